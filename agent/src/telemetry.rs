//! Agent telemetry: CPU utilisation (from `/proc/stat`), memory (from
//! `/proc/meminfo`) and power, sampled at `--telemetry-interval` and
//! published as `AgentMessage::Telemetry` for placement and offloading.
//!
//! Power comes from a meter of the agent's energy source kept running
//! between samples (the average over the interval of the counted domains);
//! with the estimate source it is the model's watts for the measured
//! utilisation, labelled `Estimated`.
//!
//! Utilisation covers the agent's CPUs ([`TelemetrySampler::with_cpus`]:
//! its `--cpus` set, or every CPU it may use), so agents sharing a machine
//! each report their own. With the trials' registry
//! ([`TelemetrySampler::with_trials`]) a sample also says how much of those
//! CPUs went to load from outside the trials and the agent
//! ([`crate::foreign`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunefleet_common::measurement::{EnergySourceKind, Telemetry};

use crate::energy::{EnergyMeter, EnergySource, EstimateModel, Usage};
use crate::foreign::{ForeignMeter, TrialRegistry};

/// Cumulative jiffies of one CPU line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// Everything but idle and iowait.
    pub busy: u64,
    pub total: u64,
}

/// Busy CPU time of the whole machine since boot (every CPU, every
/// process: `/proc/stat`'s aggregate line), in microseconds.
pub fn machine_busy_us(proc_root: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(proc_root.join("stat")).ok()?;
    let (all, _) = parse_proc_stat(&text);
    Some(crate::procfs::ticks_to_us(all?.busy, rustix::param::clock_ticks_per_second()))
}

/// The aggregate `cpu` line and the per-CPU `cpuN` lines of `/proc/stat`,
/// by CPU number (offline CPUs have no line).
pub fn parse_proc_stat(text: &str) -> (Option<CpuTimes>, Vec<(u32, CpuTimes)>) {
    let mut all = None;
    let mut per_cpu = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let Some(label) = fields.next() else { continue };
        if !label.starts_with("cpu") {
            continue;
        }
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let values: Vec<u64> = fields.take(8).filter_map(|f| f.parse().ok()).collect();
        if values.len() < 4 {
            continue;
        }
        let total: u64 = values.iter().sum();
        let idle = values[3] + values.get(4).copied().unwrap_or(0);
        let times = CpuTimes { busy: total.saturating_sub(idle), total };
        if label == "cpu" {
            all = Some(times);
        } else if let Ok(cpu) = label["cpu".len()..].parse::<u32>() {
            per_cpu.push((cpu, times));
        }
    }
    (all, per_cpu)
}

/// Busy fraction between two readings, 0 to 1 (0 when no time passed).
pub fn utilisation(prev: CpuTimes, now: CpuTimes) -> f64 {
    let total = now.total.saturating_sub(prev.total);
    if total == 0 {
        return 0.0;
    }
    (now.busy.saturating_sub(prev.busy) as f64 / total as f64).clamp(0.0, 1.0)
}

/// Busy and total ticks of `cpus` between two readings (CPUs missing from
/// either are left out), and the busy fraction of each, in the order given.
pub fn cpus_between(prev: &[(u32, CpuTimes)], now: &[(u32, CpuTimes)], cpus: &[u32]) -> (CpuTimes, Vec<f64>) {
    let find = |list: &[(u32, CpuTimes)], cpu: u32| list.iter().find(|(c, _)| *c == cpu).map(|(_, t)| *t);
    let mut sum = CpuTimes::default();
    let mut each = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let (Some(p), Some(n)) = (find(prev, cpu), find(now, cpu)) else { continue };
        sum.busy += n.busy.saturating_sub(p.busy);
        sum.total += n.total.saturating_sub(p.total);
        each.push(utilisation(p, n));
    }
    (sum, each)
}

/// `(total, available)` bytes from `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some((kib("MemTotal:")? * 1024, kib("MemAvailable:")? * 1024))
}

/// Samples telemetry; keeps the previous CPU times and a running meter.
pub struct TelemetrySampler {
    proc_root: PathBuf,
    prev: Option<(CpuTimes, Vec<(u32, CpuTimes)>)>,
    /// The agent's CPUs; none: every CPU `/proc/stat` lists.
    cpus: Option<Vec<u32>>,
    /// The trials' and the agent's CPU time, when the trials are known.
    foreign: Option<ForeignMeter>,
    /// Battery, charging and thermal state, when read.
    conditions: Option<crate::conditions::ConditionsReader>,
    meter: Option<Box<dyn EnergyMeter>>,
    kind: EnergySourceKind,
    model: EstimateModel,
    started: Instant,
    last: Instant,
}

impl std::fmt::Debug for TelemetrySampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetrySampler").field("proc_root", &self.proc_root).field("kind", &self.kind).finish()
    }
}

impl TelemetrySampler {
    /// Starts sampling: reads the CPU times and starts a meter on `source`
    /// (metered sources only; without one, power comes from `model`).
    pub fn new(proc_root: &Path, source: &dyn EnergySource, model: EstimateModel) -> Self {
        let metered = source.kind() != EnergySourceKind::Estimated;
        let meter = if metered {
            match source.start() {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(error = %e, "telemetry: energy source failed; power will be estimated");
                    None
                }
            }
        } else {
            None
        };
        let kind = if meter.is_some() { source.kind() } else { EnergySourceKind::Estimated };
        let now = Instant::now();
        let mut sampler = TelemetrySampler {
            proc_root: proc_root.to_path_buf(),
            prev: None,
            cpus: None,
            foreign: None,
            conditions: None,
            meter,
            kind,
            model,
            started: now,
            last: now,
        };
        sampler.prev = sampler.read_cpu();
        sampler
    }

    /// Restricts utilisation, per-CPU figures and the foreign load to `cpus`.
    pub fn with_cpus(mut self, cpus: Vec<u32>) -> Self {
        self.cpus = Some(cpus);
        self
    }

    /// Tells load from outside apart: the CPU time of the trials in
    /// `registry` and of this process is not foreign.
    pub fn with_trials(mut self, registry: TrialRegistry) -> Self {
        self.foreign = Some(ForeignMeter::new(&self.proc_root, registry));
        self
    }

    /// Reads the device's conditions with every sample.
    pub fn with_conditions(mut self, reader: crate::conditions::ConditionsReader) -> Self {
        self.conditions = Some(reader);
        self
    }

    fn read_cpu(&self) -> Option<(CpuTimes, Vec<(u32, CpuTimes)>)> {
        let text = std::fs::read_to_string(self.proc_root.join("stat")).ok()?;
        let (all, per_cpu) = parse_proc_stat(&text);
        Some((all?, per_cpu))
    }

    /// One telemetry sample over the time since the previous one.
    pub fn sample(&mut self, running: u32) -> Telemetry {
        let now = Instant::now();
        let interval = now.saturating_duration_since(self.last);
        self.last = now;
        let cpu = self.read_cpu();
        // Read right after /proc/stat, over (nearly) the same interval.
        let excluded = self.foreign.as_mut().map(ForeignMeter::excluded_ticks);
        let (cpu_utilisation, per_cpu, foreign_cpu) = match (&self.prev, &cpu) {
            (Some((p_all, p_per)), Some((n_all, n_per))) => {
                let listed: Vec<u32>;
                let cpus = match &self.cpus {
                    Some(cpus) => cpus.as_slice(),
                    None => {
                        listed = n_per.iter().map(|(c, _)| *c).collect();
                        &listed
                    }
                };
                let (sum, per_cpu) = cpus_between(p_per, n_per, cpus);
                let all = if self.cpus.is_some() {
                    utilisation(CpuTimes::default(), sum)
                } else {
                    utilisation(*p_all, *n_all)
                };
                let foreign = excluded.and_then(|ex| crate::foreign::foreign_fraction(sum.busy, ex, sum.total));
                (all, per_cpu, foreign)
            }
            _ => (0.0, Vec::new(), None),
        };
        if cpu.is_some() {
            self.prev = cpu;
        }
        let (memory_total_bytes, available) = std::fs::read_to_string(self.proc_root.join("meminfo"))
            .ok()
            .and_then(|t| parse_meminfo(&t))
            .unwrap_or((0, 0));
        let power_watts = match &mut self.meter {
            Some(meter) => {
                meter.sample(now.saturating_duration_since(self.started));
                meter.last_watts()
            }
            None => {
                let cores = u32::try_from(per_cpu.len()).unwrap_or(u32::MAX);
                let busy: f64 = per_cpu.iter().sum();
                (cores > 0).then(|| self.model.watts(cores, busy))
            }
        };
        Telemetry {
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            interval_ms: u32::try_from(interval.as_millis()).unwrap_or(u32::MAX),
            cpu_utilisation,
            per_cpu,
            memory_used_bytes: memory_total_bytes.saturating_sub(available),
            memory_total_bytes,
            power_watts,
            power_source: self.kind,
            running,
            foreign_cpu,
            conditions: self.conditions.as_mut().map(crate::conditions::ConditionsReader::read).unwrap_or_default(),
        }
    }

    /// Stops the running meter (the reading is discarded).
    pub fn finish(self) {
        if let Some(meter) = self.meter {
            let usage = Usage { wall: Duration::ZERO, cpu: Duration::ZERO, cores: 0 };
            let _ = meter.stop(self.started.elapsed(), &usage);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str =
        "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\nintr 1\n";
    const STAT_B: &str =
        "cpu  200 0 200 1000 0 0 0 0 0 0\ncpu0 150 0 150 400 0 0 0 0 0 0\ncpu1 50 0 50 600 0 0 0 0 0 0\n";

    #[test]
    fn utilisation_between_two_stat_readings() {
        let (a, a_per) = parse_proc_stat(STAT_A);
        let (b, b_per) = parse_proc_stat(STAT_B);
        let (a, b) = (a.expect("cpu line"), b.expect("cpu line"));
        assert_eq!(a, CpuTimes { busy: 200, total: 1000 });
        assert_eq!(utilisation(a, b), 0.5);
        assert_eq!(utilisation(a_per[0].1, b_per[0].1), 1.0);
        assert_eq!(utilisation(a_per[1].1, b_per[1].1), 0.0);
        assert_eq!(utilisation(b, b), 0.0);
    }

    /// `/proc/stat` with CPUs 0, 1, 2 and 5 (3 and 4 offline), each line's
    /// user and idle ticks.
    fn stat(ticks: [(u64, u64); 4]) -> String {
        let mut text = String::from("cpu  0 0 0 0 0 0 0 0 0 0\n");
        for (cpu, (user, idle)) in [0, 1, 2, 5].into_iter().zip(ticks) {
            text.push_str(&format!("cpu{cpu} {user} 0 0 {idle} 0 0 0 0 0 0\n"));
        }
        text + "intr 1\n"
    }

    #[test]
    fn cpus_by_number_not_by_line() {
        let (_, a) = parse_proc_stat(&stat([(0, 0); 4]));
        let (_, b) = parse_proc_stat(&stat([(100, 0), (0, 100), (50, 50), (100, 0)]));
        assert_eq!(a.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [0, 1, 2, 5]);
        let (sum, each) = cpus_between(&a, &b, &[2, 5, 3]);
        assert_eq!(sum, CpuTimes { busy: 150, total: 200 }, "offline CPU 3 left out");
        assert_eq!(each, [0.5, 1.0]);
    }

    #[test]
    fn utilisation_and_foreign_load_over_the_agents_cpus() {
        let root = tempfile::tempdir().expect("tempdir");
        let proc_root = root.path();
        let write = |name: &str, text: &str| {
            std::fs::create_dir_all(proc_root.join(name).parent().expect("a parent")).expect("mkdir");
            std::fs::write(proc_root.join(name), text).expect("write");
        };
        let process = |pid: &str, ppid: i32, pgrp: i32, ticks: u64| {
            crate::procfs::fixture::stat(proc_root, pid, ppid, pgrp, [ticks, 0, 0, 0])
        };
        write("meminfo", "MemTotal: 2048 kB\nMemAvailable: 1024 kB\n");
        write("stat", &stat([(0, 0); 4]));
        process("self", 1, 1, 0);
        process("10", 1, 10, 0);
        let registry = TrialRegistry::default();
        let _trial = registry.register(crate::procfs::Members::Group(10));
        let source = crate::energy::Estimate::default();
        let mut sampler = TelemetrySampler::new(proc_root, &source, EstimateModel::default())
            .with_cpus(vec![1, 5])
            .with_trials(registry);
        // CPU 0 busy (not the agent's); CPUs 1 and 5: 100 of 200 ticks busy,
        // 60 of them the trial's, 10 the agent's.
        write("stat", &stat([(100, 0), (20, 80), (0, 100), (80, 20)]));
        process("10", 1, 10, 60);
        process("self", 1, 1, 10);
        let t = sampler.sample(1);
        assert_eq!(t.per_cpu, [0.2, 0.8]);
        assert_eq!(t.cpu_utilisation, 0.5);
        assert_eq!(t.foreign_cpu, Some(30.0 / 200.0));
        assert_eq!(t.memory_total_bytes, 2048 * 1024);
        // Without the registry the load cannot be told apart.
        let mut plain = TelemetrySampler::new(proc_root, &source, EstimateModel::default());
        write("stat", &stat([(200, 0), (20, 180), (0, 200), (80, 120)]));
        let t = plain.sample(0);
        assert_eq!(t.foreign_cpu, None);
        assert_eq!(t.per_cpu.len(), 4, "every listed CPU");
        sampler.finish();
        plain.finish();
    }

    #[test]
    fn memory_from_meminfo() {
        let text = "MemTotal:        2048 kB\nMemFree:  10 kB\nMemAvailable:    1024 kB\n";
        assert_eq!(parse_meminfo(text), Some((2048 * 1024, 1024 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: x kB\n"), None);
    }

    #[test]
    fn estimated_power_when_no_meter() {
        let source = crate::energy::Estimate::default();
        let mut sampler = TelemetrySampler::new(Path::new("/proc"), &source, EstimateModel::default());
        let t = sampler.sample(0);
        assert_eq!(t.power_source, EnergySourceKind::Estimated);
        assert!(t.memory_total_bytes > 0);
        assert!(t.power_watts.is_some_and(|w| w > 0.0));
        assert!((0.0..=1.0).contains(&t.cpu_utilisation));
        sampler.finish();
    }
}
