//! The engine: one loop that turns broker events into scheduler decisions,
//! store writes and messages to agents.
//!
//! Each turn takes every event that is waiting (up to a batch), applies them
//! in one store transaction, commits, and only then sends assignments and
//! result acknowledgements: an agent forgets a result only once it is on disk.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::message::{
    AgentMessage, Assignment, Cancel, CoordinatorMessage, ResultAck, SessionToken, TrialResult, Welcome,
};

use crate::progress::Progress;
use crate::sched::{Effect, Restored, ResultKind, Scheduler, StudyPolicy, Verdict};
use crate::search::{self, TrialPlan};
use crate::store::{Batch, RecordOutcome, Store, StoreError, TrialState};
use crate::study::{Direction, Study};
use crate::transport::{Inbound, Outbox};

/// Extra time a lease gets beyond the trial timeout (start-up, result delivery).
pub const LEASE_GRACE: Duration = Duration::from_secs(30);
/// Most events applied in one store transaction.
const MAX_BATCH: usize = 2048;

/// Why the engine stopped early.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the broker connection closed for good")]
    TransportClosed,
}

/// Counters a user (or a test) can read after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub rejected_messages: u64,
    /// Messages with a session token the coordinator did not give that agent (or that expired).
    pub bad_tokens: u64,
    pub unknown_results: u64,
    pub duplicate_results: u64,
    pub superseded_results: u64,
    pub requeued: u64,
    pub assignments: u64,
}

/// The best result so far, for the progress display and the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Best {
    pub trial: u64,
    pub value: f64,
    pub agent: String,
}

/// What a finished study looked like.
#[derive(Debug, Clone)]
pub struct Summary {
    pub study: String,
    pub total: u64,
    pub done: u64,
    pub failed: u64,
    pub best: Option<Best>,
    pub elapsed: Duration,
    pub stats: EngineStats,
    pub agents_seen: usize,
}

struct ActiveStudy {
    study: Study,
    plans: Vec<TrialPlan>,
    best: Option<Best>,
    started: Instant,
}

/// The coordinator's state while it runs.
pub struct Engine {
    store: Store,
    sched: Scheduler,
    outbox: Outbox,
    studies: HashMap<String, ActiveStudy>,
    stats: EngineStats,
    epoch: Instant,
    progress: Progress,
    agents_seen: std::collections::HashSet<String>,
    /// Queue each stored result's points for InfluxDB (see [`crate::sink`]).
    influx: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Engine {
    pub fn new(store: Store, outbox: Outbox, progress: Progress) -> Self {
        Engine {
            store,
            sched: Scheduler::new(),
            outbox,
            studies: HashMap::new(),
            stats: EngineStats::default(),
            epoch: Instant::now(),
            progress,
            agents_seen: Default::default(),
            influx: false,
        }
    }

    /// Queues the points of every stored result in the store's InfluxDB
    /// outbox, in the same transaction as the result.
    pub fn with_influx(mut self, on: bool) -> Self {
        self.influx = on;
        self
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Creates the study in the store, or resumes it if it is there already
    /// with the same configuration, and starts scheduling its trials.
    pub fn start_study(&mut self, study: Study) -> Result<(), EngineError> {
        let plans = search::plan(&study);
        {
            let mut batch = self.store.batch()?;
            batch.create_study(&study, &plans)?;
            batch.commit()?;
        }
        let rows = self.store.trials(&study.name)?;
        let mut states = vec![Restored::Pending { last_attempt: 0, failures: 0 }; plans.len()];
        let mut best: Option<Best> = None;
        for row in rows {
            let Some(slot) = states.get_mut(row.trial as usize) else { continue };
            *slot = match row.state {
                TrialState::Pending => Restored::Pending { last_attempt: row.attempts, failures: row.failures },
                TrialState::Running => Restored::Running {
                    agent: row.agent.clone().unwrap_or_default(),
                    attempt: row.attempts,
                    failures: row.failures,
                },
                TrialState::Done => Restored::Done,
                TrialState::Failed => Restored::Failed,
            };
            if let (Some(value), Some(agent)) = (row.objective, row.agent.clone()) {
                if best.as_ref().is_none_or(|b| study.objective.direction.better(value, b.value)) {
                    best = Some(Best { trial: row.trial, value, agent });
                }
            }
        }
        let policy = StudyPolicy {
            name: study.name.clone(),
            selector: study.selector.clone(),
            max_attempts: study.max_attempts,
            lease_ms: study.timeout_ms() + LEASE_GRACE.as_millis() as u64,
        };
        let now = self.now_ms();
        self.sched.add_study(policy, states, now);
        if let Some(c) = self.sched.counts(&study.name) {
            self.progress.start(&study.name, c.total, c.done + c.failed);
        }
        self.studies.insert(study.name.clone(), ActiveStudy { study, plans, best, started: Instant::now() });
        Ok(())
    }

    /// Runs until `study` has finished, the transport closes, or `shutdown` fires.
    pub async fn run_study(
        mut self,
        study: &str,
        mut inbound: mpsc::Receiver<Inbound>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Summary, EngineError> {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events = Vec::with_capacity(MAX_BATCH);
        loop {
            if self.sched.counts(study).is_none_or(|c| c.finished()) {
                break;
            }
            let mut tick = false;
            tokio::select! {
                biased;
                _ = &mut shutdown => {
                    tracing::info!("shutting down: no more assignments");
                    break;
                }
                ev = inbound.recv() => match ev {
                    Some(ev) => {
                        events.push(ev);
                        while events.len() < MAX_BATCH {
                            match inbound.try_recv() {
                                Ok(ev) => events.push(ev),
                                Err(_) => break,
                            }
                        }
                    }
                    None => return Err(EngineError::TransportClosed),
                },
                _ = ticker.tick() => tick = true,
            }
            self.turn(&mut events, tick).await?;
        }
        let summary = self.summary(study);
        {
            let mut batch = self.store.batch()?;
            if summary.done + summary.failed == summary.total {
                batch.finish_study(study, unix_ms())?;
            }
            batch.commit()?;
        }
        self.progress.finish();
        if let Err(e) = self.outbox.close().await {
            tracing::debug!(error = %e, "closing the MQTT connection");
        }
        Ok(summary)
    }

    fn summary(&self, study: &str) -> Summary {
        let c = self.sched.counts(study).unwrap_or_default();
        let active = self.studies.get(study);
        Summary {
            study: study.to_string(),
            total: c.total,
            done: c.done,
            failed: c.failed,
            best: active.and_then(|a| a.best.clone()),
            elapsed: active.map(|a| a.started.elapsed()).unwrap_or_default(),
            stats: self.stats.clone(),
            agents_seen: self.agents_seen.len(),
        }
    }

    /// One turn: apply `events` in one transaction, commit, then send.
    async fn turn(&mut self, events: &mut Vec<Inbound>, tick: bool) -> Result<(), EngineError> {
        let now = self.now_ms();
        let mut out: Vec<(String, CoordinatorMessage)> = Vec::new();
        {
            let mut batch = self.store.batch()?;
            let mut effects = Vec::new();
            for ev in events.drain(..) {
                handle(
                    &mut Ctx {
                        sched: &mut self.sched,
                        batch: &mut batch,
                        studies: &mut self.studies,
                        stats: &mut self.stats,
                        agents_seen: &mut self.agents_seen,
                        out: &mut out,
                        effects: &mut effects,
                        influx: self.influx,
                    },
                    ev,
                )?;
            }
            if tick {
                effects.extend(self.sched.expire(now));
            }
            effects.extend(self.sched.assign(now));
            for effect in effects {
                apply(&mut batch, &self.studies, &mut self.stats, &mut out, effect)?;
            }
            batch.commit()?;
        }
        for (agent, msg) in out {
            if let Err(e) = self.outbox.send(&agent, &msg).await {
                tracing::warn!(agent = %agent, error = %e, "could not send");
            }
        }
        for (name, active) in &self.studies {
            if let Some(c) = self.sched.counts(name) {
                let best = active.best.as_ref().map(|b| (active.study.objective.metric.as_str(), b.value, b.trial));
                self.progress.update(c.done + c.failed, c.running, self.sched.live_agents(), best);
            }
        }
        Ok(())
    }
}

struct Ctx<'a, 'b> {
    sched: &'a mut Scheduler,
    batch: &'a mut Batch<'b>,
    studies: &'a mut HashMap<String, ActiveStudy>,
    stats: &'a mut EngineStats,
    agents_seen: &'a mut std::collections::HashSet<String>,
    out: &'a mut Vec<(String, CoordinatorMessage)>,
    effects: &'a mut Vec<Effect>,
    influx: bool,
}

fn handle(cx: &mut Ctx<'_, '_>, ev: Inbound) -> Result<(), EngineError> {
    let (agent, msg) = match ev {
        Inbound::Connected => {
            tracing::info!("connected to the broker");
            return Ok(());
        }
        Inbound::Disconnected(why) => {
            tracing::warn!(error = %why, "lost the broker; reconnecting");
            return Ok(());
        }
        Inbound::Rejected { topic, reason } => {
            cx.stats.rejected_messages += 1;
            let n = cx.stats.rejected_messages;
            if n <= 10 || n.is_power_of_two() {
                tracing::warn!(topic = %topic, reason = %reason, rejected = n, "rejected a message");
            }
            return Ok(());
        }
        Inbound::Agent { agent, msg } => (agent, *msg),
    };
    let now = unix_ms();
    if let Some(token) = session_token(&msg) {
        if !cx.sched.token_ok(&agent, token) {
            cx.stats.bad_tokens += 1;
            let n = cx.stats.bad_tokens;
            if n <= 10 || n.is_power_of_two() {
                tracing::warn!(agent = %agent, refused = n, "message with an unknown or expired session token refused");
            }
            return Ok(());
        }
    }
    match msg {
        AgentMessage::Hello(info) => {
            tracing::info!(agent = %agent, arch = %info.arch, cores = info.cores, slots = info.slots, "agent announced");
            cx.batch.upsert_agent(&info, now)?;
            cx.agents_seen.insert(agent.clone());
            let token: SessionToken = rand::random();
            let instance = info.instance;
            cx.effects.extend(cx.sched.hello(info, token));
            cx.out.push((agent, CoordinatorMessage::Welcome(Welcome { instance, token })));
        }
        AgentMessage::Status(status) => {
            if !status.online {
                tracing::info!(agent = %agent, "agent offline");
            }
            cx.batch.set_agent_online(&agent, status.online, now)?;
            cx.effects.extend(cx.sched.status(&agent, &status));
        }
        AgentMessage::Request(req) => cx.effects.extend(cx.sched.request(&agent, &req)),
        AgentMessage::Progress(p) => {
            if cx.sched.is_live(&agent, &p.trial) {
                cx.batch.record_progress(&p)?;
            }
        }
        AgentMessage::Refuse(r) => cx.effects.extend(cx.sched.refuse(&agent, &r.trial, &r.reason)),
        AgentMessage::Result(result) => on_result(cx, agent, result, now)?,
        // Telemetry is for offloading decisions; not used by the engine yet.
        AgentMessage::Telemetry(_) => {}
    }
    Ok(())
}

/// The session token a message carries, for the messages that need one.
fn session_token(msg: &AgentMessage) -> Option<SessionToken> {
    match msg {
        AgentMessage::Hello(_) | AgentMessage::Status(_) | AgentMessage::Telemetry(_) => None,
        AgentMessage::Request(r) => Some(r.token),
        AgentMessage::Progress(p) => Some(p.token),
        AgentMessage::Result(r) => Some(r.token),
        AgentMessage::Refuse(r) => Some(r.token),
    }
}

fn on_result(cx: &mut Ctx<'_, '_>, agent: String, result: TrialResult, now: u64) -> Result<(), EngineError> {
    let TrialResult { trial, measurement, .. } = result;
    let kind = match &measurement.exit {
        ExitOutcome::SpawnFailed(why) => ResultKind::Retry(format!("could not start: {why}")),
        ExitOutcome::Cancelled => ResultKind::Retry("cancelled".into()),
        _ => ResultKind::Complete { success: measurement.exit.success() },
    };
    let (verdict, effects) = cx.sched.result(&agent, &trial, kind);
    cx.effects.extend(effects);
    let active = cx.studies.get_mut(&trial.study);
    match verdict {
        Verdict::Unknown => {
            cx.stats.unknown_results += 1;
            tracing::warn!(agent = %agent, trial = %trial, "result for no attempt this agent holds: refused");
            return Ok(());
        }
        Verdict::Retried => {
            tracing::info!(agent = %agent, trial = %trial, exit = ?measurement.exit, "attempt ended without a result");
            cx.batch.end_attempt(&trial, &agent, &crate::store::exit_text(&measurement.exit), now)?;
        }
        Verdict::Accepted | Verdict::Duplicate | Verdict::Superseded => {
            let objective = active.as_ref().and_then(|a| {
                measurement.exit.success().then(|| measurement.objective_value(&a.study.objective.metric)).flatten()
            });
            let stored = cx.batch.record_result(&trial, &agent, &measurement, objective, now)?;
            if cx.influx && stored == RecordOutcome::Stored {
                let points = crate::sink::trial_points(&trial, &agent, &measurement, objective);
                cx.batch.enqueue_points(&points, now)?;
            }
            match verdict {
                Verdict::Duplicate => cx.stats.duplicate_results += 1,
                Verdict::Superseded => cx.stats.superseded_results += 1,
                _ => {
                    if let (Some(a), Some(v)) = (active, objective) {
                        let dir: Direction = a.study.objective.direction;
                        if a.best.as_ref().is_none_or(|b| dir.better(v, b.value)) {
                            a.best = Some(Best { trial: trial.trial, value: v, agent: agent.clone() });
                        }
                    }
                }
            }
        }
    }
    cx.out.push((agent, CoordinatorMessage::Ack(ResultAck { trial })));
    Ok(())
}

fn apply(
    batch: &mut Batch<'_>,
    studies: &HashMap<String, ActiveStudy>,
    stats: &mut EngineStats,
    out: &mut Vec<(String, CoordinatorMessage)>,
    effect: Effect,
) -> Result<(), EngineError> {
    let now = unix_ms();
    match effect {
        Effect::Assign { agent, trial, request_seq } => {
            let Some(active) = studies.get(&trial.study) else { return Ok(()) };
            let Some(plan) = active.plans.get(trial.trial as usize) else { return Ok(()) };
            match search::render(&active.study, plan, &trial) {
                Ok(spec) => {
                    batch.record_assignment(&trial, &agent, now)?;
                    stats.assignments += 1;
                    out.push((agent, CoordinatorMessage::Assign(Assignment { trial, request_seq, spec })));
                }
                Err(e) => {
                    // Validated at load time, so this is a bug; fail the trial rather than loop.
                    tracing::error!(trial = %trial, error = %e, "command template does not render");
                    batch.fail_trial(&trial.study, trial.trial, &e.to_string())?;
                }
            }
        }
        Effect::Cancel { agent, trial, reason } => {
            tracing::info!(agent = %agent, trial = %trial, reason = %reason, "cancelling");
            out.push((agent, CoordinatorMessage::Cancel(Cancel { trial, reason })));
        }
        Effect::Requeued { trial, reason } => {
            stats.requeued += 1;
            tracing::info!(trial = %trial, reason = %reason, "trial requeued");
            batch.requeue(&trial, &reason)?;
        }
        Effect::Failed { trial, reason } => {
            tracing::warn!(trial = %trial, reason = %reason, "trial failed");
            batch.fail_trial(&trial.study, trial.trial, &reason)?;
        }
    }
    Ok(())
}
