//! The measurement record: everything an agent learned from one trial attempt.
//!
//! Numbers are numbers (never strings), every energy figure names the source
//! that produced it, and every counter says whether it was a hardware or a
//! software event and for how long it was actually counting.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

// Re-exported: the counters are part of the measurement record, defined
// apart so that the profile, derived from them, needs no measurement.
pub use crate::counter::{
    push_counter_sample, CounterKind, CounterReading, CounterSample, MissingCounter, MAX_COUNTER_SAMPLES,
};
use crate::params::SystemParams;
use crate::profile::Profile;

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
    /// Where the workload saved its state after this epoch (its epoch
    /// line's `checkpoint`): a moved trial resumes from it.
    pub checkpoint: Option<String>,
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
    /// An external meter (a PDU, a smart plug, a lab meter) read through a
    /// command or an HTTP endpoint; the reading's note names which.
    External,
}

impl EnergySourceKind {
    /// Every kind, in the order documentation lists them.
    pub const ALL: [EnergySourceKind; 5] = [
        EnergySourceKind::Rapl,
        EnergySourceKind::Hwmon,
        EnergySourceKind::Battery,
        EnergySourceKind::Estimated,
        EnergySourceKind::External,
    ];

    /// The kind's name in study files and text output (`rapl`, `battery`...).
    pub fn as_str(self) -> &'static str {
        match self {
            EnergySourceKind::Rapl => "rapl",
            EnergySourceKind::Hwmon => "hwmon",
            EnergySourceKind::Battery => "battery",
            EnergySourceKind::Estimated => "estimated",
            EnergySourceKind::External => "external",
        }
    }
}

impl std::fmt::Display for EnergySourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of [`EnergySourceKind::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an energy source (rapl, hwmon, battery, estimated or external)")]
pub struct UnknownEnergySource(pub String);

impl std::str::FromStr for EnergySourceKind {
    type Err = UnknownEnergySource;

    /// Parses a name [`EnergySourceKind::as_str`] gives.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EnergySourceKind::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| UnknownEnergySource(s.to_string()))
    }
}

/// Energy of one domain (package-0, package-0/core, dram, BAT0, cpu-estimate...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainEnergy {
    pub domain: String,
    pub joules: f64,
    /// True when this domain is part of [`EnergyReading::joules`]; false for
    /// a part of another domain (a package's `core` sub-zone, a socket's
    /// cores), reported for detail but not added again.
    pub in_total: bool,
}

/// Average power over one sampling interval of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerSample {
    /// Milliseconds since the workload started, at the end of the interval.
    pub elapsed_ms: u64,
    /// Average power of the counted domains over the interval.
    pub watts: f64,
}

/// Longest power series kept in one reading; longer runs are thinned by
/// merging neighbouring samples (see [`push_power_sample`]).
pub const MAX_POWER_SAMPLES: usize = 512;

/// Appends `sample` to `series`, keeping at most [`MAX_POWER_SAMPLES`]: when
/// full, neighbouring pairs are merged into one sample (mean power, later
/// end time), so the series always covers the whole run at a coarser step.
pub fn push_power_sample(series: &mut Vec<PowerSample>, sample: PowerSample) {
    if series.len() >= MAX_POWER_SAMPLES {
        let merged: Vec<PowerSample> = series
            .chunks(2)
            .map(|pair| PowerSample {
                elapsed_ms: pair[pair.len() - 1].elapsed_ms,
                watts: pair.iter().map(|p| p.watts).sum::<f64>() / pair.len() as f64,
            })
            .collect();
        *series = merged;
    }
    series.push(sample);
}

/// Energy used while the workload ran, with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnergyReading {
    pub source: EnergySourceKind,
    /// Total over the domains, counted once (sub-zones are not added to their package).
    pub joules: f64,
    pub domains: Vec<DomainEnergy>,
    /// Sampling interval used while the workload ran (0: not sampled, a model).
    pub interval_ms: u32,
    /// False when the figure cannot be trusted (battery charging, a zone vanished...).
    pub valid: bool,
    /// Why the figure is invalid, or a note on how it was made (and which
    /// sources were skipped on the way to this one).
    pub note: Option<String>,
    /// Power of the counted domains over the run, one sample per interval
    /// (bounded, see [`MAX_POWER_SAMPLES`]); empty for a model estimate.
    pub series: Vec<PowerSample>,
}

/// How a GPU's energy over a window was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuMethod {
    /// The difference of its total-energy counter (NVML, Volta and newer).
    Counter,
    /// Its power readings integrated over the samples (trapezoids).
    PowerIntegrated,
}

impl GpuMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            GpuMethod::Counter => "counter",
            GpuMethod::PowerIntegrated => "power_integrated",
        }
    }
}

/// One GPU's energy over a trial's run (the GPUs the trial was given) or
/// over a co-measured window (every GPU of the node), with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuEnergy {
    /// NVML's index on its machine.
    pub index: u32,
    /// `GPU-...`, stable whatever the index order.
    pub uuid: String,
    pub joules: f64,
    pub method: GpuMethod,
    /// False when a read failed on the way: the figure covers less than the window.
    pub valid: bool,
    pub note: Option<String>,
}

impl GpuEnergy {
    /// This reading as a figure.
    pub fn figure(&self) -> EnergyFigure {
        EnergyFigure { joules: Some(self.joules), valid: self.valid }
    }
}

/// An energy figure as it is kept: its joules (none when nothing was
/// measured) and whether its source vouched for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EnergyFigure {
    pub joules: Option<f64>,
    pub valid: bool,
}

impl EnergyFigure {
    /// The one rule for whether energy counts: a figure its source vouched
    /// for, and a finite number. Every reader of a trial's energy (the
    /// objective, the search's second objectives, the store's views, the
    /// report, the export and the InfluxDB points) asks this.
    pub fn counted(self) -> Option<f64> {
        self.joules.filter(|j| self.valid && j.is_finite())
    }

    /// This figure and `parts`, summed: a trial's CPU and GPU energy
    /// ([`Measurement::energy_figure`]), or a trial's energy over every
    /// machine that measured it (its own agent's figure and what each
    /// co-measuring node measured of its window, `[measure] nodes`). The
    /// joules of every figure there is; valid only when each counts (a GPU
    /// read that failed, or a node that never answered, makes it invalid).
    pub fn with_parts(self, parts: impl IntoIterator<Item = EnergyFigure>) -> EnergyFigure {
        let mut sum = self.joules.unwrap_or(0.0);
        let mut valid = self.counted().is_some();
        for n in parts {
            sum += n.joules.unwrap_or(0.0);
            valid &= n.counted().is_some();
        }
        EnergyFigure { joules: Some(sum), valid }
    }
}

impl EnergyReading {
    /// This reading as a figure.
    pub fn figure(&self) -> EnergyFigure {
        EnergyFigure { joules: Some(self.joules), valid: self.valid }
    }

    /// The joules when they count ([`EnergyFigure::counted`]).
    pub fn counted(&self) -> Option<f64> {
        self.figure().counted()
    }
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
    /// The counters sampled at an interval while the workload ran.
    pub counter_series: Vec<CounterSample>,
    /// The workload's profile vector, derived from the counters.
    pub profile: Profile,
    pub energy: EnergyReading,
    pub limits: AppliedLimits,
    /// The last lines of the workload's output that were not metric lines.
    pub log_tail: String,
    /// The trial's stretches under one system configuration each: the probe
    /// windows of a pipelined trial, then the rest. Empty for a trial that
    /// ran under one configuration throughout.
    pub segments: Vec<Segment>,
    /// The configuration a pipelined trial selected after probing.
    pub selected: Option<SystemParams>,
    /// A pipelined trial's first-window profile (also sent early in
    /// [`crate::message::Progress`]); kept here because progress may be lost.
    pub window_profile: Option<WindowProfile>,
    /// Why this measurement may not represent its configuration: load from
    /// outside the trial above the agent's threshold while it ran, the
    /// device charging, throttled... Empty: clean.
    pub interference: Vec<String>,
    /// The energy of each GPU the trial was given (`gpus = N`), apart from
    /// the CPU's in `energy`; empty when it was given none. Last on the
    /// wire: a result stored before it existed (protocol 12 and older)
    /// ends where this list begins (see `codec::decode_stored_result`).
    #[serde(default)]
    pub gpus: Vec<GpuEnergy>,
    /// The trial's share of `energy` (0 to 1) where that reading is the
    /// whole machine's while other trials of its agent ran beside it (an
    /// agent of several slots, a metered source): its CPU time over the
    /// busy CPU time of the machine during its run. `None`: `energy` is the
    /// trial's alone (one slot, or the estimate, a model of its own CPU
    /// time). Last on the wire with `gpus`.
    #[serde(default)]
    pub cpu_share: Option<f64>,
}

/// Why a segment ran under its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentRole {
    /// Epochs before the first probe window.
    Warmup,
    /// A probe window.
    Probe,
    /// The rest of the trial under the selected configuration.
    Selected,
    /// Under a configuration the coordinator sent ([`crate::message::Reconfigure`]).
    Reconfigured,
    /// What a trial without a probe plan started under (reported once the
    /// coordinator reconfigured it).
    Initial,
    /// Under a configuration reused from jobs that profiled alike
    /// ([`crate::message::ReconfigureReason::Reuse`]); probing stopped.
    Reused,
    /// A probe window of steps that an epoch end cut short (its
    /// configuration is measured again in the next window).
    Cut,
}

/// The profile of the first window of a pipelined trial: what a recurring
/// job is recognised by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowProfile {
    /// The configuration the window ran under (the probe plan's first).
    pub system: SystemParams,
    /// Epochs that ended in it, and its steps when it counted steps.
    pub epochs: u32,
    pub steps: u32,
    pub wall_us: u64,
    pub profile: Profile,
}

/// One stretch of a trial under one system configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    pub role: SegmentRole,
    pub system: SystemParams,
    /// The CPUs the trial's threads were pinned to (empty: not pinned).
    pub cpus: Vec<u32>,
    /// The epochs the segment spans (1-based): from the one running when it
    /// started to the last one that ended in it (or the one running, when
    /// a window of steps ended within an epoch).
    pub first_epoch: u32,
    pub last_epoch: u32,
    /// Steps in the segment, when its windows count steps; else 0.
    pub steps: u32,
    /// Since the workload started, in microseconds.
    pub start_us: u64,
    pub wall_us: u64,
    /// Energy of the segment from the trial's energy source
    /// ([`Measurement::energy`] says which); `None` when it gives none.
    pub energy_j: Option<f64>,
    /// CPU time of the trial's processes in the segment (the task-clock
    /// software counter), when counted.
    pub cpu_us: Option<u64>,
    /// The median wall time of one unit (epoch or step) in the segment, in
    /// microseconds, when at least [`Segment::MIN_UNITS_FOR_NOISE`] units
    /// ended in it: what probe windows are compared by (an outlying unit,
    /// a checkpoint or a garbage collection, does not move it).
    pub unit_median_us: Option<u64>,
    /// The spread of its units' times relative to their median (median
    /// absolute deviation / median), measured with `unit_median_us`.
    pub unit_spread: Option<f64>,
    /// For the `Selected` segment of a pipelined trial: how far apart the
    /// kept configuration and the runner-up were, in standard errors of
    /// the difference of their windows' medians (2 or more: the choice is
    /// not noise). `None` when the windows were too short to measure noise.
    pub margin: Option<f64>,
}

impl Segment {
    /// Units a window needs before its noise is measured.
    pub const MIN_UNITS_FOR_NOISE: usize = 3;

    /// Wall time per unit as probes are compared: the median unit's when
    /// measured, else the mean.
    pub fn typical_us_per_unit(&self) -> f64 {
        self.unit_median_us.map_or_else(|| self.us_per_unit(), |m| m as f64)
    }

    /// Epochs that ended in the segment.
    pub fn epochs(&self) -> u32 {
        self.last_epoch.saturating_sub(self.first_epoch).saturating_add(1)
    }

    /// What the segment's time and energy are compared per: its steps when
    /// it counted steps, else its epochs.
    pub fn units(&self) -> u32 {
        if self.steps > 0 {
            self.steps
        } else {
            self.epochs().max(1)
        }
    }

    /// Wall time per unit (epoch or step), in microseconds.
    pub fn us_per_unit(&self) -> f64 {
        self.wall_us as f64 / f64::from(self.units())
    }

    /// Energy per unit (epoch or step), in joules.
    pub fn joules_per_unit(&self) -> Option<f64> {
        self.energy_j.map(|j| j / f64::from(self.units()))
    }
}

impl EnergyReading {
    /// No figure at all from `source` (nothing ran, or nothing could be read), with why.
    pub fn none(source: EnergySourceKind, note: impl Into<String>) -> Self {
        EnergyReading {
            source,
            joules: 0.0,
            domains: Vec::new(),
            series: Vec::new(),
            interval_ms: 0,
            valid: false,
            note: Some(note.into()),
        }
    }
}

impl Measurement {
    /// A record with nothing measured: how a workload that never ran is
    /// recorded, and a base to fill in with `..Measurement::unmeasured(..)`.
    pub fn unmeasured(exit: ExitOutcome, energy: EnergyReading) -> Self {
        Measurement {
            started_unix_ms: 0,
            wall_us: 0,
            user_us: 0,
            sys_us: 0,
            max_rss_kib: 0,
            exit,
            epochs: Vec::new(),
            final_metrics: Metrics::new(),
            counters: Vec::new(),
            counters_missing: Vec::new(),
            counter_series: Vec::new(),
            profile: Profile::empty(),
            energy,
            limits: AppliedLimits { cpus: Vec::new(), threads: None, memory: MemoryLimit::None },
            log_tail: String::new(),
            segments: Vec::new(),
            selected: None,
            window_profile: None,
            interference: Vec::new(),
            gpus: Vec::new(),
            cpu_share: None,
        }
    }

    /// The trial's energy: its share of the CPU's (`energy`) and its GPUs'
    /// (`gpus`), valid only when each part is. The one definition every
    /// reader uses: the objective, the store, the search, the report, the
    /// export and the InfluxDB points.
    pub fn energy_figure(&self) -> EnergyFigure {
        let cpu = EnergyFigure { joules: Some(self.cpu_joules()), valid: self.energy.valid };
        cpu.with_parts(self.gpus.iter().map(GpuEnergy::figure))
    }

    /// The CPU's part of the trial's energy: the reading, or the trial's
    /// share of it ([`Measurement::cpu_share`]).
    pub fn cpu_joules(&self) -> f64 {
        self.energy.joules * self.cpu_share.map_or(1.0, |s| s.clamp(0.0, 1.0))
    }

    /// The joules of its GPUs together; `None` when it was given none.
    pub fn gpu_joules(&self) -> Option<f64> {
        (!self.gpus.is_empty()).then(|| self.gpus.iter().map(|g| g.joules).sum())
    }

    /// The value an objective refers to: `wall_time` (seconds), `energy`
    /// (joules), `cpu_time` (seconds), or a reported metric by name. `None`
    /// when there is no such value, and for `energy` (the CPU's and the
    /// GPUs', [`Measurement::energy_figure`]) when a reading is not valid (a
    /// battery charging, a zone that vanished, a GPU read that failed...):
    /// such a trial has no energy to rank.
    pub fn objective_value(&self, name: &str) -> Option<f64> {
        match name {
            "wall_time" => Some(self.wall_us as f64 / 1e6),
            "cpu_time" => Some((self.user_us + self.sys_us) as f64 / 1e6),
            "energy" => self.energy_figure().counted(),
            other => self.final_metrics.get(other).copied(),
        }
    }
}

/// What an agent reports about itself at a fixed interval, for placement
/// and offloading decisions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// Unix time in milliseconds of the sample.
    pub unix_ms: u64,
    /// Interval the figures are averaged over, in milliseconds.
    pub interval_ms: u32,
    /// Busy fraction of all CPUs the agent may use, 0 to 1.
    pub cpu_utilisation: f64,
    /// Busy fraction of each CPU, 0 to 1, by CPU number order.
    pub per_cpu: Vec<f64>,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// Average power over the interval, when a meter (or the model) gives one.
    pub power_watts: Option<f64>,
    /// Where `power_watts` came from.
    pub power_source: EnergySourceKind,
    /// Trials running on the agent.
    pub running: u32,
    /// Busy fraction of the agent's CPUs spent by processes that are not
    /// its trials' (0 to 1): load from outside that would disturb a
    /// measurement. `None` when it cannot be told apart.
    pub foreign_cpu: Option<f64>,
    /// Battery, charging and thermal state, where the device has them.
    pub conditions: Conditions,
}

/// The state of a phone or laptop that makes measurements unrepresentative.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conditions {
    /// On external power (a fuel gauge then says nothing of the workload).
    pub charging: Option<bool>,
    /// Battery charge, 0 to 100.
    pub battery_percent: Option<f64>,
    /// Some CPU runs below its maximum frequency for heat (or a thermal
    /// zone is past its passive trip point).
    pub throttled: Option<bool>,
    /// Hottest thermal zone, degrees Celsius.
    pub temperature_c: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn energy_counts_only_when_vouched_for_and_finite_and_over_nodes_only_when_each_does() {
        let f = |joules, valid| EnergyFigure { joules, valid };
        assert_eq!(f(Some(2.5), true).counted(), Some(2.5));
        assert_eq!(f(Some(2.5), false).counted(), None, "not vouched for");
        assert_eq!(f(Some(f64::NAN), true).counted(), None, "not a number");
        assert_eq!(f(Some(f64::INFINITY), true).counted(), None);
        assert_eq!(f(None, true).counted(), None, "nothing measured");
        let all = f(Some(1.0), true).with_parts([f(Some(2.0), true), f(Some(4.0), true)]);
        assert_eq!(all, f(Some(7.0), true));
        assert_eq!(all.counted(), Some(7.0));
        let one_bad = f(Some(1.0), true).with_parts([f(Some(2.0), false), f(Some(4.0), true)]);
        assert_eq!(one_bad, f(Some(7.0), false), "every figure kept, valid only when each counts");
        let silent = f(Some(1.0), true).with_parts([f(None, false)]);
        assert_eq!(silent, f(Some(1.0), false), "a node that never answered");
        assert_eq!(f(Some(1.0), false).with_parts([]).counted(), None, "its own figure counts too");
    }

    #[test]
    fn energy_source_names_round_trip() {
        for kind in EnergySourceKind::ALL {
            assert_eq!(kind.as_str().parse::<EnergySourceKind>(), Ok(kind));
        }
        let names: Vec<&str> = EnergySourceKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names, ["rapl", "hwmon", "battery", "estimated", "external"]);
        assert_eq!("Rapl".parse::<EnergySourceKind>(), Err(UnknownEnergySource("Rapl".into())));
    }

    /// An invalid energy reading was ranked like a valid one.
    #[test]
    fn regression_invalid_energy_reading_has_no_energy_objective() {
        let valid = EnergyReading {
            joules: 12.5,
            valid: true,
            ..EnergyReading::none(EnergySourceKind::Battery, "discharging")
        };
        let mut m = Measurement::unmeasured(ExitOutcome::Exited(0), valid);
        m.wall_us = 2_000_000;
        assert_eq!(m.objective_value("energy"), Some(12.5));
        m.energy.valid = false;
        m.energy.note = Some("battery charging".into());
        assert_eq!(m.objective_value("energy"), None, "an invalid reading ranks nowhere");
        assert_eq!(m.objective_value("wall_time"), Some(2.0), "other objectives do not depend on it");
    }

    #[test]
    fn a_trials_energy_is_its_cpu_share_and_its_gpus_each_kept_apart() {
        let cpu = EnergyReading { joules: 10.0, valid: true, ..EnergyReading::none(EnergySourceKind::Rapl, "") };
        let mut m = Measurement::unmeasured(ExitOutcome::Exited(0), cpu);
        assert_eq!(m.gpu_joules(), None, "given no GPU");
        assert_eq!(m.objective_value("energy"), Some(10.0));
        let gpu = |index, joules, valid| GpuEnergy {
            index,
            uuid: format!("GPU-{index}"),
            joules,
            method: GpuMethod::Counter,
            valid,
            note: None,
        };
        m.gpus = vec![gpu(0, 250.0, true), gpu(1, 40.0, true)];
        assert_eq!(m.gpu_joules(), Some(290.0));
        assert_eq!(m.energy.joules, 10.0, "the CPU's part kept apart");
        assert_eq!(m.energy_figure(), EnergyFigure { joules: Some(300.0), valid: true });
        assert_eq!(m.objective_value("energy"), Some(300.0));
        // Beside other trials of its agent: its share of the machine's reading.
        m.cpu_share = Some(0.25);
        assert_eq!(m.cpu_joules(), 2.5);
        assert_eq!(m.energy_figure(), EnergyFigure { joules: Some(292.5), valid: true });
        assert_eq!(m.energy.joules, 10.0, "the machine's reading kept as read");
        m.gpus[1].valid = false;
        assert_eq!(m.energy_figure().counted(), None, "one GPU read failed: the whole figure does not count");
        assert_eq!(m.objective_value("energy"), None);
    }

    #[test]
    fn power_series_is_bounded_and_covers_the_run() {
        let mut series = Vec::new();
        for i in 0..(3 * MAX_POWER_SAMPLES as u64) {
            push_power_sample(&mut series, PowerSample { elapsed_ms: (i + 1) * 100, watts: 10.0 });
        }
        assert!(series.len() <= MAX_POWER_SAMPLES);
        assert_eq!(series.last().map(|p| p.elapsed_ms), Some(3 * MAX_POWER_SAMPLES as u64 * 100));
        assert!(series.iter().all(|p| (p.watts - 10.0).abs() < 1e-12));
        assert!(series.windows(2).all(|w| w[0].elapsed_ms < w[1].elapsed_ms));
    }
}
