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
use crate::query::best::{mixed_sources, unranked_note};
use crate::runtime::engine::Summary;
use crate::store::{BestRow, Store};

/// `tunefleet run`: a study (one per `[[group]]`, side by side).
pub async fn run(args: &RunArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let study = study::load(&args.study)?;
    let summaries =
        run_studies(study.expand(), &args.broker, &args.influx, &args.store.store, !args.quiet, None, shutdown).await?;
    for summary in &summaries {
        print_summary(summary, &args.store.store);
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
    Ok(())
}

/// `tunefleet serve`: the coordinator as a service until `shutdown`.
pub async fn serve(args: &ServeArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let control = args.control.resolve(&args.store.store);
    // Scripts and tests read this line; the socket exists once the broker is up.
    println!("control: {}", control.display());
    let summaries =
        run_studies(Vec::new(), &args.broker, &args.influx, &args.store.store, true, Some(control), shutdown).await?;
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
    answer(crate::runtime::control::ask(&control.resolve(&store.store), &ask).await?)
}

/// `tunefleet cancel`: a study of a running service.
pub async fn cancel(study: String, control: &ControlArg, store: &StoreArg) -> Result<()> {
    let ask = crate::runtime::control::Ask::Cancel { study };
    answer(crate::runtime::control::ask(&control.resolve(&store.store), &ask).await?)
}

/// Prints a service's answer; an error answer is an error.
fn answer(a: crate::runtime::control::Answer) -> Result<()> {
    match a {
        crate::runtime::control::Answer::Ok { message } => {
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

/// One study's trials (or how many an adaptive search may make).
fn check_one(study: &Study, out: &mut String) -> Result<()> {
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
        let params: Vec<String> = p.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        writeln!(out, "  trial {:>4} repeat {}: {}", p.trial, p.repeat, params.join(" "))?;
    }
    Ok(())
}

/// What a finished study prints: its counts, what was refused or moved,
/// its best trials and its store.
pub fn print_summary(s: &Summary, store: &Path) {
    let stopped = if s.stopped > 0 { format!(", {} stopped early", s.stopped) } else { String::new() };
    println!(
        "study {}: {}/{} trials done, {} failed{stopped}, in {:.1} s on {} agent(s)",
        s.study,
        s.done,
        s.total,
        s.failed,
        s.elapsed.as_secs_f64(),
        s.agents_seen
    );
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
        (st.unknown_results, "results for attempts never assigned"),
        (st.other_study_refs, "messages of another study of the same name"),
    ];
    if refused.iter().any(|(n, _)| *n > 0) {
        // Scripts and tests read this line: "refused: N what, N what, ...".
        let parts: Vec<String> = refused.iter().map(|(n, what)| format!("{n} {what}")).collect();
        println!("refused: {}", parts.join(", "));
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

fn print_best(best: &[BestRow]) {
    if let Some(note) = mixed_sources(best.iter().map(|r| r.energy_source.as_deref())) {
        println!("{note}");
    }
    println!("best trials:");
    for r in best {
        let params: Vec<String> = r.params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!("  trial {:>4}  {:>10.6}  on {:<16} {}", r.trial, r.objective, r.agent, params.join(" "));
    }
}
