//! How the store reads the domain's trial record
//! ([`crate::domain::trial`]): the columns of a record and of its accepted
//! result, and the rows mapped into them.

use super::sql::{self, Row};
use super::{get_u64, trial_cols, trial_state};
use crate::domain::search::TrialPlan;
use crate::domain::trial::{Outcome, StoredEnergy, TrialRecord};

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
/// [`outcome`] reads them, but its measurement ([`outcome_cols`]).
const OUTCOME_COLS: &str = "r.attempt AS result_attempt, r.agent AS result_agent, r.success, r.objective,
        r.violation, r.wall_us, r.user_us, r.sys_us, r.exit, r.energy_j, r.energy_source, r.energy_valid,
        r.gpu_energy_j, r.system, r.received_ms";

/// A SELECT's outcome columns with the measurement read or not.
pub(super) fn outcome_cols(measured: Measured) -> String {
    format!("{OUTCOME_COLS}, {} AS measurement", measured.column())
}

/// The accepted result in `row` ([`OUTCOME_COLS`]), none where the trial
/// has none (a LEFT JOIN's NULLs).
pub(super) fn outcome(row: &Row<'_>) -> sql::Result<Option<Outcome>> {
    let Some(attempt) = row.get::<_, Option<u32>>("result_attempt")? else { return Ok(None) };
    // A source another build wrote and this one does not know reads as
    // none: a read of trials never fails on it.
    let source = row.get::<_, Option<String>>("energy_source")?.and_then(|text| text.parse().ok());
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
