//! The engine's core: every decision of a turn, with no I/O but the store
//! (no MQTT, no tokio, no clock: the turn's clocks come in as [`Now`]).
//!
//! [`Core::turn`] takes the control requests, then the broker's events
//! (each through the gate, decided by the dispatch and applied in a savepoint of its own: `super::apply`), and on a
//! tick expires leases and runs the offloading decider; then it tops up each
//! study's trials, hands out work and performs every scheduler effect
//! (`super::effects`), commits, and returns what to send ([`Outgoing`]).
//! The caller sends it only now: an agent forgets a result only once it is
//! on disk. Starting a study is `super::start`'s.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tunefleet_common::message::CoordinatorMessage;

use super::active::{ActiveStudy, Summary};
use super::apply::handle_all;
use super::ctx::{co_messages, Ctx};
use super::effects::{cancel, offload, schedule, Turn};
use super::types::{Answer, Ask, Inbound};
pub use super::types::{EngineError, EngineStats, Now};
use crate::domain::comeasure::CoMeasures;
use crate::domain::offload::{LoadHistory, OffloadPolicy};
use crate::domain::reuse::Book;
use crate::domain::sched::{Scheduler, StudyCounts};
use crate::runtime::auth::Sessions;
use crate::store::{Committing, Store};

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
    /// The turn's commit: nothing above is sent before it has landed
    /// (on a file it has).
    pub committed: Committing,
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
    telemetry: LoadHistory,
    offload: Option<OffloadPolicy>,
    last_decision_ms: u64,
    /// Profiles, clusters and reuse, loaded from the store with the first study.
    pub(super) book: Option<Book>,
    /// When the heartbeat was last written (Unix ms).
    beat_ms: u64,
    /// Nodes measuring other agents' trials (`[measure] nodes`).
    pub(super) co: CoMeasures,
    /// Bytes of a study's store one agent may take ([`StudyPolicy::store_share`]).
    pub(super) store_share: u64,
    /// Studies to take back from the store after it was lost
    /// ([`Core::restore`]) that have not started again yet.
    unrestored: Vec<Unrestored>,
    /// Studies this run had cancelled before it took them back from the
    /// store: cancelled again at the next turn (what the store kept of
    /// the cancellation may be less).
    recancel: Vec<String>,
    /// Studies whose submit was answered with a lost database: the store
    /// may have kept them (the commit that opened one landed, the read
    /// after it failed). Taken back at the next tick, or with the others
    /// after a pause ([`Core::restore`]), where the store holds one as
    /// running; the store's other studies (a `run` beside a service on one
    /// store) are never looked at.
    pub(super) submitted_when_lost: Vec<crate::domain::study::Study>,
}

/// A study to take back from the store ([`Core::restore`]), with what this
/// run decided of it, which stays decided.
struct Unrestored {
    study: crate::domain::study::Study,
    cancelled: bool,
    failed_fast: Option<String>,
    at_start: (u64, u64),
    first_assigned: Option<Instant>,
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
            telemetry: LoadHistory::default(),
            offload: None,
            last_decision_ms: 0,
            book: None,
            beat_ms: 0,
            co: CoMeasures::default(),
            store_share: u64::MAX,
            unrestored: Vec::new(),
            recancel: Vec::new(),
            submitted_when_lost: Vec::new(),
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
    pub fn with_offload(mut self, policy: Option<OffloadPolicy>) -> Self {
        self.offload = policy;
        self
    }

    /// Queues the points of every stored result in the store's InfluxDB
    /// outbox, in the same transaction as the result.
    pub fn with_influx(mut self, on: bool) -> Self {
        self.influx = on;
        self
    }

    /// One turn: the control requests `asks` (submitted studies start first,
    /// each in its own transaction), then in one transaction the
    /// cancellations, `events` in order, and on a `tick` the expired leases
    /// and the offloading decider's verdicts; new trials, assignments, and
    /// every effect in the store; its commit sent. Returns what to send
    /// once that commit has landed ([`Outgoing::committed`]): on a server
    /// the next turn may be built meanwhile, its writes after this one's.
    pub fn turn(
        &mut self,
        events: impl IntoIterator<Item = Inbound>,
        asks: Vec<Ask>,
        tick: bool,
        now: Now,
    ) -> Result<Outgoing, EngineError> {
        let mut out = Outgoing::default();
        if tick {
            self.take_back_submitted(now, &mut out.started)?;
        }
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
                Ask::Enqueue { study, params } => answers.push(Some(self.enqueue(&study, &params))),
                Ask::Tell { study, params } => answers.push(Some(self.tell(&study, &params))),
            }
        }
        let waits = (now.unix_ms >= self.beat_ms.saturating_add(BEAT_MS)).then(|| self.waits());
        let mut batch = self.store.batch()?;
        if let Some(waits) = waits {
            batch.beat(std::process::id(), now.unix_ms, false, super::warm::broker_counters().as_deref(), &waits)?;
            self.beat_ms = now.unix_ms;
        }
        let mut effects = Vec::new();
        for study in std::mem::take(&mut self.recancel) {
            let _ = cancel(&mut self.sched, &mut self.studies, &study, &mut effects);
        }
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
        out.committed = batch.commit_pipelined()?;
        Ok(out)
    }

    /// After the store's database was lost inside a turn or under a commit
    /// (what this core holds may be ahead of what the store kept): every
    /// study it runs is taken back from the store, as a coordinator started
    /// again takes it, and every session ends (each agent says Hello again
    /// and sends what it kept). What this run decided of a study stays
    /// decided: one it cancelled (from the control socket, or for its
    /// failures) is cancelled again at the next turn, and its failures
    /// still count from this run's start. The store's owner starts over
    /// ([`crate::store::Store::failed_commit_seen`]). A database lost again
    /// meanwhile is the error; the studies not yet taken back are kept for
    /// the next call. A study submitted as the database was lost is taken
    /// too where the store kept it, though its submit was answered with
    /// the error ([`Core::submitted_when_lost`]). What the progress display
    /// starts again with.
    pub fn restore(&mut self, now: Now) -> Result<Vec<Started>, EngineError> {
        self.store.failed_commit_seen();
        let held = self.studies.drain().map(|(_, a)| Unrestored {
            study: a.study,
            cancelled: a.cancelled,
            failed_fast: a.failed_fast,
            at_start: a.at_start,
            first_assigned: a.first_assigned,
        });
        self.unrestored.extend(held);
        self.unrestored.sort_by(|a, b| a.study.name.cmp(&b.study.name));
        self.unrestored.dedup_by(|a, b| a.study.name == b.study.name);
        self.sched = Scheduler::new();
        self.unsynced.clear();
        self.telemetry = LoadHistory::default();
        self.last_decision_ms = 0;
        self.book = None;
        self.beat_ms = 0;
        self.co = CoMeasures::default();
        self.end_sessions();
        let mut started = Vec::new();
        while let Some(study) = self.unrestored.first().map(|u| u.study.clone()) {
            started.push(self.start_study(study, now)?);
            let taken = self.unrestored.remove(0);
            if let Some(active) = self.studies.get_mut(&taken.study.name) {
                active.at_start = taken.at_start;
                active.failed_fast = taken.failed_fast;
                active.first_assigned = taken.first_assigned;
            }
            if taken.cancelled {
                self.recancel.push(taken.study.name);
            }
        }
        self.take_back_submitted(now, &mut started)?;
        Ok(started)
    }

    /// Starts each study of [`Core::submitted_when_lost`] that the store
    /// holds as running and this core does not run, into `started`; the
    /// others are forgotten. Whether or not the engine paused: a read after
    /// the commit that opened one may fail on a connection that was made
    /// again before the turn's own commit.
    fn take_back_submitted(&mut self, now: Now, started: &mut Vec<Started>) -> Result<(), EngineError> {
        while let Some(study) = self.submitted_when_lost.first().cloned() {
            let kept = self.store.study(&study.name)?.is_some_and(|s| s.state == crate::store::StudyState::Running);
            if kept && !self.studies.contains_key(&study.name) {
                tracing::warn!(study = %study.name, "a study submitted as the database was lost, kept by the store: taken back");
                started.push(self.start_study(study, now)?);
            }
            self.submitted_when_lost.remove(0);
        }
        Ok(())
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

    /// Whether the store's database answers now, else why not.
    pub fn store_reachable(&self) -> Result<(), crate::store::StoreError> {
        self.store.reachable()
    }

    /// The engine has seen a commit of its store fail (its database lost)
    /// and writes nothing until it has taken its studies back
    /// ([`Core::restore`]): what is sent to the store runs again
    /// ([`Store::failed_commit_seen`]), so whether it answers can be asked.
    pub fn failed_commit_seen(&self) {
        self.store.failed_commit_seen();
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
