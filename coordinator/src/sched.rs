//! Scheduling decisions, as a pure state machine: plain values in, plain
//! [`Effect`]s out, no sockets and no clocks (time is passed in as `now_ms`).
//!
//! * Pull: an agent's latest [`WorkRequest`] gives it credit (free slots);
//!   every assignment spends one. An agent never gets more than it asked for.
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

use std::collections::{BTreeMap, VecDeque};

use tunefleet_common::message::{AgentInfo, AgentStatus, TrialRef, WorkRequest};

pub use crate::study::Selector;

/// What the scheduler needs to know of a study.
#[derive(Debug, Clone)]
pub struct StudyPolicy {
    pub name: String,
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
    /// Trials in `State::Running`, kept up to date so that no event scans every trial.
    running: u64,
    /// Leases restored from the store, by agent, until that agent's first request.
    restored: BTreeMap<String, Vec<u64>>,
    /// More trials may still be added ([`Scheduler::add_trial`]): the study
    /// is not finished even when every trial it has is.
    open: bool,
}

impl StudyState {
    /// Ends the running attempt of trial `i` without a result: the trial is
    /// queued again, or failed once it has used up its attempts.
    fn end_attempt(&mut self, i: u64, trial: TrialRef, reason: String) -> Option<Effect> {
        let slot = self.trials.get_mut(i as usize)?;
        self.running -= 1;
        slot.failures += 1;
        if slot.failures >= self.policy.max_attempts {
            slot.state = State::Failed;
            self.failed += 1;
            Some(Effect::Failed { reason: format!("{} attempts failed, last: {reason}", slot.failures), trial })
        } else {
            slot.state = State::Pending;
            // At the front: a recycled trial should not wait behind the whole study.
            self.queue.push_front(i);
            Some(Effect::Requeued { trial, reason })
        }
    }
}

#[derive(Debug)]
struct AgentState {
    info: Option<AgentInfo>,
    online: bool,
    instance: u64,
    credit: u32,
    last_seq: Option<u64>,
    /// Why the agent gets no trials now (the decider found it overloaded).
    overloaded: Option<String>,
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
    /// Round-robin start among agents, so work spreads across the fleet.
    next_agent: usize,
    /// Round-robin start among studies, so studies that share agents share
    /// them fairly: each free slot goes to the next study with work for it.
    next_study: usize,
}

fn trial_ref(study: &str, trial: u64, attempt: u32) -> TrialRef {
    TrialRef { study: study.to_string(), trial, attempt }
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
            running: 0,
            restored: BTreeMap::new(),
            open: false,
            policy,
        };
        for (i, restored) in states.into_iter().enumerate() {
            let slot = match restored {
                Restored::Pending { last_attempt, failures } => {
                    study.queue.push_back(i as u64);
                    TrialSlot { last_attempt, failures, ..TrialSlot::new(State::Pending) }
                }
                Restored::Running { agent, attempt, failures } => {
                    study.running += 1;
                    study.restored.entry(agent.clone()).or_default().push(i as u64);
                    let lease = Lease {
                        agent: agent.clone(),
                        attempt,
                        deadline_ms: now_ms + study.policy.lease_ms,
                        restored: true,
                    };
                    TrialSlot {
                        last_attempt: attempt,
                        failures,
                        history: vec![(attempt, agent)],
                        ..TrialSlot::new(State::Running(lease))
                    }
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
        let credit: u64 = self
            .agents
            .values()
            .filter(|a| a.online && a.info.as_ref().is_some_and(|i| s.policy.selector.matches(i)))
            .map(|a| u64::from(a.credit))
            .sum();
        credit.saturating_sub(s.queue.len() as u64)
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
            running: s.running,
            stopped: s.stopped,
            open: s.open,
        })
    }

    /// Agents that are online and have said who they are.
    pub fn live_agents(&self) -> usize {
        self.agents.values().filter(|a| a.online && a.info.is_some()).count()
    }

    /// The device class of `agent`, once it said what it is.
    pub fn agent_class(&self, agent: &str) -> Option<String> {
        self.agents.get(agent).and_then(|a| a.info.as_ref()).map(device_class)
    }

    /// Agents connected and matching `study`'s selector.
    pub fn eligible_agents(&self, study: &str) -> usize {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return 0 };
        self.agents
            .values()
            .filter(|a| a.online && a.info.as_ref().is_some_and(|i| s.policy.selector.matches(i)))
            .count()
    }

    /// An agent announced itself (its session is authenticated by
    /// [`crate::auth`]). A new `instance` means the agent process
    /// restarted: whatever it was running is gone.
    pub fn hello(&mut self, info: AgentInfo) -> Vec<Effect> {
        let name = info.agent.clone();
        let instance = info.instance;
        let agent = self.agents.entry(name.clone()).or_insert(AgentState {
            info: None,
            online: true,
            instance,
            credit: 0,
            last_seq: None,
            overloaded: None,
        });
        let restarted = agent.instance != instance;
        agent.instance = instance;
        agent.online = true;
        agent.info = Some(info);
        if restarted {
            agent.credit = 0;
            agent.last_seq = None;
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
        if status.online {
            return Vec::new();
        }
        state.credit = 0;
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
        state.credit = req.free;
        state.online = true;
        let mut effects = Vec::new();
        for study in &mut self.studies {
            let name = study.policy.name.clone();
            for i in study.restored.remove(agent).unwrap_or_default() {
                let attempt = match study.trials.get(i as usize).map(|t| &t.state) {
                    Some(State::Running(l)) if l.restored && l.agent == agent => l.attempt,
                    _ => continue,
                };
                let tr = trial_ref(&name, i, attempt);
                if req.running.contains(&tr) {
                    continue;
                }
                effects.extend(study.end_attempt(i, tr, "the agent no longer runs it".into()));
            }
        }
        effects
    }

    /// The agent will not run this attempt: queue it again without counting a failure.
    pub fn refuse(&mut self, agent: &str, trial: &TrialRef, reason: &str) -> Vec<Effect> {
        let Some(study) = self.studies.iter_mut().find(|s| s.policy.name == trial.study) else { return Vec::new() };
        let Some(slot) = study.trials.get_mut(trial.trial as usize) else { return Vec::new() };
        match &slot.state {
            State::Running(l) if l.agent == agent && l.attempt == trial.attempt => {
                slot.state = State::Pending;
                study.running -= 1;
                study.queue.push_front(trial.trial);
                vec![Effect::Requeued { trial: trial.clone(), reason: format!("refused by {agent}: {reason}") }]
            }
            _ => Vec::new(),
        }
    }

    /// A result from `agent` for `trial`.
    pub fn result(&mut self, agent: &str, trial: &TrialRef, kind: ResultKind, now_ms: u64) -> (Verdict, Vec<Effect>) {
        let Some(study) = self.studies.iter_mut().find(|s| s.policy.name == trial.study) else {
            return (Verdict::Unknown, Vec::new());
        };
        let name = study.policy.name.clone();
        let Some(slot) = study.trials.get_mut(trial.trial as usize) else { return (Verdict::Unknown, Vec::new()) };
        let ran_it = slot.history.iter().any(|(a, who)| *a == trial.attempt && who == agent);
        match &slot.state {
            State::Done { agent: a, attempt } if a == agent && *attempt == trial.attempt => {
                return (Verdict::Duplicate, Vec::new())
            }
            // The stopped attempt's own result (cut short, or complete if it
            // ended before the cancel arrived) is kept for the record, once.
            State::Stopped { agent: a, attempt, delivered } if a == agent && *attempt == trial.attempt => {
                let verdict = if *delivered { Verdict::Duplicate } else { Verdict::Accepted };
                slot.state = State::Stopped { agent: a.clone(), attempt: *attempt, delivered: true };
                return (verdict, Vec::new());
            }
            State::Stopped { .. } => return (if ran_it { Verdict::Superseded } else { Verdict::Unknown }, Vec::new()),
            State::Done { .. } => return (if ran_it { Verdict::Superseded } else { Verdict::Unknown }, Vec::new()),
            _ if !ran_it => return (Verdict::Unknown, Vec::new()),
            // Failed for want of a result (attempts ran out, e.g. its agent was
            // presumed dead): a workload that really ran delivers after all.
            State::Failed if matches!(kind, ResultKind::Complete { .. }) => {
                study.failed -= 1;
            }
            _ => {}
        }
        let live = match &slot.state {
            State::Running(l) => Some(l.clone()),
            _ => None,
        };
        let this_is_live = live.as_ref().is_some_and(|l| l.agent == agent && l.attempt == trial.attempt);
        let kind = match kind {
            ResultKind::Interfered { success, reason } => {
                if !this_is_live || slot.remeasures >= MAX_REMEASURES {
                    // Measured again often enough (or an old attempt): take it, flagged.
                    ResultKind::Complete { success }
                } else {
                    slot.remeasures += 1;
                    slot.class = self.agents.get(agent).and_then(|a| a.info.as_ref()).map(device_class);
                    slot.state = State::Pending;
                    slot.avoid.push((agent.to_string(), now_ms.saturating_add(AVOID_MS)));
                    study.running -= 1;
                    study.queue.push_front(trial.trial);
                    let reason = format!("measured again ({} of {MAX_REMEASURES}): {reason}", slot.remeasures);
                    return (
                        Verdict::Remeasured,
                        vec![Effect::Moved { trial: trial.clone(), from: agent.to_string(), reason }],
                    );
                }
            }
            other => other,
        };
        match kind {
            ResultKind::Interfered { .. } => (Verdict::Unknown, Vec::new()),
            ResultKind::Retry(reason) => {
                if !this_is_live {
                    // An old attempt failed after the trial had moved on: nothing to do.
                    return (Verdict::Superseded, Vec::new());
                }
                (Verdict::Retried, study.end_attempt(trial.trial, trial.clone(), reason).into_iter().collect())
            }
            ResultKind::Complete { success } => {
                slot.state = State::Done { agent: agent.to_string(), attempt: trial.attempt };
                if live.is_some() {
                    study.running -= 1;
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
                        trial: trial_ref(&name, trial.trial, l.attempt),
                        reason: format!("attempt {} already delivered a result", trial.attempt),
                    });
                }
                (Verdict::Accepted, effects)
            }
        }
    }

    /// Whether `trial` is the live attempt of `agent` (progress worth recording).
    pub fn is_live(&self, agent: &str, trial: &TrialRef) -> bool {
        self.studies
            .iter()
            .find(|s| s.policy.name == trial.study)
            .and_then(|s| s.trials.get(trial.trial as usize))
            .is_some_and(
                |slot| matches!(&slot.state, State::Running(l) if l.agent == agent && l.attempt == trial.attempt),
            )
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
        let Some(slot) = s.trials.get_mut(usize::try_from(trial).unwrap_or(usize::MAX)) else { return Vec::new() };
        let mut effects = Vec::new();
        let tr = trial_ref(study, trial, slot.last_attempt);
        match &slot.state {
            State::Running(l) => {
                effects.push(Effect::Cancel { agent: l.agent.clone(), trial: tr.clone(), reason: reason.to_string() });
                slot.state = State::Stopped { agent: l.agent.clone(), attempt: l.attempt, delivered: false };
                s.running -= 1;
            }
            State::Pending => slot.state = State::Stopped { agent: String::new(), attempt: 0, delivered: true },
            _ => return effects,
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
            let name = study.policy.name.clone();
            for (i, slot) in study.trials.iter_mut().enumerate() {
                let State::Running(l) = &slot.state else { continue };
                if l.agent != agent {
                    continue;
                }
                let tr = trial_ref(&name, i as u64, l.attempt);
                let reason = format!("agent overloaded: {why}");
                effects.push(Effect::Cancel { agent: agent.to_string(), trial: tr.clone(), reason: reason.clone() });
                effects.push(Effect::Moved { trial: tr, from: agent.to_string(), reason });
                slot.state = State::Pending;
                slot.avoid.push((agent.to_string(), now_ms.saturating_add(AVOID_MS)));
                slot.class.clone_from(&class);
                study.running -= 1;
                study.queue.push_front(i as u64);
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
            let name = study.policy.name.clone();
            let expired: Vec<(u64, String, u32)> = study
                .trials
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| match &slot.state {
                    State::Running(l) if l.deadline_ms <= now_ms => Some((i as u64, l.agent.clone(), l.attempt)),
                    _ => None,
                })
                .collect();
            for (i, agent, attempt) in expired {
                let tr = trial_ref(&name, i, attempt);
                let reason = "lease expired".to_string();
                effects.push(Effect::Cancel { agent, trial: tr.clone(), reason: reason.clone() });
                effects.extend(study.end_attempt(i, tr, reason));
            }
        }
        effects
    }

    /// Hands queued trials to agents with credit.
    pub fn assign(&mut self, now_ms: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        let names: Vec<String> = self.agents.keys().cloned().collect();
        if names.is_empty() {
            return effects;
        }
        let start = self.next_agent % names.len();
        for name in names[start..].iter().chain(&names[..start]) {
            let Some(agent) = self.agents.get_mut(name) else { continue };
            let Some(info) = agent.info.as_ref().filter(|_| agent.online && agent.overloaded.is_none()) else {
                continue;
            };
            let seq = agent.last_seq.unwrap_or(0);
            'credit: while agent.credit > 0 {
                let n = self.studies.len();
                for k in 0..n {
                    let i = (self.next_study + k) % n;
                    let study = &mut self.studies[i];
                    if !study.policy.selector.matches(info) {
                        continue;
                    }
                    // Trials kept off this agent wait for another one.
                    let mut kept_off = Vec::new();
                    while let Some(t) = study.queue.pop_front() {
                        let slot = &mut study.trials[t as usize];
                        if slot.state != State::Pending {
                            continue;
                        }
                        slot.avoid.retain(|(_, until)| *until > now_ms);
                        let other_class = slot.class.as_ref().is_some_and(|c| *c != device_class(info));
                        if other_class || slot.avoid.iter().any(|(a, _)| a == name) {
                            kept_off.push(t);
                            continue;
                        }
                        for k in kept_off.drain(..).rev() {
                            study.queue.push_front(k);
                        }
                        slot.last_attempt += 1;
                        slot.history.push((slot.last_attempt, name.clone()));
                        slot.state = State::Running(Lease {
                            agent: name.clone(),
                            attempt: slot.last_attempt,
                            deadline_ms: now_ms + study.policy.lease_ms,
                            restored: false,
                        });
                        study.running += 1;
                        agent.credit -= 1;
                        // The next free slot goes first to the study after this one.
                        self.next_study = (i + 1) % n;
                        effects.push(Effect::Assign {
                            agent: name.clone(),
                            trial: trial_ref(&study.policy.name, t, slot.last_attempt),
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
        }
        self.next_agent = self.next_agent.wrapping_add(1);
        effects
    }

    fn release_leases(&mut self, agent: &str, reason: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        for study in &mut self.studies {
            let name = study.policy.name.clone();
            let held: Vec<(u64, u32)> = study
                .trials
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| match &slot.state {
                    State::Running(l) if l.agent == agent => Some((i as u64, l.attempt)),
                    _ => None,
                })
                .collect();
            for (i, attempt) in held {
                effects.extend(study.end_attempt(i, trial_ref(&name, i, attempt), reason.into()));
            }
        }
        effects
    }
}

#[cfg(test)]
mod tests {
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
        let policy = StudyPolicy { name: "s".into(), selector, max_attempts, lease_ms: 1_000 };
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
    fn studies_that_share_agents_take_turns() {
        let mut s = sched(6, 1, Selector::default());
        let policy = StudyPolicy { name: "t".into(), selector: Selector::default(), max_attempts: 1, lease_ms: 1_000 };
        s.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; 6], 0);
        s.hello(info("a", 1, "x86_64", &[]));
        s.request("a", &req(1, 4));
        let order: Vec<String> = assigned(&s.assign(0)).into_iter().map(|(_, t)| t.study).collect();
        assert_eq!(order, vec!["s", "t", "s", "t"], "a study listed first does not starve the next");
        // Where one study has nothing left, the other takes every slot.
        let mut lone = sched(0, 1, Selector::default());
        let policy = StudyPolicy { name: "t".into(), selector: Selector::default(), max_attempts: 1, lease_ms: 1_000 };
        lone.add_study(policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; 3], 0);
        lone.hello(info("a", 1, "x86_64", &[]));
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
    fn never_assigns_more_than_requested() {
        let mut s = sched(10, 3, Selector::default());
        s.hello(info("a", 1, "x86_64", &[]));
        assert!(s.assign(0).is_empty(), "no request yet, no work");
        s.request("a", &req(1, 2));
        assert_eq!(assigned(&s.assign(0)).len(), 2);
        assert!(s.assign(0).is_empty());
        // A stale (older) request grants nothing.
        s.request("a", &req(1, 5));
        assert!(s.assign(0).is_empty());
        s.request("a", &req(2, 1));
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
        s.hello(info("good", 1, "aarch64", &[("pool", "gpu"), ("x", "y")]));
        for a in ["wrong-tag", "wrong-arch", "good"] {
            s.request(a, &req(1, 4));
        }
        let got = assigned(&s.assign(0));
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|(a, _)| a == "good"));
        assert_eq!(s.eligible_agents("s"), 1);
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
        let policy = StudyPolicy { name: "s".into(), selector: Selector::default(), max_attempts: 3, lease_ms: 10 };
        let states = vec![Restored::Done, Restored::Running { agent: "a".into(), attempt: 2, failures: 1 }];
        s.add_study(policy, states, 0);
        let t = TrialRef { study: "s".into(), trial: 1, attempt: 2 };
        assert_eq!(s.result("a", &t, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        assert!(s.counts("s").is_some_and(|c| c.finished()));
    }

    #[test]
    fn restored_lease_not_listed_by_the_agent_is_requeued() {
        let mut s = Scheduler::new();
        let policy = StudyPolicy { name: "s".into(), selector: Selector::default(), max_attempts: 3, lease_ms: 10_000 };
        let states = vec![
            Restored::Running { agent: "a".into(), attempt: 1, failures: 0 },
            Restored::Running { agent: "a".into(), attempt: 1, failures: 0 },
            Restored::Running { agent: "gone".into(), attempt: 1, failures: 0 },
        ];
        s.add_study(policy, states, 0);
        s.hello(info("a", 9, "x86_64", &[]));
        let still = TrialRef { study: "s".into(), trial: 0, attempt: 1 };
        let eff = s.request("a", &WorkRequest { seq: 1, free: 0, running: vec![still.clone()] });
        assert!(matches!(&eff[..], [Effect::Requeued { trial, .. }] if trial.trial == 1), "{eff:?}");
        // The retained offline status of an agent this process never met releases its restored lease.
        let eff = s.status("gone", &AgentStatus { online: false, instance: 4 });
        assert!(matches!(&eff[..], [Effect::Requeued { trial, .. }] if trial.trial == 2), "{eff:?}");
        assert_eq!(s.result("a", &still, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
    }

    #[test]
    fn running_count_matches_the_trials_through_random_events() {
        let mut s = sched(30, 3, Selector::default());
        let agents = ["a", "b", "c"];
        let mut instances = [1u64, 1, 1];
        for a in agents {
            s.hello(info(a, 1, "x86_64", &[]));
        }
        let mut held: Vec<(String, TrialRef)> = Vec::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for step in 0..2_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let who = (seed % 3) as usize;
            let agent = agents[who];
            match (seed >> 8) % 7 {
                0 | 1 => s.request(agent, &req(step + 1, 2)).len(),
                2 if !held.is_empty() => {
                    let (a, t) = held.swap_remove((seed >> 16) as usize % held.len());
                    s.result(&a, &t, ResultKind::Complete { success: seed % 2 == 0 }, 0).1.len()
                }
                3 if !held.is_empty() => {
                    let (a, t) = held.swap_remove((seed >> 16) as usize % held.len());
                    s.result(&a, &t, ResultKind::Retry("x".into()), 0).1.len()
                }
                4 if !held.is_empty() => {
                    let (a, t) = held[(seed >> 16) as usize % held.len()].clone();
                    s.refuse(&a, &t, "busy").len()
                }
                5 => s.status(agent, &AgentStatus { online: false, instance: instances[who] }).len(),
                6 => {
                    instances[who] += (seed >> 20) % 2;
                    s.hello(info(agent, instances[who], "x86_64", &[])).len()
                }
                _ => s.expire(step * 10).len(),
            };
            for e in s.assign(step * 10) {
                if let Effect::Assign { agent, trial, .. } = e {
                    held.push((agent, trial));
                }
            }
            let study = &s.studies[0];
            let truth = study.trials.iter().filter(|t| matches!(t.state, State::Running(_))).count() as u64;
            assert_eq!(study.running, truth, "after step {step}");
        }
    }
}
