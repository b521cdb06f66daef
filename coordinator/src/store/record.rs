//! One trial as the store keeps it, in the domain's terms: its plan, where
//! it stands, and its accepted result with the result's energy typed
//! ([`TrialRecord`], [`Outcome`], [`StoredEnergy`]). Every read of trials
//! and results answers in these (`trials`, `results`, the export), and the
//! ranking ([`Ranked`]) is a plan and its outcome with the standing of its
//! configuration: no row type repeats another's columns.

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use tunefleet_common::measurement::{EnergyFigure, EnergySourceKind, Measurement};
use tunefleet_common::message::SystemParams;

use super::sql::{self, Row};
use super::{bad_text, get_u64, trial_cols, trial_state, TrialState};
use crate::domain::search::TrialPlan;

/// A result's energy as the store keeps it: its joules (none where
/// nothing was measured), the kind of source that measured them, and
/// whether that source vouched for them.
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
    /// How the workload ended, as readable text ([`super::exit_text`]).
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
    /// it ([`Measured::With`]): kept as text, so that a read never fails on
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

/// Whether a read carries each result's whole measurement (JSON to
/// parse, the largest column) or only its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measured {
    With,
    Without,
}

impl Measured {
    /// The column a record's SELECT reads the measurement from.
    pub(super) fn column(self) -> &'static str {
        match self {
            Measured::With => "r.measurement",
            Measured::Without => "NULL",
        }
    }
}

/// The columns of `results r` an [`Outcome`] is read from, named as
/// [`outcome`] reads them; `{measurement}` is [`Measured::column`].
pub(super) const OUTCOME_COLS: &str = "r.attempt AS result_attempt, r.agent AS result_agent, r.success, r.objective,
        r.violation, r.wall_us, r.user_us, r.sys_us, r.exit, r.energy_j, r.energy_source, r.energy_valid,
        r.gpu_energy_j, r.system, r.received_ms, {measurement} AS measurement";

/// A SELECT's outcome columns with the measurement read or not.
pub(super) fn outcome_cols(measured: Measured) -> String {
    OUTCOME_COLS.replace("{measurement}", measured.column())
}

/// The accepted result in `row` ([`OUTCOME_COLS`]), none where the trial
/// has none (a LEFT JOIN's NULLs).
pub(super) fn outcome(row: &Row<'_>) -> sql::Result<Option<Outcome>> {
    let Some(attempt) = row.get::<_, Option<u32>>("result_attempt")? else { return Ok(None) };
    let source = match row.get::<_, Option<String>>("energy_source")? {
        Some(text) => Some(text.parse().map_err(|_| bad_text(row, "energy_source", "energy source", &text))?),
        None => None,
    };
    Ok(Some(Outcome {
        attempt,
        agent: row.get("result_agent")?,
        success: row.get("success")?,
        objective: row.get("objective")?,
        violation: row.get("violation")?,
        wall_us: get_u64(row, "wall_us")?,
        user_us: get_u64(row, "user_us")?,
        sys_us: get_u64(row, "sys_us")?,
        exit: row.get("exit")?,
        energy: StoredEnergy {
            joules: row.get("energy_j")?,
            source,
            // NULL (a store from before validity was kept) reads as not valid.
            valid: row.get::<_, Option<bool>>("energy_valid")?.unwrap_or(false),
        },
        gpu_energy_j: row.get("gpu_energy_j")?,
        // A configuration this build cannot read is shown as none.
        system: row.get::<_, Option<String>>("system")?.and_then(|text| serde_json::from_str(&text).ok()),
        received_ms: get_u64(row, "received_ms")?,
        measurement_json: row.get("measurement")?,
    }))
}

/// A trial's plan from `row`'s `trials` columns.
pub(super) fn plan(row: &Row<'_>) -> sql::Result<TrialPlan> {
    let (trial, repeat, params) = trial_cols(row)?;
    Ok(TrialPlan { trial, params, repeat })
}

/// The SELECT of [`TrialRecord`]s of study `?1`, with or without their
/// measurements; a caller adds conditions (`AND ...`) and an order.
pub(super) fn record_select(measured: Measured) -> String {
    format!(
        "SELECT t.trial, t.repeat, t.params, t.state, t.attempts, t.reason,
            COALESCE(r.agent, a.agent) AS agent,
            (SELECT COUNT(*) FROM attempts f
             WHERE f.study = t.study AND f.trial = t.trial AND f.ended_ms IS NOT NULL AND f.attempt IS NOT r.attempt
               AND COALESCE(f.outcome, '') NOT LIKE 'moved off %' AND COALESCE(f.outcome, '') NOT LIKE 'refused by %'
               AND COALESCE(f.outcome, '') NOT LIKE 'not started: %') AS failures,
            {}
        FROM trials t
        LEFT JOIN results r ON r.study = t.study AND r.trial = t.trial
        LEFT JOIN attempts a ON a.study = t.study AND a.trial = t.trial AND a.attempt = t.attempts
        WHERE t.study = ?1",
        outcome_cols(measured)
    )
}

/// The [`TrialRecord`] in `row` ([`record_select`]).
pub(super) fn record(row: &Row<'_>) -> sql::Result<TrialRecord> {
    Ok(TrialRecord {
        plan: plan(row)?,
        state: trial_state(row, "state")?,
        attempts: row.get("attempts")?,
        failures: row.get("failures")?,
        reason: row.get("reason")?,
        agent: row.get("agent")?,
        result: outcome(row)?,
    })
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
