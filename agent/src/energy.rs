//! Energy measurement seam. An [`EnergySource`] starts a [`EnergyMeter`]
//! just before the workload is let go; the meter is stopped when the
//! workload has exited and returns an [`EnergyReading`] that names its
//! source. Real meters (RAPL powercap, hwmon, battery fuel gauges) plug in
//! here later, each with its sysfs root as a parameter.
//!
//! The only source implemented now is [`Estimate`], a model, not a meter:
//!
//! ```text
//! joules = idle_watts_per_core * cores * wall_seconds
//!        + busy_watts_per_core * cpu_seconds
//! ```
//!
//! where `cores` is the number of CPUs the workload was pinned to (all the
//! agent's CPUs when it was not pinned) and `cpu_seconds` is the user + system
//! CPU time of the process tree. Its readings are always labelled
//! [`EnergySourceKind::Estimated`] and carry a note saying they are a model.

use std::time::Duration;

use tunefleet_common::measurement::{DomainEnergy, EnergyReading, EnergySourceKind};
use tunefleet_common::message::EnergySourceInfo;

/// What the workload used, for sources that model rather than measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub wall: Duration,
    /// User + system CPU time of the process tree.
    pub cpu: Duration,
    /// CPUs the workload could run on.
    pub cores: u32,
}

/// A place energy figures come from.
pub trait EnergySource: Send + Sync {
    fn kind(&self) -> EnergySourceKind;
    /// What this source offers, for the agent's Hello.
    fn info(&self) -> EnergySourceInfo;
    /// Starts measuring; called just before the workload starts.
    fn start(&self) -> Box<dyn EnergyMeter>;
}

/// A measurement in progress.
pub trait EnergyMeter: Send {
    /// Stops measuring; called once the workload has exited.
    fn stop(self: Box<Self>, usage: &Usage) -> EnergyReading;
}

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

    fn note(&self) -> String {
        format!(
            "model estimate, not a meter: {} W idle per pinned core x wall time + {} W per busy core x CPU time",
            self.idle_watts_per_core, self.busy_watts_per_core
        )
    }
}

/// The estimate source: no hardware, always available.
#[derive(Debug, Clone, Copy, Default)]
pub struct Estimate {
    pub model: EstimateModel,
}

/// Domain name of the estimate.
pub const ESTIMATE_DOMAIN: &str = "cpu-estimate";

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

    fn start(&self) -> Box<dyn EnergyMeter> {
        Box::new(EstimateMeter { model: self.model })
    }
}

struct EstimateMeter {
    model: EstimateModel,
}

impl EnergyMeter for EstimateMeter {
    fn stop(self: Box<Self>, usage: &Usage) -> EnergyReading {
        let joules = self.model.joules(usage);
        EnergyReading {
            source: EnergySourceKind::Estimated,
            joules,
            domains: vec![DomainEnergy { domain: ESTIMATE_DOMAIN.to_string(), joules }],
            interval_ms: 0,
            valid: true,
            note: Some(self.model.note()),
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
    }

    #[test]
    fn estimate_reading_is_labelled_as_a_model() {
        let source = Estimate::default();
        let usage = Usage { wall: Duration::from_secs(1), cpu: Duration::from_secs(1), cores: 1 };
        let reading = source.start().stop(&usage);
        assert_eq!(reading.source, EnergySourceKind::Estimated);
        assert!((reading.joules - 5.0).abs() < 1e-9);
        assert_eq!(reading.domains.len(), 1);
        assert!(reading.note.as_deref().is_some_and(|n| n.contains("model")));
        assert!(source.info().readable);
    }
}
