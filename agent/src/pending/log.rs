//! The spool's append-only log (`{state_dir}/spool.log`): its frame
//! format, the replay that rebuilds the unacknowledged results from it, and
//! the file itself (appends with one `fdatasync` per group of records,
//! compaction through a temporary file).
//!
//! The file is made [`CHUNK`] bytes at a time, written with zeros ahead of
//! the records, so that an append changes neither the file's size nor its
//! blocks: its `fdatasync` then writes the record's page alone, not the
//! inode as well (a second synchronous write: about a third less time a
//! sync, and a fifth less CPU, measured on ext4). Zeros after the last
//! record are the log's clean end.
//!
//! The file starts with [`MAGIC`]. Each record is a frame: the length of
//! its payload (u32, little-endian), a CRC-32 of the payload (u32), then the
//! payload: a kind byte and a body. A result record's body is its key (the
//! result's [`super::file_name`], after its u16 length) and the encoded
//! `TrialResult`; a settled record's body is a key alone, and ends the
//! result of that key (acknowledged, or parked). A later result of a key
//! replaces the earlier one.
//!
//! A crash mid-append leaves a short or garbled last frame: the replay stops
//! at the first frame that is short, impossible or fails its checksum, and
//! says what it dropped; the owner logs it and rewrites the log without it.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::error::{io_err, sync_dir, PendingError};

/// The first bytes of a spool log (format version 1).
pub(super) const MAGIC: &[u8; 8] = b"TFSPOOL1";
const RESULT: u8 = 1;
const SETTLED: u8 = 2;
/// Length and checksum.
const FRAME_HEADER: usize = 8;
/// Larger payloads are damage, not records: a result is at most a message.
const MAX_PAYLOAD: usize = tunefleet_common::MAX_MESSAGE_BYTES + 4096;

/// When everything in the log is settled and it is at least this long, it
/// is rewritten empty (a few hundred results between rewrites).
pub(super) const COMPACT_SETTLED: u64 = 64 * 1024;
/// A log at least this long, at least half of it settled, is rewritten.
pub(super) const COMPACT_ABOVE: u64 = 4 * 1024 * 1024;
/// The file grows by this much at a time, zeros written ahead of the records
/// (as much as an everything-settled log holds before its rewrite).
pub(super) const CHUNK: u64 = COMPACT_SETTLED;

/// Appends one frame of `kind` whose body is `parts`, in order.
fn push_frame(out: &mut Vec<u8>, kind: u8, parts: &[&[u8]]) -> Result<(), usize> {
    let len = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
    let len32 = u32::try_from(len).ok().filter(|_| len <= MAX_PAYLOAD).ok_or(len)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    for p in parts {
        crc.update(p);
    }
    out.extend_from_slice(&len32.to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.push(kind);
    for p in parts {
        out.extend_from_slice(p);
    }
    Ok(())
}

/// Appends the frame of a result (`encoded`, the wire codec's bytes) under `key`.
/// Fails, with the payload's size, for a result too large to be a record.
pub(super) fn push_result(out: &mut Vec<u8>, key: &str, encoded: &[u8]) -> Result<(), usize> {
    let key_len = u16::try_from(key.len()).map_err(|_| key.len())?;
    push_frame(out, RESULT, &[&key_len.to_le_bytes(), key.as_bytes(), encoded])
}

/// Appends the frame that settles the result of `key`.
pub(super) fn push_settled(out: &mut Vec<u8>, key: &str) {
    // A key is a short file name (`super::file_name`): always fits.
    let _ = push_frame(out, SETTLED, &[key.as_bytes()]);
}

/// The size of a result's frame.
fn result_frame_len(key: &str, encoded: &[u8]) -> u64 {
    (FRAME_HEADER + 1 + 2 + key.len() + encoded.len()) as u64
}

/// What a log holds.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Replay {
    /// The unacknowledged results, by key: their encoded bytes.
    pub live: BTreeMap<String, Vec<u8>>,
    /// Records that no longer count: settled or replaced results and the
    /// marks that settled them.
    pub dead: usize,
    /// How many bytes of the log were read as records (header included).
    pub valid_len: usize,
    /// What was dropped at the end, if anything.
    pub dropped: Option<Dropped>,
}

/// Bytes at the end of a log that are not a whole record.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Dropped {
    /// Their offset in the file.
    pub at: usize,
    pub bytes: usize,
    pub why: &'static str,
}

/// Replays a log's bytes. An empty file is an empty log; a file that does
/// not start with [`MAGIC`] is dropped whole (`at` 0).
pub(super) fn replay(bytes: &[u8]) -> Replay {
    let mut out = Replay::default();
    if bytes.is_empty() {
        return out;
    }
    let Some(mut rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
        out.dropped = Some(Dropped { at: 0, bytes: bytes.len(), why: "not a spool log (unknown header)" });
        return out;
    };
    let stop = |rest: &[u8], why| Some(Dropped { at: bytes.len() - rest.len(), bytes: rest.len(), why });
    while !rest.is_empty() {
        let Some((header, after)) = rest.split_first_chunk::<FRAME_HEADER>() else {
            if rest.iter().all(|&b| b == 0) {
                // Zeros made ahead of the records, fewer than a header: the clean end.
                break;
            }
            out.dropped = stop(rest, "a short record header (torn write)");
            break;
        };
        let [l0, l1, l2, l3, c0, c1, c2, c3] = *header;
        let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
        let crc = u32::from_le_bytes([c0, c1, c2, c3]);
        if len == 0 && rest.iter().all(|&b| b == 0) {
            // Zeros made ahead of the records: the clean end.
            break;
        }
        if len == 0 || len > MAX_PAYLOAD {
            out.dropped = stop(rest, "an impossible record length");
            break;
        }
        let Some((payload, next)) = after.split_at_checked(len) else {
            out.dropped = stop(rest, "a short record (torn write)");
            break;
        };
        if crc32fast::hash(payload) != crc {
            out.dropped = stop(rest, "a record whose checksum does not match (torn write)");
            break;
        }
        let applied = match payload.split_first() {
            Some((&RESULT, body)) => parse_result(body).map(|(key, encoded)| {
                if out.live.insert(key.to_string(), encoded.to_vec()).is_some() {
                    out.dead += 1;
                }
            }),
            Some((&SETTLED, key)) => std::str::from_utf8(key).ok().map(|key| {
                out.dead += if out.live.remove(key).is_some() { 2 } else { 1 };
            }),
            _ => None,
        };
        if applied.is_none() {
            out.dropped = stop(rest, "a record this agent cannot read");
            break;
        }
        rest = next;
    }
    out.valid_len = bytes.len() - out.dropped.as_ref().map_or(rest.len(), |d| d.bytes);
    out
}

/// A result record's key and encoded result.
fn parse_result(body: &[u8]) -> Option<(&str, &[u8])> {
    let (len, body) = body.split_first_chunk::<2>()?;
    let (key, encoded) = body.split_at_checked(usize::from(u16::from_le_bytes(*len)))?;
    Some((std::str::from_utf8(key).ok()?, encoded))
}

/// The log file, open for appending, with the results it holds unsettled.
#[derive(Debug)]
pub(super) struct Log {
    path: PathBuf,
    dir: PathBuf,
    file: File,
    /// Where the records end (where the next one goes).
    len: u64,
    /// The file's length: zeros from `len` to here.
    capacity: u64,
    live: BTreeMap<String, Vec<u8>>,
    /// The bytes of the live results' frames (what a rewrite keeps).
    live_len: u64,
    /// An append failed and could not be undone: the file may end in a
    /// partial record, so it is rewritten before the next append.
    rewrite: bool,
    /// How many `fdatasync`s appends made (group commit makes one per group).
    syncs: u64,
}

impl Log {
    /// Opens (creating) the log at `path` in `dir`, replaying it; a torn
    /// tail is logged and dropped. A file that is not a spool log is moved
    /// aside (`….unreadable`, never over another) and a new log started.
    pub(super) fn open(dir: &Path, path: &Path) -> Result<Log, PendingError> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(PendingError::Io { action: "read", path: path.to_path_buf(), source: e }),
        };
        let replay = replay(&bytes);
        let mut rewrite = bytes.is_empty() || replay.dead > 0;
        if let Some(d) = &replay.dropped {
            rewrite = true;
            if d.at == 0 {
                let aside = aside_name(path);
                tracing::error!(
                    path = %path.display(), aside = %aside.display(), bytes = d.bytes, why = d.why,
                    "the spool log is unreadable: moved aside, starting a new one"
                );
                fs::rename(path, &aside).map_err(io_err("move aside", path))?;
            } else {
                tracing::warn!(
                    path = %path.display(), at = d.at, bytes = d.bytes, why = d.why,
                    "dropping the torn end of the spool log (a crash during a write; that result was never sent)"
                );
            }
        }
        let live_len = replay.live.iter().map(|(k, v)| result_frame_len(k, v)).sum();
        let file = open_write(path)?;
        let mut log = Log {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            file,
            len: replay.valid_len as u64,
            capacity: bytes.len() as u64,
            live: replay.live,
            live_len,
            rewrite,
            syncs: 0,
        };
        if log.rewrite {
            log.compact()?;
        }
        Ok(log)
    }

    /// The unsettled results, by key.
    pub(super) fn live(&self) -> &BTreeMap<String, Vec<u8>> {
        &self.live
    }

    /// Appends the results (key, encoded bytes) and makes them durable with
    /// one `fdatasync`, whatever their number. On failure nothing of them
    /// counts, and the file is cut back to where it was.
    pub(super) fn append(&mut self, results: Vec<(String, Vec<u8>)>) -> Result<(), PendingError> {
        if results.is_empty() {
            return Ok(());
        }
        if self.rewrite {
            self.compact()?;
        }
        let mut buf = Vec::new();
        for (key, encoded) in &results {
            push_result(&mut buf, key, encoded).map_err(|size| PendingError::Io {
                action: "append to",
                path: self.path.clone(),
                source: io::Error::new(io::ErrorKind::InvalidInput, format!("a record of {size} bytes")),
            })?;
        }
        self.write(&buf, true)?;
        for (key, encoded) in results {
            self.live_len += result_frame_len(&key, &encoded);
            if let Some(old) = self.live.insert(key.clone(), encoded) {
                self.live_len -= result_frame_len(&key, &old);
            }
        }
        Ok(())
    }

    /// Settles the result of `key` (acknowledged or parked): a small record,
    /// made durable now when `sync`, else by the next append's sync (a
    /// settled mark lost to a crash only means the result is sent again, and
    /// the coordinator answers it as a duplicate). A key not held is a no-op.
    /// The log is compacted when the policy says so.
    pub(super) fn settle(&mut self, key: &str, sync: bool) -> Result<(), PendingError> {
        let Some(encoded) = self.live.get(key) else { return Ok(()) };
        let frame_len = result_frame_len(key, encoded);
        if self.rewrite {
            self.live.remove(key);
            self.live_len -= frame_len;
            return self.compact();
        }
        let mut buf = Vec::new();
        push_settled(&mut buf, key);
        self.write(&buf, sync)?;
        self.live.remove(key);
        self.live_len -= frame_len;
        if should_compact(self.len, self.live.len(), self.live_len) {
            self.compact()?;
        }
        Ok(())
    }

    fn write(&mut self, buf: &[u8], sync: bool) -> Result<(), PendingError> {
        let end = self.len + buf.len() as u64;
        let done = self.grow_to(end).and_then(|()| self.file.write_all_at(buf, self.len)).and_then(|()| {
            if sync {
                self.file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(source) = done {
            // Cut back, so the next record never follows a partial one.
            match self.file.set_len(self.len) {
                Ok(()) => self.capacity = self.len,
                Err(_) => self.rewrite = true,
            }
            return Err(PendingError::Io { action: "append to", path: self.path.clone(), source });
        }
        self.len += buf.len() as u64;
        self.syncs += u64::from(sync);
        Ok(())
    }

    /// Makes the file at least `end` bytes long, zeros written up to the
    /// next [`CHUNK`] (made durable by the sync of the record that needed it).
    fn grow_to(&mut self, end: u64) -> io::Result<()> {
        if end <= self.capacity {
            return Ok(());
        }
        let capacity = whole_chunks(end);
        let zeros = vec![0u8; usize::try_from(capacity - self.capacity).unwrap_or(usize::MAX)];
        self.file.write_all_at(&zeros, self.capacity)?;
        self.capacity = capacity;
        Ok(())
    }

    /// Rewrites the log with the live results alone, zeros after them to a
    /// whole [`CHUNK`]: a temporary file, fsynced, renamed over the log, and
    /// the directory fsynced.
    pub(super) fn compact(&mut self) -> Result<(), PendingError> {
        // Until the new file is open for appends, the next write rewrites
        // first: a failure after the rename would leave appends going to
        // the file it replaced.
        self.rewrite = true;
        let mut buf = MAGIC.to_vec();
        for (key, encoded) in &self.live {
            // Each was a record already: it fits.
            let _ = push_result(&mut buf, key, encoded);
        }
        let len = buf.len() as u64;
        let capacity = whole_chunks(len);
        buf.resize(usize::try_from(capacity).unwrap_or(buf.len()), 0);
        let tmp = self.path.with_extension("log.tmp");
        let mut f = File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(&buf).and_then(|()| f.sync_all()).map_err(io_err("write", &tmp))?;
        fs::rename(&tmp, &self.path).map_err(io_err("rename", &self.path))?;
        sync_dir(&self.dir)?;
        self.file = open_write(&self.path)?;
        self.len = len;
        self.capacity = buf.len() as u64;
        self.rewrite = false;
        Ok(())
    }

    /// Where the records end.
    #[cfg(test)]
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// How many appends were synced.
    #[cfg(test)]
    pub(super) fn syncs(&self) -> u64 {
        self.syncs
    }
}

/// Whether a log of `len` bytes holding `live` results (`live_len` bytes of
/// them) is worth rewriting: everything settled and past
/// [`COMPACT_SETTLED`], or past [`COMPACT_ABOVE`] and half of it settled.
pub(super) fn should_compact(len: u64, live: usize, live_len: u64) -> bool {
    (live == 0 && len >= COMPACT_SETTLED) || (len >= COMPACT_ABOVE && live_len <= len / 2)
}

/// `len` rounded up to whole [`CHUNK`]s.
fn whole_chunks(len: u64) -> u64 {
    len.div_ceil(CHUNK).saturating_mul(CHUNK)
}

/// The log opened for writes at given offsets (records go where the last
/// one ended, into the zeros made ahead).
fn open_write(path: &Path) -> Result<File, PendingError> {
    OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(io_err("open", path))
}

/// `path.unreadable`, or `path.unreadable.N` with the first free N.
fn aside_name(path: &Path) -> PathBuf {
    let base = path.with_extension("log.unreadable");
    std::iter::once(base.clone())
        .chain((1u32..).map(|n| base.with_extension(format!("unreadable.{n}"))))
        .find(|p| !p.exists())
        .unwrap_or(base)
}

/// The unsettled results of the log at `path`, read without changing it
/// (the log of a running agent: a record being written reads as a torn tail
/// and is left out).
pub(super) fn read_live(path: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read(path).map(|b| replay(&b).live).unwrap_or_default()
}
