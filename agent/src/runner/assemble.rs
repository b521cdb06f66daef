//! The measurement of a trial that ran, from what it left: times, the exit
//! (mapped from how the workload ended: its exit code or signal, a timeout
//! or a cancel, an exec that failed, an end never seen), counters, profile,
//! energy, segments, metrics and the log tail.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use tunefleet_common::measurement::{AppliedLimits, ExitOutcome, Measurement, MissingCounter, WindowProfile};
use tunefleet_common::profile::Profile;

use super::child::Exited;
use super::control::Disturbed;
use super::output::{micros, Collected, MAX_EPOCHS};
use super::start::RunnerConfig;
use crate::counters::CounterSet;
use crate::energy::{TrialMeters, Usage};
use crate::exec::EXIT_EXEC_FAILED;
use crate::pipeline::{Boundary, Pipeline};
use crate::procfs;

/// What the monitor saw until the workload ended and its output closed.
pub(super) struct Monitored {
    pub(super) exited: Option<Result<Exited, String>>,
    pub(super) stopped: Option<ExitOutcome>,
    pub(super) collected: Collected,
    pub(super) peak_rss: Option<u64>,
    /// What it was told disturbed it while it ran.
    pub(super) disturbed: Disturbed,
}

/// What a trial that ran leaves for its measurement, once its output
/// readers, RSS sampler and cgroup are gone.
pub(super) struct Ended {
    pub(super) started_unix_ms: u64,
    pub(super) start: Instant,
    pub(super) limits: AppliedLimits,
    pub(super) counters: CounterSet,
    pub(super) meters: TrialMeters,
    /// The machine's busy CPU time at the start and at the exit, where its
    /// energy reading is shared with other trials.
    pub(super) machine_busy_us: (Option<u64>, Option<u64>),
    pub(super) pipeline: Pipeline,
    pub(super) last_boundary: Option<Boundary>,
    pub(super) window_profile: Option<WindowProfile>,
    pub(super) monitored: Monitored,
}

/// The measurement of a trial that ran, complete: `cfg.machine_cpus` are
/// the cores of a trial not pinned (`pinned` empty), for the energy
/// estimate; what disturbed it is flagged past `cfg.interference_threshold`.
pub(super) fn assemble(cfg: &RunnerConfig, pinned: &[u32], ended: Ended) -> Measurement {
    let machine_cpus = cfg.machine_cpus;
    let Ended {
        started_unix_ms,
        start,
        limits,
        counters,
        meters,
        machine_busy_us,
        pipeline,
        last_boundary,
        window_profile,
        monitored,
    } = ended;
    let Monitored { exited, stopped, mut collected, peak_rss, disturbed } = monitored;
    let ticks = rustix::param::clock_ticks_per_second();
    let (wall, user_us, sys_us, status) = match &exited {
        Some(Ok(e)) => {
            let (user, sys) = e.stat.map_or((0, 0), |s| {
                (procfs::ticks_to_us(s.utime + s.cutime, ticks), procfs::ticks_to_us(s.stime + s.cstime, ticks))
            });
            (e.at.saturating_duration_since(start), user, sys, Some(e.status))
        }
        _ => (start.elapsed(), 0, 0, None),
    };
    let crate::counters::CounterOutcome { readings: counters, missing: mut counters_missing, series: counter_series } =
        counters.finish(wall);
    let exit = match (stopped, status, &exited) {
        (Some(outcome), _, _) => outcome,
        (None, Some(status), _) => match (status.code(), collected.exec_failed.take()) {
            (Some(EXIT_EXEC_FAILED), Some(reason)) => ExitOutcome::SpawnFailed(reason),
            (Some(code), _) => ExitOutcome::Exited(code),
            (None, _) => ExitOutcome::Signaled(status.signal().unwrap_or(0)),
        },
        (None, None, Some(Err(reason))) => ExitOutcome::SpawnFailed(reason.clone()),
        (None, None, _) => ExitOutcome::SpawnFailed("the workload's end was not observed".into()),
    };
    if matches!(exit, ExitOutcome::SpawnFailed(_)) {
        // Counters of a workload that never ran say nothing.
        counters_missing = CounterSet::all_missing("the workload did not start").finish(Duration::ZERO).missing;
    }
    let spawn_failed = matches!(exit, ExitOutcome::SpawnFailed(_));
    let counters = if spawn_failed { Vec::new() } else { counters };
    let counter_series = if spawn_failed { Vec::new() } else { counter_series };
    let profile = Profile::derive(&counters, &counter_series, micros(wall));
    let cores = if pinned.is_empty() { machine_cpus } else { u32::try_from(pinned.len()).unwrap_or(u32::MAX) };
    let usage = Usage { wall, cpu: Duration::from_micros(user_us + sys_us), cores };
    let end = last_boundary.unwrap_or_else(|| Boundary {
        at_us: micros(wall),
        epoch: 0,
        joules: meters.so_far(&usage),
        cpu_us: Some(user_us + sys_us),
    });
    let (segments, selected) = pipeline.finish(end);
    let (energy, gpus) = meters.stop(wall, &usage);
    if collected.epochs_dropped > 0 {
        let note =
            format!("[tunefleet: {} epoch lines beyond the first {MAX_EPOCHS} not kept]", collected.epochs_dropped);
        collected.tail.push(&note, false);
    }
    let final_metrics = collected
        .final_metrics
        .take()
        .or_else(|| collected.epochs.last().map(|e| e.metrics.clone()))
        .unwrap_or_default();
    let missing: Vec<MissingCounter> = counters_missing;
    Measurement {
        started_unix_ms,
        wall_us: micros(wall),
        user_us,
        sys_us,
        max_rss_kib: peak_rss.unwrap_or(0),
        exit,
        epochs: collected.epochs,
        final_metrics,
        counters,
        counters_missing: missing,
        counter_series,
        profile,
        energy,
        limits,
        log_tail: collected.tail.render(),
        segments,
        selected,
        window_profile,
        interference: interference(disturbed, cfg.interference_threshold),
        gpus,
        cpu_share: cpu_share(user_us + sys_us, machine_busy_us),
    }
}

/// Why a measurement may not represent its configuration: load from
/// outside past `threshold` first, then the device's bad conditions.
fn interference(disturbed: Disturbed, threshold: f64) -> Vec<String> {
    let mut out: Vec<String> =
        crate::foreign::interference_reason(disturbed.foreign_peak, threshold).into_iter().collect();
    out.extend(disturbed.conditions);
    out
}

/// A trial's share of a whole-machine energy reading: its CPU time over
/// the machine's busy CPU time between its start and its exit (`None`
/// where the reading is not shared, or the machine's time is unknown or
/// nil). At most 1: its own time and the machine's are counted in ticks,
/// apart.
fn cpu_share(trial_cpu_us: u64, machine_busy_us: (Option<u64>, Option<u64>)) -> Option<f64> {
    let (Some(start), Some(end)) = machine_busy_us else { return None };
    let busy = end.checked_sub(start).filter(|b| *b > 0)?;
    Some((trial_cpu_us as f64 / busy as f64).min(1.0))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::process::ExitStatus;

    use tunefleet_common::measurement::{EnergySourceKind, EpochMetrics, MemoryLimit, Metrics};
    use tunefleet_common::params::SystemParams;

    use super::*;
    use crate::energy::{Estimate, EstimateModel};
    use crate::procfs::StatFields;
    use crate::runner::control::Control;

    const STAT: StatFields = StatFields { ppid: 1, pgrp: 7, utime: 30, stime: 10, cutime: 20, cstime: 5 };

    /// How the workload ended, and what the monitor saw of it.
    fn ended(exited: Option<Result<Exited, String>>, stopped: Option<ExitOutcome>, collected: Collected) -> Ended {
        Ended {
            started_unix_ms: 1_700_000_000_000,
            start: Instant::now(),
            limits: AppliedLimits { cpus: vec![0], threads: Some(2), memory: MemoryLimit::None },
            counters: CounterSet::all_missing("no perf here"),
            meters: TrialMeters {
                machine: Estimate { model: EstimateModel::default(), skipped: Vec::new() }.meter(),
                gpus: None,
            },
            machine_busy_us: (None, None),
            pipeline: Pipeline::new(None, SystemParams::default(), vec![0]),
            last_boundary: None,
            window_profile: None,
            monitored: Monitored { exited, stopped, collected, peak_rss: Some(4096), disturbed: Disturbed::default() },
        }
    }

    /// The workload's top process ended with the raw wait status `raw`,
    /// two seconds after the start.
    fn exit_after_two_seconds(raw: i32) -> impl FnOnce(Instant) -> Option<Result<Exited, String>> {
        move |start| {
            Some(Ok(Exited { status: ExitStatus::from_raw(raw), at: start + Duration::from_secs(2), stat: Some(STAT) }))
        }
    }

    /// `assemble` for a trial pinned to one CPU of eight, its exit made by
    /// `exited` from the start instant.
    fn measure(
        exited: impl FnOnce(Instant) -> Option<Result<Exited, String>>,
        stopped: Option<ExitOutcome>,
        collected: Collected,
    ) -> Measurement {
        let mut e = ended(None, stopped, collected);
        e.monitored.exited = exited(e.start);
        assemble(&eight_cpus(), &[0], e)
    }

    /// A runner of eight CPUs, flagging load from outside past 0.25.
    fn eight_cpus() -> RunnerConfig {
        let mut cfg = RunnerConfig::new("/bin/true".into());
        cfg.machine_cpus = 8;
        cfg.interference_threshold = 0.25;
        cfg
    }

    #[test]
    fn what_disturbed_a_trial_is_in_its_measurement_when_assembled() {
        let disturbed = |foreign_peak, conditions: &[&str]| {
            let mut e = ended(exit_after_two_seconds(0)(Instant::now()), None, Collected::default());
            e.monitored.disturbed =
                Disturbed { foreign_peak, conditions: conditions.iter().map(|c| c.to_string()).collect() };
            assemble(&eight_cpus(), &[0], e).interference
        };
        let both = disturbed(Some(0.6), &["device charging", "CPU throttled"]);
        assert_eq!(both.len(), 3, "{both:?}");
        assert!(both[0].starts_with("load from outside the trial reached 0.60"), "{both:?}");
        assert_eq!(both[1..], ["device charging", "CPU throttled"]);
        assert_eq!(disturbed(Some(0.1), &["device charging"]), ["device charging"], "below the threshold");
        assert!(disturbed(None, &[]).is_empty(), "a clean run");
    }

    #[test]
    fn a_trial_notes_the_largest_load_and_each_condition_once() {
        let mut d = Disturbed::default();
        for c in [
            Control::ForeignLoad(0.1),
            Control::ForeignLoad(0.6),
            Control::ForeignLoad(f64::NAN),
            Control::ForeignLoad(0.2),
            Control::Conditions(vec!["device charging".into()]),
            Control::Conditions(vec!["device charging".into(), "CPU throttled".into()]),
        ] {
            assert!(d.note(&c), "{c:?}");
        }
        assert!(!d.note(&Control::Cancel), "a cancel is not a disturbance");
        assert_eq!(d.foreign_peak, Some(0.6));
        assert_eq!(d.conditions, ["device charging", "CPU throttled"]);
    }

    fn missing_reasons(m: &Measurement) -> BTreeSet<String> {
        m.counters_missing.iter().map(|c| c.reason.clone()).collect()
    }

    #[test]
    fn exit_zero_is_exited_with_the_zombies_times() {
        let m = measure(exit_after_two_seconds(0), None, Collected::default());
        assert_eq!(m.exit, ExitOutcome::Exited(0));
        assert_eq!(m.wall_us, 2_000_000, "wall time runs from the start to the exit seen");
        let ticks = rustix::param::clock_ticks_per_second();
        assert_eq!(m.user_us, procfs::ticks_to_us(30 + 20, ticks), "own and waited-for children's user time");
        assert_eq!(m.sys_us, procfs::ticks_to_us(10 + 5, ticks));
        assert_eq!(m.max_rss_kib, 4096);
        assert_eq!(m.started_unix_ms, 1_700_000_000_000);
        assert_eq!(m.limits.threads, Some(2));
        assert_eq!(missing_reasons(&m), BTreeSet::from(["no perf here".to_string()]));
        assert_eq!(m.energy.source, EnergySourceKind::Estimated);
    }

    #[test]
    fn a_non_zero_exit_keeps_its_code() {
        let m = measure(exit_after_two_seconds(3 << 8), None, Collected::default());
        assert_eq!(m.exit, ExitOutcome::Exited(3));
    }

    #[test]
    fn killed_by_a_signal_is_signaled_with_it() {
        let m = measure(exit_after_two_seconds(9), None, Collected::default());
        assert_eq!(m.exit, ExitOutcome::Signaled(9));
        assert_eq!(m.wall_us, 2_000_000);
    }

    #[test]
    fn a_timeout_or_a_cancel_wins_over_the_signal_that_ended_it() {
        let m = measure(exit_after_two_seconds(15), Some(ExitOutcome::TimedOut), Collected::default());
        assert_eq!(m.exit, ExitOutcome::TimedOut);
        assert_eq!(m.wall_us, 2_000_000, "times still come from the exit");
        let m = measure(exit_after_two_seconds(9), Some(ExitOutcome::Cancelled), Collected::default());
        assert_eq!(m.exit, ExitOutcome::Cancelled);
    }

    #[test]
    fn the_wrappers_exec_failure_is_a_spawn_failure_with_its_reason() {
        let failed =
            Collected { exec_failed: Some("cannot execute \"nope\": not found".into()), ..Collected::default() };
        let m = measure(exit_after_two_seconds(EXIT_EXEC_FAILED << 8), None, failed);
        assert_eq!(m.exit, ExitOutcome::SpawnFailed("cannot execute \"nope\": not found".into()));
        assert!(m.counters.is_empty() && m.counter_series.is_empty());
        assert_eq!(missing_reasons(&m), BTreeSet::from(["the workload did not start".to_string()]));
        // The same code without the wrapper's marker is the workload's own.
        let m = measure(exit_after_two_seconds(EXIT_EXEC_FAILED << 8), None, Collected::default());
        assert_eq!(m.exit, ExitOutcome::Exited(EXIT_EXEC_FAILED));
        assert_eq!(missing_reasons(&m), BTreeSet::from(["no perf here".to_string()]));
    }

    #[test]
    fn an_end_not_observed_is_a_spawn_failure_saying_why() {
        let reason = "waiting for the workload failed: EINVAL".to_string();
        let m = measure(|_| Some(Err(reason.clone())), None, Collected::default());
        assert_eq!(m.exit, ExitOutcome::SpawnFailed(reason));
        assert_eq!((m.user_us, m.sys_us), (0, 0));
        assert_eq!(missing_reasons(&m), BTreeSet::from(["the workload did not start".to_string()]));
        let m = measure(|_| None, None, Collected::default());
        assert_eq!(m.exit, ExitOutcome::SpawnFailed("the workload's end was not observed".into()));
        // A stop asked for is still what ended it.
        let m = measure(|_| None, Some(ExitOutcome::Cancelled), Collected::default());
        assert_eq!(m.exit, ExitOutcome::Cancelled);
    }

    #[test]
    fn final_metrics_fall_back_to_the_last_epoch_and_dropped_epochs_are_noted() {
        let epoch = |n: u32, loss: f64| EpochMetrics {
            epoch: n,
            elapsed_us: u64::from(n) * 1000,
            metrics: Metrics::from([("loss".to_string(), loss)]),
            checkpoint: None,
        };
        let collected =
            Collected { epochs: vec![epoch(1, 0.5), epoch(2, 0.25)], epochs_dropped: 3, ..Collected::default() };
        let m = measure(exit_after_two_seconds(0), None, collected);
        assert_eq!(m.final_metrics, Metrics::from([("loss".to_string(), 0.25)]));
        assert_eq!(m.epochs.len(), 2);
        assert!(
            m.log_tail.contains(&format!("3 epoch lines beyond the first {MAX_EPOCHS} not kept")),
            "{}",
            m.log_tail
        );
        let final_line = Collected {
            epochs: vec![epoch(1, 0.5)],
            final_metrics: Some(Metrics::from([("accuracy".to_string(), 0.9)])),
            ..Collected::default()
        };
        let m = measure(exit_after_two_seconds(0), None, final_line);
        assert_eq!(m.final_metrics, Metrics::from([("accuracy".to_string(), 0.9)]));
        assert!(m.log_tail.is_empty(), "{}", m.log_tail);
    }

    #[test]
    fn an_unpinned_trial_is_estimated_on_the_machines_cpus() {
        let run = |pinned: &[u32]| {
            let mut e = ended(None, None, Collected::default());
            e.monitored.exited = exit_after_two_seconds(0)(e.start);
            assemble(&eight_cpus(), pinned, e).energy.joules
        };
        let (one, unpinned) = (run(&[0]), run(&[]));
        assert!(unpinned > one, "unpinned {unpinned} J on 8 CPUs, pinned {one} J on 1");
        assert_eq!(run(&[0, 1, 2, 3, 4, 5, 6, 7]), unpinned);
    }

    #[test]
    fn a_trial_beside_others_gets_its_cpu_time_share_of_the_machine() {
        assert_eq!(cpu_share(500_000, (Some(1_000_000), Some(3_000_000))), Some(0.25));
        assert_eq!(cpu_share(500_000, (None, Some(3_000_000))), None, "not shared");
        assert_eq!(cpu_share(500_000, (Some(3_000_000), Some(3_000_000))), None, "no busy time seen");
        assert_eq!(cpu_share(9_000_000, (Some(1_000_000), Some(3_000_000))), Some(1.0), "never more than all of it");
        let mut e = ended(None, None, Collected::default());
        e.machine_busy_us = (Some(0), Some(4_000_000));
        let m = assemble(&eight_cpus(), &[0], e);
        assert_eq!(m.cpu_share, Some((m.user_us + m.sys_us) as f64 / 4e6));
    }
}
