//! Fixture sysfs trees in a temp dir: `powercap/`, `hwmon/`, `power_supply/`
//! under one root, rewritten between samples by the tests.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tempfile::TempDir;
use tunefleet_agent::energy::{EnergyRoots, RealFs, SysfsRead};

/// Intel's 32-bit package counter range, in microjoules.
pub const INTEL_RANGE: u64 = 262_143_328_850;
/// The range AMD reports for its RAPL package zone.
pub const AMD_RANGE: u64 = 65_532_610_987;

/// A fixture tree.
pub struct Sysfs {
    dir: TempDir,
}

impl Sysfs {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["powercap", "hwmon", "power_supply"] {
            fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        Sysfs { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn write(&self, rel: &str, content: &str) {
        let path = self.path(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).expect("mkdir");
        }
        fs::write(path, format!("{content}\n")).expect("write");
    }

    pub fn remove_dir(&self, rel: &str) {
        fs::remove_dir_all(self.path(rel)).expect("remove");
    }

    /// A RAPL zone `powercap/intel-rapl:{id}`.
    pub fn rapl_zone(&self, id: &str, name: &str, energy_uj: u64, range_uj: u64) {
        let zone = format!("powercap/intel-rapl:{id}");
        self.write(&format!("{zone}/name"), name);
        self.write(&format!("{zone}/energy_uj"), &energy_uj.to_string());
        self.write(&format!("{zone}/max_energy_range_uj"), &range_uj.to_string());
    }

    pub fn set_energy(&self, id: &str, energy_uj: u64) {
        self.write(&format!("powercap/intel-rapl:{id}/energy_uj"), &energy_uj.to_string());
    }

    pub fn roots(&self) -> EnergyRoots {
        EnergyRoots::under(self.dir.path())
    }

    /// Roots whose reads of `denied` fail with EACCES, as a non-root agent
    /// sees a root-only `energy_uj` (chmod cannot do that for root).
    pub fn roots_denying(&self, denied: &[&str]) -> EnergyRoots {
        let denied = denied.iter().map(|d| self.path(d)).collect();
        EnergyRoots { fs: Arc::new(DenyFs { denied }), ..self.roots() }
    }
}

/// The real file system, except that some paths are permission denied.
#[derive(Debug)]
pub struct DenyFs {
    pub denied: Vec<PathBuf>,
}

impl SysfsRead for DenyFs {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        if self.denied.iter().any(|d| d == path) {
            return Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        }
        RealFs.read(path)
    }

    fn list(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        RealFs.list(dir)
    }
}
