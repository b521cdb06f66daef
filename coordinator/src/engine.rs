//! The engine: one loop that turns broker events into scheduler decisions,
//! store writes and messages to agents.
//!
//! Each turn takes every event that is waiting (up to a batch), applies them
//! in one store transaction, commits, and only then sends assignments and
//! result acknowledgements: an agent forgets a result only once it is on disk.
//!
//! Every frame is authenticated first ([`crate::auth`]); every message that
//! passes is validated before it reaches the scheduler or the store
//! ([`crate::validate`]). Bad input is counted, logged at a bounded rate and
//! answered where the agent must act (a refused result is parked by the
//! agent); it never ends the run. Each message is handled inside a
//! savepoint of its own: a store error while handling it undoes only its
//! writes (counted, logged, a result answered `Refused` so the agent parks
//! it) and the turn goes on with the next.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tunefleet_common::auth::{self, Signed, UpFrame, Will};
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::message::{
    AckOutcome, AgentMessage, AgentStatus, Assignment, Cancel, CoordinatorMessage, ResultAck, TrialRef, TrialResult,
};
use tunefleet_common::topic::AgentTopic;

use crate::auth::{Admission, HelloRefusal, Sessions, WillCheck};
use crate::progress::Progress;
use crate::sched::{Effect, Restored, ResultKind, Scheduler, StudyPolicy, Verdict};
use crate::search::{self, Search, TrialPlan};
use crate::store::{Batch, RecordOutcome, Store, StoreError, TrialState};
use crate::study::{Direction, Study};
use crate::transport::{Inbound, Outbox};

/// Extra time a lease gets beyond the trial timeout (start-up, result delivery).
pub const LEASE_GRACE: Duration = Duration::from_secs(30);
/// Most events applied in one store transaction.
const MAX_BATCH: usize = 2048;
/// How long a finishing coordinator waits for its agents to confirm that
/// every acknowledgement it sent has arrived.
pub const SYNC_GRACE: Duration = Duration::from_secs(5);

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
    /// Payloads that do not decode or do not belong on their topic.
    pub rejected_messages: u64,
    /// Sealed frames that fail authentication: no session, another
    /// session's token, a bad MAC, a replayed sequence number.
    pub bad_tokens: u64,
    /// Hellos refused: bad signature, wrong name or instance, replayed,
    /// changed key, too many agents.
    pub refused_hellos: u64,
    /// Hellos dropped by the rate limit.
    pub rate_limited_hellos: u64,
    /// Last Wills that match no session of the agent (forged or replayed).
    pub forged_wills: u64,
    /// Authenticated messages with a field out of bounds (validate.rs).
    pub invalid_messages: u64,
    /// Messages (or the bookkeeping after one) whose store writes failed:
    /// rolled back alone, the turn went on.
    pub store_errors: u64,
    /// Checkpoints outside their study's `resume_prefix`: not kept.
    pub refused_checkpoints: u64,
    /// Results the coordinator cannot place, answered so the agent parks them.
    pub unknown_results: u64,
    /// Results, progress, refusals and running attempts of another study of
    /// a name this coordinator runs (another study id: another store).
    /// Results are refused (the agent parks them), the rest is ignored.
    pub other_study_refs: u64,
    pub duplicate_results: u64,
    pub superseded_results: u64,
    pub requeued: u64,
    pub assignments: u64,
    /// Trials stopped early (ASHA).
    pub stopped: u64,
    /// Attempts moved off an overloaded agent, or measured again because
    /// their measurement was disturbed.
    pub moved: u64,
    /// Trials that skipped probing for a configuration reused from jobs
    /// that profiled alike, and reuses that then ran slower than promised.
    pub reused: u64,
    pub reuse_worse: u64,
    /// Window profiles refused as malformed (the trial probes as usual).
    pub bad_profiles: u64,
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
    /// Stopped early by ASHA: neither done nor failed.
    pub stopped: u64,
    pub best: Option<Best>,
    pub elapsed: Duration,
    pub stats: EngineStats,
    pub agents_seen: usize,
}

struct ActiveStudy {
    study: Study,
    /// Asked for trials as agents have room, told every result.
    search: Search,
    /// The trials created so far, by id.
    plans: Vec<TrialPlan>,
    /// Early stopping on the epochs trials report, when the study asks for it.
    asha: Option<search::asha::Asha>,
    /// Objective values of successful trials, for `[stability]`.
    values: HashMap<u64, f64>,
    /// The last checkpoint each trial's live attempt reported (epoch, reference).
    checkpoints: HashMap<u64, (u32, String)>,
    /// With `[stability]`: the trials of each configuration, by its JSON.
    runs: HashMap<String, Vec<u64>>,
    /// What every trial of a pipelined study probes (computed once).
    probe: Option<tunefleet_common::message::ProbePlan>,
    /// Cancelled from the control socket: no more trials.
    cancelled: bool,
    /// Attempts whose first window was decided on (once each).
    decided: std::collections::HashSet<(u64, u32)>,
    /// Trials running a reused configuration: it, and the time relative
    /// to the first window its cluster promised.
    reused: HashMap<u64, (tunefleet_common::message::SystemParams, f64)>,
    best: Option<Best>,
    started: Instant,
}

impl ActiveStudy {
    fn new(study: Study, search: Search, plans: Vec<TrialPlan>, values: HashMap<u64, f64>, best: Option<Best>) -> Self {
        let asha =
            study.early_stopping.map(|e| search::asha::Asha::new(e.reduction, e.grace, study.objective.direction));
        let probe = search::probe_plan(&study);
        let mut active = ActiveStudy {
            study,
            search,
            plans: Vec::new(),
            asha,
            values,
            checkpoints: HashMap::new(),
            runs: HashMap::new(),
            probe,
            cancelled: false,
            decided: Default::default(),
            reused: HashMap::new(),
            best,
            started: Instant::now(),
        };
        active.remember(plans);
        active
    }

    /// Keeps `trials` as created (and indexes them by configuration when
    /// the study repeats until stable).
    fn remember(&mut self, trials: Vec<TrialPlan>) {
        if self.study.stability.is_some() {
            for t in &trials {
                self.runs.entry(crate::store::params_json(&t.params)).or_default().push(t.trial);
            }
        }
        self.plans.extend(trials);
    }

    /// Creates `trials` in the store and the scheduler, and remembers them.
    fn create(
        &mut self,
        sched: &mut Scheduler,
        batch: &mut Batch<'_>,
        trials: Vec<TrialPlan>,
    ) -> Result<(), EngineError> {
        batch.add_trials(&self.study.name, &trials)?;
        self.adopt(sched, trials);
        Ok(())
    }

    /// Adds `trials`, already in the store, to the scheduler, and remembers them.
    fn adopt(&mut self, sched: &mut Scheduler, trials: Vec<TrialPlan>) {
        for t in &trials {
            let id = sched.add_trial(&self.study.name);
            debug_assert_eq!(id, Some(t.trial), "the scheduler and the search number trials alike");
        }
        self.remember(trials);
    }
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
    sessions: Sessions,
    /// Agents asked to confirm delivery ([`CoordinatorMessage::Sync`]) that have not yet.
    unsynced: HashMap<String, u64>,
    /// Agents sent something other than a Sync since this was last cleared.
    sent_to: std::collections::HashSet<String>,
    /// Agents' recent telemetry, for the overload decider.
    telemetry: crate::decide::Telemetry,
    offload: Option<crate::decide::Policy>,
    last_decision_ms: u64,
    /// Profiles, clusters and reuse, loaded from the store with the first study.
    book: Option<crate::reuse::Book>,
    /// Control-socket requests waiting for the next turn.
    requests: Vec<crate::control::Request>,
    /// Starts agents while studies have work (`--launcher`).
    launcher: Option<crate::launch::Launcher>,
    /// When the status was last published again (engine clock).
    status_ms: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Engine {
    pub fn new(store: Store, outbox: Outbox, progress: Progress, sessions: Sessions) -> Self {
        Engine {
            sessions,
            unsynced: HashMap::new(),
            sent_to: Default::default(),
            store,
            sched: Scheduler::new(),
            outbox,
            studies: HashMap::new(),
            stats: EngineStats::default(),
            epoch: Instant::now(),
            progress,
            agents_seen: Default::default(),
            influx: false,
            telemetry: Default::default(),
            offload: None,
            last_decision_ms: 0,
            book: None,
            requests: Vec::new(),
            launcher: None,
            status_ms: 0,
        }
    }

    /// Moves trials off agents the decider finds overloaded ([`crate::decide`]).
    pub fn with_offload(mut self, policy: Option<crate::decide::Policy>) -> Self {
        self.offload = policy;
        self
    }

    /// Starts agents with `launcher` while studies have work.
    pub fn with_launcher(mut self, launcher: Option<crate::launch::Launcher>) -> Self {
        self.launcher = launcher;
        self
    }

    /// Queues the points of every stored result in the store's InfluxDB
    /// outbox, in the same transaction as the result.
    pub fn with_influx(mut self, on: bool) -> Self {
        self.influx = on;
        self
    }

    /// A study file submitted to the service: started (or resumed) beside
    /// the others.
    fn submit(&mut self, text: &str, origin: &str) -> crate::control::Answer {
        use crate::control::Answer;
        let file = match crate::study::parse(text, origin) {
            Ok(s) => s,
            Err(e) => return Answer::Error { message: e.to_string() },
        };
        let studies = file.expand();
        for study in &studies {
            let name = &study.name;
            if self.studies.get(name).is_some_and(|a| !a.cancelled)
                && self.sched.counts(name).is_some_and(|c| !c.finished())
            {
                return Answer::Error { message: format!("study {name} is running already") };
            }
        }
        let mut started = Vec::new();
        for study in studies {
            let name = study.name.clone();
            if let Err(e) = self.start_study(study) {
                return Answer::Error { message: e.to_string() };
            }
            let total = self.sched.counts(&name).map_or(0, |c| c.total);
            tracing::info!(study = %name, "study submitted");
            started.push(format!("study {name} submitted ({total} trials so far)"));
        }
        Answer::Ok { message: started.join("\n") }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Creates the study in the store, or resumes it if it is there already
    /// with the same configuration, and starts scheduling its trials.
    pub fn start_study(&mut self, study: Study) -> Result<(), EngineError> {
        if self.book.is_none() {
            self.book = Some(load_book(&self.store)?);
        }
        let id = {
            let mut batch = self.store.batch()?;
            batch.create_study(&study, &[])?;
            // Drawn the first time the study runs, kept in the store after.
            let id = batch.study_id(&study.name, rand::random())?;
            batch.commit()?;
            id
        };
        let rows = self.store.trials(&study.name)?;
        let plans: Vec<TrialPlan> = rows.iter().map(|r| r.plan()).collect();
        let mut search = Search::new(&study);
        search.resume(&plans);
        let mut states = Vec::with_capacity(rows.len());
        let mut values = HashMap::new();
        let mut best: Option<Best> = None;
        // Trials ASHA stopped: told to the search with their last report below.
        let mut stopped: HashMap<u64, tunefleet_common::params::Params> = HashMap::new();
        for row in rows {
            if row.trial != states.len() as u64 {
                tracing::error!(study = %study.name, trial = row.trial, "trial ids in the store are not dense; later trials ignored");
                break;
            }
            states.push(match row.state {
                TrialState::Pending => Restored::Pending { last_attempt: row.attempts, failures: row.failures },
                TrialState::Running => Restored::Running {
                    agent: row.agent.clone().unwrap_or_default(),
                    attempt: row.attempts,
                    failures: row.failures,
                },
                TrialState::Done => Restored::Done,
                TrialState::Failed => Restored::Failed,
                TrialState::Stopped => {
                    stopped.insert(row.trial, row.params.clone());
                    Restored::Stopped
                }
            });
            if let (Some(value), Some(agent)) = (row.objective, row.agent.clone()) {
                values.insert(row.trial, value);
                search.tell(row.trial, &row.params, value);
                if best.as_ref().is_none_or(|b| study.objective.direction.better(value, b.value)) {
                    best = Some(Best { trial: row.trial, value, agent });
                }
            }
        }
        let policy = StudyPolicy {
            name: study.name.clone(),
            id,
            selector: study.selector.clone(),
            max_attempts: study.max_attempts,
            lease_ms: study.timeout_ms() + LEASE_GRACE.as_millis() as u64,
        };
        let now = self.now_ms();
        self.sched.add_study(policy, states, now);
        self.sched.set_open(&study.name, !search.exhausted());
        if let Some(c) = self.sched.counts(&study.name) {
            self.progress.start(&study.name, search.planned().max(c.total), c.done + c.failed + c.stopped);
        }
        let mut active = ActiveStudy::new(study, search, plans, values, best);
        // What a coordinator that stopped had seen: early stopping's rungs,
        // and the checkpoint each trial's latest attempt reported.
        let mut last_reports: HashMap<u64, (u32, f64)> = HashMap::new();
        for p in self.store.study_progress(&active.study.name)? {
            if let (Some(asha), Some(&value)) = (active.asha.as_mut(), p.metrics.get(&active.study.objective.metric)) {
                let _ = asha.report(p.trial, p.epoch, value);
            }
            if let Some(&value) =
                p.metrics.get(&active.study.objective.metric).filter(|_| stopped.contains_key(&p.trial))
            {
                let last = last_reports.entry(p.trial).or_insert((p.epoch, value));
                if p.epoch >= last.0 {
                    *last = (p.epoch, value);
                }
            }
            // A checkpoint stored before the coordinator checked them (an
            // injected option, a path outside resume_prefix) is not resumed from.
            let usable = |c: &String| usable_checkpoint(&active.study, c).is_ok();
            match p.checkpoint.filter(usable) {
                Some(reference) => {
                    active.checkpoints.insert(p.trial, (p.epoch, reference));
                }
                // A later attempt that started over has no checkpoint yet.
                None if p.epoch <= 1 => {
                    active.checkpoints.remove(&p.trial);
                }
                None => {}
            }
        }
        for (trial, (epoch, value)) in last_reports {
            if let Some(params) = stopped.get(&trial) {
                active.search.tell_pruned(trial, params, epoch, value);
            }
        }
        self.studies.insert(active.study.name.clone(), active);
        Ok(())
    }

    /// Runs until `study` has finished, the transport closes, or `shutdown` fires.
    pub async fn run_study(
        self,
        study: &str,
        inbound: mpsc::Receiver<Inbound>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Summary, EngineError> {
        let mut summaries = self.run_studies(&[study.to_string()], inbound, shutdown).await?;
        summaries.pop().ok_or(EngineError::TransportClosed)
    }

    /// Runs `studies` side by side on the fleet until every one has
    /// finished, the transport closes, or `shutdown` fires; a summary per
    /// study, in order.
    pub async fn run_studies(
        self,
        studies: &[String],
        inbound: mpsc::Receiver<Inbound>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Vec<Summary>, EngineError> {
        self.drive(Some(studies), inbound, None, shutdown).await
    }

    /// Runs as a service (`tunefleet serve`) until `shutdown`: studies
    /// come and go through `requests` (the control socket), side by side
    /// on the fleet; a summary per study it ran.
    pub async fn serve(
        self,
        inbound: mpsc::Receiver<Inbound>,
        requests: mpsc::Receiver<crate::control::Request>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Vec<Summary>, EngineError> {
        self.drive(None, inbound, Some(requests), shutdown).await
    }

    /// The loop of [`Engine::run_studies`] (until `studies` finish) and of
    /// [`Engine::serve`] (`studies` is `None`: until shutdown).
    async fn drive(
        mut self,
        studies: Option<&[String]>,
        mut inbound: mpsc::Receiver<Inbound>,
        mut requests: Option<mpsc::Receiver<crate::control::Request>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Vec<Summary>, EngineError> {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events = Vec::with_capacity(MAX_BATCH);
        let mut announced = std::collections::HashSet::new();
        loop {
            let names: Vec<String> = match studies {
                Some(s) => s.to_vec(),
                None => self.studies.keys().cloned().collect(),
            };
            let finished: Vec<&String> =
                names.iter().filter(|s| self.sched.counts(s).is_none_or(|c| c.finished())).collect();
            for s in &finished {
                if (names.len() > 1 || studies.is_none()) && announced.insert((*s).clone()) {
                    let c = self.sched.counts(s).unwrap_or_default();
                    // Scripts read this line: a campaign's progress per workload.
                    self.progress.note(&format!(
                        "finished: {s}: {}/{} trials done, {} failed, {} stopped ({} of {} studies finished)",
                        c.done,
                        c.total,
                        c.failed,
                        c.stopped,
                        announced.len(),
                        names.len()
                    ));
                    if studies.is_none() {
                        let mut batch = self.store.batch()?;
                        batch.finish_study(s, unix_ms())?;
                        batch.commit()?;
                    }
                }
            }
            if studies.is_some() && finished.len() == names.len() {
                break;
            }
            let mut tick = false;
            tokio::select! {
                biased;
                _ = &mut shutdown => {
                    tracing::info!("shutting down: no more assignments");
                    break;
                }
                r = next_request(&mut requests) => match r {
                    Some(r) => self.requests.push(r),
                    None => requests = None,
                },
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
        self.sync(&mut inbound, SYNC_GRACE).await?;
        let names: Vec<String> = match studies {
            Some(s) => s.to_vec(),
            None => {
                let mut all: Vec<String> = self.studies.keys().cloned().collect();
                all.sort();
                all
            }
        };
        let summaries: Vec<Summary> = names.iter().map(|s| self.summary(s)).collect();
        {
            let mut batch = self.store.batch()?;
            for summary in &summaries {
                // Finished: every trial ended and the search has no more (a
                // study stopped before it made a trial is not finished).
                if self.sched.counts(&summary.study).is_some_and(|c| c.finished()) {
                    batch.finish_study(&summary.study, unix_ms())?;
                }
            }
            batch.commit()?;
        }
        self.progress.finish();
        if let Err(e) = self.outbox.close(SYNC_GRACE).await {
            tracing::warn!(error = %e, "closing the MQTT connection");
        }
        Ok(summaries)
    }

    /// Asks every agent with a session to confirm that all sent before has
    /// arrived (the acknowledgements above all), and waits for the answers
    /// (at most `grace`), handling whatever else comes meanwhile: an agent
    /// sent anything after it confirmed (the ack of a cancelled attempt's
    /// result) is asked again. Agents answer once no trial they were told
    /// to cancel is still running.
    async fn sync(&mut self, inbound: &mut mpsc::Receiver<Inbound>, grace: Duration) -> Result<(), EngineError> {
        let agents: Vec<String> = self.sessions.live_agents().map(str::to_string).collect();
        self.sent_to = agents.into_iter().collect();
        let deadline = tokio::time::Instant::now() + grace;
        let mut events = Vec::new();
        loop {
            // Agents sent anything since their last Sync are asked (again): a
            // newer Sync replaces the one still awaited.
            let again: Vec<String> = self.sent_to.drain().filter(|a| self.sessions.is_live(a)).collect();
            let nonce: u64 = rand::random();
            let msgs: Vec<_> = again.iter().map(|a| (a.clone(), CoordinatorMessage::Sync(nonce))).collect();
            self.unsynced.extend(again.into_iter().map(|a| (a, nonce)));
            self.send(Vec::new(), msgs).await;
            // An agent whose session ended (it went offline) has nothing more to confirm.
            self.unsynced.retain(|a, _| self.sessions.is_live(a));
            if self.unsynced.is_empty() {
                break;
            }
            tokio::select! {
                ev = inbound.recv() => match ev {
                    Some(ev) => events.push(ev),
                    None => break,
                },
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(agents = ?self.unsynced.keys().collect::<Vec<_>>(), "agents did not confirm delivery in time");
                    break;
                }
            }
            self.turn(&mut events, false).await?;
        }
        Ok(())
    }

    /// Publishes Welcomes, then seals and publishes `msgs`.
    async fn send(&mut self, welcomes: Vec<(String, Vec<u8>)>, msgs: Vec<(String, CoordinatorMessage)>) {
        for (agent, payload) in welcomes {
            if let Err(e) = self.outbox.send(&agent, AgentTopic::Welcome, payload).await {
                tracing::warn!(agent = %agent, error = %e, "could not send");
            }
        }
        for (agent, msg) in msgs {
            if !matches!(msg, CoordinatorMessage::Sync(_)) {
                self.sent_to.insert(agent.clone());
            }
            let (kind, payload) = match self.sessions.seal(&agent, &msg) {
                Some(Ok(sealed)) => sealed,
                Some(Err(e)) => {
                    tracing::error!(agent = %agent, error = %e, "cannot seal a message");
                    continue;
                }
                None => {
                    tracing::debug!(agent = %agent, "no session: message not sent");
                    continue;
                }
            };
            if let Err(e) = self.outbox.send(&agent, kind, payload).await {
                tracing::warn!(agent = %agent, error = %e, "could not send");
            }
        }
    }

    fn summary(&self, study: &str) -> Summary {
        let c = self.sched.counts(study).unwrap_or_default();
        let active = self.studies.get(study);
        Summary {
            study: study.to_string(),
            total: c.total,
            done: c.done,
            failed: c.failed,
            stopped: c.stopped,
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
        let mut welcomes: Vec<(String, Vec<u8>)> = Vec::new();
        {
            // Submitted studies start first (each in its own transaction).
            let mut cancels = Vec::new();
            for request in std::mem::take(&mut self.requests) {
                match request.ask {
                    crate::control::Ask::Submit { study, origin } => {
                        let _ = request.reply.send(self.submit(&study, &origin));
                    }
                    crate::control::Ask::Cancel { study } => cancels.push((study, request.reply)),
                }
            }
            let mut batch = self.store.batch()?;
            let mut effects = Vec::new();
            for (study, reply) in cancels {
                let _ = reply.send(cancel(&mut self.sched, &mut self.studies, &study, &mut effects));
            }
            handle_all(
                &mut Ctx {
                    sched: &mut self.sched,
                    batch: &mut batch,
                    studies: &mut self.studies,
                    stats: &mut self.stats,
                    agents_seen: &mut self.agents_seen,
                    out: &mut out,
                    welcomes: &mut welcomes,
                    effects: &mut effects,
                    influx: self.influx,
                    sessions: &mut self.sessions,
                    unsynced: &mut self.unsynced,
                    telemetry: &mut self.telemetry,
                    now_ms: now,
                    remeasure: self.offload.is_some(),
                    book: self.book.get_or_insert_with(Default::default),
                },
                events.drain(..),
            )?;
            if tick {
                if let Some(launcher) = self.launcher.as_mut() {
                    let work = self.studies.keys().any(|s| self.sched.counts(s).is_some_and(|c| !c.finished()));
                    let online: std::collections::HashSet<&str> = self.sessions.live_agents().collect();
                    launcher.tick(now, work, &|name| online.contains(name));
                }
                effects.extend(self.sched.expire(now));
                if let Some(policy) = self.offload.filter(|p| now >= self.last_decision_ms + p.interval_ms) {
                    self.last_decision_ms = now;
                    effects.extend(offload(&mut self.sched, &self.telemetry, &policy, now));
                }
            }
            schedule(&mut self.sched, &mut batch, &mut self.studies, &mut self.stats, &mut out, effects, now)?;
            batch.commit()?;
        }
        self.send(welcomes, out).await;
        let refresh = crate::transport::STATUS_REFRESH.as_millis() as u64;
        if tick && now >= self.status_ms + refresh {
            self.status_ms = now;
            if let Err(e) = self.outbox.refresh_status().await {
                tracing::warn!(error = %e, "cannot publish the coordinator status again");
            }
        }
        for (name, active) in &self.studies {
            if let Some(c) = self.sched.counts(name) {
                let best = active.best.as_ref().map(|b| (active.study.objective.metric.as_str(), b.value, b.trial));
                let update = crate::progress::Update {
                    finished: c.done + c.failed + c.stopped,
                    running: c.running,
                    live_agents: self.sched.live_agents(),
                    best,
                };
                self.progress.update(name, update);
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
    welcomes: &'a mut Vec<(String, Vec<u8>)>,
    effects: &'a mut Vec<Effect>,
    influx: bool,
    sessions: &'a mut Sessions,
    unsynced: &'a mut HashMap<String, u64>,
    telemetry: &'a mut crate::decide::Telemetry,
    /// The engine's clock (milliseconds since it started), for the scheduler.
    now_ms: u64,
    /// Measurements agents flag as disturbed are taken again (with offloading).
    remeasure: bool,
    book: &'a mut crate::reuse::Book,
}

/// The decider's verdicts, applied: overloaded agents get no trials and
/// their running ones move.
fn offload(
    sched: &mut Scheduler,
    telemetry: &crate::decide::Telemetry,
    policy: &crate::decide::Policy,
    now: u64,
) -> Vec<Effect> {
    let mut effects = Vec::new();
    for decision in crate::decide::decide(policy, telemetry, |a| sched.overloaded(a).is_some(), now) {
        match decision {
            crate::decide::Decision::Overloaded { agent, why } => {
                tracing::warn!(agent = %agent, reason = %why, "agent overloaded: no new trials, its trials move");
                effects.extend(sched.set_overloaded(&agent, Some(why), now));
            }
            crate::decide::Decision::Recovered { agent } => {
                tracing::info!(agent = %agent, "agent no longer overloaded");
                effects.extend(sched.set_overloaded(&agent, None, now));
            }
        }
    }
    effects
}

/// Creates as many trials as the agents that match each study have room
/// for, asking its search; closes a study in the scheduler once its search
/// has nothing more.
fn top_up(
    sched: &mut Scheduler,
    batch: &mut Batch<'_>,
    studies: &mut HashMap<String, ActiveStudy>,
) -> Result<(), EngineError> {
    for (name, active) in studies.iter_mut().filter(|(_, a)| !a.cancelled) {
        let mut want = sched.demand(name);
        while want > 0 {
            // TPE's constant liar: the trials created and not finished run.
            let running: Vec<(u64, &tunefleet_common::params::Params)> = active
                .plans
                .iter()
                .filter(|p| !sched.is_finished(name, p.trial))
                .map(|p| (p.trial, &p.params))
                .collect();
            let Some(trials) = active.search.next_trials_while(&running) else { break };
            want = want.saturating_sub(trials.len() as u64);
            active.create(sched, batch, trials)?;
        }
        if active.search.exhausted() {
            sched.set_open(name, false);
        }
    }
    Ok(())
}

/// The next control request, or never when there is no control socket.
async fn next_request(
    requests: &mut Option<mpsc::Receiver<crate::control::Request>>,
) -> Option<crate::control::Request> {
    match requests {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Cancels `name`: no more trials; every trial not finished is stopped, and
/// its running attempt cancelled on its agent.
fn cancel(
    sched: &mut Scheduler,
    studies: &mut HashMap<String, ActiveStudy>,
    name: &str,
    effects: &mut Vec<Effect>,
) -> crate::control::Answer {
    use crate::control::Answer;
    let Some(active) = studies.get_mut(name) else {
        return Answer::Error { message: format!("no study {name:?} runs here") };
    };
    if active.cancelled {
        return Answer::Ok { message: format!("study {name} was cancelled already") };
    }
    active.cancelled = true;
    sched.set_open(name, false);
    let mut running = 0;
    for trial in 0..active.plans.len() as u64 {
        let stopped = sched.stop(name, trial, "study cancelled");
        running += stopped.iter().filter(|e| matches!(e, Effect::Cancel { .. })).count();
        effects.extend(stopped);
    }
    tracing::warn!(study = %name, running, "study cancelled");
    Answer::Ok { message: format!("study {name} cancelled: {running} running attempts cancelled on their agents") }
}

/// Logs the first ten of a kind of refusal, then at powers of two.
fn loud(n: u64) -> bool {
    n <= 10 || n.is_power_of_two()
}

/// Handles `events` in order, each in its own savepoint ([`handle`]).
fn handle_all(cx: &mut Ctx<'_, '_>, events: impl IntoIterator<Item = Inbound>) -> Result<(), EngineError> {
    for ev in events {
        handle(cx, ev)?;
    }
    Ok(())
}

/// The end of a turn: new trials where agents have room, assignments, and
/// every effect applied to the store.
fn schedule(
    sched: &mut Scheduler,
    batch: &mut Batch<'_>,
    studies: &mut HashMap<String, ActiveStudy>,
    stats: &mut EngineStats,
    out: &mut Vec<(String, CoordinatorMessage)>,
    mut effects: Vec<Effect>,
    now: u64,
) -> Result<(), EngineError> {
    top_up(sched, batch, studies)?;
    effects.extend(sched.assign(now));
    for effect in effects {
        apply(batch, studies, stats, out, effect)?;
    }
    Ok(())
}

/// Runs `f` inside savepoint `name`: kept when it succeeds; when it fails
/// with a store error, its writes are undone (the rest of the batch stays),
/// the error is counted and returned for the caller to answer.
fn in_savepoint(
    cx: &mut Ctx<'_, '_>,
    name: &'static str,
    f: impl FnOnce(&mut Ctx<'_, '_>) -> Result<(), EngineError>,
) -> Result<Option<StoreError>, EngineError> {
    cx.batch.savepoint(name)?;
    match f(cx) {
        Ok(()) => {
            cx.batch.release(name)?;
            Ok(None)
        }
        Err(EngineError::Store(e)) => {
            cx.batch.rollback_to(name)?;
            cx.stats.store_errors += 1;
            Ok(Some(e))
        }
        Err(e) => {
            cx.batch.rollback_to(name)?;
            Err(e)
        }
    }
}

/// One message, in a savepoint of its own. A store error while handling it
/// rolls back its writes alone and drops what it queued; the turn goes on.
///
/// The scheduler and the other in-memory state are not in the savepoint,
/// so every handler validates first and writes the store before it changes
/// them: a result is judged ([`Scheduler::judge`]) and settled only once its
/// writes succeeded; a status, telemetry, progress or Last Will is written
/// before it is applied. What follows once a result is settled (an extra
/// repeat, a learned profile) runs in a savepoint of its own ([`aside`]), so
/// its failure never undoes a result the scheduler already counts.
fn guarded(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    kind: AgentTopic,
    result: Option<TrialRef>,
    f: impl FnOnce(&mut Ctx<'_, '_>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    let (out, effects) = (cx.out.len(), cx.effects.len());
    let Some(e) = in_savepoint(cx, "message", f)? else { return Ok(()) };
    cx.out.truncate(out);
    cx.effects.truncate(effects);
    if loud(cx.stats.store_errors) {
        tracing::error!(agent = %agent, topic = kind.as_str(), error = %e, errors = cx.stats.store_errors, "message refused: the store could not take it (rolled back alone)");
    }
    if let Some(trial) = result {
        let outcome = AckOutcome::Refused(format!("the store could not take it: {e}"));
        cx.out.push((agent.to_string(), CoordinatorMessage::Ack(ResultAck { trial, outcome })));
    }
    Ok(())
}

/// Bookkeeping after a settled result, in a savepoint of its own: a store
/// error undoes it alone (logged, counted) and the result stays stored.
fn aside(
    cx: &mut Ctx<'_, '_>,
    what: &str,
    f: impl FnOnce(&mut Ctx<'_, '_>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    if let Some(e) = in_savepoint(cx, "aside", f)? {
        if loud(cx.stats.store_errors) {
            tracing::error!(error = %e, errors = cx.stats.store_errors, "{what}: the store could not take it (rolled back alone)");
        }
    }
    Ok(())
}

/// Whether `reference` may be resumed from in `study` (message validation
/// checked its form already; this checks it again for stored ones).
fn usable_checkpoint(study: &Study, reference: &str) -> Result<(), crate::validate::Why> {
    crate::validate::checkpoint("checkpoint", reference).map_err(|e| e.why)?;
    crate::validate::checkpoint_under(reference, study.resume_prefix.as_deref())
}

fn handle(cx: &mut Ctx<'_, '_>, ev: Inbound) -> Result<(), EngineError> {
    let (agent, kind, frame) = match ev {
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
            if loud(n) {
                tracing::warn!(topic = %topic, reason = %reason, rejected = n, "rejected a message");
            }
            return Ok(());
        }
        Inbound::Agent { agent, kind, frame } => (agent, kind, *frame),
    };
    let now = unix_ms();
    let (agent, msg) = match frame {
        UpFrame::Hello(signed) => {
            let name = agent.clone();
            return guarded(cx, &name, kind, None, |cx| on_hello(cx, agent, &signed, now));
        }
        UpFrame::Will(will) => {
            let name = agent.clone();
            return guarded(cx, &name, kind, None, |cx| on_will(cx, agent, &will, now));
        }
        UpFrame::Sealed(sealed) => match cx.sessions.open(&agent, kind, &sealed) {
            Ok(msg) => (agent, msg),
            Err(e) => {
                cx.stats.bad_tokens += 1;
                if loud(cx.stats.bad_tokens) {
                    tracing::warn!(agent = %agent, topic = kind.as_str(), error = %e, refused = cx.stats.bad_tokens, "unauthenticated message refused");
                }
                // A frame of a session this coordinator does not hold (it
                // restarted, or another Hello replaced it): a known agent is
                // told, signed, so it says Hello again instead of talking
                // into the void.
                if matches!(e, auth::AuthError::NoSession | auth::AuthError::Token { .. })
                    && cx.batch.agent_key(&agent)?.is_some()
                {
                    if let Some(notice) = cx.sessions.stale_notice(&agent, sealed.token, std::time::Instant::now()) {
                        cx.welcomes.push((agent, notice));
                    }
                }
                return Ok(());
            }
        },
    };
    if let Err(why) = crate::validate::message(&msg) {
        cx.stats.invalid_messages += 1;
        if loud(cx.stats.invalid_messages) {
            tracing::warn!(agent = %agent, topic = kind.as_str(), reason = %why, invalid = cx.stats.invalid_messages, "message refused: out of bounds");
        }
        if let AgentMessage::Result(r) = msg {
            let outcome = AckOutcome::Refused(format!("out of bounds: {why}"));
            cx.out.push((agent, CoordinatorMessage::Ack(ResultAck { trial: r.trial, outcome })));
        }
        return Ok(());
    }
    let result = match &msg {
        AgentMessage::Result(r) => Some(r.trial.clone()),
        // Requests and sync answers change the scheduler and memory only:
        // no savepoint (two statements a message) to guard them.
        AgentMessage::Request(_) | AgentMessage::Synced(_) => return dispatch(cx, agent, msg, now),
        _ => None,
    };
    let name = agent.clone();
    guarded(cx, &name, kind, result, |cx| dispatch(cx, agent, msg, now))
}

/// A valid message from an authenticated agent: store writes first, then
/// the scheduler and the rest of memory (see [`guarded`]).
fn dispatch(cx: &mut Ctx<'_, '_>, agent: String, msg: AgentMessage, now: u64) -> Result<(), EngineError> {
    match msg {
        AgentMessage::Status(status) => {
            if !status.online {
                cx.batch.set_will_hash(&agent, None)?;
            }
            cx.batch.set_agent_online(&agent, status.online, now)?;
            if !status.online {
                tracing::info!(agent = %agent, "agent offline");
                cx.telemetry.forget(&agent);
                cx.sessions.end(&agent);
            }
            cx.effects.extend(cx.sched.status(&agent, &status));
        }
        AgentMessage::Request(req) => {
            // Another study's attempts are none of this one's (the
            // scheduler compares study ids too): counted, nothing else.
            let others: Vec<&TrialRef> = req.running.iter().filter(|t| of_another_study(cx.sched, t)).collect();
            for t in others {
                other_study(cx, &agent, "running attempt", t);
            }
            cx.effects.extend(cx.sched.request(&agent, &req));
        }
        AgentMessage::Progress(p) if of_another_study(cx.sched, &p.trial) => {
            other_study(cx, &agent, "progress", &p.trial);
        }
        AgentMessage::Refuse(r) if of_another_study(cx.sched, &r.trial) => {
            other_study(cx, &agent, "refusal", &r.trial);
        }
        AgentMessage::Progress(mut p) => {
            if cx.sched.is_live(&agent, &p.trial) {
                if let (Some(reference), Some(a)) = (&p.checkpoint, cx.studies.get(&p.trial.study)) {
                    if let Err(why) = usable_checkpoint(&a.study, reference) {
                        cx.stats.refused_checkpoints += 1;
                        if loud(cx.stats.refused_checkpoints) {
                            tracing::warn!(agent = %agent, trial = %p.trial, checkpoint = ?reference, reason = %why, refused = cx.stats.refused_checkpoints, "checkpoint refused: not kept");
                        }
                        p.checkpoint = None;
                    }
                }
                cx.batch.record_progress(&p)?;
                if let Some(wp) = &p.profile {
                    on_profile(cx, &agent, &p.trial, wp)?;
                }
                if let (Some(reference), Some(a)) = (&p.checkpoint, cx.studies.get_mut(&p.trial.study)) {
                    a.checkpoints.insert(p.trial.trial, (p.epoch, reference.clone()));
                }
                early_stop(cx, &p);
            }
        }
        AgentMessage::Refuse(r) => cx.effects.extend(cx.sched.refuse(&agent, &r.trial, &r.reason)),
        AgentMessage::Result(result) => on_result(cx, agent, result, now)?,
        AgentMessage::Telemetry(t) => {
            cx.batch.record_telemetry(&agent, &t)?;
            cx.telemetry.observe(&agent, crate::decide::Sample::of(&t, cx.now_ms));
        }
        AgentMessage::Synced(n) => {
            if cx.unsynced.get(&agent) == Some(&n) {
                cx.unsynced.remove(&agent);
            }
        }
    }
    Ok(())
}

/// Whether `trial` names a study this coordinator runs but carries another
/// study id: it belongs to another study of that name (another store).
fn of_another_study(sched: &Scheduler, trial: &TrialRef) -> bool {
    sched.study_id(&trial.study).is_some_and(|id| id != trial.study_id)
}

/// Counts (and logs the first of) references to another study of a name
/// this coordinator runs.
fn other_study(cx: &mut Ctx<'_, '_>, agent: &str, what: &str, trial: &TrialRef) {
    cx.stats.other_study_refs += 1;
    if loud(cx.stats.other_study_refs) {
        tracing::warn!(agent = %agent, trial = %trial, study_id = format!("{:016x}", trial.study_id), what, count = cx.stats.other_study_refs, "another study of this name (another store): ignored");
    }
}

/// A signed Hello: the cheap checks, then with what the store knows of the
/// name the replay check and admission (a pinned key, a join token, or open
/// enrolment) and their budgets, then the signatures; a new key is pinned,
/// then a session and its Welcome.
fn on_hello(cx: &mut Ctx<'_, '_>, agent: String, signed: &Signed, now: u64) -> Result<(), EngineError> {
    let refused = |cx: &mut Ctx<'_, '_>, e: HelloRefusal| {
        if matches!(e, HelloRefusal::RateLimited(_)) {
            cx.stats.rate_limited_hellos += 1;
            if loud(cx.stats.rate_limited_hellos) {
                tracing::warn!(agent = %agent, dropped = cx.stats.rate_limited_hellos, "{e}");
            }
        } else {
            cx.stats.refused_hellos += 1;
            if loud(cx.stats.refused_hellos) {
                tracing::error!(agent = %agent, refused = cx.stats.refused_hellos, "Hello refused: {e}");
            }
        }
    };
    let peeked = cx.sessions.peek_hello(&agent, signed).and_then(|h| match crate::validate::agent_info(&h.info) {
        Ok(()) => Ok(h),
        Err(why) => Err(HelloRefusal::Invalid(why.to_string())),
    });
    let hello = match peeked {
        Ok(h) => h,
        Err(e) => {
            refused(cx, e);
            return Ok(());
        }
    };
    let known = cx.batch.known(&agent)?;
    let token = match (&known.pin, &hello.enrol) {
        (None, Some(e)) => cx.batch.token(&e.token)?,
        _ => None,
    };
    let admitted = cx.sessions.admit(&agent, &hello, &known, token.as_ref(), std::time::Instant::now(), now);
    let checked = admitted.and_then(|a| cx.sessions.verify(&hello, signed, &a).map(|d| (a, d)));
    let (admission, digest) = match checked {
        Ok(c) => c,
        Err(e) => {
            refused(cx, e);
            return Ok(());
        }
    };
    match &admission {
        Admission::Known => {}
        Admission::Token(public) => {
            cx.batch.enrol(&agent, &hello.key, Some(public), now)?;
            tracing::info!(agent = %agent, key = %auth::hex(&hello.key), token = %crate::store::token_id(public), "new agent enrolled with a join token: its key is pinned from now on");
        }
        Admission::Open => {
            cx.batch.enrol(&agent, &hello.key, None, now)?;
            tracing::warn!(agent = %agent, key = %auth::hex(&hello.key), "new agent pinned by OPEN ENROLMENT (no join token): any broker user could have been it");
        }
    }
    // The store first: a store error here undoes this Hello alone (its
    // savepoint) before any session is opened.
    cx.batch.record_hello(&agent, hello.info.instance, hello.seq)?;
    let mut info = hello.info.clone();
    // The tags a join token granted are the agent's, whatever it claims.
    info.tags.extend(cx.batch.granted_tags(&agent)?);
    cx.batch.set_will_hash(&agent, Some(&hello.will_hash))?;
    cx.batch.upsert_agent(&info, now)?;
    let (token, payload) = match cx.sessions.accept(&agent, &hello, digest) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(agent = %agent, error = %e, "cannot open a session");
            return Ok(());
        }
    };
    tracing::info!(agent = %agent, arch = %info.arch, cores = info.cores, slots = info.slots, session = %format!("{token:016x}"), "agent announced");
    cx.agents_seen.insert(agent.clone());
    cx.effects.extend(cx.sched.hello(info));
    cx.welcomes.push((agent, payload));
    Ok(())
}

/// An agent's Last Will: offline only if it is the will its session (or,
/// after a coordinator restart, its last recorded session) committed to.
fn on_will(cx: &mut Ctx<'_, '_>, agent: String, will: &Will, now: u64) -> Result<(), EngineError> {
    let genuine = match cx.sessions.will(&agent, will) {
        WillCheck::Live => true,
        WillCheck::NoSession => cx.batch.will_hash(&agent)?.is_some_and(|h| auth::will_matches(will, &h)),
        WillCheck::Forged => {
            cx.stats.forged_wills += 1;
            tracing::warn!(agent = %agent, forged = cx.stats.forged_wills, "a Last Will that is not this session's: ignored");
            return Ok(());
        }
    };
    if !genuine {
        // The retained will of an earlier session, seen again after a restart.
        tracing::debug!(agent = %agent, "stale Last Will ignored");
        return Ok(());
    }
    cx.batch.set_will_hash(&agent, None)?;
    cx.batch.set_agent_online(&agent, false, now)?;
    tracing::info!(agent = %agent, "agent lost its connection (Last Will)");
    cx.telemetry.forget(&agent);
    cx.effects.extend(cx.sched.status(&agent, &AgentStatus { online: false, instance: will.instance }));
    Ok(())
}

/// `[stability]`: once every run of a trial's configuration has ended, one
/// more while their objectives spread more than the study allows (and it
/// has runs left).
fn repeat_until_stable(
    sched: &mut Scheduler,
    batch: &mut Batch<'_>,
    a: &mut ActiveStudy,
    trial: u64,
) -> Result<(), EngineError> {
    let Some(stability) = a.study.stability else { return Ok(()) };
    let Some(params) = a.plans.get(trial as usize).map(|p| p.params.clone()) else { return Ok(()) };
    let runs = a.runs.get(&crate::store::params_json(&params)).cloned().unwrap_or_default();
    let name = a.study.name.clone();
    if runs.len() >= stability.max_repeats as usize || !runs.iter().all(|&t| sched.is_finished(&name, t)) {
        return Ok(());
    }
    let values: Vec<f64> = runs.iter().filter_map(|t| a.values.get(t).copied()).collect();
    let Some(spread) = search::spread(&values).filter(|s| *s > stability.spread) else { return Ok(()) };
    // The row first: when the store refuses it, the search has not counted it.
    let repeat = runs.len() as u32;
    let next = TrialPlan { trial: a.plans.len() as u64, params: params.clone(), repeat };
    batch.add_trials(&name, std::slice::from_ref(&next))?;
    let plan = a.search.extra_repeat(&params, repeat);
    debug_assert_eq!(plan, next, "the search numbers trials as the study has them");
    tracing::info!(study = %name, trial = plan.trial, spread, runs = runs.len(), "not stable yet: one more run");
    a.adopt(sched, vec![plan]);
    Ok(())
}

/// Every profile record and stored model, by device class.
fn load_book(store: &Store) -> Result<crate::reuse::Book, EngineError> {
    let mut book = crate::reuse::Book::default();
    for r in store.profile_records()? {
        book.classes.entry(r.class.clone()).or_default().records.push(r);
    }
    for (class, model, fitted_on) in store.cluster_models()? {
        let c = book.classes.entry(class).or_default();
        c.model = Some(model);
        c.fitted_on = usize::try_from(fitted_on).unwrap_or(usize::MAX);
    }
    for c in book.classes.values_mut() {
        c.place_all();
    }
    Ok(book)
}

/// A pipelined trial's first window was profiled: reuse a configuration
/// of its cluster (it stops probing), or let it probe; recorded either way.
fn on_profile(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    wp: &tunefleet_common::measurement::WindowProfile,
) -> Result<(), EngineError> {
    use crate::reuse::{self, Decision};
    let Some(a) = cx.studies.get_mut(&trial.study) else { return Ok(()) };
    let (Some(probe), Some(plan)) = (a.probe.as_ref(), a.plans.get(trial.trial as usize)) else { return Ok(()) };
    if a.decided.contains(&(trial.trial, trial.attempt)) {
        return Ok(());
    }
    let Some(class) = cx.sched.agent_class(agent) else { return Ok(()) };
    let malformed = reuse::check(&wp.profile).is_err();
    let group = reuse::group_key(&a.study.reuse.group, &plan.params);
    let c = cx.book.classes.get(&class);
    let decision = reuse::decide(
        &a.study.reuse,
        c.and_then(|c| c.model.as_ref()),
        c.map_or(&[][..], |c| &c.records),
        c.map_or(&[][..], |c| &c.clusters),
        &wp.profile,
        &group,
        probe.select,
    );
    let decision = match decision {
        Decision::Reuse { cluster, distance, threshold, .. } if !a.study.reuse.enabled => Decision::Probe {
            cluster: Some(cluster),
            distance: Some(distance),
            threshold: Some(threshold),
            reason: format!(
                "probed: reuse is off for this study ([reuse] enabled = false); it would have {}",
                decision.reason()
            ),
        },
        d => d,
    };
    let mut row = crate::store::DecisionRow {
        study: trial.study.clone(),
        trial: trial.trial,
        attempt: trial.attempt,
        class,
        decision: "probe".into(),
        cluster: None,
        distance: None,
        threshold: None,
        system: None,
        expected: None,
        reason: decision.reason(),
        at_ms: unix_ms(),
    };
    match &decision {
        Decision::Reuse { cluster, distance, threshold, system, expected, .. } => {
            row.decision = "reuse".into();
            (row.cluster, row.distance, row.threshold) = (Some(*cluster as u64), Some(*distance), Some(*threshold));
            row.system = Some(reuse::system_text(system));
            row.expected = Some(*expected);
        }
        Decision::Probe { cluster, distance, threshold, .. } => {
            (row.cluster, row.distance, row.threshold) = (cluster.map(|c| c as u64), *distance, *threshold);
        }
    }
    // Written first: a store error leaves the attempt undecided, as it was.
    cx.batch.record_decision(&row)?;
    a.decided.insert((trial.trial, trial.attempt));
    if malformed {
        cx.stats.bad_profiles += 1;
    }
    match decision {
        Decision::Reuse { system, expected, .. } => {
            a.reused.insert(trial.trial, (system.clone(), expected));
            cx.stats.reused += 1;
            tracing::info!(trial = %trial, agent = %agent, reason = %row.reason, "configuration reused: probing skipped");
            cx.out.push((
                agent.to_string(),
                CoordinatorMessage::Reconfigure(tunefleet_common::message::Reconfigure {
                    trial: trial.clone(),
                    system,
                    reason: tunefleet_common::message::ReconfigureReason::Reuse,
                }),
            ));
        }
        Decision::Probe { .. } => tracing::info!(trial = %trial, agent = %agent, reason = %row.reason, "probing"),
    }
    Ok(())
}

/// A pipelined trial's result: its first-window profile, with how each
/// configuration ran, joins its device class's profiles (the model is
/// refitted as they grow); a reused configuration is checked against
/// what its cluster promised. Nothing is learnt from an agent the study's
/// selector does not admit.
fn learn(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    m: &tunefleet_common::measurement::Measurement,
    now: u64,
) -> Result<(), EngineError> {
    use crate::reuse::{self, Record, Verdict};
    let Some(a) = cx.studies.get(&trial.study) else { return Ok(()) };
    let (Some(wp), Some(probe), Some(plan)) = (&m.window_profile, &a.probe, a.plans.get(trial.trial as usize)) else {
        return Ok(());
    };
    if reuse::check(&wp.profile).is_err() {
        return Ok(());
    }
    let Some(outcomes) = reuse::outcomes(&m.segments) else { return Ok(()) };
    let Some(class) = cx.sched.agent_class(agent) else { return Ok(()) };
    // Only agents the study's selector admits teach its device class.
    if !cx.sched.admits(&trial.study, agent) {
        tracing::info!(trial = %trial, agent = %agent, "profile not learnt: the study's selector does not admit this agent");
        return Ok(());
    }
    let reused = m.segments.iter().any(|s| s.role == tunefleet_common::measurement::SegmentRole::Reused);
    let mut worse = None;
    if let Some((system, expected)) = a.reused.get(&trial.trial).filter(|_| reused) {
        let verdict = reuse::verify(&outcomes, system, *expected, a.study.reuse.verify_bound);
        let (decision, reason, measured) = match &verdict {
            Verdict::Kept { measured, .. } => (
                "kept",
                format!(
                    "the reused configuration ran at {measured:.3} x the first window, as promised ({expected:.3})"
                ),
                Some(*measured),
            ),
            Verdict::Worse { why, measured, .. } => {
                cx.stats.reuse_worse += 1;
                tracing::warn!(trial = %trial, %why, "reused configuration ran slower than its record: its cluster is probed again");
                worse = Some(why.clone());
                ("worse", why.clone(), Some(*measured))
            }
            Verdict::Unverified => ("kept", "not verified: no reused window was measured".to_string(), None),
        };
        cx.batch.record_decision(&crate::store::DecisionRow {
            study: trial.study.clone(),
            trial: trial.trial,
            attempt: trial.attempt,
            class: class.clone(),
            decision: decision.into(),
            cluster: None,
            distance: None,
            threshold: None,
            system: Some(reuse::system_text(system)),
            expected: measured,
            reason,
            at_ms: now,
        })?;
    }
    let profile = if reused { wp.profile.clone() } else { reuse::with_signature(wp, &outcomes, probe.select) };
    let workload = a.study.command.first().map_or("", |c| c.rsplit('/').next().unwrap_or(c)).to_string();
    let record = Record {
        study: trial.study.clone(),
        trial: trial.trial,
        class: class.clone(),
        workload,
        group: reuse::group_key(&a.study.reuse.group, &plan.params),
        profile,
        outcomes,
        reused,
        worse,
        at_ms: now,
    };
    cx.batch.record_profile(&record)?;
    // The new model is fitted and written before the book changes: a store
    // error leaves the book as the store has it.
    let c = cx.book.classes.entry(class.clone()).or_default();
    let same = |r: &Record| r.study == record.study && r.trial == record.trial;
    let replaced = c.records.iter().any(same);
    let mut refitted = None;
    if c.stale_at(c.records.len() + usize::from(!replaced)) {
        let profiles: Vec<tunefleet_common::profile::Profile> =
            c.records.iter().filter(|r| !same(r)).chain(std::iter::once(&record)).map(|r| r.profile.clone()).collect();
        match crate::cluster::fit(&profiles, &crate::cluster::FitOptions::default()) {
            Ok(fitted) => {
                tracing::info!(class = %class, k = fitted.model.k(), profiles = profiles.len(), "profile clusters refitted");
                cx.batch.record_model(&class, &fitted.model, profiles.len(), now)?;
                refitted = Some((fitted.model, profiles.len()));
            }
            Err(e) => tracing::warn!(class = %class, error = %e, "cannot cluster profiles"),
        }
    }
    let placed = c.model.as_ref().and_then(|m| m.place(&record.profile)).map(|p| p.cluster);
    c.records.retain(|r| !same(r));
    c.records.push(record);
    // A refit or a replaced record places every record again; else only the new one.
    if let Some((model, fitted_on)) = refitted {
        c.model = Some(model);
        c.fitted_on = fitted_on;
        c.place_all();
    } else if replaced {
        c.place_all();
    } else {
        c.clusters.push(placed);
    }
    Ok(())
}

/// ASHA's verdict on a live attempt's epoch report.
fn early_stop(cx: &mut Ctx<'_, '_>, p: &tunefleet_common::message::Progress) {
    let Some(active) = cx.studies.get_mut(&p.trial.study) else { return };
    let Some(asha) = active.asha.as_mut() else { return };
    let Some(&value) = p.metrics.get(&active.study.objective.metric) else { return };
    if let search::asha::Decision::Stop { rung, value: judged, cutoff } = asha.report(p.trial.trial, p.epoch, value) {
        // The model learns where ASHA cut (Optuna's pruned trials).
        if let Some(plan) = active.plans.get(p.trial.trial as usize) {
            active.search.tell_pruned(p.trial.trial, &plan.params, p.epoch, value);
        }
        let value = judged;
        let metric = &active.study.objective.metric;
        let reason = format!("stopped early by ASHA: {metric} {value} at epoch {rung} is behind the cut {cutoff}");
        tracing::info!(trial = %p.trial, %reason);
        cx.effects.extend(cx.sched.stop(&p.trial.study, p.trial.trial, &reason));
    }
}

fn on_result(cx: &mut Ctx<'_, '_>, agent: String, result: TrialResult, now: u64) -> Result<(), EngineError> {
    let TrialResult { trial, measurement, .. } = result;
    let kind = match &measurement.exit {
        ExitOutcome::SpawnFailed(why) => ResultKind::Retry(format!("could not start: {why}")),
        ExitOutcome::Cancelled => ResultKind::Retry("cancelled".into()),
        // A disturbed measurement is taken again only when the coordinator moves work.
        _ if cx.remeasure && !measurement.interference.is_empty() => {
            ResultKind::Interfered { success: measurement.exit.success(), reason: measurement.interference.join("; ") }
        }
        _ => ResultKind::Complete { success: measurement.exit.success() },
    };
    // Judged now, settled once the store has taken the result: a write that
    // fails leaves the scheduler as it was (see `guarded`).
    let judgement = cx.sched.judge(&agent, &trial, kind);
    let verdict = judgement.verdict;
    let mut outcome = AckOutcome::Stored;
    let mut objective = None;
    let mut stored = false;
    // A result the scheduler cannot place is a duplicate only when it is of
    // this study (its id), its trial is finished, and the store shows the
    // attempt was given to this agent (this process or an earlier one on
    // the same store): the agent deletes a result answered `Duplicate`.
    let other = verdict == Verdict::Unknown && of_another_study(cx.sched, &trial);
    let known = verdict == Verdict::Unknown
        && !other
        && cx.sched.is_finished(&trial.study, trial.trial)
        && cx.batch.attempt_given(&trial, &agent)?;
    match verdict {
        Verdict::Unknown if other => {
            other_study(cx, &agent, "result", &trial);
            outcome = AckOutcome::Refused(format!(
                "a result of another study of that name (another store): the study {} this coordinator runs has another id",
                trial.study
            ));
        }
        Verdict::Unknown if known => {
            cx.stats.duplicate_results += 1;
            tracing::info!(agent = %agent, trial = %trial, "result for a trial already finished: acknowledged as a duplicate");
            outcome = AckOutcome::Duplicate;
        }
        Verdict::Unknown => {
            cx.stats.unknown_results += 1;
            let why = if cx.studies.contains_key(&trial.study) {
                "this coordinator never gave that attempt to this agent"
            } else {
                "this coordinator does not run that study"
            };
            tracing::warn!(agent = %agent, trial = %trial, reason = why, "result refused: the agent keeps it aside");
            outcome = AckOutcome::Refused(why.to_string());
        }
        Verdict::Remeasured => {
            tracing::info!(agent = %agent, trial = %trial, interference = ?measurement.interference, "measurement disturbed: measured again");
        }
        Verdict::Retried => {
            cx.batch.end_attempt(&trial, &agent, &crate::store::exit_text(&measurement.exit), now)?;
            tracing::info!(agent = %agent, trial = %trial, exit = ?measurement.exit, "attempt ended without a result");
        }
        // An attempt the trial moved on from (moved, lease expired) that was
        // cancelled or never started: it ends; it is no result of the trial.
        Verdict::Superseded if matches!(measurement.exit, ExitOutcome::SpawnFailed(_) | ExitOutcome::Cancelled) => {
            cx.batch.end_attempt(&trial, &agent, &crate::store::exit_text(&measurement.exit), now)?;
            cx.stats.superseded_results += 1;
        }
        Verdict::Accepted | Verdict::Duplicate | Verdict::Superseded => {
            let active = cx.studies.get(&trial.study);
            objective = active
                .as_ref()
                .and_then(|a| measurement.exit.success().then(|| a.study.objective_value(&measurement)).flatten());
            stored = cx.batch.record_result(&trial, &agent, &measurement, objective, now)? == RecordOutcome::Stored;
            if stored {
                let system = measurement.selected.clone().or_else(|| {
                    let plan = active?.plans.get(trial.trial as usize)?;
                    Some(search::system_params(&plan.params))
                });
                cx.batch.record_segments(&trial, &measurement, &system.unwrap_or_default())?;
            }
            if cx.influx && stored {
                let points = crate::sink::trial_points(&trial, &agent, &measurement, objective);
                cx.batch.enqueue_points(&points, now)?;
            }
            match verdict {
                Verdict::Duplicate => {
                    cx.stats.duplicate_results += 1;
                    outcome = AckOutcome::Duplicate;
                }
                Verdict::Superseded => cx.stats.superseded_results += 1,
                _ => {}
            }
        }
    }
    // The store has everything this result decides: now the scheduler and memory.
    cx.effects.extend(cx.sched.settle(judgement, cx.now_ms));
    if verdict == Verdict::Accepted {
        if let (Some(a), Some(v)) = (cx.studies.get_mut(&trial.study), objective) {
            if let Some(plan) = a.plans.get(trial.trial as usize) {
                if measurement.exit != ExitOutcome::Cancelled {
                    a.search.tell(trial.trial, &plan.params, v);
                }
            }
            a.values.insert(trial.trial, v);
            let dir: Direction = a.study.objective.direction;
            if a.best.as_ref().is_none_or(|b| dir.better(v, b.value)) {
                a.best = Some(Best { trial: trial.trial, value: v, agent: agent.clone() });
            }
            // A savepoint costs two statements: only where there is a repeat to judge.
            if a.study.stability.is_some() {
                aside(cx, "an extra repeat", |cx| {
                    let Some(a) = cx.studies.get_mut(&trial.study) else { return Ok(()) };
                    repeat_until_stable(cx.sched, cx.batch, a, trial.trial)
                })?;
            }
        }
    }
    // Only a pipelined trial's profile teaches anything (`learn` returns at once otherwise).
    let probed =
        measurement.window_profile.is_some() && cx.studies.get(&trial.study).is_some_and(|a| a.probe.is_some());
    if stored && measurement.exit.success() && probed {
        aside(cx, "learning a profile", |cx| learn(cx, &agent, &trial, &measurement, now))?;
    }
    cx.out.push((agent, CoordinatorMessage::Ack(ResultAck { trial, outcome })));
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
            let checkpoint = active.checkpoints.get(&trial.trial);
            if let Some((epoch, _)) = checkpoint.filter(|_| !active.study.resume.is_empty()) {
                tracing::info!(trial = %trial, agent = %agent, epoch, "goes on from its last checkpoint");
            }
            match search::render_resumed(&active.study, active.probe.as_ref(), plan, &trial, checkpoint) {
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
        Effect::Moved { trial, from, reason } => {
            stats.moved += 1;
            tracing::warn!(trial = %trial, from = %from, reason = %reason, "trial moved");
            batch.requeue(&trial, &format!("moved off {from}: {reason}"))?;
        }
        Effect::Stopped { trial, reason } => {
            stats.stopped += 1;
            batch.stop_trial(&trial, &reason, now)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tunefleet_common::auth::{self, Identity, Session};
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, Measurement};
    use tunefleet_common::message::{AgentInfo, Progress, Refusal, WorkRequest};

    const STUDY: &str = r#"
name = "s"
command = ["true", "{x}"]
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 4
[strategy]
kind = "grid"
[hyper.x]
kind = "int"
low = 1
high = 4
"#;

    /// The id the rig's store keeps for study `s`.
    const RIG_STUDY_ID: u64 = 0x5eed_0000_0000_0005;

    /// Messages for agents, by agent name.
    type Outgoing = Vec<(String, CoordinatorMessage)>;

    /// The engine's state without its transport: what a turn touches.
    struct Rig {
        store: Store,
        sched: Scheduler,
        studies: HashMap<String, ActiveStudy>,
        stats: EngineStats,
        sessions: Sessions,
        agent: Option<Session>,
        book: crate::reuse::Book,
    }

    fn info() -> AgentInfo {
        AgentInfo { slots: 2, ..AgentInfo::minimal("a", 1) }
    }

    impl Rig {
        /// A store with study `s`, and agent `a` welcomed through a real handshake.
        fn new() -> Rig {
            Rig::with_study(STUDY)
        }

        /// [`Rig::new`] with another study named `s` of 4 trials.
        fn with_study(text: &str) -> Rig {
            let study = crate::study::parse(text, "test.toml").expect("study");
            let mut search = Search::new(&study);
            let mut plans = Vec::new();
            while let Some(trials) = search.next_trials() {
                plans.extend(trials);
            }
            let mut store = Store::open_in_memory().expect("store");
            let mut batch = store.batch().expect("batch");
            batch.create_study(&study, &plans).expect("create");
            let mut sched = Scheduler::new();
            let id = batch.study_id("s", RIG_STUDY_ID).expect("study id");
            batch.commit().expect("commit");
            let policy = StudyPolicy {
                name: "s".into(),
                id,
                selector: study.selector.clone(),
                max_attempts: study.max_attempts,
                lease_ms: 60_000,
            };
            sched.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; plans.len()], 0);
            let mut studies = HashMap::new();
            studies.insert("s".into(), ActiveStudy::new(study, search, plans, HashMap::new(), None));
            let mut sessions = Sessions::new(Identity::generate().expect("key").0, 9, 1);
            // The rig's agent is admitted without a join token (tokens have tests of their own).
            sessions.open_enrolment = true;
            let coordinator_key = sessions.public_key();
            let me = Identity::generate().expect("key").0;
            let (signed, pending) = auth::hello(&me, info(), 9, 1, [0; 32], None).expect("hello");
            let mut rig = Rig {
                store,
                sched,
                studies,
                stats: EngineStats::default(),
                sessions,
                agent: None,
                book: Default::default(),
            };
            let hello = UpFrame::Hello(signed);
            let out =
                rig.turn(vec![Inbound::Agent { agent: "a".into(), kind: AgentTopic::Hello, frame: Box::new(hello) }]);
            let (_, welcome) = out.0.into_iter().next().expect("a Welcome");
            let Ok(auth::DownFrame::Welcome(w)) = tunefleet_common::decode(&welcome) else { panic!("not a Welcome") };
            rig.agent = Some(pending.finish("a", &coordinator_key, &w).expect("session"));
            rig
        }

        /// One turn through the engine's own path ([`handle_all`], then
        /// [`schedule`]), with every lease expired first so work comes back.
        fn turn(&mut self, events: Vec<Inbound>) -> (Vec<(String, Vec<u8>)>, Outgoing) {
            let (mut out, mut welcomes, mut effects) = (Vec::new(), Vec::new(), Vec::new());
            let mut batch = self.store.batch().expect("batch");
            let mut seen = Default::default();
            let mut unsynced = HashMap::new();
            let mut cx = Ctx {
                sched: &mut self.sched,
                batch: &mut batch,
                studies: &mut self.studies,
                stats: &mut self.stats,
                agents_seen: &mut seen,
                out: &mut out,
                welcomes: &mut welcomes,
                effects: &mut effects,
                influx: true,
                sessions: &mut self.sessions,
                unsynced: &mut unsynced,
                telemetry: &mut Default::default(),
                now_ms: 0,
                remeasure: true,
                book: &mut self.book,
            };
            handle_all(&mut cx, events).expect("a message never ends the run");
            effects.extend(self.sched.expire(u64::MAX / 2));
            schedule(&mut self.sched, &mut batch, &mut self.studies, &mut self.stats, &mut out, effects, 0)
                .expect("effects apply");
            batch.commit().expect("the batch commits");
            (welcomes, out)
        }

        /// `msg` sealed in agent `a`'s session, as the transport hands it
        /// over ([`crate::transport::classify`]: a frame too large is rejected).
        fn sealed(&mut self, msg: &AgentMessage) -> Inbound {
            let kind = AgentTopic::of_agent_message(msg);
            self.sealed_body(kind, tunefleet_common::encode(msg).expect("encode"))
        }

        /// Any `body` sealed in agent `a`'s session on a `kind` topic.
        fn sealed_body(&mut self, kind: AgentTopic, body: Vec<u8>) -> Inbound {
            let session = self.agent.as_mut().expect("welcomed");
            let frame = tunefleet_common::encode(&UpFrame::Sealed(session.seal(kind, body))).expect("encode");
            wire(kind, &frame)
        }

        /// The scheduler and the store agree on how many trials ended how.
        fn consistent(&self) -> Result<(), String> {
            let c = self.sched.counts("s").ok_or("no study")?;
            let st = self.store.trial_counts("s").map_err(|e| e.to_string())?;
            if (c.done, c.failed, c.stopped, c.total) != (st.done, st.failed, st.stopped, st.total()) {
                return Err(format!("scheduler {c:?}, store {st:?}"));
            }
            Ok(())
        }
    }

    /// `payload` as agent `a` publishes it on a `kind` topic, through the transport's check.
    fn wire(kind: AgentTopic, payload: &[u8]) -> Inbound {
        let topics = tunefleet_common::topic::Topics::default();
        crate::transport::classify(&topics, &topics.agent("a", kind), payload)
    }

    fn acks(out: &Outgoing) -> Vec<&ResultAck> {
        out.iter()
            .filter_map(|(_, m)| match m {
                CoordinatorMessage::Ack(a) => Some(a),
                _ => None,
            })
            .collect()
    }

    fn assigned(out: Outgoing) -> Vec<Assignment> {
        out.into_iter()
            .filter_map(|(_, m)| match m {
                CoordinatorMessage::Assign(a) => Some(a),
                _ => None,
            })
            .collect()
    }

    /// A result with every part a pipelined trial's has.
    fn full_measurement(v: f64) -> Measurement {
        use tunefleet_common::measurement::*;
        let system =
            tunefleet_common::message::SystemParams { cores: Some(2), threads: Some(2), memory_mib: Some(512) };
        let mut profile = tunefleet_common::profile::Profile::empty();
        profile.values[0] = Some(1.5);
        Measurement {
            started_unix_ms: 1_700_000_000_000,
            wall_us: 2_000_000,
            user_us: 1_000_000,
            sys_us: 10_000,
            max_rss_kib: 4096,
            epochs: vec![EpochMetrics {
                epoch: 1,
                elapsed_us: 1_000_000,
                metrics: [("v".to_string(), v)].into(),
                checkpoint: Some("/ckpt/1".into()),
            }],
            final_metrics: [("v".to_string(), v)].into(),
            counters: vec![CounterReading {
                event: "task-clock".into(),
                kind: CounterKind::Software,
                value: 10,
                time_enabled_ns: 10,
                time_running_ns: 10,
            }],
            counters_missing: vec![MissingCounter { event: "cycles".into(), reason: "no PMU".into() }],
            counter_series: vec![CounterSample { elapsed_ms: 100, deltas: vec![1.0] }],
            profile: profile.clone(),
            energy: EnergyReading {
                joules: 3.0,
                domains: vec![DomainEnergy { domain: "package-0".into(), joules: 3.0, in_total: true }],
                series: vec![PowerSample { elapsed_ms: 100, watts: 1.5 }],
                interval_ms: 100,
                valid: true,
                ..EnergyReading::none(EnergySourceKind::Rapl, "rapl")
            },
            limits: AppliedLimits {
                cpus: vec![0, 1],
                threads: Some(2),
                memory: MemoryLimit::Cgroup { bytes: 1 << 29 },
            },
            log_tail: "done\n".into(),
            segments: vec![Segment {
                role: SegmentRole::Probe,
                system: system.clone(),
                cpus: vec![0, 1],
                first_epoch: 1,
                last_epoch: 1,
                steps: 0,
                start_us: 0,
                wall_us: 1_000_000,
                energy_j: Some(1.5),
                cpu_us: Some(900_000),
            }],
            selected: Some(system.clone()),
            window_profile: Some(WindowProfile { system, epochs: 1, steps: 0, wall_us: 1_000_000, profile }),
            interference: Vec::new(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Rapl, ""))
        }
    }

    /// Mostly attempts the engine hands out (study `s` with its id, trials 0
    /// to 3, first attempts), so results reach the store; sometimes any
    /// (another study of the same name included).
    fn trial_ref() -> impl Strategy<Value = TrialRef> {
        let study = prop_oneof![6 => Just("s".to_string()), 1 => "[a-z]{1,3}", 1 => text()];
        let id = prop_oneof![6 => Just(RIG_STUDY_ID), 1 => any::<u64>()];
        let trial = prop_oneof![6 => 0u64..4, 1 => 4u64..6, 1 => any::<u64>()];
        (study, id, trial, prop_oneof![6 => Just(1u32), 1 => 0u32..4])
            .prop_map(|(study, study_id, trial, attempt)| TrialRef { study, study_id, trial, attempt })
    }

    fn big() -> impl Strategy<Value = u64> {
        prop_oneof![8 => 0u64..1_000_000, 1 => Just(i64::MAX as u64), 1 => Just(9223372036854775813), 1 => any::<u64>()]
    }

    /// Names and texts: plain ones, any characters (control ones included),
    /// option-like and log-forging ones, and long ones.
    fn text() -> BoxedStrategy<String> {
        prop_oneof![
            12 => "[a-z0-9._/-]{0,12}",
            2 => ".{0,24}",
            1 => Just("--output=/home/victim/.bashrc".to_string()),
            1 => Just("ok\n\u{1b}[31mFORGED LOG LINE".to_string()),
            1 => (0usize..3000).prop_map(|n| "x".repeat(n)),
        ]
        .boxed()
    }

    fn float() -> BoxedStrategy<f64> {
        prop_oneof![
            8 => -1e6f64..1e6,
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => any::<f64>(),
        ]
        .boxed()
    }

    /// A few of `item`, now and then `huge` of them (within the frame size limit).
    fn some<T: Clone + std::fmt::Debug + 'static>(item: BoxedStrategy<T>, huge: usize) -> BoxedStrategy<Vec<T>> {
        some_of(item.clone(), item, huge)
    }

    /// A few of `item`, now and then `huge` of `small` (a small kind of
    /// item, so a huge list stays within the frame size limit).
    fn some_of<T: Clone + std::fmt::Debug + 'static>(
        item: BoxedStrategy<T>,
        small: BoxedStrategy<T>,
        huge: usize,
    ) -> BoxedStrategy<Vec<T>> {
        prop_oneof![30 => prop::collection::vec(item, 0..3), 1 => small.prop_map(move |x| vec![x; huge])].boxed()
    }

    fn metrics() -> BoxedStrategy<tunefleet_common::measurement::Metrics> {
        let name = prop_oneof![4 => Just("v".to_string()), 2 => Just("loss".to_string()), 2 => text()];
        prop_oneof![
            30 => prop::collection::btree_map(name, float(), 0..3),
            1 => prop::collection::btree_map("[a-z]{6,8}", float(), 250..300),
        ]
        .boxed()
    }

    fn system() -> BoxedStrategy<tunefleet_common::message::SystemParams> {
        (prop::option::of(any::<u32>()), prop::option::of(any::<u32>()), prop::option::of(big()))
            .prop_map(|(cores, threads, memory_mib)| tunefleet_common::message::SystemParams {
                cores,
                threads,
                memory_mib,
            })
            .boxed()
    }

    fn profile() -> BoxedStrategy<tunefleet_common::profile::Profile> {
        let values = some(prop::option::of(float()).boxed(), 100);
        (prop_oneof![Just(tunefleet_common::profile::PROFILE_VERSION), any::<u16>()], values)
            .prop_map(|(version, values)| tunefleet_common::profile::Profile { version, values })
            .boxed()
    }

    fn window_profile() -> BoxedStrategy<tunefleet_common::measurement::WindowProfile> {
        (system(), any::<u32>(), any::<u32>(), big(), profile())
            .prop_map(|(system, epochs, steps, wall_us, profile)| tunefleet_common::measurement::WindowProfile {
                system,
                epochs,
                steps,
                wall_us,
                profile,
            })
            .boxed()
    }

    /// A segment whose CPU list may be `cpus` long.
    fn segment(cpus: usize) -> BoxedStrategy<tunefleet_common::measurement::Segment> {
        use tunefleet_common::measurement::{Segment, SegmentRole};
        let role = prop::sample::select(vec![
            SegmentRole::Warmup,
            SegmentRole::Probe,
            SegmentRole::Selected,
            SegmentRole::Reconfigured,
            SegmentRole::Initial,
            SegmentRole::Reused,
            SegmentRole::Cut,
        ]);
        let spans = (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            big(),
            big(),
            prop::option::of(float()),
            prop::option::of(big()),
        );
        (role, system(), some(any::<u32>().boxed(), cpus), spans)
            .prop_map(|(role, system, cpus, (first_epoch, last_epoch, steps, start_us, wall_us, energy_j, cpu_us))| {
                Segment { role, system, cpus, first_epoch, last_epoch, steps, start_us, wall_us, energy_j, cpu_us }
            })
            .boxed()
    }

    fn energy() -> BoxedStrategy<EnergyReading> {
        use tunefleet_common::measurement::{DomainEnergy, PowerSample};
        let kind = prop::sample::select(vec![
            EnergySourceKind::Rapl,
            EnergySourceKind::Hwmon,
            EnergySourceKind::Battery,
            EnergySourceKind::Estimated,
            EnergySourceKind::External,
        ]);
        let domain = (text(), float(), any::<bool>())
            .prop_map(|(domain, joules, in_total)| DomainEnergy { domain, joules, in_total })
            .boxed();
        let sample = (big(), float()).prop_map(|(elapsed_ms, watts)| PowerSample { elapsed_ms, watts }).boxed();
        (kind, float(), some(domain, 100), any::<u32>(), any::<bool>(), prop::option::of(text()), some(sample, 600))
            .prop_map(|(source, joules, domains, interval_ms, valid, note, series)| EnergyReading {
                source,
                joules,
                domains,
                interval_ms,
                valid,
                note,
                series,
            })
            .boxed()
    }

    fn measurement() -> BoxedStrategy<Measurement> {
        use tunefleet_common::measurement::*;
        let exit = prop_oneof![
            4 => any::<i32>().prop_map(ExitOutcome::Exited),
            4 => Just(ExitOutcome::Exited(0)),
            1 => any::<i32>().prop_map(ExitOutcome::Signaled),
            1 => Just(ExitOutcome::TimedOut),
            1 => Just(ExitOutcome::Cancelled),
            1 => text().prop_map(ExitOutcome::SpawnFailed),
        ];
        let epoch = (any::<u32>(), big(), metrics(), prop::option::of(text()))
            .prop_map(|(epoch, elapsed_us, metrics, checkpoint)| EpochMetrics {
                epoch,
                elapsed_us,
                metrics,
                checkpoint,
            })
            .boxed();
        let plain_epoch = (any::<u32>(), big())
            .prop_map(|(epoch, elapsed_us)| EpochMetrics {
                epoch,
                elapsed_us,
                metrics: Metrics::new(),
                checkpoint: None,
            })
            .boxed();
        let kind = prop_oneof![Just(CounterKind::Hardware), Just(CounterKind::Software)];
        let counter = (text(), kind, big(), big(), big())
            .prop_map(|(event, kind, value, time_enabled_ns, time_running_ns)| CounterReading {
                event,
                kind,
                value,
                time_enabled_ns,
                time_running_ns,
            })
            .boxed();
        let missing = (text(), text()).prop_map(|(event, reason)| MissingCounter { event, reason }).boxed();
        let sample =
            (big(), some(float(), 70)).prop_map(|(elapsed_ms, deltas)| CounterSample { elapsed_ms, deltas }).boxed();
        let memory = prop_oneof![
            Just(MemoryLimit::None),
            big().prop_map(|bytes| MemoryLimit::Cgroup { bytes }),
            big().prop_map(|bytes| MemoryLimit::Rlimit { bytes }),
        ];
        let limits = (some(any::<u32>().boxed(), 70_000), prop::option::of(any::<u32>()), memory)
            .prop_map(|(cpus, threads, memory)| AppliedLimits { cpus, threads, memory });
        let times = (big(), big(), big(), big(), big());
        let series =
            (some_of(epoch, plain_epoch, 5000), metrics(), some(counter, 100), some(missing, 100), some(sample, 600));
        let rest = (
            profile(),
            energy(),
            limits,
            prop_oneof![30 => text(), 1 => Just("y".repeat(20_000))],
            some_of(segment(70_000), segment(2), 1100),
            prop::option::of(system()),
            prop::option::of(window_profile()),
            // Mostly clean: a disturbed measurement is measured again, not stored.
            prop_oneof![6 => Just(Vec::new()), 1 => some(text(), 20)],
        );
        (times, exit, series, rest)
            .prop_map(
                |(
                    (started_unix_ms, wall_us, user_us, sys_us, max_rss_kib),
                    exit,
                    (epochs, final_metrics, counters, counters_missing, counter_series),
                    (profile, energy, limits, log_tail, segments, selected, window_profile, interference),
                )| Measurement {
                    started_unix_ms,
                    wall_us,
                    user_us,
                    sys_us,
                    max_rss_kib,
                    exit,
                    epochs,
                    final_metrics,
                    counters,
                    counters_missing,
                    counter_series,
                    profile,
                    energy,
                    limits,
                    log_tail,
                    segments,
                    selected,
                    window_profile,
                    interference,
                },
            )
            .boxed()
    }

    fn telemetry() -> BoxedStrategy<tunefleet_common::measurement::Telemetry> {
        use tunefleet_common::measurement::{Conditions, Telemetry};
        let conditions = (
            prop::option::of(any::<bool>()),
            prop::option::of(float()),
            prop::option::of(any::<bool>()),
            prop::option::of(float()),
        )
            .prop_map(|(charging, battery_percent, throttled, temperature_c)| Conditions {
                charging,
                battery_percent,
                throttled,
                temperature_c,
            });
        let load = (float(), some(float(), 70_000), big(), big(), prop::option::of(float()));
        (big(), any::<u32>(), load, any::<u32>(), prop::option::of(float()), conditions)
            .prop_map(
                |(
                    unix_ms,
                    interval_ms,
                    (cpu_utilisation, per_cpu, memory_used_bytes, memory_total_bytes, power_watts),
                    running,
                    foreign_cpu,
                    conditions,
                )| {
                    Telemetry {
                        unix_ms,
                        interval_ms,
                        cpu_utilisation,
                        per_cpu,
                        memory_used_bytes,
                        memory_total_bytes,
                        power_watts,
                        power_source: EnergySourceKind::Estimated,
                        running,
                        foreign_cpu,
                        conditions,
                    }
                },
            )
            .boxed()
    }

    /// A good measurement with one field (any, nested ones whole) taken
    /// from a random one: a single bad value, so results with it reach the
    /// scheduler and the store unless validation stops them.
    fn spliced() -> BoxedStrategy<Measurement> {
        let field = prop_oneof![3 => 0usize..19, 1 => Just(19)];
        let past = prop_oneof![Just(i64::MAX as u64 + 1), Just(9223372036854775813), Just(u64::MAX)];
        let not_finite = prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)];
        (measurement(), field, -1e3f64..1e3, (segment(4), 0usize..10, past, not_finite))
            .prop_map(|(r, field, v, (rs, sub, past, not_finite))| {
                let mut m = full_measurement(v);
                match field {
                    // One field of a good segment, its numbers out of range
                    // (the crash of issue 20, finding 2).
                    19 => {
                        let s = &mut m.segments[0];
                        match sub {
                            0 => s.role = rs.role,
                            1 => s.system = rs.system,
                            2 => s.cpus = rs.cpus,
                            3 => s.first_epoch = rs.first_epoch,
                            4 => s.last_epoch = rs.last_epoch,
                            5 => s.steps = rs.steps,
                            6 => s.start_us = past,
                            7 => s.wall_us = past,
                            8 => s.energy_j = Some(not_finite),
                            _ => s.cpu_us = Some(past),
                        }
                    }
                    0 => m.started_unix_ms = r.started_unix_ms,
                    1 => m.wall_us = r.wall_us,
                    2 => m.user_us = r.user_us,
                    3 => m.sys_us = r.sys_us,
                    4 => m.max_rss_kib = r.max_rss_kib,
                    5 => m.exit = r.exit,
                    6 => m.epochs = r.epochs,
                    7 => m.final_metrics = r.final_metrics,
                    8 => m.counters = r.counters,
                    9 => m.counters_missing = r.counters_missing,
                    10 => m.counter_series = r.counter_series,
                    11 => m.profile = r.profile,
                    12 => m.energy = r.energy,
                    13 => m.limits = r.limits,
                    14 => m.log_tail = r.log_tail,
                    15 => m.segments = r.segments,
                    16 => m.selected = r.selected,
                    17 => m.window_profile = r.window_profile,
                    18 => m.interference = r.interference,
                    _ => {}
                }
                m
            })
            .boxed()
    }

    /// Every message an agent sends, every field of it, nested ones included.
    fn message() -> impl Strategy<Value = AgentMessage> {
        let checkpoint = prop::option::of(prop_oneof![3 => "/ckpt/[a-z0-9]{1,4}", 1 => text()]);
        prop_oneof![
            2 => (trial_ref(), measurement())
                .prop_map(|(trial, measurement)| AgentMessage::Result(TrialResult { trial, measurement })),
            4 => (trial_ref(), spliced())
                .prop_map(|(trial, measurement)| AgentMessage::Result(TrialResult { trial, measurement })),
            3 => (trial_ref(), any::<u32>(), big(), metrics(), checkpoint, prop::option::of(window_profile())).prop_map(
                |(trial, epoch, elapsed_us, metrics, checkpoint, profile)| AgentMessage::Progress(Progress {
                    trial,
                    epoch,
                    elapsed_us,
                    metrics,
                    checkpoint,
                    profile,
                })
            ),
            3 => (any::<u64>(), prop_oneof![0u32..4, any::<u32>()], some(trial_ref().boxed(), 1100))
                .prop_map(|(seq, free, running)| AgentMessage::Request(WorkRequest { seq, free, running })),
            1 => (trial_ref(), text()).prop_map(|(trial, reason)| AgentMessage::Refuse(Refusal { trial, reason })),
            1 => telemetry().prop_map(AgentMessage::Telemetry),
            1 => (any::<bool>(), any::<u64>())
                .prop_map(|(online, instance)| AgentMessage::Status(AgentStatus { online, instance })),
            1 => any::<u64>().prop_map(AgentMessage::Synced),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Authenticated messages of every kind with any values in every
        /// field (out of range, not finite, too long, too many, control
        /// characters, for studies and attempts that do not exist, in any
        /// order) never stop the engine; every result that reaches it is
        /// answered, and the scheduler and the store agree after each turn.
        #[test]
        fn any_authenticated_message_leaves_the_coordinator_running(msgs in prop::collection::vec(message(), 1..16)) {
            let mut rig = Rig::new();
            let mut results = 0;
            let mut acks = 0;
            let mut online = true;
            // One message a turn, so work handed out in one turn can be answered in the next.
            for m in &msgs {
                let ev = rig.sealed(m);
                // An offline status ends the session: what follows is refused
                // unanswered; a frame too large never reaches the engine.
                if online && matches!(ev, Inbound::Agent { .. }) && matches!(m, AgentMessage::Result(_)) {
                    results += 1;
                }
                online &= !matches!(m, AgentMessage::Status(s) if !s.online);
                let (_, out) = rig.turn(vec![ev]);
                acks += acks_in(&out);
                prop_assert_eq!(rig.consistent(), Ok(()));
            }
            prop_assert_eq!(acks, results, "every result gets an answer the agent acts on");
            prop_assert_eq!(rig.stats.store_errors, 0, "validation keeps every value the store cannot take out");
            // The store still answers.
            prop_assert_eq!(rig.store.trials("s").expect("trials").len(), 4);
        }
    }

    fn acks_in(out: &Outgoing) -> usize {
        acks(out).len()
    }

    fn ok_measurement(v: f64) -> Measurement {
        Measurement {
            wall_us: 5,
            final_metrics: [("v".to_string(), v)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        }
    }

    /// What the rig's agent is answered for a result of `trial`.
    fn answer(rig: &mut Rig, trial: &TrialRef, v: f64) -> AckOutcome {
        let msg =
            rig.sealed(&AgentMessage::Result(TrialResult { trial: trial.clone(), measurement: ok_measurement(v) }));
        let (_, out) = rig.turn(vec![msg]);
        match acks(&out)[..] {
            [ack] if ack.trial == *trial => ack.outcome.clone(),
            ref other => panic!("one answer for {trial} expected: {other:?}"),
        }
    }

    /// Issue 20, finding 8: references of another study of the same name
    /// (another study id: another store) are none of this study's. Its
    /// result is refused (the agent parks it; never `Duplicate`, which the
    /// agent deletes), its progress and refusal are ignored, and it never
    /// takes this study's trial.
    #[test]
    fn regression_another_study_of_the_same_name_is_refused_never_duplicate() {
        let mut rig = Rig::new();
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, running: vec![] }));
        let a = assigned(rig.turn(vec![req]).1).pop().expect("work");
        assert_eq!(a.trial.study_id, RIG_STUDY_ID, "an assignment carries the study's id");
        let twin = TrialRef { study_id: RIG_STUDY_ID ^ 1, ..a.trial.clone() };
        let progress = Progress {
            trial: twin.clone(),
            epoch: 1,
            elapsed_us: 1,
            metrics: [("v".to_string(), 1.0)].into(),
            checkpoint: None,
            profile: None,
        };
        let refusal = Refusal { trial: twin.clone(), reason: "busy".into() };
        let twin_result = TrialResult { trial: twin.clone(), measurement: ok_measurement(9.0) };
        let own_result = TrialResult { trial: a.trial.clone(), measurement: ok_measurement(1.0) };
        // One turn, while the trial runs: the twin's progress, refusal and
        // result, then the study's own result.
        let events = vec![
            rig.sealed(&AgentMessage::Progress(progress)),
            rig.sealed(&AgentMessage::Refuse(refusal)),
            rig.sealed(&AgentMessage::Result(twin_result)),
            rig.sealed(&AgentMessage::Result(own_result)),
        ];
        let (_, out) = rig.turn(events);
        let answers: Vec<(&TrialRef, &AckOutcome)> = acks(&out).into_iter().map(|a| (&a.trial, &a.outcome)).collect();
        assert!(
            matches!(&answers[..], [(t, AckOutcome::Refused(why)), (own, AckOutcome::Stored)]
                if **t == twin && **own == a.trial && why.contains("another study of that name")),
            "{answers:?}"
        );
        assert_eq!(out.len(), 2, "nothing else: {out:?}");
        assert_eq!(rig.stats.requeued, 0, "the twin's refusal requeued nothing");
        assert!(rig.store.progress(&a.trial).expect("progress").is_empty(), "the twin's epoch is not kept");
        // Once the trial is finished: still refused, never a duplicate.
        let outcome = answer(&mut rig, &twin, 9.0);
        assert!(
            matches!(&outcome, AckOutcome::Refused(why) if why.contains("another study of that name")),
            "{outcome:?}"
        );
        assert_eq!(answer(&mut rig, &a.trial, 1.0), AckOutcome::Duplicate, "its own attempt is");
        assert_eq!(rig.stats.other_study_refs, 4);
        let results = rig.store.results("s").expect("results");
        assert_eq!(results.iter().map(|r| r.objective).collect::<Vec<_>>(), [Some(1.0)], "this study's result alone");
        assert_eq!(rig.consistent(), Ok(()));
    }

    /// A coordinator restarted on its store knows no attempt history but
    /// the store's: a result of an attempt an earlier process gave is still
    /// a duplicate; one never given is refused, not acknowledged.
    #[test]
    fn after_a_restart_duplicate_only_for_an_attempt_the_store_knows() {
        let mut rig = Rig::new();
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, running: vec![] }));
        let a = assigned(rig.turn(vec![req]).1).pop().expect("work");
        assert_eq!(answer(&mut rig, &a.trial, 1.0), AckOutcome::Stored);
        // The restart: the scheduler as `start_study` rebuilds it from the store.
        let policy = StudyPolicy {
            name: "s".into(),
            id: RIG_STUDY_ID,
            selector: Default::default(),
            max_attempts: 3,
            lease_ms: 60_000,
        };
        let mut states = vec![Restored::Pending { last_attempt: 0, failures: 0 }; 4];
        states[a.trial.trial as usize] = Restored::Done;
        rig.sched = Scheduler::new();
        rig.sched.add_study(policy, states, 0);
        assert_eq!(answer(&mut rig, &a.trial, 1.0), AckOutcome::Duplicate, "the store knows the attempt");
        let never = TrialRef { attempt: a.trial.attempt + 1, ..a.trial.clone() };
        let outcome = answer(&mut rig, &never, 2.0);
        assert!(matches!(&outcome, AckOutcome::Refused(why) if why.contains("never gave")), "{outcome:?}");
        let twin = TrialRef { study_id: 1, ..a.trial.clone() };
        let outcome = answer(&mut rig, &twin, 3.0);
        assert!(matches!(&outcome, AckOutcome::Refused(why) if why.contains("another study")), "{outcome:?}");
        assert_eq!(rig.store.results("s").expect("results").len(), 1);
        assert_eq!((rig.stats.duplicate_results, rig.stats.unknown_results, rig.stats.other_study_refs), (1, 1, 1));
    }

    #[test]
    fn a_result_that_cannot_be_stored_is_refused_and_the_study_goes_on() {
        let mut rig = Rig::new();
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, running: vec![] }));
        let (_, out) = rig.turn(vec![req]);
        let Some(CoordinatorMessage::Assign(a)) = out.into_iter().map(|(_, m)| m).next() else { panic!("no work") };
        let huge = Measurement {
            wall_us: u64::MAX,
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        };
        let bad = rig.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: huge }));
        let (_, out) = rig.turn(vec![bad]);
        let answer = out.into_iter().find_map(|(_, m)| match m {
            CoordinatorMessage::Ack(ack) => Some(ack),
            _ => None,
        });
        let answer = answer.expect("answered");
        assert!(matches!(&answer.outcome, AckOutcome::Refused(why) if why.contains("wall_us")), "{answer:?}");
        assert_eq!(rig.stats.invalid_messages, 1);
        // A good result for the same attempt is still taken.
        let good = Measurement {
            wall_us: 5,
            final_metrics: [("v".to_string(), 1.0)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        };
        let ok = rig.sealed(&AgentMessage::Result(TrialResult { trial: a.trial, measurement: good }));
        let (_, out) = rig.turn(vec![ok]);
        assert!(out
            .iter()
            .any(|(_, m)| matches!(m, CoordinatorMessage::Ack(ResultAck { outcome: AckOutcome::Stored, .. }))));
        assert_eq!(rig.sched.counts("s").expect("study").done, 1);
    }

    /// Issue 20, finding 2: a segment starting past i64::MAX left
    /// `engine::turn` with a store error and ended the process; nothing was
    /// acknowledged, so the agent sent it again after every restart.
    #[test]
    fn regression_a_segment_past_i64_is_refused_and_the_study_goes_on() {
        let mut rig = Rig::new();
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, running: vec![] }));
        let (_, out) = rig.turn(vec![req]);
        let a = assigned(out).pop().expect("work");
        let mut m = full_measurement(1.0);
        m.segments[0].start_us = 9223372036854775813;
        let bad = rig.sealed(&AgentMessage::Result(TrialResult { trial: a.trial.clone(), measurement: m }));
        let (_, out) = rig.turn(vec![bad]);
        let ack = acks(&out).pop().cloned().expect("answered");
        assert!(
            matches!(&ack.outcome, AckOutcome::Refused(why) if why.contains("measurement.segments[0].start_us")),
            "{ack:?}"
        );
        assert_eq!(
            (rig.stats.invalid_messages, rig.stats.store_errors),
            (1, 0),
            "refused by validation, before the store"
        );
        // The attempt still runs: its good result is taken, and the study goes on.
        let ok = rig.sealed(&AgentMessage::Result(TrialResult { trial: a.trial, measurement: full_measurement(2.0) }));
        let (_, out) = rig.turn(vec![ok]);
        assert_eq!(acks(&out).pop().map(|a| a.outcome.clone()), Some(AckOutcome::Stored));
        assert_eq!(rig.sched.counts("s").expect("study").done, 1);
        assert_eq!(rig.consistent(), Ok(()));
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 2, free: 1, running: vec![] }));
        assert_eq!(assigned(rig.turn(vec![req]).1).len(), 1, "more work is handed out");
    }

    /// A store error while handling one message undoes that message alone:
    /// the other messages of the turn are kept, the result is answered
    /// Refused (the agent parks it), and the scheduler is left as the store
    /// has it, so the same result is taken once the store takes it.
    #[test]
    fn a_store_error_rolls_back_its_message_alone() {
        let mut rig = Rig::new();
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 2, running: vec![] }));
        let work = assigned(rig.turn(vec![req]).1);
        assert_eq!(work.len(), 2);
        let (t0, t1) = (work[0].trial.clone(), work[1].trial.clone());
        rig.store
            .execute_for_test(&format!(
                "CREATE TRIGGER planted BEFORE INSERT ON results WHEN NEW.trial = {}
                 BEGIN SELECT RAISE(ABORT, 'planted failure'); END;",
                t0.trial
            ))
            .expect("trigger");
        let result = |trial: &TrialRef| {
            AgentMessage::Result(TrialResult { trial: trial.clone(), measurement: full_measurement(1.0) })
        };
        let progress = AgentMessage::Progress(Progress {
            trial: t1.clone(),
            epoch: 1,
            elapsed_us: 5,
            metrics: [("v".to_string(), 0.5)].into(),
            checkpoint: None,
            profile: None,
        });
        let events = vec![rig.sealed(&progress), rig.sealed(&result(&t0)), rig.sealed(&result(&t1))];
        let (_, out) = rig.turn(events);
        let answers: Vec<(u64, AckOutcome)> =
            acks(&out).into_iter().map(|a| (a.trial.trial, a.outcome.clone())).collect();
        assert!(
            matches!(&answers[..], [(a, AckOutcome::Refused(why)), (b, AckOutcome::Stored)]
                if *a == t0.trial && *b == t1.trial && why.contains("planted failure")),
            "{answers:?}"
        );
        assert_eq!(rig.stats.store_errors, 1);
        assert_eq!(rig.store.progress(&t1).expect("progress").len(), 1, "the turn's other messages are kept");
        assert_eq!(rig.sched.counts("s").expect("study").done, 1, "the refused result is not counted");
        assert_eq!(rig.consistent(), Ok(()));
        // The store takes it again: the same result is stored, not a duplicate.
        rig.store.execute_for_test("DROP TRIGGER planted").expect("drop");
        let again = rig.sealed(&result(&t0));
        let (_, out) = rig.turn(vec![again]);
        assert_eq!(acks(&out).pop().map(|a| a.outcome.clone()), Some(AckOutcome::Stored));
        assert_eq!(rig.sched.counts("s").expect("study").done, 2);
        assert_eq!(rig.consistent(), Ok(()));
    }

    /// Issue 20, finding 6: a checkpoint became options of another agent's
    /// command. Checkpoints outside `resume_prefix` are not kept, malformed
    /// ones are refused with their message, and a kept one is one argument.
    #[test]
    fn regression_checkpoints_stay_under_their_prefix_and_one_argument() {
        let study = STUDY.replace(
            "[objective]",
            "resume = [\"--resume\", \"{checkpoint}\"]\nresume_prefix = \"s3://bucket/ckpt/\"\n[objective]",
        );
        let mut rig = Rig::with_study(&study);
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, running: vec![] }));
        let a = assigned(rig.turn(vec![req]).1).pop().expect("work");
        let progress = |epoch: u32, checkpoint: &str| {
            AgentMessage::Progress(Progress {
                trial: a.trial.clone(),
                epoch,
                elapsed_us: 5,
                metrics: Default::default(),
                checkpoint: Some(checkpoint.into()),
                profile: None,
            })
        };
        let events = vec![
            rig.sealed(&progress(1, "s3://bucket/ckpt/t0 e1")),
            rig.sealed(&progress(2, "/home/victim/.bashrc")),
            rig.sealed(&progress(3, "s3://bucket/ckpt/../../victim")),
            rig.sealed(&progress(4, "--output=/home/victim/.bashrc\n\u{1b}[31mFORGED")),
        ];
        rig.turn(events);
        assert_eq!(rig.stats.refused_checkpoints, 2, "outside the prefix: refused, not kept");
        assert_eq!(rig.stats.invalid_messages, 1, "an option with control characters: the message is refused");
        let stored: Vec<Option<String>> =
            rig.store.study_progress("s").expect("progress").into_iter().map(|p| p.checkpoint).collect();
        assert_eq!(stored, vec![Some("s3://bucket/ckpt/t0 e1".to_string()), None, None]);
        // The agent gives the trial back: the next attempt resumes from the one kept checkpoint.
        let refuse = rig.sealed(&AgentMessage::Refuse(Refusal { trial: a.trial.clone(), reason: "draining".into() }));
        rig.turn(vec![refuse]);
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 2, free: 1, running: vec![] }));
        let next = assigned(rig.turn(vec![req]).1).pop().expect("work again");
        assert_eq!(next.trial.trial, a.trial.trial);
        let argv = &next.spec.argv;
        assert_eq!(&argv[argv.len() - 2..], ["--resume", "s3://bucket/ckpt/t0 e1"], "{argv:?}");
    }

    /// Stable-toolchain fuzzing (the `fuzz/` target needs nightly): seeded
    /// random frames, and mutations of real frames sealed in a real session
    /// (bytes flipped, inserted, deleted, cut; both the frame on the wire
    /// and the body under a valid MAC), go through the transport's check and
    /// the engine's own decode, open, validate and handle path, several a
    /// turn. Nothing panics, the engine keeps going, the scheduler and the
    /// store agree. Runs 3 s; `TUNEFLEET_FUZZ_SECS` for longer,
    /// `TUNEFLEET_FUZZ_SEED` for another seed.
    #[test]
    fn random_and_mutated_frames_never_stop_the_engine() {
        use rand::{Rng, SeedableRng};
        let secs: f64 = std::env::var("TUNEFLEET_FUZZ_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3.0);
        let seed: u64 = std::env::var("TUNEFLEET_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut rig = Rig::new();
        let req = rig.sealed(&AgentMessage::Request(WorkRequest { seq: 1, free: 2, running: vec![] }));
        let work = assigned(rig.turn(vec![req]).1);
        let live = work.first().map(|w| w.trial.clone()).expect("work");
        let seeds: Vec<AgentMessage> = vec![
            AgentMessage::Request(WorkRequest { seq: 2, free: 1, running: vec![live.clone()] }),
            AgentMessage::Progress(Progress {
                trial: live.clone(),
                epoch: 1,
                elapsed_us: 5,
                metrics: [("v".to_string(), 0.5)].into(),
                checkpoint: Some("/ckpt/1".into()),
                profile: full_measurement(1.0).window_profile,
            }),
            AgentMessage::Result(TrialResult { trial: live.clone(), measurement: full_measurement(1.0) }),
            AgentMessage::Refuse(Refusal { trial: live, reason: "busy".into() }),
            AgentMessage::Telemetry(tunefleet_common::measurement::Telemetry {
                unix_ms: 1,
                interval_ms: 1000,
                cpu_utilisation: 0.5,
                per_cpu: vec![0.5, 0.25],
                memory_used_bytes: 1 << 30,
                memory_total_bytes: 1 << 32,
                power_watts: Some(12.0),
                power_source: EnergySourceKind::Rapl,
                running: 1,
                foreign_cpu: Some(0.1),
                conditions: Default::default(),
            }),
            AgentMessage::Status(AgentStatus { online: true, instance: 1 }),
            AgentMessage::Synced(7),
        ];
        let bodies: Vec<(AgentTopic, Vec<u8>)> = seeds
            .iter()
            .map(|m| (AgentTopic::of_agent_message(m), tunefleet_common::encode(m).expect("encode")))
            .collect();
        let mutate = |rng: &mut rand::rngs::StdRng, mut bytes: Vec<u8>, most: u32| {
            for _ in 0..rng.random_range(1..=most) {
                let at = rng.random_range(0..=bytes.len());
                match rng.random_range(0..5) {
                    0 if at < bytes.len() => bytes[at] ^= 1 << rng.random_range(0..8),
                    1 if at < bytes.len() => bytes[at] = rng.random(),
                    2 => bytes.insert(at, rng.random()),
                    3 if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => bytes.truncate(at),
                }
            }
            bytes
        };
        let kinds = AgentTopic::ALL;
        let started = Instant::now();
        let mut inputs = 0u64;
        while started.elapsed().as_secs_f64() < secs {
            let mut events = Vec::new();
            for _ in 0..rng.random_range(1..8) {
                let (kind, body) = bodies[rng.random_range(0..bodies.len())].clone();
                let ev = match rng.random_range(0..4) {
                    // Random bytes on any topic agents publish on.
                    0 => {
                        let junk: Vec<u8> = (0..rng.random_range(0..256)).map(|_| rng.random()).collect();
                        wire(kinds[rng.random_range(0..kinds.len())], &junk)
                    }
                    // A real sealed frame, mutated on the wire (its MAC mostly fails).
                    1 => {
                        let session = rig.agent.as_mut().expect("welcomed");
                        let frame =
                            tunefleet_common::encode(&UpFrame::Sealed(session.seal(kind, body))).expect("encode");
                        wire(kind, &mutate(&mut rng, frame, 4))
                    }
                    // A mutated body under a valid MAC: it reaches decode, validate and handle.
                    _ => {
                        // One change at a time mostly decodes: the values change, not the shape.
                        let most = if rng.random_bool(0.7) { 1 } else { 4 };
                        let body = mutate(&mut rng, body, most);
                        // An offline status would end the session and every later frame with it.
                        if let Ok(AgentMessage::Status(AgentStatus { online: false, .. })) =
                            tunefleet_common::decode(&body)
                        {
                            continue;
                        }
                        rig.sealed_body(kind, body)
                    }
                };
                events.push(ev);
                inputs += 1;
            }
            rig.turn(events);
            assert_eq!(rig.consistent(), Ok(()));
        }
        let rate = inputs as f64 / started.elapsed().as_secs_f64();
        let st = &rig.stats;
        // Opened, decoded and judged by validation or the handlers.
        let reached = st.invalid_messages + st.duplicate_results + st.unknown_results + st.assignments;
        println!(
            "fuzzed {inputs} frames in {:.1} s: {rate:.0} a second (seed {seed}); {reached} reached validation and the handlers",
            started.elapsed().as_secs_f64()
        );
        assert!(inputs > 100, "too few inputs: {inputs}");
        assert!(st.rejected_messages > 0 && st.bad_tokens > 0 && reached > 10, "{st:?}");
        // Still going: a result for an attempt never given is answered.
        let stray = TrialRef { study: "s".into(), study_id: RIG_STUDY_ID, trial: 3, attempt: 9 };
        let msg = rig.sealed(&AgentMessage::Result(TrialResult { trial: stray, measurement: full_measurement(1.0) }));
        let (_, out) = rig.turn(vec![msg]);
        assert_eq!(acks(&out).len(), 1, "the engine still answers");
        assert_eq!(rig.store.trials("s").expect("trials").len(), 4);
    }
}
