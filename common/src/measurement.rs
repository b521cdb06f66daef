//! The measurement record: everything an agent learned from one trial attempt.
//!
//! Numbers are numbers (never strings), every energy figure names the source
//! that produced it, and every counter says whether it was a hardware or a
//! software event and for how long it was actually counting.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Named metric values reported by the workload (`loss`, `accuracy`, ...).
pub type Metrics = BTreeMap<String, f64>;

/// How the workload process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitOutcome {
    /// Exited on its own with this status code.
    Exited(i32),
    /// Killed by this signal (not by the agent).
    Signaled(i32),
    /// Exceeded the trial timeout; the agent killed its process group.
    TimedOut,
    /// Cancelled by the coordinator or by the agent shutting down.
    Cancelled,
    /// Could not be started (missing program, bad working directory...).
    SpawnFailed(String),
}

impl ExitOutcome {
    /// True when the workload ran to completion with status 0.
    pub fn success(&self) -> bool {
        matches!(self, ExitOutcome::Exited(0))
    }
}

/// Metrics of one epoch, as printed by the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: u32,
    /// Microseconds since the workload started.
    pub elapsed_us: u64,
    pub metrics: Metrics,
}

/// Whether a counter came from the PMU or from the kernel's software events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CounterKind {
    Hardware,
    Software,
}

/// One perf counter over the whole process tree of the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterReading {
    /// perf-style event name, e.g. `task-clock`, `instructions`.
    pub event: String,
    pub kind: CounterKind,
    /// Raw count as read from the kernel.
    pub value: u64,
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
}

impl CounterReading {
    /// True when the kernel multiplexed this counter (it ran part of the time).
    pub fn multiplexed(&self) -> bool {
        self.time_running_ns < self.time_enabled_ns
    }

    /// The count scaled for multiplexing: `value * enabled / running`.
    pub fn scaled(&self) -> f64 {
        if self.time_running_ns == 0 {
            0.0
        } else {
            self.value as f64 * self.time_enabled_ns as f64 / self.time_running_ns as f64
        }
    }
}

/// A counter that was asked for and could not be measured, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingCounter {
    pub event: String,
    pub reason: String,
}

/// Where an energy figure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EnergySourceKind {
    /// RAPL through the powercap sysfs interface.
    Rapl,
    /// A hwmon energy counter or power sensor.
    Hwmon,
    /// A battery fuel gauge (phones, laptops).
    Battery,
    /// A model estimate from CPU utilisation; no meter was read.
    Estimated,
}

impl EnergySourceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EnergySourceKind::Rapl => "rapl",
            EnergySourceKind::Hwmon => "hwmon",
            EnergySourceKind::Battery => "battery",
            EnergySourceKind::Estimated => "estimated",
        }
    }
}

impl std::fmt::Display for EnergySourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Energy of one domain (package-0, dram, battery, cpu-estimate...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainEnergy {
    pub domain: String,
    pub joules: f64,
}

/// Energy used while the workload ran, with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnergyReading {
    pub source: EnergySourceKind,
    /// Total over the domains, counted once (sub-zones are not added to their package).
    pub joules: f64,
    pub domains: Vec<DomainEnergy>,
    /// Sampling interval used while the workload ran.
    pub interval_ms: u32,
    /// False when the figure cannot be trusted (battery charging, a zone vanished...).
    pub valid: bool,
    /// Why the figure is invalid, or a note on how it was made.
    pub note: Option<String>,
}

/// How the memory limit of a trial was enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum MemoryLimit {
    /// No limit was asked for.
    None,
    /// A cgroup v2 `memory.max` of this many bytes.
    Cgroup { bytes: u64 },
    /// `RLIMIT_AS` of this many bytes (no usable cgroup v2 memory controller).
    Rlimit { bytes: u64 },
}

/// The system parameters as they were really applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedLimits {
    /// CPUs the process tree was pinned to; empty when not pinned.
    pub cpus: Vec<u32>,
    pub threads: Option<u32>,
    pub memory: MemoryLimit,
}

/// Everything measured for one attempt of one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Unix time in milliseconds when the workload was started.
    pub started_unix_ms: u64,
    pub wall_us: u64,
    pub user_us: u64,
    pub sys_us: u64,
    /// Peak resident set of the largest process of the tree, in KiB.
    pub max_rss_kib: u64,
    pub exit: ExitOutcome,
    pub epochs: Vec<EpochMetrics>,
    /// Final metrics: the workload's `final` line, or else its last epoch.
    pub final_metrics: Metrics,
    pub counters: Vec<CounterReading>,
    pub counters_missing: Vec<MissingCounter>,
    pub energy: EnergyReading,
    pub limits: AppliedLimits,
    /// The last lines of the workload's output that were not metric lines.
    pub log_tail: String,
}

impl Measurement {
    /// The value an objective refers to: `wall_time` (seconds), `energy`
    /// (joules), `cpu_time` (seconds), or a reported metric by name.
    pub fn objective_value(&self, name: &str) -> Option<f64> {
        match name {
            "wall_time" => Some(self.wall_us as f64 / 1e6),
            "cpu_time" => Some((self.user_us + self.sys_us) as f64 / 1e6),
            "energy" => Some(self.energy.joules),
            other => self.final_metrics.get(other).copied(),
        }
    }
}
