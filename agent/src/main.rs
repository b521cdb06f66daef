//! `tunefleet-agent`: parses flags, sets up logging and signals, and runs
//! the agent library, or one of its stand-alone subcommands (`probe`,
//! `measure`). `tunefleet-agent __exec ...` is the exec wrapper (see
//! `tunefleet_agent::exec`), dispatched before any runtime exists.
//!
//! Exit codes: 0 after a clean stop, 1 on a runtime error, 2 on a usage
//! error; `measure` exits with the measured command's status (1 when it
//! cannot write its `-o FILE`).

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;
use tunefleet_agent::exec;
use tunefleet_agent::measure::{self, MeasureConfig};
use tunefleet_agent::options::{self, Cli, Mode, SpoolAction};
use tunefleet_agent::pending::SpoolView;
use tunefleet_agent::probe;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == exec::SUBCOMMAND) {
        let status = exec::main(&args[2..]);
        return ExitCode::from(u8::try_from(status).unwrap_or(1));
    }
    let cli = Cli::parse(); // exits with 2 on usage errors, 0 for --help
    if let Some(dir) = &cli.workdir {
        if let Err(e) = std::env::set_current_dir(dir) {
            eprintln!("tunefleet-agent: --workdir {}: {e}", dir.display());
            return ExitCode::from(2);
        }
    }
    let mode = match options::into_mode(cli) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("tunefleet-agent: {e}");
            return ExitCode::from(2);
        }
    };
    // The subcommands are quiet unless asked: their report is the output.
    let default_filter = if matches!(mode, Mode::Agent(_)) { "info" } else { "error" };
    let filter = EnvFilter::try_from_env("TUNEFLEET_LOG").unwrap_or_else(|_| EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let result = match mode {
        Mode::Agent(config) => run(*config).map(|()| ExitCode::SUCCESS),
        Mode::Probe { json, roots, model } => {
            let report = probe::probe(&roots, model);
            if json {
                serde_json::to_string_pretty(&report)
                    .context("cannot encode the probe report")
                    .map(|text| println!("{text}"))
            } else {
                print!("{}", report.render_table());
                Ok(())
            }
            .map(|()| ExitCode::SUCCESS)
        }
        Mode::Measure { argv, interval, json, output, roots, model } => {
            run_measure(argv, interval, json, output.as_deref(), roots, model).map(ExitCode::from)
        }
        Mode::Key { state_dir } => tunefleet_agent::auth::load_identity(Some(&state_dir))
            .map(|id| println!("{}", tunefleet_common::auth::hex(&id.public())))
            .context("loading the agent's key")
            .map(|()| ExitCode::SUCCESS),
        Mode::Spool { state_dir, action } => spool(&state_dir, action).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tunefleet-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `tunefleet-agent spool`: what the state directory keeps.
fn spool(state_dir: &std::path::Path, action: SpoolAction) -> anyhow::Result<()> {
    let pending = SpoolView::open(state_dir);
    match action {
        SpoolAction::List => {
            let unacked = pending.load();
            let parked = pending.parked();
            println!(
                "{}: {} awaiting an acknowledgement, {} kept aside",
                state_dir.display(),
                unacked.len(),
                parked.len()
            );
            for r in &unacked {
                println!("unacked {}  exit {:?}", r.trial, r.measurement.exit);
            }
            for p in &parked {
                println!("parked  {}  {}  ({})", p.trial, p.reason, p.path.display());
            }
            if !parked.is_empty() {
                println!("to deliver them to the coordinator that runs their study: tunefleet-agent spool requeue, then start the agent against it");
            }
        }
        SpoolAction::Requeue => {
            let n = pending.requeue().context("moving parked results back")?;
            println!("{n} results moved back; the agent delivers them on its next run");
            let left = pending.parked().len();
            if left > 0 {
                println!(
                    "{left} stay parked: their trial already has a result waiting (requeue again once it is delivered)"
                );
            }
        }
    }
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the async runtime")
}

/// Runs `f` to its end on a new runtime, then stops the runtime without
/// waiting long for its blocking threads: one still reading a pipe that a
/// stray process of a trial holds open must not keep the agent from exiting.
fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    let runtime = runtime()?;
    let out = runtime.block_on(f);
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    Ok(out)
}

fn run(config: tunefleet_agent::AgentConfig) -> anyhow::Result<()> {
    // Before the runtime starts any thread: everything the agent starts inherits the mask.
    if let Some(cpus) = &config.cpus {
        tunefleet_agent::cpus::pin_self(cpus).context("--cpus: cannot confine the agent to its CPUs")?;
    }
    block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot install the SIGTERM handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                _ = term.recv() => tracing::info!("SIGTERM received"),
            }
        };
        tunefleet_agent::run(config, shutdown).await.context("agent failed")
    })?
}

fn run_measure(
    argv: Vec<String>,
    interval: std::time::Duration,
    json: bool,
    output: Option<&std::path::Path>,
    energy_roots: tunefleet_agent::energy::EnergyRoots,
    model: tunefleet_agent::energy::EstimateModel,
) -> anyhow::Result<u8> {
    let wrapper = std::env::current_exe().context("cannot find this executable to use as the exec wrapper")?;
    let cfg = MeasureConfig { argv, interval, energy_roots, model, wrapper };
    // Created before the command runs: a path that cannot be written fails at once, not after the run.
    let file = output
        .map(|path| std::fs::File::create(path).with_context(|| format!("-o: cannot create {}", path.display())))
        .transpose()?;
    let measurement = block_on(async {
        let (handle, control) = tunefleet_agent::runner::TrialHandle::new();
        // Ctrl-C reaches the command too (same terminal); the runner then stops its group.
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                handle.cancel();
            }
        });
        measure::measure(&cfg, control).await
    })?;
    let line = serde_json::to_string(&measurement).context("cannot encode the measurement")?;
    if json {
        eprintln!("{line}");
    } else {
        eprint!("{}", measure::render_table(&cfg.argv, &measurement));
    }
    if let (Some(path), Some(mut file)) = (output, file) {
        use std::io::Write as _;
        writeln!(file, "{line}").with_context(|| format!("-o: cannot write {}", path.display()))?;
    }
    Ok(measure::exit_status(&measurement.exit))
}
