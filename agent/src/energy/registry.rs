//! Every source a trial's energy is measured with, behind one registry:
//! the machine's source [`super::select`] chose (an external meter, RAPL,
//! hwmon, a battery, or the labelled estimate) and NVML for the GPUs a
//! trial is given ([`super::gpu`]). A trial's meters start together
//! ([`Registry::start_gpus`] first, loading NVML taking a while, then
//! [`Registry::start_machine`] just before the workload goes) and stop
//! together ([`TrialMeters::stop`]): one reading of the machine and one
//! of each GPU given, valid or saying why not, which is what the
//! measurement is assembled from.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, GpuEnergy, GpuMethod};
use tunefleet_common::message::GpuDevice;

use super::estimate::{Estimate, EstimateModel};
use super::gpu::TrialGpus;
use super::source::{sampling_interval, EnergyMeter, EnergySource, Usage};

/// Starts `source`; when it fails now (a zone vanished since discovery, a
/// permission changed), measures with the estimate instead and says why.
pub fn start_or_estimate(source: &dyn EnergySource, model: EstimateModel) -> Box<dyn EnergyMeter> {
    match source.start() {
        Ok(meter) => meter,
        Err(e) => {
            tracing::warn!(source = %source.kind(), error = %e, "energy source failed to start; using the estimate");
            let estimate = Estimate { model, skipped: vec![format!("{}: {e}", source.kind())] };
            estimate.meter()
        }
    }
}

/// The sources of this agent's trials.
#[derive(Clone)]
pub struct Registry {
    /// The machine's source.
    pub source: Arc<dyn EnergySource>,
    /// The model of the estimate used when `source` fails to start.
    pub model: EstimateModel,
    /// NVML, the GPU driver's library; `None`: where the driver installs it.
    pub nvml_lib: Option<PathBuf>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("source", &self.source.kind()).field("nvml_lib", &self.nvml_lib).finish()
    }
}

impl Default for Registry {
    /// The estimate alone, no GPU.
    fn default() -> Self {
        Registry { source: Arc::new(Estimate::default()), model: EstimateModel::default(), nvml_lib: None }
    }
}

impl Registry {
    /// The machine's source and the estimate's model.
    pub fn new(source: Arc<dyn EnergySource>, model: EstimateModel) -> Self {
        Registry { source, model, nvml_lib: None }
    }

    /// With NVML at `nvml_lib` for the GPUs.
    pub fn with_nvml(mut self, nvml_lib: Option<PathBuf>) -> Self {
        self.nvml_lib = nvml_lib;
        self
    }

    /// The machine's source kind.
    pub fn kind(&self) -> EnergySourceKind {
        self.source.kind()
    }

    /// `requested`, shortened where the machine's counters could wrap faster.
    pub fn sampling_interval(&self, requested: Duration) -> Duration {
        sampling_interval(requested, self.source.as_ref())
    }

    /// The meters of `gpus` (none given: `None`), started.
    pub fn start_gpus(&self, gpus: &[GpuDevice]) -> Option<TrialGpus> {
        TrialGpus::start(self.nvml_lib.as_deref(), gpus)
    }

    /// The machine's meter, started (the estimate, saying why, where the
    /// source fails to start now).
    pub fn start_machine(&self) -> Box<dyn EnergyMeter> {
        start_or_estimate(self.source.as_ref(), self.model)
    }

    /// The readings of a trial that never ran: nothing of the machine, and
    /// each GPU it was given not measured, `why`.
    pub fn never_ran(&self, gpus: &[GpuDevice], why: &str) -> (EnergyReading, Vec<GpuEnergy>) {
        let usage = Usage { wall: Duration::ZERO, cpu: Duration::ZERO, cores: 0 };
        let machine = start_or_estimate(self.source.as_ref(), EstimateModel::default()).stop(Duration::ZERO, &usage);
        let gpus = gpus
            .iter()
            .map(|g| GpuEnergy {
                index: g.index,
                uuid: g.uuid.clone(),
                joules: 0.0,
                method: GpuMethod::Counter,
                valid: false,
                note: Some(format!("not measured: {why}")),
            })
            .collect();
        (machine, gpus)
    }
}

/// A trial's meters while it runs.
pub struct TrialMeters {
    pub machine: Box<dyn EnergyMeter>,
    pub gpus: Option<TrialGpus>,
}

impl TrialMeters {
    /// Every meter sampled at `elapsed` since the start.
    pub fn sample(&mut self, elapsed: Duration) {
        self.machine.sample(elapsed);
        if let Some(g) = &mut self.gpus {
            g.sample(elapsed);
        }
    }

    /// The machine's joules from the start to the latest sample.
    pub fn so_far(&self, usage: &Usage) -> Option<f64> {
        self.machine.so_far(usage)
    }

    /// The readings from the start until `elapsed`: the machine's, and one
    /// for each GPU the trial was given.
    pub fn stop(self, elapsed: Duration, usage: &Usage) -> (EnergyReading, Vec<GpuEnergy>) {
        let machine = self.machine.stop(elapsed, usage);
        (machine, self.gpus.map(|g| g.stop(elapsed)).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trial_that_never_ran_has_a_reading_for_each_gpu_it_was_given_none_valid() {
        let gpus: Vec<GpuDevice> =
            (0..2).map(|i| GpuDevice { index: i, uuid: format!("GPU-{i}"), name: "H100".into() }).collect();
        let (machine, readings) = Registry::default().never_ran(&gpus, "the workload did not start");
        assert_eq!(machine.joules, 0.0);
        assert_eq!(readings.len(), 2, "one reading per GPU given");
        assert!(readings
            .iter()
            .all(|r| !r.valid && r.note.as_deref() == Some("not measured: the workload did not start")));
        assert_eq!(readings.iter().map(|r| r.uuid.as_str()).collect::<Vec<_>>(), ["GPU-0", "GPU-1"]);
    }
}
