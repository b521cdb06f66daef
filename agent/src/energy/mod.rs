//! Energy measurement seam. An [`EnergySource`] starts an [`EnergyMeter`]
//! just before the workload is let go; the runner calls
//! [`EnergyMeter::sample`] at an interval while it runs (so counter wraps are
//! caught and a power series exists) and [`EnergyMeter::stop`] once it has
//! exited. The [`EnergyReading`] says where every joule came from: source,
//! domains, interval, and a validity flag with its reason.
//!
//! A trial's meters come from one [`Registry`]: the source [`select`]
//! chose and NVML for its GPUs, started together and stopped together.
//!
//! Sources, tried in this order by [`select`]:
//!
//! * [`external`]: a meter read through a command or an HTTP endpoint (a
//!   PDU, a smart plug), used whenever one is configured (`--energy-command`,
//!   `--energy-url`); the others are then only listed.
//! * [`rapl`]: RAPL through powercap (`/sys/class/powercap`), Intel and AMD.
//! * [`hwmon`]: hwmon energy counters and power sensors (`/sys/class/hwmon`).
//! * [`battery`]: battery fuel gauges (`/sys/class/power_supply`).
//! * [`estimate`]: a model from CPU time, always available, always labelled.
//!
//! Every metered source reads a root path given as a parameter, through a
//! [`SysfsRead`] seam, so tests point it at fixture trees (and, running as
//! root, can still make a file unreadable). A source that is present but not
//! readable is skipped with a message saying how to grant access, and the
//! reading of the source used instead says which sources were skipped.

pub mod battery;
pub mod estimate;
pub mod external;
pub mod gpu;
pub mod hwmon;
mod metered;
pub mod rapl;
mod registry;
mod source;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind};
use tunefleet_common::message::EnergySourceInfo;

pub use estimate::{Estimate, EstimateModel, ESTIMATE_DOMAIN};
pub use metered::{Channel, ChannelRead, MeteredSource};
pub use registry::{start_or_estimate, Registry, TrialMeters};
pub use source::{
    grant_hint, read_i64, read_text, sampling_interval, skipped_note, EnergyError, EnergyMeter, EnergySource, RealFs,
    SysfsRead, Usage, GRANT_HINT,
};

/// Default roots of the metered sources (defined with the flags that override them).
pub use tunefleet_common::agent_cli::{HWMON_ROOT, POWERCAP_ROOT, POWER_SUPPLY_ROOT};

/// Where the metered sources live, and how their files are read.
#[derive(Debug, Clone)]
pub struct EnergyRoots {
    pub powercap: PathBuf,
    pub hwmon: PathBuf,
    pub power_supply: PathBuf,
    pub fs: Arc<dyn SysfsRead>,
    /// An external meter; when set, it is the source.
    pub external: Option<external::ExternalConfig>,
    /// NVML, the GPU driver's library ([`gpu`]); `None`: where the driver installs it.
    pub nvml_lib: Option<PathBuf>,
}

impl Default for EnergyRoots {
    fn default() -> Self {
        EnergyRoots {
            powercap: PathBuf::from(POWERCAP_ROOT),
            hwmon: PathBuf::from(HWMON_ROOT),
            power_supply: PathBuf::from(POWER_SUPPLY_ROOT),
            fs: Arc::new(RealFs),
            external: None,
            nvml_lib: None,
        }
    }
}

impl EnergyRoots {
    /// All roots under one directory (`powercap`, `hwmon`, `power_supply`, `nvml`).
    pub fn under(dir: &Path) -> Self {
        EnergyRoots {
            powercap: dir.join("powercap"),
            hwmon: dir.join("hwmon"),
            power_supply: dir.join("power_supply"),
            fs: Arc::new(RealFs),
            external: None,
            // A fixture tree has its own (usually absent) NVML, never the machine's.
            nvml_lib: Some(dir.join("nvml").join(gpu::DEFAULT_NVML_LIB)),
        }
    }
}

/// The source chosen, and what was found on the way.
pub struct Selection {
    pub source: Arc<dyn EnergySource>,
    /// Every source looked at, in order, readable or not (for Hello and `probe`).
    pub found: Vec<EnergySourceInfo>,
    /// Sources present but skipped, with the reason (empty when the first
    /// present source was used).
    pub skipped: Vec<String>,
}

impl std::fmt::Debug for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selection")
            .field("source", &self.source.kind())
            .field("found", &self.found)
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// Uses the external meter when one is configured (readable now or not: its
/// readings then say why they are invalid); else tries RAPL, hwmon,
/// battery, then the estimate, and uses the first that is present and
/// readable. Present but unreadable sources are logged with how to grant
/// access, listed in `skipped`, and named in every reading's note.
pub fn select(roots: &EnergyRoots, model: EstimateModel) -> Selection {
    let fs = &roots.fs;
    let candidates: [(EnergySourceKind, Result<MeteredSource, EnergyError>); 3] = [
        (EnergySourceKind::Rapl, rapl::discover(&roots.powercap, Arc::clone(fs))),
        (EnergySourceKind::Hwmon, hwmon::discover(&roots.hwmon, Arc::clone(fs))),
        (EnergySourceKind::Battery, battery::discover(&roots.power_supply, Arc::clone(fs))),
    ];
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    let mut chosen: Option<Arc<dyn EnergySource>> = None;
    if let Some(config) = &roots.external {
        let source = external::ExternalSource { config: config.clone() };
        let info = source.info();
        if !info.readable {
            tracing::warn!(
                note = info.note.as_deref().unwrap_or(""),
                "external energy meter does not read now; its readings will be invalid until it does"
            );
        }
        found.push(info);
        chosen = Some(Arc::new(source));
    }
    for (kind, result) in candidates {
        match result {
            Ok(source) => {
                found.push(source.info());
                if chosen.is_none() {
                    chosen = Some(Arc::new(source));
                }
            }
            Err(EnergyError::NotFound { .. }) => {}
            Err(e) => {
                let reason = format!("{kind}: {e}");
                found.push(EnergySourceInfo { kind, domains: Vec::new(), readable: false, note: Some(e.to_string()) });
                if chosen.is_none() {
                    tracing::warn!(source = %kind, error = %e, "energy source present but unusable; trying the next");
                    skipped.push(reason);
                }
            }
        }
    }
    let estimate = Estimate { model, skipped: skipped.clone() };
    found.push(estimate.info());
    let source = match chosen {
        Some(s) if skipped.is_empty() => s,
        Some(s) => Arc::new(Annotated { inner: s, note: skipped_note(&skipped) }),
        None => Arc::new(estimate),
    };
    tracing::info!(source = %source.kind(), skipped = skipped.len(), "energy source selected");
    Selection { source, found, skipped }
}

/// A source whose readings carry an extra note (why earlier sources were skipped).
struct Annotated {
    inner: Arc<dyn EnergySource>,
    note: String,
}

struct AnnotatedMeter {
    inner: Box<dyn EnergyMeter>,
    note: String,
}

impl EnergySource for Annotated {
    fn kind(&self) -> EnergySourceKind {
        self.inner.kind()
    }
    fn info(&self) -> EnergySourceInfo {
        self.inner.info()
    }
    fn max_interval(&self) -> Option<Duration> {
        self.inner.max_interval()
    }
    fn start(&self) -> Result<Box<dyn EnergyMeter>, EnergyError> {
        Ok(Box::new(AnnotatedMeter { inner: self.inner.start()?, note: self.note.clone() }))
    }
}

impl EnergyMeter for AnnotatedMeter {
    fn sample(&mut self, elapsed: Duration) {
        self.inner.sample(elapsed);
    }
    fn last_watts(&self) -> Option<f64> {
        self.inner.last_watts()
    }
    fn so_far(&self, usage: &Usage) -> Option<f64> {
        self.inner.so_far(usage)
    }
    fn stop(self: Box<Self>, elapsed: Duration, usage: &Usage) -> EnergyReading {
        let mut reading = self.inner.stop(elapsed, usage);
        reading.note = Some(match reading.note.take() {
            Some(n) => format!("{n}; {}", self.note),
            None => self.note,
        });
        reading
    }
}
