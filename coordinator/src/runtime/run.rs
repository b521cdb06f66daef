//! The coordinator as a library: [`run`] starts the embedded broker (or
//! connects to an external one), opens the store, loads the coordinator's
//! key, runs its studies until they end or `shutdown` completes, and drains the
//! InfluxDB sink. `cli.rs` only turns flags into a [`RunConfig`] and prints;
//! tests and other programs call [`run`] directly.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use tunefleet_common::auth::{self, Identity, KeyFileError};
use tunefleet_common::security::ClientSecurity;
use tunefleet_common::topic::Topics;
use tunefleet_common::{BrokerUrl, CodecError};

use crate::domain::study::Study;
use crate::runtime::auth::Sessions;
use crate::runtime::broker::{self, BrokerError, BrokerSettings};
use crate::runtime::engine::{EngineError, Summary};
use crate::runtime::failover;
use crate::runtime::logins::UserLine;
use crate::runtime::progress::ProgressDisplay;
use crate::runtime::shell::Engine;
use crate::runtime::sink::{Flusher, SinkConfig, SinkError, SinkStats};
use crate::runtime::transport::{self, TransportConfig, TransportError};
use crate::store::{Store, StoreError};

/// Which broker the fleet meets on.
#[derive(Debug, Clone)]
pub enum BrokerChoice {
    /// Start the embedded broker with these settings; the users file's
    /// lines decide who else logs in ([`crate::runtime::logins`]).
    Embedded(BrokerSettings, Option<HashMap<String, UserLine>>),
    /// Use a broker that already runs: its URL and how to log in.
    External { url: BrokerUrl, security: ClientSecurity },
}

/// Everything one run needs.
pub struct RunConfig {
    /// Run side by side on the fleet (one study, or a campaign's).
    pub studies: Vec<Study>,
    pub broker: BrokerChoice,
    pub topics: Topics,
    pub keepalive: Duration,
    /// The SQLite store (created when missing; a study in it is resumed).
    pub store: PathBuf,
    /// The coordinator's Ed25519 key (created when missing).
    pub identity: PathBuf,
    /// Bound on the agents whose keys are pinned.
    pub max_agents: u64,
    /// Most slots any agent is given, whatever it announces.
    pub max_slots: u32,
    /// Most GPUs any agent is given, whatever it announces.
    pub max_gpus: u32,
    /// Bytes the store's disk keeps free: below, the engine pauses
    /// ([`crate::runtime::disk`]).
    pub store_min_free: u64,
    /// Bytes of each study's store one agent may take ([`crate::domain::sched::StudyPolicy::store_share`]).
    pub store_share: u64,
    /// Pin new agent keys without a join token (a lab).
    pub open_enrolment: bool,
    /// Where results' points go besides the store, and how long to keep
    /// delivering them after the study.
    pub influx: Option<(SinkConfig, Duration)>,
    /// Show a progress bar (a terminal) or plain lines.
    pub progress: bool,
    /// When agents count as overloaded (their trials are then moved);
    /// `None`: never.
    pub offload: Option<crate::domain::offload::OffloadPolicy>,
    /// Told the URL agents use once the broker is up (`tunefleet run`
    /// prints it: scripts read it to find a port the OS chose).
    pub on_broker: Option<OnBroker>,
    /// Start agents with this launcher while studies have work ([`crate::runtime::launch`]).
    pub launch: Option<crate::runtime::launch::LaunchArgs>,
    /// Run as a service (`tunefleet serve`): take studies on this control
    /// socket ([`crate::runtime::control`]), resume the store's unfinished ones, and
    /// run until `shutdown` instead of until `studies` finish.
    pub control: Option<PathBuf>,
    /// A service on a server's store: how long its lease runs unrenewed
    /// before a standby takes over (`store/lease.rs`); `None`: no lease
    /// (a run, a campaign, a store in a file).
    pub lease: Option<Duration>,
}

/// A callback given the broker URL agents use.
pub type OnBroker = Box<dyn FnOnce(&BrokerUrl) + Send>;

/// What a run did.
#[derive(Debug)]
pub struct RunOutcome {
    /// One per study, in order.
    pub summaries: Vec<Summary>,
    /// The InfluxDB sink's final figures, when there was one.
    pub influx: Option<SinkStats>,
}

/// Why a run stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("embedded broker")]
    Broker(#[from] BrokerError),
    #[error("opening the store {path}")]
    Store { path: PathBuf, source: StoreError },
    #[error("the coordinator's key")]
    Key(#[from] KeyFileError),
    #[error("signing the coordinator status")]
    Codec(#[from] CodecError),
    #[error("MQTT")]
    Transport(#[from] TransportError),
    #[error("InfluxDB sink")]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Control(#[from] crate::runtime::control::ControlError),
    #[error("cannot take the running lock beside the store {path}")]
    Locking { path: PathBuf, source: std::io::Error },
    #[error("stopped while waiting for room on the disk of the store {path}")]
    NoRoom { path: PathBuf },
    #[error("study {name} in the store no longer parses: {why}")]
    StoredStudy { name: String, why: String },
    #[error(transparent)]
    SteppedDown(#[from] crate::store::Lost),
}

/// Runs `config.studies` to the end (or until `shutdown`).
pub async fn run(config: RunConfig, shutdown: impl Future<Output = ()>) -> Result<RunOutcome, RunError> {
    let RunConfig {
        studies,
        broker,
        topics,
        keepalive,
        store,
        identity: key_path,
        max_agents,
        max_slots,
        max_gpus,
        store_min_free,
        store_share,
        open_enrolment,
        influx,
        progress,
        offload,
        on_broker,
        launch,
        control,
        lease,
    } = config;
    if let Some(path) = &control {
        // Before the broker and the store: a second service on the same store says so.
        crate::runtime::control::ensure_free(path).await?;
    }
    tokio::pin!(shutdown);
    // A service among others on a server's store: a standby until active,
    // before the broker (agents meet the active one) and the store.
    let lease = lease.filter(|_| control.is_some() && crate::store::is_remote(&store));
    let held = match lease {
        Some(lease) => match active(&store, &key_path, lease, shutdown.as_mut()).await? {
            Some(held) => Some(held),
            None => return Ok(RunOutcome { summaries: Vec::new(), influx: None }),
        },
        None => None,
    };
    // Renewed from now on: what follows may take a while (a store's
    // migration, its lock held by a rename).
    let (instance, epoch) = (held.as_ref().map(|h| h.instance), held.as_ref().map(|h| h.epoch));
    let renewals = failover::Renewals::of(held, lease);
    let (public, connect, security) = meet_on(broker, &topics, &store)?;
    if let Some(tell) = on_broker {
        tell(&public);
    }
    wait_for_room(&store, store_min_free, shutdown.as_mut()).await?;
    let db = Store::open(&store).map_err(|source| RunError::Store { path: store.clone(), source })?;
    // Held until the run ends: no rename or delete under a running coordinator.
    let _running =
        crate::store::RunLock::running(&store).map_err(|source| RunError::Locking { path: store.clone(), source })?;
    if let Some(epoch) = epoch {
        db.fence(epoch);
    }
    let sessions = sessions(&key_path, instance, max_agents, (max_slots, max_gpus), open_enrolment)?;
    let root = topics.root().to_string();
    let (outbox, inbound) = transport::connect(TransportConfig {
        url: connect,
        // Not the instance: that one is in the retained status, and a broker
        // user who knows a client id can take the connection over.
        client_id: format!("tf-coordinator-{:016x}", rand::random::<u64>()),
        topics,
        keepalive,
        security,
        online_status: sessions.status_payload(true)?,
        offline_status: sessions.status_payload(false)?,
    })?;
    let sink = influx.as_ref().map(|(c, _)| Flusher::spawn(c.clone(), &store)).transpose()?;
    let launcher = launch.as_ref().and_then(|args| {
        let cx = crate::runtime::launch::Context {
            broker: public.to_string(),
            root: root.clone(),
            coordinator_key: auth::hex(&sessions.public_key()),
            prefix: "launched".to_string(),
        };
        crate::runtime::launch::Launcher::new(args, cx)
    });
    let mut engine = Engine::new(db, outbox, ProgressDisplay::new(progress), sessions)
        .with_influx(sink.is_some())
        .with_offload(offload)
        .with_launcher(launcher)
        .with_space(Some(crate::runtime::disk::Guard::new(store.clone(), store_min_free)))
        .with_store_share(store_share);
    let result = match control {
        None => {
            let names: Vec<String> = studies.iter().map(|s| s.name.clone()).collect();
            for study in studies {
                engine.start_study(study)?;
            }
            engine.run_studies(&names, inbound, shutdown).await.map_err(RunError::from)
        }
        Some(path) => serve(engine, &store, &path, studies, inbound, shutdown, renewals).await,
    };
    let influx = match (sink, influx) {
        (Some(sink), Some((_, grace))) => Some(sink.drain(grace).await?),
        _ => None,
    };
    Ok(RunOutcome { summaries: result?, influx })
}

/// A service (`tunefleet serve`): the store's unfinished studies resumed
/// and `studies` started, then studies taken on the control socket at
/// `path` until `shutdown`, or until its lease (when it holds one) is lost:
/// that ends it where it is, with nothing more written or sent (the fence
/// refuses a write that raced it).
async fn serve(
    mut engine: Engine,
    store: &Path,
    path: &Path,
    studies: Vec<Study>,
    inbound: tokio::sync::mpsc::Receiver<crate::runtime::engine::Inbound>,
    shutdown: Pin<&mut impl Future<Output = ()>>,
    mut renewals: failover::Renewals,
) -> Result<Vec<Summary>, RunError> {
    for study in unfinished(store)?.into_iter().chain(studies) {
        engine.start_study(study)?;
    }
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    // On a server's store, requests written there by another machine's
    // `submit` and `cancel` too.
    let relay = crate::store::is_remote(store).then(|| crate::runtime::control::relay(store, tx.clone()));
    let listener = crate::runtime::control::listen(path, tx).await?;
    let result = tokio::select! {
        r = engine.serve(inbound, rx, shutdown) => r.map_err(RunError::from),
        l = renewals.lost() => Err(RunError::SteppedDown(l)),
    };
    listener.abort();
    if let Some(r) = relay {
        r.abort();
    }
    let _ = std::fs::remove_file(path);
    match result {
        Err(e @ RunError::Engine(_)) => Err(renewals.why_it_ended(e).await),
        r => r,
    }
}

/// Waits as a standby until this service holds the lease of the
/// coordinators on the server's `store` (`None`: `shutdown` came first),
/// announcing an instance above this key's and every one the store saw.
async fn active(
    store: &Path,
    key_path: &Path,
    lease: Duration,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<crate::store::Lease>, RunError> {
    let holder = crate::store::name_this_process();
    let min_instance = auth::next_instance(Some(&key_path.with_extension("instance")))?;
    let waited = failover::wait_to_be_active(store, &holder, lease, min_instance, shutdown).await;
    waited.map_err(|source| RunError::Store { path: store.to_path_buf(), source })
}

/// Where the fleet meets: the broker URL agents use, the one the
/// coordinator connects to, and how it logs in (the embedded broker is
/// started here, its internal listener for the coordinator alone).
fn meet_on(
    broker: BrokerChoice,
    topics: &Topics,
    store: &Path,
) -> Result<(BrokerUrl, BrokerUrl, ClientSecurity), RunError> {
    Ok(match broker {
        BrokerChoice::External { url, security } => (url.clone(), url, security),
        BrokerChoice::Embedded(mut settings, users) => {
            // Logins by identity, each to its own topics.
            let logins = crate::runtime::logins::Logins::new(topics.clone(), store.to_path_buf(), users);
            settings.gate = Some(std::sync::Arc::new(logins));
            let b = broker::start(&settings)?;
            let tls = settings.tls.is_some();
            tracing::info!(addr = %b.addr, tls, "embedded broker listening");
            let public = BrokerUrl { host: broker::reachable_host(b.addr.ip()), port: b.addr.port(), tls };
            let internal =
                BrokerUrl { host: b.internal.addr.ip().to_string(), port: b.internal.addr.port(), tls: false };
            (public, internal, ClientSecurity { credentials: b.internal.credentials, tls: None })
        }
    })
}

/// A disk too full to commit to: wait for room instead of failing (and,
/// under systemd, restarting into the same full disk), or until `shutdown`.
async fn wait_for_room(
    store: &Path,
    min_free: u64,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<(), RunError> {
    if crate::runtime::disk::has_room(store, min_free) {
        return Ok(());
    }
    let free = crate::runtime::disk::free_bytes(store).unwrap_or(0);
    tracing::error!(
        store = %store.display(),
        free = %crate::runtime::disk::readable(free),
        floor = %crate::runtime::disk::readable(min_free),
        "the store's disk is nearly full: waiting for room before starting"
    );
    loop {
        tokio::select! {
            () = &mut shutdown => return Err(RunError::NoRoom { path: store.to_path_buf() }),
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        if crate::runtime::disk::has_room(store, min_free) {
            tracing::warn!("the store's disk has room: starting");
            return Ok(());
        }
    }
}

/// The coordinator's sessions with agents: its key (created when missing,
/// at `key_path`), this start's instance, and the bounds on the fleet.
fn sessions(
    key_path: &Path,
    instance: Option<u64>,
    max_agents: u64,
    (max_slots, max_gpus): (u32, u32),
    open_enrolment: bool,
) -> Result<Sessions, RunError> {
    let (identity, created) = Identity::load_or_create(key_path)?;
    if created {
        tracing::warn!(path = %key_path.display(), key = %auth::short_key(&identity.public()), "created the coordinator's key");
    }
    // Grows with every start of this coordinator key (agents take an older
    // instance's status for a replay), whatever the clock says.
    // The lease's when there is one: above every instance the store's
    // coordinators announced.
    let instance = match instance {
        Some(i) => i,
        None => auth::next_instance(Some(&key_path.with_extension("instance")))?,
    };
    let started =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let mut sessions = Sessions::new(identity, instance, started);
    sessions.max_agents = max_agents;
    sessions.max_slots = max_slots;
    sessions.max_gpus = max_gpus;
    sessions.open_enrolment = open_enrolment;
    if open_enrolment {
        tracing::warn!(
            "OPEN ENROLMENT: any broker user can join this fleet with a key of its own (--open-enrolment); use join \
             tokens (tunefleet token create) outside a lab"
        );
    }
    Ok(sessions)
}

/// The studies a service (or a run) left unfinished in the store at
/// `store`, as the store reads them back: they go on.
fn unfinished(store: &Path) -> Result<Vec<Study>, RunError> {
    let db = Store::open(store).map_err(|source| RunError::Store { path: store.to_path_buf(), source })?;
    let rows = db.studies().map_err(|source| RunError::Store { path: store.to_path_buf(), source })?;
    let mut studies = Vec::new();
    for row in rows.into_iter().filter(|s| s.state == crate::store::StudyState::Running) {
        match db.stored(&row.name).map(|s| s.and_then(|s| s.study())) {
            Ok(Some(study)) => {
                tracing::info!(study = %study.name, "resuming an unfinished study");
                studies.push(study);
            }
            // Not readable by this program: the parse error says why.
            _ => {
                let origin = format!("{} (stored)", row.name);
                let why = crate::domain::study::parse(&row.config, &origin)
                    .err()
                    .map_or_else(|| "not found in its stored file".to_string(), |e| e.to_string());
                return Err(RunError::StoredStudy { name: row.name.clone(), why });
            }
        }
    }
    Ok(studies)
}
