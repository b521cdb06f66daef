//! A study written as an Optuna journal (`tunefleet export --format
//! optuna`): the log `optuna.storages.JournalStorage` replays, so
//! `optuna.load_study` and optuna-dashboard open a Tunefleet study as they
//! open one of their own. One study-creation line (its directions: the
//! objective's, then each `also` figure minimised), then one trial-creation
//! line per trial with its state, values, start and end times, parameters
//! in Optuna's internal form with their distributions, the objective at
//! each stored epoch as intermediate values, and as user attributes what
//! Optuna has no field for: the energy with its source, the agent, the
//! wall time, the exit.
//!
//! The journal's format is Optuna's (5.x, `JournalOperation`); it is
//! written, never read, here.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use serde_json::{json, Map, Value};
use tunefleet_common::params::ParamValue;

use super::export::ExportError;
use crate::domain::study::{Direction, ParamSpec, Study};
use crate::store::{AttemptTimes, ProgressRow, Store, StoreError, TrialRecord, TrialState};

/// Optuna's journal operation codes (`JournalOperation`).
const CREATE_STUDY: u8 = 0;
const SET_STUDY_USER_ATTR: u8 = 2;
const CREATE_TRIAL: u8 = 4;
/// Optuna's `StudyDirection` values.
const MINIMIZE: u8 = 1;
const MAXIMIZE: u8 = 2;
/// Optuna's `TrialState` values.
const RUNNING: u8 = 0;
const COMPLETE: u8 = 1;
const PRUNED: u8 = 2;
const FAIL: u8 = 3;
const WAITING: u8 = 4;
/// Who wrote the lines (Optuna keys ownership of running trials by it).
const WORKER: &str = "tunefleet-export";

/// Optuna's JSON of the distribution of `spec` (`distribution_to_json`).
pub fn distribution(spec: &ParamSpec) -> Value {
    match spec {
        ParamSpec::Categorical { values } => {
            let choices: Vec<Value> = values.iter().map(value_json).collect();
            json!({"name": "CategoricalDistribution", "attributes": {"choices": choices}})
        }
        ParamSpec::Int { low, high, step } => {
            json!({"name": "IntDistribution", "attributes": {"log": false, "step": step, "low": low, "high": high}})
        }
        ParamSpec::Float { low, high, .. } => {
            json!({"name": "FloatDistribution", "attributes": {"step": null, "low": low, "high": high, "log": false}})
        }
        ParamSpec::LogFloat { low, high, .. } => {
            json!({"name": "FloatDistribution", "attributes": {"step": null, "low": low, "high": high, "log": true}})
        }
    }
}

fn value_json(v: &ParamValue) -> Value {
    match v {
        ParamValue::Int(i) => json!(i),
        ParamValue::Float(f) => json!(f),
        ParamValue::Text(t) => json!(t),
    }
}

/// `v` in Optuna's internal form under `spec`: a number, or a category's index.
pub fn internal(spec: &ParamSpec, v: &ParamValue) -> Option<f64> {
    match spec {
        ParamSpec::Categorical { values } => values.iter().position(|c| c == v).map(|i| i as f64),
        _ => v.as_f64(),
    }
}

/// Unix milliseconds as ISO 8601 with microseconds, as Optuna writes them.
fn iso(ms: u64) -> Option<String> {
    let text = crate::report::utc(ms);
    let (date, rest) = text.split_once(' ')?;
    let time = rest.strip_suffix(" UTC")?;
    Some(format!("{date}T{time}.{:03}000+00:00", ms % 1000))
}

/// Writes `study` as an Optuna journal to `out`.
pub fn write(store: &Store, study: &Study, rows: &[TrialRecord], out: &mut impl Write) -> Result<(), ExportError> {
    let name = &study.name;
    let dir = |d: Direction| if d == Direction::Maximize { MAXIMIZE } else { MINIMIZE };
    let directions: Vec<u8> =
        std::iter::once(dir(study.objective.direction)).chain(study.objective.also.iter().map(|_| MINIMIZE)).collect();
    let mut lines = vec![
        json!({"op_code": CREATE_STUDY, "worker_id": WORKER, "study_name": name, "directions": directions}),
        json!({"op_code": SET_STUDY_USER_ATTR, "worker_id": WORKER, "study_id": 0,
               "user_attr": {"tunefleet_metric": study.objective.metric}}),
    ];
    let specs: BTreeMap<&str, &ParamSpec> = study.parameters().collect();
    let times = store.attempt_times(name)?;
    let mut epochs: HashMap<(u64, u32), BTreeMap<String, f64>> = HashMap::new();
    for p in store.study_progress(name)? {
        let ProgressRow { trial, attempt, epoch, metrics, .. } = p;
        if let Some(v) = metrics.get(&study.objective.metric).filter(|v| v.is_finite()) {
            epochs.entry((trial, attempt)).or_default().insert(epoch.to_string(), *v);
        }
    }
    for r in rows {
        lines.push(trial_line(study, &specs, r, &times, &epochs));
    }
    let study_err = |source| ExportError::Write { study: name.clone(), source };
    for line in lines {
        let text = serde_json::to_string(&line)
            .map_err(|source| ExportError::Json { context: format!("study {name:?} as an Optuna journal"), source })?;
        writeln!(out, "{text}").map_err(study_err)?;
    }
    out.flush().map_err(study_err)
}

fn trial_line(
    study: &Study,
    specs: &BTreeMap<&str, &ParamSpec>,
    r: &TrialRecord,
    times: &AttemptTimes,
    epochs: &HashMap<(u64, u32), BTreeMap<String, f64>>,
) -> Value {
    let (o, trial) = (r.result.as_ref(), r.plan.trial);
    let values: Option<Vec<f64>> = o.and_then(|o| {
        let also = study.also_figures(o.energy.joules, o.wall_us);
        o.objective.map(|v| std::iter::once(v).chain(also).collect())
    });
    let finite = values.as_ref().is_some_and(|v| v.iter().all(|x| x.is_finite()));
    let state = match r.state {
        TrialState::Done if finite => COMPLETE,
        TrialState::Done | TrialState::Failed => FAIL,
        TrialState::Stopped => PRUNED,
        TrialState::Running => RUNNING,
        TrialState::Pending => WAITING,
    };
    let attempt = o.map_or(0, |o| o.attempt);
    let (start, end) = times.get(&(trial, attempt)).copied().map_or((None, None), |(s, e)| (Some(s), e));
    let mut distributions = Map::new();
    let mut params = Map::new();
    for (name, v) in &r.plan.params {
        let Some(spec) = specs.get(name.as_str()) else { continue };
        let Some(x) = internal(spec, v) else { continue };
        distributions.insert(name.clone(), Value::String(distribution(spec).to_string()));
        params.insert(name.clone(), json!(x));
    }
    let mut user = Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() {
            user.insert(k.to_string(), v);
        }
    };
    put("energy_j", json!(o.and_then(|o| o.energy.joules)));
    put("energy_source", json!(o.and_then(|o| o.energy.source_name())));
    put("energy_valid", json!(o.map(|o| o.energy.valid)));
    put("agent", json!(o.map(|o| &o.agent)));
    put("wall_time_s", json!(o.map(|o| o.wall_us as f64 / 1e6)));
    put("exit", json!(o.map(|o| &o.exit)));
    put("repeat", json!(r.plan.repeat));
    put("tunefleet_trial", json!(trial));
    let mut line = json!({
        "op_code": CREATE_TRIAL,
        "worker_id": WORKER,
        "study_id": 0,
        "state": state,
        "datetime_start": start.and_then(iso),
        "distributions": distributions,
        "params": params,
        "user_attrs": user,
        "system_attrs": {},
        "intermediate_values": epochs.get(&(trial, attempt)).cloned().unwrap_or_default(),
    });
    if let Some(obj) = line.as_object_mut() {
        match (&values, state) {
            (Some(v), COMPLETE) if v.len() > 1 => {
                obj.insert("value".into(), Value::Null);
                obj.insert("values".into(), json!(v));
            }
            (Some(v), COMPLETE) => {
                obj.insert("value".into(), json!(v[0]));
                obj.insert("values".into(), Value::Null);
            }
            _ => {
                obj.insert("value".into(), Value::Null);
                obj.insert("values".into(), Value::Null);
            }
        }
        if let Some(end) = end.filter(|_| state != RUNNING && state != WAITING).and_then(iso) {
            obj.insert("datetime_complete".into(), json!(end));
        }
    }
    line
}

/// Writes study `name` of `store` as an Optuna journal to `out`.
pub fn export(store: &Store, name: &str, out: &mut impl Write) -> Result<(), ExportError> {
    let study =
        store.stored(name)?.and_then(|s| s.study()).ok_or_else(|| StoreError::UnknownStudy(name.to_string()))?;
    write(store, &study, &store.trials(name)?, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distributions_and_values_are_optunas() {
        let cat = ParamSpec::Categorical { values: vec![ParamValue::Text("x".into()), ParamValue::Text("y".into())] };
        assert_eq!(
            distribution(&cat).to_string(),
            r#"{"attributes":{"choices":["x","y"]},"name":"CategoricalDistribution"}"#
        );
        assert_eq!(internal(&cat, &ParamValue::Text("y".into())), Some(1.0), "a category is its index");
        assert_eq!(internal(&cat, &ParamValue::Text("z".into())), None);
        let int = ParamSpec::Int { low: 1, high: 7, step: 3 };
        assert_eq!(distribution(&int)["attributes"]["step"], json!(3));
        assert_eq!(internal(&int, &ParamValue::Int(4)), Some(4.0));
        let log = ParamSpec::LogFloat { low: 1e-4, high: 1e-1, grid: 0 };
        assert_eq!(distribution(&log)["attributes"]["log"], json!(true));
        assert_eq!(iso(1_700_000_000_123).as_deref(), Some("2023-11-14T22:13:20.123000+00:00"));
    }
}
