//! An agent as the scheduler sees it ([`FleetAgent`]): what it said it is
//! and asked for, and the credit a request gives it (never past its
//! announced slots: [`credit`]). The scheduler's handling of agents is in
//! `agents.rs`.

use std::sync::Arc;

use tunefleet_common::message::AgentInfo;

use super::lease::StudyLeases;

#[derive(Debug)]
pub(super) struct FleetAgent {
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
    /// The most leases it may hold at once, however many places it has:
    /// halved each time it loses trials before they start, one more with
    /// each result (`u32::MAX`: all its places).
    pub(super) window: u32,
    /// Trials it lost before they started, since this coordinator started.
    pub(super) lost_held: u64,
    /// The tags the operator granted it (what it claims is in `info`).
    pub(super) granted: std::collections::BTreeMap<String, String>,
    /// Its join token, when the token grants its names a store share
    /// together (`token create --total-store-mib`).
    pub(super) holder: Option<super::lease::Holder>,
}

impl FleetAgent {
    /// The trials an agent takes at once: its slots, and as many held
    /// ahead as it offers (never more than 4 per slot).
    pub(super) fn places(info: &AgentInfo) -> u32 {
        info.slots.saturating_add(info.ahead_places())
    }

    /// The trials it may hold at once now: its places, at most its window.
    pub(super) fn places_now(&self) -> u32 {
        self.info.as_ref().map_or(0, |i| Self::places(i).min(self.window))
    }

    /// Counts `credit` as what this agent adds to the `ready_credit` of the
    /// studies it matches (by the info it has now).
    pub(super) fn recount(&mut self, studies: &mut [StudyLeases], credit: u32) {
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

/// What an agent may use of what it announced (`info`): at most the
/// `slots` and `lookahead` the operator granted it, and at most `cap`
/// slots whatever the grant; trials held ahead at most
/// [`tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT`] per slot as
/// before. Returns whether anything was cut.
pub fn grant(info: &mut AgentInfo, slots: Option<u32>, lookahead: Option<u32>, cap: u32) -> bool {
    let before = (info.slots, info.lookahead);
    info.slots = info.slots.min(slots.unwrap_or(u32::MAX)).min(cap.max(1));
    info.lookahead = info.lookahead.min(lookahead.unwrap_or(u32::MAX)).min(info.ahead_places());
    before != (info.slots, info.lookahead)
}

/// Cuts the GPUs `info` announces to what was granted (`None`: `cap`), the
/// first ones by index kept; true when it announced more.
pub fn grant_gpus(info: &mut AgentInfo, gpus: Option<u32>, cap: u32) -> bool {
    let most = gpus.unwrap_or(cap).min(cap) as usize;
    if info.gpus.len() <= most {
        return false;
    }
    info.gpus.sort_by_key(|g| g.index);
    info.gpus.truncate(most);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_gets_what_it_was_granted_not_what_it_claims() {
        let mut claimed = AgentInfo { slots: 1024, lookahead: 4096, ..AgentInfo::minimal("m", 1) };
        assert!(grant(&mut claimed, Some(2), Some(3), 64));
        assert_eq!((claimed.slots, claimed.lookahead), (2, 3));
        let mut capped = AgentInfo { slots: 1024, lookahead: 4096, ..AgentInfo::minimal("m", 1) };
        assert!(grant(&mut capped, None, None, 64));
        assert_eq!((capped.slots, capped.lookahead), (64, 256), "the fleet cap, 4 ahead per slot");
        let gpu =
            |index| tunefleet_common::message::GpuDevice { index, uuid: format!("GPU-{index}"), name: "g".into() };
        let mut hoarder = AgentInfo { gpus: (0..64).rev().map(gpu).collect(), ..AgentInfo::minimal("m", 1) };
        assert!(grant_gpus(&mut hoarder, Some(2), 8));
        assert_eq!(hoarder.gpus.iter().map(|g| g.index).collect::<Vec<_>>(), [0, 1], "what was granted, lowest first");
        let mut capped = AgentInfo { gpus: (0..64).map(gpu).collect(), ..AgentInfo::minimal("m", 1) };
        assert!(grant_gpus(&mut capped, None, 8));
        assert_eq!(capped.gpus.len(), 8, "the fleet cap");
        let mut none = AgentInfo { gpus: (0..2).map(gpu).collect(), ..AgentInfo::minimal("m", 1) };
        assert!(grant_gpus(&mut none, Some(0), 8));
        assert!(none.gpus.is_empty(), "a grant of 0 GPUs");
        let mut honest = AgentInfo { gpus: (0..2).map(gpu).collect(), ..AgentInfo::minimal("h", 1) };
        assert!(!grant_gpus(&mut honest, None, 8), "fewer than the cap are kept as announced");
        let mut modest = AgentInfo { slots: 2, lookahead: 1, ..AgentInfo::minimal("h", 1) };
        assert!(!grant(&mut modest, Some(8), None, 64), "less than granted is kept as announced");
        assert_eq!((modest.slots, modest.lookahead), (2, 1));
    }
}
