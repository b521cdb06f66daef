//! The Tunefleet agent as a library: [`run`] connects to the broker, takes
//! trials and measures them until `shutdown` completes. `main.rs` only parses
//! flags, sets up logging and waits for signals.
//!
//! * [`protocol`]: the pure state machine (slots, refusals, unacked results).
//! * [`auth`]: keys, the pinned coordinator, the session that seals and opens.
//! * [`transport`]: MQTT (the only module that knows rumqttc).
//! * [`runner`]: runs one trial through the [`exec`] wrapper and measures it
//!   with [`counters`], [`procfs`], [`energy`] and [`cgroup`] limits.
//! * [`metrics`] and [`output`]: what the workload prints.
//! * [`telemetry`]: CPU, memory and power published at an interval;
//!   [`foreign`]: the load from outside the trials in it, and the
//!   interference flag on measurements taken under it.
//! * [`conditions`]: charging, battery and throttling, which stop the agent
//!   taking trials and flag the measurements they disturb.
//! * [`probe`] and [`measure`]: the `probe` and `measure` subcommands.
//! * [`AgentConfig`]: what it runs with; [`caps`], [`cpus`], [`pending`],
//!   [`options`]: the rest.

pub mod allow;
pub mod auth;
pub mod caps;
pub mod cgroup;
pub mod comeasure;
pub mod conditions;
mod config;
pub mod counters;
pub mod cpus;
pub mod energy;
pub mod exec;
pub mod foreign;
mod inbound;
pub mod live;
pub mod measure;
pub mod metrics;
pub mod options;
pub mod output;
pub mod pending;
pub mod pipeline;
pub mod probe;
pub mod procfs;
pub mod protocol;
pub mod runner;
pub mod telemetry;
pub mod transport;

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tunefleet_common::measurement::{Measurement, SegmentRole};
use tunefleet_common::message::{frames, AgentMessage, TrialRef, TrialResult};

pub use crate::config::AgentConfig;
use crate::inbound::{on_inbound, Refused};
use crate::pending::PendingResults;
use crate::protocol::{Action, AgentState, StartTrial};
use crate::runner::{RunnerConfig, TrialRun};
use crate::transport::{Delivery, Transport, TransportConfig};

/// Why the agent stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid agent name: {0}")]
    Name(#[from] tunefleet_common::topic::TopicError),
    #[error("cannot find this executable to use as the exec wrapper: {0}")]
    WrapperExe(std::io::Error),
    #[error("state directory: {0}")]
    State(#[from] pending::PendingError),
    #[error("keys: {0}")]
    Keys(#[from] tunefleet_common::auth::KeyFileError),
    #[error(transparent)]
    Trust(#[from] auth::TrustError),
    #[error("MQTT transport: {0}")]
    Transport(#[from] transport::TransportError),
    #[error("the MQTT event loop stopped unexpectedly")]
    TransportClosed,
    #[error("refused by the coordinator: {0}")]
    Refused(String),
}

/// Carries out the state machine's actions.
struct Executor {
    transport: Transport,
    auth: auth::AgentAuth,
    runner: Arc<RunnerConfig>,
    pending: Option<PendingResults>,
    /// Every running trial's handle (its control input).
    trials: HashMap<TrialRef, runner::TrialHandle>,
    done_tx: mpsc::Sender<(TrialRef, Measurement)>,
    progress_tx: mpsc::Sender<(TrialRef, runner::EpochReport)>,
    /// Trials whose workload exited, their measurement not yet ready.
    exited_tx: mpsc::Sender<TrialRef>,
    publish_failures: u64,
    /// Results the coordinator refused, moved aside.
    parked: u64,
    /// This machine measured over other agents' trials.
    co: comeasure::CoMeter,
    /// Results the state directory could not take, kept in memory until
    /// acknowledged or stored (see [`Executor::retry_spool`]).
    unsaved: Vec<TrialResult>,
    /// Why results cannot be stored now (`None`: they can).
    spool_problem: Option<String>,
    /// `spool_problem` changed since the agent's state was last told.
    spool_changed: bool,
}

/// Places held ahead per slot an automatic lookahead announces: the most
/// it holds (one per slot, more for trials short beside a round trip:
/// [`AgentState::with_auto_lookahead`]).
pub const AUTO_LOOKAHEAD_PER_SLOT: u32 = tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT;

/// How long the agent waits for a Welcome before it says Hello again.
const HELLO_RETRY: Duration = Duration::from_secs(3);
/// How often an agent with free slots and nothing assigned asks again: a
/// coordinator that lost its session answers with a signed stale-session
/// notice, and the agent says Hello again (a lost notice is asked for anew).
const REQUEST_AGAIN: Duration = Duration::from_secs(30);
/// How often an agent whose state directory could not store a result tries again.
const SPOOL_RETRY: Duration = Duration::from_secs(2);

impl Executor {
    /// Carries out `actions` in order, except that trials held ahead start
    /// first (their start needs no disk: the slot a result freed is not
    /// idle during its sync), and the results they keep go to disk next,
    /// together (one append, one sync: group commit), up to the next spool
    /// operation (a Forget or a Park), which stays in order. A result is
    /// always on disk before it is published.
    fn apply(&mut self, mut actions: Vec<Action>) {
        while !actions.is_empty() {
            let end = actions.iter().position(|a| matches!(a, Action::Forget(_) | Action::Park(..)));
            let rest = actions.split_off(end.map_or(actions.len(), |i| i + 1));
            let (starts, others): (Vec<Action>, Vec<Action>) =
                actions.into_iter().partition(|a| matches!(a, Action::Start(_)));
            for start in starts {
                self.apply_one(start);
            }
            actions = others;
            let kept: Vec<&TrialResult> =
                actions.iter().filter_map(|a| if let Action::Keep(r) = a { Some(r) } else { None }).collect();
            if let Some(Err(e)) = self.pending.as_mut().filter(|_| !kept.is_empty()).map(|p| p.save_all(&kept)) {
                for result in &kept {
                    tracing::debug!(trial = %result.trial, error = %e, "result not stored in the state directory");
                }
                self.unsaved.extend(kept.iter().map(|r| (*r).clone()));
                if self.spool_problem.is_none() {
                    tracing::error!(
                        error = %e,
                        unsaved = self.unsaved.len(),
                        "cannot store results in the state directory: taking no trials until it can (the results are \
                         sent, and kept in memory until acknowledged)"
                    );
                    self.spool_problem = Some(e.to_string());
                    self.spool_changed = true;
                }
            }
            // Messages in a row go out bundled (a result and the request
            // after it: one frame).
            let mut run = Vec::new();
            for action in actions {
                match action {
                    Action::Publish(msg) if msg.bundleable() => run.push(msg),
                    other => {
                        self.publish_all(std::mem::take(&mut run));
                        self.apply_one(other);
                    }
                }
            }
            self.publish_all(run);
            actions = rest;
        }
    }

    fn apply_one(&mut self, action: Action) {
        match action {
            Action::Hello(info) => self.hello(&info),
            Action::Publish(msg) => self.publish(&msg),
            Action::Start(start) => self.start(start),
            Action::Cancel(trial) => {
                if let Some(handle) = self.trials.get(&trial) {
                    tracing::info!(%trial, "cancelling trial");
                    handle.cancel();
                }
            }
            Action::Reconfigure(trial, system, reason) => {
                if let Some(handle) = self.trials.get(&trial) {
                    tracing::info!(%trial, ?system, ?reason, "reconfiguring trial");
                    let role = match reason {
                        tunefleet_common::message::ReconfigureReason::Requested => SegmentRole::Reconfigured,
                        tunefleet_common::message::ReconfigureReason::Reuse => SegmentRole::Reused,
                    };
                    handle.send(runner::Control::Apply(system, role));
                }
            }
            // Stored by `apply`, with the rest of its group.
            Action::Keep(_) => {}
            Action::CoMeasure(c) => {
                if let Some(answer) = self.co.on(c) {
                    self.publish(&AgentMessage::CoMeasured(answer));
                }
            }
            Action::Forget(trial) => {
                self.unsaved.retain(|r| r.trial != trial);
                if let Some(Err(e)) = self.pending.as_mut().map(|p| p.remove(&trial)) {
                    tracing::warn!(%trial, error = %e, "cannot forget a stored result");
                }
            }
            Action::Park(trial, reason) => {
                self.parked += 1;
                tracing::warn!(
                    %trial,
                    %reason,
                    parked = self.parked,
                    "the coordinator refused a result: kept aside (tunefleet-agent spool lists it)"
                );
                if let Some(Err(e)) = self.pending.as_mut().map(|p| p.park(&trial, &reason)) {
                    tracing::error!(%trial, error = %e, "cannot move a refused result aside");
                }
            }
        }
    }

    /// What the agent's state must hear of the state directory, once per
    /// change: `Some(Some(why))` it cannot store results, `Some(None)` it can again.
    fn spool_change(&mut self) -> Option<Option<String>> {
        std::mem::take(&mut self.spool_changed).then(|| self.spool_problem.clone())
    }

    /// While results cannot be stored: tries again (the results not yet
    /// acknowledged, or a probe write when every one was); once the state
    /// directory takes them, the agent takes trials again.
    fn retry_spool(&mut self) {
        let Some(pending) = self.pending.as_mut() else { return };
        let unsaved: Vec<&TrialResult> = self.unsaved.iter().collect();
        let tried = if unsaved.is_empty() { pending.probe_space() } else { pending.save_all(&unsaved) };
        match tried {
            Ok(()) => {
                tracing::info!(stored = unsaved.len(), "the state directory stores results again: taking trials");
                self.unsaved.clear();
                self.spool_problem = None;
                self.spool_changed = true;
            }
            Err(e) => tracing::debug!(error = %e, "the state directory still cannot store results"),
        }
    }

    fn hello(&mut self, info: &tunefleet_common::message::AgentInfo) {
        match self.auth.hello(info) {
            Ok(Some(payload)) => self.send(tunefleet_common::topic::AgentTopic::Hello, payload),
            Ok(None) => tracing::debug!("no coordinator online yet: Hello deferred"),
            Err(e) => tracing::error!(error = %e, "cannot build a Hello"),
        }
    }

    fn publish(&mut self, msg: &AgentMessage) {
        self.publish_within(msg, usize::MAX);
    }

    /// Publishes `msg` unless its frame is larger than `max` bytes: then
    /// false, and nothing sent.
    fn publish_within(&mut self, msg: &AgentMessage, max: usize) -> bool {
        if !self.transport.is_connected() {
            // Sealed in a session the next connection will not have: what
            // matters (results, requests) is sent again once welcomed.
            tracing::debug!("not connected: message not sent");
            return true;
        }
        match self.auth.seal(msg) {
            Some(Ok((_, payload))) if payload.len() > max => return false,
            Some(Ok((kind, payload))) => self.send(kind, payload),
            Some(Err(e)) => tracing::error!(error = %e, "cannot seal a message"),
            None => tracing::debug!("no session: message not sent"),
        }
        true
    }

    /// Publishes `msgs` in order, in as few frames as [`frames`] makes; a
    /// bundle that would not fit in one message goes out one by one.
    fn publish_all(&mut self, msgs: Vec<AgentMessage>) {
        for group in frames(msgs, AgentMessage::bundleable) {
            if group.len() < 2 {
                group.iter().for_each(|m| self.publish(m));
                continue;
            }
            let sent = match AgentMessage::bundle(&group) {
                Ok(bundle) => self.publish_within(&bundle, tunefleet_common::MAX_MESSAGE_BYTES),
                Err(e) => {
                    tracing::error!(error = %e, "cannot bundle messages: sent one by one");
                    false
                }
            };
            if !sent {
                group.iter().for_each(|m| self.publish(m));
            }
        }
    }

    fn send(&mut self, kind: tunefleet_common::topic::AgentTopic, payload: Vec<u8>) {
        if let Err(e) = self.transport.publish(kind, payload) {
            self.publish_failures += 1;
            tracing::warn!(error = %e, failures = self.publish_failures, "publish failed");
        }
    }

    fn start(&mut self, start: StartTrial) {
        let StartTrial { trial, spec, cpus, gpus } = start;
        tracing::info!(%trial, argv = ?spec.argv, ?cpus, gpus = ?gpus.iter().map(|g| g.index).collect::<Vec<_>>(), "starting trial");
        let (handle, control) = runner::TrialHandle::new();
        self.trials.insert(trial.clone(), handle);
        let label = format!("{}-{:x}", pending::file_name(&trial).trim_end_matches(".bin"), rand::random::<u32>());
        let run = TrialRun { spec, cpus, gpus, label };
        let runner = Arc::clone(&self.runner);
        let done = self.done_tx.clone();
        let progress = self.progress_tx.clone();
        let exited = self.exited_tx.clone();
        // Started here, not in the task: the task runs only once the loop
        // is free again, after the sync of the result that freed the slot.
        let launched = runner::launch(&runner, &run);
        tokio::spawn(async move {
            let (ptx, mut prx) = mpsc::channel::<runner::EpochReport>(256);
            let forward = async {
                while let Some(epoch) = prx.recv().await {
                    // Progress is advisory; dropped if the agent loop lags.
                    let _ = progress.try_send((trial.clone(), epoch));
                }
            };
            // The slot is free at the exit, before the measurement is ready.
            let (exit_tx, exit_rx) = tokio::sync::oneshot::channel();
            let free = async {
                if exit_rx.await.is_ok() {
                    // Advisory: the result frees the slot anyway.
                    let _ = exited.try_send(trial.clone());
                }
            };
            let (measurement, (), ()) =
                tokio::join!(launched.finish(&runner, &run, Some(ptx), control, Some(exit_tx)), forward, free);
            tracing::info!(%trial, exit = ?measurement.exit, wall_us = measurement.wall_us, "trial ended");
            let _ = done.send((trial, measurement)).await;
        });
    }
}

/// Runs the agent until `shutdown` completes (or `max_trials` / idle exit),
/// then drains within the grace period: running trials are cancelled and
/// their results published, the retained status goes offline, and the
/// connection is closed. Losing the broker is never an error.
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    let mut agent = Agent::start(&config)?;
    tokio::pin!(shutdown);
    let outcome = agent.serve(shutdown).await;
    agent.drain(outcome.is_ok()).await;
    outcome
}

/// The running agent: its state machine, the executor of its actions, and
/// what comes in (frames, trials' ends, progress and exits, telemetry).
struct Agent<'c> {
    config: &'c AgentConfig,
    state: AgentState,
    exec: Executor,
    inbound: mpsc::Receiver<Delivery>,
    done_rx: mpsc::Receiver<(TrialRef, Measurement)>,
    progress_rx: mpsc::Receiver<(TrialRef, runner::EpochReport)>,
    exited_rx: mpsc::Receiver<TrialRef>,
    telemetry: telemetry::TelemetrySampler,
    conditions_gate: conditions::Gate,
    /// Told when the agent stops, for the runner: a trial stopped with it
    /// is cancelled, not failed.
    stopping: tokio::sync::watch::Sender<bool>,
    refused: Refused,
    /// The state machine's clock starts here.
    clock: Instant,
}

/// The loop's timers.
struct Ticks {
    telemetry: Interval,
    /// Samples of the co-measurements under way.
    co: Interval,
    /// A Hello that got no Welcome (lost, rate-limited, or answered by a
    /// coordinator that restarted meanwhile) is sent again.
    hello_retry: Interval,
    request_again: Interval,
    spool_retry: Interval,
}

impl Ticks {
    fn new(config: &AgentConfig) -> Self {
        let every = |period, missed| {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(missed);
            tick
        };
        Ticks {
            telemetry: every(config.telemetry_interval, MissedTickBehavior::Skip),
            co: every(config.sample_interval, MissedTickBehavior::Skip),
            hello_retry: every(HELLO_RETRY, MissedTickBehavior::Delay),
            request_again: every(REQUEST_AGAIN, MissedTickBehavior::Delay),
            spool_retry: every(SPOOL_RETRY, MissedTickBehavior::Delay),
        }
    }
}

impl<'c> Agent<'c> {
    /// Everything the agent runs with, from `config`: its CPUs, its energy
    /// source, the runner, its keys and trust, the state machine with the
    /// results restored from the state directory, and the connection.
    fn start(config: &'c AgentConfig) -> Result<Self, AgentError> {
        tunefleet_common::topic::validate_agent_id(&config.name)?;
        let wrapper = match &config.wrapper {
            Some(w) => w.clone(),
            None => std::env::current_exe().map_err(AgentError::WrapperExe)?,
        };
        let instance = tunefleet_common::auth::next_instance(
            config.state_dir.as_ref().map(|d| d.join(auth::INSTANCE_FILE)).as_deref(),
        )?;
        let cpus = cpus::agent_cpus(config.cpus.as_ref());
        let selection = energy::select(&config.energy_roots, config.energy_model);
        // The GPUs it gives trials (none where NVML is absent or not built in).
        let gpus = energy::gpu::probe(config.energy_roots.nvml_lib.as_deref()).devices();
        let info = caps::agent_info(caps::CapsInput {
            agent: config.name.clone(),
            instance,
            slots: config.slots,
            lookahead: config.lookahead.unwrap_or(config.slots.saturating_mul(AUTO_LOOKAHEAD_PER_SLOT)),
            cpus: cpus.clone(),
            energy: selection.found.clone(),
            tags: config.tags.clone(),
            gpus,
        });
        tracing::info!(agent = %config.name, instance, slots = config.slots, gpus = info.gpus.len(), counters = ?info.counters, "agent starting");
        let trials = foreign::TrialRegistry::default();
        let registry = energy::Registry::new(Arc::clone(&selection.source), config.energy_model)
            .with_nvml(config.energy_roots.nvml_lib.clone());
        let (stopping, stopping_rx) = tokio::sync::watch::channel(false);
        let mut runner = runner_config(config, wrapper, registry.clone(), &cpus, &info.gpus, trials.clone());
        runner.agent_stopping = Some(stopping_rx);
        let proc_root = std::path::Path::new("/proc");
        let telemetry = telemetry::TelemetrySampler::new(proc_root, selection.source.as_ref(), config.energy_model)
            .with_cpus(cpus.clone())
            .with_trials(trials)
            .with_conditions(conditions::ConditionsReader::new(config.conditions.clone()));
        let conditions_gate = conditions::Gate::new(conditions::Policy {
            min_battery: config.conditions.min_battery,
            battery_energy: selection.source.kind() == tunefleet_common::measurement::EnergySourceKind::Battery,
        });
        let pending = config.state_dir.as_deref().map(PendingResults::open).transpose()?;
        let agent_auth = agent_auth(config)?;
        let gpus = info.gpus.clone();
        let mut state = AgentState::new(info, cpus.clone(), config.max_trials);
        if config.lookahead.is_none() {
            state = state.with_auto_lookahead(config.slots);
        }
        let clock = Instant::now();
        for result in pending.iter().flat_map(PendingResults::load) {
            tracing::info!(trial = %result.trial, "restored an unacknowledged result");
            state.restore_unacked(result);
        }
        let (transport, inbound) = Transport::start(TransportConfig {
            broker: config.broker.clone(),
            more_brokers: config.more_brokers.clone(),
            agent: config.name.clone(),
            keepalive: config.keepalive,
            topics: config.topics.clone(),
            instance,
            security: config.security.clone(),
            identity: Some(agent_auth.identity()),
        })?;
        let (done_tx, done_rx) = mpsc::channel(64);
        let (progress_tx, progress_rx) = mpsc::channel(1024);
        let (exited_tx, exited_rx) = mpsc::channel(64);
        let exec = Executor {
            transport,
            auth: agent_auth,
            parked: 0,
            runner: Arc::new(runner),
            pending,
            trials: HashMap::new(),
            done_tx,
            progress_tx,
            exited_tx,
            publish_failures: 0,
            co: comeasure::CoMeter::new(registry, PathBuf::from("/proc"), cpus, config.sample_interval).with_gpus(gpus),
            unsaved: Vec::new(),
            spool_problem: None,
            spool_changed: false,
        };
        let refused = Refused::default();
        Ok(Agent {
            config,
            state,
            exec,
            inbound,
            done_rx,
            progress_rx,
            exited_rx,
            telemetry,
            conditions_gate,
            stopping,
            refused,
            clock,
        })
    }

    /// The main loop, until `shutdown` completes, `--max-trials` or
    /// `--exit-when-idle` says so (`Ok`), or the agent cannot go on.
    async fn serve(&mut self, mut shutdown: Pin<&mut impl Future<Output = ()>>) -> Result<(), AgentError> {
        let config = self.config;
        let mut ticks = Ticks::new(config);
        let mut idle_since = Instant::now();
        let far = Duration::from_secs(365 * 86_400);
        loop {
            let idle_at = idle_since + config.exit_when_idle.unwrap_or(far);
            let idle = config.exit_when_idle.is_some() && self.state.running().next().is_none();
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("shutdown requested");
                    return Ok(());
                }
                event = self.inbound.recv() => match event {
                    Some(event) => {
                        let was_running = self.state.running().count();
                        self.state.set_clock(self.micros());
                        let actions = self.inbound_actions(event);
                        if actions.iter().any(|a| matches!(a, Action::Hello(_))) {
                            ticks.hello_retry.reset();
                        }
                        self.exec.apply(actions);
                        if self.state.running().count() != was_running {
                            idle_since = Instant::now();
                        }
                        // Saying Hello again cannot help: stop, saying why.
                        if let Some(why) = self.refused.fatal.take() {
                            return Err(AgentError::Refused(why));
                        }
                    }
                    None => return Err(AgentError::TransportClosed),
                },
                Some(first) = self.done_rx.recv() => {
                    self.state.set_clock(self.micros());
                    self.on_trial_done(first);
                    idle_since = Instant::now();
                    if self.state.max_trials_done() {
                        tracing::info!("--max-trials reached");
                        return Ok(());
                    }
                }
                Some((trial, epoch)) = self.progress_rx.recv() => self.on_progress(trial, epoch),
                Some(trial) = self.exited_rx.recv() => {
                    self.state.set_clock(self.micros());
                    self.exec.apply(self.state.on_exited(trial));
                }
                _ = ticks.hello_retry.tick() => {
                    if self.exec.transport.is_connected() {
                        self.exec.apply(self.state.hello_again());
                    }
                }
                _ = ticks.co.tick(), if !self.exec.co.is_idle() => self.exec.co.sample(),
                _ = ticks.spool_retry.tick(), if self.exec.spool_problem.is_some() => self.retry_spool(),
                _ = ticks.request_again.tick() => {
                    if self.exec.transport.is_connected() {
                        self.state.set_clock(self.micros());
                        self.exec.apply(self.state.request_again());
                    }
                }
                _ = ticks.telemetry.tick() => self.sample_telemetry(),
                () = tokio::time::sleep_until(idle_at), if idle => {
                    tracing::info!("idle for the --exit-when-idle period");
                    // A job that never got in failed: its exit status says so.
                    if !self.exec.auth.ever_welcomed() {
                        return Err(AgentError::Refused(self.refused.why_never_admitted()));
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Drain: refuse new work, cancel what runs, publish results, wait for
    /// acks (only while connected: unacked results stay in the state dir),
    /// all within the grace period; then the offline status, and the
    /// connection closed. `transport_open`: the loop did not stop on an error.
    async fn drain(mut self, mut transport_open: bool) {
        let deadline = Instant::now() + self.config.grace;
        // A trial the SIGTERM that stops the agent stopped too is cancelled.
        self.stopping.send_replace(true);
        self.exec.apply(self.state.begin_drain());
        while self.state.running().next().is_some()
            || (self.state.unacked_count() > 0 && self.exec.transport.is_connected())
        {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(
                        running = self.state.running().count(),
                        unacked = self.state.unacked_count(),
                        "grace period over; stopping anyway"
                    );
                    break;
                }
                Some(first) = self.done_rx.recv() => self.on_trial_done(first),
                event = self.inbound.recv(), if transport_open => match event {
                    Some(event) => {
                        let actions = self.inbound_actions(event);
                        self.exec.apply(actions);
                    }
                    None => transport_open = false,
                },
                Some((trial, epoch)) = self.progress_rx.recv() => self.on_progress(trial, epoch),
            }
        }
        for handle in self.exec.trials.values() {
            handle.cancel();
        }
        self.exec.apply(vec![Action::Publish(self.state.status(false))]);
        if !self.exec.unsaved.is_empty() {
            tracing::error!(
                results = self.exec.unsaved.len(),
                "stopping with results the coordinator has not acknowledged and the state directory could not \
                 store: they are lost"
            );
        }
        let remaining = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(500));
        self.exec.transport.disconnect(remaining).await;
        tracing::info!(
            undecodable = self.refused.undecodable,
            unauthenticated = self.refused.unauthenticated,
            statuses_ignored = self.refused.statuses,
            disallowed = self.refused.disallowed,
            parked = self.exec.parked,
            "agent stopped"
        );
    }

    /// Microseconds since the agent started, the state machine's clock.
    fn micros(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// What the state machine does with `event`, decoded by [`inbound`].
    fn inbound_actions(&mut self, event: Delivery) -> Vec<Action> {
        on_inbound(&mut self.state, &mut self.exec.auth, &self.config.allow, event, &mut self.refused)
    }

    fn on_progress(&mut self, trial: TrialRef, epoch: runner::EpochReport) {
        self.exec.apply(self.state.progress(trial, epoch).into_iter().collect());
    }

    /// A trial ended, in the main loop or in the drain alike, and with it
    /// every other trial whose end is already queued: their progress still
    /// queued is published first (it was sent before the end), their
    /// handles go, and the state machine takes the results (complete as
    /// the runner assembled them), carried out together so that they are
    /// kept on disk with one sync (group commit) before any is published.
    fn on_trial_done(&mut self, first: (TrialRef, Measurement)) {
        let mut done = vec![first];
        while let Ok(more) = self.done_rx.try_recv() {
            done.push(more);
        }
        while let Ok((trial, epoch)) = self.progress_rx.try_recv() {
            self.on_progress(trial, epoch);
        }
        let mut actions = Vec::new();
        for (trial, measurement) in done {
            self.exec.trials.remove(&trial);
            actions.extend(self.state.on_finished(trial, measurement));
        }
        self.exec.apply(actions);
        if let Some(problem) = self.exec.spool_change() {
            self.exec.apply(self.state.on_spool(problem));
        }
    }

    /// The state directory tried again while it cannot store results; the
    /// state machine hears when it can.
    fn retry_spool(&mut self) {
        self.exec.retry_spool();
        if let Some(problem) = self.exec.spool_change() {
            self.state.set_clock(self.micros());
            self.exec.apply(self.state.on_spool(problem));
        }
    }

    /// Tells every running trial `control`.
    fn tell_running(&self, control: &runner::Control) {
        for trial in self.state.running() {
            if let Some(handle) = self.exec.trials.get(trial) {
                handle.send(control.clone());
            }
        }
    }

    /// One telemetry sample: the load from outside the trials and the
    /// device's bad conditions told to each running trial (its measurement
    /// says so), the conditions judged, the sample published.
    fn sample_telemetry(&mut self) {
        let sample = self.telemetry.sample(u32::try_from(self.state.running().count()).unwrap_or(u32::MAX));
        if let Some(f) = sample.foreign_cpu {
            self.tell_running(&runner::Control::ForeignLoad(f));
        }
        if let Some(reasons) = self.conditions_gate.check(&sample.conditions) {
            if !reasons.is_empty() {
                self.tell_running(&runner::Control::Conditions(reasons.clone()));
            }
            self.exec.apply(self.state.on_conditions(reasons));
        }
        if self.exec.transport.is_connected() {
            self.exec.publish(&AgentMessage::Telemetry(sample));
        }
    }
}

/// How this agent runs trials: through `wrapper`, with the energy source
/// selected, on `cpus` (and `gpus`), its trials' processes registered in `trials`.
fn runner_config(
    config: &AgentConfig,
    wrapper: PathBuf,
    energy: energy::Registry,
    cpus: &[u32],
    gpus: &[tunefleet_common::message::GpuDevice],
    trials: foreign::TrialRegistry,
) -> RunnerConfig {
    let mut runner = RunnerConfig::new(wrapper);
    runner.cgroup = cgroup::CgroupV2::detect(&config.cgroup_root);
    runner.energy = energy;
    runner.sample_interval = config.sample_interval;
    runner.machine_cpus = u32::try_from(cpus.len()).unwrap_or(u32::MAX).max(1);
    runner.trials = trials;
    runner.gpus_offered = !gpus.is_empty();
    runner.shared_machine = config.slots > 1;
    runner.interference_threshold = config.interference_threshold;
    runner
}

/// This agent's key (kept in the state directory, with the name it is
/// known under) and whom it trusts as its coordinator.
fn agent_auth(config: &AgentConfig) -> Result<auth::AgentAuth, AgentError> {
    let identity = auth::load_identity(config.state_dir.as_deref())?;
    // The name this key is known under, for a later start without --name.
    if let Some(dir) = config.state_dir.as_deref() {
        let file = dir.join(auth::NAME_FILE);
        if !file.exists() {
            if let Err(e) = std::fs::write(&file, format!("{}\n", config.name)) {
                tracing::warn!(file = %file.display(), error = %e, "cannot keep this agent's name");
            }
        }
    }
    let trust = auth::Trust {
        given: config.coordinator_key,
        token: config.join.clone(),
        first_use: config.trust_first_coordinator,
        file: config.state_dir.as_ref().map(|d| d.join(auth::COORDINATOR_KEY_FILE)),
    };
    if trust.first_use && trust.given.is_none() && trust.token.is_none() {
        tracing::warn!(
            "--trust-first-coordinator: this agent obeys whichever coordinator answers first; any broker user can be \
             it (use a join token outside a lab)"
        );
    }
    let agent_auth = auth::AgentAuth::new(&config.name, identity, trust)?;
    tracing::info!(key = %tunefleet_common::auth::short_key(&agent_auth.public_key()), "this agent's public key");
    Ok(agent_auth)
}
