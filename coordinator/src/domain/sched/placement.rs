//! Placement: queued trials handed to the agents with credit, round robin
//! over the ready agents and over the studies that share them, keeping a
//! moved trial off the agent it left and in its device class. An agent
//! holding as many leases as it has slots takes more only as trials held
//! ahead ([`tunefleet_common::message::AgentInfo::lookahead`]): only of
//! studies that allow it, with a lease once more as long for each trial
//! per slot it waits behind.

use std::ops::Bound;

use super::lease::{depth_left, leases_on, trial_ref, Lease, State};
use super::{Effect, Scheduler};

impl Scheduler {
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
            let slots = usize::try_from(info.slots).unwrap_or(usize::MAX);
            // Leases it holds: past its slots, a trial waits there.
            let mut holding = leases_on(studies, name);
            'credit: while agent.credit > 0 {
                let n = studies.len();
                for k in 0..n {
                    let i = (*next_study + k) % n;
                    let ahead = holding >= slots;
                    let Some(study) = studies
                        .get_mut(i)
                        .filter(|s| s.policy.selector.matches(info) && (!ahead || depth_left(s, name, slots) > 0))
                    else {
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
                        let other_class = slot.class.as_ref().is_some_and(|c| *c != info.device_class());
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
                        // A held trial waits behind one trial per slot for
                        // each round of held ones before it: its lease
                        // covers them and its own run.
                        let waits = if ahead { (holding + 1 - slots).div_ceil(slots.max(1)) } else { 0 };
                        let lease_ms = study.policy.lease_ms.saturating_mul(1 + waits as u64);
                        let deadline_ms = now_ms.saturating_add(lease_ms);
                        study.lease(t, Lease { agent: name.to_string(), attempt, deadline_ms, restored: false, seq });
                        agent.credit -= 1;
                        holding += 1;
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
}
