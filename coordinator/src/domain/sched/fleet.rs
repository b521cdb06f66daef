//! An agent as the scheduler sees it ([`AgentState`]): what it said it is
//! and asked for, and the credit a request gives it (never past its
//! announced slots: [`credit`]). The scheduler's handling of agents is in
//! `agents.rs`.

use std::sync::Arc;

use tunefleet_common::message::AgentInfo;

use super::lease::StudyState;

#[derive(Debug)]
pub(super) struct AgentState {
    /// Its name, shared with the fleet's indexes.
    pub(super) name: Arc<str>,
    pub(super) info: Option<AgentInfo>,
    pub(super) online: bool,
    pub(super) instance: u64,
    pub(super) credit: u32,
    /// What its last request asked for beyond the slots its leases left
    /// free: given back, one per lease that ends, up to what it asked.
    pub(super) withheld: u32,
    pub(super) last_seq: Option<u64>,
    /// Why the agent gets no trials now (the decider found it overloaded).
    pub(super) overloaded: Option<String>,
    /// Counted in the scheduler's `live` count.
    pub(super) live: bool,
    /// In the scheduler's `ready` set.
    pub(super) ready: bool,
    /// Counted in the `ready_credit` of the studies it matches: its credit
    /// while it is ready, else 0.
    pub(super) counted: u32,
}

impl AgentState {
    /// The trials an agent takes at once: its slots, and as many held
    /// ahead as it offers (never more than 4 per slot).
    pub(super) fn places(info: &AgentInfo) -> u32 {
        info.slots.saturating_add(info.ahead_places())
    }

    /// Counts `credit` as what this agent adds to the `ready_credit` of the
    /// studies it matches (by the info it has now).
    pub(super) fn recount(&mut self, studies: &mut [StudyState], credit: u32) {
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

/// An agent's credit: the `free` slots (and places to hold a trial ahead)
/// it asks for, less the attempts on their way to it (`in_flight`), and at
/// most the `slots` (and lookahead) it announced less every lease it holds
/// (`held`: those running, held ahead and on their way).
pub(super) fn credit(free: u32, slots: u32, in_flight: usize, held: usize) -> u32 {
    let sub = |n: u32, k: usize| n.saturating_sub(u32::try_from(k).unwrap_or(u32::MAX));
    sub(free, in_flight).min(sub(slots, held))
}
