//! The estimate: a model, not a meter. Always available, always labelled
//! [`EnergySourceKind::Estimated`], never mixed with metered values:
//!
//! ```text
//! joules = idle_watts_per_core * cores * wall_seconds
//!        + busy_watts_per_core * cpu_seconds
//! ```
//!
//! where `cores` is the number of CPUs the workload was pinned to (all the
//! agent's CPUs when it was not pinned) and `cpu_seconds` is the user +
//! system CPU time of the process tree. The coefficients are per device
//! class (`--idle-watts-per-core`, `--busy-watts-per-core`); the defaults
//! (1 W idle, 4 W busy per core) suit a laptop or small server core.

use std::time::Duration;

use tunefleet_common::measurement::{DomainEnergy, EnergyReading, EnergySourceKind};
use tunefleet_common::message::EnergySourceInfo;

use super::source::{skipped_note, EnergyError, EnergyMeter, EnergySource, Usage};

/// Coefficients of the estimate model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EstimateModel {
    pub idle_watts_per_core: f64,
    pub busy_watts_per_core: f64,
}

impl Default for EstimateModel {
    fn default() -> Self {
        EstimateModel { idle_watts_per_core: 1.0, busy_watts_per_core: 4.0 }
    }
}

impl EstimateModel {
    /// Joules the model attributes to `usage`.
    pub fn joules(&self, usage: &Usage) -> f64 {
        self.idle_watts_per_core * f64::from(usage.cores) * usage.wall.as_secs_f64()
            + self.busy_watts_per_core * usage.cpu.as_secs_f64()
    }

    /// Watts the model gives `cores` CPUs of which `busy_cores` are busy.
    pub fn watts(&self, cores: u32, busy_cores: f64) -> f64 {
        self.idle_watts_per_core * f64::from(cores) + self.busy_watts_per_core * busy_cores.max(0.0)
    }

    /// The label every estimated reading carries.
    pub fn note(&self) -> String {
        format!(
            "estimated (a model, not a meter): {} W idle per pinned core x wall time + {} W per busy core x CPU time",
            self.idle_watts_per_core, self.busy_watts_per_core
        )
    }
}

/// Domain name of the estimate.
pub const ESTIMATE_DOMAIN: &str = "cpu-estimate";

/// The estimate source: no hardware, always available.
#[derive(Debug, Clone, Default)]
pub struct Estimate {
    pub model: EstimateModel,
    /// Metered sources skipped on the way here, with the reason.
    pub skipped: Vec<String>,
}

impl Estimate {
    fn label(&self) -> String {
        if self.skipped.is_empty() {
            self.model.note()
        } else {
            format!("{}; {}", self.model.note(), skipped_note(&self.skipped))
        }
    }

    /// A meter of this model.
    pub fn meter(&self) -> Box<dyn EnergyMeter> {
        Box::new(EstimateMeter { model: self.model, label: self.label() })
    }
}

impl EnergySource for Estimate {
    fn kind(&self) -> EnergySourceKind {
        EnergySourceKind::Estimated
    }

    fn info(&self) -> EnergySourceInfo {
        EnergySourceInfo {
            kind: EnergySourceKind::Estimated,
            domains: vec![ESTIMATE_DOMAIN.to_string()],
            readable: true,
            note: Some(self.model.note()),
        }
    }

    fn start(&self) -> Result<Box<dyn EnergyMeter>, EnergyError> {
        Ok(self.meter())
    }
}

struct EstimateMeter {
    model: EstimateModel,
    label: String,
}

impl EnergyMeter for EstimateMeter {
    fn sample(&mut self, _elapsed: Duration) {}

    fn last_watts(&self) -> Option<f64> {
        None
    }

    fn so_far(&self, usage: &Usage) -> Option<f64> {
        Some(self.model.joules(usage))
    }

    fn stop(self: Box<Self>, _elapsed: Duration, usage: &Usage) -> EnergyReading {
        let joules = self.model.joules(usage);
        EnergyReading {
            source: EnergySourceKind::Estimated,
            joules,
            domains: vec![DomainEnergy { domain: ESTIMATE_DOMAIN.to_string(), joules, in_total: true }],
            interval_ms: 0,
            valid: true,
            note: Some(self.label),
            series: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_adds_idle_and_busy_parts() {
        let model = EstimateModel { idle_watts_per_core: 1.0, busy_watts_per_core: 4.0 };
        let usage = Usage { wall: Duration::from_secs(10), cpu: Duration::from_millis(2500), cores: 2 };
        assert!((model.joules(&usage) - (1.0 * 2.0 * 10.0 + 4.0 * 2.5)).abs() < 1e-9);
        let idle = Usage { wall: Duration::ZERO, cpu: Duration::ZERO, cores: 8 };
        assert_eq!(model.joules(&idle), 0.0);
        assert_eq!(model.watts(2, 0.5), 4.0);
    }

    #[test]
    fn estimate_reading_is_labelled_and_names_skipped_sources() {
        let source = Estimate { skipped: vec!["rapl: permission denied".into()], ..Estimate::default() };
        let usage = Usage { wall: Duration::from_secs(1), cpu: Duration::from_secs(1), cores: 1 };
        let reading = source.start().expect("always starts").stop(Duration::from_secs(1), &usage);
        assert_eq!(reading.source, EnergySourceKind::Estimated);
        assert!((reading.joules - 5.0).abs() < 1e-9);
        assert_eq!(reading.domains.len(), 1);
        let note = reading.note.unwrap_or_default();
        assert!(note.starts_with("estimated"), "{note}");
        assert!(note.contains("skipped: rapl: permission denied"), "{note}");
        assert!(source.info().readable);
    }
}
