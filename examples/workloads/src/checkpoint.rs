//! Checkpoints of the workloads: everything a run needs to go on after an
//! epoch on another machine, so a trial moved off an overloaded agent
//! continues from its last finished epoch instead of from zero.
//!
//! One file per epoch, `epoch-N.ckpt`, written to a temporary name and
//! renamed (a reader never sees half a checkpoint), starting with a magic
//! word that names the workload and the format version; all numbers are
//! little-endian. A run's seed and flags are not in it: a resumed run is
//! started with the same flags.
//!
//! - [`Checkpoint`], `tunefleet-train`: the epoch, the position of the
//!   sample-order RNG, the sample order, the parameters and the momentum;
//! - [`IoCheckpoint`], `tunefleet-io`: the epoch, the shape of an epoch
//!   (files and their size, to refuse a resume with other flags) and the
//!   running totals its final line reports.

use std::io;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"TFCKPT01";
const IO_MAGIC: &[u8; 8] = b"TFIOCK01";

/// The state of a `tunefleet-train` run after `epoch`.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub epoch: u32,
    /// `ChaCha8Rng::get_word_pos` of the run's RNG.
    pub rng_word_pos: u128,
    pub order: Vec<u32>,
    pub params: Vec<f32>,
    pub velocity: Vec<f32>,
}

/// Why a checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: not a {workload} checkpoint, or truncated", path.display())]
    Format { path: PathBuf, workload: &'static str },
}

impl Checkpoint {
    /// The bytes of the file.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + 4 * (self.order.len() + self.params.len() + self.velocity.len()));
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.rng_word_pos.to_le_bytes());
        for v in [self.order.len(), self.params.len(), self.velocity.len()] {
            out.extend_from_slice(&(v as u64).to_le_bytes());
        }
        self.order.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        self.params.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        self.velocity.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
        out
    }

    /// Parses the bytes of a file; `None` when they are not a whole checkpoint.
    pub fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let rest = bytes.strip_prefix(MAGIC)?;
        let (epoch, rest) = take::<4>(rest)?;
        let (pos, rest) = take::<16>(rest)?;
        let (n_order, rest) = take::<8>(rest)?;
        let (n_params, rest) = take::<8>(rest)?;
        let (n_velocity, mut rest) = take::<8>(rest)?;
        let len = |b: [u8; 8]| usize::try_from(u64::from_le_bytes(b)).ok();
        let (n_order, n_params, n_velocity) = (len(n_order)?, len(n_params)?, len(n_velocity)?);
        if rest.len() != 4usize.checked_mul(n_order.checked_add(n_params)?.checked_add(n_velocity)?)? {
            return None;
        }
        let mut words = |n: usize| {
            let (head, tail) = rest.split_at(4 * n);
            rest = tail;
            head.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect::<Vec<[u8; 4]>>()
        };
        let order = words(n_order).into_iter().map(u32::from_le_bytes).collect();
        let params = words(n_params).into_iter().map(f32::from_le_bytes).collect();
        let velocity = words(n_velocity).into_iter().map(f32::from_le_bytes).collect();
        Some(Checkpoint {
            epoch: u32::from_le_bytes(epoch),
            rng_word_pos: u128::from_le_bytes(pos),
            order,
            params,
            velocity,
        })
    }

    /// Writes `dir/epoch-N.ckpt` atomically; returns its path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, CheckpointError> {
        save(dir, self.epoch, &self.encode())
    }

    /// Reads a checkpoint written by [`Checkpoint::save`].
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        load(path, "tunefleet-train", Checkpoint::decode)
    }
}

/// The state of a `tunefleet-io` run after `epoch`.
#[derive(Debug, Clone, PartialEq)]
pub struct IoCheckpoint {
    pub epoch: u32,
    /// Files per epoch and their size: a resumed run must have the same.
    pub files: u64,
    pub file_kib: u64,
    /// The checksum of the epochs so far, folded in epoch order.
    pub checksum: u64,
    /// Bytes written and read back, and seconds spent, in the epochs so far.
    pub bytes: u64,
    pub seconds: f64,
    /// The best epoch throughput so far, MiB/s.
    pub best_mibs: f64,
}

impl IoCheckpoint {
    /// Everything after the epoch, as 64-bit words in file order.
    fn words(&self) -> [u64; 6] {
        [self.files, self.file_kib, self.checksum, self.bytes, self.seconds.to_bits(), self.best_mibs.to_bits()]
    }

    /// The bytes of the file.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(IO_MAGIC.len() + 4 + 6 * 8);
        out.extend_from_slice(IO_MAGIC);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        self.words().iter().for_each(|w| out.extend_from_slice(&w.to_le_bytes()));
        out
    }

    /// Parses the bytes of a file; `None` when they are not a whole checkpoint.
    pub fn decode(bytes: &[u8]) -> Option<IoCheckpoint> {
        let (epoch, rest) = take::<4>(bytes.strip_prefix(IO_MAGIC)?)?;
        let mut words = rest.chunks(8).map(|c| take::<8>(c).map(|(w, _)| u64::from_le_bytes(w)));
        let [files, file_kib, checksum, bytes, seconds, best] = [(); 6].map(|()| words.next().flatten());
        if words.next().is_some() {
            return None;
        }
        Some(IoCheckpoint {
            epoch: u32::from_le_bytes(epoch),
            files: files?,
            file_kib: file_kib?,
            checksum: checksum?,
            bytes: bytes?,
            seconds: f64::from_bits(seconds?),
            best_mibs: f64::from_bits(best?),
        })
    }

    /// Writes `dir/epoch-N.ckpt` atomically; returns its path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, CheckpointError> {
        save(dir, self.epoch, &self.encode())
    }

    /// Reads a checkpoint written by [`IoCheckpoint::save`].
    pub fn load(path: &Path) -> Result<IoCheckpoint, CheckpointError> {
        load(path, "tunefleet-io", IoCheckpoint::decode)
    }
}

/// Writes `bytes` to `dir/epoch-N.ckpt` through a temporary file and a
/// rename; returns the path.
fn save(dir: &Path, epoch: u32, bytes: &[u8]) -> Result<PathBuf, CheckpointError> {
    let path = dir.join(format!("epoch-{epoch}.ckpt"));
    let tmp = dir.join(format!(".epoch-{epoch}.ckpt.tmp"));
    let io = |source| CheckpointError::Io { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(path)
}

/// Reads `path` and decodes it as a checkpoint of `workload`.
fn load<T>(path: &Path, workload: &'static str, decode: fn(&[u8]) -> Option<T>) -> Result<T, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io { path: path.to_path_buf(), source })?;
    decode(&bytes).ok_or_else(|| CheckpointError::Format { path: path.to_path_buf(), workload })
}

fn take<const N: usize>(bytes: &[u8]) -> Option<([u8; N], &[u8])> {
    let head: [u8; N] = bytes.get(..N)?.try_into().ok()?;
    Some((head, &bytes[N..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_truncation_and_garbage() {
        let c = Checkpoint {
            epoch: 3,
            rng_word_pos: 1 << 70,
            order: vec![2, 0, 1],
            params: vec![0.5, -1.25],
            velocity: vec![0.0, 3.5],
        };
        let bytes = c.encode();
        assert_eq!(Checkpoint::decode(&bytes), Some(c.clone()));
        assert_eq!(Checkpoint::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(Checkpoint::decode(b"TFCKPT01garbage"), None);
        assert_eq!(Checkpoint::decode(b""), None);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = c.save(dir.path()).expect("saves");
        assert!(path.ends_with("epoch-3.ckpt"));
        assert_eq!(Checkpoint::load(&path).expect("loads"), c);
        std::fs::write(&path, b"nope").expect("write");
        assert!(matches!(Checkpoint::load(&path), Err(CheckpointError::Format { .. })));
    }

    #[test]
    fn io_checkpoints_round_trip_and_are_not_taken_for_train_ones() {
        let c = IoCheckpoint {
            epoch: 2,
            files: 16,
            file_kib: 256,
            checksum: 0xdead_beef_0123_4567,
            bytes: 8 << 20,
            seconds: 0.125,
            best_mibs: 99.5,
        };
        let bytes = c.encode();
        assert_eq!(IoCheckpoint::decode(&bytes), Some(c.clone()));
        assert_eq!(IoCheckpoint::decode(&bytes[..bytes.len() - 1]), None);
        assert_eq!(IoCheckpoint::decode(&[&bytes[..], b"x"].concat()), None, "trailing bytes");
        let dir = tempfile::tempdir().expect("tempdir");
        let path = c.save(dir.path()).expect("saves");
        assert!(path.ends_with("epoch-2.ckpt"));
        assert_eq!(IoCheckpoint::load(&path).expect("loads"), c);
        let e = Checkpoint::load(&path).expect_err("an io checkpoint is not a train one");
        assert!(e.to_string().contains("not a tunefleet-train checkpoint"), "{e}");
        let train = Checkpoint { epoch: 1, rng_word_pos: 0, order: vec![], params: vec![], velocity: vec![] };
        let e = IoCheckpoint::load(&train.save(dir.path()).expect("saves")).expect_err("nor the other way");
        assert!(e.to_string().contains("not a tunefleet-io checkpoint"), "{e}");
    }
}
