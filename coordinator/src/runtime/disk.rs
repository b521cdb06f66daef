//! Room on the store's disk. Below a floor the coordinator pauses rather
//! than fail a commit (and exit, and restart into the same full disk under
//! systemd): it takes no message and assigns nothing, agents keep their
//! results, and it goes on once there is room again.

use std::path::{Path, PathBuf};

/// The default floor: the store's filesystem keeps at least this free.
pub const DEFAULT_MIN_FREE_MIB: u64 = 64;

/// What one agent's results and progress may take of a study's store by
/// default (MiB): ample for honest trials (a result is at most 1 MiB, most
/// take a few KiB), a bound on what a member can write.
pub const DEFAULT_STORE_SHARE_MIB: u64 = 256;

/// Bytes free to an unprivileged writer on the filesystem holding `path`
/// (its directory, for a file not made yet); `None` when it cannot be read.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let dir = match path.exists() {
        true => path,
        false => path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")),
    };
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Whether the store at `path` has room: at least `floor` bytes free (an
/// unreadable figure counts as room: the commit will say).
pub fn has_room(path: &Path, floor: u64) -> bool {
    free_bytes(path).is_none_or(|free| free >= floor)
}

/// `bytes` for reading (`12.3 MiB`).
pub fn readable(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    format!("{:.1} MiB", bytes as f64 / MIB)
}

/// The engine's view of the store's disk, looked at most once a second.
#[derive(Debug)]
pub struct Guard {
    pub path: PathBuf,
    pub floor: u64,
    checked_ms: Option<u64>,
    paused: bool,
}

/// What changed at a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Same,
    Paused { free: u64 },
    Resumed { free: u64 },
}

impl Guard {
    pub fn new(path: PathBuf, floor: u64) -> Self {
        Guard { path, floor, checked_ms: None, paused: false }
    }

    pub fn paused(&self) -> bool {
        self.paused
    }

    /// Looks at the disk when a second has passed since the last look (at
    /// engine time `now_ms`); pauses below the floor, resumes at twice the
    /// floor's room above it (no flapping at the edge).
    pub fn look(&mut self, now_ms: u64) -> Change {
        if self.checked_ms.is_some_and(|at| now_ms < at.saturating_add(1000)) {
            return Change::Same;
        }
        self.checked_ms = Some(now_ms);
        let Some(free) = free_bytes(&self.path) else { return Change::Same };
        match self.paused {
            false if free < self.floor => {
                self.paused = true;
                Change::Paused { free }
            }
            true if free >= self.floor.saturating_mul(2).max(self.floor.saturating_add(1)) => {
                self.paused = false;
                Change::Resumed { free }
            }
            _ => Change::Same,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_space_of_this_filesystem_is_read_and_a_floor_above_it_pauses() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("s.db");
        let free = free_bytes(&store).expect("statvfs of a temp dir");
        assert!(free > 0);
        assert!(has_room(&store, 0));
        assert!(!has_room(&store, u64::MAX));
        let mut g = Guard::new(store.clone(), free.saturating_mul(4));
        assert!(matches!(g.look(0), Change::Paused { .. }));
        assert_eq!(g.look(500), Change::Same, "looked at most once a second");
        assert!(g.paused());
        g.floor = 1;
        assert!(matches!(g.look(1500), Change::Resumed { .. }));
        assert!(!g.paused());
    }
}
