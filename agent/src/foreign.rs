//! Load from outside the agent's trials: how much of the agent's CPUs went
//! to processes that are neither its running trials nor the agent itself,
//! and the interference flag a trial's measurement gets when that load was
//! high while it ran.
//!
//! * [`TrialRegistry`]: the runner registers each trial's processes
//!   ([`Members`]: its cgroup or its process group) when it starts the
//!   workload, and ends the registration with the leader's final CPU time
//!   when the workload exits. The telemetry sampler reads it.
//! * [`ForeignMeter`]: at every telemetry sample, the CPU time (clock ticks,
//!   from `/proc/PID/stat`) the registered trials and the agent used since
//!   the previous sample. [`foreign_fraction`] turns it, with the busy and
//!   total ticks of the agent's CPUs from `/proc/stat`, into the fraction
//!   published as `Telemetry::foreign_cpu`.
//! * [`ForeignPeaks`] and [`interference_reason`]: the largest foreign load
//!   seen in a sample taken while each trial ran, and the reason its
//!   measurement carries when that exceeded `--interference-threshold`.
//!
//! What counts as the trial: every process of its cgroup or process group,
//! its own user and system time plus that of the children it waited for
//! (`cutime`, `cstime`). Summing both over the live members and taking the
//! difference between two samples counts a short-lived child that a member
//! reaped in between (its time moves into its parent's `cutime`); a member
//! that vanished while its parent is not a member (an orphan reaped by
//! init) is not subtracted, so its last partial interval is lost. When the
//! workload exits, the runner hands over the leader's total as a zombie
//! (itself and every child it waited for), which covers the trial's last
//! partial interval: without it, the tail of a trial that just ended would
//! look like load from outside to the next trial.
//!
//! The agent's own threads (MQTT, samplers, output readers) are not
//! foreign: their user and system time is subtracted too (not its `cutime`,
//! which includes the trials it reaped). Everything else busy on the
//! agent's CPUs is foreign, steal time of a virtual machine included (it is
//! another guest's load). A sample is blocking `/proc` I/O on the agent's
//! runtime thread, once per telemetry interval: one `/proc` scan per trial
//! without a cgroup (about 1 ms per 100 processes), one `cgroup.procs` read
//! per trial with one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::procfs::{self, Members};

/// The default `--interference-threshold`: a quarter of the agent's CPUs.
pub use tunefleet_common::agent_cli::DEFAULT_INTERFERENCE_THRESHOLD as DEFAULT_THRESHOLD;

/// The busy fraction of the agent's CPUs spent outside its trials and
/// itself: `busy` ticks of those CPUs minus `excluded` ticks (the trials'
/// and the agent's CPU time), over `total` ticks (elapsed time × CPUs),
/// clamped to 0..=1. `None` when no time passed.
pub fn foreign_fraction(busy: u64, excluded: u64, total: u64) -> Option<f64> {
    if total == 0 {
        return None;
    }
    Some((busy.saturating_sub(excluded) as f64 / total as f64).clamp(0.0, 1.0))
}

/// CPU time of one process of a trial at a reading, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcTimes {
    pub pid: i32,
    pub ppid: i32,
    /// Its own user and system time.
    pub own: u64,
    /// User and system time of the children it waited for.
    pub reaped: u64,
}

impl ProcTimes {
    fn total(&self) -> u64 {
        self.own.saturating_add(self.reaped)
    }

    fn from_stat(pid: i32, s: &procfs::StatFields) -> Self {
        ProcTimes { pid, ppid: s.ppid, own: s.utime + s.stime, reaped: s.cutime + s.cstime }
    }
}

/// Ticks a trial's processes used between two readings of its live
/// members: the sum now minus the sum before of the processes still there
/// and of those reaped by a member still there (their time is in the
/// parent's `reaped` now). A process new since `prev` counts in full.
pub fn trial_ticks(prev: &[ProcTimes], now: &[ProcTimes]) -> u64 {
    let live: BTreeSet<i32> = now.iter().map(|p| p.pid).collect();
    let after: u64 = now.iter().map(ProcTimes::total).sum();
    let before: u64 =
        prev.iter().filter(|p| live.contains(&p.pid) || live.contains(&p.ppid)).map(ProcTimes::total).sum();
    after.saturating_sub(before)
}

/// Ticks a trial used in its last partial interval: the leader's final
/// total (itself and every child it waited for) minus what the previous
/// reading counted. `None` (the end was not observed): nothing.
pub fn ended_ticks(prev: &[ProcTimes], final_ticks: Option<u64>) -> u64 {
    let before: u64 = prev.iter().map(ProcTimes::total).sum();
    final_ticks.map_or(0, |f| f.saturating_sub(before))
}

#[derive(Debug)]
struct Entry {
    members: Members,
    /// `Some` once the workload exited: the leader's final CPU time, when read.
    ended: Option<Option<u64>>,
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    entries: BTreeMap<u64, Entry>,
    /// A [`ForeignMeter`] reads it: ended entries wait for its next sample.
    watched: bool,
}

/// The running trials' processes, shared by the runner (which registers
/// them) and the telemetry sampler (which reads them). Cloning shares it.
#[derive(Debug, Clone, Default)]
pub struct TrialRegistry {
    inner: Arc<Mutex<Registry>>,
}

/// One trial's registration; ends (without a final reading) when dropped.
#[derive(Debug)]
pub struct Registration {
    registry: TrialRegistry,
    id: u64,
}

/// A registered trial as the meter sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    pub id: u64,
    pub members: Members,
    /// `Some` once ended, with the leader's final CPU time when read.
    pub ended: Option<Option<u64>>,
}

impl TrialRegistry {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Every critical section leaves the map consistent: a panic in
        // another holder cannot have left it half-changed.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a trial's processes until the registration ends.
    pub fn register(&self, members: Members) -> Registration {
        let mut r = self.lock();
        let id = r.next;
        r.next += 1;
        r.entries.insert(id, Entry { members, ended: None });
        Registration { registry: self.clone(), id }
    }

    /// Every registered trial; ended ones are handed out once, then forgotten.
    pub fn take_snapshot(&self) -> Vec<Registered> {
        let mut r = self.lock();
        r.watched = true;
        let out: Vec<Registered> =
            r.entries.iter().map(|(&id, e)| Registered { id, members: e.members.clone(), ended: e.ended }).collect();
        r.entries.retain(|_, e| e.ended.is_none());
        out
    }

    /// Trials registered and not yet ended.
    pub fn running(&self) -> usize {
        self.lock().entries.values().filter(|e| e.ended.is_none()).count()
    }

    fn end(&self, id: u64, final_ticks: Option<u64>) {
        let mut r = self.lock();
        if !r.watched {
            r.entries.remove(&id);
        } else if let Some(e) = r.entries.get_mut(&id) {
            if e.ended.is_none() {
                e.ended = Some(final_ticks);
            }
        }
    }
}

impl Registration {
    /// The workload exited: `final_ticks` is the leader's user and system
    /// time plus its waited-for children's, read while it was a zombie.
    pub fn end(&self, final_ticks: Option<u64>) {
        self.registry.end(self.id, final_ticks);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.end(self.id, None);
    }
}

/// The CPU times of every live process of a trial.
pub fn read_members(proc_root: &Path, members: &Members) -> Vec<ProcTimes> {
    crate::live::trial_processes(proc_root, members)
        .into_iter()
        .filter_map(|pid| procfs::read_stat(proc_root, pid).map(|s| ProcTimes::from_stat(pid, &s)))
        .collect()
}

/// The agent's own user and system time (all its threads), in ticks.
fn read_own(proc_root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join("self").join("stat")).ok()?;
    procfs::parse_stat(&text).map(|s| s.utime + s.stime)
}

/// Counts the CPU time of the registered trials and of the agent between
/// calls (see the module doc).
#[derive(Debug)]
pub struct ForeignMeter {
    proc_root: PathBuf,
    registry: TrialRegistry,
    prev: BTreeMap<u64, Vec<ProcTimes>>,
    prev_own: Option<u64>,
}

impl ForeignMeter {
    /// Starts counting now.
    pub fn new(proc_root: &Path, registry: TrialRegistry) -> Self {
        let mut meter =
            ForeignMeter { proc_root: proc_root.to_path_buf(), registry, prev: BTreeMap::new(), prev_own: None };
        let _ = meter.excluded_ticks();
        meter
    }

    /// Ticks the trials and the agent used since the previous call.
    pub fn excluded_ticks(&mut self) -> u64 {
        let mut ticks = 0u64;
        let mut next = BTreeMap::new();
        for entry in self.registry.take_snapshot() {
            let prev = self.prev.remove(&entry.id).unwrap_or_default();
            match entry.ended {
                Some(final_ticks) => ticks = ticks.saturating_add(ended_ticks(&prev, final_ticks)),
                None => {
                    let now = read_members(&self.proc_root, &entry.members);
                    if now.is_empty() && !prev.is_empty() {
                        // Reaped but not yet marked ended: the final reading covers it.
                        next.insert(entry.id, prev);
                        continue;
                    }
                    ticks = ticks.saturating_add(trial_ticks(&prev, &now));
                    next.insert(entry.id, now);
                }
            }
        }
        self.prev = next;
        let own = read_own(&self.proc_root);
        if let (Some(before), Some(now)) = (self.prev_own, own) {
            ticks = ticks.saturating_add(now.saturating_sub(before));
        }
        if own.is_some() {
            self.prev_own = own;
        }
        ticks
    }
}

/// Why a measurement may not represent its configuration, when the largest
/// foreign load seen while it ran exceeded `threshold`.
pub fn interference_reason(peak: Option<f64>, threshold: f64) -> Option<String> {
    let peak = peak.filter(|p| *p > threshold)?;
    Some(format!("load from outside the trial reached {peak:.2} of the agent's CPUs (threshold {threshold:.2})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn p(pid: i32, ppid: i32, own: u64, reaped: u64) -> ProcTimes {
        ProcTimes { pid, ppid, own, reaped }
    }

    #[test]
    fn fraction_of_the_agents_cpus() {
        assert_eq!(foreign_fraction(150, 50, 200), Some(0.5));
        assert_eq!(foreign_fraction(100, 130, 200), Some(0.0), "more excluded than busy: none foreign");
        assert_eq!(foreign_fraction(300, 0, 200), Some(1.0));
        assert_eq!(foreign_fraction(10, 0, 0), None);
    }

    #[test]
    fn trial_ticks_follow_children_into_their_parent() {
        // Leader 10 with child 11; 11 is reaped by 10 (its 30 ticks move
        // into 10's reaped), 12 is new; 13 was an orphan reaped elsewhere.
        let prev = [p(10, 1, 100, 0), p(11, 10, 20, 0), p(13, 1, 40, 0)];
        let now = [p(10, 1, 110, 30), p(12, 10, 5, 0)];
        // (110 + 30 + 5) - (100 + 20): 10 own, 10 more of 11's, 5 of 12's.
        assert_eq!(trial_ticks(&prev, &now), 25);
        assert_eq!(trial_ticks(&[], &now), 145, "a new trial counts in full");
        assert_eq!(trial_ticks(&now, &now), 0);
        assert_eq!(trial_ticks(&now, &[]), 0);
        assert_eq!(ended_ticks(&now, Some(160)), 15);
        assert_eq!(ended_ticks(&now, Some(100)), 0);
        assert_eq!(ended_ticks(&now, None), 0);
    }

    #[test]
    fn interference_above_the_threshold_only() {
        let reason = interference_reason(Some(0.823), 0.25).expect("flagged");
        assert_eq!(reason, "load from outside the trial reached 0.82 of the agent's CPUs (threshold 0.25)");
        assert_eq!(interference_reason(Some(0.25), 0.25), None, "at the threshold: not exceeded");
        assert_eq!(interference_reason(Some(0.1), 0.25), None);
        assert_eq!(interference_reason(None, 0.25), None, "no sample while it ran");
    }

    use crate::procfs::fixture::stat as process;

    #[test]
    fn meter_on_a_fixture_proc_tree() {
        let root = tempfile::tempdir().expect("tempdir");
        let proc_root = root.path();
        // The agent itself (its cutime counts the trials it reaped: ignored).
        process(proc_root, "self", 1, 1, [50, 10, 0, 0]);
        process(proc_root, "10", 1, 10, [100, 0, 0, 0]);
        process(proc_root, "11", 10, 10, [20, 0, 0, 0]);
        process(proc_root, "30", 1, 30, [500, 0, 0, 0]);
        let registry = TrialRegistry::default();
        let mut meter = ForeignMeter::new(proc_root, registry.clone());
        assert_eq!(meter.excluded_ticks(), 0, "nothing ran since the first reading");

        let trial = registry.register(Members::Group(10));
        assert_eq!(registry.running(), 1);
        assert_eq!(meter.excluded_ticks(), 120, "a newly registered trial counts in full");
        process(proc_root, "self", 1, 1, [52, 11, 900, 0]);
        process(proc_root, "10", 1, 10, [110, 5, 0, 0]);
        process(proc_root, "11", 10, 10, [30, 0, 0, 0]);
        process(proc_root, "30", 1, 30, [900, 0, 0, 0]);
        assert_eq!(meter.excluded_ticks(), 3 + 15 + 10, "the agent's own, the trial's; not process 30");

        // Child 11 reaped by 10 (40 ticks into its reaped), then the group
        // reaped by the agent before the runner ended the registration.
        process(proc_root, "10", 1, 10, [120, 5, 45, 0]);
        fs::remove_dir_all(proc_root.join("11")).expect("rm");
        assert_eq!(meter.excluded_ticks(), 10 + 15);
        fs::remove_dir_all(proc_root.join("10")).expect("rm");
        assert_eq!(meter.excluded_ticks(), 0, "gone but not ended: the previous reading is kept");
        trial.end(Some(190));
        assert_eq!(registry.running(), 0);
        assert_eq!(meter.excluded_ticks(), 190 - 170, "the final reading covers the last interval");
        assert_eq!(meter.excluded_ticks(), 0, "an ended trial is forgotten after one sample");
        assert!(registry.take_snapshot().is_empty());

        // A cgroup's processes, whatever their group; dropping ends it.
        process(proc_root, "40", 1, 40, [7, 0, 0, 0]);
        let procs = proc_root.join("cgroup.procs");
        fs::write(&procs, "40\n30\n").expect("write");
        let cg = registry.register(Members::Cgroup(procs));
        assert_eq!(meter.excluded_ticks(), 907);
        drop(cg);
        assert_eq!(meter.excluded_ticks(), 0, "ended without a final reading");
    }

    #[test]
    fn an_unwatched_registry_forgets_ended_trials() {
        let registry = TrialRegistry::default();
        registry.register(Members::Group(1)).end(Some(5));
        drop(registry.register(Members::Group(2)));
        assert!(registry.take_snapshot().is_empty());
        let kept = registry.register(Members::Group(3));
        kept.end(None);
        let snap = registry.take_snapshot();
        assert_eq!(snap.len(), 1, "watched now: handed out once");
        assert_eq!(snap[0].ended, Some(None));
    }
}
