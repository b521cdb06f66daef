//! Results: how a result relates to what the scheduler knows, judged
//! without changing anything ([`Scheduler::judge`]) and settled once the
//! store has taken it ([`Scheduler::settle`]).

use tunefleet_common::message::{AgentInfo, TrialRef};

use super::lease::{trial_ref, State};
use super::types::Change;
use super::{Effect, Judgement, ResultKind, Scheduler, Verdict, MAX_REMEASURES};

impl Scheduler {
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
        if study.past_share(agent, self.agents.get(agent).and_then(|a| a.holder.as_ref()))
            && !matches!(kind, ResultKind::Retry(_))
        {
            let why = format!("the agent has used its share of the study's store ({} bytes)", study.policy.store_share);
            let change = if this_is_live { Change::Retry(why) } else { Change::Nothing };
            return judged(Verdict::PastShare, change);
        }
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
        if matches!(change, Change::Complete { .. }) {
            self.delivered(&agent);
        }
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
                let class = self.agents.get(&agent).and_then(|a| a.info.as_ref()).map(AgentInfo::device_class);
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
}
