//! Agent telemetry: CPU utilisation (from `/proc/stat`), memory (from
//! `/proc/meminfo`) and power, sampled at `--telemetry-interval` and
//! published as `AgentMessage::Telemetry` for placement and offloading.
//!
//! Power comes from a meter of the agent's energy source kept running
//! between samples (the average over the interval of the counted domains);
//! with the estimate source it is the model's watts for the measured
//! utilisation, labelled `Estimated`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunefleet_common::measurement::{EnergySourceKind, Telemetry};

use crate::energy::{EnergyMeter, EnergySource, EstimateModel, Usage};

/// Cumulative jiffies of one CPU line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// Everything but idle and iowait.
    pub busy: u64,
    pub total: u64,
}

/// The aggregate `cpu` line and the per-CPU `cpuN` lines of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> (Option<CpuTimes>, Vec<CpuTimes>) {
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
        } else {
            per_cpu.push(times);
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
    prev: Option<(CpuTimes, Vec<CpuTimes>)>,
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
            meter,
            kind,
            model,
            started: now,
            last: now,
        };
        sampler.prev = sampler.read_cpu();
        sampler
    }

    fn read_cpu(&self) -> Option<(CpuTimes, Vec<CpuTimes>)> {
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
        let (cpu_utilisation, per_cpu) = match (&self.prev, &cpu) {
            (Some((p_all, p_per)), Some((n_all, n_per))) => (
                utilisation(*p_all, *n_all),
                p_per.iter().zip(n_per).map(|(p, n)| utilisation(*p, *n)).collect::<Vec<f64>>(),
            ),
            _ => (0.0, Vec::new()),
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
            // Not told apart yet: filled in by the agent when it knows its trials' CPU time.
            foreign_cpu: None,
            conditions: Default::default(),
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
        assert_eq!(utilisation(a_per[0], b_per[0]), 1.0);
        assert_eq!(utilisation(a_per[1], b_per[1]), 0.0);
        assert_eq!(utilisation(b, b), 0.0);
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
