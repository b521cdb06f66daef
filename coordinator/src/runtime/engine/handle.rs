//! Inbound events, each in a savepoint of its own, in three stages: the
//! gate ([`super::gate`]) opens and bounds what came in; the handshake
//! ([`super::hello`]) and Last Wills; and the dispatch of each message of
//! an authenticated agent: statuses, work requests, progress, refusals,
//! telemetry and results, judged, stored, then settled in the scheduler
//! (see [`guarded`]). No I/O but the store: what is to be sent is queued in
//! the [`Ctx`].

use tunefleet_common::auth::{self, Will};
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::message::{
    AckOutcome, AgentMessage, AgentStatus, CoordinatorMessage, ResultAck, TrialRef, TrialResult,
};
use tunefleet_common::topic::AgentTopic;

use super::ctx::{co_messages, early_stop, repeat_until_stable, usable_checkpoint, Ctx};
use super::gate::{gate, Gated};
use super::hello::on_hello;
use super::learn::{learn, on_profile};
use super::types::Inbound;
use super::types::{loud, EngineError};
use crate::domain::comeasure::{NodeOutcome, NodeRecord};
use crate::domain::offload::Sample;
use crate::domain::sched::{ResultKind, Scheduler, Verdict};
use crate::domain::search;
use crate::runtime::auth::WillCheck;
use crate::store::{RecordOutcome, StoreError};

/// Handles `events` in order, each in its own savepoint ([`handle`]).
pub(super) fn handle_all(cx: &mut Ctx<'_, '_>, events: impl IntoIterator<Item = Inbound>) -> Result<(), EngineError> {
    for ev in events {
        handle(cx, ev)?;
    }
    Ok(())
}

/// Runs `f` inside savepoint `name`: kept when it succeeds; when it fails
/// with a store error, its writes are undone (the rest of the batch stays),
/// the error is counted and returned for the caller to answer.
fn in_savepoint(
    cx: &mut Ctx<'_, '_>,
    name: &'static str,
    f: impl FnOnce(&mut Ctx<'_, '_>) -> Result<(), EngineError>,
) -> Result<Option<StoreError>, EngineError> {
    cx.batch.savepoint(name)?;
    match f(cx) {
        Ok(()) => {
            cx.batch.release(name)?;
            Ok(None)
        }
        Err(EngineError::Store(e)) => {
            cx.batch.rollback_to(name)?;
            cx.stats.store_errors += 1;
            Ok(Some(e))
        }
        Err(e) => {
            cx.batch.rollback_to(name)?;
            Err(e)
        }
    }
}

/// One message, in a savepoint of its own. A store error while handling it
/// rolls back its writes alone and drops what it queued; the turn goes on.
///
/// The scheduler and the other in-memory state are not in the savepoint,
/// so every handler validates first and writes the store before it changes
/// them: a result is judged ([`Scheduler::judge`]) and settled only once its
/// writes succeeded; a status, telemetry, progress or Last Will is written
/// before it is applied. What follows once a result is settled (an extra
/// repeat, a learned profile) runs in a savepoint of its own ([`aside`]), so
/// its failure never undoes a result the scheduler already counts.
fn guarded(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    kind: AgentTopic,
    result: Option<TrialRef>,
    f: impl FnOnce(&mut Ctx<'_, '_>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    let (out, effects) = (cx.out.len(), cx.effects.len());
    let Some(e) = in_savepoint(cx, "message", f)? else { return Ok(()) };
    cx.out.truncate(out);
    cx.effects.truncate(effects);
    if loud(cx.stats.store_errors) {
        tracing::error!(agent = %agent, topic = kind.as_str(), error = %e, errors = cx.stats.store_errors, "message refused: the store could not take it (rolled back alone)");
    }
    if let Some(trial) = result {
        let outcome = AckOutcome::Refused(format!("the store could not take it: {e}"));
        cx.out.push((agent.to_string(), CoordinatorMessage::Ack(ResultAck { trial, outcome })));
    }
    Ok(())
}

/// Bookkeeping after a settled result, in a savepoint of its own: a store
/// error undoes it alone (logged, counted) and the result stays stored.
fn aside(
    cx: &mut Ctx<'_, '_>,
    what: &str,
    f: impl FnOnce(&mut Ctx<'_, '_>) -> Result<(), EngineError>,
) -> Result<(), EngineError> {
    if let Some(e) = in_savepoint(cx, "aside", f)? {
        if loud(cx.stats.store_errors) {
            tracing::error!(error = %e, errors = cx.stats.store_errors, "{what}: the store could not take it (rolled back alone)");
        }
    }
    Ok(())
}

/// One event: the gate makes it an authenticated, bounded, typed message
/// ([`gate`]); a handshake or a Last Will is taken in its savepoint, each
/// message in its own ([`dispatch`]).
fn handle(cx: &mut Ctx<'_, '_>, ev: Inbound) -> Result<(), EngineError> {
    let now = cx.now.unix_ms;
    match gate(cx, ev)? {
        Gated::Nothing => Ok(()),
        Gated::Hello { agent, signed } => {
            let name = agent.clone();
            guarded(cx, &name, AgentTopic::Hello, None, |cx| on_hello(cx, agent, &signed, now))
        }
        Gated::Will { agent, will } => {
            let name = agent.clone();
            guarded(cx, &name, AgentTopic::Status, None, |cx| on_will(cx, agent, &will, now))
        }
        Gated::Messages { agent, msgs } => {
            for (kind, msg) in msgs {
                let result = match &msg {
                    AgentMessage::Result(r) => Some(r.trial.clone()),
                    // Requests and sync answers change the scheduler and memory only:
                    // no savepoint (two statements a message) to guard them.
                    AgentMessage::Request(_) | AgentMessage::Synced(_) => {
                        dispatch(cx, agent.clone(), msg, now)?;
                        continue;
                    }
                    _ => None,
                };
                let name = agent.clone();
                guarded(cx, &name, kind, result, |cx| dispatch(cx, name.clone(), msg, now))?;
            }
            Ok(())
        }
    }
}

/// A valid message from an authenticated agent: store writes first, then
/// the scheduler and the rest of memory (see [`guarded`]).
fn dispatch(cx: &mut Ctx<'_, '_>, agent: String, msg: AgentMessage, now: u64) -> Result<(), EngineError> {
    match msg {
        AgentMessage::Status(status) => {
            if !status.online {
                cx.batch.set_will_hash(&agent, None)?;
            }
            cx.batch.set_agent_online(&agent, status.online, now)?;
            if !status.online {
                tracing::info!(agent = %agent, "agent offline");
                cx.telemetry.forget(&agent);
                cx.sessions.end(&agent);
            }
            cx.effects.extend(cx.sched.status(&agent, &status));
        }
        AgentMessage::Request(req) => {
            // Another study's attempts are none of this one's (the
            // scheduler compares study ids too): counted, nothing else.
            let others: Vec<&TrialRef> =
                req.running.iter().chain(&req.held).filter(|t| of_another_study(cx.sched, t)).collect();
            for t in others {
                other_study(cx, &agent, "running attempt", t);
            }
            cx.effects.extend(cx.sched.request(&agent, &req));
        }
        AgentMessage::Progress(p) if of_another_study(cx.sched, &p.trial) => {
            other_study(cx, &agent, "progress", &p.trial);
        }
        AgentMessage::Refuse(r) if of_another_study(cx.sched, &r.trial) => {
            other_study(cx, &agent, "refusal", &r.trial);
        }
        AgentMessage::Progress(mut p) => {
            if cx.sched.is_live(&agent, &p.trial) {
                if let (Some(reference), Some(a)) = (&p.checkpoint, cx.studies.get(&p.trial.study)) {
                    if let Err(why) = usable_checkpoint(&a.study, reference) {
                        cx.stats.refused_checkpoints += 1;
                        if loud(cx.stats.refused_checkpoints) {
                            tracing::warn!(agent = %agent, trial = %p.trial, checkpoint = ?reference, reason = %why, refused = cx.stats.refused_checkpoints, "checkpoint refused: not kept");
                        }
                        p.checkpoint = None;
                    }
                }
                // Bounded per attempt: rows and bytes (names, values, checkpoint).
                let bytes = p.metrics.keys().map(|k| k.len() as u64 + 16).sum::<u64>()
                    + p.checkpoint.as_ref().map_or(0, |c| c.len() as u64);
                cx.effects.extend(cx.sched.started(&agent, &p.trial));
                if let Err(why) = cx.sched.take_progress(&agent, &p.trial, bytes) {
                    cx.stats.refused_progress += 1;
                    if loud(cx.stats.refused_progress) {
                        tracing::warn!(agent = %agent, trial = %p.trial, epoch = p.epoch, reason = why, refused = cx.stats.refused_progress, "progress not kept");
                    }
                    return Ok(());
                }
                cx.batch.record_progress(&p)?;
                if let Some(wp) = &p.profile {
                    on_profile(cx, &agent, &p.trial, wp)?;
                }
                if let (Some(reference), Some(a)) = (&p.checkpoint, cx.studies.get_mut(&p.trial.study)) {
                    a.checkpoints.insert(p.trial.trial, (p.epoch, reference.clone()));
                }
                early_stop(cx, &p);
            }
        }
        AgentMessage::Refuse(r) => cx.effects.extend(cx.sched.refuse(&agent, &r.trial, &r.reason)),
        AgentMessage::Result(result) => on_result(cx, agent, result, now)?,
        // Taken apart before dispatch (`handle`); refused by the bounds check.
        AgentMessage::Bundle(_) => {}
        AgentMessage::Telemetry(t) => {
            cx.batch.record_telemetry(&agent, &t)?;
            cx.telemetry.observe(&agent, Sample::of(&t, cx.now.engine_ms));
        }
        AgentMessage::Synced(n) => {
            if cx.unsynced.get(&agent) == Some(&n) {
                cx.unsynced.remove(&agent);
            }
        }
        // Checked, stored, and only then taken: a store error leaves the
        // node to be asked again (see `guarded`).
        AgentMessage::CoMeasured(m) => match cx.co.check(&agent, &m, cx.sched.agent_cores(&agent).unwrap_or(1)) {
            Ok(()) => {
                let trial = m.trial.clone();
                let record =
                    NodeRecord { trial: trial.clone(), agent: agent.clone(), outcome: NodeOutcome::Measured(m) };
                cx.batch.record_node(&record, now)?;
                cx.co.taken(&agent, &trial);
            }
            Err(why) => {
                cx.stats.refused_comeasures += 1;
                if loud(cx.stats.refused_comeasures) {
                    tracing::warn!(agent = %agent, trial = %m.trial, reason = %why, refused = cx.stats.refused_comeasures, "co-measurement refused");
                }
            }
        },
    }
    Ok(())
}

/// Whether `trial` names a study this coordinator runs but carries another
/// study id: it belongs to another study of that name (another store).
fn of_another_study(sched: &Scheduler, trial: &TrialRef) -> bool {
    sched.study_id(&trial.study).is_some_and(|id| id != trial.study_id)
}

/// Counts (and logs the first of) references to another study of a name
/// this coordinator runs.
fn other_study(cx: &mut Ctx<'_, '_>, agent: &str, what: &str, trial: &TrialRef) {
    cx.stats.other_study_refs += 1;
    if loud(cx.stats.other_study_refs) {
        tracing::warn!(agent = %agent, trial = %trial, study_id = format!("{:016x}", trial.study_id), what, count = cx.stats.other_study_refs, "another study of this name (another store): ignored");
    }
}

/// An agent's Last Will: offline only if it is the will its session (or,
/// after a coordinator restart, its last recorded session) committed to.
fn on_will(cx: &mut Ctx<'_, '_>, agent: String, will: &Will, now: u64) -> Result<(), EngineError> {
    let genuine = match cx.sessions.will(&agent, will) {
        WillCheck::Live => true,
        WillCheck::NoSession => cx.batch.will_hash(&agent)?.is_some_and(|h| auth::will_matches(will, &h)),
        WillCheck::Forged => {
            cx.stats.forged_wills += 1;
            tracing::warn!(agent = %agent, forged = cx.stats.forged_wills, "a Last Will that is not this session's: ignored");
            return Ok(());
        }
    };
    if !genuine {
        // The retained will of an earlier session, seen again after a restart.
        tracing::debug!(agent = %agent, "stale Last Will ignored");
        return Ok(());
    }
    cx.batch.set_will_hash(&agent, None)?;
    cx.batch.set_agent_online(&agent, false, now)?;
    tracing::info!(agent = %agent, "agent lost its connection (Last Will)");
    cx.telemetry.forget(&agent);
    cx.effects.extend(cx.sched.status(&agent, &AgentStatus { online: false, instance: will.instance }));
    Ok(())
}

fn on_result(cx: &mut Ctx<'_, '_>, agent: String, result: TrialResult, now: u64) -> Result<(), EngineError> {
    let TrialResult { trial, measurement, .. } = result;
    let kind = match &measurement.exit {
        ExitOutcome::SpawnFailed(why) => ResultKind::Retry(format!("could not start: {why}")),
        ExitOutcome::Cancelled => ResultKind::Retry("cancelled".into()),
        // A disturbed measurement is taken again only when the coordinator moves work.
        _ if cx.remeasure && !measurement.interference.is_empty() => {
            ResultKind::Interfered { success: measurement.exit.success(), reason: measurement.interference.join("; ") }
        }
        _ => ResultKind::Complete { success: measurement.exit.success() },
    };
    // Judged now, settled once the store has taken the result: a write that
    // fails leaves the scheduler as it was (see `guarded`).
    let judgement = cx.sched.judge(&agent, &trial, kind);
    let verdict = judgement.verdict;
    let (outcome, objective, stored) = record(cx, &agent, &trial, &measurement, verdict, now)?;
    // The nodes measuring with the attempt: its window, now that it ended
    // with a result; forgotten when it ended without one.
    let co = if stored {
        let from = measurement.started_unix_ms;
        let to = from.saturating_add(measurement.wall_us / 1000);
        cx.co.window(&trial, from, to, now, cx.now.engine_ms)
    } else if matches!(verdict, Verdict::Retried | Verdict::Superseded | Verdict::Remeasured) {
        cx.co.abandon(&trial)
    } else {
        Vec::new()
    };
    cx.out.extend(co_messages(co));
    // The store has everything this result decides: now the scheduler and memory.
    cx.effects.extend(cx.sched.settle(judgement, cx.now.engine_ms));
    if verdict == Verdict::Accepted {
        tell_accepted(cx, &agent, &trial, &measurement, objective)?;
    }
    // Only a pipelined trial's profile teaches anything (`learn` returns at once otherwise).
    let probed =
        measurement.window_profile.is_some() && cx.studies.get(&trial.study).is_some_and(|a| a.probe.is_some());
    if stored && measurement.exit.success() && probed {
        aside(cx, "learning a profile", |cx| learn(cx, &agent, &trial, &measurement, now))?;
    }
    cx.out.push((agent, CoordinatorMessage::Ack(ResultAck { trial, outcome })));
    Ok(())
}

/// Stores what the judged result `verdict` says of `measurement` (a result,
/// an ended attempt, nothing): the answer for the agent, the objective
/// value read from it and whether a result row was stored.
fn record(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    measurement: &tunefleet_common::measurement::Measurement,
    verdict: Verdict,
    now: u64,
) -> Result<(AckOutcome, Option<f64>, bool), EngineError> {
    let mut outcome = AckOutcome::Stored;
    let mut objective = None;
    let mut stored = false;
    // A result the scheduler cannot place is a duplicate only when it is of
    // this study (its id), its trial is finished, and the store shows the
    // attempt was given to this agent (this process or an earlier one on
    // the same store): the agent deletes a result answered `Duplicate`.
    let other = verdict == Verdict::Unknown && of_another_study(cx.sched, trial);
    let known = verdict == Verdict::Unknown
        && !other
        && cx.sched.is_finished(&trial.study, trial.trial)
        && cx.batch.attempt_given(trial, agent)?;
    match verdict {
        Verdict::Unknown if other => {
            other_study(cx, agent, "result", trial);
            outcome = AckOutcome::Refused(format!(
                "a result of another study of that name (another store): the study {} this coordinator runs has another id",
                trial.study
            ));
        }
        Verdict::Unknown if known => {
            cx.stats.duplicate_results += 1;
            tracing::info!(agent = %agent, trial = %trial, "result for a trial already finished: acknowledged as a duplicate");
            outcome = AckOutcome::Duplicate;
        }
        Verdict::Unknown => {
            cx.stats.unknown_results += 1;
            let why = if cx.studies.contains_key(&trial.study) {
                "this coordinator never gave that attempt to this agent"
            } else {
                "this coordinator does not run that study"
            };
            tracing::warn!(agent = %agent, trial = %trial, reason = why, "result refused: the agent keeps it aside");
            outcome = AckOutcome::Refused(why.to_string());
        }
        Verdict::Remeasured => {
            tracing::info!(agent = %agent, trial = %trial, interference = ?measurement.interference, "measurement disturbed: measured again");
        }
        Verdict::Retried => {
            cx.batch.end_attempt(trial, agent, &crate::store::exit_text(&measurement.exit), now)?;
            tracing::info!(agent = %agent, trial = %trial, exit = ?measurement.exit, "attempt ended without a result");
        }
        // An attempt the trial moved on from (moved, lease expired) that was
        // cancelled or never started: it ends; it is no result of the trial.
        Verdict::Superseded if matches!(measurement.exit, ExitOutcome::SpawnFailed(_) | ExitOutcome::Cancelled) => {
            cx.batch.end_attempt(trial, agent, &crate::store::exit_text(&measurement.exit), now)?;
            cx.stats.superseded_results += 1;
        }
        Verdict::Accepted | Verdict::Duplicate | Verdict::Superseded => {
            let active = cx.studies.get(&trial.study);
            objective = active
                .as_ref()
                .and_then(|a| measurement.exit.success().then(|| a.study.objective_value(measurement)).flatten());
            stored = cx.batch.record_result(trial, agent, measurement, objective, now)? == RecordOutcome::Stored;
            if stored && measurement.exit == ExitOutcome::Cancelled {
                // Cancelled on purpose (stopped early, moved, the study
                // cancelled): kept for the record, no failure of the trial.
                tracing::info!(trial = %trial, agent = %agent, "the cancelled attempt's result is kept for the record");
            } else if stored && !measurement.exit.success() {
                let cause = crate::domain::failure::cause(&measurement.exit, &measurement.log_tail);
                tracing::warn!(trial = %trial, agent = %agent, %cause, "trial failed");
            } else if stored && objective.is_none() {
                // A measured objective (energy) is missing for its own reasons: `best` says them.
                if let Some(a) =
                    active.filter(|a| !matches!(a.study.objective.metric.as_str(), "energy" | "wall_time" | "cpu_time"))
                {
                    let metric = &a.study.objective.metric;
                    let seen: Vec<&str> = measurement.final_metrics.keys().map(String::as_str).collect();
                    tracing::warn!(trial = %trial, expected = %metric, reported = ?seen, "trial reported no value for the objective");
                }
            }
            if stored {
                // What the trial ran under in the end: the configuration its
                // probing selected, else the one it was reconfigured to (a
                // reused configuration), else its plan's.
                use tunefleet_common::measurement::SegmentRole;
                let reconfigured = measurement
                    .segments
                    .iter()
                    .rev()
                    .find(|s| matches!(s.role, SegmentRole::Reconfigured | SegmentRole::Selected))
                    .map(|s| s.system.clone());
                let reused = active.and_then(|a| a.reused.get(&trial.trial)).map(|(system, _)| system.clone());
                let system = measurement.selected.clone().or(reconfigured).or(reused).or_else(|| {
                    let plan = active?.plans.get(trial.trial as usize)?;
                    Some(search::system_params(&plan.params))
                });
                cx.batch.record_segments(trial, measurement, &system.unwrap_or_default())?;
            }
            if cx.influx && stored {
                let points = super::points::trial_points(trial, agent, measurement, objective);
                cx.batch.enqueue_points(&points, now)?;
            }
            match verdict {
                Verdict::Duplicate => {
                    cx.stats.duplicate_results += 1;
                    outcome = AckOutcome::Duplicate;
                }
                Verdict::Superseded => cx.stats.superseded_results += 1,
                _ => {}
            }
        }
    }
    Ok((outcome, objective, stored))
}

/// An accepted result with its objective `objective`: told to the search,
/// counted in the ranking, judged for `[stability]`.
fn tell_accepted(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    measurement: &tunefleet_common::measurement::Measurement,
    objective: Option<f64>,
) -> Result<(), EngineError> {
    if let (Some(a), Some(v)) = (cx.studies.get_mut(&trial.study), objective) {
        if let Some(plan) = a.plans.get(trial.trial as usize) {
            if measurement.exit != ExitOutcome::Cancelled {
                let energy = Some(measurement.energy.joules).filter(|_| measurement.energy.valid);
                let also = a.study.also_figures(energy, measurement.wall_us);
                a.search.tell(trial.trial, &plan.params, v, &also);
            }
        }
        a.record_value(trial.trial, v, agent);
        // A savepoint costs two statements: only where there is a repeat to judge.
        if a.study.stability.is_some() {
            aside(cx, "an extra repeat", |cx| {
                let Some(a) = cx.studies.get_mut(&trial.study) else { return Ok(()) };
                repeat_until_stable(cx.sched, cx.batch, a, trial.trial)
            })?;
        }
    }
    Ok(())
}
