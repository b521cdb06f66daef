//! One trial as the fleet keeps it, in the domain's terms: its plan,
//! where it stands, and its accepted result with the result's energy
//! typed ([`TrialRecord`], [`Outcome`], [`StoredEnergy`]); the ranking
//! ([`Ranked`]) is a plan and its outcome with the standing of its
//! configuration. The store answers every read of trials and results in
//! these, and a study's search goes on from them
//! ([`crate::domain::search::Search::restore`]).

use std::fmt;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use tunefleet_common::measurement::{EnergyFigure, EnergySourceKind, Measurement};
use tunefleet_common::message::SystemParams;

use crate::domain::search::TrialPlan;

/// Where a trial is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    Pending,
    Running,
    Done,
    Failed,
    /// Stopped early by the search (its epochs trailed): final, not a
    /// failure, never retried.
    Stopped,
}

impl TrialState {
    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Pending => "pending",
            TrialState::Running => "running",
            TrialState::Done => "done",
            TrialState::Failed => "failed",
            TrialState::Stopped => "stopped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [TrialState::Pending, TrialState::Running, TrialState::Done, TrialState::Failed, TrialState::Stopped]
            .into_iter()
            .find(|t| t.as_str() == s)
    }

    /// Done or failed: no more attempts are assigned (a trial failed without
    /// a result may still take the late result of an attempt it had).
    pub fn is_final(self) -> bool {
        matches!(self, TrialState::Done | TrialState::Failed | TrialState::Stopped)
    }
}

impl fmt::Display for TrialState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A result's energy as the store keeps it: its joules (none where
/// nothing was measured), the kind of source that measured them (none
/// also where another build wrote a kind this one does not know), and
/// whether that source vouched for them (a store from before validity was
/// kept: not).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredEnergy {
    pub joules: Option<f64>,
    pub source: Option<EnergySourceKind>,
    pub valid: bool,
}

impl StoredEnergy {
    /// The figure the one rule for energy reads ([`EnergyFigure::counted`]).
    pub fn figure(&self) -> EnergyFigure {
        EnergyFigure { joules: self.joules, valid: self.valid }
    }

    /// The joules when they count.
    pub fn counted(&self) -> Option<f64> {
        self.figure().counted()
    }

    /// The source's name as text output and JSON show it (`rapl`...).
    pub fn source_name(&self) -> Option<&'static str> {
        self.source.map(EnergySourceKind::as_str)
    }

    /// Whether the joules are a model's estimate, not a meter's.
    pub fn estimated(&self) -> bool {
        self.source == Some(EnergySourceKind::Estimated)
    }
}

/// A trial's accepted result.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The attempt that gave it, and its agent.
    pub attempt: u32,
    pub agent: String,
    pub success: bool,
    /// The objective as the result reported it (a failed trial may have one).
    pub objective: Option<f64>,
    /// How far it misses the study's constraints (0: feasible; `None`: no
    /// constraints).
    pub violation: Option<f64>,
    pub wall_us: u64,
    pub user_us: u64,
    pub sys_us: u64,
    /// How the workload ended, as readable text (`exited 0`, `signal 9`...).
    pub exit: String,
    /// The trial's whole energy (CPU and GPUs), and its GPUs' part apart
    /// (none when it was given no GPU).
    pub energy: StoredEnergy,
    pub gpu_energy_j: Option<f64>,
    /// The system configuration it is ranked under: the one its pipelined
    /// trial selected, else the one it ran under (`None` in a store from
    /// before).
    pub system: Option<SystemParams>,
    pub received_ms: u64,
    /// The whole measurement as the agent's JSON, where the read asked for
    /// it: kept as text, so that a read never fails on
    /// a measurement another build wrote ([`Outcome::measurement`] parses it).
    pub measurement_json: Option<String>,
}

impl Outcome {
    /// The measurement, where it was read: an error where this build
    /// cannot read what another one wrote.
    pub fn measurement(&self) -> Option<serde_json::Result<Measurement>> {
        self.measurement_json.as_deref().map(serde_json::from_str)
    }
}

/// A trial: its plan, where it stands, and its accepted result.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRecord {
    pub plan: TrialPlan,
    pub state: TrialState,
    /// The highest attempt number assigned so far (0: never assigned).
    pub attempts: u32,
    /// Attempts that ended without becoming the trial's result (requeued,
    /// reassigned, ended by `Batch::end_attempt`...); moves, refusals and
    /// attempts never started are not counted.
    pub failures: u32,
    /// Why the trial failed, when it did.
    pub reason: Option<String>,
    /// The agent of the accepted result, else of the latest attempt.
    pub agent: Option<String>,
    pub result: Option<Outcome>,
}

impl TrialRecord {
    /// The accepted result, when it succeeded.
    pub fn success(&self) -> Option<&Outcome> {
        self.result.as_ref().filter(|o| o.success)
    }

    /// The objective of the accepted result, when it succeeded and had one.
    pub fn objective(&self) -> Option<f64> {
        self.success().and_then(|o| o.objective)
    }

    /// The accepted result's violation, when it succeeded (see [`Outcome::violation`]).
    pub fn violation(&self) -> Option<f64> {
        self.success().and_then(|o| o.violation)
    }

    /// The accepted result's energy when it counts.
    pub fn counted_energy(&self) -> Option<f64> {
        self.result.as_ref().and_then(|o| o.energy.counted())
    }

    /// The accepted result's wall time.
    pub fn wall_us(&self) -> Option<u64> {
        self.result.as_ref().map(|o| o.wall_us)
    }
}

/// A successful result in the one ranking ([`crate::domain::rank`]): its
/// trial's plan, the result, and how its configuration stands.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    pub plan: TrialPlan,
    pub result: Outcome,
    /// Ranked runs of its configuration (its hyper-parameters), this one
    /// included, their mean objective, and their mean violation (0: every
    /// run feasible): what it is ranked by.
    pub runs: u32,
    pub mean: f64,
    pub mean_violation: f64,
}

impl Ranked {
    /// Its objective (a ranked result always has one).
    pub fn objective(&self) -> f64 {
        self.result.objective.unwrap_or(f64::NAN)
    }

    /// Whether its configuration meets every constraint.
    pub fn feasible(&self) -> bool {
        self.mean_violation == 0.0
    }

    /// Its energy as stored ([`EnergyFigure::counted`] says whether it counts).
    pub fn energy(&self) -> EnergyFigure {
        self.result.energy.figure()
    }
}

/// What `best --json` and the API show of a ranked result: the trial, its
/// result's figures and its configuration's standing, in one flat object.
impl Serialize for Ranked {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (p, r) = (&self.plan, &self.result);
        let mut o = s.serialize_struct("Ranked", 15)?;
        o.serialize_field("trial", &p.trial)?;
        o.serialize_field("repeat", &p.repeat)?;
        o.serialize_field("params", &p.params)?;
        o.serialize_field("objective", &self.objective())?;
        o.serialize_field("attempt", &r.attempt)?;
        o.serialize_field("agent", &r.agent)?;
        o.serialize_field("wall_us", &r.wall_us)?;
        o.serialize_field("energy_j", &r.energy.joules)?;
        o.serialize_field("energy_source", &r.energy.source_name())?;
        o.serialize_field("energy_valid", &r.energy.valid)?;
        o.serialize_field("system", &r.system)?;
        o.serialize_field("runs", &self.runs)?;
        o.serialize_field("mean", &self.mean)?;
        o.serialize_field("violation", &r.violation)?;
        o.serialize_field("mean_violation", &self.mean_violation)?;
        o.end()
    }
}

#[cfg(test)]
impl Outcome {
    /// A successful first attempt's result of `agent`, for tests to change.
    pub(crate) fn for_test(agent: &str, objective: Option<f64>, wall_us: u64, energy: StoredEnergy) -> Outcome {
        Outcome {
            attempt: 1,
            agent: agent.to_string(),
            success: true,
            objective,
            violation: None,
            wall_us,
            user_us: 0,
            sys_us: 0,
            exit: "exited 0".to_string(),
            energy,
            gpu_energy_j: None,
            system: None,
            received_ms: 0,
            measurement_json: None,
        }
    }
}
