//! Scheduling decisions, as a pure state machine: plain values in, plain
//! [`Effect`]s out, no sockets and no clocks (time is passed in as `now_ms`).
//!
//! * Pull: an agent's latest `WorkRequest` gives it credit (free slots);
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
//! `StudyLeases::lease` and ends in `StudyLeases::unlease`, which keep the
//! study's indexes; `Scheduler::sync_agent` keeps the fleet's after every
//! change to an agent. A property test checks them all against a full scan
//! after any sequence of events.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use tunefleet_common::message::{AgentInfo, TrialRef};

mod agents;
mod expiry;
mod fleet;
mod lease;
mod placement;
mod results;
#[cfg(test)]
mod tests;
mod types;

use fleet::FleetAgent;
pub use fleet::{grant, grant_gpus};
pub use lease::NOT_STARTED;
use lease::{Lease, State, StudyLeases, TrialSlot};
pub use types::{
    Effect, Judgement, Restored, ResultKind, Selector, StudyCounts, StudyPolicy, Verdict, AVOID_MS, MAX_REMEASURES,
};

/// The scheduler.
#[derive(Debug, Default)]
pub struct Scheduler {
    studies: Vec<StudyLeases>,
    agents: BTreeMap<String, FleetAgent>,
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

impl Scheduler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a study whose trials `0..states.len()` are in the given states.
    pub fn add_study(&mut self, policy: StudyPolicy, states: Vec<Restored>, now_ms: u64) {
        self.studies.retain(|s| s.policy.name != policy.name);
        let mut study = StudyLeases {
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
            written: HashMap::new(),
            written_by_holder: HashMap::new(),
            attributed: Default::default(),
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
                        // It may have run for a while: lost, it counts.
                        started: true,
                        progress: (0, 0),
                        ahead: false,
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
    /// the live agents that match it, less the trials already queued. For a
    /// study held shallower than agents offer (`ahead_per_slot`), what each
    /// can take of it: a trial is asked of the search only when it can go
    /// out, not to wait in the queue asked blind.
    pub fn demand(&self, study: &str) -> u64 {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return 0 };
        let mut credit = s.ready_credit;
        if s.policy.ahead_per_slot < tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT {
            let room: u64 = self
                .ready
                .iter()
                .filter_map(|name| Some((name, self.agents.get(&**name)?)))
                .filter_map(|(name, a)| Some((name, a, a.info.as_ref().filter(|i| s.policy.selector.matches(i))?)))
                .map(|(name, a, info)| {
                    // Its own depth there; or, when it waits for a free
                    // slot, the agent's free slots.
                    let slots = usize::try_from(info.slots).unwrap_or(usize::MAX);
                    let room = if s.policy.ahead_per_slot == 0 {
                        slots.saturating_sub(lease::leases_on(&self.studies, name))
                    } else {
                        lease::depth_left(s, name, slots)
                    };
                    u64::from(a.counted).min(room as u64)
                })
                .sum();
            credit = credit.min(room);
        }
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
        self.agents.get(agent).and_then(|a| a.info.as_ref()).map(AgentInfo::device_class)
    }

    /// Whether `study`'s selector admits `agent` as it last described
    /// itself: what reuse may learn from (an unknown study or agent, no).
    pub fn admits(&self, study: &str, agent: &str) -> bool {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return false };
        self.agents.get(agent).and_then(|a| a.info.as_ref()).is_some_and(|i| s.policy.selector.matches(i))
    }

    /// Why `study` waits with agents online, if none of them can run its
    /// trials: what each lacks (three named, the rest counted). `None`
    /// while one can, or while no agent is online (that wait is ordinary).
    pub fn why_waiting(&self, study: &str) -> Option<String> {
        let s = self.studies.iter().find(|s| s.policy.name == study)?;
        let mut online: Vec<(&String, &AgentInfo)> =
            self.agents.iter().filter(|(_, a)| a.online).filter_map(|(n, a)| Some((n, a.info.as_ref()?))).collect();
        let fits = |i: &AgentInfo| s.policy.selector.matches(i) && i.gpus.len() >= s.policy.gpus as usize;
        let past = |n: &str| s.past_share(n, self.agents.get(n).and_then(|a| a.holder.as_ref()));
        if online.is_empty() || online.iter().any(|(n, i)| fits(i) && !past(n)) {
            return None;
        }
        // Those that could have used their share of its store.
        if online.iter().any(|(_, i)| fits(i)) {
            let n = online.iter().filter(|(n, _)| past(n)).count();
            return Some(format!("the {n} online agent(s) that could run its trials used their share of its store"));
        }
        // What three lack, in name order; the rest counted.
        online.sort_by_key(|(n, _)| n.as_str());
        let mut parts: Vec<String> = online
            .iter()
            .take(3)
            .map(|(n, i)| format!("{n} lacks {}", s.policy.selector.unmet(i, s.policy.gpus).join(", ")))
            .collect();
        if online.len() > 3 {
            parts.push(format!("and {} more agent(s)", online.len() - 3));
        }
        Some(format!("no online agent can run its trials: {}", parts.join("; ")))
    }

    /// Agents connected and matching `study`'s selector.
    pub fn eligible_agents(&self, study: &str) -> usize {
        let Some(s) = self.studies.iter().find(|s| s.policy.name == study) else { return 0 };
        self.agents
            .values()
            .filter(|a| a.online && a.info.as_ref().is_some_and(|i| s.policy.selector.matches(i)))
            .count()
    }

    /// Agents online that said who they are and were granted all of `tags`
    /// by the operator (their join token's `--tag`), by name: what an agent
    /// only claims makes it no measuring node of others' trials.
    pub fn agents_tagged(&self, tags: &BTreeMap<String, String>) -> Vec<String> {
        self.agents
            .values()
            .filter(|a| a.online && a.info.is_some())
            .filter(|a| tags.iter().all(|(k, v)| a.granted.get(k) == Some(v)))
            .map(|a| a.name.to_string())
            .collect()
    }

    /// The tags the operator granted `agent` (set after its Hello).
    pub fn set_granted(&mut self, agent: &str, tags: BTreeMap<String, String>) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.granted = tags;
        }
    }

    /// The cores `agent` announced (for the bounds of what it measures).
    /// The slots `agent` was given, while it is online.
    pub fn live_slots(&self, agent: &str) -> Option<u32> {
        self.agents.get(agent).filter(|a| a.online).and_then(|a| a.info.as_ref()).map(|i| i.slots)
    }

    pub fn agent_cores(&self, agent: &str) -> Option<u32> {
        self.agents.get(agent).and_then(|a| a.info.as_ref()).map(|i| i.cores)
    }

    /// The GPUs `agent` announced (none when it is not known).
    pub fn agent_gpus(&self, agent: &str) -> usize {
        self.agents.get(agent).and_then(|a| a.info.as_ref()).map_or(0, |i| i.gpus.len())
    }

    /// How long the lease of `trial`'s live attempt has left at `now_ms`.
    pub fn lease_left(&self, trial: &TrialRef, now_ms: u64) -> Option<u64> {
        let slot = self.studies.iter().find(|s| s.owns(trial)).and_then(|s| s.trials.get(trial.trial as usize))?;
        match &slot.state {
            State::Running(l) if l.attempt == trial.attempt => Some(l.deadline_ms.saturating_sub(now_ms)),
            _ => None,
        }
    }

    /// Whether a result of `trial` from `agent` may still come and be kept:
    /// its live attempt, or the attempt of a trial stopped early whose
    /// result has not arrived (kept for the record).
    pub fn awaits_result(&self, agent: &str, trial: &TrialRef) -> bool {
        self.studies.iter().find(|s| s.owns(trial)).and_then(|s| s.trials.get(trial.trial as usize)).is_some_and(
            |slot| match &slot.state {
                State::Running(l) => l.agent == agent && l.attempt == trial.attempt,
                State::Stopped { agent: a, attempt, delivered: false } => a == agent && *attempt == trial.attempt,
                _ => false,
            },
        )
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
}
