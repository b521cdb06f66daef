//! Leases that end without a result: a trial stopped early, the expiry
//! tick (leases past their deadline), and an agent's leases given up.

use super::lease::{trial_ref, State};
use super::{Effect, Scheduler};

impl Scheduler {
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

    /// Cancels and requeues every lease past its deadline.
    pub fn expire(&mut self, now_ms: u64) -> Vec<Effect> {
        let mut effects = Vec::new();
        let mut lost = Vec::new();
        for study in &mut self.studies {
            let mut due: Vec<u64> = study.deadlines.range(..=(now_ms, u64::MAX)).map(|&(_, i)| i).collect();
            // In trial order, as a scan of the trials would find them.
            due.sort_unstable();
            for i in due {
                let Some(State::Running(l)) = study.trials.get(i as usize).map(|t| &t.state) else { continue };
                let (agent, tr) = (l.agent.clone(), trial_ref(&study.policy, i, l.attempt));
                let reason = "lease expired".to_string();
                effects.push(Effect::Cancel { agent: agent.clone(), trial: tr.clone(), reason: reason.clone() });
                if let Some((effect, unstarted)) = study.lose_attempt(i, tr, reason) {
                    effects.push(effect);
                    if unstarted {
                        lost.push(agent);
                    }
                }
            }
        }
        for agent in lost {
            effects.extend(self.lost_unstarted(&agent, 1));
        }
        effects
    }

    /// Gives up every lease `agent` holds (it went offline or restarted):
    /// started attempts are failed attempts, the others are queued again
    /// without a failure ([`super::lease::StudyLeases::lose_attempt`]), and
    /// the agent, having lost trials it held, is given fewer
    /// ([`Scheduler::lost_unstarted`]).
    pub(super) fn release_leases(&mut self, agent: &str, reason: &str) -> Vec<Effect> {
        let mut effects = Vec::new();
        let mut unstarted = 0;
        for study in &mut self.studies {
            for i in study.held_by(agent) {
                let Some(State::Running(l)) = study.trials.get(i as usize).map(|t| &t.state) else { continue };
                let tr = trial_ref(&study.policy, i, l.attempt);
                if let Some((effect, u)) = study.lose_attempt(i, tr, reason.into()) {
                    effects.push(effect);
                    unstarted += u32::from(u);
                }
            }
        }
        effects.extend(self.lost_unstarted(agent, unstarted));
        effects
    }
}
