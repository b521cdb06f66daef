//! The seam every energy source plugs into: [`EnergySource`] and
//! [`EnergyMeter`], the [`SysfsRead`] file-system seam with its readers,
//! the errors ([`EnergyError`], with how to grant access) and what a model
//! is fed ([`Usage`]). The sources (`rapl`, `hwmon`, `battery`, `external`,
//! `estimate`) build on it; `select` in the parent picks one.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind};
use tunefleet_common::message::EnergySourceInfo;

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

/// The note naming skipped sources.
pub fn skipped_note(skipped: &[String]) -> String {
    format!("skipped: {}", skipped.join("; "))
}
