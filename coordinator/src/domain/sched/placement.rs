//! Placement: queued trials handed to the agents with credit, one trial to
//! each agent in turn (round robin over the ready agents, and over the
//! studies that share them), keeping a moved trial off the agent it left
//! and in its device class, and a trial that needs GPUs (`gpus = N`) on an
//! agent with that many its leases do not take. An agent holding as many leases as it has
//! slots takes more only as trials held ahead
//! ([`tunefleet_common::message::AgentInfo::lookahead`]): only of studies
//! that allow it, with a lease once more as long for each trial per slot it
//! waits behind, and never past its share of the study's outstanding
//! trials (see [`fair_share`]), so no agent drains a queue that others
//! wait on.

use std::ops::Bound;
use std::sync::Arc;

use super::fleet::FleetAgent;
use super::lease::{depth_left, leases_on, trial_ref, Lease, State, StudyLeases};
use super::{Effect, Scheduler};

impl Scheduler {
    /// Hands queued trials to agents with credit.
    pub fn assign(&mut self, now_ms: u64) -> Vec<Effect> {
        self.give_back();
        let mut effects = Vec::new();
        let live = self.live;
        let Scheduler { studies, agents, ready, next_agent, next_study, .. } = self;
        // The ready agent after the one the last turn began with.
        let after = ready.range::<str, _>((Bound::Excluded(&**next_agent), Bound::Unbounded)).next();
        let Some(start) = after.or_else(|| ready.first()).cloned() else { return effects };
        // Agents whose credit changed.
        let mut served: Vec<Arc<str>> = Vec::new();
        // Agents with credit left after their trial of this pass.
        let mut again: Vec<Arc<str>> = Vec::new();
        let (from_start, before_start) =
            ((Bound::Included(&*start), Bound::Unbounded), (Bound::Unbounded, Bound::Excluded(&*start)));
        for name in ready.range::<str, _>(from_start).chain(ready.range::<str, _>(before_start)) {
            if studies.iter().all(|s| s.queue.is_empty()) {
                break;
            }
            let Some(agent) = agents.get_mut(&**name) else { continue };
            if let Some(effect) = place_one(studies, agent, next_study, live, now_ms) {
                effects.push(effect);
                served.push(name.clone());
                if agent.credit > 0 {
                    again.push(name.clone());
                }
            }
        }
        // Further passes visit only the agents that took a trial and still
        // have credit: one more trial each, until the queues or the credit run out.
        while !again.is_empty() && !studies.iter().all(|s| s.queue.is_empty()) {
            let pass = std::mem::take(&mut again);
            for name in pass {
                let Some(agent) = agents.get_mut(&*name) else { continue };
                if let Some(effect) = place_one(studies, agent, next_study, live, now_ms) {
                    effects.push(effect);
                    if agent.credit > 0 {
                        again.push(name);
                    }
                }
            }
        }
        *next_agent = start;
        served.sort_unstable();
        served.dedup();
        for name in served {
            self.sync_agent(&name);
        }
        effects
    }
}

/// The most of `study`'s leases one agent may hold once its slots are
/// busy: its equal share of the study's outstanding trials (queued and
/// running) among the `live` agents. An agent with a free slot always
/// takes a trial; only trials held ahead are bounded so.
fn fair_share(study: &StudyLeases, live: usize) -> usize {
    let outstanding = study.queue.len() + study.deadlines.len();
    outstanding.div_ceil(live.max(1))
}

/// GPUs of agent `name` its leases take, running and held.
fn gpus_leased(studies: &[StudyLeases], name: &str) -> usize {
    studies.iter().map(|s| s.held.get(name).map_or(0, |h| h.len()) * s.policy.gpus as usize).sum()
}

/// One trial for `agent` (one with credit, online, not overloaded), of the
/// next study after `next_study` with a trial it may take; `None` when
/// none fits.
fn place_one(
    studies: &mut [StudyLeases],
    agent: &mut FleetAgent,
    next_study: &mut usize,
    live: usize,
    now_ms: u64,
) -> Option<Effect> {
    if agent.credit == 0 || !agent.online || agent.overloaded.is_some() {
        return None;
    }
    let info = agent.info.as_ref()?;
    let name = &*agent.name;
    let seq = agent.last_seq.unwrap_or(0);
    let slots = usize::try_from(info.slots).unwrap_or(usize::MAX);
    // Leases it holds: past its slots, a trial waits there.
    let holding = leases_on(studies, name);
    let ahead = holding >= slots;
    // Its GPUs not leased: a trial of a study with `gpus = N` needs N of
    // them (held ones count: each is started on GPUs of its own).
    let gpus_free = match info.gpus.len() {
        0 => 0,
        gpus => gpus.saturating_sub(gpus_leased(studies, name)),
    };
    let n = studies.len();
    for k in 0..n {
        let i = (*next_study + k) % n;
        let Some(study) = studies.get_mut(i).filter(|s| {
            s.policy.selector.matches(info)
                && s.policy.gpus as usize <= gpus_free
                && !s.past_share(name, agent.holder.as_ref())
                && (!ahead
                    || (depth_left(s, name, slots) > 0
                        && s.held.get(name).map_or(0, |h| h.len()) < fair_share(s, live)))
        }) else {
            continue;
        };
        // Trials kept off this agent wait for another one.
        let mut kept_off = Vec::new();
        let mut chosen = None;
        while let Some(t) = study.queue.pop_front() {
            let Some(slot) = study.trials.get_mut(t as usize) else { continue };
            if slot.state != State::Pending {
                continue;
            }
            slot.avoid.retain(|(_, until)| *until > now_ms);
            let other_class = slot.class.as_ref().is_some_and(|c| *c != info.device_class());
            if other_class || slot.avoid.iter().any(|(a, _)| **a == *name) {
                kept_off.push(t);
                continue;
            }
            chosen = Some(t);
            break;
        }
        for k in kept_off.into_iter().rev() {
            study.queue.push_front(k);
        }
        let Some(t) = chosen else { continue };
        let Some(slot) = study.trials.get_mut(t as usize) else { continue };
        slot.last_attempt += 1;
        let attempt = slot.last_attempt;
        slot.history.push((attempt, name.to_string()));
        // A held trial waits behind one trial per slot for each round of
        // held ones before it: its lease covers them and its own run.
        let waits = if ahead { (holding + 1 - slots).div_ceil(slots.max(1)) } else { 0 };
        let lease_ms = study.policy.lease_ms.saturating_mul(1 + waits as u64);
        let deadline_ms = now_ms.saturating_add(lease_ms);
        let lease = Lease {
            agent: name.to_string(),
            attempt,
            deadline_ms,
            restored: false,
            seq,
            started: false,
            progress: (0, 0),
            ahead,
        };
        study.lease(t, lease);
        agent.credit -= 1;
        // The next free slot goes first to the study after this one.
        *next_study = (i + 1) % n;
        return Some(Effect::Assign {
            agent: name.to_string(),
            trial: trial_ref(&study.policy, t, attempt),
            request_seq: seq,
            ahead,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use tunefleet_common::message::{AgentInfo, GpuDevice, WorkRequest};

    use crate::domain::sched::{Effect, Restored, ResultKind, Scheduler, StudyPolicy, Verdict};
    use crate::domain::study::Selector;

    fn study(name: &str, id: u64, gpus: u32, trials: usize) -> (StudyPolicy, Vec<Restored>) {
        let policy = StudyPolicy {
            name: name.into(),
            id,
            selector: Selector::default(),
            max_attempts: 1,
            ahead_per_slot: 4,
            ahead_per_agent: None,
            lease_ms: 1_000,
            gpus,
            store_share: u64::MAX,
        };
        (policy, vec![Restored::Pending { last_attempt: 0, failures: 0 }; trials])
    }

    fn agent(name: &str, slots: u32, gpus: u32) -> AgentInfo {
        let gpus = (0..gpus).map(|i| GpuDevice { index: i, uuid: format!("GPU-{i}"), name: "H200".into() }).collect();
        AgentInfo { slots, lookahead: 4 * slots, gpus, ..AgentInfo::minimal(name, 1) }
    }

    /// (agent, study, trial) of each assignment.
    fn placed(effects: &[Effect]) -> Vec<(String, String, u64)> {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::Assign { agent, trial, .. } => Some((agent.clone(), trial.study.clone(), trial.trial)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_trial_needing_gpus_goes_only_where_that_many_are_not_leased() {
        let mut s = Scheduler::new();
        for (policy, states) in [study("train", 1, 1, 6), study("cpu", 2, 0, 6), study("big", 3, 3, 2)] {
            s.add_study(policy, states, 0);
        }
        s.hello(agent("g", 3, 2));
        s.hello(agent("c", 2, 0));
        s.request("g", &WorkRequest { seq: 1, free: 3, ahead: 4, running: vec![], held: vec![] });
        s.request("c", &WorkRequest { seq: 1, free: 2, ahead: 0, running: vec![], held: vec![] });
        let first = placed(&s.assign(0));
        let on = |who: &str, what: &str, list: &[(String, String, u64)]| {
            list.iter().filter(|(a, st, _)| a == who && st == what).count()
        };
        assert_eq!(on("g", "train", &first), 2, "two GPUs, two trials of one GPU each, held ones included: {first:?}");
        assert_eq!(on("c", "train", &first), 0, "no GPU, no training trial");
        assert_eq!(on("g", "big", &first) + on("c", "big", &first), 0, "no agent has three GPUs");
        assert!(on("g", "cpu", &first) > 0 && on("c", "cpu", &first) > 0, "CPU trials fill the rest: {first:?}");
        // One training trial ends on g: its GPU takes the next one, no more.
        let (_, _, t) = first.iter().find(|(a, st, _)| a == "g" && st == "train").cloned().expect("one");
        let trial = tunefleet_common::message::TrialRef { study: "train".into(), study_id: 1, trial: t, attempt: 1 };
        assert_eq!(s.result("g", &trial, ResultKind::Complete { success: true }, 0).0, Verdict::Accepted);
        s.request("g", &WorkRequest { seq: 2, free: 1, ahead: 4, running: vec![], held: vec![] });
        let next = placed(&s.assign(0));
        assert_eq!(on("g", "train", &next), 1, "{next:?}");
    }
}
