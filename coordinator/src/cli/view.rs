//! The text of the commands that read results: each takes the data its
//! module returns ([`crate::query::best::View`], [`crate::query::profiles`]'s views,
//! [`crate::query::status::StudyStatus`]) and renders it, so querying and
//! rendering stay apart. Pure.

use std::fmt::Write as _;

use tunefleet_common::message::SystemParams;
use tunefleet_common::params::Params;

use crate::domain::study::Secondary;
use crate::query::best::{figure, unranked_note, RankedTrial, View};
use crate::query::profiles::{ClassView, Classified};
use crate::query::status::StudyStatus;
use crate::store::{DecisionRow, Unranked};

/// The text `best` prints.
pub fn best(view: &View) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    match view {
        View::Ranked { trials, unranked, mixed_sources, importance, ranked, .. } => {
            ranked_text(&mut out, trials, unranked, mixed_sources.as_deref(), importance, *ranked)?;
        }
        View::Configurations { study, metric, direction, configurations } => {
            writeln!(
                out,
                "configurations of {study} by mean {metric} ({direction}): mean, spread (sd / |mean|), runs"
            )?;
            for c in configurations {
                let spread = c.spread.map_or_else(|| "-".to_string(), |s| format!("{:.2} %", s * 100.0));
                writeln!(
                    out,
                    "{:>12.6}  {spread:>9}  {:>3} runs  {}",
                    c.mean,
                    c.runs.len(),
                    describe(&c.params, c.system.as_ref())
                )?;
            }
        }
        View::Pareto { study, metric, direction, axes, considered, front, mixed_sources, hypervolume } => {
            let names: Vec<&str> = axes.iter().map(|a| a.as_str()).collect();
            writeln!(
                out,
                "Pareto front of {study}: {metric} ({direction}) against {} (minimised): {} of {considered} trials",
                names.join(", "),
                front.len(),
            )?;
            if let Some(h) = hypervolume {
                let point: Vec<String> = h.reference.iter().map(|v| format!("{v:.6}")).collect();
                writeln!(
                    out,
                    "hypervolume {:.6} from the reference point ({metric}, {}) = ({})",
                    h.volume,
                    names.join(", "),
                    point.join(", ")
                )?;
            }
            if let Some(note) = mixed_sources {
                writeln!(out, "{note}")?;
            }
            for r in front {
                let figures: Vec<String> = axes
                    .iter()
                    .map(|&a| match a {
                        Secondary::Energy => format!("{:.3} J", figure(r, a)),
                        Secondary::WallTime => format!("{:.3} s", figure(r, a)),
                    })
                    .collect();
                let params = describe(&r.plan.params, r.result.system.as_ref());
                writeln!(out, "trial {:>4}  {:>12.6}  {}  {params}", r.plan.trial, r.objective(), figures.join("  "))?;
            }
        }
        View::ByClass { classes, .. } => {
            for c in classes {
                writeln!(out, "{}: {} ranked trials", c.class, c.ranked)?;
                for r in &c.trials {
                    let params = describe(&r.plan.params, r.result.system.as_ref());
                    writeln!(
                        out,
                        "  trial {:>4}  {:>12.6}  agent {:<16} {params}",
                        r.plan.trial,
                        r.objective(),
                        r.result.agent
                    )?;
                }
            }
        }
    }
    Ok(out)
}

/// The text of [`View::Ranked`]: the best trials, best first, then notes on
/// those disturbed or left out and the parameters' importance over
/// `ranked` trials.
fn ranked_text(
    out: &mut String,
    trials: &[RankedTrial],
    unranked: &Unranked,
    mixed_sources: Option<&str>,
    importance: &[(String, f64)],
    ranked: usize,
) -> std::fmt::Result {
    if let Some(note) = mixed_sources {
        writeln!(out, "{note}")?;
    }
    let disturbed = trials.iter().filter(|t| !t.interference.is_empty()).count();
    for RankedTrial { row: r, decisions, interference } in trials {
        let source = r.result.energy.source_name().unwrap_or("no energy");
        writeln!(
            out,
            "trial {:>4}  {:>12.6}  agent {:<16} [{source}] {}{}",
            r.plan.trial,
            r.objective(),
            r.result.agent,
            describe(&r.plan.params, r.result.system.as_ref()),
            crate::query::best::infeasible_note(r)
        )?;
        for d in decisions {
            writeln!(out, "            {}: {}", d.decision, d.reason)?;
        }
        if !interference.is_empty() {
            writeln!(out, "            disturbed: {}", interference.join("; "))?;
        }
    }
    if disturbed > 0 {
        writeln!(
            out,
            "note: {disturbed} of these trials ran while their agent was busy with other work: their time and \
             energy are inflated; run them again on a quiet machine, or run the study with --offload"
        )?;
    }
    if let Some(note) = unranked_note(unranked) {
        writeln!(out, "note: {note}")?;
    }
    if !importance.is_empty() {
        let shares: Vec<String> = importance.iter().map(|(p, s)| format!("{p} {s:.2}")).collect();
        writeln!(
            out,
            "importance (each parameter's share of the objective's variance it explains alone, over {ranked} trials): {}",
            shares.join(", ")
        )?;
    }
    Ok(())
}

/// A result's parameters, and the system configuration it ran (or, when
/// pipelined, selected) when that is not already among them.
pub fn describe(params: &Params, system: Option<&SystemParams>) -> String {
    let mut words: Vec<String> =
        params.iter().map(|(k, v)| format!("{k}={}", crate::domain::params::value_text(v))).collect();
    if let Some(sys) = system {
        for (name, value) in
            [("cores", sys.cores.map(u64::from)), ("threads", sys.threads.map(u64::from)), ("memory", sys.memory_mib)]
        {
            if let (Some(v), false) = (value, params.contains_key(name)) {
                words.push(format!("{name}={v} (selected)"));
            }
        }
    }
    words.join(" ")
}

/// One line per study.
pub fn status(rows: &[StudyStatus]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("no studies\n");
    }
    for s in rows {
        let best = s.best.map_or(String::new(), |(v, t)| match s.best_runs {
            0 | 1 => format!(", best {}={v:.6} (trial {t})", s.metric),
            n => format!(", best {}={v:.6} (mean of {n} runs, best run trial {t})", s.metric),
        }) + if s.best_feasible == Some(false) { " infeasible: no trial meets the constraints" } else { "" };
        let pace = match (s.per_minute, s.eta_s) {
            (Some(p), Some(eta)) => format!(", {p:.1} trials/min, about {eta:.0} s left"),
            (Some(p), None) => format!(", {p:.1} trials/min"),
            _ => String::new(),
        };
        let agents = if s.coordinator_running {
            format!("{} agents online", s.live_agents)
        } else {
            match s.coordinator_seen_s {
                Some(ago) => format!("no coordinator running (last seen {})", ago_text(ago)),
                None => "no coordinator running".to_string(),
            }
        };
        let _ = writeln!(
            out,
            "{} {}: {}/{} done, {} running, {} held ahead, {} pending, {} failed, {} stopped, {agents}{best}{pace}",
            s.study, s.state, s.done, s.total, s.running, s.held, s.pending, s.failed, s.stopped
        );
        if s.failed > 0 {
            let _ = writeln!(out, "  {}", crate::domain::failure::summary(s.failed, &s.failures, 3));
        }
        if s.state == "interrupted" {
            let _ = writeln!(out, "  run the same command (or `tunefleet serve` on this store) to resume it");
        }
        if let Some(why) = &s.waits {
            let _ = writeln!(out, "  waits: {why}");
        }
    }
    if let Some(b) = rows.first().and_then(|s| s.broker.as_ref()) {
        let n = |k: &str| b.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let logins = b.get("logins").and_then(serde_json::Value::as_object);
        let by_kind: Vec<String> = logins
            .map(|l| l.iter().filter(|(_, v)| v.as_u64() != Some(0)).map(|(k, v)| format!("{v} {k}")).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "broker: {} connections ({}), {} logins refused, {} denied, {} dropped, {} slow subscribers closed",
            n("connections"),
            if by_kind.is_empty() { "none".to_string() } else { by_kind.join(", ") },
            n("refused_login_total"),
            n("denied_total"),
            n("dropped_total"),
            n("slow_closed_total") + n("stalled_total"),
        );
    }
    let floor = crate::runtime::disk::DEFAULT_MIN_FREE_MIB * 1024 * 1024;
    if let Some(free) = rows.first().and_then(|s| s.store_free_bytes).filter(|f| *f < floor) {
        let _ = writeln!(
            out,
            "the store's disk is nearly full ({} free): a coordinator pauses below its --store-min-free-mib \
             (default {} MiB), taking no message and assigning nothing, until it has room",
            crate::runtime::disk::readable(free),
            crate::runtime::disk::DEFAULT_MIN_FREE_MIB
        );
    }
    out
}

/// `seconds` ago, for reading: "12 s ago", "5 min ago", "3 h ago".
fn ago_text(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s ago"),
        s if s < 7_200.0 => format!("{:.0} min ago", s / 60.0),
        s => format!("{:.0} h ago", s / 3_600.0),
    }
}

/// The listing as text.
pub fn classes(views: &[ClassView]) -> String {
    let mut out = String::new();
    if views.is_empty() {
        out.push_str(
            "no profiles yet: pipelined trials profile their first window and join a model when they finish\n",
        );
    }
    for v in views {
        let sil = v.silhouette.map_or("one cluster".to_string(), |s| format!("silhouette {s:.2}"));
        let _ = writeln!(
            out,
            "{}: {} profiles, {} clusters ({sil}), fitted on {}; features: {}",
            v.class,
            v.profiles,
            v.k,
            v.fitted_on,
            v.features.join(", ")
        );
        for c in &v.clusters {
            let kinds: Vec<String> = c.workloads.iter().map(|(w, n)| format!("{w} x{n}")).collect();
            let _ = writeln!(
                out,
                "  cluster {}: {} members (radius {:.3}): {}",
                c.cluster,
                c.size,
                c.radius,
                kinds.join(", ")
            );
            let shown: Vec<&str> = c.members.iter().take(8).map(String::as_str).collect();
            let more = c.members.len().saturating_sub(shown.len());
            let _ = write!(out, "    members: {}", shown.join(" "));
            if more > 0 {
                let _ = write!(out, " and {more} more");
            }
            out.push('\n');
            for (group, system, t, from) in &c.configurations {
                let _ = writeln!(
                    out,
                    "    best for {group}: {system} ({t:.3} x the first probe window, from {from} probed jobs)"
                );
            }
        }
    }
    out
}

/// The decisions as text, one per line.
pub fn decisions(rows: &[DecisionRow]) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        out.push_str("no reuse decisions\n");
    }
    for r in rows {
        let _ = writeln!(out, "{}/{}#{} {:<6} {}", r.study, r.trial, r.attempt, r.decision, r.reason);
    }
    out
}

/// What `tunefleet profiles forget` prints.
pub fn forgotten(agent: &str, forgotten: &[(String, u64)]) -> String {
    if forgotten.is_empty() {
        return format!("{agent}: no profiles learnt from it\n");
    }
    let mut out = String::new();
    for (class, n) in forgotten {
        let _ = writeln!(out, "{agent}: {n} profiles forgotten in {class} (its clusters fitted again)");
    }
    out.push_str("a coordinator running now keeps them in memory until it restarts\n");
    out
}

/// Where a trial would land, as text.
pub fn classified(c: &Classified) -> String {
    let mut out = format!("{}/{} on {}\n", c.study, c.trial, c.class);
    for (cluster, d) in &c.distances {
        let _ = writeln!(out, "  cluster {cluster}: distance {d:.3}");
    }
    let _ = writeln!(out, "{}", c.decision);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_a_line_per_study_with_its_pace() {
        let row = StudyStatus {
            study: "s".into(),
            state: "running".into(),
            total: 100,
            pending: 80,
            running: 0,
            held: 0,
            done: 20,
            failed: 0,
            stopped: 0,
            metric: "loss".into(),
            best: Some((0.5, 3)),
            best_runs: 1,
            best_feasible: None,
            store_free_bytes: None,
            live_agents: 2,
            coordinator_running: true,
            coordinator_seen_s: Some(1.0),
            broker: None,
            waits: None,
            failures: Vec::new(),
            per_minute: Some(20.0),
            eta_s: Some(240.0),
        };
        let text = status(std::slice::from_ref(&row));
        assert!(text.contains("s running: 20/100 done") && text.contains("best loss=0.500000 (trial 3)"), "{text}");
        assert!(text.contains("20.0 trials/min, about 240 s left") && text.contains("2 agents online"), "{text}");
        let gone = StudyStatus {
            state: "interrupted".into(),
            coordinator_running: false,
            coordinator_seen_s: Some(300.0),
            per_minute: None,
            eta_s: None,
            ..row
        };
        let text = status(&[gone]);
        assert!(text.contains("no coordinator running (last seen 5 min ago)"), "{text}");
        assert!(text.contains("run the same command"), "{text}");
        assert_eq!(status(&[]), "no studies\n");
    }
}
