//! GPU energy through NVML, the NVIDIA driver's management library, loaded
//! at run time when it is there (`libnvidia-ml.so.1`, or `--nvml-lib`): no
//! build-time dependency on the driver, and an agent without a GPU loses
//! nothing. Per GPU: its total-energy counter (millijoules since the driver
//! loaded; Volta and newer) where it has one, else its power reading
//! integrated over the samples the runner takes. Read only: nothing here
//! changes a GPU's settings (power limit, clocks, modes).
//!
//! The static agent (musl) cannot load a shared library: it is built
//! without the `nvml` feature and says so in `probe`.
//!
//! Tests run the same path against a stand-in library built from
//! `agent/tests/nvml-standin.c` over a fixture they control.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

/// The library's name where the driver installs it.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// One GPU as `probe` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuInfo {
    /// NVML's index (PCI bus order).
    pub index: u32,
    pub name: String,
    /// `GPU-...`: what `CUDA_VISIBLE_DEVICES` takes, whatever the order.
    pub uuid: String,
    /// Whether it has a total-energy counter (else its power is integrated).
    pub energy_counter: bool,
    /// Its power draw now, in watts, when it reports one.
    pub power_w: Option<f64>,
    /// What failed, when something did.
    pub note: Option<String>,
}

/// What `probe` found of GPUs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuReport {
    /// This agent was built without NVML (the static agent).
    NotBuilt,
    /// The library did not load or initialise: why (no driver, no GPU).
    Unavailable { lib: PathBuf, reason: String },
    /// NVML answered: its GPUs (possibly none).
    Found { lib: PathBuf, gpus: Vec<GpuInfo> },
}

impl GpuReport {
    /// Lines for `probe`'s table.
    pub fn render(&self) -> String {
        let mut out = String::from("\ngpus (NVML, read only)\n");
        match self {
            GpuReport::NotBuilt => {
                out.push_str("  not in this build: a static agent cannot load the driver's library (use the glibc build on GPU nodes)\n")
            }
            GpuReport::Unavailable { lib, reason } => {
                out.push_str(&format!("  none: {} did not load: {reason}\n", lib.display()))
            }
            GpuReport::Found { lib, gpus } if gpus.is_empty() => {
                out.push_str(&format!("  none: {} loaded and lists no GPU\n", lib.display()))
            }
            GpuReport::Found { gpus, .. } => {
                out.push_str(&format!("  {:<5} {:<28} {:<42} {:<15} {:<9} note\n", "index", "name", "uuid", "energy", "power"));
                for g in gpus {
                    let power = g.power_w.map_or("-".to_string(), |w| format!("{w:.1} W"));
                    let energy = if g.energy_counter { "counter" } else { "power x time" };
                    out.push_str(&format!(
                        "  {:<5} {:<28} {:<42} {:<15} {:<9} {}\n",
                        g.index,
                        g.name,
                        g.uuid,
                        energy,
                        power,
                        g.note.as_deref().unwrap_or("")
                    ));
                }
            }
        }
        out
    }
}

pub use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
use tunefleet_common::message::GpuDevice;

impl GpuReport {
    /// The GPUs this agent can give trials: those NVML lists and opens,
    /// each with its UUID (what `CUDA_VISIBLE_DEVICES` is given).
    pub fn devices(&self) -> Vec<GpuDevice> {
        let GpuReport::Found { gpus, .. } = self else { return Vec::new() };
        gpus.iter()
            .filter(|g| !g.uuid.is_empty() && (g.energy_counter || g.power_w.is_some()))
            .map(|g| GpuDevice { index: g.index, uuid: g.uuid.clone(), name: g.name.clone() })
            .collect()
    }
}

/// The GPUs of one trial (or co-measured window) being measured: a meter,
/// or why none could start (every GPU's reading then says so, invalid:
/// energy that was not measured never counts as none).
#[derive(Debug)]
pub struct TrialGpus {
    gpus: Vec<GpuDevice>,
    meter: Result<GpuMeter, String>,
}

impl TrialGpus {
    /// Starts measuring `gpus` (none: nothing to measure, nothing loaded).
    pub fn start(lib: Option<&Path>, gpus: &[GpuDevice]) -> Option<TrialGpus> {
        if gpus.is_empty() {
            return None;
        }
        let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        Some(TrialGpus { gpus: gpus.to_vec(), meter: GpuMeter::start(lib, &indices) })
    }

    pub fn sample(&mut self, elapsed: Duration) {
        if let Ok(m) = &mut self.meter {
            m.sample(elapsed);
        }
    }

    /// Each GPU's joules from the start to the latest sample (0 for GPUs
    /// whose meter never started).
    pub fn so_far(&self) -> Vec<f64> {
        match &self.meter {
            Ok(m) => m.so_far(),
            Err(_) => vec![0.0; self.gpus.len()],
        }
    }

    /// One reading per GPU from the start until `elapsed`.
    pub fn stop(self, elapsed: Duration) -> Vec<GpuEnergy> {
        match self.meter {
            Ok(m) => m.stop(elapsed),
            Err(why) => self
                .gpus
                .into_iter()
                .map(|g| GpuEnergy {
                    index: g.index,
                    uuid: g.uuid,
                    joules: 0.0,
                    method: GpuMethod::Counter,
                    valid: false,
                    note: Some(format!("not measured: {why}")),
                })
                .collect(),
        }
    }
}

/// The library to load: `lib`, else where the driver installs it.
pub fn lib_or_default(lib: Option<&Path>) -> PathBuf {
    lib.map_or_else(|| PathBuf::from(DEFAULT_NVML_LIB), Path::to_path_buf)
}

#[cfg(feature = "nvml")]
mod imp {
    use super::*;
    use nvml_wrapper::Nvml;

    fn init(lib: &Path) -> Result<Nvml, String> {
        Nvml::builder().lib_path(lib.as_os_str()).init().map_err(|e| e.to_string())
    }

    pub fn probe(lib: Option<&Path>) -> GpuReport {
        let lib = lib_or_default(lib);
        let nvml = match init(&lib) {
            Ok(n) => n,
            Err(reason) => return GpuReport::Unavailable { lib, reason },
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => return GpuReport::Unavailable { lib, reason: format!("counting GPUs: {e}") },
        };
        let gpus = (0..count)
            .map(|index| match nvml.device_by_index(index) {
                Ok(d) => {
                    let energy = d.total_energy_consumption();
                    let power = d.power_usage();
                    let note = match (&energy, &power) {
                        (Err(e), Err(p)) => Some(format!("no energy counter ({e}) and no power reading ({p})")),
                        (Ok(_), Err(p)) => Some(format!("no power reading: {p}")),
                        _ => None,
                    };
                    GpuInfo {
                        index,
                        name: d.name().unwrap_or_else(|e| format!("? ({e})")),
                        uuid: d.uuid().unwrap_or_default(),
                        energy_counter: energy.is_ok(),
                        power_w: power.ok().map(|mw| f64::from(mw) / 1e3),
                        note,
                    }
                }
                Err(e) => GpuInfo {
                    index,
                    name: "?".into(),
                    uuid: String::new(),
                    energy_counter: false,
                    power_w: None,
                    note: Some(format!("cannot open: {e}")),
                },
            })
            .collect();
        GpuReport::Found { lib, gpus }
    }

    /// One GPU being measured.
    struct Tracked {
        index: u32,
        uuid: String,
        /// The counter at the start, when it has one.
        start_mj: Option<u64>,
        /// The counter at the latest sample (the workload's exit, at the end).
        last_mj: Option<u64>,
        /// Power integration: the last (elapsed, watts) and the joules so far.
        last: Option<(Duration, f64)>,
        integrated_j: f64,
        failures: Vec<String>,
    }

    /// GPUs measured over a window: started before the workload, sampled
    /// while it runs (the runner's interval), stopped after it exits.
    pub struct GpuMeter {
        nvml: Nvml,
        gpus: Vec<Tracked>,
        /// When the latest sample was taken.
        sampled: Duration,
    }

    impl std::fmt::Debug for GpuMeter {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("GpuMeter").field("gpus", &self.gpus.len()).finish_non_exhaustive()
        }
    }

    impl GpuMeter {
        /// Starts measuring the GPUs of NVML index `indices`.
        pub fn start(lib: Option<&Path>, indices: &[u32]) -> Result<GpuMeter, String> {
            let lib = lib_or_default(lib);
            let nvml = init(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
            let mut gpus = Vec::with_capacity(indices.len());
            for &index in indices {
                let d = nvml.device_by_index(index).map_err(|e| format!("GPU {index}: {e}"))?;
                let start_mj = d.total_energy_consumption().ok();
                let last = match start_mj {
                    Some(_) => None,
                    None => Some((
                        Duration::ZERO,
                        f64::from(
                            d.power_usage()
                                .map_err(|e| format!("GPU {index}: no energy counter and no power reading: {e}"))?,
                        ) / 1e3,
                    )),
                };
                gpus.push(Tracked {
                    index,
                    uuid: d.uuid().unwrap_or_default(),
                    start_mj,
                    last_mj: start_mj,
                    last,
                    integrated_j: 0.0,
                    failures: Vec::new(),
                });
            }
            Ok(GpuMeter { nvml, gpus, sampled: Duration::ZERO })
        }

        /// A sample `elapsed` after the start: a counter is read, a GPU
        /// without one adds a trapezoid.
        pub fn sample(&mut self, elapsed: Duration) {
            self.sampled = elapsed;
            for g in &mut self.gpus {
                if g.start_mj.is_some() {
                    match self.nvml.device_by_index(g.index).and_then(|d| d.total_energy_consumption()) {
                        Ok(mj) => g.last_mj = Some(mj),
                        Err(e) => g.failures.push(format!("energy read at {:.1} s: {e}", elapsed.as_secs_f64())),
                    }
                    continue;
                }
                let Some((at, watts)) = g.last else { continue };
                match self.nvml.device_by_index(g.index).and_then(|d| d.power_usage()) {
                    Ok(mw) => {
                        let now_w = f64::from(mw) / 1e3;
                        g.integrated_j += (watts + now_w) / 2.0 * elapsed.saturating_sub(at).as_secs_f64();
                        g.last = Some((elapsed, now_w));
                    }
                    Err(e) => g.failures.push(format!("power read at {:.1} s: {e}", elapsed.as_secs_f64())),
                }
            }
        }

        /// Each GPU's joules from the start to the latest sample.
        pub fn so_far(&self) -> Vec<f64> {
            self.gpus
                .iter()
                .map(|g| match (g.start_mj, g.last_mj) {
                    (Some(start), Some(end)) => end.saturating_sub(start) as f64 / 1e3,
                    (Some(_), None) => 0.0,
                    (None, _) => g.integrated_j,
                })
                .collect()
        }

        /// The energy of each GPU from the start until `elapsed`: the
        /// sample taken then (the runner samples at the workload's exit:
        /// nothing after it is counted), else one taken now.
        pub fn stop(mut self, elapsed: Duration) -> Vec<GpuEnergy> {
            if self.sampled < elapsed || elapsed.is_zero() {
                self.sample(elapsed);
            }
            self.gpus
                .into_iter()
                .map(|mut g| {
                    let (joules, method) = match (g.start_mj, g.last_mj) {
                        (Some(start), Some(end)) if end >= start => ((end - start) as f64 / 1e3, GpuMethod::Counter),
                        (Some(start), Some(end)) => {
                            g.failures.push(format!("the counter went back ({start} -> {end} mJ): driver reloaded?"));
                            (0.0, GpuMethod::Counter)
                        }
                        (Some(_), None) => (0.0, GpuMethod::Counter),
                        (None, _) => (g.integrated_j, GpuMethod::PowerIntegrated),
                    };
                    let valid = g.failures.is_empty();
                    GpuEnergy {
                        index: g.index,
                        uuid: g.uuid,
                        joules,
                        method,
                        valid,
                        note: (!valid).then(|| g.failures.join("; ")),
                    }
                })
                .collect()
        }
    }
}

#[cfg(not(feature = "nvml"))]
mod imp {
    use super::*;

    pub fn probe(_lib: Option<&Path>) -> GpuReport {
        GpuReport::NotBuilt
    }

    /// Without NVML there is no GPU meter.
    #[derive(Debug)]
    pub struct GpuMeter;

    impl GpuMeter {
        pub fn start(_lib: Option<&Path>, _indices: &[u32]) -> Result<GpuMeter, String> {
            Err("this agent was built without NVML (the static agent): no GPU energy".into())
        }
        pub fn sample(&mut self, _elapsed: Duration) {}
        pub fn so_far(&self) -> Vec<f64> {
            Vec::new()
        }
        pub fn stop(self, _elapsed: Duration) -> Vec<GpuEnergy> {
            Vec::new()
        }
    }
}

pub use imp::{probe, GpuMeter};
