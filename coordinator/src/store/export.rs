//! The rows an export is made of: every trial of a study with its
//! accepted result, if any (`crate::query::export` writes them as CSV or
//! JSON).

use tunefleet_common::measurement::EnergyFigure;
use tunefleet_common::params::Params;

use super::sql::{self};
use super::{at, get_opt_u64, trial_cols, trial_state, Result, SqlContext, Store, TrialState};

impl Store {
    /// Every trial of `study` with its accepted result, by trial
    /// (`rank` left empty: the ranking is the query's).
    pub fn export_rows(&self, study: &str) -> Result<Vec<ExportRow>> {
        let context = || format!("exporting study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT t.trial, t.repeat, t.state, t.params, t.attempts,
                        r.objective, r.wall_us, r.energy_j, r.energy_source, r.energy_valid, r.gpu_energy_j,
                        r.agent, r.attempt, r.exit, r.measurement, r.violation
                 FROM trials t LEFT JOIN results r ON r.study = t.study AND r.trial = t.trial
                 WHERE t.study = ?1 ORDER BY t.trial",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |row| {
                let measurement: Option<String> = row.get("measurement")?;
                let measurement = match measurement {
                    Some(text) => Some(serde_json::from_str::<serde_json::Value>(&text).map_err(|e| {
                        let i = at(row, "measurement").unwrap_or(0);
                        sql::Error::conversion(i, e)
                    })?),
                    None => None,
                };
                let (trial, repeat, params) = trial_cols(row)?;
                Ok(ExportRow {
                    trial,
                    repeat,
                    state: trial_state(row, "state")?,
                    params,
                    attempts: row.get("attempts")?,
                    objective: row.get("objective")?,
                    wall_us: get_opt_u64(row, "wall_us")?,
                    energy_j: row.get("energy_j")?,
                    energy_source: row.get("energy_source")?,
                    energy_valid: row.get("energy_valid")?,
                    gpu_energy_j: row.get("gpu_energy_j")?,
                    violation: row.get("violation")?,
                    agent: row.get("agent")?,
                    attempt: row.get("attempt")?,
                    exit: row.get("exit")?,
                    measurement,
                    rank: None,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }
}

/// One exported trial.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRow {
    pub trial: u64,
    pub repeat: u32,
    pub state: TrialState,
    pub params: Params,
    pub attempts: u32,
    pub objective: Option<f64>,
    pub wall_us: Option<u64>,
    pub energy_j: Option<f64>,
    pub energy_source: Option<String>,
    pub energy_valid: Option<bool>,
    /// Its GPUs' part of `energy_j`; none when it was given no GPU.
    pub gpu_energy_j: Option<f64>,
    pub agent: Option<String>,
    pub attempt: Option<u32>,
    pub exit: Option<String>,
    pub measurement: Option<serde_json::Value>,
    /// Its place among the ranked trials, its configuration's mean and runs.
    pub rank: Option<(u64, f64, u32)>,
    /// How far its result misses the study's constraints (0: feasible;
    /// `None`: no constraints, or no result).
    pub violation: Option<f64>,
}

/// When each attempt was assigned and ended (Unix ms), by (trial, attempt).
pub type AttemptTimes = std::collections::HashMap<(u64, u32), (u64, Option<u64>)>;

impl Store {
    /// When each attempt of `study` was assigned and ended.
    pub fn attempt_times(&self, study: &str) -> Result<AttemptTimes> {
        let context = || format!("reading the attempt times of {study}");
        let mut stmt = self
            .conn
            .prepare_cached("SELECT trial, attempt, assigned_ms, ended_ms FROM attempts WHERE study = ?1")
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |r| {
                let n = |v: i64| u64::try_from(v).unwrap_or(0);
                Ok((
                    (n(r.get(0)?), u32::try_from(r.get::<_, i64>(1)?).unwrap_or(0)),
                    (n(r.get(2)?), r.get::<_, Option<i64>>(3)?.map(n)),
                ))
            })
            .ctx(context)?
            .collect::<sql::Result<_>>()
            .ctx(context)?;
        Ok(rows)
    }
}

impl ExportRow {
    /// Its accepted result's energy as stored; none without a result.
    pub fn energy(&self) -> EnergyFigure {
        EnergyFigure { joules: self.energy_j, valid: self.energy_valid == Some(true) }
    }
}
