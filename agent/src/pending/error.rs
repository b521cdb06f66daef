//! The spool's error type and the two small I/O helpers the log and the
//! spool share (below both, so neither imports the other's parent).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tunefleet_common::message::TrialRef;
use tunefleet_common::CodecError;

/// A state-directory operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("{action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: io::Error },
    #[error("cannot encode the result of {trial}: {source}")]
    Encode { trial: TrialRef, source: CodecError },
    #[error("another agent uses the state directory {0} (it holds spool.lock)")]
    Locked(PathBuf),
}

pub(super) fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PendingError {
    let path = path.to_path_buf();
    move |source| PendingError::Io { action, path, source }
}

/// Makes a rename or removal in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), PendingError> {
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))
}
