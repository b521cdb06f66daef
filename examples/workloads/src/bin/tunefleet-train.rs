//! `tunefleet-train`: trains a small MLP on the bundled handwritten digits and
//! prints one JSON line per epoch, then a final line, on stdout. With
//! `TUNEFLEET_CONTROL=stdin` it reads a control line on stdin after each epoch
//! but the last ([`tunefleet_workloads::control`]).
//!
//! Exit codes: 0 trained, 1 failed (diverged, cannot write), 2 bad flags or a
//! bad `TUNEFLEET_THREADS`/`OMP_NUM_THREADS`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tunefleet_workloads::threads::{self, MAX_THREADS};
use tunefleet_workloads::train::{self, TrainConfig};
use tunefleet_workloads::{control, digits};

/// Train a 64 -> hidden -> 10 perceptron on the UCI digits with SGD and momentum.
#[derive(Debug, Parser)]
#[command(name = "tunefleet-train", version)]
struct Cli {
    /// Learning rate (> 0).
    #[arg(long, default_value_t = 0.05, value_parser = positive_f32)]
    lr: f32,
    /// Momentum, in [0, 1).
    #[arg(long, default_value_t = 0.9, value_parser = momentum)]
    momentum: f32,
    /// Samples per mini-batch.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    batch_size: u32,
    /// Width of the hidden layer.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=16_384))]
    hidden: u32,
    /// Number of epochs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    epochs: u32,
    /// Passes over the training split per epoch.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    passes: u32,
    /// Seed of the split, the initial weights and the sample order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Gradient workers per mini-batch in the first epoch [default: $TUNEFLEET_THREADS, else $OMP_NUM_THREADS,
    /// else 1]. With TUNEFLEET_CONTROL=stdin, a `threads=N` line on stdin after an epoch changes it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=MAX_THREADS as u64))]
    threads: Option<u64>,
    /// Save the state after every epoch in this directory and name the file
    /// on the epoch line ("checkpoint"), so the run can go on elsewhere.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<std::path::PathBuf>,
    /// Go on after the epoch saved in this checkpoint (give the flags it was
    /// saved with); an empty value starts from scratch.
    // An OsString, not a PathBuf: clap refuses an empty PathBuf.
    #[arg(long, value_name = "FILE", value_parser = clap::value_parser!(std::ffi::OsString))]
    resume: Option<std::ffi::OsString>,
}

fn positive_f32(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{s:?} is not a finite number > 0")),
    }
}

fn momentum(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(x) if (0.0..1.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?} is not a number in [0, 1)")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let threads = match threads::for_program("tunefleet-train", cli.threads) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let config = TrainConfig {
        lr: cli.lr,
        momentum: cli.momentum,
        batch_size: cli.batch_size as usize,
        hidden: cli.hidden as usize,
        epochs: cli.epochs,
        passes: cli.passes,
        threads,
        seed: cli.seed,
        report_steps: std::env::var("TUNEFLEET_STEPS").is_ok_and(|v| v == "1"),
        checkpoint_dir: cli.checkpoint_dir,
        resume: match cli.resume.filter(|p| !p.is_empty()) {
            Some(path) => match tunefleet_workloads::checkpoint::Checkpoint::load(std::path::Path::new(&path)) {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("tunefleet-train: cannot resume: {e}");
                    return ExitCode::from(2);
                }
            },
            None => None,
        },
        ..TrainConfig::default()
    };
    match run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tunefleet-train: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: &TrainConfig) -> anyhow::Result<()> {
    let data = digits::load_bundled().context("loading the bundled digits")?;
    eprintln!(
        "tunefleet-train: {} samples, hidden {}, batch {}, lr {}, momentum {}, {} thread(s), seed {}",
        data.len(),
        config.hidden,
        config.batch_size,
        config.lr,
        config.momentum,
        config.threads,
        config.seed
    );
    let mut steer = control::from_env("tunefleet-train");
    let result = train::run(config, &data, &mut std::io::stdout().lock(), steer.as_mut())?;
    eprintln!("tunefleet-train: validation accuracy {:.4}, loss {:.4}", result.accuracy, result.loss);
    Ok(())
}
