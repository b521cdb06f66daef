//! Memory limits through cgroup v2, when a memory controller is usable.
//!
//! Under `{root}` (default `/sys/fs/cgroup`, a parameter so tests use a
//! fixture tree) the agent keeps a `tunefleet` cgroup with the memory
//! controller enabled for its children, and gives every trial a child cgroup
//! with `memory.max` set. Without a usable controller (cgroup v1, hybrid
//! hierarchies, no permission) [`CgroupV2::detect`] returns `None` and the
//! runner falls back to `RLIMIT_AS`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Default mount point of the cgroup v2 hierarchy.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// Name of the agent's parent cgroup under the root.
pub const PARENT: &str = "tunefleet";

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {action} {path}: {source}")]
pub struct CgroupError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn has_memory(path: &Path) -> bool {
    fs::read_to_string(path).is_ok_and(|s| s.split_whitespace().any(|c| c == "memory"))
}

/// A cgroup v2 hierarchy whose memory controller the agent can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupV2 {
    parent: PathBuf,
}

impl CgroupV2 {
    /// Checks `root` and prepares `{root}/tunefleet`; `None` when the memory
    /// controller is not usable there (logged at debug level).
    pub fn detect(root: &Path) -> Option<Self> {
        match Self::prepare(root) {
            Ok(Some(c)) => Some(c),
            Ok(None) => {
                tracing::debug!(root = %root.display(), "no cgroup v2 memory controller");
                None
            }
            Err(e) => {
                tracing::debug!(error = %e, "cgroup v2 memory controller not usable");
                None
            }
        }
    }

    fn prepare(root: &Path) -> Result<Option<Self>, CgroupError> {
        if !has_memory(&root.join("cgroup.controllers")) {
            return Ok(None);
        }
        let enable = |dir: &Path| -> Result<(), CgroupError> {
            let control = dir.join("cgroup.subtree_control");
            if !has_memory(&control) {
                fs::write(&control, "+memory").map_err(|source| CgroupError {
                    action: "enable memory in",
                    path: control.clone(),
                    source,
                })?;
            }
            Ok(())
        };
        enable(root)?;
        let parent = root.join(PARENT);
        fs::create_dir_all(&parent).map_err(|source| CgroupError { action: "create", path: parent.clone(), source })?;
        if !has_memory(&parent.join("cgroup.controllers")) {
            return Ok(None);
        }
        enable(&parent)?;
        Ok(Some(CgroupV2 { parent }))
    }

    /// Creates the cgroup of one trial with `memory.max = bytes`.
    pub fn create_trial(&self, name: &str, bytes: u64) -> Result<TrialCgroup, CgroupError> {
        let dir = self.parent.join(name);
        fs::create_dir_all(&dir).map_err(|source| CgroupError { action: "create", path: dir.clone(), source })?;
        let max = dir.join("memory.max");
        fs::write(&max, bytes.to_string()).map_err(|source| CgroupError { action: "write", path: max, source })?;
        // The trial's tree is killed on limit, not just the biggest process.
        let _ = fs::write(dir.join("memory.oom.group"), "1");
        Ok(TrialCgroup { dir })
    }
}

/// The cgroup of one trial; removed with [`TrialCgroup::remove`].
#[derive(Debug)]
pub struct TrialCgroup {
    dir: PathBuf,
}

impl TrialCgroup {
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves process `pid` into this cgroup.
    pub fn add(&self, pid: u32) -> Result<(), CgroupError> {
        let procs = self.dir.join("cgroup.procs");
        fs::write(&procs, pid.to_string()).map_err(|source| CgroupError { action: "write", path: procs, source })
    }

    /// The cgroup's `memory.peak` in bytes, when the kernel provides it.
    pub fn memory_peak(&self) -> Option<u64> {
        fs::read_to_string(self.dir.join("memory.peak")).ok()?.trim().parse().ok()
    }

    /// Removes the cgroup (it must be empty); failure is logged.
    pub fn remove(self) {
        if let Err(e) = fs::remove_dir(&self.dir) {
            tracing::debug!(path = %self.dir.display(), error = %e, "cannot remove trial cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_and_creates_in_a_fixture_tree() {
        let root = tempfile::tempdir().expect("tempdir");
        assert_eq!(CgroupV2::detect(root.path()), None, "no cgroup.controllers");
        fs::write(root.path().join("cgroup.controllers"), "cpu io\n").expect("write");
        assert_eq!(CgroupV2::detect(root.path()), None, "no memory controller");
        fs::write(root.path().join("cgroup.controllers"), "cpu memory io\n").expect("write");
        fs::create_dir_all(root.path().join(PARENT)).expect("mkdir");
        fs::write(root.path().join(PARENT).join("cgroup.controllers"), "memory\n").expect("write");
        let cg = CgroupV2::detect(root.path()).expect("usable");
        assert_eq!(fs::read_to_string(root.path().join("cgroup.subtree_control")).expect("read"), "+memory");
        let trial = cg.create_trial("s-1-0", 64 << 20).expect("create");
        trial.add(4242).expect("add");
        assert_eq!(fs::read_to_string(trial.path().join("memory.max")).expect("read"), "67108864");
        assert_eq!(fs::read_to_string(trial.path().join("cgroup.procs")).expect("read"), "4242");
        assert_eq!(trial.memory_peak(), None);
    }
}
