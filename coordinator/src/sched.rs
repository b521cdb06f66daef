//! Scheduling decisions, as a pure state machine: plain values in, plain
//! [`Effect`]s out, no sockets and no clocks (time is passed in as `now_ms`).
//!
//! * Pull: an agent's latest [`WorkRequest`] gives it credit (free slots);
//!   every assignment spends one. An agent never gets more than it asked for,
//!   nor more leases at once than the slots its Hello announced.
//! * Every assignment is a lease on one attempt of one trial. An agent that
//!   goes offline, or comes back as a new process, loses its leases and the
//!   trials go back to the queue at once; a lease past its deadline is
//!   cancelled and requeued. After `max_attempts` failed attempts a trial fails.
//! * Results are idempotent by trial and attempt. The first result of any
//!   attempt really handed to that agent completes the trial (a result that
//!   arrives after its agent was presumed dead is still a good result; the
//!   newer attempt is then cancelled); any later one is a duplicate or superseded.
//!   A trial failed because its attempts ran out has no result yet: the late
//!   result of one of those attempts completes it too, once.
//!
//! No event scans every trial or every agent. Each study indexes its leases
//! by deadline (an ordered set of `(deadline, trial)`: the expiry tick reads
//! only the leases that are due, and a lease that ends leaves it at once) and
//! by agent (an agent going offline, restarting or overloaded touches only
//! its own); the scheduler keeps the set of agents that have credit (a turn
//! visits only them) and a count of the live ones. Every lease starts in
//! `StudyState::lease` and ends in `StudyState::unlease`, which keep the
//! study's indexes; `Scheduler::sync_agent` keeps the fleet's after every
//! change to an agent. A property test checks them all against a full scan
//! after any sequence of events.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use tunefleet_common::message::{AgentInfo, AgentStatus, TrialRef, WorkRequest};

pub use crate::study::Selector;

/// What the scheduler needs to know of a study.
#[derive(Debug, Clone)]
pub struct StudyPolicy {
    pub name: String,
    /// The random id the store keeps for the study: every trial reference
    /// carries it, and one with another id is of another study of that name.
    pub id: u64,
    pub selector: Selector,
    pub max_attempts: u32,
    /// How long an attempt may hold its lease (trial timeout plus a grace).
    pub lease_ms: u64,
}

/// A trial's state when a study is (re)loaded from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    Pending { last_attempt: u32, failures: u32 },
    Running { agent: String, attempt: u32, failures: u32 },
    Done,
    Failed,
    Stopped,
}

/// What the engine must do because of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send this attempt to this agent (and record the assignment).
    Assign { agent: String, trial: TrialRef, request_seq: u64 },
    /// Tell this agent to stop this attempt.
    Cancel { agent: String, trial: TrialRef, reason: String },
    /// This attempt ended without a usable result; the trial is queued again.
    Requeued { trial: TrialRef, reason: String },
    /// The trial has used up its attempts.
    Failed { trial: TrialRef, reason: String },
    /// The trial was stopped early (final, not a failure, never retried).
    Stopped { trial: TrialRef, reason: String },
    /// This attempt was taken off `from` (overloaded, or its measurement
    /// disturbed): the trial is queued again, not counted as a failure, and
    /// kept off `from` for a while.
    Moved { trial: TrialRef, from: String, reason: String },
}

/// How a result relates to what the scheduler knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The trial is complete with this result.
    Accepted,
    /// This very attempt's result was already accepted.
    Duplicate,
    /// Another attempt's result was accepted first; keep this one as such.
    Superseded,
    /// The attempt failed for reasons of its own (could not start, cancelled): retried.
    Retried,
    /// No such study, trial, or attempt of this agent: refuse it.
    Unknown,
    /// The measurement was disturbed (load from outside, the device's
    /// conditions): the trial is measured again elsewhere.
    Remeasured,
}

/// A result's verdict and what it does to its trial, from
/// [`Scheduler::judge`], done by [`Scheduler::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: Verdict,
    change: Change,
    agent: String,
    trial: TrialRef,
}

/// What settling a judgement changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    Nothing,
    /// A stopped attempt's own result arrived.
    Delivered,
    /// Measured again elsewhere, for this reason.
    Remeasure(String),
    /// The attempt ended without a result, for this reason.
    Retry(String),
    /// The trial is done; `revive` when it had failed for want of a result.
    Complete {
        success: bool,
        revive: bool,
        this_is_live: bool,
    },
}

/// Whether a result completes its trial or asks for another attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultKind {
    /// The workload ran; `success` is false when it exited non-zero or was killed.
    Complete {
        success: bool,
    },
    Retry(String),
    /// The workload ran, but its measurement says it was disturbed.
    Interfered {
        success: bool,
        reason: String,
    },
}

/// An agent's device class: what makes its measurements comparable with
/// another's (`x86_64, 2 cores, rapl`).
pub fn device_class(info: &AgentInfo) -> String {
    let energy = info.energy.iter().find(|e| e.readable).map_or("no energy", |e| e.kind.as_str());
    format!("{}, {} cores, {energy}", info.arch, info.cores)
}

/// Measurements refused for interference before a disturbed one is taken.
pub const MAX_REMEASURES: u32 = 2;
/// How long a trial moved off an agent stays off it.
pub const AVOID_MS: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    agent: String,
    attempt: u32,
    deadline_ms: u64,
    /// Loaded from the store after a coordinator restart, not assigned by this process.
    restored: bool,
    /// The agent's request this lease answered (0 when restored).
    seq: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Pending,
    Running(Lease),
    Done {
        agent: String,
        attempt: u32,
    },
    Failed,
    /// Stopped early; `delivered` once the stopped attempt's result arrived.
    Stopped {
        agent: String,
        attempt: u32,
        delivered: bool,
    },
}

#[derive(Debug, Clone)]
struct TrialSlot {
    state: State,
    last_attempt: u32,
    failures: u32,
    /// Which agent ran which attempt: only these may deliver results.
    history: Vec<(u32, String)>,
    /// Agents this trial was moved off, and until when (ms) it stays off them.
    avoid: Vec<(String, u64)>,
    /// Measurements refused for interference so far.
    remeasures: u32,
    /// Once moved or measured again: the device class it must stay in, so
    /// its measurements stay comparable (and a checkpoint fits).
    class: Option<String>,
}

impl TrialSlot {
    /// A trial in `state` that no attempt has touched yet.
    fn new(state: State) -> Self {
        TrialSlot {
            state,
            last_attempt: 0,
            failures: 0,
            history: Vec::new(),
            avoid: Vec::new(),
            remeasures: 0,
            class: None,
        }
    }
}

#[derive(Debug)]
struct StudyState {
    policy: StudyPolicy,
    trials: Vec<TrialSlot>,
    queue: VecDeque<u64>,
    finished: u64,
    failed: u64,
    stopped: u64,
    /// The running trials by lease deadline: one entry per trial in
    /// `State::Running`, so its length is the number running.
    deadlines: BTreeSet<(u64, u64)>,
    /// The running trials by the agent holding their lease.
    held: HashMap<String, BTreeSet<u64>>,
    /// Agents whose leases ended since the last turn (their withheld credit
    /// is given back at the next [`Scheduler::assign`]).
    released: Vec<String>,
    /// The credit of the ready agents that match the selector, so that
    /// [`Scheduler::demand`] needs no scan.
    ready_credit: u64,
    /// Leases restored from the store, by agent, until that agent's first request.
    restored: BTreeMap<String, Vec<u64>>,
    /// More trials may still be added ([`Scheduler::add_trial`]): the study
    /// is not finished even when every trial it has is.
    open: bool,
}

impl StudyState {
    /// Trial `i` runs under `lease` (it was not running).
    fn lease(&mut self, i: u64, lease: Lease) {
        let Some(slot) = usize::try_from(i).ok().and_then(|i| self.trials.get_mut(i)) else { return };
        self.deadlines.insert((lease.deadline_ms, i));
        match self.held.get_mut(&lease.agent) {
            Some(trials) => {
                trials.insert(i);
            }
            None => {
                self.held.insert(lease.agent.clone(), BTreeSet::from([i]));
            }
        }
        slot.state = State::Running(lease);
    }

    /// Takes the lease off trial `i`, if it runs: the trial is left
    /// `Pending` (the caller says what it becomes) and out of the indexes.
    fn unlease(&mut self, i: u64) -> Option<Lease> {
        let slot = usize::try_from(i).ok().and_then(|i| self.trials.get_mut(i))?;
        if !matches!(slot.state, State::Running(_)) {
            return None;
        }
        let State::Running(lease) = std::mem::replace(&mut slot.state, State::Pending) else { return None };
        self.deadlines.remove(&(lease.deadline_ms, i));
        if let Some(trials) = self.held.get_mut(&lease.agent) {
            // An empty set stays (it allocates nothing): one per agent that ever held a lease here.
            trials.remove(&i);
        }
        self.released.push(lease.agent.clone());
        Some(lease)
    }

    /// How many trials run now.
    fn running(&self) -> u64 {
        self.deadlines.len() as u64
    }

    /// The trials whose lease `agent` holds, in trial order.
    fn held_by(&self, agent: &str) -> Vec<u64> {
        self.held.get(agent).map(|t| t.iter().copied().collect()).unwrap_or_default()
    }

    /// Ends the running attempt of trial `i` without a result: the trial is
    /// queued again, or failed once it has used up its attempts.
    fn end_attempt(&mut self, i: u64, trial: TrialRef, reason: String) -> Option<Effect> {
        self.unlease(i)?;
        let slot = self.trials.get_mut(usize::try_from(i).ok()?)?;
        slot.failures += 1;
        if slot.failures >= self.policy.max_attempts {
            slot.state = State::Failed;
            self.failed += 1;
            Some(Effect::Failed { reason: format!("{} attempts failed, last: {reason}", slot.failures), trial })
        } else {
            // At the front: a recycled trial should not wait behind the whole study.
            self.queue.push_front(i);
            Some(Effect::Requeued { trial, reason })
        }
    }

    /// Takes trial `i` off `agent` because of `why` without counting a
    /// failure: queued again at the front, kept off `agent` for
    /// [`AVOID_MS`] and, when `class` is known, in that device class.
    fn move_off(&mut self, i: u64, agent: &str, class: Option<String>, now_ms: u64) -> Option<Lease> {
        let lease = self.unlease(i)?;
        let slot = self.trials.get_mut(usize::try_from(i).ok()?)?;
        slot.avoid.push((agent.to_string(), now_ms.saturating_add(AVOID_MS)));
        slot.class = class;
        self.queue.push_front(i);
        Some(lease)
    }
}

#[derive(Debug)]
struct AgentState {
    /// Its name, shared with the fleet's indexes.
    name: Arc<str>,
    info: Option<AgentInfo>,
    online: bool,
    instance: u64,
    credit: u32,
    /// What its last request asked for beyond the slots its leases left
    /// free: given back, one per lease that ends, up to what it asked.
    withheld: u32,
    last_seq: Option<u64>,
    /// Why the agent gets no trials now (the decider found it overloaded).
    overloaded: Option<String>,
    /// Counted in [`Scheduler::live`].
    live: bool,
    /// In [`Scheduler::ready`].
    ready: bool,
    /// Counted in the `ready_credit` of the studies it matches: its credit
    /// while it is ready, else 0.
    counted: u32,
}

impl AgentState {
    /// Counts `credit` as what this agent adds to the `ready_credit` of the
    /// studies it matches (by the info it has now).
    fn recount(&mut self, studies: &mut [StudyState], credit: u32) {
        if credit == self.counted {
            return;
        }
        if let Some(info) = &self.info {
            for s in studies.iter_mut().filter(|s| s.policy.selector.matches(info)) {
                s.ready_credit = s.ready_credit + u64::from(credit) - u64::from(self.counted);
            }
        }
        self.counted = credit;
    }
}

/// Progress of one study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StudyCounts {
    pub total: u64,
    pub done: u64,
    pub failed: u64,
    pub running: u64,
    /// Stopped early: final, neither done nor failed.
    pub stopped: u64,
    /// More trials may still come.
    pub open: bool,
}

impl StudyCounts {
    /// Every trial is final and no more will be added.
    pub fn finished(&self) -> bool {
        !self.open && self.done + self.failed + self.stopped == self.total
    }
}

/// The scheduler.
#[derive(Debug, Default)]
pub struct Scheduler {
    studies: Vec<StudyState>,
    agents: BTreeMap<String, AgentState>,
    /// Agents online, announced and with credit: the only ones a turn visits.
    ready: BTreeSet<Arc<str>>,
    /// Agents online and announced.
    live: usize,
    /// Round-robin start among agents (the ready agent a turn began with),
    /// so work spreads across the fleet.
    next_agent: Arc<str>,
    /// Round-robin start among studies, so studies that share agents share
    /// them fairly: each free slot goes to the next study with work for it.
    next_study: usize,
}

/// An agent's credit: the `free` slots it asks for, less the attempts on
/// their way to it (`in_flight`), and at most the `slots` it announced less
/// every lease it holds (`held`, those on their way included).
fn credit(free: u32, slots: u32, in_flight: usize, held: usize) -> u32 {
    let sub = |n: u32, k: usize| n.saturating_sub(u32::try_from(k).unwrap_or(u32::MAX));
    sub(free, in_flight).min(sub(slots, held))
}

fn trial_ref(policy: &StudyPolicy, trial: u64, attempt: u32) -> TrialRef {
    TrialRef { study: policy.name.clone(), study_id: policy.id, trial, attempt }
}

impl StudyState {
    /// Whether `trial` refers to this study: its name and its id.
    fn owns(&self, trial: &TrialRef) -> bool {
        self.policy.name == trial.study && self.policy.id == trial.study_id
    }
}

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a study whose trials `0..states.len()` are in the given states.
    pub fn add_study(&mut self, policy: StudyPolicy, states: Vec<Restored>, now_ms: u64) {
        self.studies.retain(|s| s.policy.name != policy.name);
        let mut study = StudyState {
            trials: Vec::with_capacity(states.len()),
            queue: VecDeque::new(),
            finished: 0,
            failed: 0,
            stopped: 0,
            deadlines: BTreeSet::new(),
            held: HashMap::new(),
            released: Vec::new(),
            ready_credit: 0,
            restored: BTreeMap::new(),
            open: false,
            policy,
        };
        for (i, restored) in states.into_iter().enumerate() {
            let i = i as u64;
            let slot = match restored {
                Restored::Pending { last_attempt, failures } => {
                    study.queue.push_back(i);
                    TrialSlot { last_attempt, failures, ..TrialSlot::new(State::Pending) }
                }
                Restored::Running { agent, attempt, failures } => {
                    study.restored.entry(agent.clone()).or_default().push(i);
                    let lease = Lease {
                        agent: agent.clone(),
                        attempt,
                        deadline_ms: now_ms + study.policy.lease_ms,
                        restored: true,
                        seq: 0,
                    };
                    let slot = TrialSlot {
                        last_attempt: attempt,
                        failures,
                        history: vec![(attempt, agent)],
                        ..TrialSlot::new(State::Pending)
                    };
                    study.trials.push(slot);
                    study.lease(i, lease);
                    continue;
                }
                Restored::Done => {
                    study.finished += 1;
                    TrialSlot::new(State::Done { agent: String::new(), attempt: 0 })
                }
                Restored::Failed => {
                    study.failed += 1;
                    TrialSlot::new(State::Failed)
                }
                Restored::Stopped => {
                    study.stopped += 1;
                    TrialSlot::new(State::Stopped { agent: String::new(), attempt: 0, delivered: true })
                }
            };
            study.trials.push(slot);
        }
        study.ready_credit = self
            .ready
            .iter()
            .filter_map(|name| self.agents.get(&**name))
            .filter(|a| a.info.as_ref().is_some_and(|i| study.policy.selector.matches(i)))
            .map(|a| u64::from(a.counted))
            .sum();
        self.studies.push(study);
    }

    /// Says whether trials may still be added to `study` (a study is
    /// closed when added: all its trials are known).
    pub fn set_open(&mut self, study: &str, open: bool) {
        if let Some(s) = self.studies.iter_mut().find(|s| s.policy.name == study) {
            s.open = open;
        }
    }

    /// Adds a pending trial to `study` and returns its id (the next one).
    pub fn add_trial(&mut self, study: &str) -> Option<u64> {
        let s = self.studies.iter_mut().find(|s| s.policy.name == study)?;
        let id = s.trials.len() as u64;
        s.trials.push(TrialSlot::new(State::Pending));
        s.queue.push_back(id);
        Some(id)
    }

    /// How many more trials `study` could hand out now: the free slots of
    /// the live agents that match it, less the trials already queued.
    pub fn demand(&self, study: &str) -> u64 {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return 0 };
        s.ready_credit.saturating_sub(s.queue.len() as u64)
    }

    /// Drops a finished study from memory.
    pub fn remove_study(&mut self, name: &str) {
        self.studies.retain(|s| s.policy.name != name);
    }

    pub fn counts(&self, study: &str) -> Option<StudyCounts> {
        let s = self.studies.iter().find(|s| s.policy.name == study)?;
        Some(StudyCounts {
            total: s.trials.len() as u64,
            done: s.finished,
            failed: s.failed,
            running: s.running(),
            stopped: s.stopped,
            open: s.open,
        })
    }

    /// Agents that are online and have said who they are.
    pub fn live_agents(&self) -> usize {
        self.live
    }

    /// The device class of `agent`, once it said what it is.
    pub fn agent_class(&self, agent: &str) -> Option<String> {
        self.agents.get(agent).and_then(|a| a.info.as_ref()).map(device_class)
    }

    /// Whether `study`'s selector admits `agent` as it last described
    /// itself: what reuse may learn from (an unknown study or agent, no).
    pub fn admits(&self, study: &str, agent: &str) -> bool {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return false };
        self.agents.get(agent).and_then(|a| a.info.as_ref()).is_some_and(|i| s.policy.selector.matches(i))
    }

    /// Agents connected and matching `study`'s selector.
    pub fn eligible_agents(&self, study: &str) -> usize {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return 0 };
        self.agents
            .values()
            .filter(|a| a.online && a.info.as_ref().is_some_and(|i| s.policy.selector.matches(i)))
            .count()
    }

    /// Brings the fleet's indexes (`ready`, `live`, the studies'
    /// `ready_credit`) up to date with what `agent` is now; called after
    /// every change to an agent.
    fn sync_agent(&mut self, agent: &str) {
        let Some(a) = self.agents.get_mut(agent) else { return };
        let live = a.online && a.info.is_some();
        if live != a.live {
            a.live = live;
            if live {
                self.live += 1;
            } else {
                self.live -= 1;
            }
        }
        let ready = live && a.credit > 0;
        a.recount(&mut self.studies, if ready { a.credit } else { 0 });
        if ready != a.ready {
            a.ready = ready;
            if ready {
                self.ready.insert(a.name.clone());
            } else {
                self.ready.remove(agent);
            }
        }
    }

    /// An agent announced itself (its session is authenticated by
    /// [`crate::auth`]). A new `instance` means the agent process
    /// restarted: whatever it was running is gone.
    pub fn hello(&mut self, info: AgentInfo) -> Vec<Effect> {
        let name = info.agent.clone();
        let instance = info.instance;
        let agent = self.agents.entry(name.clone()).or_insert_with(|| AgentState {
            name: Arc::from(name.as_str()),
            info: None,
            online: true,
            instance,
            credit: 0,
            withheld: 0,
            last_seq: None,
            overloaded: None,
            live: false,
            ready: false,
            counted: 0,
        });
        // What it matches may change with what it says it is.
        agent.recount(&mut self.studies, 0);
        let restarted = agent.instance != instance;
        agent.instance = instance;
        agent.online = true;
        agent.info = Some(info);
        if restarted {
            agent.credit = 0;
            agent.withheld = 0;
            agent.last_seq = None;
        }
        self.sync_agent(&name);
        if restarted {
            self.release_leases(&name, "agent restarted")
        } else {
            Vec::new()
        }
    }

    /// An agent's retained status, or its Last Will.
    pub fn status(&mut self, agent: &str, status: &AgentStatus) -> Vec<Effect> {
        let Some(state) = self.agents.get_mut(agent) else {
            // Not seen by this process: only leases restored from the store can be affected.
            return if status.online { Vec::new() } else { self.release_leases(agent, "agent is offline") };
        };
        if status.instance != state.instance {
            // A stale status of an earlier process (the retained one, or a late will).
            return Vec::new();
        }
        state.online = status.online;
        if !status.online {
            state.credit = 0;
            state.withheld = 0;
        }
        self.sync_agent(agent);
        if status.online {
            return Vec::new();
        }
        self.release_leases(agent, "agent went offline")
    }

    /// An agent's request for work: its credit becomes `free`. Trials that a
    /// previous coordinator handed to this agent and that it no longer lists as
    /// running are lost (their results, had there been any, came first).
    pub fn request(&mut self, agent: &str, req: &WorkRequest) -> Vec<Effect> {
        let Some(state) = self.agents.get_mut(agent) else { return Vec::new() };
        if state.last_seq.is_some_and(|seq| req.seq <= seq) {
            return Vec::new();
        }
        state.last_seq = Some(req.seq);
        state.online = true;
        let mut effects = Vec::new();
        for study in &mut self.studies {
            let Some(restored) = study.restored.remove(agent) else { continue };
            for i in restored {
                let attempt = match study.trials.get(i as usize).map(|t| &t.state) {
                    Some(State::Running(l)) if l.restored && l.agent == agent => l.attempt,
                    _ => continue,
                };
                let tr = trial_ref(&study.policy, i, attempt);
                if req.running.contains(&tr) {
                    continue;
                }
                effects.extend(study.end_attempt(i, tr, "the agent no longer runs it".into()));
            }
        }
        // Attempts given to the agent that it had not seen when it asked are
        // on their way: its free slots are fewer than it says. Only those
        // answering its previous request: an older one it does not list was
        // lost (a broker restart) and waits for its lease to run out; it is
        // not taken off what the agent asks for, but it still holds one of
        // the agent's announced slots (below) until then.
        let in_flight: usize = self
            .studies
            .iter()
            .map(|study| {
                let held = study.held.get(agent).map_or(0, |trials| {
                    trials
                        .iter()
                        .filter(|&&i| match study.trials.get(i as usize).map(|t| &t.state) {
                            Some(State::Running(l)) => {
                                l.seq.saturating_add(1) >= req.seq
                                    && !req.running.contains(&trial_ref(&study.policy, i, l.attempt))
                            }
                            _ => false,
                        })
                        .count()
                });
                held
            })
            .sum();
        // Never more than the slots it announced, less the leases it holds:
        // a `free` past that would let one agent take every pending trial.
        let held: usize = self.studies.iter().map(|s| s.held.get(agent).map_or(0, BTreeSet::len)).sum();
        if let Some(state) = self.agents.get_mut(agent) {
            let slots = state.info.as_ref().map_or(0, |i| i.slots);
            state.credit = credit(req.free, slots, in_flight, held);
            // Leases it holds but no longer runs (a result on its way) end
            // soon: the slots they free are its, up to what it asked for.
            state.withheld = credit(req.free, slots, in_flight, 0).saturating_sub(state.credit);
            // Leases that ended before this request are counted in it already.
            for study in &mut self.studies {
                study.released.retain(|a| a != agent);
            }
        }
        self.sync_agent(agent);
        effects
    }

    /// The agent will not run this attempt: queue it again without counting a failure.
    pub fn refuse(&mut self, agent: &str, trial: &TrialRef, reason: &str) -> Vec<Effect> {
        let Some(study) = self.studies.iter_mut().find(|s| s.owns(trial)) else { return Vec::new() };
        let Some(slot) = study.trials.get(trial.trial as usize) else { return Vec::new() };
        match &slot.state {
            State::Running(l) if l.agent == agent && l.attempt == trial.attempt => {
                study.unlease(trial.trial);
                study.queue.push_front(trial.trial);
                vec![Effect::Requeued { trial: trial.clone(), reason: format!("refused by {agent}: {reason}") }]
            }
            _ => Vec::new(),
        }
    }

    /// A result from `agent` for `trial`.
    pub fn result(&mut self, agent: &str, trial: &TrialRef, kind: ResultKind, now_ms: u64) -> (Verdict, Vec<Effect>) {
        let judgement = self.judge(agent, trial, kind);
        let verdict = judgement.verdict;
        (verdict, self.settle(judgement, now_ms))
    }

    /// What a result would do to its trial, decided without changing
    /// anything: the engine writes the store first and calls
    /// [`Scheduler::settle`] only once those writes succeeded, so a store
    /// error leaves the scheduler as it was.
    pub fn judge(&self, agent: &str, trial: &TrialRef, kind: ResultKind) -> Judgement {
        let judged = |verdict, change| Judgement { verdict, change, agent: agent.to_string(), trial: trial.clone() };
        let Some(study) = self.studies.iter().find(|s| s.owns(trial)) else {
            return judged(Verdict::Unknown, Change::Nothing);
        };
        let Some(slot) = study.trials.get(trial.trial as usize) else {
            return judged(Verdict::Unknown, Change::Nothing);
        };
        let ran_it = slot.history.iter().any(|(a, who)| *a == trial.attempt && who == agent);
        let mut revive = false;
        match &slot.state {
            State::Done { agent: a, attempt } if a == agent && *attempt == trial.attempt => {
                return judged(Verdict::Duplicate, Change::Nothing)
            }
            // The stopped attempt's own result (cut short, or complete if it
            // ended before the cancel arrived) is kept for the record, once.
            State::Stopped { agent: a, attempt, delivered } if a == agent && *attempt == trial.attempt => {
                return if *delivered {
                    judged(Verdict::Duplicate, Change::Nothing)
                } else {
                    judged(Verdict::Accepted, Change::Delivered)
                };
            }
            State::Stopped { .. } | State::Done { .. } => {
                return judged(if ran_it { Verdict::Superseded } else { Verdict::Unknown }, Change::Nothing)
            }
            _ if !ran_it => return judged(Verdict::Unknown, Change::Nothing),
            // Failed for want of a result (attempts ran out, e.g. its agent was
            // presumed dead): a workload that really ran delivers after all.
            // A disturbed measurement of it is taken too (flagged): it is no live
            // attempt's, so it is not measured again.
            State::Failed if !matches!(kind, ResultKind::Retry(_)) => revive = true,
            _ => {}
        }
        let this_is_live = matches!(&slot.state, State::Running(l) if l.agent == agent && l.attempt == trial.attempt);
        match kind {
            ResultKind::Interfered { reason, .. } if this_is_live && slot.remeasures < MAX_REMEASURES => {
                judged(Verdict::Remeasured, Change::Remeasure(reason))
            }
            // Measured again often enough (or an old attempt): take it, flagged.
            ResultKind::Interfered { success, .. } => {
                judged(Verdict::Accepted, Change::Complete { success, revive, this_is_live })
            }
            // An old attempt failed after the trial had moved on: nothing to do.
            ResultKind::Retry(_) if !this_is_live => judged(Verdict::Superseded, Change::Nothing),
            ResultKind::Retry(reason) => judged(Verdict::Retried, Change::Retry(reason)),
            ResultKind::Complete { success } => {
                judged(Verdict::Accepted, Change::Complete { success, revive, this_is_live })
            }
        }
    }

    /// Does what [`Scheduler::judge`] decided.
    pub fn settle(&mut self, judgement: Judgement, now_ms: u64) -> Vec<Effect> {
        let Judgement { change, agent, trial, .. } = judgement;
        let Some(study) = self.studies.iter_mut().find(|s| s.owns(&trial)) else { return Vec::new() };
        let Some(slot) = study.trials.get_mut(trial.trial as usize) else { return Vec::new() };
        match change {
            Change::Nothing => Vec::new(),
            Change::Delivered => {
                if let State::Stopped { delivered, .. } = &mut slot.state {
                    *delivered = true;
                }
                Vec::new()
            }
            Change::Remeasure(reason) => {
                slot.remeasures += 1;
                let reason = format!("measured again ({} of {MAX_REMEASURES}): {reason}", slot.remeasures);
                let class = self.agents.get(&agent).and_then(|a| a.info.as_ref()).map(device_class);
                study.move_off(trial.trial, &agent, class, now_ms);
                vec![Effect::Moved { trial, from: agent, reason }]
            }
            Change::Retry(reason) => study.end_attempt(trial.trial, trial, reason).into_iter().collect(),
            Change::Complete { success, revive, this_is_live } => {
                if revive {
                    study.failed -= 1;
                }
                let live = study.unlease(trial.trial);
                if let Some(slot) = study.trials.get_mut(trial.trial as usize) {
                    slot.state = State::Done { agent: agent.clone(), attempt: trial.attempt };
                }
                if success {
                    study.finished += 1;
                } else {
                    study.failed += 1;
                }
                let mut effects = Vec::new();
                if let Some(l) = live.filter(|_| !this_is_live) {
                    effects.push(Effect::Cancel {
                        agent: l.agent,
                        trial: trial_ref(&study.policy, trial.trial, l.attempt),
                        reason: format!("attempt {} already delivered a result", trial.attempt),
                    });
                }
                effects
            }
        }
    }

    /// Whether `trial` is the live attempt of `agent` (progress worth recording).
    pub fn is_live(&self, agent: &str, trial: &TrialRef) -> bool {
        self.studies.iter().find(|s| s.owns(trial)).and_then(|s| s.trials.get(trial.trial as usize)).is_some_and(
            |slot| matches!(&slot.state, State::Running(l) if l.agent == agent && l.attempt == trial.attempt),
        )
    }

    /// The id of the study named `name` that this scheduler runs.
    pub fn study_id(&self, name: &str) -> Option<u64> {
        self.studies.iter().find(|s| s.policy.name == name).map(|s| s.policy.id)
    }

    /// Whether trial `trial` of `study` is done or failed for good.
    pub fn is_finished(&self, study: &str, trial: u64) -> bool {
        self.studies
            .iter()
            .find(|s| s.policy.name == study)
            .and_then(|s| s.trials.get(usize::try_from(trial).ok()?))
            .is_some_and(|slot| matches!(slot.state, State::Done { .. } | State::Failed | State::Stopped { .. }))
    }

    /// Stops trial `trial` of `study` early: its running attempt is
    /// cancelled, and it ends in a state of its own (neither done nor
    /// failed, never retried). Nothing happens to a trial already final.
    pub fn stop(&mut self, study: &str, trial: u64, reason: &str) -> Vec<Effect> {
        let Some(s) = self.studies.iter_mut().find(|s| s.policy.name == study) else { return Vec::new() };
        let Some(slot) = s.trials.get(usize::try_from(trial).unwrap_or(usize::MAX)) else { return Vec::new() };
        let mut effects = Vec::new();
        let tr = trial_ref(&s.policy, trial, slot.last_attempt);
        let was_pending = slot.state == State::Pending;
        let stopped = match s.unlease(trial) {
            Some(l) => {
                effects.push(Effect::Cancel { agent: l.agent.clone(), trial: tr.clone(), reason: reason.to_string() });
                State::Stopped { agent: l.agent, attempt: l.attempt, delivered: false }
            }
            None if was_pending => State::Stopped { agent: String::new(), attempt: 0, delivered: true },
            None => return effects,
        };
        if let Some(slot) = s.trials.get_mut(usize::try_from(trial).unwrap_or(usize::MAX)) {
            slot.state = stopped;
        }
        s.stopped += 1;
        effects.push(Effect::Stopped { trial: tr, reason: reason.to_string() });
        effects
    }

    /// The decider found `agent` overloaded (`Some(why)`) or well again
    /// (`None`). An overloaded agent gets no trials, and the attempts it runs
    /// are moved: cancelled there and queued again without counting a
    /// failure, kept off it for [`AVOID_MS`].
    pub fn set_overloaded(&mut self, agent: &str, why: Option<String>, now_ms: u64) -> Vec<Effect> {
        let Some(state) = self.agents.get_mut(agent) else { return Vec::new() };
        let class = state.info.as_ref().map(device_class);
        let newly = why.is_some() && state.overloaded.is_none();
        state.overloaded = why.clone();
        let Some(why) = why.filter(|_| newly) else { return Vec::new() };
        let mut effects = Vec::new();
        for study in &mut self.studies {
            for i in study.held_by(agent) {
                let Some(l) = study.move_off(i, agent, class.clone(), now_ms) else { continue };
                let tr = trial_ref(&study.policy, i, l.attempt);
                let reason = format!("agent overloaded: {why}");
                effects.push(Effect::Cancel { agent: agent.to_string(), trial: tr.clone(), reason: reason.clone() });
                effects.push(Effect::Moved { trial: tr, from: agent.to_string(), reason });
            }
        }
        effects
    }

    /// Whether `agent` is overloaded now (and why).
    pub fn overloaded(&self, agent: &str) -> Option<&str> {
        self.agents.get(agent).and_then(|a| a.overloaded.as_deref())
    }

    /// Cancels and requeues every lease past its deadline.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        for study in &mut self.studies {
            let mut due: Vec<u64> = study.deadlines.range(..=(now_ms, u64::MAX)).map(|&(_, i)| i).collect();
            // In trial order, as a scan of the trials would find them.
            due.sort_unstable();
            for i in due {
                let Some(State::Running(l)) = study.trials.get(i as usize).map(|t| &t.state) else { continue };
                let (agent, tr) = (l.agent.clone(), trial_ref(&study.policy, i, l.attempt));
                let reason = "lease expired".to_string();
                effects.push(Effect::Cancel { agent, trial: tr.clone(), reason: reason.clone() });
                effects.extend(study.end_attempt(i, tr, reason));
            }
        }
        effects
    }

    /// Each lease that ended since the last turn gives its agent back one
    /// slot of the credit its last request was denied for want of slots.
    fn give_back(&mut self) {
        let ended: Vec<String> = self.studies.iter_mut().flat_map(|s| std::mem::take(&mut s.released)).collect();
        for agent in ended {
            let Some(a) = self.agents.get_mut(&agent) else { continue };
            if a.withheld > 0 && a.online {
                a.withheld -= 1;
                a.credit += 1;
                self.sync_agent(&agent);
            }
        }
    }

    /// Hands queued trials to agents with credit.
    pub fn assign(&mut self, now_ms: u64) -> Vec<Effect> {
        self.give_back();
        let mut effects = Vec::new();
        let Scheduler { studies, agents, ready, next_agent, next_study, .. } = self;
        // The ready agent after the one the last turn began with.
        let after = ready.range::<str, _>((Bound::Excluded(&**next_agent), Bound::Unbounded)).next();
        let Some(start) = after.or_else(|| ready.first()).cloned() else { return effects };
        // Agents whose credit changed.
        let mut served = Vec::new();
        let (from_start, before_start) =
            ((Bound::Included(&*start), Bound::Unbounded), (Bound::Unbounded, Bound::Excluded(&*start)));
        for name in ready.range::<str, _>(from_start).chain(ready.range::<str, _>(before_start)) {
            if studies.iter().all(|s| s.queue.is_empty()) {
                break;
            }
            let Some(agent) = agents.get_mut(&**name) else { continue };
            let Some(info) = agent.info.as_ref().filter(|_| agent.online && agent.overloaded.is_none()) else {
                continue;
            };
            let seq = agent.last_seq.unwrap_or(0);
            let credit = agent.credit;
            'credit: while agent.credit > 0 {
                let n = studies.len();
                for k in 0..n {
                    let i = (*next_study + k) % n;
                    let Some(study) = studies.get_mut(i).filter(|s| s.policy.selector.matches(info)) else {
                        continue;
                    };
                    // Trials kept off this agent wait for another one.
                    let mut kept_off = Vec::new();
                    while let Some(t) = study.queue.pop_front() {
                        let Some(slot) = study.trials.get_mut(t as usize) else { continue };
                        if slot.state != State::Pending {
                            continue;
                        }
                        slot.avoid.retain(|(_, until)| *until > now_ms);
                        let other_class = slot.class.as_ref().is_some_and(|c| *c != device_class(info));
                        if other_class || slot.avoid.iter().any(|(a, _)| **a == **name) {
                            kept_off.push(t);
                            continue;
                        }
                        for k in kept_off.drain(..).rev() {
                            study.queue.push_front(k);
                        }
                        slot.last_attempt += 1;
                        let attempt = slot.last_attempt;
                        slot.history.push((attempt, name.to_string()));
                        let deadline_ms = now_ms + study.policy.lease_ms;
                        study.lease(t, Lease { agent: name.to_string(), attempt, deadline_ms, restored: false, seq });
                        agent.credit -= 1;
                        // The next free slot goes first to the study after this one.
                        *next_study = (i + 1) % n;
                        effects.push(Effect::Assign {
                            agent: name.to_string(),
                            trial: trial_ref(&study.policy, t, attempt),
                            request_seq: seq,
                        });
                        continue 'credit;
                    }
                    for k in kept_off.into_iter().rev() {
                        study.queue.push_front(k);
                    }
                }
                break;
            }
            if agent.credit != credit {
                served.push(name.clone());
            }
        }
        *next_agent = start;
        for name in served {
            self.sync_agent(&name);
        }
        effects
    }

    fn release_leases(&mut self, agent: &str, reason: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        for study in &mut self.studies {
            for i in study.held_by(agent) {
                let Some(State::Running(l)) = study.trials.get(i as usize).map(|t| &t.state) else { continue };
                let tr = trial_ref(&study.policy, i, l.attempt);
                effects.extend(study.end_attempt(i, tr, reason.into()));
            }
        }
        effects
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn info(name: &str, instance: u64, arch: &str, tags: &[(&str, &str)]) -> AgentInfo {
        AgentInfo {
            agent: name.into(),
            instance,
            version: "t".into(),
            arch: arch.into(),
            os: "linux".into(),
            kernel: "6".into(),
            cores: 2,
            memory_bytes: 1 << 30,
            slots: 2,
            energy: vec![],
            counters: vec![],
            tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    fn sched(trials: usize, max_attempts: u32, selector: Selector) -> Scheduler {
        let mut s = Scheduler::new();
        let policy = StudyPolicy { name: "s".into(), id: 7, selector, max_attempts, lease_ms: 1_000 };
        s.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; trials], 0);
        s
    }

    /// A study of `trials` and agents `a` and `b`, both announced.
    fn agents_a_and_b(trials: usize, max_attempts: u32) -> Scheduler {
        let mut s = sched(trials, max_attempts, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.hello(info("b", 1, "x86_64", &[]));
        s
    }

    fn req(seq: u64, free: u32) -> WorkRequest {
        WorkRequest { seq, free, running: vec![] }
    }

    fn assigned(effects: &[Effect]) -> Vec<(String, TrialRef)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Assign { agent, trial, .. } => Some((agent.clone(), trial.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn attempts_on_their_way_are_not_given_again_to_a_newer_request() {
        let mut s = sched(6, 1, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 2));
        let first = assigned(&s.assign(0));
        assert_eq!(first.len(), 2);
        // Asked again before the two assignments arrived: no slot is free.
        s.request("a", &req(2, 2));
        assert!(assigned(&s.assign(0)).is_empty(), "both slots are taken by attempts on their way");
        // It runs one of them and finished the other: one slot.
        assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        let running = vec![first[1].1.clone()];
        s.request("a", &WorkRequest { seq: 3, free: 1, running });
        assert_eq!(assigned(&s.assign(0)).len(), 1);
    }

    #[test]
    fn studies_that_share_agents_take_turns() {
        let mut s = sched(6, 1, Selector::default());
        let policy =
            StudyPolicy { name: "t".into(), id: 8, selector: Selector::default(), max_attempts: 1, lease_ms: 1_000 };
        s.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; 6], 0);
        s.hello(AgentInfo { slots: 4, ..info("a", 1, "x86_64", &[]) });
        s.request("a", &req(1, 4));
        let order: Vec<String> = assigned(&s.assign(0)).into_iter().map(|(_, t)| t.study).collect();
        assert_eq!(order, vec!["s", "t", "s", "t"], "a study listed first does not starve the next");
        // Where one study has nothing left, the other takes every slot.
        let mut lone = sched(0, 1, Selector::default());
        let policy =
            StudyPolicy { name: "t".into(), id: 8, selector: Selector::default(), max_attempts: 1, lease_ms: 1_000 };
        lone.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; 3], 0);
        lone.hello(AgentInfo { slots: 3, ..info("a", 1, "x86_64", &[]) });
        lone.request("a", &req(1, 3));
        assert_eq!(assigned(&lone.assign(0)).len(), 3);
    }

    #[test]
    fn an_open_study_takes_trials_added_later_and_finishes_only_once_closed() {
        let mut s = sched(0, 3, Selector::default());
        s.set_open("s", true);
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 2));
        assert_eq!(s.demand("s"), 2, "two free slots, nothing queued");
        assert_eq!(s.add_trial("s"), Some(0));
        assert_eq!(s.demand("s"), 1);
        let a = assigned(&s.assign(0));
        assert_eq!(a.len(), 1);
        let (v, _) = s.result("a", &a[0].1, ResultKind::Complete { success: true }, 0);
        assert_eq!(v, Verdict::Accepted);
        assert!(!s.counts("s").expect("study").finished(), "open: more trials may come");
        s.set_open("s", false);
        assert!(s.counts("s").expect("study").finished());
        assert_eq!(s.add_trial("nope"), None);
    }

    #[test]
    fn an_overloaded_agent_gets_nothing_and_its_trials_move_without_counting_a_failure() {
        let mut s = agents_a_and_b(2, 1);
        s.request("a", &req(1, 2));
        let on_a = assigned(&s.assign(0));
        assert_eq!(on_a.len(), 2);
        let effects = s.set_overloaded("a", Some("busy".into()), 1_000);
        let moved: Vec<_> = effects.iter().filter(|e| matches!(e, Effect::Moved { from, .. } if from == "a")).collect();
        let cancelled = effects.iter().filter(|e| matches!(e, Effect::Cancel { agent, .. } if agent == "a")).count();
        assert_eq!((moved.len(), cancelled), (2, 2), "{effects:?}");
        assert!(s.set_overloaded("a", Some("still busy".into()), 1_500).is_empty(), "said once");
        // a asks again: nothing while overloaded; b takes both (max_attempts 1: a failure would fail them).
        s.request("a", &req(2, 2));
        assert!(assigned(&s.assign(2_000)).is_empty());
        s.request("b", &req(1, 2));
        let on_b = assigned(&s.assign(2_000));
        assert_eq!(on_b.iter().map(|(a, t)| (a.as_str(), t.attempt)).collect::<Vec<_>>(), vec![("b", 2), ("b", 2)]);
        for (_, t) in &on_b {
            assert_eq!(s.result("b", t, ResultKind::Complete { success: true }, 3_000).0, Verdict::Accepted);
        }
        let c = s.counts("s").expect("study");
        assert_eq!((c.done, c.failed), (2, 0));
    }

    #[test]
    fn a_moved_trial_stays_off_its_agent_for_a_while_even_when_it_recovers() {
        let mut s = sched(1, 3, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 1));
        assert_eq!(assigned(&s.assign(0)).len(), 1);
        s.set_overloaded("a", Some("busy".into()), 0);
        assert!(s.set_overloaded("a", None, 10).is_empty());
        assert_eq!(s.overloaded("a"), None);
        s.request("a", &req(2, 1));
        assert!(assigned(&s.assign(100)).is_empty(), "kept off a");
        let later = assigned(&s.assign(AVOID_MS + 1));
        assert_eq!(later.len(), 1, "back on a once the avoidance ends");
    }

    #[test]
    fn a_moved_trial_stays_in_its_device_class() {
        let mut s = sched(1, 3, Selector::default());
        s.hello(info("x86", 1, "x86_64", &[]));
        s.hello(info("arm", 1, "aarch64", &[]));
        s.hello(info("x86-2", 1, "x86_64", &[]));
        s.request("x86", &req(1, 1));
        assert_eq!(assigned(&s.assign(0)).len(), 1);
        s.set_overloaded("x86", Some("busy".into()), 0);
        s.request("arm", &req(1, 1));
        assert!(assigned(&s.assign(10)).is_empty(), "another class would not measure the same thing");
        s.request("x86-2", &req(1, 1));
        let a = assigned(&s.assign(20));
        assert_eq!(a.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), vec!["x86-2"]);
    }

    #[test]
    fn a_disturbed_measurement_is_taken_again_then_accepted_flagged() {
        let mut s = agents_a_and_b(1, 1);
        let mut now = 0;
        for round in 0..=MAX_REMEASURES {
            for agent in ["a", "b"] {
                s.request(agent, &req(u64::from(round) + 1, 1));
            }
            now += AVOID_MS + 1;
            let a = assigned(&s.assign(now));
            assert_eq!(a.len(), 1, "round {round}");
            let (agent, t) = &a[0];
            let kind = ResultKind::Interfered { success: true, reason: "outside load".into() };
            let (v, effects) = s.result(agent, t, kind, now);
            if round < MAX_REMEASURES {
                assert_eq!(v, Verdict::Remeasured);
                assert!(matches!(&effects[..], [Effect::Moved { reason, .. }] if reason.contains("measured again")));
            } else {
                assert_eq!(v, Verdict::Accepted, "after {MAX_REMEASURES} re-measurements the flagged one is kept");
            }
        }
        let c = s.counts("s").expect("study");
        assert_eq!((c.done, c.failed), (1, 0), "max_attempts 1: re-measuring is no failure");
    }

    #[test]
    fn regression_a_request_is_capped_at_the_announced_slots() {
        let mut s = sched(20, 1, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        // Announced 2 slots, asks for a thousand.
        s.request("a", &req(1, 1_000));
        let first = assigned(&s.assign(0));
        assert_eq!(first.len(), 2, "no more than its 2 announced slots");
        // Again, listing both as running: both slots are held.
        s.request("a", &WorkRequest { seq: 2, free: 1_000, running: first.iter().map(|(_, t)| t.clone()).collect() });
        assert!(assigned(&s.assign(0)).is_empty(), "its slots are all held");
        // Lying about what it runs does not free a slot either.
        s.request("a", &req(3, 1_000));
        s.request("a", &req(4, 1_000));
        assert!(assigned(&s.assign(0)).is_empty(), "leases it holds count whatever it says");
        assert_eq!(s.counts("s").map(|c| c.running), Some(2));
        // One finished: one slot again.
        assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        s.request("a", &req(5, 1_000));
        assert_eq!(assigned(&s.assign(0)).len(), 1);
        assert_eq!(credit(1_000, 2, 0, 0), 2);
        assert_eq!(credit(1, 2, 0, 0), 1, "it may ask for fewer");
        assert_eq!(credit(2, 2, 1, 1), 1);
        assert_eq!(credit(5, 4, 0, 9), 0);
    }

    #[test]
    fn regression_a_slot_freed_by_a_result_on_its_way_is_given_to_the_request_that_asked_for_it() {
        // After a broker outage the agent asks (free 1, running nothing)
        // before its spooled result ends the lease it still holds: the cap
        // withholds the slot, and the result gives it back (the agent does
        // not ask again: its slot was free when it asked).
        let mut s = sched(3, 1, Selector::default());
        s.hello(AgentInfo { slots: 1, ..info("a", 1, "x86_64", &[]) });
        s.request("a", &req(1, 1));
        let first = assigned(&s.assign(0));
        assert_eq!(first.len(), 1);
        // It runs it (listed), then finishes it while the broker is away and asks again.
        s.request("a", &WorkRequest { seq: 2, free: 0, running: vec![first[0].1.clone()] });
        s.request("a", &req(3, 1));
        assert!(assigned(&s.assign(0)).is_empty(), "its one slot is held until the result comes");
        assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        assert_eq!(assigned(&s.assign(0)).len(), 1, "the slot the result freed goes to the request");
        assert!(assigned(&s.assign(0)).is_empty(), "once");
    }

    #[test]
    fn never_assigns_more_than_requested() {
        let mut s = sched(10, 3, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        assert!(s.assign(0).is_empty(), "no request yet, no work");
        s.request("a", &req(1, 2));
        let first = assigned(&s.assign(0));
        assert_eq!(first.len(), 2);
        assert!(s.assign(0).is_empty());
        // A stale (older) request grants nothing.
        s.request("a", &req(1, 5));
        assert!(s.assign(0).is_empty());
        // One finished: the newer request's free slot is given.
        assert_eq!(s.result("a", &first[0].1, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        s.request("a", &WorkRequest { seq: 2, free: 1, running: vec![first[1].1.clone()] });
        assert_eq!(assigned(&s.assign(0)).len(), 1);
    }

    #[test]
    fn selector_is_respected() {
        let sel = Selector {
            arch: vec!["aarch64".into()],
            tags: [("pool".to_string(), "gpu".to_string())].into(),
            ..Selector::default()
        };
        let mut s = sched(4, 3, sel);
        s.hello(info("wrong-tag", 1, "aarch64", &[("pool", "cpu")]));
        s.hello(info("wrong-arch", 1, "x86_64", &[("pool", "gpu")]));
        s.hello(AgentInfo { slots: 4, ..info("good", 1, "aarch64", &[("pool", "gpu"), ("x", "y")]) });
        for a in ["wrong-tag", "wrong-arch", "good"] {
            s.request(a, &req(1, 4));
        }
        let got = assigned(&s.assign(0));
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|(a, _)| a == "good"));
        assert_eq!(s.eligible_agents("s"), 1);
    }

    #[test]
    fn regression_reuse_learns_only_from_agents_the_selector_admits() {
        let sel = Selector { tags: [("pool".to_string(), "lab".to_string())].into(), ..Selector::default() };
        let mut s = sched(2, 1, sel);
        s.hello(info("member", 1, "x86_64", &[("pool", "lab")]));
        s.hello(info("stranger", 1, "x86_64", &[("pool", "home")]));
        assert!(s.admits("s", "member"));
        assert!(!s.admits("s", "stranger"), "another pool's profiles do not join this study's model");
        assert!(!s.admits("s", "never-seen"));
        assert!(!s.admits("other-study", "member"));
        // It says it is something else now: no longer admitted.
        s.hello(info("member", 1, "x86_64", &[("pool", "home")]));
        assert!(!s.admits("s", "member"));
    }

    #[test]
    fn offline_agent_trials_are_requeued_and_late_results_win_once() {
        let mut s = agents_a_and_b(1, 5);
        s.request("a", &req(1, 1));
        let first = assigned(&s.assign(0));
        assert_eq!(first[0].0, "a");
        let t1 = first[0].1.clone();
        let eff = s.status("a", &AgentStatus { online: false, instance: 1 });
        assert!(matches!(&eff[..], [Effect::Requeued { .. }]), "{eff:?}");
        s.request("b", &req(1, 1));
        let second = assigned(&s.assign(0));
        assert_eq!(second[0].0, "b");
        let t2 = second[0].1.clone();
        assert_eq!(t2.attempt, t1.attempt + 1);
        // The presumed-dead agent delivers after all: accepted, b is told to stop.
        let (v, eff) = s.result("a", &t1, ResultKind::Complete { success: true }, 0);
        assert_eq!(v, Verdict::Accepted);
        assert!(matches!(&eff[..], [Effect::Cancel { agent, .. }] if agent == "b"));
        assert_eq!(s.result("a", &t1, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
        assert_eq!(s.result("b", &t2, ResultKind::Complete { success: true }, 0).0, Verdict::Superseded);
        assert_eq!(s.counts("s").map(|c| (c.done, c.finished())), Some((1, true)));
    }

    /// Issue 8: a good result that arrived after its trial had run out of
    /// attempts was kept as superseded, and the trial stayed failed.
    #[test]
    fn regression_late_result_of_a_failed_trial_completes_it_once() {
        let mut s = sched(2, 1, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 2));
        let got = assigned(&s.assign(0));
        let (t0, t1) = (got[0].1.clone(), got[1].1.clone());
        // The agent is presumed dead: with one attempt allowed, both trials fail.
        let eff = s.status("a", &AgentStatus { online: false, instance: 1 });
        assert_eq!(eff.iter().filter(|e| matches!(e, Effect::Failed { .. })).count(), 2, "{eff:?}");
        assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((0, 2)));
        assert_eq!(s.result("mallory", &t0, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
        assert_eq!(s.result("a", &t0, ResultKind::Retry("cancelled".into()), 0).0, Verdict::Superseded);
        // It was alive after all: its real results count, once each.
        assert_eq!(s.result("a", &t0, ResultKind::Complete { success: true }, 0), (Verdict::Accepted, vec![]));
        assert_eq!(s.result("a", &t0, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
        assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((1, 1)));
        // A run that failed on its own is the failed trial's result: still failed, counted once.
        assert_eq!(s.result("a", &t1, ResultKind::Complete { success: false }, 0).0, Verdict::Accepted);
        assert_eq!(s.result("a", &t1, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
        let c = s.counts("s").expect("study");
        assert_eq!((c.done, c.failed, c.running, c.finished()), (1, 1, 0, true));
    }

    /// Found by the engine's property test: a disturbed result of a trial
    /// that had failed for want of a result made it done and left it
    /// counted failed as well (the scheduler counted 5 trials of 4).
    #[test]
    fn regression_a_disturbed_late_result_of_a_failed_trial_counts_once() {
        let mut s = sched(1, 1, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 1));
        let t0 = assigned(&s.assign(0))[0].1.clone();
        s.status("a", &AgentStatus { online: false, instance: 1 });
        assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((0, 1)));
        let disturbed = ResultKind::Interfered { success: true, reason: "load".into() };
        assert_eq!(s.result("a", &t0, disturbed, 0).0, Verdict::Accepted);
        assert_eq!(s.counts("s").map(|c| (c.done, c.failed)), Some((1, 0)));
    }

    #[test]
    fn forged_or_unknown_results_are_refused() {
        let mut s = sched(2, 3, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 1));
        let t = assigned(&s.assign(0))[0].1.clone();
        assert_eq!(s.result("mallory", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
        let other_attempt = TrialRef { attempt: 7, ..t.clone() };
        assert_eq!(s.result("a", &other_attempt, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
        let other_study = TrialRef { study: "nope".into(), ..t.clone() };
        assert_eq!(s.result("a", &other_study, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
        let out_of_range = TrialRef { trial: 99, ..t.clone() };
        assert_eq!(s.result("a", &out_of_range, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
        assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    }

    /// Issue 20, finding 8: a reference with the study's name but another
    /// study id is of another study of that name (another store): none of
    /// this study's results, progress, refusals or running attempts.
    #[test]
    fn a_reference_with_another_study_id_is_not_this_studys() {
        let mut s = sched(2, 3, Selector::default());
        assert_eq!(s.study_id("s"), Some(7));
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 1));
        let t = assigned(&s.assign(0))[0].1.clone();
        assert_eq!(t.study_id, 7, "assignments carry the study's id");
        let twin = TrialRef { study_id: 8, ..t.clone() };
        assert!(s.is_live("a", &t) && !s.is_live("a", &twin));
        assert!(s.refuse("a", &twin, "no").is_empty(), "another study's refusal moves nothing");
        assert_eq!(s.result("a", &twin, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
        assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Duplicate);
        assert_eq!(s.result("a", &twin, ResultKind::Complete { success: true }, 0).0, Verdict::Unknown);
    }

    #[test]
    fn retries_until_max_attempts_then_fails() {
        let mut s = sched(1, 2, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        for seq in 1..=2 {
            s.request("a", &req(seq, 1));
            let t = assigned(&s.assign(0))[0].1.clone();
            let (v, eff) = s.result("a", &t, ResultKind::Retry("no such program".into()), 0);
            assert_eq!(v, Verdict::Retried);
            if seq == 1 {
                assert!(matches!(&eff[..], [Effect::Requeued { .. }]));
            } else {
                assert!(matches!(&eff[..], [Effect::Failed { reason, .. }] if reason.contains("2 attempts")));
            }
        }
        assert_eq!(s.counts("s").map(|c| (c.failed, c.finished())), Some((1, true)));
    }

    #[test]
    fn restarted_agent_loses_leases_and_expired_leases_are_cancelled() {
        let mut s = sched(2, 5, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 2));
        assert_eq!(assigned(&s.assign(0)).len(), 2);
        let eff = s.hello(info("a", 2, "x86_64", &[]));
        assert_eq!(eff.iter().filter(|e| matches!(e, Effect::Requeued { .. })).count(), 2);
        // The restarted agent's old retained status does not take it offline.
        assert!(s.status("a", &AgentStatus { online: false, instance: 1 }).is_empty());
        assert_eq!(s.live_agents(), 1);
        s.request("a", &req(1, 1));
        let t = assigned(&s.assign(100))[0].1.clone();
        assert!(s.expire(1_099).is_empty());
        let eff = s.expire(1_100);
        assert!(matches!(&eff[0], Effect::Cancel { trial, .. } if *trial == t));
        assert!(matches!(&eff[1], Effect::Requeued { .. }));
    }

    #[test]
    fn refusal_requeues_without_counting_a_failure() {
        let mut s = sched(1, 1, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 1));
        let t = assigned(&s.assign(0))[0].1.clone();
        assert!(matches!(&s.refuse("a", &t, "busy")[..], [Effect::Requeued { .. }]));
        s.request("a", &req(2, 1));
        let t2 = assigned(&s.assign(0))[0].1.clone();
        assert_eq!(t2.attempt, 2);
        assert_eq!(s.result("a", &t2, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    }

    #[test]
    fn work_spreads_round_robin() {
        let mut s = sched(4, 3, Selector::default());
        for a in ["a", "b"] {
            s.hello(info(a, 1, "x86_64", &[]));
            s.request(a, &req(1, 1));
        }
        let got = assigned(&s.assign(0));
        assert_eq!(got.len(), 2);
        assert_ne!(got[0].0, got[1].0);
    }

    #[test]
    fn restored_running_trial_accepts_its_result() {
        let mut s = Scheduler::new();
        let policy =
            StudyPolicy { name: "s".into(), id: 7, selector: Selector::default(), max_attempts: 3, lease_ms: 10 };
        let states = vec![Restored::Done, Restored::Running { agent: "a".into(), attempt: 2, failures: 1 }];
        s.add_study(policy, states, 0);
        let t = TrialRef { study: "s".into(), study_id: 7, trial: 1, attempt: 2 };
        assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        assert!(s.counts("s").is_some_and(|c| c.finished()));
    }

    #[test]
    fn restored_lease_not_listed_by_the_agent_is_requeued() {
        let mut s = Scheduler::new();
        let policy =
            StudyPolicy { name: "s".into(), id: 7, selector: Selector::default(), max_attempts: 3, lease_ms: 10_000 };
        let states = vec![
            Restored::Running { agent: "a".into(), attempt: 1, failures: 0 },
            Restored::Running { agent: "a".into(), attempt: 1, failures: 0 },
            Restored::Running { agent: "gone".into(), attempt: 1, failures: 0 },
        ];
        s.add_study(policy, states, 0);
        s.hello(info("a", 9, "x86_64", &[]));
        let still = TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 1 };
        let eff = s.request("a", &WorkRequest { seq: 1, free: 0, running: vec![still.clone()] });
        assert!(matches!(&eff[..], [Effect::Requeued { trial, .. }] if trial.trial == 1), "{eff:?}");
        // The retained offline status of an agent this process never met releases its restored lease.
        let eff = s.status("gone", &AgentStatus { online: false, instance: 4 });
        assert!(matches!(&eff[..], [Effect::Requeued { trial, .. }] if trial.trial == 2), "{eff:?}");
        assert_eq!(s.result("a", &still, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    }

    /// Checks every index against a full scan of the trials and the agents.
    fn assert_indexes_agree(s: &Scheduler) -> Result<(), proptest::test_runner::TestCaseError> {
        for study in &s.studies {
            let mut deadlines = BTreeSet::new();
            let mut held: HashMap<String, BTreeSet<u64>> = HashMap::new();
            for (i, t) in study.trials.iter().enumerate() {
                if let State::Running(l) = &t.state {
                    deadlines.insert((l.deadline_ms, i as u64));
                    held.entry(l.agent.clone()).or_default().insert(i as u64);
                }
            }
            let name = &study.policy.name;
            let ready_credit: u64 = s
                .agents
                .values()
                .filter(|a| a.online && a.info.as_ref().is_some_and(|i| study.policy.selector.matches(i)))
                .map(|a| u64::from(a.credit))
                .sum();
            prop_assert_eq!(study.ready_credit, ready_credit, "{}: credit of the agents that match", name);
            prop_assert_eq!(study.running(), deadlines.len() as u64, "{}: running count", name);
            prop_assert_eq!(&study.deadlines, &deadlines, "{}: leases by deadline", name);
            let nonempty = study.held.iter().filter(|(_, t)| !t.is_empty());
            prop_assert_eq!(
                nonempty.map(|(a, t)| (a.clone(), t.clone())).collect::<HashMap<_, _>>(),
                held,
                "{}: leases by agent",
                name
            );
        }
        let live = |a: &AgentState| a.online && a.info.is_some();
        let ready: BTreeSet<Arc<str>> =
            s.agents.values().filter(|a| live(a) && a.credit > 0).map(|a| a.name.clone()).collect();
        prop_assert_eq!(&s.ready, &ready, "agents with credit");
        prop_assert_eq!(s.live, s.agents.values().filter(|a| live(a)).count(), "live agents");
        prop_assert!(s.agents.values().all(|a| a.live == live(a)), "each agent's live flag");
        prop_assert!(s.agents.values().all(|a| a.ready == ready.contains(&a.name)), "each agent's ready flag");
        let counted = |a: &AgentState| if live(a) { a.credit } else { 0 };
        prop_assert!(s.agents.values().all(|a| a.counted == counted(a)), "each agent's counted credit");
        Ok(())
    }

    /// One event for the index property test.
    #[derive(Debug, Clone)]
    enum Op {
        Request { agent: usize, free: u32 },
        Complete { pick: usize, success: bool },
        Retry { pick: usize },
        Interfered { pick: usize },
        Refuse { pick: usize },
        Offline { agent: usize },
        Hello { agent: usize, restart: bool, gpu: bool },
        Overloaded { agent: usize, on: bool },
        Stop { study: bool, trial: u64 },
        AddTrial,
        Advance { ms: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..4usize, 0..4u32).prop_map(|(agent, free)| Op::Request { agent, free }),
            3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, success)| Op::Complete { pick, success }),
            1 => any::<usize>().prop_map(|pick| Op::Retry { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Interfered { pick }),
            1 => any::<usize>().prop_map(|pick| Op::Refuse { pick }),
            1 => (0..4usize).prop_map(|agent| Op::Offline { agent }),
            1 => (0..4usize, any::<bool>(), any::<bool>())
                .prop_map(|(agent, restart, gpu)| Op::Hello { agent, restart, gpu }),
            1 => (0..4usize, any::<bool>()).prop_map(|(agent, on)| Op::Overloaded { agent, on }),
            1 => (any::<bool>(), 0..24u64).prop_map(|(study, trial)| Op::Stop { study, trial }),
            1 => Just(Op::AddTrial),
            2 => (0..1_500u64).prop_map(|ms| Op::Advance { ms }),
        ]
    }

    proptest! {
        /// After any sequence of events, on two studies sharing the agents
        /// (one restored with leases held by an agent this process has not
        /// met yet, and only for agents that say they have a GPU, which an
        /// agent may say or stop saying when it announces itself again),
        /// the indexes say what a scan of every trial and agent says.
        #[test]
        fn indexes_agree_with_a_full_scan_after_any_events(ops in proptest::collection::vec(op(), 1..200)) {
            let mut s = sched(12, 3, Selector::default());
            s.set_open("s", true);
            let gpu = Selector { tags: [("pool".to_string(), "gpu".to_string())].into(), ..Selector::default() };
            let policy = StudyPolicy { name: "t".into(), id: 8, selector: gpu, max_attempts: 2, lease_ms: 700 };
            let mut states = vec![Restored::Pending { last_attempt: 0, failures: 0 }; 8];
            states.extend((1..4).map(|attempt| Restored::Running { agent: "d".into(), attempt, failures: 0 }));
            s.add_study(policy, states, 0);
            let agents = ["a", "b", "c", "d"];
            let mut instances = [1u64; 4];
            let mut seqs = [0u64; 4];
            for a in &agents[..3] {
                s.hello(info(a, 1, "x86_64", &[]));
            }
            assert_indexes_agree(&s)?;
            let mut held: Vec<(String, TrialRef)> = Vec::new();
            let mut now = 0u64;
            for op in ops {
                let pick = |held: &Vec<(String, TrialRef)>, p: usize| held.get(p % held.len().max(1)).cloned();
                match op {
                    Op::Request { agent, free } => {
                        seqs[agent] += 1;
                        s.request(agents[agent], &WorkRequest { seq: seqs[agent], free, running: vec![] });
                    }
                    Op::Complete { pick: p, success } => {
                        if let Some((a, t)) = pick(&held, p) {
                            s.result(&a, &t, ResultKind::Complete { success }, now);
                        }
                    }
                    Op::Retry { pick: p } => {
                        if let Some((a, t)) = pick(&held, p) {
                            s.result(&a, &t, ResultKind::Retry("x".into()), now);
                        }
                    }
                    Op::Interfered { pick: p } => {
                        if let Some((a, t)) = pick(&held, p) {
                            s.result(&a, &t, ResultKind::Interfered { success: true, reason: "load".into() }, now);
                        }
                    }
                    Op::Refuse { pick: p } => {
                        if let Some((a, t)) = pick(&held, p) {
                            s.refuse(&a, &t, "busy");
                        }
                    }
                    Op::Offline { agent } => {
                        s.status(agents[agent], &AgentStatus { online: false, instance: instances[agent] });
                    }
                    Op::Hello { agent, restart, gpu } => {
                        instances[agent] += u64::from(restart);
                        let tags: &[(&str, &str)] = if gpu { &[("pool", "gpu")] } else { &[] };
                        s.hello(info(agents[agent], instances[agent], "x86_64", tags));
                    }
                    Op::Overloaded { agent, on } => {
                        s.set_overloaded(agents[agent], on.then(|| "busy".to_string()), now);
                    }
                    Op::Stop { study, trial } => {
                        s.stop(if study { "s" } else { "t" }, trial, "enough");
                    }
                    Op::AddTrial => {
                        s.add_trial("s");
                    }
                    Op::Advance { ms } => {
                        now += ms;
                        s.expire(now);
                    }
                }
                assert_indexes_agree(&s)?;
                for e in s.assign(now) {
                    if let Effect::Assign { agent, trial, .. } = e {
                        held.push((agent, trial));
                    }
                }
                assert_indexes_agree(&s)?;
            }
        }
    }
}
