//! What an export reads: every trial of a study with its accepted
//! result and measurement, and when each attempt ran
//! (`crate::query::export` writes them as CSV or JSON).

use super::record::Measured;
use super::sql::{self, params, Optional};
use super::{to_i64, Result, SqlContext, Store};
use crate::domain::trial::TrialRecord;

impl Store {
    /// Every trial of `study` with its accepted result, if any, by trial;
    /// the result's measurement read as `measured` says.
    pub fn trials_read(&self, study: &str, measured: Measured) -> Result<Vec<TrialRecord>> {
        self.records(study, measured, "ORDER BY t.trial")
    }

    /// The measurement of `study`'s trial `trial`'s accepted result, as
    /// the agent's JSON; none without a result.
    pub fn measurement_json(&self, study: &str, trial: u64) -> Result<Option<String>> {
        let context = || format!("reading the measurement of {study}/{trial}");
        self.conn
            .prepare_cached("SELECT measurement FROM results WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .query_row(params![study, to_i64("trial", trial)?], |r| r.get(0))
            .optional()
            .ctx(context)
    }
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
