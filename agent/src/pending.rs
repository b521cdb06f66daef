//! Results waiting for the coordinator's acknowledgement, kept on disk in
//! the state directory so a restarted agent publishes them again.
//!
//! Layout: `{state_dir}/unacked/{study}-{trial}-{attempt}-{hash}.bin`, each
//! file one encoded `TrialResult` (the wire codec, version byte included).
//! Writes go through a temporary file and a rename, so a crash never leaves
//! half a result behind; a file that does not decode is logged and skipped.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tunefleet_common::message::{TrialRef, TrialResult};
use tunefleet_common::{decode, encode, CodecError};

/// A state-directory operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("{action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: io::Error },
    #[error("cannot encode the result of {trial}: {source}")]
    Encode { trial: TrialRef, source: CodecError },
}

/// The on-disk set of unacknowledged results.
#[derive(Debug, Clone)]
pub struct PendingResults {
    dir: PathBuf,
}

/// FNV-1a, stable across builds (file names must survive upgrades).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The file name of a trial's result.
pub fn file_name(trial: &TrialRef) -> String {
    let study: String =
        trial.study.chars().take(40).map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    let hash = fnv1a(format!("{}\0{}\0{}", trial.study, trial.trial, trial.attempt).as_bytes());
    format!("{study}-{}-{}-{hash:016x}.bin", trial.trial, trial.attempt)
}

impl PendingResults {
    /// Opens (creating) `{state_dir}/unacked`.
    pub fn open(state_dir: &Path) -> Result<Self, PendingError> {
        let dir = state_dir.join("unacked");
        fs::create_dir_all(&dir).map_err(|source| PendingError::Io { action: "create", path: dir.clone(), source })?;
        Ok(PendingResults { dir })
    }

    pub fn save(&self, result: &TrialResult) -> Result<(), PendingError> {
        let bytes = encode(result).map_err(|source| PendingError::Encode { trial: result.trial.clone(), source })?;
        let path = self.dir.join(file_name(&result.trial));
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, bytes).map_err(|source| PendingError::Io { action: "write", path: tmp.clone(), source })?;
        fs::rename(&tmp, &path).map_err(|source| PendingError::Io { action: "rename", path, source })
    }

    pub fn remove(&self, trial: &TrialRef) -> Result<(), PendingError> {
        let path = self.dir.join(file_name(trial));
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(PendingError::Io { action: "remove", path, source: e })
            }
            _ => Ok(()),
        }
    }

    /// Every stored result that decodes.
    pub fn load(&self) -> Vec<TrialResult> {
        let Ok(entries) = fs::read_dir(&self.dir) else { return Vec::new() };
        let mut out = Vec::new();
        for path in entries.flatten().map(|e| e.path()) {
            if path.extension().and_then(|e| e.to_str()) != Some("bin") {
                continue;
            }
            match fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| decode::<TrialResult>(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable stored result"),
            }
        }
        out.sort_by(|a, b| a.trial.cmp(&b.trial));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{
        AppliedLimits, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, MemoryLimit,
    };

    fn result(study: &str, trial: u64) -> TrialResult {
        TrialResult {
            token: 0,
            trial: TrialRef { study: study.into(), trial, attempt: 1 },
            measurement: Measurement {
                started_unix_ms: 5,
                wall_us: 7,
                max_rss_kib: 3,
                energy: EnergyReading {
                    joules: 1.5,
                    valid: true,
                    ..EnergyReading::none(EnergySourceKind::Estimated, "")
                },
                limits: AppliedLimits { cpus: vec![1], threads: Some(2), memory: MemoryLimit::None },
                log_tail: "x\n".into(),
                ..Measurement::unmeasured(ExitOutcome::Cancelled, EnergyReading::none(EnergySourceKind::Estimated, ""))
            },
        }
    }

    #[test]
    fn saves_loads_and_removes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = PendingResults::open(dir.path()).expect("open");
        let (a, b) = (result("st/../x", 1), result("st/../x", 2));
        store.save(&a).expect("save");
        store.save(&b).expect("save");
        fs::write(dir.path().join("unacked").join("junk.bin"), b"\x01\xff").expect("write junk");
        assert_eq!(store.load(), vec![a.clone(), b.clone()]);
        store.remove(&a.trial).expect("remove");
        store.remove(&a.trial).expect("removing twice is fine");
        assert_eq!(PendingResults::open(dir.path()).expect("reopen").load(), vec![b]);
        assert_ne!(file_name(&a.trial), file_name(&result("st_.._x", 1).trial));
    }
}
