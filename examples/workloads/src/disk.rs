//! The kernel of `tunefleet-io`, an I/O-bound job. Each epoch writes `files`
//! files of `file_kib` KiB into a scratch directory, `block_kib` KiB per
//! `write` call, makes each one durable with `fsync`, reads it back
//! `block_kib` KiB per `read` call, checks it against what was written and
//! deletes it. Its time goes to system calls and to waiting for the device
//! to acknowledge the syncs, so it uses little CPU per wall second, unlike
//! the compute-bound [`crate::train`] and the memory-bound [`crate::transpose`].
//!
//! The files are shared among `threads` scoped workers, each taking the next
//! file nobody has taken yet; the calling thread collects the results and
//! prints the step lines. The workers are started for each epoch, so the
//! control channel ([`crate::control`]) can change their number between
//! epochs.
//!
//! A file's contents are a SplitMix64 stream seeded by the run's seed, the
//! epoch and the file's index: every epoch writes new data, and the
//! checksums depend only on the seed and the shape of an epoch, never on the
//! thread count or the order in which files finish. The [`Checksum`] is
//! FNV-1a over 64-bit words, one multiply per 8 bytes: cheap enough not to
//! make the job a compute one, and what keeps the reads from being skipped.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

use crate::checkpoint::{CheckpointError, IoCheckpoint};
pub use crate::checksum::Checksum;
use crate::control::{Settings, Steer};
use crate::report::{emit, IoEvent};

const KIB: usize = 1 << 10;
const MIB: f64 = (1u64 << 20) as f64;
/// The increment of SplitMix64's state (2^64 divided by the golden ratio).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Parameters of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct IoConfig {
    /// Files written and read back per epoch.
    pub files: usize,
    /// Size of each file, in KiB.
    pub file_kib: usize,
    /// Bytes per `write` and per `read` call, in KiB (a file's last call may
    /// move less).
    pub block_kib: usize,
    pub epochs: u32,
    /// Workers of the first epoch (the control channel may change it).
    pub threads: usize,
    /// Seed of the files' contents.
    pub seed: u64,
    /// Where the files go; it must exist. Each file is deleted once checked,
    /// also when the check or the I/O fails.
    pub scratch_dir: PathBuf,
    /// Print a step line after every file (`TUNEFLEET_STEPS=1`: the agent's
    /// probe windows count steps).
    pub report_steps: bool,
    /// Save the totals after every epoch here and name the file on the epoch line.
    pub checkpoint_dir: Option<PathBuf>,
    /// Go on from this state (the run's other flags must be those it was saved with).
    pub resume: Option<IoCheckpoint>,
    /// Corrupts the first file of the last epoch on disk between its sync
    /// and its read, to exercise the check.
    pub inject_fault: bool,
}

impl IoConfig {
    /// The defaults of `tunefleet-io`, writing in `scratch_dir`: 10 epochs of
    /// 16 files of 256 KiB, 4 KiB per call, one thread, seed 0.
    pub fn new(scratch_dir: PathBuf) -> Self {
        IoConfig {
            files: 16,
            file_kib: 256,
            block_kib: 4,
            epochs: 10,
            threads: 1,
            seed: 0,
            scratch_dir,
            report_steps: false,
            checkpoint_dir: None,
            resume: None,
            inject_fault: false,
        }
    }

    /// Bytes written plus bytes read back in one epoch.
    pub fn bytes_per_epoch(&self) -> u64 {
        2 * self.files as u64 * self.file_kib as u64 * KIB as u64
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("cannot {action} {}", path.display())]
    File {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("check failed: {} read back with checksum {found}, written with {expected}", path.display())]
    Check { path: PathBuf, expected: Checksum, found: Checksum },
    #[error("cannot start file worker thread")]
    Spawn(#[source] io::Error),
    #[error("a file worker thread stopped unexpectedly")]
    WorkerLost,
    #[error("cannot write the epoch report")]
    Write(#[source] io::Error),
    #[error("checkpoint")]
    Checkpoint(#[from] CheckpointError),
    #[error("cannot resume: the checkpoint was saved with {files} files of {file_kib} KiB (give the same --files and --file-kib)")]
    Resume { files: u64, file_kib: u64 },
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `buf` with the contents of file `index` of `epoch` in a run seeded
/// by `seed`.
pub fn fill(buf: &mut [u8], seed: u64, epoch: u32, index: usize) {
    let mut state = mix(mix(seed ^ mix(u64::from(epoch))) ^ index as u64);
    for chunk in buf.chunks_mut(8) {
        state = state.wrapping_add(GOLDEN_GAMMA);
        chunk.copy_from_slice(&mix(state).to_le_bytes()[..chunk.len()]);
    }
}

/// Where file `index` goes: named after the process too, so runs sharing a
/// scratch directory do not meet.
fn file_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("tunefleet-io-{}-{index}.dat", std::process::id()))
}

/// A file worker of one epoch, with a buffer for what it writes and one for
/// what it reads back.
struct Worker<'a> {
    config: &'a IoConfig,
    epoch: u32,
    written: Vec<u8>,
    read: Vec<u8>,
}

impl<'a> Worker<'a> {
    fn new(config: &'a IoConfig, epoch: u32) -> Self {
        let bytes = config.file_kib * KIB;
        Worker { config, epoch, written: vec![0; bytes], read: vec![0; bytes] }
    }

    /// Writes, syncs, reads back, checks and deletes file `index`; returns
    /// its checksum.
    fn file(&mut self, index: usize) -> Result<Checksum, IoError> {
        let path = file_path(&self.config.scratch_dir, index);
        fill(&mut self.written, self.config.seed, self.epoch, index);
        let expected = Checksum::of(&self.written);
        let done = self.write_and_read_back(&path, index);
        // Deleted whatever happened, so that a failed run leaves nothing behind.
        let removed = fs::remove_file(&path);
        done?;
        removed.map_err(|source| IoError::File { action: "delete", path: path.clone(), source })?;
        let found = Checksum::of(&self.read);
        if found != expected {
            return Err(IoError::Check { path, expected, found });
        }
        Ok(found)
    }

    fn write_and_read_back(&mut self, path: &Path, index: usize) -> Result<(), IoError> {
        let block = self.config.block_kib.max(1) * KIB;
        let fail = |action| move |source| IoError::File { action, path: path.to_path_buf(), source };
        let mut file = File::create(path).map_err(fail("create"))?;
        for chunk in self.written.chunks(block) {
            file.write_all(chunk).map_err(fail("write"))?;
        }
        file.sync_all().map_err(fail("sync"))?;
        drop(file);
        if self.config.inject_fault && self.epoch == self.config.epochs && index == 0 {
            if let Some(&first) = self.written.first() {
                let mut file = OpenOptions::new().write(true).open(path).map_err(fail("open"))?;
                file.write_all(&[!first]).map_err(fail("write"))?;
            }
        }
        let mut file = File::open(path).map_err(fail("open"))?;
        for chunk in self.read.chunks_mut(block) {
            file.read_exact(chunk).map_err(fail("read"))?;
        }
        Ok(())
    }
}

/// Runs the files of `epoch` on `threads` workers (fewer when there are
/// fewer files), counting a step per file checked; returns the epoch's
/// checksum, its files' checksums folded in file order, and the number of
/// workers. The first failure stops every worker after its current file.
fn run_epoch(
    config: &IoConfig,
    epoch: u32,
    threads: usize,
    out: &mut impl Write,
    step: &mut u64,
) -> Result<(Checksum, usize), IoError> {
    let workers = threads.clamp(1, config.files.max(1));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let mut sums = vec![None; config.files];
    let mut first_error = None;
    thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        for _ in 0..workers {
            let (tx, next, failed) = (tx.clone(), &next, &failed);
            let mut worker = Worker::new(config, epoch);
            let spawned = thread::Builder::new().name("io".into()).spawn_scoped(scope, move || {
                while !failed.load(Ordering::Relaxed) {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= config.files || tx.send((index, worker.file(index))).is_err() {
                        break;
                    }
                }
            });
            if let Err(e) = spawned {
                failed.store(true, Ordering::Relaxed);
                first_error = Some(IoError::Spawn(e));
                break;
            }
        }
        // The workers hold the other senders: the loop ends when the last one ends.
        drop(tx);
        for (index, result) in rx {
            let done = result.and_then(|sum| {
                sums[index] = Some(sum);
                *step += 1;
                if config.report_steps {
                    emit(out, &IoEvent::Step { step: *step }).map_err(IoError::Write)?;
                }
                Ok(())
            });
            if let Err(e) = done {
                failed.store(true, Ordering::Relaxed);
                first_error.get_or_insert(e);
            }
        }
    });
    if let Some(e) = first_error {
        return Err(e);
    }
    let sums = sums.into_iter().collect::<Option<Vec<_>>>().ok_or(IoError::WorkerLost)?;
    Ok((Checksum::fold(sums), workers))
}

/// Runs `config.epochs` epochs, printing one JSON line per epoch and a final
/// line to `out`; returns the checksum of the run, the epochs' checksums
/// folded in order. After each epoch line but the last, `steer` says what
/// the next epoch runs with.
pub fn run(config: &IoConfig, out: &mut impl Write, steer: &mut dyn Steer) -> Result<Checksum, IoError> {
    let (files, file_kib) = (config.files as u64, config.file_kib as u64);
    let mut totals =
        IoCheckpoint { epoch: 0, files, file_kib, checksum: Checksum::EMPTY.0, bytes: 0, seconds: 0.0, best_mibs: 0.0 };
    if let Some(saved) = &config.resume {
        if (saved.files, saved.file_kib) != (files, file_kib) {
            return Err(IoError::Resume { files: saved.files, file_kib: saved.file_kib });
        }
        totals = saved.clone();
    }
    let bytes = config.bytes_per_epoch();
    let mut settings = Settings { threads: config.threads };
    let mut step = 0;
    for epoch in totals.epoch + 1..=config.epochs {
        let start = Instant::now();
        let (checksum, threads) = run_epoch(config, epoch, settings.threads, out, &mut step)?;
        let seconds = start.elapsed().as_secs_f64();
        let throughput_mibs = bytes as f64 / seconds.max(1e-9) / MIB;
        totals = IoCheckpoint {
            epoch,
            checksum: Checksum(totals.checksum).with(checksum.0).0,
            bytes: totals.bytes + bytes,
            seconds: totals.seconds + seconds,
            best_mibs: totals.best_mibs.max(throughput_mibs),
            ..totals
        };
        let checkpoint = match &config.checkpoint_dir {
            Some(dir) => Some(totals.save(dir)?.display().to_string()),
            None => None,
        };
        let line = IoEvent::Epoch { epoch, throughput_mibs, checksum, seconds, threads, checkpoint };
        emit(out, &line).map_err(IoError::Write)?;
        if epoch < config.epochs {
            settings = settings.apply(&steer.between_epochs());
        }
    }
    let checksum = Checksum(totals.checksum);
    let last = IoEvent::Final {
        throughput_mibs: totals.bytes as f64 / totals.seconds.max(1e-9) / MIB,
        best_throughput_mibs: totals.best_mibs,
        checksum,
        seconds: totals.seconds,
    };
    emit(out, &last).map_err(IoError::Write)?;
    Ok(checksum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{Unsteered, Update};
    use crate::report::epoch_threads;

    /// A short run in `dir`: 3 epochs of 5 files of 8 KiB, 1 KiB per call.
    fn config(dir: &Path) -> IoConfig {
        IoConfig { files: 5, file_kib: 8, block_kib: 1, epochs: 3, ..IoConfig::new(dir.to_path_buf()) }
    }

    fn lines(out: &[u8]) -> Vec<serde_json::Value> {
        let text = String::from_utf8_lossy(out);
        text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    }

    fn is_empty(dir: &Path) -> bool {
        fs::read_dir(dir).expect("scratch dir").next().is_none()
    }

    #[test]
    fn checksums_are_fnv_1a_over_words_then_bytes() {
        assert_eq!(Checksum::of(b""), Checksum::EMPTY);
        assert_eq!(Checksum::of(b"a"), Checksum::EMPTY.with(u64::from(b'a')));
        assert_eq!(Checksum::of(&7u64.to_le_bytes()), Checksum::EMPTY.with(7));
        // Words are ordered: swapping two changes the sum.
        let (ab, ba) =
            ([1u64.to_le_bytes(), 2u64.to_le_bytes()].concat(), [2u64.to_le_bytes(), 1u64.to_le_bytes()].concat());
        assert_ne!(Checksum::of(&ab), Checksum::of(&ba));
        assert_eq!(Checksum::fold([Checksum(1), Checksum(2)]), Checksum::of(&ab));
        assert_eq!(Checksum(0xab).to_string(), "00000000000000ab");
    }

    #[test]
    fn contents_depend_on_seed_epoch_and_file_and_on_nothing_else() {
        let contents = |seed, epoch, index| {
            let mut buf = vec![0; 1000];
            fill(&mut buf, seed, epoch, index);
            buf
        };
        let base = contents(1, 1, 0);
        assert_eq!(base, contents(1, 1, 0));
        for other in [contents(2, 1, 0), contents(1, 2, 0), contents(1, 1, 1)] {
            assert_ne!(base, other);
        }
        // A shorter file is a prefix of a longer one (the last word cut).
        let mut short = vec![0; 13];
        fill(&mut short, 1, 1, 0);
        assert_eq!(short, base[..13]);
    }

    #[test]
    fn runs_each_epoch_and_leaves_the_scratch_dir_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut out = Vec::new();
        let checksum = run(&config(dir.path()), &mut out, &mut Unsteered).expect("runs");
        let lines = lines(&out);
        assert_eq!(lines.len(), 4, "3 epochs and a final line");
        let epochs: Vec<_> = lines[..3].iter().map(|l| (l["event"].as_str(), l["epoch"].as_u64())).collect();
        assert_eq!(epochs, [(Some("epoch"), Some(1)), (Some("epoch"), Some(2)), (Some("epoch"), Some(3))]);
        assert!(lines[..3].iter().all(|l| l["throughput_mibs"].as_f64().is_some_and(|t| t > 0.0)));
        // The run's checksum folds the epochs', each of which folds its files'.
        let epoch_sum = |epoch| {
            Checksum::fold((0..5).map(|index| {
                let mut buf = vec![0; 8 * KIB];
                fill(&mut buf, 0, epoch, index);
                Checksum::of(&buf)
            }))
        };
        assert_eq!(lines[0]["checksum"], epoch_sum(1).to_string());
        assert_eq!(checksum, Checksum::fold([epoch_sum(1), epoch_sum(2), epoch_sum(3)]));
        assert_eq!(lines[3]["event"], "final");
        assert_eq!(lines[3]["checksum"], checksum.to_string());
        assert!(is_empty(dir.path()));
    }

    #[test]
    fn the_checksum_depends_on_the_seed_and_not_on_the_threads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let go = |seed, threads| {
            let config = IoConfig { seed, threads, ..config(dir.path()) };
            run(&config, &mut Vec::new(), &mut Unsteered).expect("runs")
        };
        let one = go(7, 1);
        assert_eq!(go(7, 3), one);
        assert_eq!(go(7, 64), one, "more threads than files");
        assert_ne!(go(8, 1), one);
    }

    #[test]
    fn each_epoch_runs_with_the_threads_the_steer_gave_after_the_previous_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut asked = vec![Some(3), None, Some(9)].into_iter();
        let mut calls = 0;
        let mut steer = || {
            calls += 1;
            Update { threads: asked.next().flatten() }
        };
        let mut out = Vec::new();
        run(&IoConfig { epochs: 4, ..config(dir.path()) }, &mut out, &mut steer).expect("runs");
        assert_eq!(calls, 3, "asked after every epoch but the last");
        assert_eq!(epoch_threads(&out), [1, 3, 3, 5], "no more workers than files");
    }

    #[test]
    fn step_lines_count_every_file_when_asked_and_never_otherwise() {
        let dir = tempfile::tempdir().expect("tempdir");
        let events = |report_steps| {
            let mut out = Vec::new();
            let config = IoConfig { threads: 2, report_steps, ..config(dir.path()) };
            run(&config, &mut out, &mut Unsteered).expect("runs");
            lines(&out)
        };
        let with = events(true);
        let steps: Vec<u64> = with.iter().filter(|l| l["event"] == "step").filter_map(|l| l["step"].as_u64()).collect();
        assert_eq!(steps, (1..=15).collect::<Vec<_>>(), "one per file, numbered over the run");
        let epoch_at = with.iter().position(|l| l["event"] == "epoch").expect("an epoch line");
        assert_eq!(epoch_at, 5, "the first epoch line follows its files' steps");
        assert!(events(false).iter().all(|l| l["event"] != "step"));
    }

    #[test]
    fn a_run_resumed_from_a_checkpoint_ends_where_the_whole_run_ends() {
        let dir = tempfile::tempdir().expect("tempdir");
        let saved = tempfile::tempdir().expect("tempdir");
        let whole = run(&IoConfig { epochs: 4, ..config(dir.path()) }, &mut Vec::new(), &mut Unsteered).expect("runs");
        let mut out = Vec::new();
        let saving = IoConfig { epochs: 2, checkpoint_dir: Some(saved.path().to_path_buf()), ..config(dir.path()) };
        run(&saving, &mut out, &mut Unsteered).expect("runs");
        let lines = lines(&out);
        let path = lines[1]["checkpoint"].as_str().expect("the epoch line names its checkpoint");
        let c = IoCheckpoint::load(Path::new(path)).expect("loads");
        assert_eq!(c.epoch, 2);
        let mut out = Vec::new();
        let resumed = IoConfig { epochs: 4, resume: Some(c.clone()), ..config(dir.path()) };
        let end = run(&resumed, &mut out, &mut Unsteered).expect("runs");
        let epochs: Vec<u64> = self::lines(&out).iter().filter_map(|l| l["epoch"].as_u64()).collect();
        assert_eq!(epochs, [3, 4], "goes on after the saved epoch");
        assert_eq!(end, whole, "the same checksum as a run that never stopped");
        let other = IoConfig { files: 6, resume: Some(c), ..config(dir.path()) };
        let e = run(&other, &mut Vec::new(), &mut Unsteered).expect_err("another shape");
        assert!(matches!(e, IoError::Resume { files: 5, file_kib: 8 }), "{e}");
    }

    #[test]
    fn a_file_corrupted_on_disk_fails_the_check_and_is_deleted_anyway() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut out = Vec::new();
        let faulty = IoConfig { inject_fault: true, threads: 2, ..config(dir.path()) };
        let e = run(&faulty, &mut out, &mut Unsteered).expect_err("corrupted");
        assert!(matches!(&e, IoError::Check { expected, found, .. } if expected != found), "{e}");
        assert_eq!(lines(&out).len(), 2, "the epochs before the last, no final line");
        assert!(is_empty(dir.path()));
    }

    #[test]
    fn a_missing_scratch_dir_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gone = dir.path().join("gone");
        let e = run(&config(&gone), &mut Vec::new(), &mut Unsteered).expect_err("no directory");
        assert!(matches!(&e, IoError::File { action: "create", path, .. } if path.starts_with(&gone)), "{e}");
    }
}
