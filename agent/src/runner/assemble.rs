//! The measurement of a trial that ran, from what it left: times, the exit
//! (mapped from how the workload ended: its exit code or signal, a timeout
//! or a cancel, an exec that failed, an end never seen), counters, profile,
//! energy, segments, metrics and the log tail.

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use tunefleet_common::measurement::{AppliedLimits, ExitOutcome, Measurement, MissingCounter, WindowProfile};
use tunefleet_common::profile::Profile;

use super::output::{micros, Collected, MAX_EPOCHS};
use super::start::Exited;
use crate::counters::CounterSet;
use crate::energy::{EnergyMeter, Usage};
use crate::exec::EXIT_EXEC_FAILED;
use crate::pipeline::{Boundary, Pipeline};
use crate::procfs;

/// What the monitor saw until the workload ended and its output closed.
pub(super) struct Monitored {
    pub(super) exited: Option<Result<Exited, String>>,
    pub(super) stopped: Option<ExitOutcome>,
    pub(super) collected: Collected,
    pub(super) peak_rss: Option<u64>,
}

/// What a trial that ran leaves for its measurement, once its output
/// readers, RSS sampler and cgroup are gone.
pub(super) struct Ended {
    pub(super) started_unix_ms: u64,
    pub(super) start: Instant,
    pub(super) limits: AppliedLimits,
    pub(super) counters: CounterSet,
    pub(super) meter: Box<dyn EnergyMeter>,
    pub(super) pipeline: Pipeline,
    pub(super) last_boundary: Option<Boundary>,
    pub(super) window_profile: Option<WindowProfile>,
    pub(super) monitored: Monitored,
}

/// The measurement of a trial that ran. `machine_cpus` are the cores of a
/// trial not pinned (`pinned` empty), for the energy estimate.
pub(super) fn assemble(machine_cpus: u32, pinned: &[u32], ended: Ended) -> Measurement {
    let Ended { started_unix_ms, start, limits, counters, meter, pipeline, last_boundary, window_profile, monitored } =
        ended;
    let Monitored { exited, stopped, mut collected, peak_rss } = monitored;
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
        joules: meter.so_far(&usage),
        cpu_us: Some(user_us + sys_us),
    });
    let (segments, selected) = pipeline.finish(end);
    let energy = meter.stop(wall, &usage);
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
        interference: Vec::new(),
    }
}
