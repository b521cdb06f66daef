//! What one turn's handling may touch ([`Ctx`]), and the rules applied
//! through it as results and epochs arrive: ASHA's early stops
//! ([`early_stop`]), `[stability]` repeats ([`repeat_until_stable`]) and
//! which checkpoints may be resumed ([`usable_checkpoint`]).

use std::collections::{HashMap, HashSet};

use tunefleet_common::message::{CoordinatorMessage, Progress};

use super::active::ActiveStudy;
use super::types::{EngineError, EngineStats, Now};
use crate::domain::comeasure::CoMeasures;
use crate::domain::offload::Telemetry;
use crate::domain::reuse::Book;
use crate::domain::sched::{Effect, Scheduler};
use crate::domain::search::{self, TrialPlan};
use crate::runtime::auth::Sessions;
use crate::store::Batch;

/// What handling a message may touch: the engine's state, borrowed for one
/// turn, with the turn's store batch and what it queues to send.
pub(super) struct Ctx<'a, 'b> {
    pub(super) sched: &'a mut Scheduler,
    pub(super) batch: &'a mut Batch<'b>,
    pub(super) studies: &'a mut HashMap<String, ActiveStudy>,
    pub(super) stats: &'a mut EngineStats,
    pub(super) agents_seen: &'a mut HashSet<String>,
    pub(super) out: &'a mut Vec<(String, CoordinatorMessage)>,
    pub(super) welcomes: &'a mut Vec<(String, Vec<u8>)>,
    pub(super) effects: &'a mut Vec<Effect>,
    pub(super) influx: bool,
    pub(super) sessions: &'a mut Sessions,
    pub(super) unsynced: &'a mut HashMap<String, u64>,
    pub(super) telemetry: &'a mut Telemetry,
    /// The turn's clocks: the engine's for the scheduler, the wall clock
    /// for the store, the monotonic instant for the session limits.
    pub(super) now: Now,
    /// Measurements agents flag as disturbed are taken again (with offloading).
    pub(super) remeasure: bool,
    pub(super) book: &'a mut Book,
    /// Nodes measuring other agents' trials (`[measure] nodes`).
    pub(super) co: &'a mut CoMeasures,
}

impl Ctx<'_, '_> {
    /// What the dispatch reads ([`super::dispatch::decide`]): the state, shared.
    pub(super) fn view(&self) -> super::dispatch::EngineView<'_> {
        super::dispatch::EngineView {
            sched: self.sched,
            studies: self.studies,
            co: self.co,
            remeasure: self.remeasure,
            influx: self.influx,
        }
    }
}

/// Co-measurement steps ([`CoMeasures`]) as the messages that carry them.
pub(super) fn co_messages(
    sends: Vec<(String, tunefleet_common::message::CoMeasure)>,
) -> impl Iterator<Item = (String, CoordinatorMessage)> {
    sends.into_iter().map(|(node, m)| (node, CoordinatorMessage::CoMeasure(m)))
}

/// `[stability]`: once every run of a trial's configuration has ended, one
/// more while their objectives spread more than the study allows (and it
/// has runs left).
pub(super) fn repeat_until_stable(
    sched: &mut Scheduler,
    batch: &mut Batch<'_>,
    a: &mut ActiveStudy,
    trial: u64,
) -> Result<(), EngineError> {
    let Some(stability) = a.study.stability else { return Ok(()) };
    let Some(params) = a.plans.get(trial as usize).map(|p| p.params.clone()) else { return Ok(()) };
    let runs = a.runs.get(&crate::store::params_json(&params)).cloned().unwrap_or_default();
    let name = a.study.name.clone();
    if runs.len() >= stability.max_repeats as usize || !runs.iter().all(|&t| sched.is_finished(&name, t)) {
        return Ok(());
    }
    let values: Vec<f64> = runs.iter().filter_map(|t| a.values.get(t).copied()).collect();
    let Some(spread) = search::spread(&values).filter(|s| *s > stability.spread) else { return Ok(()) };
    // The row first: when the store refuses it, the search has not counted it.
    let repeat = runs.len() as u32;
    let next = TrialPlan { trial: a.plans.len() as u64, params: params.clone(), repeat };
    batch.add_trials(&name, std::slice::from_ref(&next))?;
    let plan = a.search.extra_repeat(&params, repeat);
    debug_assert_eq!(plan, next, "the search numbers trials as the study has them");
    tracing::info!(study = %name, trial = plan.trial, spread, runs = runs.len(), "not stable yet: one more run");
    a.adopt(sched, vec![plan]);
    Ok(())
}

/// ASHA's verdict on a live attempt's epoch report.
pub(super) fn early_stop(cx: &mut Ctx<'_, '_>, p: &Progress) {
    let Some(active) = cx.studies.get_mut(&p.trial.study) else { return };
    let Some(asha) = active.asha.as_mut() else { return };
    let Some(&value) = p.metrics.get(&active.study.objective.metric) else { return };
    if let tunefleet_search::asha::Pruning::Stop { rung, value: judged, cutoff } =
        asha.report(p.trial.trial, p.epoch, value)
    {
        // The model learns where ASHA cut (Optuna's pruned trials).
        if let Some(plan) = active.plans.get(p.trial.trial as usize) {
            active.search.tell_pruned(p.trial.trial, &plan.params, p.epoch, value);
        }
        let value = judged;
        let metric = &active.study.objective.metric;
        let (value, cutoff) = (readable(value), readable(cutoff));
        let reason = format!("stopped early by ASHA: {metric} {value} at epoch {rung} is behind the cut {cutoff}");
        tracing::info!(trial = %p.trial, %reason);
        cx.effects.extend(cx.sched.stop(&p.trial.study, p.trial.trial, &reason));
    }
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
