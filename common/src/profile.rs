//! The workload profile: a fixed-length, versioned vector derived from the
//! perf counters of one run, for comparing and clustering workloads.
//!
//! Every feature is a rate normalised so that features share a scale and do
//! not depend on how long the run was or how many threads it used:
//!
//! | # | feature | definition |
//! |---|---|---|
//! | 0 | `cpus_busy` | task-clock seconds per wall second |
//! | 1 | `cpus_busy_cv` | coefficient of variation of `cpus_busy` over the sampled intervals |
//! | 2 | `log_ctx_switches_per_cpu_s` | log10(1 + context switches per task-clock second) |
//! | 3 | `log_migrations_per_cpu_s` | log10(1 + CPU migrations per task-clock second) |
//! | 4 | `log_minor_faults_per_cpu_s` | log10(1 + minor faults per task-clock second) |
//! | 5 | `log_major_faults_per_cpu_s` | log10(1 + major faults per task-clock second) |
//! | 6 | `ipc` | instructions per cycle |
//! | 7 | `giga_instructions_per_cpu_s` | instructions per task-clock nanosecond |
//! | 8 | `cache_refs_per_kilo_instr` | cache references per 1000 instructions, log10(1 + x) |
//! | 9 | `cache_miss_ratio` | cache misses / cache references |
//! | 10 | `branches_per_instr` | branch instructions per instruction |
//! | 11 | `branch_miss_ratio` | branch misses / branch instructions |
//! | 12 | `llc_loads_per_kilo_instr` | LLC loads per 1000 instructions, log10(1 + x) |
//! | 13 | `llc_load_miss_ratio` | LLC load misses / LLC loads |
//! | 14 | `stalled_frontend_per_cycle` | stalled-cycles-frontend / cycles |
//! | 15 | `stalled_backend_per_cycle` | stalled-cycles-backend / cycles |
//! | 16 | `log_rss_mib` | log10(1 + resident MiB of the trial's processes at the window's end) |
//! | 17 | `rss_growth_mib_per_s` | resident MiB gained per wall second over the window (from nothing at the start of the workload for a first window), signed log10(1 + \|x\|) |
//! | 18 | `log_io_kib_per_s` | log10(1 + KiB read and written through syscalls per wall second) (`rchar + wchar`) |
//! | 19 | `log_io_syscalls_per_s` | log10(1 + read and write syscalls per wall second) (`syscr + syscw`) |
//! | 20 | `voluntary_switch_share` | voluntary / all context switches of the trial's threads |
//! | 21 | `log_switches_per_s` | log10(1 + context switches per wall second), from `/proc` |
//! | 22 | `log2_threads` | log2 of the trial's threads at the window's end |
//! | 23 | `speedup_best` | time per unit under the first probed configuration / under the best one |
//! | 24 | `energy_ratio_best` | energy per unit under the best configuration / under the first one |
//!
//! Features 0 to 15 come from perf counters, 16 to 22 from `/proc` (every
//! Linux has them, no PMU needed): together they are the *window profile*
//! an agent derives at the end of a pipelined trial's first window
//! ([`Profile::window`]). Features 23 and 24 are the scaling signature, known
//! only once the probe windows have run; the coordinator adds them
//! ([`Profile::set`]). A whole-run profile ([`Profile::derive`]) has no
//! `/proc` features.
//!
//! A feature whose counters were not measured (no PMU, qemu-user, a zero
//! denominator) is `None`: missing, never an invented zero. Counts are scaled
//! for multiplexing before use. [`PROFILE_VERSION`] changes whenever the list
//! or a definition changes; vectors of different versions are not compared.

use serde::{Deserialize, Serialize};

use crate::counter::{CounterReading, CounterSample};

/// Version of the feature list below.
pub const PROFILE_VERSION: u16 = 2;

/// Feature names, in vector order.
pub const FEATURES: [&str; 25] = [
    "cpus_busy",
    "cpus_busy_cv",
    "log_ctx_switches_per_cpu_s",
    "log_migrations_per_cpu_s",
    "log_minor_faults_per_cpu_s",
    "log_major_faults_per_cpu_s",
    "ipc",
    "giga_instructions_per_cpu_s",
    "cache_refs_per_kilo_instr",
    "cache_miss_ratio",
    "branches_per_instr",
    "branch_miss_ratio",
    "llc_loads_per_kilo_instr",
    "llc_load_miss_ratio",
    "stalled_frontend_per_cycle",
    "stalled_backend_per_cycle",
    "log_rss_mib",
    "rss_growth_mib_per_s",
    "log_io_kib_per_s",
    "log_io_syscalls_per_s",
    "voluntary_switch_share",
    "log_switches_per_s",
    "log2_threads",
    "speedup_best",
    "energy_ratio_best",
];

/// The features the coordinator classifies a new job on: those known at
/// the end of its first window, less three that describe the machine or
/// the configuration rather than the job (CPU migrations: the scheduler;
/// major faults: what the page cache held; threads: the configuration's
/// thread count). Measured on the three bundled workloads, these three
/// varied as much between runs of one job as between jobs (BENCHMARKS.md).
pub const WINDOW_FEATURES: [usize; 19] = [0, 1, 2, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20];

/// What `/proc` says about a trial's processes, summed over them: counts
/// since each process started, and sizes now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcCounts {
    /// Resident set, KiB (`VmRSS`).
    pub rss_kib: u64,
    /// Bytes read and written through syscalls (`/proc/PID/io`).
    pub rchar: u64,
    pub wchar: u64,
    /// Read and write syscalls.
    pub syscr: u64,
    pub syscw: u64,
    /// Context switches of every thread (`/proc/PID/task/TID/status`).
    pub voluntary: u64,
    pub involuntary: u64,
    pub threads: u64,
    /// Processes counted (0: nothing could be read).
    pub processes: u32,
}

/// A profile vector: `values[i]` is feature `FEATURES[i]` of `version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub version: u16,
    pub values: Vec<Option<f64>>,
}

impl Default for Profile {
    fn default() -> Self {
        Profile::empty()
    }
}

/// Why two profiles cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile versions differ: {0} and {1}")]
    Version(u16, u16),
    #[error("the profiles share no measured feature")]
    NothingInCommon,
}

fn log1p10(x: f64) -> f64 {
    (1.0 + x.max(0.0)).log10()
}

fn ratio(num: Option<f64>, den: Option<f64>) -> Option<f64> {
    match (num, den) {
        (Some(n), Some(d)) if d > 0.0 => Some(n / d),
        _ => None,
    }
}

impl Profile {
    /// A profile of this version with every feature missing.
    pub fn empty() -> Self {
        Profile { version: PROFILE_VERSION, values: vec![None; FEATURES.len()] }
    }

    /// The value of feature `name`, if it was measured.
    pub fn get(&self, name: &str) -> Option<f64> {
        let i = FEATURES.iter().position(|f| *f == name)?;
        self.values.get(i).copied().flatten()
    }

    /// Sets feature `name` (the coordinator adds the scaling signature);
    /// false when no feature has that name.
    pub fn set(&mut self, name: &str, value: Option<f64>) -> bool {
        let Some(i) = FEATURES.iter().position(|f| *f == name) else { return false };
        if self.values.len() < FEATURES.len() {
            self.values.resize(FEATURES.len(), None);
        }
        self.values[i] = value.filter(|v| v.is_finite());
        true
    }

    /// The profile of a window that started with the trial: counters
    /// counted from the start (totals at the window's end), `/proc` at the
    /// start (`before`, `None` when it could not be read: growth is then
    /// missing) and at the end (`after`), and the window's wall time.
    pub fn window(counters: &[CounterReading], before: Option<&ProcCounts>, after: &ProcCounts, wall_us: u64) -> Self {
        let mut p = Profile::derive(counters, &[], wall_us);
        let wall_s = wall_us as f64 / 1e6;
        if after.processes == 0 || wall_s <= 0.0 {
            return p;
        }
        let base = before.copied().unwrap_or_default();
        let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / wall_s;
        let mib = |kib: u64| kib as f64 / 1024.0;
        let growth = before.map(|b| (mib(after.rss_kib) - mib(b.rss_kib)) / wall_s);
        let switches = (after.voluntary + after.involuntary).saturating_sub(base.voluntary + base.involuntary);
        let voluntary = after.voluntary.saturating_sub(base.voluntary);
        let io_kib = per_s(after.rchar + after.wchar, base.rchar + base.wchar) / 1024.0;
        p.set("log_rss_mib", Some(log1p10(mib(after.rss_kib))));
        p.set("rss_growth_mib_per_s", growth.map(|g| g.signum() * log1p10(g.abs())));
        p.set("log_io_kib_per_s", Some(log1p10(io_kib)));
        p.set("log_io_syscalls_per_s", Some(log1p10(per_s(after.syscr + after.syscw, base.syscr + base.syscw))));
        p.set("voluntary_switch_share", ratio(Some(voluntary as f64), Some(switches as f64)));
        p.set("log_switches_per_s", Some(log1p10(switches as f64 / wall_s)));
        p.set("log2_threads", (after.threads > 0).then(|| (after.threads as f64).log2()));
        p
    }

    /// Derives the profile from the run's counter totals, its sampled
    /// series (same counter order as `counters`) and its wall time.
    pub fn derive(counters: &[CounterReading], series: &[CounterSample], wall_us: u64) -> Self {
        let index = |event: &str| {
            counters
                .iter()
                .position(|c| c.event.strip_suffix(":u").unwrap_or(&c.event) == event && c.time_running_ns > 0)
        };
        let total = |event: &str| index(event).map(|i| counters[i].scaled());
        let task_ns = total("task-clock");
        let cpu_s = task_ns.map(|ns| ns / 1e9).filter(|s| *s > 0.0);
        let wall_s = wall_us as f64 / 1e6;
        let per_cpu_s = |event: &str| ratio(total(event), cpu_s).map(log1p10);
        let per_kilo_instr = |event: &str| ratio(total(event), total("instructions")).map(|r| log1p10(r * 1000.0));
        let cv = index("task-clock").and_then(|i| busy_cv(series, i));
        let mut values = vec![
            ratio(task_ns.map(|ns| ns / 1e9), Some(wall_s)),
            cv,
            per_cpu_s("context-switches"),
            per_cpu_s("cpu-migrations"),
            per_cpu_s("minor-faults"),
            per_cpu_s("major-faults"),
            ratio(total("instructions"), total("cycles")),
            ratio(total("instructions"), task_ns),
            per_kilo_instr("cache-references"),
            ratio(total("cache-misses"), total("cache-references")),
            ratio(total("branch-instructions"), total("instructions")),
            ratio(total("branch-misses"), total("branch-instructions")),
            per_kilo_instr("LLC-loads"),
            ratio(total("LLC-load-misses"), total("LLC-loads")),
            ratio(total("stalled-cycles-frontend"), total("cycles")),
            ratio(total("stalled-cycles-backend"), total("cycles")),
        ];
        values.resize(FEATURES.len(), None);
        Profile { version: PROFILE_VERSION, values }
    }

    /// Euclidean distance over the features both profiles measured.
    pub fn distance(&self, other: &Profile) -> Result<f64, ProfileError> {
        if self.version != other.version {
            return Err(ProfileError::Version(self.version, other.version));
        }
        let mut sum = 0.0;
        let mut shared = 0;
        for (a, b) in self.values.iter().zip(&other.values) {
            if let (Some(a), Some(b)) = (a, b) {
                sum += (a - b) * (a - b);
                shared += 1;
            }
        }
        if shared == 0 {
            return Err(ProfileError::NothingInCommon);
        }
        Ok(sum.sqrt())
    }
}

/// Coefficient of variation of CPUs busy per interval, from the task-clock
/// column `col` of `series`; `None` with fewer than two full intervals.
fn busy_cv(series: &[CounterSample], col: usize) -> Option<f64> {
    let mut busy = Vec::new();
    let mut prev_ms = 0u64;
    for s in series {
        let dt_ms = s.elapsed_ms.saturating_sub(prev_ms);
        prev_ms = s.elapsed_ms;
        if let (Some(d), true) = (s.deltas.get(col), dt_ms > 0) {
            busy.push(d / (dt_ms as f64 * 1e6));
        }
    }
    if busy.len() < 2 {
        return None;
    }
    let n = busy.len() as f64;
    let mean = busy.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return None;
    }
    let var = busy.iter().map(|b| (b - mean) * (b - mean)).sum::<f64>() / n;
    Some(var.sqrt() / mean)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::CounterKind;

    fn counter(event: &str, value: u64) -> CounterReading {
        CounterReading {
            event: event.into(),
            kind: CounterKind::Software,
            value,
            time_enabled_ns: 1_000,
            time_running_ns: 1_000,
        }
    }

    #[test]
    fn software_only_marks_hardware_features_missing() {
        let counters = [
            counter("task-clock", 2_000_000_000),
            counter("context-switches:u", 99),
            counter("cpu-migrations", 0),
            counter("minor-faults", 9_999),
            counter("major-faults", 0),
        ];
        let p = Profile::derive(&counters, &[], 1_000_000);
        assert_eq!(p.values.len(), FEATURES.len());
        assert_eq!(p.get("cpus_busy"), Some(2.0));
        // 99 switches in 2 CPU-seconds: log10(1 + 49.5).
        assert!((p.get("log_ctx_switches_per_cpu_s").unwrap_or(0.0) - 50.5f64.log10()).abs() < 1e-12);
        assert_eq!(p.get("log_migrations_per_cpu_s"), Some(0.0));
        assert_eq!(p.get("ipc"), None);
        assert_eq!(p.get("llc_load_miss_ratio"), None);
        assert_eq!(p.get("cpus_busy_cv"), None, "no series, no variability");
    }

    #[test]
    fn multiplexed_counts_are_scaled_and_zero_denominators_are_missing() {
        let mut cycles = counter("cycles", 500);
        cycles.time_running_ns = 500; // ran half the time: scaled to 1000
        let counters = [counter("instructions", 2_000), cycles, counter("branch-instructions", 0)];
        let p = Profile::derive(&counters, &[], 1);
        assert_eq!(p.get("ipc"), Some(2.0));
        assert_eq!(p.get("branch_miss_ratio"), None);
        assert_eq!(p.get("branches_per_instr"), Some(0.0));
    }

    #[test]
    fn variability_from_the_series() {
        let counters = [counter("task-clock", 3)];
        let steady: Vec<CounterSample> =
            (1..=4).map(|i| CounterSample { elapsed_ms: i * 1000, deltas: vec![1e9] }).collect();
        assert_eq!(Profile::derive(&counters, &steady, 4_000_000).get("cpus_busy_cv"), Some(0.0));
        let bursty = vec![
            CounterSample { elapsed_ms: 1000, deltas: vec![2e9] },
            CounterSample { elapsed_ms: 2000, deltas: vec![0.0] },
        ];
        assert_eq!(Profile::derive(&counters, &bursty, 2_000_000).get("cpus_busy_cv"), Some(1.0));
    }

    #[test]
    fn window_profile_from_proc_counts() {
        let counters = [counter("task-clock", 500_000_000)];
        let before = ProcCounts { rss_kib: 1024, processes: 1, ..Default::default() };
        let after = ProcCounts {
            rss_kib: 3 * 1024,
            rchar: 1024 * 1024,
            wchar: 1024 * 1024,
            syscr: 90,
            syscw: 9,
            voluntary: 30,
            involuntary: 10,
            threads: 4,
            processes: 1,
        };
        let p = Profile::window(&counters, Some(&before), &after, 2_000_000);
        assert_eq!(p.values.len(), FEATURES.len());
        assert_eq!(p.get("cpus_busy"), Some(0.25));
        assert_eq!(p.get("log_rss_mib"), Some(4f64.log10()));
        // 2 MiB more in 2 s: +1 MiB/s.
        assert_eq!(p.get("rss_growth_mib_per_s"), Some(2f64.log10()));
        assert_eq!(p.get("log_io_kib_per_s"), Some(1025f64.log10()));
        assert_eq!(p.get("log_io_syscalls_per_s"), Some(50.5f64.log10()));
        assert_eq!(p.get("voluntary_switch_share"), Some(0.75));
        assert_eq!(p.get("log_switches_per_s"), Some(21f64.log10()));
        assert_eq!(p.get("log2_threads"), Some(2.0));
        assert_eq!(p.get("speedup_best"), None, "known only after probing");
        // Shrinking memory is negative growth; no first reading, no growth.
        let shrunk = Profile::window(&counters, Some(&after), &before, 1_000_000);
        assert!(shrunk.get("rss_growth_mib_per_s").is_some_and(|g| g < 0.0));
        assert_eq!(Profile::window(&counters, None, &after, 1).get("rss_growth_mib_per_s"), None);
        // Nothing read from /proc: those features are missing, not zero.
        let none = Profile::window(&counters, None, &ProcCounts::default(), 1_000_000);
        assert_eq!(none.get("log_io_kib_per_s"), None);
        assert_eq!(none.get("log2_threads"), None);
    }

    #[test]
    fn set_refuses_unknown_names_and_non_finite_values() {
        let mut p = Profile::empty();
        assert!(p.set("speedup_best", Some(1.5)));
        assert_eq!(p.get("speedup_best"), Some(1.5));
        assert!(p.set("speedup_best", Some(f64::NAN)));
        assert_eq!(p.get("speedup_best"), None);
        assert!(!p.set("no such feature", Some(1.0)));
    }

    #[test]
    fn distance_uses_shared_features_and_checks_versions() {
        let mut a = Profile::empty();
        let mut b = Profile::empty();
        assert_eq!(a.distance(&b), Err(ProfileError::NothingInCommon));
        a.values[0] = Some(1.0);
        a.values[1] = Some(5.0);
        b.values[0] = Some(4.0);
        b.values[2] = Some(7.0);
        assert_eq!(a.distance(&b), Ok(3.0));
        b.version = PROFILE_VERSION + 1;
        assert!(matches!(a.distance(&b), Err(ProfileError::Version(..))));
    }
}
