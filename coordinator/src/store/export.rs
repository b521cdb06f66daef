//! The rows an export is made of: every trial of a study with its
//! accepted result, if any (`crate::query::export` writes them as CSV or
//! JSON).

use rusqlite::types::Type;
use tunefleet_common::measurement::EnergyFigure;
use tunefleet_common::params::Params;

use super::{get_opt_u64, get_u64, params_col, trial_state, Result, SqlContext, Store, TrialState};

impl Store {
    /// Every trial of `study` with its accepted result, by trial
    /// (`rank` left empty: the ranking is the query's).
    pub fn export_rows(&self, study: &str) -> Result<Vec<ExportRow>> {
        let context = || format!("exporting study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT t.trial, t.repeat, t.state, t.params, t.attempts,
                        r.objective, r.wall_us, r.energy_j, r.energy_source, r.energy_valid,
                        r.agent, r.attempt, r.exit, r.measurement
                 FROM trials t LEFT JOIN results r ON r.study = t.study AND r.trial = t.trial
                 WHERE t.study = ?1 ORDER BY t.trial",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |row| {
                let measurement: Option<String> = row.get(13)?;
                let measurement = match measurement {
                    Some(text) => Some(
                        serde_json::from_str::<serde_json::Value>(&text)
                            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(13, Type::Text, Box::new(e)))?,
                    ),
                    None => None,
                };
                Ok(ExportRow {
                    trial: get_u64(row, 0)?,
                    repeat: row.get(1)?,
                    state: trial_state(row, 2)?,
                    params: params_col(row, 3)?,
                    attempts: row.get(4)?,
                    objective: row.get(5)?,
                    wall_us: get_opt_u64(row, 6)?,
                    energy_j: row.get(7)?,
                    energy_source: row.get(8)?,
                    energy_valid: row.get(9)?,
                    agent: row.get(10)?,
                    attempt: row.get(11)?,
                    exit: row.get(12)?,
                    measurement,
                    rank: None,
                })
            })
            .ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
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
    pub agent: Option<String>,
    pub attempt: Option<u32>,
    pub exit: Option<String>,
    pub measurement: Option<serde_json::Value>,
    /// Its place among the ranked trials, its configuration's mean and runs.
    pub rank: Option<(u64, f64, u32)>,
}

impl ExportRow {
    /// Its accepted result's energy as stored; none without a result.
    pub fn energy(&self) -> EnergyFigure {
        EnergyFigure { joules: self.energy_j, valid: self.energy_valid == Some(true) }
    }
}
