//! A study while the engine runs it ([`ActiveStudy`]): its search, the
//! trials made so far, early stopping, the checkpoints and values its
//! trials reported, reuse decisions; and what the engine reports of it
//! ([`Best`], [`Summary`]).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use tunefleet_common::message::{ProbePlan, SystemParams};

use super::types::{EngineError, EngineStats};
use crate::domain::rank::Standings;
use crate::domain::sched::Scheduler;
use crate::domain::search::{self, Search, TrialPlan};
use crate::domain::study::Study;
use crate::store::Batch;

/// The leading configuration so far by the one ranking rule
/// ([`crate::domain::rank`]), for the progress display and the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct Best {
    /// Its best run.
    pub trial: u64,
    /// The mean objective of its runs.
    pub value: f64,
    /// Its ranked runs.
    pub runs: u32,
    /// Where its best run ran.
    pub agent: String,
    /// Whether it meets the study's `[[constraint]]`s (`None`: it has none):
    /// the leader is infeasible only when no configuration is feasible.
    pub feasible: Option<bool>,
}

/// What a finished study looked like.
#[derive(Debug, Clone)]
pub struct Summary {
    pub study: String,
    pub total: u64,
    pub done: u64,
    pub failed: u64,
    /// Stopped early by ASHA: neither done nor failed.
    pub stopped: u64,
    /// Every trial is final and no more will come (false: interrupted or cancelled early).
    pub finished: bool,
    /// The trials the study plans in all (its budget), at least `total`.
    pub planned: u64,
    pub best: Option<Best>,
    pub elapsed: Duration,
    pub stats: EngineStats,
    pub agents_seen: usize,
    /// Trials in flight at each ask of its search (gp, tpe); `None` when
    /// it never read them.
    pub ask_depth: Option<tunefleet_search::AskDepth>,
    /// Why this run stopped it early for its failures ([`Study::fails_fast`]), if it did.
    pub failed_fast: Option<String>,
}

pub(super) struct ActiveStudy {
    pub(super) study: Study,
    /// Asked for trials as agents have room, told every result.
    pub(super) search: Search,
    /// The trials created so far, by id.
    pub(super) plans: Vec<TrialPlan>,
    /// Early stopping on the epochs trials report, when the study asks for it.
    pub(super) asha: Option<tunefleet_search::asha::Asha>,
    /// Objective values of successful trials, for `[stability]`.
    pub(super) values: HashMap<u64, f64>,
    /// The last checkpoint each trial's live attempt reported (epoch, reference).
    pub(super) checkpoints: HashMap<u64, (u32, String)>,
    /// With `[stability]`: the trials of each configuration, by its JSON.
    pub(super) runs: HashMap<String, Vec<u64>>,
    /// What every trial of a pipelined study probes (computed once).
    pub(super) probe: Option<ProbePlan>,
    /// Cancelled from the control socket, or for its failures: no more trials.
    pub(super) cancelled: bool,
    /// Failed and done trials when this run started it: its failures to
    /// stop on are this run's own, so a fixed study goes on when resumed.
    pub(super) at_start: (u64, u64),
    /// Why it was stopped for its failures, if it was.
    pub(super) failed_fast: Option<String>,
    /// Why no online agent can run it, as last said ([`Scheduler::why_waiting`]).
    pub(super) waits: Option<String>,
    /// Attempts whose first window was decided on (once each).
    pub(super) decided: HashSet<(u64, u32)>,
    /// Trials running a reused configuration: it, and the time relative
    /// to the first window its cluster promised.
    pub(super) reused: HashMap<u64, (SystemParams, f64)>,
    /// The ranked results (one rule, [`crate::domain::rank`]) and where
    /// each ranked trial ran.
    standings: Standings,
    ran_on: HashMap<u64, String>,
    /// When this run first handed one of its trials to an agent: the
    /// study's time counts from here (not the seconds before any agent came).
    pub(super) first_assigned: Option<Instant>,
}

impl ActiveStudy {
    /// A study that starts (or resumes) now, with the trials `plans`
    /// already made; the objective values they reached are told with
    /// [`ActiveStudy::record_value`].
    pub(super) fn new(study: Study, search: Search, plans: Vec<TrialPlan>) -> Self {
        let asha = study
            .early_stopping
            .map(|e| tunefleet_search::asha::Asha::new(e.reduction, e.grace, study.stopping_metric().1));
        let probe = search::probe_plan(&study);
        let study_dir = study.objective.direction;
        let mut active = ActiveStudy {
            study,
            search,
            plans: Vec::new(),
            asha,
            values: HashMap::new(),
            checkpoints: HashMap::new(),
            runs: HashMap::new(),
            probe,
            cancelled: false,
            at_start: (0, 0),
            failed_fast: None,
            waits: None,
            decided: Default::default(),
            reused: HashMap::new(),
            standings: Standings::new(study_dir),
            ran_on: HashMap::new(),
            first_assigned: None,
        };
        active.remember(plans);
        active
    }

    /// Keeps `trials` as created (and indexes them by configuration when
    /// the study repeats until stable).
    fn remember(&mut self, trials: Vec<TrialPlan>) {
        if self.study.stability.is_some() {
            for t in &trials {
                self.runs.entry(crate::store::params_json(&t.params)).or_default().push(t.trial);
            }
        }
        self.plans.extend(trials);
    }

    /// Counts `value`, the objective trial `trial` reached on `agent`, in
    /// the ranking (and for `[stability]`).
    pub(super) fn record_value(&mut self, trial: u64, value: f64, violation: Option<f64>, agent: &str) {
        self.values.insert(trial, value);
        if let Some(plan) = self.plans.get(trial as usize) {
            let config = crate::store::params_json(&plan.params);
            self.standings.record(&config, trial, value, violation.unwrap_or(0.0));
            self.ran_on.insert(trial, agent.to_string());
        }
    }

    /// The leading configuration so far.
    pub(super) fn best(&self) -> Option<Best> {
        let (_, s) = self.standings.leader()?;
        let agent = self.ran_on.get(&s.best_trial).cloned().unwrap_or_default();
        let feasible = (!self.study.constraints.is_empty()).then_some(s.violation == 0.0);
        Some(Best { trial: s.best_trial, value: s.mean, runs: s.runs, agent, feasible })
    }

    /// Creates `trials` in the store and the scheduler, and remembers them.
    pub(super) fn create(
        &mut self,
        sched: &mut Scheduler,
        batch: &mut Batch<'_>,
        trials: Vec<TrialPlan>,
    ) -> Result<(), EngineError> {
        batch.add_trials(&self.study.name, &trials)?;
        self.adopt(sched, trials);
        Ok(())
    }

    /// Adds `trials`, already in the store, to the scheduler, and remembers them.
    pub(super) fn adopt(&mut self, sched: &mut Scheduler, trials: Vec<TrialPlan>) {
        for t in &trials {
            let id = sched.add_trial(&self.study.name);
            debug_assert_eq!(id, Some(t.trial), "the scheduler and the search number trials alike");
        }
        self.remember(trials);
    }
}
