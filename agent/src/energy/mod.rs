//! Energy measurement seam. An [`EnergySource`] starts an [`EnergyMeter`]
//! just before the workload is let go; the runner calls
//! [`EnergyMeter::sample`] at an interval while it runs (so counter wraps are
//! caught and a power series exists) and [`EnergyMeter::stop`] once it has
//! exited. The [`EnergyReading`] says where every joule came from: source,
//! domains, interval, and a validity flag with its reason.
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
pub mod hwmon;
mod metered;
pub mod rapl;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind};
use tunefleet_common::message::EnergySourceInfo;

pub use estimate::{Estimate, EstimateModel, ESTIMATE_DOMAIN};
pub use metered::{Channel, ChannelRead, MeteredSource};

/// Default roots of the metered sources (defined with the flags that override them).
pub use tunefleet_common::agent_cli::{HWMON_ROOT, POWERCAP_ROOT, POWER_SUPPLY_ROOT};

/// How to let a non-root agent read root-only energy counters.
pub const GRANT_HINT: &str = "energy counters are root-only since the PLATYPUS fix (CVE-2020-8694); \
to let the agent read them, give a group read access at boot, e.g. in the agent's systemd unit: \
ExecStartPre=-+/usr/bin/find /sys/devices/virtual/powercap -name energy_uj -exec chgrp powercap {} + \
-exec chmod g+r {} + with SupplementaryGroups=powercap (or run the agent as root)";

/// How to let a non-root agent read `path`: [`GRANT_HINT`] for RAPL, the
/// same recipe for that very file otherwise (a hwmon counter, a battery).
pub fn grant_hint(path: &Path) -> String {
    if path.components().any(|c| c.as_os_str() == "powercap") {
        return GRANT_HINT.to_string();
    }
    let p = path.display();
    format!(
        "the agent's user may not read it; to let the agent read it, give a group read access at boot, e.g. in \
         the agent's systemd unit: ExecStartPre=+/bin/sh -c 'chgrp powercap {p} && chmod g+r {p}' with \
         SupplementaryGroups=powercap (or run the agent as root)"
    )
}

/// What the workload used, for sources that model rather than measure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub wall: Duration,
    /// User + system CPU time of the process tree.
    pub cpu: Duration,
    /// CPUs the workload could run on.
    pub cores: u32,
}

/// Why a source cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EnergyError {
    #[error("{}: permission denied; {}", path.display(), grant_hint(path))]
    PermissionDenied { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {text:?} is not a number", path.display())]
    Parse { path: PathBuf, text: String },
    #[error("no {kind} energy domains under {}", root.display())]
    NotFound { kind: EnergySourceKind, root: PathBuf },
    #[error("cannot start the meter's reading thread: {0}")]
    Thread(String),
}

impl EnergyError {
    /// True when the source exists but this process may not read it.
    pub fn is_permission(&self) -> bool {
        matches!(self, EnergyError::PermissionDenied { .. })
    }
}

/// How sysfs files are read: the real file system, or a test double.
pub trait SysfsRead: Send + Sync + std::fmt::Debug {
    fn read(&self, path: &Path) -> std::io::Result<String>;
    fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealFs;

impl SysfsRead for RealFs {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
        out.sort();
        Ok(out)
    }
}

/// Reads a sysfs file as trimmed text, mapping errors to [`EnergyError`].
pub fn read_text(fs: &dyn SysfsRead, path: &Path) -> Result<String, EnergyError> {
    match fs.read(path) {
        Ok(text) => Ok(text.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(EnergyError::PermissionDenied { path: path.to_path_buf() })
        }
        Err(source) => Err(EnergyError::Read { path: path.to_path_buf(), source }),
    }
}

/// Reads a sysfs file holding one integer.
pub fn read_i64(fs: &dyn SysfsRead, path: &Path) -> Result<i64, EnergyError> {
    let text = read_text(fs, path)?;
    text.parse().map_err(|_| EnergyError::Parse { path: path.to_path_buf(), text })
}

/// A place energy figures come from.
pub trait EnergySource: Send + Sync {
    fn kind(&self) -> EnergySourceKind;
    /// What this source offers, for the agent's Hello and `probe`.
    fn info(&self) -> EnergySourceInfo;
    /// The longest sampling interval that still sees every counter wrap;
    /// `None` when the source has no such limit.
    fn max_interval(&self) -> Option<Duration> {
        None
    }
    /// Starts measuring (reads every counter once); called just before the
    /// workload starts.
    fn start(&self) -> Result<Box<dyn EnergyMeter>, EnergyError>;
}

/// A measurement in progress.
pub trait EnergyMeter: Send {
    /// Reads the meters at `elapsed` since the start.
    fn sample(&mut self, elapsed: Duration);
    /// Average power of the counted domains over the last sampled interval.
    fn last_watts(&self) -> Option<f64>;
    /// Takes a last sample and returns the reading; `usage` feeds models.
    fn stop(self: Box<Self>, elapsed: Duration, usage: &Usage) -> EnergyReading;
    /// Joules counted from the start to the last sample (for a model, at
    /// `usage`); `None` when the meter cannot say before it stops.
    fn so_far(&self, _usage: &Usage) -> Option<f64> {
        None
    }
}

/// The sampling interval to use: the one asked for, shortened when the
/// source's counters could wrap more than once in it.
pub fn sampling_interval(requested: Duration, source: &dyn EnergySource) -> Duration {
    match source.max_interval() {
        Some(max) if max < requested => max.max(Duration::from_millis(1)),
        _ => requested,
    }
}

/// Where the metered sources live, and how their files are read.
#[derive(Debug, Clone)]
pub struct EnergyRoots {
    pub powercap: PathBuf,
    pub hwmon: PathBuf,
    pub power_supply: PathBuf,
    pub fs: Arc<dyn SysfsRead>,
    /// An external meter; when set, it is the source.
    pub external: Option<external::ExternalConfig>,
}

impl Default for EnergyRoots {
    fn default() -> Self {
        EnergyRoots {
            powercap: PathBuf::from(POWERCAP_ROOT),
            hwmon: PathBuf::from(HWMON_ROOT),
            power_supply: PathBuf::from(POWER_SUPPLY_ROOT),
            fs: Arc::new(RealFs),
            external: None,
        }
    }
}

impl EnergyRoots {
    /// All three roots under one directory (`powercap`, `hwmon`, `power_supply`).
    pub fn under(dir: &Path) -> Self {
        EnergyRoots {
            powercap: dir.join("powercap"),
            hwmon: dir.join("hwmon"),
            power_supply: dir.join("power_supply"),
            fs: Arc::new(RealFs),
            external: None,
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

/// The note naming skipped sources.
pub fn skipped_note(skipped: &[String]) -> String {
    format!("skipped: {}", skipped.join("; "))
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
