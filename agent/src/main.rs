//! `tunefleet-agent`: parses flags, sets up logging and signals, and runs
//! the agent library. `tunefleet-agent __exec ...` is the exec wrapper
//! (see `tunefleet_agent::exec`), dispatched before any runtime exists.
//!
//! Exit codes: 0 after a clean stop, 1 on a runtime error, 2 on a usage error.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use tunefleet_agent::exec;
use tunefleet_agent::options::Cli;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == exec::SUBCOMMAND) {
        let status = exec::main(&args[2..]);
        return ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    let cli = Cli::parse(); // exits with 2 on usage errors, 0 for --help
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tunefleet-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_env("TUNEFLEET_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tunefleet-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(config: tunefleet_agent::AgentConfig) -> anyhow::Result<()> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot install the SIGTERM handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                _ = term.recv() => tracing::info!("SIGTERM received"),
            }
        };
        tunefleet_agent::run(config, shutdown).await.context("agent failed")
    })
}
