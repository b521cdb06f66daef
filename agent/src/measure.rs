//! `tunefleet-agent measure [--interval D] [--json] -- CMD ARGS...`: runs a
//! command once through the same runner as a trial (exec wrapper, counters
//! over the whole process tree, energy sampled at the interval) and reports
//! wall and CPU time, energy per domain with its source, the counters and
//! the profile vector, like `perf stat` with energy.
//!
//! The command's standard output and error are its own (inherited); the
//! report goes to standard error after it exits, as `perf stat` does, so
//! the command's output can still be piped. The exit status is the
//! command's: its code, 128 + the signal that killed it, or 127 when it
//! could not be started.

use std::path::PathBuf;
use std::time::Duration;

use tunefleet_common::measurement::{EnergySourceKind, ExitOutcome, Measurement};
use tunefleet_common::message::TrialSpec;
use tunefleet_common::params::SystemParams;
use tunefleet_common::profile::FEATURES;

use crate::energy::{self, EnergyRoots, EstimateModel};
use crate::runner::{run_trial, ControlInput, RunnerConfig, TrialRun};

/// What to measure and how.
#[derive(Debug, Clone)]
pub struct MeasureConfig {
    pub argv: Vec<String>,
    pub interval: Duration,
    pub energy_roots: EnergyRoots,
    pub model: EstimateModel,
    /// The agent executable, re-run as the exec wrapper.
    pub wrapper: PathBuf,
}

/// Runs the command once and measures it.
/// `control` is the input of a [`crate::runner::TrialHandle`] (Ctrl-C cancels through it).
pub async fn measure(cfg: &MeasureConfig, control: ControlInput) -> Measurement {
    let selection = energy::select(&cfg.energy_roots, cfg.model);
    let mut runner = RunnerConfig::new(cfg.wrapper.clone());
    runner.energy = energy::Registry::new(selection.source, cfg.model);
    runner.sample_interval = cfg.interval;
    runner.inherit_output = true;
    let run = TrialRun {
        spec: TrialSpec {
            argv: cfg.argv.clone(),
            env: Vec::new(),
            system: SystemParams::default(),
            timeout_ms: 0,
            probe: None,
            gpus: 0,
        },
        cpus: Vec::new(),
        label: format!("measure-{}", std::process::id()),
        gpus: vec![],
    };
    run_trial(&runner, &run, None, control).await
}

/// The exit status `measure` passes on for the command's outcome.
pub fn exit_status(exit: &ExitOutcome) -> u8 {
    match exit {
        ExitOutcome::Exited(code) => u8::try_from(*code & 0xff).unwrap_or(1),
        ExitOutcome::Signaled(sig) => u8::try_from(128 + (*sig & 0x7f)).unwrap_or(1),
        ExitOutcome::SpawnFailed(_) => 127,
        ExitOutcome::TimedOut | ExitOutcome::Cancelled => 130,
    }
}

fn exit_text(exit: &ExitOutcome) -> String {
    match exit {
        ExitOutcome::Exited(c) => format!("exited with status {c}"),
        ExitOutcome::Signaled(s) => format!("killed by signal {s}"),
        ExitOutcome::TimedOut => "timed out".into(),
        ExitOutcome::Cancelled => "interrupted".into(),
        ExitOutcome::SpawnFailed(r) => format!("could not start: {r}"),
    }
}

/// The measurement as a `perf stat`-like table.
pub fn render_table(argv: &[String], m: &Measurement) -> String {
    let secs = |us: u64| us as f64 / 1e6;
    let mut out = String::new();
    out.push_str(&format!("\n measurement of '{}': {}\n\n", argv.join(" "), exit_text(&m.exit)));
    out.push_str(&format!("  {:>16.3} s  wall\n", secs(m.wall_us)));
    out.push_str(&format!("  {:>16.3} s  user\n", secs(m.user_us)));
    out.push_str(&format!("  {:>16.3} s  sys\n", secs(m.sys_us)));
    out.push_str(&format!("  {:>16} KiB peak RSS\n", m.max_rss_kib));
    let e = &m.energy;
    let sampling = if e.source == EnergySourceKind::Estimated {
        "ESTIMATED by a model, not sampled".to_string()
    } else {
        format!("sampled every {} ms", e.interval_ms)
    };
    out.push_str(&format!("\n energy from {} ({}, {sampling})\n", e.source, if e.valid { "valid" } else { "INVALID" }));
    for d in &e.domains {
        let part = if d.in_total { "" } else { "  (part of another domain, not in total)" };
        out.push_str(&format!("  {:>16.3} J  {}{part}\n", d.joules, d.domain));
    }
    out.push_str(&format!("  {:>16.3} J  total\n", e.joules));
    if m.wall_us > 0 {
        out.push_str(&format!("  {:>16.3} W  average\n", e.joules / secs(m.wall_us)));
    }
    if let Some(note) = &e.note {
        out.push_str(&format!("  note: {note}\n"));
    }
    out.push_str(&format!("\n counters ({} interval samples)\n", m.counter_series.len()));
    for c in &m.counters {
        let mux = if c.multiplexed() {
            format!(
                "  (multiplexed: counted {:.1}% of the time, scaled)",
                100.0 * c.time_running_ns as f64 / c.time_enabled_ns.max(1) as f64
            )
        } else {
            String::new()
        };
        out.push_str(&format!("  {:>20.0}  {}{mux}\n", c.scaled(), c.event));
    }
    for c in &m.counters_missing {
        out.push_str(&format!("  {:>20}  {}: {}\n", "<not counted>", c.event, c.reason));
    }
    out.push_str(&format!("\n profile (version {})\n", m.profile.version));
    for (name, value) in FEATURES.iter().zip(&m.profile.values) {
        match value {
            Some(v) => out.push_str(&format!("  {v:>16.4}  {name}\n")),
            None => out.push_str(&format!("  {:>16}  {name}\n", "missing")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_passes_the_command_through() {
        assert_eq!(exit_status(&ExitOutcome::Exited(0)), 0);
        assert_eq!(exit_status(&ExitOutcome::Exited(3)), 3);
        assert_eq!(exit_status(&ExitOutcome::Exited(256 + 4)), 4);
        assert_eq!(exit_status(&ExitOutcome::Signaled(9)), 137);
        assert_eq!(exit_status(&ExitOutcome::SpawnFailed("no such file".into())), 127);
    }
}
