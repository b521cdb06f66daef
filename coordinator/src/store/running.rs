//! Which stores a coordinator is running on: every running coordinator
//! holds a shared lock on a file beside its store for as long as it runs,
//! and the commands that change a study under it (`studies rename`,
//! `studies delete`) need the lock alone. The kernel drops a lock with its
//! process, so a coordinator that stalled (stopped, swapped out, on a
//! paused VM) still holds it, and one that died holds nothing: no
//! heartbeat's age decides.
//!
//! A store on a PostgreSQL server has no file beside it: the same lock is
//! an advisory lock of the server, held by a connection of its own for as
//! long as this value lives (the server drops it with the connection).

use std::fs::File;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// A lock on a store's running file, held while this value lives.
#[derive(Debug)]
pub struct RunLock {
    _file: Option<File>,
    _conn: Option<super::sql::Conn>,
}

/// The advisory lock's key on a server: one per schema, so fleets sharing
/// a server do not wait for each other.
fn advisory_key(schema: &str) -> i64 {
    let h = super::fnv(format!("tunefleet running {schema}").as_bytes(), super::FNV_START);
    i64::from_ne_bytes(h.to_ne_bytes())
}

/// A connection of its own to the server `store` names, and its key.
fn server_lock(store: &Path) -> std::io::Result<(super::sql::Conn, i64)> {
    let (conn, target) = super::sql::Conn::open_server(store).map_err(std::io::Error::other)?;
    Ok((conn, advisory_key(&target.schema)))
}

/// The file beside `store` that running coordinators lock.
pub fn lock_path(store: &Path) -> PathBuf {
    let mut name = store.as_os_str().to_os_string();
    name.push(".running");
    PathBuf::from(name)
}

fn open(store: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(lock_path(store))
}

impl RunLock {
    /// What a running coordinator holds: shared, so several coordinators
    /// (a `serve` and a `run` of another study) may run on one store. It
    /// waits only while a rename or delete holds the lock alone.
    pub fn running(store: &Path) -> std::io::Result<RunLock> {
        if super::is_remote(store) {
            let (conn, key) = server_lock(store)?;
            conn.execute("SELECT pg_advisory_lock_shared(?1)", [key]).map_err(std::io::Error::other)?;
            return Ok(RunLock { _file: None, _conn: Some(conn) });
        }
        let file = open(store)?;
        flock(&file, FlockOperation::LockShared)?;
        Ok(RunLock { _file: Some(file), _conn: None })
    }

    /// The lock alone, or `None` while any coordinator runs on `store`.
    pub fn alone(store: &Path) -> std::io::Result<Option<RunLock>> {
        if super::is_remote(store) {
            let (conn, key) = server_lock(store)?;
            let held: bool = conn
                .query_row("SELECT pg_try_advisory_lock(?1)", [key], |r| r.get(0))
                .map_err(std::io::Error::other)?;
            return Ok(held.then_some(RunLock { _file: None, _conn: Some(conn) }));
        }
        let file = open(store)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(RunLock { _file: Some(file), _conn: None })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_coordinator_keeps_the_store_from_being_changed_alone() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("s.db");
        let a = RunLock::running(&store).expect("running");
        let b = RunLock::running(&store).expect("a second coordinator runs beside it");
        assert!(RunLock::alone(&store).expect("try").is_none(), "two run");
        drop(a);
        assert!(RunLock::alone(&store).expect("try").is_none(), "one runs");
        drop(b);
        let alone = RunLock::alone(&store).expect("try");
        assert!(alone.is_some(), "none runs");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(lock_path(&store)).expect("meta").permissions().mode();
        assert_eq!(mode & 0o077, 0, "private: {mode:o}");
    }
}
