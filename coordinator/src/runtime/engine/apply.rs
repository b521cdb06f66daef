//! The apply stage of a turn: each inbound event through the gate
//! ([`super::gate`]: authenticated, bounded, typed), a handshake or a Last
//! Will to [`super::hello`], each message of an authenticated agent decided
//! by [`super::dispatch`] (which reads and changes nothing) and performed
//! here in a savepoint of its own: the store writes the decision names,
//! then the scheduler and the rest of memory, then what it sends (queued in
//! the [`Ctx`]; the shell sends once the turn commits). On a server an
//! accepted result whose row is all it writes goes without one, judged with
//! the turn's next answer ([`accept_late`]). No I/O but the store.

use tunefleet_common::measurement::{ExitOutcome, Measurement};
use tunefleet_common::message::{AckOutcome, AgentMessage, CoordinatorMessage, Progress, ResultAck, TrialRef};
use tunefleet_common::topic::AgentTopic;

use super::ctx::{co_messages, Ctx};
use super::dispatch::{decide, extra_run, Decision, EarlyStop, ExtraRun, Keep, ResultStep};
use super::gate::{gate, Gated, Gatekeeping};
use super::hello::{on_hello, on_will};
use super::learn::{apply_reuse, learn};
use super::types::{loud, EngineError, Inbound};
use crate::domain::offload::Sample;
use crate::domain::sched::Verdict;
use crate::domain::search::TrialPlan;
use crate::store::{RecordOutcome, Score, StoreError};

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
    // Outside the match below on purpose: opening it answers the turn's
    // checked writes (assignments, results sent late), whose refusal or
    // error is the turn's and never this message's to undo alone.
    cx.batch.savepoint(name)?;
    // Its writes answered before it is kept: an error of one is its own.
    match f(cx).and_then(|()| Ok(cx.batch.settle()?)) {
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
/// writes succeeded (on a server, an accepted result whose row is all it
/// writes goes without a savepoint: [`accept_late`]); a status, telemetry,
/// progress or Last Will is written
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
        refuse_result(cx, agent, trial, &e);
    }
    Ok(())
}

/// Answers a result the store could not take: refused, the agent parks it.
fn refuse_result(cx: &mut Ctx<'_, '_>, agent: &str, trial: TrialRef, e: &StoreError) {
    let outcome = AckOutcome::Refused(format!("the store could not take it: {e}"));
    cx.out.push((agent.to_string(), CoordinatorMessage::Ack(ResultAck { trial, outcome })));
}

/// Counts `bytes` written for `agent`'s `trial` in its share of the
/// study's store (and says when the share is used up).
fn count_share(cx: &mut Ctx<'_, '_>, agent: &str, trial: &TrialRef, bytes: u64) {
    if let Some(share) = cx.sched.count_written(agent, trial, bytes) {
        tracing::warn!(agent = %agent, study = %trial.study, share = %crate::runtime::disk::readable(share), "the agent has used its share of the study's store: its results are refused and it gets none of the study's trials (--store-share-mib)");
    }
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
/// ([`gate`]); a handshake or a Last Will is taken in its savepoint; each
/// message is decided ([`decide`]) and performed in its own ([`apply`]).
fn handle(cx: &mut Ctx<'_, '_>, ev: Inbound) -> Result<(), EngineError> {
    let now = cx.now.unix_ms;
    let gated = gate(&mut Gatekeeping { stats: cx.stats, sessions: cx.sessions }, ev);
    match gated {
        Gated::Nothing => Ok(()),
        Gated::Stale { agent, token } => {
            // Told signed, and only a name with a pinned key: a stranger
            // learns nothing.
            if cx.batch.agent_key(&agent)?.is_some() {
                if let Some(notice) = cx.sessions.stale_notice(&agent, token, cx.now.instant) {
                    cx.welcomes.push((agent, notice));
                }
            }
            Ok(())
        }
        Gated::Hello { agent, signed } => {
            let name = agent.clone();
            guarded(cx, &name, AgentTopic::Hello, None, |cx| on_hello(cx, agent, &signed, now))
        }
        Gated::Will { agent, will } => {
            let name = agent.clone();
            guarded(cx, &name, AgentTopic::Status, None, |cx| on_will(cx, agent, &will, now))
        }
        Gated::Messages { agent, msgs, refused } => {
            cx.out.extend(refused.into_iter().map(|ack| (agent.clone(), CoordinatorMessage::Ack(ack))));
            if cx.sessions.heard(&agent, now) {
                let name = agent.clone();
                // On a server a savepoint would wait for the turn's checked
                // writes (a round trip); this write of the engine's own clock
                // fails with the database alone, which fails the turn anyway.
                match cx.batch.answers_late() {
                    true => cx.batch.agent_heard(&name, now)?,
                    false => aside(cx, "last seen", |cx| Ok(cx.batch.agent_heard(&name, now)?))?,
                }
            }
            for (kind, msg) in msgs {
                // Requests and sync answers change the scheduler and memory only:
                // no savepoint (two statements a message) to guard them.
                let unguarded = matches!(msg, AgentMessage::Request(_) | AgentMessage::Synced(_));
                let decision = decide(&cx.view(), &agent, msg);
                if unguarded {
                    apply(cx, agent.clone(), decision, now)?;
                    continue;
                }
                let decision = match decision {
                    Decision::Result(step) if cx.batch.answers_late() && step.row_alone() => {
                        accept_late(cx, agent.clone(), *step, now)?;
                        continue;
                    }
                    decision => decision,
                };
                let result = match &decision {
                    Decision::Result(step) => Some(step.trial.clone()),
                    _ => None,
                };
                let name = agent.clone();
                guarded(cx, &name, kind, result, |cx| apply(cx, name.clone(), decision, now))?;
            }
            Ok(())
        }
    }
}

/// Performs `decision` for `agent`: store writes first, then the scheduler
/// and the rest of memory (see [`guarded`]), then what it sends.
fn apply(cx: &mut Ctx<'_, '_>, agent: String, decision: Decision, now: u64) -> Result<(), EngineError> {
    // What it writes of a study's store counts in its agent's share.
    let (written, counted) = (
        cx.batch.written(),
        match &decision {
            Decision::Progress { progress, .. } => Some(progress.trial.clone()),
            Decision::Result(step) => Some(step.trial.clone()),
            _ => None,
        },
    );
    let Some(trial) = counted else { return apply_decision(cx, agent, decision, now) };
    apply_decision(cx, agent.clone(), decision, now)?;
    count_share(cx, &agent, &trial, cx.batch.written().saturating_sub(written));
    Ok(())
}

fn apply_decision(cx: &mut Ctx<'_, '_>, agent: String, decision: Decision, now: u64) -> Result<(), EngineError> {
    match decision {
        Decision::Nothing => {}
        Decision::OtherStudy { what, trial } => other_study(cx, &agent, what, &trial),
        Decision::Status(status) => {
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
        Decision::Request { request, others } => {
            for t in &others {
                other_study(cx, &agent, "running attempt", t);
            }
            cx.effects.extend(cx.sched.request(&agent, &request));
        }
        Decision::Progress { progress: p, refused_checkpoint, bytes, reuse, early_stop } => {
            if let Some(why) = refused_checkpoint {
                cx.stats.refused_checkpoints += 1;
                if loud(cx.stats.refused_checkpoints) {
                    tracing::warn!(agent = %agent, trial = %p.trial, reason = %why, refused = cx.stats.refused_checkpoints, "checkpoint refused: not kept");
                }
            }
            cx.effects.extend(cx.sched.started(&agent, &p.trial));
            if let Err(why) = cx.sched.take_progress(&agent, &p.trial, bytes) {
                cx.stats.refused_progress += 1;
                if loud(cx.stats.refused_progress) {
                    tracing::warn!(agent = %agent, trial = %p.trial, epoch = p.epoch, reason = why, refused = cx.stats.refused_progress, "progress not kept");
                }
                return Ok(());
            }
            cx.batch.record_progress(&p)?;
            cx.batch.settle()?;
            if let Some(step) = reuse {
                apply_reuse(cx, &agent, &p.trial, step)?;
            }
            if let (Some(reference), Some(a)) = (&p.checkpoint, cx.studies.get_mut(&p.trial.study)) {
                a.checkpoints.insert(p.trial.trial, (p.epoch, reference.clone()));
            }
            if let Some(stop) = early_stop {
                apply_early_stop(cx, &p, stop);
            }
        }
        Decision::Refuse(r) => cx.effects.extend(cx.sched.refuse(&agent, &r.trial, &r.reason)),
        Decision::Result(step) => apply_result(cx, agent, *step, now)?,
        Decision::Telemetry(t) => {
            cx.batch.record_telemetry(&agent, &t)?;
            cx.telemetry.observe(&agent, Sample::of(&t, cx.now.engine_ms));
        }
        Decision::Synced(n) => {
            if cx.unsynced.get(&agent) == Some(&n) {
                cx.unsynced.remove(&agent);
            }
        }
        // Checked, stored, and only then taken: a store error leaves the
        // node to be asked again (see `guarded`).
        Decision::CoMeasured(Ok(record)) => {
            cx.batch.record_node(&record, now)?;
            cx.batch.settle()?;
            cx.co.taken(&agent, &record.trial);
        }
        Decision::CoMeasured(Err((trial, why))) => {
            cx.stats.refused_comeasures += 1;
            if loud(cx.stats.refused_comeasures) {
                tracing::warn!(agent = %agent, trial = %trial, reason = %why, refused = cx.stats.refused_comeasures, "co-measurement refused");
            }
        }
    }
    Ok(())
}

/// Counts (and logs the first of) references to another study of a name
/// this coordinator runs.
fn other_study(cx: &mut Ctx<'_, '_>, agent: &str, what: &str, trial: &TrialRef) {
    cx.stats.other_study_refs += 1;
    if loud(cx.stats.other_study_refs) {
        tracing::warn!(agent = %agent, trial = %trial, study_id = format!("{:016x}", trial.study_id), what, count = cx.stats.other_study_refs, "another study of this name (another store): ignored");
    }
}
/// A judged result: what the store keeps of it ([`write_result`]), then
/// what follows its keeping ([`after_result`]).
fn apply_result(cx: &mut Ctx<'_, '_>, agent: String, step: ResultStep, now: u64) -> Result<(), EngineError> {
    let ResultStep { trial, measurement, judgement, keep } = step;
    let score = Score { system: None, ..kept_score(&keep) };
    let (outcome, stored) = write_result(cx, &agent, &trial, &measurement, judgement.verdict, keep, now)?;
    // Stored, not only sent, before the scheduler counts it.
    cx.batch.settle()?;
    after_result(cx, agent, Taken { trial, measurement, judgement, score, outcome, stored }, now)
}

/// On a server, an accepted result the store keeps as its row alone
/// ([`ResultStep::row_alone`]): its one statement goes with the turn's next
/// answer instead of a savepoint waited for (a round trip a result). Like
/// an assignment it is counted before the server judged it: a result the
/// store does not take as judged fails the turn, which commits nothing and
/// sends nothing (the agents keep their results and send them again to
/// the coordinator started over from the store). A result that cannot be
/// written as it is (nothing of it sent) is refused alone.
fn accept_late(cx: &mut Ctx<'_, '_>, agent: String, step: ResultStep, now: u64) -> Result<(), EngineError> {
    let ResultStep { trial, measurement, judgement, keep } = step;
    let kept = kept_score(&keep);
    let (written, score) = (cx.batch.written(), Score { system: None, ..kept.clone() });
    if let Err(e) = cx.batch.record_accepted(&trial, &agent, &measurement, kept, now)? {
        cx.stats.store_errors += 1;
        if loud(cx.stats.store_errors) {
            tracing::error!(agent = %agent, trial = %trial, error = %e, errors = cx.stats.store_errors, "result refused: the store could not take it");
        }
        refuse_result(cx, &agent, trial, &e);
        return Ok(());
    }
    count_share(cx, &agent, &trial, cx.batch.written().saturating_sub(written));
    if let Keep::Result { expected, .. } = &keep {
        say_kept(&trial, &agent, &measurement, expected.as_deref());
    }
    after_result(
        cx,
        agent,
        Taken { trial, measurement, judgement, score, outcome: AckOutcome::Stored, stored: true },
        now,
    )
}

/// A result as the store took it: its answer for the agent, and whether
/// a result row was stored.
struct Taken {
    trial: TrialRef,
    measurement: Measurement,
    judgement: crate::domain::sched::Judgement,
    /// What the search is told of it.
    score: Score,
    outcome: AckOutcome,
    stored: bool,
}

/// What the store keeps of a result row `keep` says is kept (with the
/// system the trial ran under in the end; the search is told it without).
fn kept_score(keep: &Keep) -> Score {
    match keep {
        Keep::Result { objective, violation, system, .. } => {
            Score { objective: *objective, violation: *violation, system: Some(system.clone()) }
        }
        _ => Score::default(),
    }
}

/// What follows a result the store took: its co-measuring nodes' window;
/// then, the store having everything the result decides, the scheduler
/// settled, the search told, a profile learnt; and the answer to the agent.
fn after_result(cx: &mut Ctx<'_, '_>, agent: String, taken: Taken, now: u64) -> Result<(), EngineError> {
    let Taken { trial, measurement, judgement, score, outcome, stored } = taken;
    let verdict = judgement.verdict;
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
    cx.effects.extend(cx.sched.settle(judgement, cx.now.engine_ms));
    if verdict == Verdict::Accepted {
        tell_accepted(cx, &agent, &trial, &measurement, score)?;
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

/// Logs a stored result that says something went wrong: a cancelled
/// attempt kept for the record, a failed trial, an objective not reported.
fn say_kept(trial: &TrialRef, agent: &str, measurement: &Measurement, expected: Option<&str>) {
    if measurement.exit == ExitOutcome::Cancelled {
        // Cancelled on purpose (stopped early, moved, the study
        // cancelled): kept for the record, no failure of the trial.
        tracing::info!(trial = %trial, agent = %agent, "the cancelled attempt's result is kept for the record");
    } else if !measurement.exit.success() {
        let cause = crate::domain::failure::cause(&measurement.exit, &measurement.log_tail);
        tracing::warn!(trial = %trial, agent = %agent, %cause, "trial failed");
    } else if let Some(metric) = expected {
        let seen: Vec<&str> = measurement.final_metrics.keys().map(String::as_str).collect();
        tracing::warn!(trial = %trial, expected = %metric, reported = ?seen, "trial reported no value for the objective");
    }
}

/// Why a result of an agent past its share of a study's store is refused.
const PAST_SHARE: &str =
    "this agent has used its share of the study's store (the coordinator's --store-share-mib): it gets no more of its trials";

/// Writes what `keep` says the store keeps of `measurement`: the answer
/// for the agent and whether a result row was stored.
fn write_result(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    measurement: &Measurement,
    verdict: Verdict,
    keep: Keep,
    now: u64,
) -> Result<(AckOutcome, bool), EngineError> {
    match keep {
        Keep::OtherStudy => {
            other_study(cx, agent, "result", trial);
            let why = format!(
                "a result of another study of that name (another store): the study {} this coordinator runs has another id",
                trial.study
            );
            Ok((AckOutcome::Refused(why), false))
        }
        // A duplicate only when the store shows the attempt was given to
        // this agent (this process or an earlier one on the same store).
        Keep::Unknown { finished, why } => {
            if finished && cx.batch.attempt_given(trial, agent)? {
                cx.stats.duplicate_results += 1;
                tracing::info!(agent = %agent, trial = %trial, "result for a trial already finished: acknowledged as a duplicate");
                return Ok((AckOutcome::Duplicate, false));
            }
            cx.stats.unknown_results += 1;
            tracing::warn!(agent = %agent, trial = %trial, reason = why, "result refused: the agent keeps it aside");
            Ok((AckOutcome::Refused(why.to_string()), false))
        }
        Keep::PastShare => {
            cx.stats.past_share += 1;
            cx.batch.end_attempt(trial, agent, PAST_SHARE, now)?;
            Ok((AckOutcome::Refused(PAST_SHARE.to_string()), false))
        }
        Keep::Remeasured => {
            tracing::info!(agent = %agent, trial = %trial, interference = ?measurement.interference, "measurement disturbed: measured again");
            Ok((AckOutcome::Stored, false))
        }
        Keep::EndAttempt { superseded } => {
            cx.batch.end_attempt(trial, agent, &crate::store::exit_text(&measurement.exit), now)?;
            match superseded {
                true => cx.stats.superseded_results += 1,
                false => {
                    tracing::info!(agent = %agent, trial = %trial, exit = ?measurement.exit, "attempt ended without a result")
                }
            }
            Ok((AckOutcome::Stored, false))
        }
        Keep::Result { objective, violation, system, points, expected } => {
            let score = Score { objective, violation, system: Some(system) };
            let stored = cx.batch.record_result(trial, agent, measurement, score, now)? == RecordOutcome::Stored;
            if stored {
                say_kept(trial, agent, measurement, expected.as_deref());
                cx.batch.record_segments(trial, measurement)?;
                if !points.is_empty() {
                    cx.batch.enqueue_points(&points, now)?;
                }
            }
            let outcome = match verdict {
                Verdict::Duplicate => {
                    cx.stats.duplicate_results += 1;
                    AckOutcome::Duplicate
                }
                Verdict::Superseded => {
                    cx.stats.superseded_results += 1;
                    AckOutcome::Stored
                }
                _ => AckOutcome::Stored,
            };
            Ok((outcome, stored))
        }
    }
}

/// An accepted result with its objective `objective`: told to the search,
/// counted in the ranking, judged for `[stability]`.
fn tell_accepted(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    measurement: &Measurement,
    score: Score,
) -> Result<(), EngineError> {
    if let (Some(a), Some(v)) = (cx.studies.get_mut(&trial.study), score.objective) {
        if let Some(plan) = a.plans.get(trial.trial as usize) {
            if measurement.exit != ExitOutcome::Cancelled {
                let energy = measurement.energy_figure().counted();
                let also = a.study.also_figures(energy, measurement.wall_us);
                let margins = a.study.constraint_margins(measurement);
                a.search.tell_constrained(trial.trial, &plan.params, v, &also, score.violation, margins.as_deref());
            }
        }
        a.record_value(trial.trial, v, score.violation, agent);
        // A savepoint costs two statements: only where there is a repeat to add.
        if let Some(run) = extra_run(&cx.view(), trial) {
            aside(cx, "an extra repeat", |cx| add_run(cx, &trial.study, run))?;
        }
    }
    Ok(())
}

/// ASHA's verdict ([`super::dispatch::EarlyStop`]): recorded at its rung;
/// a trial it stops is told to the search and stopped.
fn apply_early_stop(cx: &mut Ctx<'_, '_>, p: &Progress, stop: EarlyStop) {
    let Some(active) = cx.studies.get_mut(&p.trial.study) else { return };
    let Some(asha) = active.asha.as_mut() else { return };
    asha.record(&stop.judged);
    let Some(reason) = stop.reason else { return };
    // The model learns where ASHA cut (Optuna's pruned trials); counted to
    // a target, what was judged is not the objective: the worst.
    if let Some(plan) = active.plans.get(p.trial.trial as usize) {
        let value = if active.study.objective.to_target.is_some() { f64::NAN } else { stop.reported };
        active.search.tell_pruned(p.trial.trial, &plan.params, p.epoch, value);
    }
    tracing::info!(trial = %p.trial, %reason);
    cx.effects.extend(cx.sched.stop(&p.trial.study, p.trial.trial, &reason));
}

/// One more run of a configuration ([`super::dispatch::ExtraRun`]): its
/// row first (when the store refuses it, the search has not counted it),
/// then the search and the scheduler.
fn add_run(cx: &mut Ctx<'_, '_>, study: &str, run: ExtraRun) -> Result<(), EngineError> {
    let Some(a) = cx.studies.get_mut(study) else { return Ok(()) };
    let ExtraRun { params, repeat, spread } = run;
    let next = TrialPlan { trial: a.plans.len() as u64, params: params.clone(), repeat };
    cx.batch.add_trials(study, std::slice::from_ref(&next))?;
    let plan = a.search.extra_repeat(&params, repeat);
    debug_assert_eq!(plan, next, "the search numbers trials as the study has them");
    tracing::info!(study = %study, trial = plan.trial, spread, runs = repeat, "not stable yet: one more run");
    a.adopt(cx.sched, vec![plan]);
    Ok(())
}
