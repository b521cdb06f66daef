//! The engine's core: every decision of a turn, with no I/O but the store
//! (no MQTT, no tokio, no clock: the turn's clocks come in as [`Now`]).
//!
//! [`Core::turn`] takes the control requests, then the broker's events
//! (each through the gate, decided by the dispatch and applied in a savepoint of its own: `super::apply`), and on a
//! tick expires leases and runs the offloading decider; then it tops up each
//! study's trials, hands out work, applies every scheduler [`Effect`] to the
//! store, commits, and returns what to send ([`Outgoing`]). The caller sends
//! it only now: an agent forgets a result only once it is on disk. Also
//! here: starting a study, cancelling one, ASHA's early stops and
//! `[stability]` repeats.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tunefleet_common::message::{Assignment, Cancel, CoordinatorMessage};

use super::active::{ActiveStudy, Summary};
use super::apply::handle_all;
use super::ctx::{co_messages, Ctx};
use super::dispatch::usable_checkpoint;
use super::learn::load_book;
use super::types::{Answer, Ask, Inbound};
pub use super::types::{EngineError, EngineStats, Now};
use crate::domain::comeasure::CoMeasures;
use crate::domain::offload::{LoadChange, Policy, Telemetry};
use crate::domain::reuse::Book;
use crate::domain::sched::{Effect, Restored, Scheduler, StudyCounts, StudyPolicy};
use crate::domain::search::{self, Search, TrialPlan};
use crate::domain::study::Study;
use crate::runtime::auth::Sessions;
use crate::store::{Batch, Store, TrialState};

/// How often the coordinator's heartbeat is written (Unix ms), at most.
pub const BEAT_MS: u64 = 2_000;

/// Extra time a lease gets beyond the trial timeout (start-up, result delivery).
pub const LEASE_GRACE: Duration = Duration::from_secs(30);

/// What a turn decided to send, once its writes are committed.
#[derive(Debug, Default)]
pub struct Outgoing {
    /// Frames published as they are (Welcomes, stale-session notices), first.
    pub welcomes: Vec<(String, Vec<u8>)>,
    /// Messages to seal in each agent's session and publish.
    pub messages: Vec<(String, CoordinatorMessage)>,
    /// The answer to each control request, in the order they were asked.
    pub answers: Vec<Answer>,
    /// Studies started (or resumed) this turn, for the progress display.
    pub started: Vec<Started>,
}

/// A study that started: its name, the trials it plans, how many are finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub study: String,
    pub total: u64,
    pub done: u64,
}

/// One study's progress, for the display ([`Core::standings`]).
#[derive(Debug, Clone, Copy)]
pub struct Headway<'a> {
    pub study: &'a str,
    pub counts: StudyCounts,
    /// `(metric, value, trial)` of the best so far.
    pub best: Option<(&'a str, f64, u64)>,
    pub live_agents: usize,
}

/// The coordinator's state while it runs, without its transport.
pub struct Core {
    pub(super) store: Store,
    pub(super) sched: Scheduler,
    pub(super) studies: HashMap<String, ActiveStudy>,
    pub(super) stats: EngineStats,
    pub(super) agents_seen: HashSet<String>,
    /// Queue each stored result's points for InfluxDB (see [`crate::runtime::sink`]).
    influx: bool,
    pub(super) sessions: Sessions,
    /// Agents asked to confirm delivery ([`CoordinatorMessage::Sync`]) that have not yet.
    pub(super) unsynced: HashMap<String, u64>,
    /// Agents' recent telemetry, for the overload decider.
    telemetry: Telemetry,
    offload: Option<Policy>,
    last_decision_ms: u64,
    /// Profiles, clusters and reuse, loaded from the store with the first study.
    book: Option<Book>,
    /// When the heartbeat was last written (Unix ms).
    beat_ms: u64,
    /// Nodes measuring other agents' trials (`[measure] nodes`).
    pub(super) co: CoMeasures,
    /// Bytes of a study's store one agent may take ([`StudyPolicy::store_share`]).
    store_share: u64,
}

/// How long a launcher's join token admits the agents it was made for (a
/// batch job may wait in a queue for a while).
pub const LAUNCH_TOKEN_TTL_MS: u64 = 24 * 3_600_000;

impl Core {
    /// A join token for one launch batch: one use for each of `names`, and
    /// only for them, valid [`LAUNCH_TOKEN_TTL_MS`]; its public half in the
    /// store, its text for the launched agents' environment (never logged).
    pub fn mint_launch_token(&mut self, names: &[String], now_unix_ms: u64) -> Option<String> {
        let made = tunefleet_common::auth::JoinToken::generate(&self.sessions.public_key())
            .and_then(|t| t.public().map(|p| (t, p)));
        let (token, public) = match made {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "cannot make a launcher's join token");
                return None;
            }
        };
        let expires = now_unix_ms.saturating_add(LAUNCH_TOKEN_TTL_MS);
        if let Err(e) = self.store.create_launch_token(&public, names, expires, now_unix_ms) {
            tracing::error!(error = %e, "cannot keep a launcher's join token");
            return None;
        }
        tracing::info!(token = %crate::store::token_id(&public), agents = names.len(), "join token made for a launch batch");
        Some(token.to_string())
    }

    pub fn new(store: Store, sessions: Sessions) -> Self {
        Core {
            store,
            sched: Scheduler::new(),
            studies: HashMap::new(),
            stats: EngineStats::default(),
            agents_seen: HashSet::new(),
            influx: false,
            sessions,
            unsynced: HashMap::new(),
            telemetry: Telemetry::default(),
            offload: None,
            last_decision_ms: 0,
            book: None,
            beat_ms: 0,
            co: CoMeasures::default(),
            store_share: u64::MAX,
        }
    }

    /// Bounds what one agent's results and progress may take of each
    /// study's store to `bytes`.
    pub fn with_store_share(mut self, bytes: u64) -> Self {
        self.store_share = bytes;
        self
    }

    /// Moves trials off agents the decider finds overloaded ([`crate::domain::offload`]),
    /// and measures again what agents flag as disturbed.
    pub fn with_offload(mut self, policy: Option<Policy>) -> Self {
        self.offload = policy;
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
    fn submit(&mut self, text: &str, origin: &str, now: Now, shown: &mut Vec<Started>) -> Answer {
        let file = match crate::domain::study::parse(text, origin) {
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
            match self.start_study(study, now) {
                Ok(s) => shown.push(s),
                Err(e) => return Answer::Error { message: e.to_string() },
            }
            let total = self.sched.counts(&name).map_or(0, |c| c.total);
            tracing::info!(study = %name, "study submitted");
            started.push(format!("study {name} submitted ({total} trials so far)"));
        }
        Answer::Ok { message: started.join("\n") }
    }

    /// Creates the study in the store, or resumes it if it is there already
    /// with the same configuration, and starts scheduling its trials; what
    /// the progress display starts with.
    pub fn start_study(&mut self, study: Study, now: Now) -> Result<Started, EngineError> {
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
        let mut values: Vec<(u64, f64, Option<f64>, String)> = Vec::new();
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
                let also = study.also_figures(row.energy_j, row.wall_us.unwrap_or(0));
                search.tell_constrained(row.trial, &row.params, value, &also, row.violation);
                values.push((row.trial, value, row.violation, agent));
            }
        }
        super::warm::warm_start(&self.store, &study, &mut search)?;
        let policy = StudyPolicy {
            name: study.name.clone(),
            id,
            selector: study.selector.clone(),
            max_attempts: study.max_attempts,
            ahead_per_slot: study.ahead_per_slot(),
            ahead_per_agent: study.ahead_per_agent(),
            lease_ms: study.timeout_ms() + LEASE_GRACE.as_millis() as u64,
            gpus: study.gpus,
            store_share: self.store_share,
        };
        self.sched.add_study(policy, states, now.engine_ms);
        self.sched.set_written(&study.name, self.store.written_by_agent(&study.name)?);
        self.sched.set_open(&study.name, !search.exhausted());
        let c = self.sched.counts(&study.name).unwrap_or_default();
        let shown = Started {
            study: study.name.clone(),
            total: search.planned().max(c.total),
            done: c.done + c.failed + c.stopped,
        };
        let mut active = ActiveStudy::new(study, search, plans);
        active.at_start = (c.failed, c.done);
        for (trial, value, violation, agent) in values {
            active.record_value(trial, value, violation, &agent);
        }
        self.replay_progress(&mut active, &stopped)?;
        self.studies.insert(active.study.name.clone(), active);
        Ok(shown)
    }

    /// What a coordinator that stopped had seen of `active`'s epochs, from
    /// the store: early stopping's rungs, the checkpoint each trial's latest
    /// attempt reported, and the last report of each trial ASHA `stopped`
    /// told to the search.
    fn replay_progress(
        &self,
        active: &mut ActiveStudy,
        stopped: &HashMap<u64, tunefleet_common::params::Params>,
    ) -> Result<(), EngineError> {
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
        Ok(())
    }

    /// One turn: the control requests `asks` (submitted studies start first,
    /// each in its own transaction), then in one transaction the
    /// cancellations, `events` in order, and on a `tick` the expired leases
    /// and the offloading decider's verdicts; new trials, assignments, and
    /// every effect in the store; committed. Returns what to send now.
    pub fn turn(
        &mut self,
        events: impl IntoIterator<Item = Inbound>,
        asks: Vec<Ask>,
        tick: bool,
        now: Now,
    ) -> Result<Outgoing, EngineError> {
        let mut out = Outgoing::default();
        let mut answers: Vec<Option<Answer>> = Vec::with_capacity(asks.len());
        let mut cancels = Vec::new();
        for ask in asks {
            match ask {
                Ask::Submit { study, origin } => {
                    answers.push(Some(self.submit(&study, &origin, now, &mut out.started)))
                }
                Ask::Cancel { study } => {
                    cancels.push((answers.len(), study));
                    answers.push(None);
                }
            }
        }
        let waits = (now.unix_ms >= self.beat_ms.saturating_add(BEAT_MS)).then(|| self.waits());
        let mut batch = self.store.batch()?;
        if let Some(waits) = waits {
            batch.beat(std::process::id(), now.unix_ms, false, super::warm::broker_counters().as_deref(), &waits)?;
            self.beat_ms = now.unix_ms;
        }
        let mut effects = Vec::new();
        for (i, study) in cancels {
            if let Some(answer) = answers.get_mut(i) {
                *answer = Some(cancel(&mut self.sched, &mut self.studies, &study, &mut effects));
            }
        }
        out.answers = answers.into_iter().flatten().collect();
        handle_all(
            &mut Ctx {
                sched: &mut self.sched,
                batch: &mut batch,
                studies: &mut self.studies,
                stats: &mut self.stats,
                agents_seen: &mut self.agents_seen,
                out: &mut out.messages,
                welcomes: &mut out.welcomes,
                effects: &mut effects,
                influx: self.influx,
                sessions: &mut self.sessions,
                unsynced: &mut self.unsynced,
                telemetry: &mut self.telemetry,
                now,
                remeasure: self.offload.is_some(),
                book: self.book.get_or_insert_with(Default::default),
                co: &mut self.co,
            },
            events,
        )?;
        if tick {
            let sched = &self.sched;
            let (again, missing) = self.co.tick(now.engine_ms, |starter, trial| sched.awaits_result(starter, trial));
            out.messages.extend(co_messages(again));
            for record in &missing {
                tracing::warn!(trial = %record.trial, node = %record.agent, "a node did not say what it measured of the trial");
                self.stats.comeasures_missing += 1;
                batch.record_node(record, now.unix_ms)?;
            }
            effects.extend(self.sched.expire(now.engine_ms));
            if let Some(policy) = self.offload.filter(|p| now.engine_ms >= self.last_decision_ms + p.interval_ms) {
                self.last_decision_ms = now.engine_ms;
                effects.extend(offload(&mut self.sched, &self.telemetry, &policy, now.engine_ms));
            }
        }
        let mut turn = Turn {
            sched: &mut self.sched,
            batch: &mut batch,
            studies: &mut self.studies,
            stats: &mut self.stats,
            out: &mut out.messages,
            co: &mut self.co,
        };
        schedule(&mut turn, effects, now)?;
        batch.commit()?;
        Ok(out)
    }

    /// Whether any study has trials left to run (the launcher starts agents then).
    pub fn has_work(&self) -> bool {
        self.studies.keys().any(|s| self.sched.counts(s).is_some_and(|c| !c.finished()))
    }

    /// Records `studies` as finished at `unix_ms`.
    pub fn finish_studies(&mut self, studies: &[&str], unix_ms: u64) -> Result<(), EngineError> {
        let mut batch = self.store.batch()?;
        for s in studies {
            batch.finish_study(s, unix_ms)?;
        }
        batch.commit()?;
        Ok(())
    }

    /// Why each waiting study waits (JSON, study -> reason): what `status` shows.
    fn waits(&self) -> String {
        let waits: serde_json::Map<String, serde_json::Value> = self
            .studies
            .iter()
            .filter_map(|(name, a)| Some((name.clone(), serde_json::Value::String(a.waits.clone()?))))
            .collect();
        serde_json::Value::Object(waits).to_string()
    }

    /// A heartbeat while paused for room on the store's disk (one small
    /// write every [`BEAT_MS`]): `status` says paused, not interrupted.
    pub fn beat_while_paused(&mut self, unix_ms: u64) -> Result<(), EngineError> {
        if unix_ms < self.beat_ms.saturating_add(BEAT_MS) {
            return Ok(());
        }
        let waits = self.waits();
        let mut batch = self.store.batch()?;
        batch.beat(std::process::id(), unix_ms, true, super::warm::broker_counters().as_deref(), &waits)?;
        batch.commit()?;
        self.beat_ms = unix_ms;
        Ok(())
    }

    /// The coordinator stops: its last heartbeat says so (`status` then
    /// tells its studies are not running).
    pub fn stop(&mut self, unix_ms: u64) -> Result<(), EngineError> {
        let mut batch = self.store.batch()?;
        batch.stop_beat(unix_ms)?;
        batch.commit()?;
        Ok(())
    }

    /// The studies this core runs, in no order.
    pub fn study_names(&self) -> Vec<String> {
        self.studies.keys().cloned().collect()
    }

    /// How `study`'s trials stand, if this core runs it.
    pub fn counts(&self, study: &str) -> Option<StudyCounts> {
        self.sched.counts(study)
    }

    /// Each running study's progress, for the display.
    pub fn standings(&self) -> impl Iterator<Item = Headway<'_>> {
        self.studies.iter().filter_map(|(name, active)| {
            Some(Headway {
                study: name,
                counts: self.sched.counts(name)?,
                best: active.best().map(|b| (active.study.objective.metric.as_str(), b.value, b.trial)),
                live_agents: self.sched.live_agents(),
            })
        })
    }

    /// The agents' sessions (the shell seals what it sends in them).
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    pub fn sessions_mut(&mut self) -> &mut Sessions {
        &mut self.sessions
    }

    /// Ends every session: each agent is told so at its next message and
    /// says Hello again (after a pause for room on the store's disk).
    pub fn end_sessions(&mut self) {
        let live: Vec<String> = self.sessions.live_agents().map(str::to_string).collect();
        for agent in &live {
            self.sessions.end(agent);
        }
    }

    /// Nodes whose measurement of a trial's window is still awaited.
    pub fn awaiting_comeasures(&self) -> usize {
        self.co.awaiting()
    }

    /// Every node still measuring is told to stop: this coordinator records
    /// nothing more of them. The messages that tell them.
    pub fn abandon_comeasures(&mut self) -> Vec<(String, CoordinatorMessage)> {
        co_messages(self.co.abandon_all()).collect()
    }

    /// `agents` were asked to confirm delivery with `nonce`
    /// ([`CoordinatorMessage::Sync`]): their answer is awaited.
    pub fn await_sync(&mut self, agents: Vec<String>, nonce: u64) {
        self.unsynced.extend(agents.into_iter().map(|a| (a, nonce)));
    }

    /// The agents whose confirmation is still awaited; an agent whose
    /// session ended (it went offline) has nothing more to confirm.
    pub fn unconfirmed(&mut self) -> Vec<String> {
        let sessions = &self.sessions;
        self.unsynced.retain(|a, _| sessions.is_live(a));
        let mut left: Vec<String> = self.unsynced.keys().cloned().collect();
        left.sort();
        left
    }

    /// What `study` looks like now (`now`: the clock its time is measured to).
    pub fn summary(&self, study: &str, now: Instant) -> Summary {
        let c = self.sched.counts(study).unwrap_or_default();
        let active = self.studies.get(study);
        Summary {
            study: study.to_string(),
            total: c.total,
            done: c.done,
            failed: c.failed,
            stopped: c.stopped,
            finished: c.finished(),
            planned: active.map_or(c.total, |a| a.search.planned().max(c.total)),
            best: active.and_then(|a| a.best()),
            elapsed: active
                .and_then(|a| a.first_assigned)
                .map(|first| now.saturating_duration_since(first))
                .unwrap_or_default(),
            stats: self.stats.clone(),
            agents_seen: self.agents_seen.len(),
            ask_depth: active.map(|a| a.search.ask_depth().clone()).filter(|d| d.asks() > 0),
            failed_fast: active.and_then(|a| a.failed_fast.clone()),
        }
    }
}

/// Says (once each time it changes) why a study with nothing running
/// waits while agents are online that cannot run it: the GPUs, arch, tags,
/// energy, cores or memory it asks for against what each agent offers.
fn say_why_waiting(sched: &Scheduler, studies: &mut HashMap<String, ActiveStudy>) {
    for (name, active) in studies.iter_mut().filter(|(_, a)| !a.cancelled) {
        let idle = sched.counts(name).is_some_and(|c| !c.finished() && c.running == 0);
        let why = if idle { sched.why_waiting(name) } else { None };
        if why != active.waits {
            match &why {
                Some(w) => tracing::warn!(study = %name, "study waits: {w}"),
                None if active.waits.is_some() => {
                    tracing::info!(study = %name, "study no longer waits for a fitting agent")
                }
                None => {}
            }
            active.waits = why;
        }
    }
}

/// Stops each study whose failures in this run reach what it allows
/// ([`crate::domain::study::Study::fails_fast`]), as a cancel does: no more
/// trials, the running ones cancelled on their agents.
fn fail_fast(sched: &mut Scheduler, studies: &mut HashMap<String, ActiveStudy>, effects: &mut Vec<Effect>) {
    let tripped: Vec<(String, String)> = studies
        .iter()
        .filter(|(_, a)| !a.cancelled)
        .filter_map(|(name, a)| {
            let c = sched.counts(name)?;
            let (failed, done) = (c.failed.saturating_sub(a.at_start.0), c.done.saturating_sub(a.at_start.1));
            Some((name.clone(), a.study.fails_fast(failed, done)?))
        })
        .collect();
    for (name, why) in tripped {
        tracing::error!(study = %name, %why, "study stopped for its failures: fix the cause and run it again to go on");
        let _ = cancel(sched, studies, &name, effects);
        if let Some(a) = studies.get_mut(&name) {
            a.failed_fast = Some(why);
        }
    }
}

/// The decider's verdicts, applied: overloaded agents get no trials and
/// their running ones move.
fn offload(sched: &mut Scheduler, telemetry: &Telemetry, policy: &Policy, now: u64) -> Vec<Effect> {
    let mut effects = Vec::new();
    for decision in crate::domain::offload::decide(policy, telemetry, |a| sched.overloaded(a).is_some(), now) {
        match decision {
            LoadChange::Overloaded { agent, why } => {
                tracing::warn!(agent = %agent, reason = %why, "agent overloaded: no new trials, its trials move");
                effects.extend(sched.set_overloaded(&agent, Some(why), now));
            }
            LoadChange::Recovered { agent } => {
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
            // Listed only for a strategy that reads them: it is a scan of
            // the study's trials (TPE's ask is linear in them anyway), which
            // would make every other study's cost per trial grow with its size.
            let running: Vec<(u64, &tunefleet_common::params::Params)> = if active.search.reads_running() {
                active
                    .plans
                    .iter()
                    .filter(|p| !sched.is_finished(name, p.trial))
                    .map(|p| (p.trial, &p.params))
                    .collect()
            } else {
                Vec::new()
            };
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

/// Cancels `name`: no more trials; every trial not finished is stopped, and
/// its running attempt cancelled on its agent.
fn cancel(
    sched: &mut Scheduler,
    studies: &mut HashMap<String, ActiveStudy>,
    name: &str,
    effects: &mut Vec<Effect>,
) -> Answer {
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
    Answer::Ok {
        message: format!(
            "study {name} cancelled: {running} attempts cancelled on their agents (running, or held to start next)"
        ),
    }
}

/// What the end of a turn touches.
struct Turn<'a, 'b> {
    sched: &'a mut Scheduler,
    batch: &'a mut Batch<'b>,
    studies: &'a mut HashMap<String, ActiveStudy>,
    stats: &'a mut EngineStats,
    out: &'a mut Vec<(String, CoordinatorMessage)>,
    co: &'a mut CoMeasures,
}

/// The end of a turn: new trials where agents have room, assignments, and
/// every effect applied to the store.
fn schedule(t: &mut Turn<'_, '_>, mut effects: Vec<Effect>, now: Now) -> Result<(), EngineError> {
    fail_fast(t.sched, t.studies, &mut effects);
    top_up(t.sched, t.batch, t.studies)?;
    say_why_waiting(t.sched, t.studies);
    effects.extend(t.sched.assign(now.engine_ms));
    for effect in effects {
        apply(t, effect, now)?;
    }
    Ok(())
}

/// The nodes that measure with `trial` (its study's `[measure] nodes`, by
/// the tags the operator granted them) start measuring: it starts now.
fn co_start(t: &mut Turn<'_, '_>, agent: &str, trial: &tunefleet_common::message::TrialRef, now: Now) {
    let Some(tags) = t.studies.get(&trial.study).and_then(|a| a.study.measure_nodes.as_ref()) else { return };
    // An agent has its nodes measure at most as many of its trials at once
    // as it has slots: a member that says it started every trial it holds
    // does not make every node open a window for each.
    let slots = t.sched.live_slots(agent).unwrap_or(1).max(1) as usize;
    if t.co.measuring_for(agent) >= slots {
        tracing::debug!(agent = %agent, trial = %trial, slots, "no co-measurement: its nodes already measure as many of its trials as it has slots");
        return;
    }
    let nodes = t.sched.agents_tagged(tags);
    // Until the lease the scheduler gave (longer for a trial held ahead).
    let lease_ms = t.sched.lease_left(trial, now.engine_ms).unwrap_or(0);
    let sends = t.co.start(trial, agent, nodes, (now.unix_ms, now.engine_ms), lease_ms);
    t.out.extend(co_messages(sends));
}

/// An attempt that ended without a result: the nodes measuring it forget it.
fn abandon(t: &mut Turn<'_, '_>, trial: &tunefleet_common::message::TrialRef) {
    let sends = t.co.abandon(trial);
    t.out.extend(co_messages(sends));
}

/// Does what the scheduler decided: an assignment rendered, recorded and
/// queued for its agent (and the nodes that measure with it told to
/// start), a cancel queued, a trial's end recorded (at `now`, Unix
/// milliseconds).
fn apply(t: &mut Turn<'_, '_>, effect: Effect, now: Now) -> Result<(), EngineError> {
    match effect {
        Effect::Assign { agent, trial, request_seq, ahead } => {
            let Some(active) = t.studies.get_mut(&trial.study) else { return Ok(()) };
            active.first_assigned.get_or_insert(now.instant);
            let Some(plan) = active.plans.get(trial.trial as usize) else { return Ok(()) };
            let checkpoint = active.checkpoints.get(&trial.trial);
            if let Some((epoch, _)) = checkpoint.filter(|_| !active.study.resume.is_empty()) {
                tracing::info!(trial = %trial, agent = %agent, epoch, "goes on from its last checkpoint");
            }
            match search::render_resumed(&active.study, active.probe.as_ref(), plan, &trial, checkpoint) {
                Ok(spec) => {
                    t.batch.record_assignment(&trial, &agent, now.unix_ms)?;
                    t.stats.assignments += 1;
                    // A trial held ahead has its nodes started once it starts.
                    if !ahead {
                        co_start(t, &agent, &trial, now);
                    }
                    t.out.push((agent, CoordinatorMessage::Assign(Assignment { trial, request_seq, spec })));
                }
                Err(e) => {
                    // Validated at load time, so this is a bug; fail the trial rather than loop.
                    tracing::error!(trial = %trial, error = %e, "command template does not render");
                    t.batch.fail_trial(&trial.study, trial.trial, &e.to_string())?;
                }
            }
        }
        Effect::Cancel { agent, trial, reason } => {
            tracing::info!(agent = %agent, trial = %trial, reason = %reason, "cancelling");
            t.out.push((agent, CoordinatorMessage::Cancel(Cancel { trial, reason })));
        }
        Effect::Requeued { trial, reason } => {
            t.stats.requeued += 1;
            tracing::info!(trial = %trial, reason = %reason, "trial requeued");
            t.batch.requeue(&trial, &reason)?;
            abandon(t, &trial);
        }
        Effect::Failed { trial, reason } => {
            tracing::warn!(trial = %trial, reason = %reason, "trial failed");
            t.batch.fail_trial(&trial.study, trial.trial, &reason)?;
            abandon(t, &trial);
        }
        Effect::Moved { trial, from, reason } => {
            t.stats.moved += 1;
            tracing::warn!(trial = %trial, from = %from, reason = %reason, "trial moved");
            t.batch.requeue(&trial, &format!("moved off {from}: {reason}"))?;
            abandon(t, &trial);
        }
        Effect::Started { agent, trial } => co_start(t, &agent, &trial, now),
        Effect::LostHeld { agent, trials, places } => {
            t.stats.lost_held += u64::from(trials);
            tracing::warn!(agent = %agent, trials, places, lost = t.stats.lost_held, "agent lost trials it held before they started (none counts a failure): it may hold fewer at once");
            t.batch.add_lost_held(&agent, trials)?;
        }
        Effect::Stopped { trial, reason } => {
            t.stats.stopped += 1;
            t.batch.stop_trial(&trial, &reason, now.unix_ms)?;
        }
    }
    Ok(())
}
