//! What a turn does once its messages are handled: the studies topped up
//! with new trials, a study that fails fast stopped, why a study waits
//! said, the scheduler's decisions taken ([`schedule`]), and each of its
//! [`Effect`]s performed on the store and told to its agent ([`perform`]).
//! Also the service's `cancel` and the offloading decider's verdicts.

use std::collections::HashMap;

use tunefleet_common::message::{Assignment, Cancel, CoordinatorMessage};

use super::active::ActiveStudy;
use super::ctx::co_messages;
use super::types::{Answer, EngineError, EngineStats, Now};
use crate::domain::comeasure::CoMeasures;
use crate::domain::offload::{LoadChange, LoadHistory, OffloadPolicy};
use crate::domain::sched::{Effect, Scheduler};
use crate::domain::search;
use crate::domain::search::TrialPlan;
use crate::store::Batch;

/// Says (once each time it changes) why a study with nothing running
/// waits while agents are online that cannot run it: the GPUs, arch, tags,
/// energy, cores or memory it asks for against what each agent offers.
fn say_why_waiting(sched: &Scheduler, studies: &mut HashMap<String, ActiveStudy>) {
    for (name, active) in studies.iter_mut().filter(|(_, a)| !a.cancelled) {
        let counts = sched.counts(name);
        let idle = counts.is_some_and(|c| !c.finished() && c.running == 0);
        // Every trial told so far is final: the outside sampler has the turn.
        let told_all = counts.is_some_and(|c| c.done + c.failed + c.stopped == c.total);
        let why = match (idle, active.search.external() && told_all) {
            (true, true) => Some(format!(
                "for its outside sampler: [strategy] kind = \"external\" runs only the configurations told through \
                 the API (POST /api/v1/studies/{name}/tell; docs/API.md), and every one told so far is final"
            )),
            (true, false) => sched.why_waiting(name),
            _ => None,
        };
        if why != active.waits {
            match &why {
                Some(w) => tracing::warn!(study = %name, "study waits: {w}"),
                None if active.waits.is_some() => {
                    tracing::info!(study = %name, "study no longer waits for a fitting agent")
                }
                None => {}
            }
            active.waits = why;
        }
    }
}

/// Stops each study whose failures in this run reach what it allows
/// ([`crate::domain::study::Study::fails_fast`]), as a cancel does: no more
/// trials, the running ones cancelled on their agents.
fn fail_fast(sched: &mut Scheduler, studies: &mut HashMap<String, ActiveStudy>, effects: &mut Vec<Effect>) {
    let tripped: Vec<(String, String)> = studies
        .iter()
        .filter(|(_, a)| !a.cancelled)
        .filter_map(|(name, a)| {
            let c = sched.counts(name)?;
            let (failed, done) = (c.failed.saturating_sub(a.at_start.0), c.done.saturating_sub(a.at_start.1));
            Some((name.clone(), a.study.fails_fast(failed, done)?))
        })
        .collect();
    for (name, why) in tripped {
        tracing::error!(study = %name, %why, "study stopped for its failures: fix the cause and run it again to go on");
        let _ = cancel(sched, studies, &name, effects);
        if let Some(a) = studies.get_mut(&name) {
            a.failed_fast = Some(why);
        }
    }
}

/// The decider's verdicts, applied: overloaded agents get no trials and
/// their running ones move.
pub(super) fn offload(sched: &mut Scheduler, telemetry: &LoadHistory, policy: &OffloadPolicy, now: u64) -> Vec<Effect> {
    let mut effects = Vec::new();
    for decision in crate::domain::offload::decide(policy, telemetry, |a| sched.overloaded(a).is_some(), now) {
        match decision {
            LoadChange::Overloaded { agent, why } => {
                tracing::warn!(agent = %agent, reason = %why, "agent overloaded: no new trials, its trials move");
                effects.extend(sched.set_overloaded(&agent, Some(why), now));
            }
            LoadChange::Recovered { agent } => {
                tracing::info!(agent = %agent, "agent no longer overloaded");
                effects.extend(sched.set_overloaded(&agent, None, now));
            }
        }
    }
    effects
}

/// Creates as many trials as the agents that match each study have room
/// for, asking its search; closes a study in the scheduler once its search
/// has nothing more.
fn top_up(
    sched: &mut Scheduler,
    batch: &mut Batch<'_>,
    studies: &mut HashMap<String, ActiveStudy>,
) -> Result<(), EngineError> {
    for (name, active) in studies.iter_mut().filter(|(_, a)| !a.cancelled) {
        let mut want = sched.demand(name);
        // Written together once asked (a statement for many: one a trial
        // was a third of a server's statements), each adopted as it comes
        // (the next ask reads it running); a write refused fails the turn.
        let mut made: Vec<TrialPlan> = Vec::new();
        while want > 0 {
            // TPE's constant liar: the trials created and not finished run.
            // Listed only for a strategy that reads them: it is a scan of
            // the study's trials (TPE's ask is linear in them anyway), which
            // would make every other study's cost per trial grow with its size.
            let running: Vec<(u64, &tunefleet_common::params::Params)> = if active.search.reads_running() {
                active
                    .plans
                    .iter()
                    .filter(|p| !sched.is_finished(name, p.trial))
                    .map(|p| (p.trial, &p.params))
                    .collect()
            } else {
                Vec::new()
            };
            let Some(trials) = active.search.next_trials_while(&running) else { break };
            want = want.saturating_sub(trials.len() as u64);
            made.extend(trials.iter().cloned());
            active.adopt(sched, trials);
        }
        batch.add_trials(name, &made)?;
        if active.search.exhausted() {
            sched.set_open(name, false);
        }
    }
    Ok(())
}

/// Cancels `name`: no more trials; every trial not finished is stopped, and
/// its running attempt cancelled on its agent.
pub(super) fn cancel(
    sched: &mut Scheduler,
    studies: &mut HashMap<String, ActiveStudy>,
    name: &str,
    effects: &mut Vec<Effect>,
) -> Answer {
    let Some(active) = studies.get_mut(name) else {
        return Answer::Error { message: format!("no study {name:?} runs here") };
    };
    if active.cancelled {
        return Answer::Ok { message: format!("study {name} was cancelled already") };
    }
    active.cancelled = true;
    sched.set_open(name, false);
    let mut running = 0;
    for trial in 0..active.plans.len() as u64 {
        let stopped = sched.stop(name, trial, "study cancelled");
        running += stopped.iter().filter(|e| matches!(e, Effect::Cancel { .. })).count();
        effects.extend(stopped);
    }
    tracing::warn!(study = %name, running, "study cancelled");
    Answer::Ok {
        message: format!(
            "study {name} cancelled: {running} attempts cancelled on their agents (running, or held to start next)"
        ),
    }
}

/// What the end of a turn touches.
pub(super) struct Turn<'a, 'b> {
    pub(super) sched: &'a mut Scheduler,
    pub(super) batch: &'a mut Batch<'b>,
    pub(super) studies: &'a mut HashMap<String, ActiveStudy>,
    pub(super) stats: &'a mut EngineStats,
    pub(super) out: &'a mut Vec<(String, CoordinatorMessage)>,
    pub(super) co: &'a mut CoMeasures,
}

/// The end of a turn: new trials where agents have room, assignments, and
/// every effect applied to the store.
pub(super) fn schedule(t: &mut Turn<'_, '_>, mut effects: Vec<Effect>, now: Now) -> Result<(), EngineError> {
    fail_fast(t.sched, t.studies, &mut effects);
    top_up(t.sched, t.batch, t.studies)?;
    say_why_waiting(t.sched, t.studies);
    effects.extend(t.sched.assign(now.engine_ms));
    for effect in effects {
        perform(t, effect, now)?;
    }
    Ok(())
}

/// The nodes that measure with `trial` (its study's `[measure] nodes`, by
/// the tags the operator granted them) start measuring: it starts now.
fn co_start(t: &mut Turn<'_, '_>, agent: &str, trial: &tunefleet_common::message::TrialRef, now: Now) {
    let Some(tags) = t.studies.get(&trial.study).and_then(|a| a.study.measure_nodes.as_ref()) else { return };
    // An agent has its nodes measure at most as many of its trials at once
    // as it has slots: a member that says it started every trial it holds
    // does not make every node open a window for each.
    let slots = t.sched.live_slots(agent).unwrap_or(1).max(1) as usize;
    if t.co.measuring_for(agent) >= slots {
        tracing::debug!(agent = %agent, trial = %trial, slots, "no co-measurement: its nodes already measure as many of its trials as it has slots");
        return;
    }
    let nodes = t.sched.agents_tagged(tags);
    // Until the lease the scheduler gave (longer for a trial held ahead).
    let lease_ms = t.sched.lease_left(trial, now.engine_ms).unwrap_or(0);
    let sends = t.co.start(trial, agent, nodes, (now.unix_ms, now.engine_ms), lease_ms);
    t.out.extend(co_messages(sends));
}

/// An attempt that ended without a result: the nodes measuring it forget it.
fn abandon(t: &mut Turn<'_, '_>, trial: &tunefleet_common::message::TrialRef) {
    let sends = t.co.abandon(trial);
    t.out.extend(co_messages(sends));
}

/// Does what the scheduler decided: an assignment rendered, recorded and
/// queued for its agent (and the nodes that measure with it told to
/// start), a cancel queued, a trial's end recorded (at `now`, Unix
/// milliseconds).
fn perform(t: &mut Turn<'_, '_>, effect: Effect, now: Now) -> Result<(), EngineError> {
    match effect {
        Effect::Assign { agent, trial, request_seq, ahead } => {
            let Some(active) = t.studies.get_mut(&trial.study) else { return Ok(()) };
            active.first_assigned.get_or_insert(now.instant);
            let Some(plan) = active.plans.get(trial.trial as usize) else { return Ok(()) };
            let checkpoint = active.checkpoints.get(&trial.trial);
            if let Some((epoch, _)) = checkpoint.filter(|_| !active.study.resume.is_empty()) {
                tracing::info!(trial = %trial, agent = %agent, epoch, "goes on from its last checkpoint");
            }
            match search::render_resumed(&active.study, active.probe.as_ref(), plan, &trial, checkpoint) {
                Ok(spec) => {
                    t.batch.record_assignment_held(&trial, &agent, now.unix_ms, ahead)?;
                    t.stats.assignments += 1;
                    // A trial held ahead has its nodes started once it starts.
                    if !ahead {
                        co_start(t, &agent, &trial, now);
                    }
                    t.out.push((agent, CoordinatorMessage::Assign(Assignment { trial, request_seq, spec })));
                }
                Err(e) => {
                    // Validated at load time, so this is a bug; fail the trial rather than loop.
                    tracing::error!(trial = %trial, error = %e, "command template does not render");
                    t.batch.fail_trial(&trial.study, trial.trial, &e.to_string())?;
                }
            }
        }
        Effect::Cancel { agent, trial, reason } => {
            tracing::info!(agent = %agent, trial = %trial, reason = %reason, "cancelling");
            t.out.push((agent, CoordinatorMessage::Cancel(Cancel { trial, reason })));
        }
        Effect::Requeued { trial, reason } => {
            t.stats.requeued += 1;
            tracing::info!(trial = %trial, reason = %reason, "trial requeued");
            t.batch.requeue(&trial, &reason)?;
            abandon(t, &trial);
        }
        Effect::Failed { trial, reason } => {
            tracing::warn!(trial = %trial, reason = %reason, "trial failed");
            t.batch.fail_trial(&trial.study, trial.trial, &reason)?;
            abandon(t, &trial);
        }
        Effect::Moved { trial, from, reason } => {
            t.stats.moved += 1;
            tracing::warn!(trial = %trial, from = %from, reason = %reason, "trial moved");
            t.batch.requeue(&trial, &format!("moved off {from}: {reason}"))?;
            abandon(t, &trial);
        }
        Effect::Started { agent, trial } => {
            t.batch.set_held(&trial, false)?;
            co_start(t, &agent, &trial, now);
        }
        Effect::LostHeld { agent, trials, places } => {
            t.stats.lost_held += u64::from(trials);
            tracing::warn!(agent = %agent, trials, places, lost = t.stats.lost_held, "agent lost trials it held before they started (none counts a failure): it may hold fewer at once");
            t.batch.add_lost_held(&agent, trials)?;
        }
        Effect::Stopped { trial, reason } => {
            t.stats.stopped += 1;
            t.batch.stop_trial(&trial, &reason, now.unix_ms)?;
        }
    }
    Ok(())
}
