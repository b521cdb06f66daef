//! Results waiting for the coordinator's acknowledgement, kept on disk in
//! the state directory so a restarted agent publishes them again.
//!
//! Layout: `{state_dir}/unacked/{study}-{trial}-{attempt}-{hash}.bin`, each
//! file one encoded `TrialResult` (the wire codec, version byte included).
//! Writes go through a temporary file, fsync, a rename and an fsync of the
//! directory, so a result is on disk (power cut included) before it is sent
//! and a crash never leaves half a result behind; a file that does not
//! decode is logged and skipped.
//!
//! A result the coordinator refuses (a study it does not run, a value it
//! cannot store) moves to `{state_dir}/parked/`, with a `.why` file beside
//! it: never re-sent on its own, never deleted. `tunefleet-agent spool`
//! lists both, and `tunefleet-agent spool requeue` moves parked results
//! back, to be delivered to the coordinator that runs their study.

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
    parked: PathBuf,
}

/// A result kept aside, as `tunefleet-agent spool` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Parked {
    pub trial: TrialRef,
    pub reason: String,
    pub path: PathBuf,
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PendingError {
    let path = path.to_path_buf();
    move |source| PendingError::Io { action, path, source }
}

/// Makes a rename or removal in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), PendingError> {
    fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_err("sync", dir))
}

/// Writes `bytes` to `path` durably: temporary file, fsync, rename, fsync of the directory.
fn write_durably(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), PendingError> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("rename", path))?;
    sync_dir(dir)
}

/// Moves `from` to `to` unless `to` exists: a hard link (which fails on an
/// existing name, with no window in between) then the removal of `from`.
/// Returns whether it moved. Where the file system has no hard links, an
/// existence check and a rename (only the agent writes its state directory).
fn move_without_replacing(from: &Path, to: &Path) -> io::Result<bool> {
    match fs::hard_link(from, to) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
        Err(_) => {
            if to.try_exists()? {
                return Ok(false);
            }
            fs::rename(from, to)?;
            return Ok(true);
        }
    }
    fs::remove_file(from)?;
    if let Some(dir) = to.parent() {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(true)
}

/// FNV-1a, stable across builds (file names must survive upgrades).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The file name of a trial's result.
pub fn file_name(trial: &TrialRef) -> String {
    let study: String =
        trial.study.chars().take(40).map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    // The study id too: two studies of one name (two stores) never share a file.
    let hash = fnv1a(format!("{}\0{}\0{}\0{}", trial.study, trial.study_id, trial.trial, trial.attempt).as_bytes());
    format!("{study}-{}-{}-{hash:016x}.bin", trial.trial, trial.attempt)
}

impl PendingResults {
    /// Opens (creating) `{state_dir}/unacked` and `{state_dir}/parked`.
    pub fn open(state_dir: &Path) -> Result<Self, PendingError> {
        let dir = state_dir.join("unacked");
        let parked = state_dir.join("parked");
        for d in [&dir, &parked] {
            fs::create_dir_all(d).map_err(io_err("create", d))?;
        }
        Ok(PendingResults { dir, parked })
    }

    /// Keeps `result` on disk (durably) until it is acknowledged.
    pub fn save(&self, result: &TrialResult) -> Result<(), PendingError> {
        let bytes = encode(result).map_err(|source| PendingError::Encode { trial: result.trial.clone(), source })?;
        write_durably(&self.dir, &self.dir.join(file_name(&result.trial)), &bytes)
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

    /// Moves a refused result aside with the reason. A result parked
    /// before under the same name stays: this one gets the next free name
    /// (`….1.bin`, `….2.bin`, …).
    pub fn park(&self, trial: &TrialRef, reason: &str) -> Result<(), PendingError> {
        let name = file_name(trial);
        let from = self.dir.join(&name);
        let stem = name.trim_end_matches(".bin");
        let mut n = 0u32;
        let to = loop {
            let to = self.parked.join(if n == 0 { name.clone() } else { format!("{stem}.{n}.bin") });
            if move_without_replacing(&from, &to).map_err(io_err("move aside", &from))? {
                break to;
            }
            n = n.checked_add(1).ok_or_else(|| PendingError::Io {
                action: "move aside",
                path: from.clone(),
                source: io::ErrorKind::AlreadyExists.into(),
            })?;
        };
        write_durably(&self.parked, &to.with_extension("why"), format!("{trial}: {reason}\n").as_bytes())?;
        sync_dir(&self.dir)
    }

    /// Every parked result that decodes, with why it was refused.
    pub fn parked(&self) -> Vec<Parked> {
        read_results(&self.parked)
            .into_iter()
            .map(|(result, path)| {
                let why = fs::read_to_string(path.with_extension("why")).unwrap_or_default();
                let reason = why.trim().split_once(": ").map_or(why.trim(), |(_, r)| r).to_string();
                Parked { trial: result.trial, reason, path }
            })
            .collect()
    }

    /// Moves every parked result back to the results awaiting an ack (the
    /// next agent run delivers them); returns how many.
    ///
    /// A parked result whose trial already has a result awaiting its ack
    /// (parked twice, or run again) stays parked: it is never written over.
    pub fn requeue(&self) -> Result<usize, PendingError> {
        let mut moved = 0;
        for p in &self.parked() {
            let to = self.dir.join(file_name(&p.trial));
            if move_without_replacing(&p.path, &to).map_err(io_err("move back", &p.path))? {
                let _ = fs::remove_file(p.path.with_extension("why"));
                moved += 1;
            }
        }
        sync_dir(&self.dir)?;
        sync_dir(&self.parked)?;
        Ok(moved)
    }

    /// Every stored result that decodes.
    pub fn load(&self) -> Vec<TrialResult> {
        read_results(&self.dir).into_iter().map(|(r, _)| r).collect()
    }
}

/// The results in `dir` that decode, by trial, with their paths.
fn read_results(dir: &Path) -> Vec<(TrialResult, PathBuf)> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut out = Vec::new();
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().and_then(|e| e.to_str()) != Some("bin") {
            continue;
        }
        match fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| decode::<TrialResult>(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => out.push((r, path)),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable stored result"),
        }
    }
    out.sort_by(|a, b| a.0.trial.cmp(&b.0.trial));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{
        AppliedLimits, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, MemoryLimit,
    };

    fn result(study: &str, trial: u64) -> TrialResult {
        TrialResult {
            trial: TrialRef { study: study.into(), study_id: 7, trial, attempt: 1 },
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

    #[test]
    fn refused_results_are_parked_listed_and_requeued() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = PendingResults::open(dir.path()).expect("open");
        let (a, b) = (result("other", 1), result("mine", 2));
        store.save(&a).expect("save");
        store.save(&b).expect("save");
        store.park(&a.trial, "this coordinator does not run that study").expect("park");
        assert_eq!(store.load(), vec![b.clone()], "parked results are not sent again");
        let parked = store.parked();
        assert_eq!(parked.len(), 1);
        assert_eq!(parked[0].trial, a.trial);
        assert_eq!(parked[0].reason, "this coordinator does not run that study");
        assert_eq!(store.requeue().expect("requeue"), 1);
        assert!(store.parked().is_empty());
        assert_eq!(store.load(), vec![b, a]);
    }

    #[test]
    fn regression_parking_never_overwrites_a_parked_result() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = PendingResults::open(dir.path()).expect("open");
        let first = result("exp", 3);
        let mut second = result("exp", 3);
        second.measurement.wall_us = 99;
        store.save(&first).expect("save");
        store.park(&first.trial, "first refusal").expect("park");
        // The same trial reference, refused again (another store's study of that name).
        store.save(&second).expect("save");
        store.park(&second.trial, "second refusal").expect("park");
        let parked = store.parked();
        assert_eq!(parked.len(), 2, "both kept: {parked:?}");
        let mut reasons: Vec<&str> = parked.iter().map(|p| p.reason.as_str()).collect();
        reasons.sort_unstable();
        assert_eq!(reasons, ["first refusal", "second refusal"]);
        let walls: Vec<u64> = parked
            .iter()
            .map(|p| decode::<TrialResult>(&fs::read(&p.path).expect("read")).expect("decode").measurement.wall_us)
            .collect();
        assert!(walls.contains(&7) && walls.contains(&99), "{walls:?}");
        assert!(store.load().is_empty());
        // Requeued: one goes back; the other would overwrite it and stays parked.
        assert_eq!(store.requeue().expect("requeue"), 1);
        assert_eq!(store.load().len(), 1);
        assert_eq!(store.parked().len(), 1, "never written over");
    }
}
