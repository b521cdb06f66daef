//! Commands that run studies or hand them over: `run`, `campaign`, `serve`,
//! `submit`, `cancel`, and `check`, which plans without running; with the
//! summary a finished study prints.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::args::{ControlArg, RunArgs, ServeArgs, StoreArg};
use super::error::{CliError, Result};
use super::output::emit;
use super::wiring::run_studies;
use crate::domain::study::{self, Study};
use crate::query::best::{infeasible_note, mixed_sources, unranked_note};
use crate::runtime::engine::Summary;
use crate::store::{Ranked, Store};

/// `tunefleet run`: a study (one per `[[group]]`, side by side).
pub async fn run(args: &RunArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let study = study::load(&args.study)?;
    let summaries =
        run_studies(study.expand(), &args.broker, &args.influx, &args.store.store, !args.quiet, None, shutdown).await?;
    for summary in &summaries {
        print_summary(summary, &args.store.store);
    }
    ended(&summaries, &args.store.store)
}

/// How a run ended, as the exit code says it: every trial a success
/// (`Ok`), or [`CliError::Ended`] when it was interrupted, when a study has
/// no successful trial, when none of its successful trials reported the
/// objective (nothing ranked), or when some trials failed, in that order;
/// the message says why and what to do.
pub fn ended(summaries: &[Summary], store: &Path) -> Result<()> {
    use super::error::{
        EXIT_FAILURES, EXIT_INTERRUPTED, EXIT_NOTHING_FEASIBLE, EXIT_NOTHING_RANKED, EXIT_NOTHING_SUCCEEDED,
    };
    if let Some((s, why)) = summaries.iter().find_map(|s| Some((s, s.failed_fast.as_ref()?))) {
        let causes = Store::open_read_only(store).and_then(|st| st.failure_causes(&s.study)).unwrap_or_default();
        let message = format!(
            "study {} stopped early: {why}: {}; fix the cause and run the same command: the study goes on",
            s.study,
            crate::domain::failure::summary(s.failed, &causes, 3)
        );
        return Err(CliError::Ended { code: EXIT_NOTHING_SUCCEEDED, message });
    }
    if let Some(s) = summaries.iter().find(|s| !s.finished) {
        let message = format!(
            "interrupted: study {}: {} of {} trials done; run the same command to resume",
            s.study, s.done, s.planned
        );
        return Err(CliError::Ended { code: EXIT_INTERRUPTED, message });
    }
    let why = |s: &Summary| {
        let causes = Store::open_read_only(store).and_then(|st| st.failure_causes(&s.study)).unwrap_or_default();
        crate::domain::failure::summary(s.failed, &causes, 3)
    };
    if let Some(s) = summaries.iter().find(|s| s.done == 0 && s.total > 0) {
        let message = if s.failed > 0 {
            format!("study {}: no trial succeeded: {}", s.study, why(s))
        } else {
            format!("study {}: no trial succeeded ({} stopped early)", s.study, s.stopped)
        };
        return Err(CliError::Ended { code: EXIT_NOTHING_SUCCEEDED, message });
    }
    if let Some(s) = summaries.iter().find(|s| s.done > 0 && s.best.is_none()) {
        let metric = Store::open_read_only(store)
            .ok()
            .and_then(|st| st.study(&s.study).ok().flatten())
            .map_or_else(|| "the objective".to_string(), |r| format!("{:?}", r.metric));
        let message = format!(
            "study {}: {} trials succeeded but none reported {metric}: nothing is ranked; make the workload print it \
             (a final line `{{\"event\":\"final\",{metric}: VALUE}}`, see docs/PROTOCOL.md \"Workload output\"), then \
             run again under a new name",
            s.study, s.done
        );
        return Err(CliError::Ended { code: EXIT_NOTHING_RANKED, message });
    }
    if let Some(s) = summaries.iter().find(|s| s.best.as_ref().is_some_and(|b| b.feasible == Some(false))) {
        let message = format!(
            "study {}: {} trials ranked but none meets its constraints: the best above misses them least; widen the \
             search space or the bounds, then run again under a new name",
            s.study, s.done
        );
        return Err(CliError::Ended { code: EXIT_NOTHING_FEASIBLE, message });
    }
    if let Some(s) = summaries.iter().find(|s| s.failed > 0) {
        let message = format!("study {}: finished with failures: {}", s.study, why(s));
        return Err(CliError::Ended { code: EXIT_FAILURES, message });
    }
    Ok(())
}

/// `tunefleet campaign`: every workload of a campaign file, side by side.
pub async fn campaign(args: &RunArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let campaign = crate::domain::campaign::load(&args.study)?;
    let name = campaign.name.clone();
    let studies: Vec<Study> = campaign.studies.iter().flat_map(Study::expand).collect();
    let summaries =
        run_studies(studies, &args.broker, &args.influx, &args.store.store, !args.quiet, None, shutdown).await?;
    for s in &summaries {
        print_summary(s, &args.store.store);
    }
    let (done, total) = summaries.iter().fold((0, 0), |(d, t), s| (d + s.done, t + s.total));
    let finished = summaries.iter().filter(|s| s.done + s.failed + s.stopped == s.total).count();
    // Scripts read this line.
    println!("campaign {name}: {finished}/{} workloads finished, {done}/{total} trials done", summaries.len());
    ended(&summaries, &args.store.store)
}

/// `tunefleet serve`: the coordinator as a service until `shutdown`.
pub async fn serve(args: &ServeArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let control = args.control.resolve(&args.store.store);
    // Scripts and tests read this line; the socket exists once the broker is up.
    println!("control: {}", control.display());
    let page = super::page::PageConfig {
        addr: match args.page.as_deref() {
            Some("off") => None,
            Some(addr) => Some(addr.to_string()),
            None => Some(super::page::DEFAULT_PAGE.to_string()),
        },
        explicit: args.page.is_some(),
        token_file: args.page_token_file.clone(),
        control: control.clone(),
    };
    // Another service on this store keeps its socket and its api.json.
    crate::runtime::control::ensure_free(&control).await?;
    let page = super::page::start(&page, &args.store.store).await?;
    let lease = std::time::Duration::from_secs(args.lease_seconds.max(3));
    let service = super::wiring::Service { control: control.clone(), lease };
    let summaries =
        run_studies(Vec::new(), &args.broker, &args.influx, &args.store.store, true, Some(service), shutdown).await;
    if let Some(page) = page {
        page.abort();
        // Its token dies with it.
        let _ = std::fs::remove_file(super::api::access_path(&control));
    }
    let summaries = summaries?;
    for s in &summaries {
        print_summary(s, &args.store.store);
    }
    Ok(())
}

/// `tunefleet submit`: the study file, checked here first, to a running service.
pub async fn submit(study: &PathBuf, control: &ControlArg, store: &StoreArg) -> Result<()> {
    let text = std::fs::read_to_string(study).map_err(CliError::file("reading", study))?;
    // Checked here too, so a mistake is reported with its line before anything is sent.
    study::parse(&text, &study.display().to_string())?;
    let ask = crate::runtime::control::Ask::Submit { study: text, origin: study.display().to_string() };
    answer(ask_service(control, store, &ask).await?)
}

/// `ask` of the service on `control`'s socket, or of the active one
/// through a server's store ([`crate::runtime::control::ask_active`]).
async fn ask_service(
    control: &ControlArg,
    store: &StoreArg,
    ask: &crate::runtime::control::Ask,
) -> Result<crate::runtime::control::Answer> {
    Ok(crate::runtime::control::ask_active(&control.resolve(&store.store), &store.store, ask).await?)
}

/// `tunefleet enqueue`: a configuration first in a study of a running
/// service.
pub async fn enqueue(study: String, params: &[String], control: &ControlArg, store: &StoreArg) -> Result<()> {
    let params = params.iter().map(|p| enqueued_value(p)).collect::<Result<Vec<_>>>()?;
    let ask = crate::runtime::control::Ask::Enqueue { study, params };
    answer(ask_service(control, store, &ask).await?)
}

/// `PARAMETER=VALUE` as a TOML key and value: a number, a boolean, a quoted
/// string or an array as written; any other word quoted.
fn enqueued_value(entry: &str) -> Result<(String, String)> {
    let Some((key, value)) = entry.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
        return Err(CliError::refused(format!("{entry:?}: expected PARAMETER=VALUE")));
    };
    let (key, value) = (key.trim(), value.trim());
    if !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') || value.contains('\n') {
        return Err(CliError::refused(format!("{entry:?}: a parameter's name and one line for its value")));
    }
    let literal = value.parse::<f64>().is_ok()
        || matches!(value, "true" | "false")
        || value.starts_with('"')
        || value.starts_with('[');
    let value = if literal { value.to_string() } else { format!("{value:?}") };
    Ok((key.to_string(), value))
}

/// `tunefleet cancel`: a study of a running service.
pub async fn cancel(study: String, control: &ControlArg, store: &StoreArg) -> Result<()> {
    let ask = crate::runtime::control::Ask::Cancel { study };
    answer(ask_service(control, store, &ask).await?)
}

/// Prints a service's answer; an error answer is an error.
fn answer(a: crate::runtime::control::Answer) -> Result<()> {
    match a {
        crate::runtime::control::Answer::Ok { message } | crate::runtime::control::Answer::Created { message, .. } => {
            println!("{message}");
            Ok(())
        }
        crate::runtime::control::Answer::Error { message } => Err(CliError::Refused(message)),
    }
}

/// `tunefleet check`: the trials of each study of the file.
pub fn check(path: &Path) -> Result<()> {
    let file = study::load(path)?;
    let mut out = String::new();
    for study in file.expand() {
        check_one(&study, &mut out)?;
    }
    emit(&out)
}

/// One study's trials (or how many an adaptive search may make), after a
/// warning on stderr for each hyper-parameter nothing uses.
fn check_one(study: &Study, out: &mut String) -> Result<()> {
    for warning in study.unused_param_warnings() {
        eprintln!("warning: {warning}");
    }
    if study.gpus > 0 {
        writeln!(
            out,
            "{}: {} GPU(s) per trial, each its own; only agents with that many take them",
            study.name, study.gpus
        )?;
    }
    if study.strategy == crate::domain::study::Strategy::External {
        let planned = crate::domain::search::Search::new(study).planned();
        writeln!(
            out,
            "{}: up to {planned} trials, each a configuration told through tunefleet serve's API by a sampler of \
             your own (docs/API.md), objective {} ({})",
            study.name,
            study.objective.metric,
            study.objective.direction.as_str()
        )?;
        return Ok(());
    }
    if crate::domain::search::Search::adaptive(study) {
        let planned = crate::domain::search::Search::new(study).planned();
        writeln!(
            out,
            "{}: up to {planned} trials chosen as the study goes (adaptive), objective {} ({})",
            study.name,
            study.objective.metric,
            study.objective.direction.as_str()
        )?;
        return Ok(());
    }
    let plans = crate::domain::search::plan(study);
    writeln!(
        out,
        "{}: {} trials, objective {} ({})",
        study.name,
        plans.len(),
        study.objective.metric,
        study.objective.direction.as_str()
    )?;
    for p in &plans {
        let params = crate::domain::params::params_text(&p.params);
        writeln!(out, "  trial {:>4} repeat {}: {params}", p.trial, p.repeat)?;
    }
    Ok(())
}

/// What a finished study prints: its counts, what was refused or moved,
/// its best trials and its store.
pub fn print_summary(s: &Summary, store: &Path) {
    let stopped = if s.stopped > 0 { format!(", {} stopped early", s.stopped) } else { String::new() };
    // Of the study's budget: an interrupted study shows what is left.
    let total = if s.finished { s.total } else { s.planned.max(s.total) };
    if s.elapsed.is_zero() && s.finished && s.agents_seen == 0 {
        println!(
            "study {}: {}/{total} trials done, {} failed{stopped} (finished before this run: nothing to do)",
            s.study, s.done, s.failed
        );
    } else {
        println!(
            "study {}: {}/{total} trials done, {} failed{stopped}, in {:.1} s on {} agent(s)",
            s.study,
            s.done,
            s.failed,
            s.elapsed.as_secs_f64(),
            s.agents_seen
        );
    }
    if let Some((d, median, most)) = s.ask_depth.as_ref().and_then(|d| Some((d, d.median()?, d.max()?))) {
        // How much of the study its search chose without results.
        println!("search: {} asks, {median} trials in flight at the median ask, {most} at most", d.asks());
    }
    if s.failed > 0 {
        // Why, grouped: the exit status and the last line each failed trial wrote.
        match Store::open_read_only(store).and_then(|st| st.failure_causes(&s.study)) {
            Ok(causes) => println!("{}", crate::domain::failure::summary(s.failed, &causes, 3)),
            Err(e) => tracing::warn!(error = %e, "cannot read why trials failed"),
        }
    }
    let st = &s.stats;
    let refused = [
        (st.rejected_messages, "malformed messages"),
        (st.bad_tokens, "unauthenticated messages"),
        (st.refused_hellos, "Hellos refused"),
        (st.rate_limited_hellos, "Hellos over the rate limit"),
        (st.forged_wills, "forged Last Wills"),
        (st.invalid_messages, "messages with values out of bounds"),
        (st.store_errors, "messages the store could not take"),
        (st.refused_checkpoints, "checkpoints outside resume_prefix"),
        (st.refused_progress, "epochs past an attempt's bound"),
        (st.past_share, "results past an agent's share of the store"),
        (st.refused_comeasures, "co-measurements"),
        (st.unknown_results, "results for attempts never assigned"),
        (st.other_study_refs, "messages of another study of the same name"),
    ];
    if refused.iter().any(|(n, _)| *n > 0) {
        // Scripts and tests read this line: "refused: N what, N what, ...".
        let parts: Vec<String> = refused.iter().map(|(n, what)| format!("{n} {what}")).collect();
        println!("refused: {}", parts.join(", "));
    }
    if st.lost_held > 0 {
        println!(
            "lost before they started: {} attempts, queued again with no failure counted (see tunefleet agents)",
            st.lost_held
        );
    }
    if st.moved > 0 {
        println!("moved: {} attempts off overloaded agents or disturbed measurements", st.moved);
    }
    if st.requeued > 0 || st.duplicate_results > 0 {
        println!("requeued: {} trials; duplicate results acknowledged: {}", st.requeued, st.duplicate_results);
    }
    let ranked = Store::open_read_only(store).and_then(|st| Ok((st.best(&s.study, 3)?, st.unranked(&s.study)?)));
    match ranked {
        Ok((best, unranked)) => {
            if let Some(note) = unranked_note(&unranked) {
                println!("note: {note}");
            }
            if unranked.no_value > 0 {
                if let Some(missing) = missing_objective_note(store, &s.study) {
                    println!("note: {missing}");
                }
            }
            if best.is_empty() {
                println!("{}", if unranked.total() > 0 { "no trial to rank" } else { "no successful trial" });
            } else {
                print_best(&best);
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot read the best trials back"),
    }
    println!("store: {}", store.display());
}

fn print_best(best: &[Ranked]) {
    if let Some(note) = mixed_sources(best.iter().map(|r| r.result.energy.source_name())) {
        println!("{note}");
    }
    println!("best trials:");
    for r in best {
        let params = crate::domain::params::params_text(&r.plan.params);
        let mean = if r.runs > 1 { format!("  (mean {:.6} of {} runs)", r.mean, r.runs) } else { String::new() };
        let infeasible = infeasible_note(r);
        println!(
            "  trial {:>4}  {:>10.6}  on {:<16} {params}{mean}{infeasible}",
            r.plan.trial,
            r.objective(),
            r.result.agent
        );
    }
}

/// What trials without a value for the objective lacked: the metric the
/// study expects and the metrics they reported.
pub fn missing_objective_note(store: &Path, study: &str) -> Option<String> {
    let st = Store::open_read_only(store).ok()?;
    let metric = st.study(study).ok()??.metric;
    let seen = st.metrics_without_objective(study).ok()?;
    Some(crate::domain::failure::missing_objective(&metric, &seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enqueued_value_is_toml_and_one_line() {
        let v = |e: &str| enqueued_value(e).map_err(|e| e.to_string());
        assert_eq!(v("lr=0.01"), Ok(("lr".into(), "0.01".into())));
        assert_eq!(v("opt=adam"), Ok(("opt".into(), "\"adam\"".into())), "a word is a string");
        assert_eq!(v("deep=true"), Ok(("deep".into(), "true".into())));
        assert_eq!(v(" n = 3 "), Ok(("n".into(), "3".into())));
        assert!(v("noequals").is_err());
        assert!(v("=3").is_err());
        assert!(v("a.b=3").is_err(), "a dotted key would reach into another table");
        assert!(v("x=[1,\n[hyper.y]]").is_err(), "one line");
    }
}
