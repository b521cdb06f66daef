//! `tunefleet`: parses flags, sets up logging and signals, runs the command.

use std::io::IsTerminal;
use std::process::ExitCode;

use tunefleet_coordinator::cli::{execute, Command};

fn main() -> ExitCode {
    let cli = match tunefleet_coordinator::cli::config::parse() {
        Ok(cli) => cli,
        Err(tunefleet_coordinator::cli::config::ConfigError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("tunefleet: {e:#}");
            return ExitCode::from(2);
        }
    };
    // The demo shows its progress bar and summary; other commands log what the coordinator does.
    let default = if matches!(cli.command, Command::Demo(_)) {
        "warn,rumqttd=off"
    } else {
        "warn,tunefleet_coordinator=info,rumqttd=off"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TUNEFLEET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file or journald gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Above the progress bars while they are drawn.
        .with_writer(tunefleet_coordinator::runtime::progress::LogWriter)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tunefleet: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The handlers are installed as soon as the runtime runs, before any
    // broker or store is opened: an early Ctrl-C drains like a late one.
    let result = runtime.block_on(async { execute(cli, shutdown_signal()).await });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A bad study file or bad input is a usage error; a run says how it ended.
            let code = ExitCode::from(e.exit_code());
            // Printed with its sources, as anyhow prints a chain.
            eprintln!("tunefleet: {:#}", anyhow::Error::from(e));
            code
        }
    }
}

fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Registered now (inside the runtime), awaited later.
    let streams = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()));
    async move {
        match streams {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
            }
            _ => std::future::pending::<()>().await,
        }
    }
}
