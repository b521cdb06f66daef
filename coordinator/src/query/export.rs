//! A study's trials exported as CSV or JSON (`tunefleet export`): the
//! store's rows ([`Store::export_rows`]), the one ranking
//! ([`crate::domain::rank`], through [`Store::best`]) and each trial's
//! energy over its co-measuring nodes ([`tunefleet_common::measurement::EnergyFigure::with_parts`]).

use std::io::Write;

use crate::store::{param_value_json, ExportRow, NodeRow, Store, StoreError};

/// Format of [`export`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// One row per trial, one column per parameter.
    Csv,
    /// An array of objects, one per trial, with the full measurement.
    Json,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("exporting study {study:?}: {source}")]
    Csv { study: String, source: csv::Error },
    #[error("{context}: {source}")]
    Json { context: String, source: serde_json::Error },
    #[error("exporting study {study:?}: {source}")]
    Write { study: String, source: std::io::Error },
}

/// Writes one row per trial of `study` to `out`.
///
/// CSV columns: `trial, repeat, state`, one column per parameter (named
/// after it, prefixed `param_` if it collides with a fixed column),
/// `objective, wall_us, energy_j, energy_source, energy_valid, agent,
/// attempt, attempts, exit, rank, config_mean, config_runs` (the one
/// ranking rule, [`crate::domain::rank`]: the trial's place among the
/// ranked ones, its configuration's mean and runs; empty when not
/// ranked), and for a study measured on several nodes
/// (`[measure] nodes`) `nodes, energy_nodes_j, energy_nodes_valid`, and
/// for a study whose trials were given GPUs `gpu_energy_j` (their part of
/// `energy_j`, the trial's whole energy), and for a study with
/// `[[constraint]]`s `feasible, violation` (its result meets them; how
/// far it misses them, summed: Optuna's rule).
/// JSON: an array of objects with the same fields, `params` as an
/// object, the full `measurement` (or null), and `nodes`: what each
/// other node measured of the stored attempt.
pub fn export(store: &Store, study: &str, format: ExportFormat, out: &mut impl Write) -> Result<(), ExportError> {
    let (rows, nodes) = read(store, study)?;
    match format {
        ExportFormat::Csv => write_csv(study, &rows, &nodes, out),
        ExportFormat::Json => write_json(study, &json_values(&rows, &nodes), out),
    }
}

/// The objects `export --format json` writes, as values (the page's API serves them).
pub fn json(store: &Store, study: &str) -> Result<Vec<serde_json::Value>, StoreError> {
    let (rows, nodes) = read(store, study)?;
    Ok(json_values(&rows, &nodes))
}

/// The ranked rows of `study` and what other nodes measured of them.
fn read(store: &Store, study: &str) -> Result<(Vec<ExportRow>, Vec<NodeRow>), StoreError> {
    if store.study(study)?.is_none() {
        return Err(StoreError::UnknownStudy(study.to_string()));
    }
    Ok((ranked_rows(store, study)?, store.node_measurements(study)?))
}

/// Every trial of `study` with its accepted result and its place by the
/// one ranking rule: the rows `export` writes (the live page's study views
/// draw them too).
pub fn ranked_rows(store: &Store, study: &str) -> Result<Vec<ExportRow>, StoreError> {
    let mut rows = store.export_rows(study)?;
    let ranked = store.best(study, usize::MAX)?;
    let places: std::collections::HashMap<u64, (u64, f64, u32)> =
        ranked.iter().enumerate().map(|(i, r)| (r.trial, (i as u64 + 1, r.mean, r.runs))).collect();
    for r in &mut rows {
        r.rank = places.get(&r.trial).copied();
    }
    Ok(rows)
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
    let all = r.energy().with_parts(mine.iter().map(|n| n.energy()));
    (mine, all.joules, Some(all.valid))
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn write_csv(study: &str, rows: &[ExportRow], nodes: &[NodeRow], out: &mut impl Write) -> Result<(), ExportError> {
    let names: std::collections::BTreeSet<&str> =
        rows.iter().flat_map(|r| r.params.keys().map(String::as_str)).collect();
    let csv_err = |source| ExportError::Csv { study: study.to_string(), source };
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
    // Studies whose trials had GPUs only: their part.
    let gpus = rows.iter().any(|r| r.gpu_energy_j.is_some());
    if gpus {
        header.push("gpu_energy_j".into());
    }
    // Constrained studies only.
    let constrained = rows.iter().any(|r| r.violation.is_some());
    if constrained {
        header.extend(["feasible".to_string(), "violation".into()]);
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
        if gpus {
            rec.push(opt(&r.gpu_energy_j));
        }
        if constrained {
            rec.extend([opt(&r.violation.map(|v| v == 0.0)), opt(&r.violation)]);
        }
        w.write_record(&rec).map_err(csv_err)?;
    }
    w.flush().map_err(|source| ExportError::Write { study: study.to_string(), source })
}

fn json_values(rows: &[ExportRow], nodes: &[NodeRow]) -> Vec<serde_json::Value> {
    rows.iter()
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
                "gpu_energy_j": r.gpu_energy_j,
                "feasible": r.violation.map(|v| v == 0.0),
                "violation": r.violation,
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
        .collect()
}

fn write_json(study: &str, values: &[serde_json::Value], out: &mut impl Write) -> Result<(), ExportError> {
    serde_json::to_writer_pretty(&mut *out, values)
        .map_err(|source| ExportError::Json { context: format!("exporting study {study:?}"), source })?;
    out.write_all(b"\n").map_err(|source| ExportError::Write { study: study.to_string(), source })
}
