//! Workload profiles, their clusters and every reuse decision
//! ([`crate::domain::reuse`]): what the coordinator learned about jobs, kept so a
//! restart (and the next study, and the next campaign) starts from it.

use super::sql::{self, params};
use serde::{Deserialize, Serialize};

use super::{json_col, to_i64, Batch, Result, SqlContext, Store, StoreError};
use crate::domain::cluster::ClusterModel;
use crate::domain::reuse::Record;

/// Created on open, like the InfluxDB outbox: older programs ignore it.
pub(super) const PROFILES_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS profiles (
    id       INTEGER PRIMARY KEY,
    class    TEXT NOT NULL,
    study    TEXT NOT NULL,
    trial    INTEGER NOT NULL,
    workload TEXT NOT NULL,
    record   TEXT NOT NULL,
    at_ms    INTEGER NOT NULL,
    UNIQUE (study, trial)
);
CREATE INDEX IF NOT EXISTS profiles_by_class ON profiles (class, id);
CREATE TABLE IF NOT EXISTS cluster_models (
    class     TEXT PRIMARY KEY NOT NULL,
    model     TEXT NOT NULL,
    records   INTEGER NOT NULL,
    fitted_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS reuse_decisions (
    study     TEXT NOT NULL,
    trial     INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    class     TEXT NOT NULL,
    decision  TEXT NOT NULL CHECK (decision IN ('reuse', 'probe', 'kept', 'worse')),
    cluster   INTEGER,
    distance  REAL,
    threshold REAL,
    system    TEXT,
    expected  REAL,
    reason    TEXT NOT NULL,
    at_ms     INTEGER NOT NULL,
    PRIMARY KEY (study, trial, attempt, decision)
);
"#;

/// One decision about one attempt: `reuse` or `probe` when its first
/// window was profiled, `kept` or `worse` when a reused configuration was
/// checked against its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRow {
    pub study: String,
    pub trial: u64,
    pub attempt: u32,
    pub class: String,
    pub decision: String,
    pub cluster: Option<u64>,
    pub distance: Option<f64>,
    pub threshold: Option<f64>,
    pub system: Option<String>,
    pub expected: Option<f64>,
    pub reason: String,
    pub at_ms: u64,
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

impl Batch<'_> {
    /// Keeps `record` (replacing an earlier one of the same trial: a trial
    /// measured again).
    pub fn record_profile(&mut self, record: &Record) -> Result<()> {
        let context = || format!("storing the profile of {}/{}", record.study, record.trial);
        let json = serde_json::to_string(record).map_err(|source| StoreError::Json { context: context(), source })?;
        self.tx
            .prepare_cached(
                "INSERT INTO profiles (class, study, trial, workload, record, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (study, trial) DO UPDATE SET class = excluded.class, workload = excluded.workload,
                     record = excluded.record, at_ms = excluded.at_ms",
            )
            .ctx(context)?
            .write(params![
                record.class,
                record.study,
                to_i64("trial", record.trial)?,
                record.workload,
                json,
                to_i64("time", record.at_ms)?
            ])
            .ctx(context)?;
        Ok(())
    }

    /// Keeps the model fitted for `class` on `records` profiles.
    pub fn record_model(&mut self, class: &str, model: &ClusterModel, records: usize, at_ms: u64) -> Result<()> {
        let context = || format!("storing the profile clusters of {class}");
        let json = serde_json::to_string(model).map_err(|source| StoreError::Json { context: context(), source })?;
        self.tx
            .prepare_cached(
                "INSERT INTO cluster_models (class, model, records, fitted_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (class) DO UPDATE SET model = excluded.model, records = excluded.records,
                     fitted_ms = excluded.fitted_ms",
            )
            .ctx(context)?
            .write(params![class, json, to_i64("records", records as u64)?, to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(())
    }

    /// Keeps a decision (the first of its kind per attempt).
    pub fn record_decision(&mut self, d: &DecisionRow) -> Result<()> {
        let context = || format!("storing the reuse decision of {}/{}", d.study, d.trial);
        self.tx
            .prepare_cached(
                "INSERT OR IGNORE INTO reuse_decisions
                 (study, trial, attempt, class, decision, cluster, distance, threshold, system, expected, reason, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )
            .ctx(context)?
            .write(params![
                d.study,
                to_i64("trial", d.trial)?,
                d.attempt,
                d.class,
                d.decision,
                d.cluster.map(|c| to_i64("cluster", c)).transpose()?,
                finite(d.distance),
                finite(d.threshold),
                d.system,
                finite(d.expected),
                d.reason,
                to_i64("time", d.at_ms)?
            ])
            .ctx(context)?;
        Ok(())
    }
}

impl Store {
    /// Forgets the profiles learnt from `agent`'s results (each profile
    /// comes from its trial's one stored result), in one transaction; each
    /// class it touched gets the model `refit` makes of the records left,
    /// or none. Returns how many went, by class.
    pub fn forget_agent_profiles(
        &mut self,
        agent: &str,
        now_ms: u64,
        refit: impl Fn(&[Record]) -> Option<ClusterModel>,
    ) -> Result<Vec<(String, u64)>> {
        let context = || format!("forgetting the profiles of {agent}");
        let of_agent = "EXISTS (SELECT 1 FROM results r WHERE r.study = profiles.study AND r.trial = profiles.trial
                         AND r.agent = ?1)";
        let mut batch = self.batch()?;
        let counts = {
            let mut stmt = batch
                .tx
                .prepare_cached(&format!(
                    "SELECT class, COUNT(*) FROM profiles WHERE {of_agent} GROUP BY class ORDER BY class"
                ))
                .ctx(context)?;
            let rows = stmt.query_map([agent], |r| Ok((r.get::<_, String>(0)?, super::get_u64(r, 1)?))).ctx(context)?;
            rows.collect::<sql::Result<Vec<_>>>().ctx(context)?
        };
        batch.tx.write(&format!("DELETE FROM profiles WHERE {of_agent}"), [agent]).ctx(context)?;
        for (class, _) in &counts {
            let records = {
                let mut stmt =
                    batch.tx.prepare_cached("SELECT record FROM profiles WHERE class = ?1 ORDER BY id").ctx(context)?;
                let rows = stmt.query_map([class], |r| json_col::<Record, _>(r, 0)).ctx(context)?;
                rows.collect::<sql::Result<Vec<_>>>().ctx(context)?
            };
            match refit(&records) {
                Some(model) => batch.record_model(class, &model, records.len(), now_ms)?,
                None => {
                    batch.tx.write("DELETE FROM cluster_models WHERE class = ?1", [class]).ctx(context)?;
                }
            }
        }
        batch.commit()?;
        Ok(counts)
    }

    /// Every profile record, by class, oldest first.
    pub fn profile_records(&self) -> Result<Vec<Record>> {
        let context = || "reading profiles".to_string();
        let mut stmt = self.conn.prepare_cached("SELECT record FROM profiles ORDER BY class, id").ctx(context)?;
        let rows = stmt.query_map((), |r| json_col::<Record, _>(r, 0)).ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// Every class's stored model and the number of records it was fitted on.
    pub fn cluster_models(&self) -> Result<Vec<(String, ClusterModel, u64)>> {
        let context = || "reading profile clusters".to_string();
        let mut stmt =
            self.conn.prepare_cached("SELECT class, model, records FROM cluster_models ORDER BY class").ctx(context)?;
        let rows = stmt
            .query_map((), |r| Ok((r.get::<_, String>(0)?, json_col::<ClusterModel, _>(r, 1)?, super::get_u64(r, 2)?)))
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// The decisions about `study`'s trials (every study's when `None`), in order.
    pub fn decisions(&self, study: Option<&str>) -> Result<Vec<DecisionRow>> {
        let context = || "reading reuse decisions".to_string();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT study, trial, attempt, class, decision, cluster, distance, threshold, system, expected, reason, at_ms
                 FROM reuse_decisions WHERE CAST(?1 AS TEXT) IS NULL OR study = ?1 ORDER BY study, trial, attempt, at_ms",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |r| {
                Ok(DecisionRow {
                    study: r.get("study")?,
                    trial: super::get_u64(r, "trial")?,
                    attempt: r.get("attempt")?,
                    class: r.get("class")?,
                    decision: r.get("decision")?,
                    cluster: super::get_opt_u64(r, "cluster")?,
                    distance: r.get("distance")?,
                    threshold: r.get("threshold")?,
                    system: r.get("system")?,
                    expected: r.get("expected")?,
                    reason: r.get("reason")?,
                    at_ms: super::get_u64(r, "at_ms")?,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }
}
