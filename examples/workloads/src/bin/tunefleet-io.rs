//! `tunefleet-io`: an I/O-bound job. Each epoch writes files into a scratch
//! directory in small calls, syncs them, reads them back, checks their
//! checksums and deletes them ([`tunefleet_workloads::disk`]); prints one
//! JSON line per epoch, then a final line, on stdout. With
//! `TUNEFLEET_CONTROL=stdin` it reads a control line on stdin after each
//! epoch but the last ([`tunefleet_workloads::control`]).
//!
//! Exit codes: 0 done, 1 a file read back wrong or other failure (a
//! checkpoint of another shape of epoch too), 2 bad flags, a bad
//! `TUNEFLEET_THREADS`/`OMP_NUM_THREADS` or a `--resume` file that is not a
//! checkpoint.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tunefleet_workloads::checkpoint::IoCheckpoint;
use tunefleet_workloads::control;
use tunefleet_workloads::disk::{self, IoConfig};
use tunefleet_workloads::threads::{self, MAX_THREADS};

const PROGRAM: &str = "tunefleet-io";

/// Write files, sync them, read them back, check and delete them, epoch after epoch.
#[derive(Debug, Parser)]
#[command(name = "tunefleet-io", version)]
struct Cli {
    /// Files written and read back per epoch.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    files: u32,
    /// Size of each file, in KiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    file_kib: u32,
    /// Bytes per write and per read system call, in KiB.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    block_kib: u32,
    /// Number of epochs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    epochs: u32,
    /// Seed of the files' contents.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// File workers in the first epoch [default: $TUNEFLEET_THREADS, else $OMP_NUM_THREADS, else 1].
    /// With TUNEFLEET_CONTROL=stdin, a `threads=N` line on stdin after an epoch changes it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_THREADS as u64))]
    threads: Option<u64>,
    /// Write the files in this directory (created when missing, kept, left
    /// empty) [default: a new directory in $TMPDIR, removed at the end].
    #[arg(long, value_name = "DIR")]
    scratch_dir: Option<PathBuf>,
    /// Save the totals after every epoch in this directory and name the file
    /// on the epoch line ("checkpoint"), so the run can go on elsewhere.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Go on after the epoch saved in this checkpoint (give the flags it was
    /// saved with); an empty value starts from scratch.
    // An OsString, not a PathBuf: clap refuses an empty PathBuf.
    #[arg(long, value_name = "FILE", value_parser = clap::value_parser!(OsString))]
    resume: Option<OsString>,
    /// Corrupt a file on disk before it is read back (to test the failure path).
    #[arg(long, hide = true)]
    inject_fault: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = match threads::for_program(PROGRAM, cli.threads) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let resume = match cli.resume.as_ref().filter(|p| !p.is_empty()) {
        Some(path) => match IoCheckpoint::load(Path::new(path)) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("{PROGRAM}: cannot resume: {e}");
                return ExitCode::from(2);
            }
        },
        None => None,
    };
    match run(cli, threads, resume) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{PROGRAM}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli, threads: usize, resume: Option<IoCheckpoint>) -> anyhow::Result<()> {
    // A directory given is kept; the default one is removed at the end, or
    // when `temp` drops on an error.
    let (scratch_dir, temp) = match cli.scratch_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create the scratch directory {}", dir.display()))?;
            (dir, None)
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("tunefleet-io-")
                .tempdir()
                .context("cannot create a scratch directory in the temporary directory")?;
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    let config = IoConfig {
        files: cli.files as usize,
        file_kib: cli.file_kib as usize,
        block_kib: cli.block_kib as usize,
        epochs: cli.epochs,
        threads,
        seed: cli.seed,
        scratch_dir,
        report_steps: std::env::var("TUNEFLEET_STEPS").is_ok_and(|v| v == "1"),
        checkpoint_dir: cli.checkpoint_dir,
        resume,
        inject_fault: cli.inject_fault,
    };
    eprintln!(
        "{PROGRAM}: {} files of {} KiB per epoch in {}, {} KiB per call, {} thread(s), seed {}",
        config.files,
        config.file_kib,
        config.scratch_dir.display(),
        config.block_kib,
        config.threads,
        config.seed
    );
    let mut steer = control::from_env(PROGRAM);
    let checksum = disk::run(&config, &mut std::io::stdout().lock(), steer.as_mut())?;
    if let Some(temp) = temp {
        temp.close().context("cannot remove the scratch directory")?;
    }
    eprintln!("{PROGRAM}: checksum {checksum}");
    Ok(())
}
