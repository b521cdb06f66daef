//! Results waiting for the coordinator's acknowledgement, kept on disk in
//! the state directory so a restarted agent publishes them again.
//!
//! Layout: `{state_dir}/spool.log`, an append-only log (`log`): one
//! record per result (the wire codec's bytes, version byte included) in a
//! frame with its length and a CRC-32, and a small settled record when the
//! coordinator acknowledges it. Results kept together are appended together
//! and made durable with one `fdatasync` (group commit): a result is on
//! disk (power cut included) before it is sent. The log is rewritten
//! (temporary file, fsync, rename, fsync of the directory) with what is
//! still unacknowledged when everything in it is settled and it passed
//! 64 KiB, when it passed 4 MiB and half of it is settled, and when the
//! agent starts: nothing acknowledged is kept beyond that. A crash during
//! an append leaves a torn last record: its checksum finds it, and it is
//! logged and dropped (that result was never sent; the coordinator gives
//! its trial to an agent again). The agent holds `{state_dir}/spool.lock`
//! while it runs: one agent per state directory.
//!
//! A result the coordinator refuses (a study it does not run, a value it
//! cannot store) moves to `{state_dir}/parked/`, with a `.why` file beside
//! it: never re-sent on its own, never deleted, never written over.
//! `tunefleet-agent spool` lists both ([`SpoolView`], which reads without
//! changing anything, so it can run beside the agent), and
//! `tunefleet-agent spool requeue` moves parked results to
//! `{state_dir}/unacked/`, which the agent reads when it starts: each file
//! there (one encoded result, the layout of earlier versions, so an
//! upgraded agent delivers what an older one left) goes into the log, then
//! is removed.

mod error;
mod log;

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tunefleet_common::message::{TrialRef, TrialResult};
use tunefleet_common::{decode_stored_result, encode};

pub use error::PendingError;
use error::{io_err, sync_dir};

/// The agent's spool of unacknowledged results (it owns the state
/// directory's log while this lives).
#[derive(Debug)]
pub struct PendingResults {
    log: log::Log,
    /// `unacked/`: results of the earlier layout, or requeued.
    inbox: PathBuf,
    parked: PathBuf,
    /// Held for the lock on `spool.lock`.
    _lock: fs::File,
}

/// A result kept aside, as `tunefleet-agent spool` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Parked {
    pub trial: TrialRef,
    pub reason: String,
    pub path: PathBuf,
}

const LOG: &str = "spool.log";
const LOCK: &str = "spool.lock";
const INBOX: &str = "unacked";
const PARKED: &str = "parked";

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

/// The file name of a trial's result (parked, or in `unacked/`); its key in the log.
pub fn file_name(trial: &TrialRef) -> String {
    let study: String =
        trial.study.chars().take(40).map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    // The study id too: two studies of one name (two stores) never share a file.
    let hash = fnv1a(format!("{}\0{}\0{}\0{}", trial.study, trial.study_id, trial.trial, trial.attempt).as_bytes());
    format!("{study}-{}-{}-{hash:016x}.bin", trial.trial, trial.attempt)
}

fn encoded(result: &TrialResult) -> Result<Vec<u8>, PendingError> {
    encode(result).map_err(|source| PendingError::Encode { trial: result.trial.clone(), source })
}

impl PendingResults {
    /// Opens the spool of `state_dir` for this agent: takes its lock,
    /// replays the log (dropping a torn tail), and moves the results found
    /// in `unacked/` into it.
    pub fn open(state_dir: &Path) -> Result<Self, PendingError> {
        let inbox = state_dir.join(INBOX);
        let parked = state_dir.join(PARKED);
        fs::create_dir_all(&parked).map_err(io_err("create", &parked))?;
        // Its key, results and pins are this agent's alone, whatever the umask.
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(state_dir, fs::Permissions::from_mode(0o700)).map_err(io_err("restrict", state_dir))?;
        }
        let lock_path = state_dir.join(LOCK);
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err("open", &lock_path))?;
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Err(PendingError::Locked(state_dir.to_path_buf())),
            Err(e) => return Err(PendingError::Io { action: "lock", path: lock_path, source: e.into() }),
        }
        let log = log::Log::open(state_dir, &state_dir.join(LOG))?;
        let mut pending = PendingResults { log, inbox, parked, _lock: lock };
        pending.take_inbox()?;
        Ok(pending)
    }

    /// Moves the results in `unacked/` into the log (one append), then
    /// removes their files. One whose trial already has a result in the log
    /// is parked instead: never written over. Files that do not decode stay.
    fn take_inbox(&mut self) -> Result<(), PendingError> {
        let found = read_results(&self.inbox);
        if found.is_empty() {
            return Ok(());
        }
        let mut batch = Vec::new();
        for (result, path) in &found {
            let key = file_name(&result.trial);
            if self.log.live().contains_key(&key) {
                let why = "a result of that trial was already waiting for its acknowledgement";
                tracing::warn!(trial = %result.trial, path = %path.display(), "{why}: parked");
                self.park_bytes(&result.trial, &fs::read(path).map_err(io_err("read", path))?, why)?;
            } else {
                batch.push((key, encoded(result)?));
            }
        }
        let n = batch.len();
        self.log.append(batch)?;
        for (_, path) in &found {
            match fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err("remove", path)(e)),
                _ => {}
            }
        }
        sync_dir(&self.inbox)?;
        tracing::info!(results = n, from = %self.inbox.display(), "results moved into the spool log");
        Ok(())
    }

    /// Keeps `result` on disk (durably) until it is acknowledged.
    pub fn save(&mut self, result: &TrialResult) -> Result<(), PendingError> {
        self.save_all(&[result])
    }

    /// Keeps `results` on disk with one append and one `fdatasync` (group
    /// commit); none of them counts as kept if it fails.
    pub fn save_all(&mut self, results: &[&TrialResult]) -> Result<(), PendingError> {
        let batch =
            results.iter().map(|r| Ok((file_name(&r.trial), encoded(r)?))).collect::<Result<Vec<_>, PendingError>>()?;
        self.log.append(batch)
    }

    /// Whether the state directory can take a result now: a probe file of
    /// one log chunk written, synced and removed.
    pub fn probe_space(&mut self) -> Result<(), PendingError> {
        let dir = self.inbox.parent().unwrap_or(&self.inbox);
        let path = dir.join("space.probe");
        let written = (|| {
            let mut f = fs::File::create(&path)?;
            std::io::Write::write_all(&mut f, &vec![0u8; usize::try_from(log::CHUNK).unwrap_or(65_536)])?;
            f.sync_data()
        })();
        let _ = fs::remove_file(&path);
        written.map_err(|source| PendingError::Io { action: "probing", path, source })
    }

    /// Forgets an acknowledged result (forgetting one not held is fine).
    pub fn remove(&mut self, trial: &TrialRef) -> Result<(), PendingError> {
        self.log.settle(&file_name(trial), false)
    }

    /// Moves a refused result aside with the reason. A result parked
    /// before under the same name stays: this one gets the next free name
    /// (`….1.bin`, `….2.bin`, …). A result not held is a no-op.
    pub fn park(&mut self, trial: &TrialRef, reason: &str) -> Result<(), PendingError> {
        let key = file_name(trial);
        let Some(bytes) = self.log.live().get(&key).cloned() else {
            tracing::debug!(%trial, "no result of that trial to park");
            return Ok(());
        };
        self.park_bytes(trial, &bytes, reason)?;
        self.log.settle(&key, true)
    }

    /// Writes a result's bytes under `parked/` with its reason, under the
    /// first free name.
    fn park_bytes(&self, trial: &TrialRef, bytes: &[u8], reason: &str) -> Result<(), PendingError> {
        let name = file_name(trial);
        let stem = name.trim_end_matches(".bin");
        let tmp = self.parked.join(format!("{stem}.parking"));
        write_durably(&self.parked, &tmp, bytes)?;
        let mut n = 0u32;
        let to = loop {
            let to = self.parked.join(if n == 0 { name.clone() } else { format!("{stem}.{n}.bin") });
            if move_without_replacing(&tmp, &to).map_err(io_err("move aside", &tmp))? {
                break to;
            }
            n = n.checked_add(1).ok_or_else(|| PendingError::Io {
                action: "move aside",
                path: tmp.clone(),
                source: io::ErrorKind::AlreadyExists.into(),
            })?;
        };
        write_durably(&self.parked, &to.with_extension("why"), format!("{trial}: {reason}\n").as_bytes())
    }

    /// Every unacknowledged result that decodes, by trial.
    pub fn load(&self) -> Vec<TrialResult> {
        decode_all(self.log.live())
    }
}

/// The spool of a state directory as `tunefleet-agent spool` sees it: read
/// without a lock and without changing the log, so beside a running agent too.
#[derive(Debug, Clone)]
pub struct SpoolView {
    log: PathBuf,
    inbox: PathBuf,
    parked: PathBuf,
}

impl SpoolView {
    pub fn open(state_dir: &Path) -> Self {
        SpoolView { log: state_dir.join(LOG), inbox: state_dir.join(INBOX), parked: state_dir.join(PARKED) }
    }

    /// Every result awaiting an acknowledgement that decodes, by trial: in
    /// the log, and in `unacked/` (the agent takes those in when it starts).
    pub fn load(&self) -> Vec<TrialResult> {
        let mut live = log::read_live(&self.log);
        for (result, path) in read_results(&self.inbox) {
            if let Ok(bytes) = fs::read(&path) {
                live.entry(file_name(&result.trial)).or_insert(bytes);
            }
        }
        decode_all(&live)
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

    /// Moves every parked result to `unacked/`, which the agent takes into
    /// its log when it next starts; returns how many.
    ///
    /// A parked result whose trial already has a result awaiting its ack
    /// (parked twice, or run again) stays parked: it is never written over.
    pub fn requeue(&self) -> Result<usize, PendingError> {
        fs::create_dir_all(&self.inbox).map_err(io_err("create", &self.inbox))?;
        let waiting = log::read_live(&self.log);
        let mut moved = 0;
        for p in &self.parked() {
            let name = file_name(&p.trial);
            if waiting.contains_key(&name) {
                continue;
            }
            if move_without_replacing(&p.path, &self.inbox.join(name)).map_err(io_err("move back", &p.path))? {
                let _ = fs::remove_file(p.path.with_extension("why"));
                moved += 1;
            }
        }
        sync_dir(&self.inbox)?;
        sync_dir(&self.parked)?;
        Ok(moved)
    }
}

/// The results among `encoded` that decode, by trial; the others logged.
fn decode_all(encoded: &BTreeMap<String, Vec<u8>>) -> Vec<TrialResult> {
    let mut out: Vec<TrialResult> = encoded
        .iter()
        .filter_map(|(key, bytes)| {
            decode_stored_result(bytes)
                .inspect_err(|e| tracing::warn!(%key, error = %e, "skipping an unreadable stored result"))
                .ok()
        })
        .collect();
    out.sort_by(|a, b| a.trial.cmp(&b.trial));
    out
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
            .and_then(|b| decode_stored_result(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => out.push((r, path)),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable stored result"),
        }
    }
    out.sort_by(|a, b| a.0.trial.cmp(&b.0.trial));
    out
}

#[cfg(test)]
mod tests;
