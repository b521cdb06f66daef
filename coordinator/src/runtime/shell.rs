//! The engine's async shell ([`Engine`]): it waits for broker events,
//! control-socket requests and ticks, reads the clocks, hands each batch to
//! the core ([`Core::turn`], no I/O but the store), and performs what the
//! core returns: answers the requests, seals and publishes the messages,
//! ticks the launcher, refreshes the retained status and the progress
//! display. What a turn sends is published by a task of its own once the
//! turn's commit has landed ([`publish_landed`]): on a server the next turn
//! is built meanwhile. At the end it asks every agent to confirm delivery
//! ([`Engine`]'s `sync`). Of the running coordinator, this is the file that
//! joins the engine to the transport and the control socket; the engine
//! imports neither.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tunefleet_common::message::{frames, CoordinatorMessage};
use tunefleet_common::topic::AgentTopic;

use crate::domain::study::Study;
use crate::runtime::auth::Sessions;
use crate::runtime::control::Request;
use crate::runtime::engine::types::unix_ms;
use crate::runtime::engine::{Answer, Core, EngineError, Inbound, Now, Summary};
use crate::runtime::progress::ProgressDisplay;
use crate::runtime::transport::Outbox;
use crate::store::{Committing, Store, StoreError};

/// Most events applied in one store transaction.
const MAX_BATCH: usize = 2048;

/// `first`, then whatever else is waiting, up to [`MAX_BATCH`]: one turn's events.
fn take_waiting(first: Inbound, inbound: &mut mpsc::Receiver<Inbound>, events: &mut Vec<Inbound>) {
    events.push(first);
    while events.len() < MAX_BATCH {
        match inbound.try_recv() {
            Ok(ev) => events.push(ev),
            Err(_) => break,
        }
    }
}
/// How long a finishing coordinator waits for its agents to confirm that
/// every acknowledgement it sent has arrived.
pub const SYNC_GRACE: Duration = Duration::from_secs(5);

/// The coordinator while it runs: the core, and what it talks through.
pub struct Engine {
    core: Core,
    outbox: Outbox,
    /// When the engine started: the core's clock counts from here.
    epoch: Instant,
    progress: ProgressDisplay,
    /// Agents sent something other than a Sync since this was last cleared.
    sent_to: HashSet<String>,
    /// Control-socket requests waiting for the next turn.
    requests: Vec<Request>,
    /// Starts agents while studies have work (`--launcher`).
    launcher: Option<crate::runtime::launch::Launcher>,
    /// When the status was last published again (engine clock).
    status_ms: u64,
    /// Room on the store's disk: below its floor the engine pauses.
    space: Option<crate::runtime::disk::Guard>,
    /// Messages dropped while paused (their agents send them again).
    dropped_while_paused: u64,
    /// The store's database was lost in a turn or under a commit (why):
    /// paused until it answers again ([`Engine::paused_for_database`]).
    database_lost: Option<EngineError>,
    /// Why the database did not answer the last time it was asked, while
    /// paused for it: said again only when it changes.
    still_lost: Option<String>,
    /// Publishes each turn's frames once its commit has landed; started
    /// with the first.
    publisher: Option<Publisher>,
}

/// How many turns may wait for their commits to land, besides the one
/// the publisher waits for: the turn built meanwhile queues behind them.
const TURNS_LANDING: usize = 1;

/// What a turn sealed, and the answers to its control requests: published
/// once its commit has landed ([`publish_landed`]).
#[derive(Default)]
struct Sending {
    committed: Committing,
    welcomes: Vec<(String, Vec<u8>)>,
    frames: Vec<(String, AgentTopic, Vec<u8>)>,
    answers: Vec<(oneshot::Sender<Answer>, Answer)>,
    /// Told once this (and all before it) is published.
    flushed: Option<oneshot::Sender<()>>,
}

/// The task that publishes what each turn sealed, in the turns' order.
struct Publisher {
    queue: mpsc::Sender<Sending>,
    /// Where it says why it stopped: a commit that failed.
    failed: oneshot::Receiver<StoreError>,
    task: tokio::task::JoinHandle<()>,
}

/// Publishes each of `queue`'s turns once its commit has landed. A commit
/// that fails ends it, said on `failed`: nothing of that turn or of those
/// queued after it (built on it) is sent, their control requests are told
/// so, and the engine stops, or pauses for a lost database
/// ([`Engine::pause_if_database_lost`]).
async fn publish_landed(outbox: Outbox, mut queue: mpsc::Receiver<Sending>, failed: oneshot::Sender<StoreError>) {
    while let Some(mut sending) = queue.recv().await {
        if let Err(e) = sending.committed.landed().await {
            let why = format!(
                "not known to be done: the store's commit failed ({e}); look with `tunefleet status` and ask again \
                 if need be"
            );
            // Said before the queue closes: whoever finds it closed reads why.
            let _ = failed.send(e);
            queue.close();
            // This turn's answers, and those of the turns built on it.
            let mut unsent = vec![sending];
            while let Ok(s) = queue.try_recv() {
                unsent.push(s);
            }
            for (reply, _) in unsent.iter_mut().flat_map(|s| s.answers.drain(..)) {
                let _ = reply.send(Answer::Error { message: why.clone() });
            }
            return;
        }
        for (agent, payload) in sending.welcomes {
            if let Err(e) = outbox.send(&agent, AgentTopic::Welcome, payload).await {
                tracing::warn!(agent = %agent, error = %e, "could not send");
            }
        }
        for (agent, kind, payload) in sending.frames {
            if let Err(e) = outbox.send(&agent, kind, payload).await {
                tracing::warn!(agent = %agent, error = %e, "could not send");
            }
        }
        for (reply, answer) in sending.answers {
            let _ = reply.send(answer);
        }
        if let Some(flushed) = sending.flushed {
            let _ = flushed.send(());
        }
    }
}

impl Engine {
    pub fn new(store: Store, outbox: Outbox, progress: ProgressDisplay, sessions: Sessions) -> Self {
        Engine {
            core: Core::new(store, sessions),
            outbox,
            epoch: Instant::now(),
            progress,
            sent_to: HashSet::new(),
            requests: Vec::new(),
            launcher: None,
            status_ms: 0,
            space: None,
            dropped_while_paused: 0,
            still_lost: None,
            database_lost: None,
            publisher: None,
        }
    }

    /// Pauses while the store's disk has less room than `guard`'s floor.
    pub fn with_space(mut self, guard: Option<crate::runtime::disk::Guard>) -> Self {
        self.space = guard;
        self
    }

    /// Whether the engine is paused for its store's database, lost in a
    /// turn or under a commit ([`Engine::pause_if_database_lost`]); looked
    /// at again each tick. Once it answers, the core takes every study back
    /// from the store, as a coordinator started again would (what it held
    /// may be ahead of what the store kept: [`Core::restore`]), and goes
    /// on. Paused and resumed as for room on the disk
    /// ([`Engine::paused_for_space`]).
    fn paused_for_database(&mut self, events: &mut Vec<Inbound>, tick: bool) -> Result<bool, EngineError> {
        if self.database_lost.is_none() {
            return Ok(false);
        }
        if tick && self.database_answers() {
            let now = self.now();
            match self.core.restore(now) {
                Ok(started) => {
                    tracing::warn!(
                        dropped = self.dropped_while_paused,
                        studies = started.len(),
                        "the store's database answers again: studies taken back from the store, going on (agents \
                         say Hello again and send what they kept)"
                    );
                    for s in &started {
                        self.progress.start(&s.study, s.total, s.done);
                    }
                    self.database_lost = None;
                    self.still_lost = None;
                    return Ok(false);
                }
                Err(e) if e.database_lost() => {
                    tracing::warn!(error = %e, "the store's database was lost again while the studies were taken back")
                }
                Err(e) => return Err(e),
            }
        }
        self.dropped_while_paused += events.len() as u64;
        events.clear();
        for r in self.requests.drain(..) {
            let _ = r.reply.send(Answer::Error { message: "the store's database is unreachable: paused".into() });
        }
        Ok(true)
    }

    /// Whether the store's database answers, paused for it; why not said
    /// when it first does not, and again whenever the reason changes (the
    /// server back up but refusing this coordinator's login, say).
    fn database_answers(&mut self) -> bool {
        match self.core.store_reachable() {
            Ok(()) => true,
            Err(e) => {
                let why = e.to_string();
                if self.still_lost.as_deref() != Some(why.as_str()) {
                    tracing::warn!(error = %why, "the store's database does not answer: still paused");
                    self.still_lost = Some(why);
                }
                false
            }
        }
    }

    /// `e` ends the engine, unless it says the store's database was lost:
    /// then nothing more is sent of the turns not yet published (none of
    /// their commits is known to have landed), `replies` are told why, and
    /// the engine pauses until the database answers and it has taken its
    /// studies back from the store ([`Engine::paused_for_database`]).
    fn pause_if_database_lost(
        &mut self,
        e: EngineError,
        replies: Vec<oneshot::Sender<Answer>>,
    ) -> Result<(), EngineError> {
        if !e.database_lost() {
            return Err(e);
        }
        tracing::error!(error = %e, "the store's database is unreachable: paused (no message taken, no trial assigned; agents keep their results) until it answers, then the studies are taken back from the store");
        for reply in replies {
            let _ = reply.send(Answer::Error { message: format!("the store's database is unreachable: {e}") });
        }
        // Ended (its commit failed) or idle (all it had was published).
        if let Some(publisher) = self.publisher.take() {
            publisher.task.abort();
        }
        self.core.failed_commit_seen();
        self.database_lost = Some(e);
        Ok(())
    }

    /// Whether the engine is paused for room on the store's disk, after a
    /// look at it. Paused, it takes no message and assigns nothing: what
    /// came is dropped (an agent keeps its results until acknowledged) and
    /// control requests are answered with the reason. Resumed, every
    /// session ends: each agent is told so at its next message, says Hello
    /// again and sends what it kept, as after a coordinator's restart.
    fn paused_for_space(&mut self, events: &mut Vec<Inbound>) -> bool {
        use crate::runtime::disk::{readable, Change};
        let now = self.now();
        let Some(guard) = self.space.as_mut() else { return false };
        match guard.look(now.engine_ms) {
            Change::Same => {}
            Change::Paused { free } => tracing::error!(
                store = %guard.path.display(),
                free = %readable(free),
                floor = %readable(guard.floor),
                "the store's disk is nearly full: paused (no message taken, no trial assigned; agents keep their \
                 results) until it has room again"
            ),
            Change::Resumed { free } => {
                tracing::warn!(
                    free = %readable(free),
                    dropped = self.dropped_while_paused,
                    "the store's disk has room again: going on (agents say Hello again and send what they kept)"
                );
                self.core.end_sessions();
            }
        }
        if !guard.paused() {
            return false;
        }
        self.dropped_while_paused += events.len() as u64;
        events.clear();
        if let Err(e) = self.core.beat_while_paused(now.unix_ms) {
            tracing::debug!(error = %e, "no heartbeat while paused");
        }
        let why = format!("the store's disk is nearly full ({}): paused until it has room", guard.path.display());
        for r in self.requests.drain(..) {
            let _ = r.reply.send(Answer::Error { message: why.clone() });
        }
        true
    }

    /// Moves trials off agents the decider finds overloaded ([`crate::domain::offload`]).
    pub fn with_offload(mut self, policy: Option<crate::domain::offload::OffloadPolicy>) -> Self {
        self.core = self.core.with_offload(policy);
        self
    }

    /// Bounds what one agent may take of each study's store (bytes).
    pub fn with_store_share(mut self, bytes: u64) -> Self {
        self.core = self.core.with_store_share(bytes);
        self
    }

    /// Starts agents with `launcher` while studies have work.
    pub fn with_launcher(mut self, launcher: Option<crate::runtime::launch::Launcher>) -> Self {
        self.launcher = launcher;
        self
    }

    /// Queues the points of every stored result in the store's InfluxDB
    /// outbox, in the same transaction as the result.
    pub fn with_influx(mut self, on: bool) -> Self {
        self.core = self.core.with_influx(on);
        self
    }

    /// The clocks, read once for a turn.
    fn now(&self) -> Now {
        Now { engine_ms: self.epoch.elapsed().as_millis() as u64, unix_ms: unix_ms(), instant: Instant::now() }
    }

    /// Creates the study in the store, or resumes it if it is there already
    /// with the same configuration, and starts scheduling its trials.
    pub fn start_study(&mut self, study: Study) -> Result<(), EngineError> {
        let now = self.now();
        let started = self.core.start_study(study, now)?;
        self.progress.start(&started.study, started.total, started.done);
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
        requests: mpsc::Receiver<Request>,
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
        mut requests: Option<mpsc::Receiver<Request>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Vec<Summary>, EngineError> {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(Duration::from_millis(250));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events = Vec::with_capacity(MAX_BATCH);
        let mut announced = HashSet::new();
        loop {
            if self.announce_finished(studies, &mut announced).await? {
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
                    Some(ev) => take_waiting(ev, &mut inbound, &mut events),
                    None => return Err(EngineError::TransportClosed),
                },
                _ = ticker.tick() => tick = true,
            }
            if self.paused_for_space(&mut events) || self.paused_for_database(&mut events, tick)? {
                continue;
            }
            self.turn(&mut events, tick).await?;
        }
        // Stopped while the database was lost: what the core holds is not
        // what the store kept, and nothing of it is written or sent.
        if let Some(e) = self.database_lost.take() {
            return Err(e);
        }
        self.sync(&mut inbound, SYNC_GRACE).await?;
        // Nodes still measuring attempts stop: this coordinator records
        // nothing more of them (a window asked during the sync included).
        let abandoned = self.core.abandon_comeasures();
        self.send(Vec::new(), abandoned).await?;
        self.stop_publishing().await?;
        let names: Vec<String> = match studies {
            Some(s) => s.to_vec(),
            None => {
                let mut all: Vec<String> = self.core.study_names();
                all.sort();
                all
            }
        };
        let summaries: Vec<Summary> = names.iter().map(|s| self.core.summary(s, Instant::now())).collect();
        // Finished: every trial ended and the search has no more (a study
        // stopped before it made a trial is not finished).
        let finished: Vec<&str> = summaries
            .iter()
            .map(|s| s.study.as_str())
            .filter(|s| self.core.counts(s).is_some_and(|c| c.finished()))
            .collect();
        self.core.finish_studies(&finished, unix_ms())?;
        self.core.stop(unix_ms())?;
        self.progress.finish();
        if let Err(e) = self.outbox.close(SYNC_GRACE).await {
            tracing::warn!(error = %e, "closing the MQTT connection");
        }
        Ok(summaries)
    }

    /// Says which studies have finished since the last look (a run of
    /// several, or a service, where each is also recorded finished);
    /// whether every study of a run (`studies`) has finished and no node's
    /// measurement of one is awaited: the run is done.
    async fn announce_finished(
        &mut self,
        studies: Option<&[String]>,
        announced: &mut HashSet<String>,
    ) -> Result<bool, EngineError> {
        let names: Vec<String> = match studies {
            Some(s) => s.to_vec(),
            None => self.core.study_names(),
        };
        // Paused for the database, what the core holds is not what the
        // store kept: nothing is taken for finished until it is restored.
        let finished: Vec<&String> = match self.database_lost {
            Some(_) => Vec::new(),
            None => names.iter().filter(|s| self.core.counts(s).is_none_or(|c| c.finished())).collect(),
        };
        for s in &finished {
            if (names.len() > 1 || studies.is_none()) && !announced.contains(*s) {
                if studies.is_none() {
                    let recorded = match self.flush().await {
                        Ok(()) => self.core.finish_studies(&[s.as_str()], unix_ms()),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = recorded {
                        // Recorded, and said, once the study is taken back finished.
                        self.pause_if_database_lost(e, Vec::new())?;
                        break;
                    }
                }
                announced.insert((*s).clone());
                let c = self.core.counts(s).unwrap_or_default();
                // Scripts read this line, once a study: a campaign's progress per workload.
                self.progress.note(&format!(
                    "finished: {s}: {}/{} trials done, {} failed, {} stopped ({} of {} studies finished)",
                    c.done,
                    c.total,
                    c.failed,
                    c.stopped,
                    announced.len(),
                    names.len()
                ));
            }
        }
        // Done once the nodes measuring the last trials have answered
        // (or were given up on: `comeasure::GIVE_UP_MS`), and the commits
        // that finished them have landed.
        let done = studies.is_some() && finished.len() == names.len() && self.core.awaiting_comeasures() == 0;
        if done {
            if let Err(e) = self.flush().await {
                self.pause_if_database_lost(e, Vec::new())?;
                return Ok(false);
            }
        }
        Ok(done)
    }

    /// Asks every agent with a session to confirm that all sent before has
    /// arrived (the acknowledgements above all), and waits for the answers
    /// (at most `grace`), handling whatever else comes meanwhile: an agent
    /// sent anything after it confirmed (the ack of a cancelled attempt's
    /// result) is asked again. Agents answer once no trial they were told
    /// to cancel is still running.
    async fn sync(&mut self, inbound: &mut mpsc::Receiver<Inbound>, grace: Duration) -> Result<(), EngineError> {
        let agents: Vec<String> = self.core.sessions().live_agents().map(str::to_string).collect();
        self.sent_to = agents.into_iter().collect();
        let deadline = tokio::time::Instant::now() + grace;
        let mut events = Vec::new();
        loop {
            // Agents sent anything since their last Sync are asked (again): a
            // newer Sync replaces the one still awaited.
            let again: Vec<String> = self.sent_to.drain().filter(|a| self.core.sessions().is_live(a)).collect();
            let nonce: u64 = rand::random();
            let msgs: Vec<_> = again.iter().map(|a| (a.clone(), CoordinatorMessage::Sync(nonce))).collect();
            self.core.await_sync(again, nonce);
            self.send(Vec::new(), msgs).await?;
            if self.core.unconfirmed().is_empty() {
                break;
            }
            tokio::select! {
                ev = inbound.recv() => match ev {
                    // What else has come goes into the same turn: with
                    // 10,000 agents confirming, a turn (and the look over
                    // every unconfirmed agent above) per confirmation was
                    // N x N.
                    Some(ev) => take_waiting(ev, inbound, &mut events),
                    None => break,
                },
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(agents = ?self.core.unconfirmed(), "agents did not confirm delivery in time");
                    break;
                }
            }
            self.turn(&mut events, false).await?;
            // Lost meanwhile: nothing more is written or sent.
            if let Some(e) = self.database_lost.take() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Welcomes, then `msgs` sealed, published after everything queued
    /// before (at once when nothing waits for a commit).
    async fn send(
        &mut self,
        welcomes: Vec<(String, Vec<u8>)>,
        msgs: Vec<(String, CoordinatorMessage)>,
    ) -> Result<(), EngineError> {
        let sending = self.sealed(Sending { welcomes, ..Sending::default() }, msgs);
        self.queue(sending).await
    }

    /// `sending` with `msgs` sealed into its frames, each agent's in the
    /// order sent, bundled where they fit one frame.
    fn sealed(&mut self, mut sending: Sending, msgs: Vec<(String, CoordinatorMessage)>) -> Sending {
        // What each agent gets, in the order sent, bundled (an ack and the
        // next assignment: one frame); a bundle too large for one message
        // goes out one by one.
        for (agent, msgs) in by_agent(msgs) {
            if msgs.iter().any(|m| !matches!(m, CoordinatorMessage::Sync(_))) {
                self.sent_to.insert(agent.clone());
            }
            for group in frames(msgs, CoordinatorMessage::bundleable) {
                let bundle = (group.len() >= 2)
                    .then(|| CoordinatorMessage::bundle(&group))
                    .and_then(|b| b.map_err(|e| tracing::error!(agent = %agent, error = %e, "cannot bundle")).ok());
                if let Some(bundle) = bundle {
                    match self.seal(&agent, &bundle) {
                        Some((kind, payload)) if payload.len() <= tunefleet_common::MAX_MESSAGE_BYTES => {
                            sending.frames.push((agent.clone(), kind, payload));
                            continue;
                        }
                        // Too large together: one by one.
                        Some(_) => {}
                        // No session: none of them can be sealed either.
                        None => continue,
                    }
                }
                for msg in group {
                    if let Some((kind, payload)) = self.seal(&agent, &msg) {
                        sending.frames.push((agent.clone(), kind, payload));
                    }
                }
            }
        }
        sending
    }

    /// Hands `sending` to the publisher (started with the first), waiting
    /// while [`TURNS_LANDING`] turns wait for their commits before it. A
    /// commit that failed before is the error.
    async fn queue(&mut self, sending: Sending) -> Result<(), EngineError> {
        let outbox = &self.outbox;
        let publisher = self.publisher.get_or_insert_with(|| {
            let (queue, jobs) = mpsc::channel(TURNS_LANDING);
            let (said, failed) = oneshot::channel();
            let task = tokio::spawn(publish_landed(outbox.clone(), jobs, said));
            Publisher { queue, failed, task }
        });
        match publisher.queue.send(sending).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError(unsent)) => {
                let e = self.publishing_failed();
                for (reply, _) in unsent.answers {
                    let message = format!("not done: a commit of the store before it failed ({e})");
                    let _ = reply.send(Answer::Error { message });
                }
                Err(e)
            }
        }
    }

    /// Why the publisher stopped: the commit that failed.
    fn publishing_failed(&mut self) -> EngineError {
        match self.publisher.as_mut().map(|p| p.failed.try_recv()) {
            Some(Ok(e)) => EngineError::Store(e),
            _ => EngineError::TransportClosed,
        }
    }

    /// Waits until everything queued is published: a commit that failed
    /// is the error.
    async fn flush(&mut self) -> Result<(), EngineError> {
        let (flushed, done) = oneshot::channel();
        self.queue(Sending { flushed: Some(flushed), ..Sending::default() }).await?;
        match done.await {
            Ok(()) => Ok(()),
            Err(_) => Err(self.publishing_failed()),
        }
    }

    /// Publishes what is queued and ends the publisher.
    async fn stop_publishing(&mut self) -> Result<(), EngineError> {
        self.flush().await?;
        if let Some(Publisher { queue, task, .. }) = self.publisher.take() {
            drop(queue);
            if let Err(e) = task.await {
                tracing::warn!(error = %e, "the publisher ended badly");
            }
        }
        Ok(())
    }

    /// `msg` sealed in `agent`'s session; `None` (said why) without one.
    fn seal(&mut self, agent: &str, msg: &CoordinatorMessage) -> Option<(AgentTopic, Vec<u8>)> {
        match self.core.sessions_mut().seal(agent, msg) {
            Some(Ok(sealed)) => Some(sealed),
            Some(Err(e)) => {
                tracing::error!(agent = %agent, error = %e, "cannot seal a message");
                None
            }
            None => {
                tracing::debug!(agent = %agent, "no session: message not sent");
                None
            }
        }
    }

    /// One turn: the core applies `events` and the waiting requests in one
    /// transaction and sends its commit; the answers and the messages,
    /// sealed, go to the publisher, which sends them once that commit has
    /// landed; then the launcher, the status and the progress display.
    async fn turn(&mut self, events: &mut Vec<Inbound>, tick: bool) -> Result<(), EngineError> {
        let now = self.now();
        let (asks, replies): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.requests).into_iter().map(|r| (r.ask, r.reply)).unzip();
        let out = match self.core.turn(events.drain(..), asks, tick, now) {
            Ok(out) => out,
            // Nothing sent after a commit that failed runs: that commit's
            // error, if one failed, is the one that tells.
            Err(e) => {
                let e = self.flush().await.err().unwrap_or(e);
                return self.pause_if_database_lost(e, replies);
            }
        };
        for s in &out.started {
            self.progress.start(&s.study, s.total, s.done);
        }
        if tick {
            if let Some(launcher) = self.launcher.as_mut() {
                let work = self.core.has_work();
                let online: HashSet<String> = self.core.sessions().live_agents().map(str::to_string).collect();
                let core = &mut self.core;
                launcher.tick(now.engine_ms, work, &|name| online.contains(name), &mut |names| {
                    core.mint_launch_token(names, now.unix_ms)
                });
            }
        }
        let answers = replies.into_iter().zip(out.answers).collect();
        let sending = Sending { committed: out.committed, welcomes: out.welcomes, answers, ..Sending::default() };
        let sending = self.sealed(sending, out.messages);
        if let Err(e) = self.queue(sending).await {
            return self.pause_if_database_lost(e, Vec::new());
        }
        // The retained online status says nothing of any turn: it need not
        // wait for the publisher's queue.
        let refresh = crate::runtime::transport::STATUS_REFRESH.as_millis() as u64;
        if tick && now.engine_ms >= self.status_ms + refresh {
            self.status_ms = now.engine_ms;
            if let Err(e) = self.outbox.refresh_status().await {
                tracing::warn!(error = %e, "cannot publish the coordinator status again");
            }
        }
        for st in self.core.standings() {
            let update = crate::runtime::progress::Update {
                finished: st.counts.done + st.counts.failed + st.counts.stopped,
                running: st.counts.running,
                closed_at: (!st.counts.open).then_some(st.counts.total),
                live_agents: st.live_agents,
                best: st.best,
            };
            self.progress.update(st.study, update);
        }
        Ok(())
    }
}

/// The next control request, or never when there is no control socket.
async fn next_request(requests: &mut Option<mpsc::Receiver<Request>>) -> Option<Request> {
    match requests {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// `msgs` by agent: each agent's in the order sent, the agents in the order
/// of their first message (what [`Engine`] bundles per agent).
fn by_agent(msgs: Vec<(String, CoordinatorMessage)>) -> Vec<(String, Vec<CoordinatorMessage>)> {
    let mut out: Vec<(String, Vec<CoordinatorMessage>)> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for (agent, msg) in msgs {
        match at.get(&agent) {
            Some(&i) => out[i].1.push(msg),
            None => {
                at.insert(agent.clone(), out.len());
                out.push((agent, vec![msg]));
            }
        }
    }
    out
}

#[cfg(test)]
mod by_agent_tests {
    use super::*;

    #[test]
    fn each_agent_gets_its_messages_in_the_order_sent() {
        let m = |agent: &str, n: u64| (agent.to_string(), CoordinatorMessage::Sync(n));
        let got = by_agent(vec![m("b", 1), m("a", 2), m("b", 3), m("a", 4), m("c", 5)]);
        let sync = |n| CoordinatorMessage::Sync(n);
        assert_eq!(
            got,
            vec![
                ("b".to_string(), vec![sync(1), sync(3)]),
                ("a".to_string(), vec![sync(2), sync(4)]),
                ("c".to_string(), vec![sync(5)])
            ]
        );
    }
}
