//! The dispatch: a valid message of an authenticated agent (what passed
//! [`super::gate`]) made a [`Decision`], reading the engine's state and
//! changing nothing: no store, no clock, no I/O, nothing written in memory.
//! [`super::apply`] performs the decision: its store writes in a savepoint,
//! then the in-memory changes it names, then what it sends.
//!
//! A result is judged here ([`Scheduler::judge`], which reads) and what it
//! makes the store keep is chosen here ([`Keep`]): the objective, the
//! system it ran under, its InfluxDB points. Only two questions need the
//! store and are left to the apply stage: whether an unknown result's
//! attempt was given to its agent (a duplicate, or refused), and whether a
//! result row already existed.
//!
//! The study's rules are decided here too: ASHA's verdict on an epoch
//! ([`EarlyStop`]), whether a first window's profile reuses a configuration
//! ([`ReuseStep`]), and, once a result is told, whether `[stability]` wants
//! one more run ([`extra_run`]).

use std::collections::HashMap;

use tunefleet_common::measurement::{ExitOutcome, Measurement, SegmentRole};
use tunefleet_common::message::{
    AgentMessage, AgentStatus, Progress, Refusal, SystemParams, TrialRef, TrialResult, WorkRequest,
};

use tunefleet_common::params::Params;
use tunefleet_search::asha::{Judged, Pruning};

use super::active::ActiveStudy;
use crate::domain::bounds::Why;
use crate::domain::comeasure::{CoMeasures, NodeOutcome, NodeRecord};
use crate::domain::reuse::{self, Book, ReuseDecision};
use crate::domain::sched::{Judgement, ResultKind, Scheduler, Verdict};
use crate::domain::search;
use crate::domain::study::{readings_of_given_gpus, Study};

/// What the dispatch reads: the engine's state, shared.
pub(super) struct EngineView<'a> {
    pub(super) sched: &'a Scheduler,
    pub(super) studies: &'a HashMap<String, ActiveStudy>,
    pub(super) co: &'a CoMeasures,
    /// The profiles learnt so far, by device class.
    pub(super) book: &'a Book,
    /// Measurements agents flag as disturbed are taken again (with offloading).
    pub(super) remeasure: bool,
    /// Stored results are queued for InfluxDB.
    pub(super) influx: bool,
}

/// What one message decides.
#[derive(Debug)]
pub(super) enum Decision {
    /// Nothing to do (progress of an attempt that is not live).
    Nothing,
    /// A message about another study of a name this coordinator runs
    /// (another store): counted, nothing else.
    OtherStudy { what: &'static str, trial: TrialRef },
    /// Online or offline: stored, then told to the scheduler (offline also
    /// ends the session and forgets the telemetry).
    Status(AgentStatus),
    /// A work request; `others` are the attempts it lists of another study
    /// of a running study's name (counted).
    Request { request: WorkRequest, others: Vec<TrialRef> },
    /// An epoch of a live attempt: its checkpoint already dropped when it
    /// may not be resumed from (`refused_checkpoint` says why), its size
    /// for the attempt's bound, what its first window's profile decides
    /// and ASHA's verdict on it.
    Progress {
        progress: Progress,
        refused_checkpoint: Option<Why>,
        bytes: u64,
        reuse: Option<ReuseStep>,
        early_stop: Option<EarlyStop>,
    },
    /// The agent will not run an assignment.
    Refuse(Refusal),
    /// A result, judged, and what the store keeps of it.
    Result(Box<ResultStep>),
    /// A telemetry sample: stored, then observed by the offload decider.
    Telemetry(tunefleet_common::measurement::Telemetry),
    /// A sync answer: the agent has everything sent before `n`.
    Synced(u64),
    /// A co-measuring node's answer: stored and taken, or refused and why.
    CoMeasured(Result<NodeRecord, (TrialRef, String)>),
}

/// What a pipelined attempt's first-window profile decides: reuse a
/// configuration of its cluster, or probe. Decided once per attempt.
#[derive(Debug)]
pub(super) struct ReuseStep {
    pub(super) class: String,
    pub(super) decision: ReuseDecision,
    /// The profile failed its checks (counted; it is probed).
    pub(super) malformed: bool,
}

/// ASHA's verdict on an epoch: recorded at its rung, and when it says stop,
/// the trial stopped with `reason`.
#[derive(Debug)]
pub(super) struct EarlyStop {
    pub(super) judged: Judged,
    /// The objective as reported (the model learns where ASHA cut).
    pub(super) reported: f64,
    pub(super) reason: Option<String>,
}

/// One more run of a configuration whose runs spread more than the
/// study's `[stability]` allows ([`extra_run`]).
#[derive(Debug)]
pub(super) struct ExtraRun {
    pub(super) params: Params,
    /// Its repeat number: the runs so far.
    pub(super) repeat: u32,
    pub(super) spread: f64,
}

/// A result with its judgement and what the store keeps.
#[derive(Debug)]
pub(super) struct ResultStep {
    pub(super) trial: TrialRef,
    pub(super) measurement: Measurement,
    pub(super) judgement: Judgement,
    pub(super) keep: Keep,
}

impl ResultStep {
    /// Whether the store keeps of it its row alone: an accepted result
    /// with no segments and no InfluxDB points (one statement on a server).
    pub(super) fn row_alone(&self) -> bool {
        self.judgement.verdict == Verdict::Accepted
            && self.measurement.segments.is_empty()
            && matches!(&self.keep, Keep::Result { points, .. } if points.is_empty())
    }
}

/// What a judged result makes the store keep.
#[derive(Debug, PartialEq)]
pub(super) enum Keep {
    /// A result of another study of that name: refused.
    OtherStudy,
    /// The scheduler cannot place it: a duplicate when its trial is
    /// `finished` and the store shows the attempt was given to this agent
    /// (the agent then deletes it), else refused with `why`.
    Unknown { finished: bool, why: &'static str },
    /// Disturbed, to be measured again: nothing kept.
    Remeasured,
    /// From an agent past its share of the study's store: refused, its
    /// attempt ended (the trial goes to another agent).
    PastShare,
    /// The attempt ended without a result (`superseded`: one the trial had
    /// moved on from, cancelled or never started).
    EndAttempt { superseded: bool },
    /// A result row with its objective, the system the trial ran under
    /// in the end and its InfluxDB points; `expected` names an objective
    /// metric the workload should have reported and did not.
    /// `violation`: how far it misses the study's constraints (`None`: none).
    Result {
        objective: Option<f64>,
        violation: Option<f64>,
        system: SystemParams,
        points: Vec<String>,
        expected: Option<String>,
    },
}

/// The decision on `msg` from `agent`.
pub(super) fn decide(view: &EngineView<'_>, agent: &str, msg: AgentMessage) -> Decision {
    match msg {
        AgentMessage::Status(status) => Decision::Status(status),
        AgentMessage::Request(request) => {
            // Another study's attempts are none of this one's (the
            // scheduler compares study ids too): counted, nothing else.
            let others = request
                .running
                .iter()
                .chain(&request.held)
                .filter(|t| of_another_study(view.sched, t))
                .cloned()
                .collect();
            Decision::Request { request, others }
        }
        AgentMessage::Progress(p) if of_another_study(view.sched, &p.trial) => {
            Decision::OtherStudy { what: "progress", trial: p.trial }
        }
        AgentMessage::Refuse(r) if of_another_study(view.sched, &r.trial) => {
            Decision::OtherStudy { what: "refusal", trial: r.trial }
        }
        AgentMessage::Progress(p) => progress(view, agent, p),
        AgentMessage::Refuse(r) => Decision::Refuse(r),
        AgentMessage::Result(r) => Decision::Result(Box::new(result(view, agent, r))),
        // Taken apart at the gate; refused by the bounds check.
        AgentMessage::Bundle(_) => Decision::Nothing,
        AgentMessage::Telemetry(t) => Decision::Telemetry(t),
        AgentMessage::Synced(n) => Decision::Synced(n),
        AgentMessage::CoMeasured(m) => {
            // Its cores count at most as the slots it was given: what it
            // claims alone cannot raise the ceiling of what it may report.
            let granted = view.sched.live_slots(agent).unwrap_or(1).max(1);
            let cores = view.sched.agent_cores(agent).unwrap_or(1).min(granted);
            let gpus = view.sched.agent_gpus(agent);
            Decision::CoMeasured(match view.co.check(agent, &m, cores, gpus) {
                Ok(()) => Ok(NodeRecord {
                    trial: m.trial.clone(),
                    agent: agent.to_string(),
                    outcome: NodeOutcome::Measured(m),
                }),
                Err(why) => Err((m.trial, why.to_string())),
            })
        }
    }
}

/// Whether `trial` names a study this coordinator runs but carries another
/// study id: it belongs to another study of that name (another store).
pub(super) fn of_another_study(sched: &Scheduler, trial: &TrialRef) -> bool {
    sched.study_id(&trial.study).is_some_and(|id| id != trial.study_id)
}

/// Whether `reference` may be resumed from in `study` (message validation
/// checked its form already; this checks it again for stored ones).
pub(super) fn usable_checkpoint(study: &Study, reference: &str) -> Result<(), crate::domain::bounds::Why> {
    crate::domain::bounds::checkpoint("checkpoint", reference).map_err(|e| e.why)?;
    crate::domain::bounds::checkpoint_under(reference, study.resume_prefix.as_deref())
}

/// An epoch report: only a live attempt's counts; a checkpoint it may not
/// be resumed from is dropped.
fn progress(view: &EngineView<'_>, agent: &str, mut p: Progress) -> Decision {
    if !view.sched.is_live(agent, &p.trial) {
        return Decision::Nothing;
    }
    let mut refused_checkpoint = None;
    if let (Some(reference), Some(a)) = (&p.checkpoint, view.studies.get(&p.trial.study)) {
        if let Err(why) = usable_checkpoint(&a.study, reference) {
            refused_checkpoint = Some(why);
        }
    }
    if refused_checkpoint.is_some() {
        p.checkpoint = None;
    }
    // Bounded per attempt: rows and bytes (names, values, checkpoint).
    let bytes = p.metrics.keys().map(|k| k.len() as u64 + 16).sum::<u64>()
        + p.checkpoint.as_ref().map_or(0, |c| c.len() as u64);
    let reuse = p.profile.as_ref().and_then(|wp| reuse_step(view, agent, &p.trial, &wp.profile));
    let early_stop = early_stop(view, &p);
    Decision::Progress { progress: p, refused_checkpoint, bytes, reuse, early_stop }
}

/// ASHA's verdict on an epoch report of a study that stops early.
fn early_stop(view: &EngineView<'_>, p: &Progress) -> Option<EarlyStop> {
    let active = view.studies.get(&p.trial.study)?;
    let asha = active.asha.as_ref()?;
    let metric = active.study.stopping_metric().0;
    let &reported = p.metrics.get(metric)?;
    let judged = asha.judge(p.trial.trial, p.epoch, reported)?;
    let reason = match judged.pruning {
        Pruning::Continue => None,
        Pruning::Stop { rung, value, cutoff } => {
            let (value, cutoff) = (readable(value), readable(cutoff));
            Some(format!("stopped early by ASHA: {metric} {value} at epoch {rung} is behind the cut {cutoff}"))
        }
    };
    Some(EarlyStop { judged, reported, reason })
}

/// A pipelined attempt's first-window profile: reuse a configuration of
/// its cluster, or probe (`None`: not pipelined, decided already, or an
/// agent of no known class).
fn reuse_step(
    view: &EngineView<'_>,
    agent: &str,
    trial: &TrialRef,
    profile: &tunefleet_common::profile::Profile,
) -> Option<ReuseStep> {
    let a = view.studies.get(&trial.study)?;
    let (probe, plan) = (a.probe.as_ref()?, a.plans.get(trial.trial as usize)?);
    if a.decided.contains(&(trial.trial, trial.attempt)) {
        return None;
    }
    let class = view.sched.agent_class(agent)?;
    let malformed = reuse::check(profile).is_err();
    let group = reuse::group_key(&a.study.reuse.group, &plan.params);
    let c = view.book.classes.get(&class);
    // Only configurations of this study's own system space may be reused:
    // another study's jobs may have measured axes or values it does not search.
    let records: Vec<reuse::Record> = c
        .map_or(&[][..], |c| &c.records)
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.outcomes.retain(|o| search::in_space(&a.study, &o.system));
            r
        })
        .collect();
    let decision = reuse::decide(
        &a.study.reuse,
        c.and_then(|c| c.model.as_ref()),
        &records,
        c.map_or(&[][..], |c| &c.clusters),
        &reuse::ProfiledJob { profile, group: &group, identity: &a.study.workload() },
        probe.select,
    );
    let decision = match decision {
        ReuseDecision::Reuse { cluster, distance, threshold, .. } if !a.study.reuse.enabled => ReuseDecision::Probe {
            cluster: Some(cluster),
            distance: Some(distance),
            threshold: Some(threshold),
            reason: format!(
                "probed: reuse is off for this study ([reuse] enabled = false); it would have {}",
                decision.reason()
            ),
        },
        d => d,
    };
    Some(ReuseStep { class, decision, malformed })
}

/// `[stability]`, once trial `trial`'s result is told: one more run of its
/// configuration when every run so far has ended and their objectives
/// spread more than the study allows (and it has runs left).
pub(super) fn extra_run(view: &EngineView<'_>, trial: &TrialRef) -> Option<ExtraRun> {
    let a = view.studies.get(&trial.study)?;
    let stability = a.study.stability?;
    let params = &a.plans.get(trial.trial as usize)?.params;
    let runs = a.runs.get(&crate::store::params_json(params)).map_or(&[][..], Vec::as_slice);
    let name = &a.study.name;
    if runs.len() >= stability.max_repeats as usize || !runs.iter().all(|&t| view.sched.is_finished(name, t)) {
        return None;
    }
    let values: Vec<f64> = runs.iter().filter_map(|t| a.values.get(t).copied()).collect();
    let spread = search::spread(&values).filter(|s| *s > stability.spread)?;
    Some(ExtraRun { params: params.clone(), repeat: runs.len() as u32, spread })
}

/// `v` for reading in a reason: at most 6 decimals, trailing zeros cut
/// (`0.123457`, not `0.12345678901234568`).
fn readable(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-3 || v.abs() >= 1e9) {
        return format!("{v:.4e}");
    }
    let text = format!("{v:.6}");
    match text.contains('.') {
        true => text.trim_end_matches('0').trim_end_matches('.').to_string(),
        false => text,
    }
}

/// A result judged, and what the store keeps of it.
fn result(view: &EngineView<'_>, agent: &str, result: TrialResult) -> ResultStep {
    let TrialResult { trial, measurement } = result;
    let gpus =
        view.studies.get(&trial.study).map_or(Ok(()), |a| readings_of_given_gpus(a.study.gpus, &measurement.gpus));
    let kind = match (&measurement.exit, gpus) {
        (ExitOutcome::SpawnFailed(why), _) => ResultKind::Retry(format!("could not start: {why}")),
        (ExitOutcome::Cancelled, _) => ResultKind::Retry("cancelled".into()),
        (_, Err(why)) => ResultKind::Retry(why),
        // A disturbed measurement is taken again only when the coordinator moves work.
        _ if view.remeasure && !measurement.interference.is_empty() => {
            ResultKind::Interfered { success: measurement.exit.success(), reason: measurement.interference.join("; ") }
        }
        _ => ResultKind::Complete { success: measurement.exit.success() },
    };
    let believed = !matches!(kind, ResultKind::Retry(_));
    let judgement = view.sched.judge(agent, &trial, kind);
    let keep = keep(view, agent, &trial, &measurement, judgement.verdict, believed);
    ResultStep { trial, measurement, judgement, keep }
}

/// What the store keeps of a result the scheduler judged `verdict`;
/// `believed`: a result the trial may take (not one that could not start,
/// was cancelled, or whose readings are not believed).
fn keep(
    view: &EngineView<'_>,
    agent: &str,
    trial: &TrialRef,
    m: &Measurement,
    verdict: Verdict,
    believed: bool,
) -> Keep {
    match verdict {
        Verdict::Unknown if of_another_study(view.sched, trial) => Keep::OtherStudy,
        Verdict::Unknown => Keep::Unknown {
            finished: view.sched.is_finished(&trial.study, trial.trial),
            why: if view.studies.contains_key(&trial.study) {
                "this coordinator never gave that attempt to this agent"
            } else {
                "this coordinator does not run that study"
            },
        },
        Verdict::Remeasured => Keep::Remeasured,
        Verdict::PastShare => Keep::PastShare,
        Verdict::Retried => Keep::EndAttempt { superseded: false },
        // An attempt the trial moved on from (moved, lease expired) that was
        // cancelled, never started, or measured what its trial was not given
        // (readings not believed): it ends; it is no result of the trial,
        // which the store would otherwise take when it holds none yet.
        Verdict::Superseded if !believed => Keep::EndAttempt { superseded: true },
        Verdict::Accepted | Verdict::Duplicate | Verdict::Superseded => {
            let active = view.studies.get(&trial.study);
            let objective = active.and_then(|a| m.exit.success().then(|| a.study.objective_value(m)).flatten());
            let violation = active.and_then(|a| m.exit.success().then(|| a.study.violation(m)).flatten());
            // A measured objective (energy, times) missing has its own
            // reasons, which `best` says; a workload's metric is warned of.
            let expected = active
                .map(|a| &a.study.objective.metric)
                .filter(|metric| {
                    objective.is_none()
                        && !matches!(metric.as_str(), "energy" | "wall_time" | "cpu_time" | "energy_time")
                })
                .cloned();
            let points = match view.influx {
                true => super::points::trial_points(trial, agent, m, objective),
                false => Vec::new(),
            };
            Keep::Result { objective, violation, system: ran_under(active, trial, m), points, expected }
        }
    }
}

/// What a trial ran under in the end: the configuration its probing
/// selected, else the one it was reconfigured to (a reused
/// configuration), else its plan's.
fn ran_under(active: Option<&ActiveStudy>, trial: &TrialRef, m: &Measurement) -> SystemParams {
    let reconfigured = m
        .segments
        .iter()
        .rev()
        .find(|s| matches!(s.role, SegmentRole::Reconfigured | SegmentRole::Selected))
        .map(|s| s.system.clone());
    let reused = active.and_then(|a| a.reused.get(&trial.trial)).map(|(system, _)| system.clone());
    m.selected
        .clone()
        .or(reconfigured)
        .or(reused)
        .or_else(|| {
            let plan = active?.plans.get(trial.trial as usize)?;
            Some(search::system_params(&plan.params))
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::readable;

    #[test]
    fn reasons_show_numbers_for_reading() {
        assert_eq!(readable(0.123_456_789_012_345_68), "0.123457");
        assert_eq!(readable(2.5), "2.5");
        assert_eq!(readable(3.0), "3");
        assert_eq!(readable(0.000_012_345), "1.2345e-5");
        assert_eq!(readable(0.0), "0");
    }
}
