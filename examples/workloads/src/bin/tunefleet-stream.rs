//! `tunefleet-stream`: a memory-bound job, a blocked out-of-place matrix
//! transpose; prints one JSON line per epoch, then a final line, on stdout,
//! and checks every element of its result. With `TUNEFLEET_CONTROL=stdin`
//! it reads a control line on stdin after each epoch but the last
//! ([`tunefleet_workloads::control`]).
//!
//! Exit codes: 0 correct, 1 wrong result or other failure, 2 bad flags or a
//! bad `TUNEFLEET_THREADS`/`OMP_NUM_THREADS`.

use std::process::ExitCode;

use clap::Parser;
use tunefleet_workloads::control;
use tunefleet_workloads::threads::{self, MAX_THREADS};
use tunefleet_workloads::transpose::{self, side_for, StreamConfig};

/// Transpose a square f64 matrix back and forth between two buffers, tile by tile.
#[derive(Debug, Parser)]
#[command(name = "tunefleet-stream", version)]
struct Cli {
    /// Size of both buffers together, in MiB.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    size_mib: u32,
    /// Tile edge, in elements.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    block_size: u32,
    /// Number of epochs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    epochs: u32,
    /// Transposes per epoch.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    passes: u32,
    /// Worker threads of the first epoch [default: $TUNEFLEET_THREADS, else $OMP_NUM_THREADS, else 1].
    /// With TUNEFLEET_CONTROL=stdin, a `threads=N` line on stdin after an epoch changes it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_THREADS as u64))]
    threads: Option<u64>,
    /// Corrupt one element before the check (to test the failure path).
    #[arg(long, hide = true)]
    inject_fault: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = match threads::for_program("tunefleet-stream", cli.threads) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = StreamConfig {
        size_mib: cli.size_mib as usize,
        block_size: cli.block_size as usize,
        threads,
        epochs: cli.epochs,
        passes: cli.passes,
        inject_fault: cli.inject_fault,
    };
    let n = side_for(config.size_mib);
    eprintln!(
        "tunefleet-stream: transposing {n}x{n} f64 ({} MiB in two buffers), block {}, {} thread(s)",
        config.size_mib, config.block_size, config.threads
    );
    let mut steer = control::from_env("tunefleet-stream");
    match transpose::run(&config, &mut std::io::stdout().lock(), steer.as_mut()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tunefleet-stream: {:#}", anyhow::Error::from(e));
            ExitCode::FAILURE
        }
    }
}
