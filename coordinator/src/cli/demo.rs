//! `tunefleet demo`: the bundled study on an embedded broker on a free
//! loopback port, with local agent processes this command starts, admits
//! with a join token of its own, and stops at the end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tunefleet_common::security::SecurityArgs;
use tunefleet_common::BrokerUrl;

use super::args::{BrokerArgs, DemoArgs, KeyArg};
use super::error::{CliError, Result};
use super::fleet::new_token;
use super::run::print_summary;
use super::wiring::run_study;
use crate::domain::study;
use crate::runtime::broker::{self, BrokerSettings};
use crate::store::Store;

/// The demo study, bundled so `tunefleet demo` works from any directory.
pub const DEMO_STUDY: &str = include_str!("../../../examples/studies/demo.toml");

/// Runs the demo until it ends or `shutdown`, then stops its agents.
pub async fn demo(args: DemoArgs, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let study = study::parse(DEMO_STUDY, "examples/studies/demo.toml")?;
    let exe = std::env::current_exe()
        .map_err(|source| CliError::System { what: "locating the tunefleet executable", source })?;
    let bin_dir = exe.parent().ok_or_else(|| CliError::refused("the executable has no directory"))?.to_path_buf();
    let agent_exe = bin_dir.join("tunefleet-agent");
    if !agent_exe.exists() {
        return Err(CliError::refused(format!(
            "{} not found: build the whole workspace first (cargo build --release)",
            agent_exe.display()
        )));
    }
    if crate::store::is_remote(&args.store) {
        // A database server's store is shared: only the demo's own study goes.
        let mut store = Store::open(&args.store).map_err(CliError::open_store(&args.store))?;
        let mut batch = store.batch()?;
        match batch.delete_study("demo") {
            Ok(_) | Err(crate::store::LifecycleError::Unknown(_)) => batch.commit()?,
            Err(e) => return Err(CliError::refused(format!("removing the old demo study: {e}"))),
        }
    }
    for f in [args.store.clone(), args.store.with_extension("db-wal"), args.store.with_extension("db-shm")] {
        if !crate::store::is_remote(&f) && f.exists() {
            std::fs::remove_file(&f).map_err(CliError::file("removing the old demo store", &f))?;
        }
    }
    let b =
        broker::start(&BrokerSettings { listen: SocketAddr::from(([127, 0, 0, 1], 0)), ..BrokerSettings::default() })?;
    let url = format!("mqtt://{}", b.addr);
    let path = std::env::join_paths(
        std::iter::once(bin_dir.clone()).chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths)),
    )?;
    let root = format!("tunefleet-demo-{}", std::process::id());
    let join = join_token(&args)?;
    let mut agents = Vec::new();
    for i in 1..=args.agents {
        let child = tokio::process::Command::new(&agent_exe)
            .args(["--broker", &url, "--name", &format!("demo-agent-{i}"), "--root", &root])
            .args(["--tag", "pool=demo"])
            .env("TUNEFLEET_JOIN", &join)
            .env("PATH", &path)
            .env("TUNEFLEET_LOG", std::env::var("TUNEFLEET_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(CliError::file("starting", &agent_exe))?;
        agents.push(child);
    }
    println!(
        "demo: embedded broker on {}, {} agents, study {:?} ({} trials)",
        b.addr, args.agents, study.name, study.budget
    );
    let broker_args = broker_args(url.parse()?, b.addr, root);
    let result = run_study(study, &broker_args, &args.influx, &args.store, !args.quiet, shutdown).await;
    stop(&mut agents).await;
    let summary = result?;
    print_summary(&summary, &args.store);
    println!(
        "look closer: tunefleet best demo --store {0} -n 3; tunefleet export demo --store {0} --format csv",
        args.store.display()
    );
    Ok(())
}

/// The demo's agents join as any agent does: with a join token for this
/// coordinator, admitting exactly them, for the demo's length.
fn join_token(args: &DemoArgs) -> Result<String> {
    let identity = KeyArg { path: None }.load(&args.store)?;
    let mut store = Store::open(&args.store).map_err(|source| CliError::OpenStore {
        what: "opening",
        path: args.store.clone(),
        source: Box::new(source),
    })?;
    new_token(
        &mut store,
        &identity,
        Some(3_600_000),
        Some(u64::from(args.agents)),
        &BTreeMap::new(),
        Default::default(),
    )
}

/// How the demo's coordinator meets its agents: on the embedded broker at
/// `broker` (listening on `listen`), under topic root `root`.
fn broker_args(broker: BrokerUrl, listen: SocketAddr, root: String) -> BrokerArgs {
    BrokerArgs {
        launch: crate::runtime::launch::LaunchArgs { launcher: None, launch_max: 0, launch_grace: Duration::ZERO },
        broker: Some(broker),
        listen,
        root,
        keepalive: 5,
        broker_users: None,
        broker_open_to_network: false,
        broker_cert: None,
        broker_key: None,
        broker_client_ca: None,
        embedded_broker: crate::runtime::broker::BrokerEngine::Native,
        security: SecurityArgs::default(),
        key: KeyArg { path: None },
        max_agents: crate::runtime::auth::DEFAULT_MAX_AGENTS,
        max_slots_per_agent: crate::runtime::auth::DEFAULT_MAX_SLOTS,
        max_gpus_per_agent: crate::runtime::auth::DEFAULT_MAX_GPUS,
        store_min_free_mib: crate::runtime::disk::DEFAULT_MIN_FREE_MIB,
        store_share_mib: crate::runtime::disk::DEFAULT_STORE_SHARE_MIB,
        open_enrolment: false,
        // The demo's agents share this machine with the coordinator: their
        // trials load each other's CPUs, which is not overload.
        offload_cpu: 0.5,
        offload_memory: 0.95,
        offload_window: 3,
        offload: false,
    }
}

/// Stops the demo's agents: SIGTERM to each, then a kill for one still
/// running after 10 s.
async fn stop(agents: &mut [tokio::process::Child]) {
    for child in agents.iter_mut() {
        if let Some(pid) = child.id().and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    for child in agents.iter_mut() {
        if tokio::time::timeout(Duration::from_secs(10), child.wait()).await.is_err() {
            let _ = child.kill().await;
        }
    }
}
