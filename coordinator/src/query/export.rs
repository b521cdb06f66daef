//! A study's trials exported as CSV or JSON (`tunefleet export`): the
//! store's trial records ([`Store::trials_read`]), the one ranking
//! ([`crate::domain::rank`], through [`Store::best`]) and each trial's
//! energy over its co-measuring nodes ([`tunefleet_common::measurement::EnergyFigure::with_parts`]).

use std::io::Write;

use crate::store::{param_value_json, Measured, NodeRow, Outcome, Store, StoreError, TrialRecord};

/// A trial as `export` writes it: its record, and its place by the one
/// ranking rule with its configuration's mean and runs (none when not
/// ranked).
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub record: TrialRecord,
    pub rank: Option<(u64, f64, u32)>,
}

impl Exported {
    /// Its accepted result, if any.
    pub fn result(&self) -> Option<&Outcome> {
        self.record.result.as_ref()
    }
}

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
fn read(store: &Store, study: &str) -> Result<(Vec<Exported>, Vec<NodeRow>), StoreError> {
    if store.study(study)?.is_none() {
        return Err(StoreError::UnknownStudy(study.to_string()));
    }
    Ok((ranked_rows(store, study, Measured::With)?, store.node_measurements(study)?))
}

/// Every trial of `study` with its accepted result (its measurement read
/// as `measured` says) and its place by the one ranking rule: the rows
/// `export` writes (the live page's study views draw them too, without
/// the measurements).
pub fn ranked_rows(store: &Store, study: &str, measured: Measured) -> Result<Vec<Exported>, StoreError> {
    let ranked = store.best(study, usize::MAX)?;
    let places: std::collections::HashMap<u64, (u64, f64, u32)> =
        ranked.iter().enumerate().map(|(i, r)| (r.plan.trial, (i as u64 + 1, r.mean, r.runs))).collect();
    Ok(store
        .trials_read(study, measured)?
        .into_iter()
        .map(|record| Exported { rank: places.get(&record.plan.trial).copied(), record })
        .collect())
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
fn with_nodes<'a>(r: &Exported, nodes: &'a [NodeRow]) -> (Vec<&'a NodeRow>, Option<f64>, Option<bool>) {
    // `nodes` is sorted by trial and attempt (`Store::node_measurements`).
    let Some(result) = r.result() else { return (Vec::new(), None, None) };
    let key = (r.record.plan.trial, result.attempt);
    let first = nodes.partition_point(|n| (n.trial, n.attempt) < key);
    let mine: Vec<&NodeRow> = nodes[first..].iter().take_while(|n| (n.trial, n.attempt) == key).collect();
    if mine.is_empty() {
        return (mine, None, None);
    }
    let all = result.energy.figure().with_parts(mine.iter().map(|n| n.energy()));
    (mine, all.joules, Some(all.valid))
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn write_csv(study: &str, rows: &[Exported], nodes: &[NodeRow], out: &mut impl Write) -> Result<(), ExportError> {
    let names: std::collections::BTreeSet<&str> =
        rows.iter().flat_map(|r| r.record.plan.params.keys().map(String::as_str)).collect();
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
    let gpus = rows.iter().any(|r| r.result().is_some_and(|o| o.gpu_energy_j.is_some()));
    if gpus {
        header.push("gpu_energy_j".into());
    }
    // Constrained studies only.
    let constrained = rows.iter().any(|r| r.result().is_some_and(|o| o.violation.is_some()));
    if constrained {
        header.extend(["feasible".to_string(), "violation".into()]);
    }
    w.write_record(&header).map_err(csv_err)?;
    for r in rows {
        let (t, o) = (&r.record, r.result());
        let mut rec: Vec<String> = vec![t.plan.trial.to_string(), t.plan.repeat.to_string(), t.state.to_string()];
        rec.extend(names.iter().map(|n| opt(&t.plan.params.get(*n))));
        rec.extend([
            opt(&o.and_then(|o| o.objective)),
            opt(&o.map(|o| o.wall_us)),
            opt(&o.and_then(|o| o.energy.joules)),
            opt(&o.and_then(|o| o.energy.source_name())),
            opt(&o.map(|o| o.energy.valid)),
            opt(&o.map(|o| &o.agent)),
            opt(&o.map(|o| o.attempt)),
            t.attempts.to_string(),
            opt(&o.map(|o| &o.exit)),
            opt(&r.rank.map(|p| p.0)),
            opt(&r.rank.map(|p| p.1)),
            opt(&r.rank.map(|p| p.2)),
        ]);
        if co {
            let (mine, sum, valid) = with_nodes(r, nodes);
            rec.extend([mine.len().to_string(), opt(&sum), opt(&valid)]);
        }
        if gpus {
            rec.push(opt(&o.and_then(|o| o.gpu_energy_j)));
        }
        if constrained {
            let violation = o.and_then(|o| o.violation);
            rec.extend([opt(&violation.map(|v| v == 0.0)), opt(&violation)]);
        }
        w.write_record(&rec).map_err(csv_err)?;
    }
    w.flush().map_err(|source| ExportError::Write { study: study.to_string(), source })
}

fn json_values(rows: &[Exported], nodes: &[NodeRow]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|r| {
            let (mine, sum, valid) = with_nodes(r, nodes);
            let (t, o) = (&r.record, r.result());
            let params: serde_json::Map<String, serde_json::Value> =
                t.plan.params.iter().map(|(k, v)| (k.clone(), param_value_json(v))).collect();
            let violation = o.and_then(|o| o.violation);
            serde_json::json!({
                "trial": t.plan.trial,
                "repeat": t.plan.repeat,
                "state": t.state.as_str(),
                "params": params,
                "objective": o.and_then(|o| o.objective),
                "wall_us": o.map(|o| o.wall_us),
                "energy_j": o.and_then(|o| o.energy.joules),
                "energy_source": o.and_then(|o| o.energy.source_name()),
                "energy_valid": o.map(|o| o.energy.valid),
                "gpu_energy_j": o.and_then(|o| o.gpu_energy_j),
                "feasible": violation.map(|v| v == 0.0),
                "violation": violation,
                "agent": o.map(|o| &o.agent),
                "attempt": o.map(|o| o.attempt),
                "attempts": t.attempts,
                "exit": o.map(|o| &o.exit),
                "rank": r.rank.map(|p| p.0),
                "config_mean": r.rank.map(|p| p.1),
                "config_runs": r.rank.map(|p| p.2),
                "measurement": o.and_then(|o| o.measurement_json.as_deref()).and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok()),
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
