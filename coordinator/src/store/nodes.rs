//! What the other nodes of a trial measured ([`crate::domain::comeasure`]):
//! one row per node and attempt, measured or missing with why.

use super::sql::{self, params};
use serde::Serialize;

use super::{get_opt_u64, get_u64, to_i64, Batch, Result, SqlContext, Store};
use crate::domain::comeasure::{NodeOutcome, NodeRecord};

/// Created on open, like the InfluxDB outbox: older programs ignore it.
pub(super) const NODES_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS node_measurements (
    study       TEXT NOT NULL,
    trial       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    agent       TEXT NOT NULL,
    source      TEXT,
    joules      REAL,
    valid       INTEGER NOT NULL CHECK (valid IN (0, 1)),
    note        TEXT,
    cpu_us      INTEGER,
    cpus        INTEGER,
    from_ms     INTEGER,
    to_ms       INTEGER,
    covered_ms  INTEGER,
    received_ms INTEGER NOT NULL,
    PRIMARY KEY (study, trial, attempt, agent)
);
"#;

/// One node's figures for one attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRow {
    pub trial: u64,
    pub attempt: u32,
    pub agent: String,
    /// Its energy source; `None` when it never answered.
    pub source: Option<String>,
    pub joules: Option<f64>,
    pub valid: bool,
    /// How the figure was made, or why it is invalid or missing.
    pub note: Option<String>,
    pub cpu_us: Option<u64>,
    pub cpus: Option<u32>,
    pub from_unix_ms: Option<u64>,
    pub to_unix_ms: Option<u64>,
    pub covered_ms: Option<u64>,
}

impl NodeRow {
    /// What the node measured, as a figure (none when it never answered).
    pub fn energy(&self) -> tunefleet_common::measurement::EnergyFigure {
        tunefleet_common::measurement::EnergyFigure { joules: self.joules, valid: self.valid }
    }
}

impl Batch<'_> {
    /// Keeps a node's figures (or its absence) for an attempt; a second
    /// record of the same node and attempt is ignored.
    pub fn record_node(&mut self, record: &NodeRecord, at_ms: u64) -> Result<()> {
        let t = &record.trial;
        let context = || format!("storing what {} measured of {t}", record.agent);
        let mut stmt = self
            .tx
            .prepare_cached(
                "INSERT OR IGNORE INTO node_measurements (study, trial, attempt, agent, source, joules, valid, note,
                     cpu_us, cpus, from_ms, to_ms, covered_ms, received_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
            )
            .ctx(context)?;
        let (trial, attempt, at) = (to_i64("trial", t.trial)?, i64::from(t.attempt), to_i64("received_ms", at_ms)?);
        match &record.outcome {
            NodeOutcome::Measured(m) => {
                // The node's CPU reading and its GPUs', one figure.
                let e = &m.energy;
                let figure = m.energy_figure();
                let joules = figure.joules.filter(|j| j.is_finite());
                let source =
                    if m.gpus.is_empty() { e.source.as_str().to_string() } else { format!("{}+nvml", e.source) };
                stmt.write(params![
                    t.study,
                    trial,
                    attempt,
                    record.agent,
                    source,
                    joules,
                    figure.valid,
                    e.note,
                    to_i64("cpu_us", m.cpu_us)?,
                    i64::from(m.cpus),
                    to_i64("from_unix_ms", m.from_unix_ms)?,
                    to_i64("to_unix_ms", m.to_unix_ms)?,
                    to_i64("covered_ms", m.covered_ms)?,
                    at,
                ])
            }
            NodeOutcome::Missing(why) => stmt.write(params![
                t.study,
                trial,
                attempt,
                record.agent,
                None::<String>,
                None::<f64>,
                false,
                why,
                None::<i64>,
                None::<i64>,
                None::<i64>,
                None::<i64>,
                None::<i64>,
                at,
            ]),
        }
        .ctx(context)?;
        Ok(())
    }
}

impl Store {
    /// Every node's figures for `study`'s attempts, by trial, attempt and node.
    pub fn node_measurements(&self, study: &str) -> Result<Vec<NodeRow>> {
        let context = || format!("reading the node measurements of {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT trial, attempt, agent, source, joules, valid, note, cpu_us, cpus, from_ms, to_ms, covered_ms
                 FROM node_measurements WHERE study = ?1 ORDER BY trial, attempt, agent",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |row| {
                Ok(NodeRow {
                    trial: get_u64(row, "trial")?,
                    attempt: row.get("attempt")?,
                    agent: row.get("agent")?,
                    source: row.get("source")?,
                    joules: row.get("joules")?,
                    valid: row.get("valid")?,
                    note: row.get("note")?,
                    cpu_us: get_opt_u64(row, "cpu_us")?,
                    cpus: row.get("cpus")?,
                    from_unix_ms: get_opt_u64(row, "from_ms")?,
                    to_unix_ms: get_opt_u64(row, "to_ms")?,
                    covered_ms: get_opt_u64(row, "covered_ms")?,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }
}
