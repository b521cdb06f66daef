//! Trials and their leases: each study's trial slots, the lease an
//! attempt runs under, and the indexes by deadline and by agent that every
//! lease keeps from [`StudyLeases::lease`] to [`StudyLeases::unlease`]; the
//! expiry tick, stopping a trial, and giving up an agent's leases.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use tunefleet_common::message::TrialRef;

use super::types::{Effect, StudyPolicy, AVOID_MS};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lease {
    pub(super) agent: String,
    pub(super) attempt: u32,
    pub(super) deadline_ms: u64,
    /// Loaded from the store after a coordinator restart, not assigned by this process.
    pub(super) restored: bool,
    /// The agent's request this lease answered (0 when restored).
    pub(super) seq: u64,
    /// The agent said it started the attempt (listed it as running, or
    /// sent its progress). One lost before that was never a failure of the
    /// trial, whoever held it ([`StudyLeases::lose_attempt`]).
    pub(super) started: bool,
    /// Progress rows kept of this attempt, and their size in bytes
    /// ([`super::Scheduler::take_progress`]).
    pub(super) progress: (u32, u64),
    /// Assigned to be held ahead (every slot of its agent was busy): the
    /// nodes that measure with it start once it starts ([`Effect::Started`]).
    pub(super) ahead: bool,
}

/// Most progress rows kept of one attempt (an epoch each).
pub const MAX_PROGRESS_ROWS: u32 = 4096;
/// Most bytes of progress (metric names and values, checkpoints) kept of
/// one attempt: an honest training run of a thousand epochs with a few
/// metrics each stays far below.
pub const MAX_PROGRESS_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
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
pub(super) struct TrialSlot {
    pub(super) state: State,
    pub(super) last_attempt: u32,
    pub(super) failures: u32,
    /// Which agent ran which attempt: only these may deliver results.
    pub(super) history: Vec<(u32, String)>,
    /// Agents this trial was moved off, and until when (ms) it stays off them.
    pub(super) avoid: Vec<(String, u64)>,
    /// Measurements refused for interference so far.
    pub(super) remeasures: u32,
    /// Once moved or measured again: the device class it must stay in, so
    /// its measurements stay comparable (and a checkpoint fits).
    pub(super) class: Option<String>,
    /// Attempts lost before they started (no failure counted for them).
    pub(super) unstarted: u32,
}

/// A trial lost before it started more than this many times its
/// `max_attempts` counts the next such loss as a failure: one whose
/// workload takes its agent down before the agent can say it started
/// would otherwise go round for ever.
pub(super) const UNSTARTED_PER_ATTEMPT: u32 = 4;

impl TrialSlot {
    /// A trial in `state` that no attempt has touched yet.
    pub(super) fn new(state: State) -> Self {
        TrialSlot {
            state,
            last_attempt: 0,
            failures: 0,
            history: Vec::new(),
            avoid: Vec::new(),
            remeasures: 0,
            class: None,
            unstarted: 0,
        }
    }
}

#[derive(Debug)]
pub(super) struct StudyLeases {
    pub(super) policy: StudyPolicy,
    pub(super) trials: Vec<TrialSlot>,
    pub(super) queue: VecDeque<u64>,
    pub(super) finished: u64,
    pub(super) failed: u64,
    pub(super) stopped: u64,
    /// The running trials by lease deadline: one entry per trial in
    /// `State::Running`, so its length is the number running.
    pub(super) deadlines: BTreeSet<(u64, u64)>,
    /// The running trials by the agent holding their lease.
    pub(super) held: HashMap<String, BTreeSet<u64>>,
    /// Agents whose leases ended since the last turn (their withheld credit
    /// is given back at the next [`Scheduler::assign`]).
    pub(super) released: Vec<String>,
    /// The credit of the ready agents that match the selector, so that
    /// [`Scheduler::demand`] needs no scan.
    pub(super) ready_credit: u64,
    /// Leases restored from the store, by agent, until that agent's first request.
    pub(super) restored: BTreeMap<String, Vec<u64>>,
    /// More trials may still be added ([`Scheduler::add_trial`]): the study
    /// is not finished even when every trial it has is.
    pub(super) open: bool,
    /// Bytes of the study's store each agent's results and progress took.
    pub(super) written: HashMap<String, u64>,
    /// ... and the names of each join token with a share of its own, together.
    pub(super) written_by_holder: HashMap<Arc<str>, u64>,
    /// Agents whose bytes count in their token's total already.
    pub(super) attributed: HashSet<String>,
}

/// A join token whose names share a store grant: its id, and the bytes of
/// each study's store they may take together.
pub(super) type Holder = (Arc<str>, u64);

impl StudyLeases {
    /// Whether `agent` (one of `holder`'s names, when its token has a
    /// share of its own) has used its share of this study's store, or its
    /// token has.
    pub(super) fn past_share(&self, agent: &str, holder: Option<&Holder>) -> bool {
        let own = self.written.get(agent).is_some_and(|w| *w >= self.policy.store_share);
        own || holder.is_some_and(|(h, cap)| self.written_by_holder.get(h).is_some_and(|w| *w >= *cap))
    }

    /// Counts what `agent` wrote before in its token's total, once.
    pub(super) fn attribute(&mut self, agent: &str, holder: &Arc<str>) {
        if self.attributed.insert(agent.to_string()) {
            let before = self.written.get(agent).copied().unwrap_or(0);
            *self.written_by_holder.entry(holder.clone()).or_default() += before;
        }
    }

    /// Trial `i` runs under `lease` (it was not running).
    pub(super) fn lease(&mut self, i: u64, lease: Lease) {
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
    pub(super) fn unlease(&mut self, i: u64) -> Option<Lease> {
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
    pub(super) fn running(&self) -> u64 {
        self.deadlines.len() as u64
    }

    /// The trials whose lease `agent` holds, in trial order.
    pub(super) fn held_by(&self, agent: &str) -> Vec<u64> {
        self.held.get(agent).map(|t| t.iter().copied().collect()).unwrap_or_default()
    }

    /// Ends the running attempt of trial `i` without a result: the trial is
    /// queued again, or failed once it has used up its attempts.
    pub(super) fn end_attempt(&mut self, i: u64, trial: TrialRef, reason: String) -> Option<Effect> {
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

    /// Ends the attempt of trial `i` that its agent lost (offline,
    /// restarted, lease run out, no longer listed). A started one is a
    /// failed attempt ([`StudyLeases::end_attempt`]). One never started (held
    /// ahead, or on its way) is no failure, whoever held it: queued again at
    /// the back. Returns the effect and whether the attempt had not started.
    pub(super) fn lose_attempt(&mut self, i: u64, trial: TrialRef, reason: String) -> Option<(Effect, bool)> {
        let slot = self.trials.get(usize::try_from(i).ok()?)?;
        let State::Running(lease) = &slot.state else { return None };
        let started = lease.started;
        let limit = self.policy.max_attempts.saturating_mul(UNSTARTED_PER_ATTEMPT);
        if started || slot.unstarted >= limit {
            return self.end_attempt(i, trial, reason).map(|e| (e, !started));
        }
        self.unlease(i)?;
        let slot = self.trials.get_mut(usize::try_from(i).ok()?)?;
        slot.unstarted += 1;
        // At the back: an agent that drops what it takes, and comes back
        // for more, gets other trials first, never the same ones in a loop.
        self.queue.push_back(i);
        Some((Effect::Requeued { trial, reason: format!("{NOT_STARTED}{reason}") }, true))
    }

    /// Takes trial `i` off `agent` because of `why` without counting a
    /// failure: queued again at the front, kept off `agent` for
    /// [`AVOID_MS`] and, when `class` is known, in that device class.
    pub(super) fn move_off(&mut self, i: u64, agent: &str, class: Option<String>, now_ms: u64) -> Option<Lease> {
        let lease = self.unlease(i)?;
        let slot = self.trials.get_mut(usize::try_from(i).ok()?)?;
        slot.avoid.push((agent.to_string(), now_ms.saturating_add(AVOID_MS)));
        slot.class = class;
        self.queue.push_front(i);
        Some(lease)
    }
}

/// How the reason of an attempt lost before it started begins: the store
/// counts no failure for it.
pub const NOT_STARTED: &str = "not started: ";

pub(super) fn trial_ref(policy: &StudyPolicy, trial: u64, attempt: u32) -> TrialRef {
    TrialRef { study: policy.name.clone(), study_id: policy.id, trial, attempt }
}

impl StudyLeases {
    /// Whether `trial` refers to this study: its name and its id.
    pub(super) fn owns(&self, trial: &TrialRef) -> bool {
        self.policy.name == trial.study && self.policy.id == trial.study_id
    }
}

/// The leases agent `name` holds, of every study.
pub(super) fn leases_on(studies: &[StudyLeases], name: &str) -> usize {
    studies.iter().map(|s| s.held.get(name).map_or(0, |h| h.len())).sum()
}

/// How many more of `study`'s trials agent `name` of `slots` slots may
/// hold, running or held ahead: as deep as the study allows
/// (`ahead_per_slot`, and `ahead_per_agent` held past its slots), counting
/// its own leases there (another study's held trials take the agent's
/// places, not this study's depth); 0 for a study held nowhere ahead.
pub(super) fn depth_left(study: &StudyLeases, name: &str, slots: usize) -> usize {
    let per_slot = usize::try_from(study.policy.ahead_per_slot).unwrap_or(usize::MAX);
    if per_slot == 0 {
        return 0;
    }
    let own = study.held.get(name).map_or(0, |h| h.len());
    let mut depth = slots.saturating_mul(per_slot.saturating_add(1));
    if let Some(per_agent) = study.policy.ahead_per_agent {
        let per_agent = usize::try_from(per_agent).unwrap_or(usize::MAX);
        depth = depth.min(slots.saturating_add(per_agent));
    }
    depth.saturating_sub(own)
}
