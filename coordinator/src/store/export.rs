//! Export of a study's trials as CSV or JSON.

use std::io::Write;

use rusqlite::types::Type;
use tunefleet_common::params::Params;

use super::{
    get_opt_u64, get_u64, param_value_json, params_col, trial_state, NodeRow, Result, SqlContext, Store, StoreError,
    TrialState,
};

/// Format of [`Store::export`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// One row per trial, one column per parameter.
    Csv,
    /// An array of objects, one per trial, with the full measurement.
    Json,
}

impl Store {
    /// Writes one row per trial of `study` to `out`.
    ///
    /// CSV columns: `trial, repeat, state`, one column per parameter (named
    /// after it, prefixed `param_` if it collides with a fixed column),
    /// `objective, wall_us, energy_j, energy_source, energy_valid, agent,
    /// attempt, attempts, exit, rank, config_mean, config_runs` (the one
    /// ranking rule, [`crate::domain::rank`]: the trial's place among the
    /// ranked ones, its configuration's mean and runs; empty when not
    /// ranked), and for a study measured on several nodes
    /// (`[measure] nodes`) `nodes, energy_nodes_j, energy_nodes_valid`.
    /// JSON: an array of objects with the same fields, `params` as an
    /// object, the full `measurement` (or null), and `nodes`: what each
    /// other node measured of the stored attempt.
    pub fn export(&self, study: &str, format: ExportFormat, out: &mut impl Write) -> Result<()> {
        if self.study(study)?.is_none() {
            return Err(StoreError::UnknownStudy(study.to_string()));
        }
        let mut rows = self.export_rows(study)?;
        let ranked = self.best(study, usize::MAX)?;
        let places: std::collections::HashMap<u64, (u64, f64, u32)> =
            ranked.iter().enumerate().map(|(i, r)| (r.trial, (i as u64 + 1, r.mean, r.runs))).collect();
        for r in &mut rows {
            r.rank = places.get(&r.trial).copied();
        }
        let nodes = self.node_measurements(study)?;
        match format {
            ExportFormat::Csv => write_csv(study, &rows, &nodes, out),
            ExportFormat::Json => write_json(study, &rows, &nodes, out),
        }
    }

    fn export_rows(&self, study: &str) -> Result<Vec<ExportRow>> {
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
struct ExportRow {
    trial: u64,
    repeat: u32,
    state: TrialState,
    params: Params,
    attempts: u32,
    objective: Option<f64>,
    wall_us: Option<u64>,
    energy_j: Option<f64>,
    energy_source: Option<String>,
    energy_valid: Option<bool>,
    agent: Option<String>,
    attempt: Option<u32>,
    exit: Option<String>,
    measurement: Option<serde_json::Value>,
    /// Its place among the ranked trials, its configuration's mean and runs.
    rank: Option<(u64, f64, u32)>,
}

const FIXED_COLUMNS: [&str; 15] = [
    "trial",
    "repeat",
    "state",
    "objective",
    "wall_us",
    "energy_j",
    "energy_source",
    "energy_valid",
    "agent",
    "attempt",
    "attempts",
    "exit",
    "rank",
    "config_mean",
    "config_runs",
];

/// The nodes that measured the row's stored attempt, and the energy of
/// the trial over every machine: its own agent's and theirs, valid only
/// when every figure is (a missing node makes it invalid).
fn with_nodes<'a>(r: &ExportRow, nodes: &'a [NodeRow]) -> (Vec<&'a NodeRow>, Option<f64>, Option<bool>) {
    // `nodes` is sorted by trial and attempt (`Store::node_measurements`).
    let key = (r.trial, r.attempt.unwrap_or(u32::MAX));
    let first = nodes.partition_point(|n| (n.trial, n.attempt) < key);
    let mine: Vec<&NodeRow> = nodes[first..].iter().take_while(|n| (n.trial, n.attempt) == key).collect();
    if mine.is_empty() {
        return (mine, None, None);
    }
    let sum = r.energy_j.unwrap_or(0.0) + mine.iter().filter_map(|n| n.joules).sum::<f64>();
    let valid = r.energy_valid == Some(true) && mine.iter().all(|n| n.valid);
    (mine, Some(sum), Some(valid))
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn write_csv(study: &str, rows: &[ExportRow], nodes: &[NodeRow], out: &mut impl Write) -> Result<()> {
    let names: std::collections::BTreeSet<&str> =
        rows.iter().flat_map(|r| r.params.keys().map(String::as_str)).collect();
    let csv_err = |source| StoreError::Csv { study: study.to_string(), source };
    let mut w = csv::Writer::from_writer(out);
    let mut header: Vec<String> = vec!["trial".into(), "repeat".into(), "state".into()];
    header
        .extend(names.iter().map(|n| if FIXED_COLUMNS.contains(n) { format!("param_{n}") } else { (*n).to_string() }));
    header.extend(FIXED_COLUMNS[3..].iter().map(|s| (*s).to_string()));
    // Co-measured studies only: the energy over every node.
    let co = !nodes.is_empty();
    if co {
        header.extend(["nodes".to_string(), "energy_nodes_j".into(), "energy_nodes_valid".into()]);
    }
    w.write_record(&header).map_err(csv_err)?;
    for r in rows {
        let mut rec: Vec<String> = vec![r.trial.to_string(), r.repeat.to_string(), r.state.to_string()];
        rec.extend(names.iter().map(|n| opt(&r.params.get(*n))));
        rec.extend([
            opt(&r.objective),
            opt(&r.wall_us),
            opt(&r.energy_j),
            opt(&r.energy_source),
            opt(&r.energy_valid),
            opt(&r.agent),
            opt(&r.attempt),
            r.attempts.to_string(),
            opt(&r.exit),
            opt(&r.rank.map(|p| p.0)),
            opt(&r.rank.map(|p| p.1)),
            opt(&r.rank.map(|p| p.2)),
        ]);
        if co {
            let (mine, sum, valid) = with_nodes(r, nodes);
            rec.extend([mine.len().to_string(), opt(&sum), opt(&valid)]);
        }
        w.write_record(&rec).map_err(csv_err)?;
    }
    w.flush().map_err(|source| StoreError::Write { study: study.to_string(), source })
}

fn write_json(study: &str, rows: &[ExportRow], nodes: &[NodeRow], out: &mut impl Write) -> Result<()> {
    let values: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (mine, sum, valid) = with_nodes(r, nodes);
            let params: serde_json::Map<String, serde_json::Value> =
                r.params.iter().map(|(k, v)| (k.clone(), param_value_json(v))).collect();
            serde_json::json!({
                "trial": r.trial,
                "repeat": r.repeat,
                "state": r.state.as_str(),
                "params": params,
                "objective": r.objective,
                "wall_us": r.wall_us,
                "energy_j": r.energy_j,
                "energy_source": r.energy_source,
                "energy_valid": r.energy_valid,
                "agent": r.agent,
                "attempt": r.attempt,
                "attempts": r.attempts,
                "exit": r.exit,
                "rank": r.rank.map(|p| p.0),
                "config_mean": r.rank.map(|p| p.1),
                "config_runs": r.rank.map(|p| p.2),
                "measurement": r.measurement,
                "nodes": mine,
                "energy_nodes_j": sum,
                "energy_nodes_valid": valid,
            })
        })
        .collect();
    serde_json::to_writer_pretty(&mut *out, &values)
        .map_err(|source| StoreError::Json { context: format!("exporting study {study:?}"), source })?;
    out.write_all(b"\n").map_err(|source| StoreError::Write { study: study.to_string(), source })
}
