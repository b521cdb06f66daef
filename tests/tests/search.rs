//! The Gaussian-process search (`kind = "gp"`) with real processes
//!: `tunefleet run`, one agent, each trial an `awk` or `sh`
//! process reporting its value.

use std::time::Duration;

use tunefleet_tests::*;

/// `(trial, x, y, objective)` of every trial with a result, in trial order.
fn trials(store: &std::path::Path, study: &str) -> Vec<(i64, f64, f64, f64)> {
    query(
        store,
        &format!(
            "SELECT t.trial, json_extract(t.params, '$.x'), json_extract(t.params, '$.y'), r.objective
             FROM trials t JOIN results r ON r.study = t.study AND r.trial = t.trial
             WHERE t.study = '{study}' AND r.objective IS NOT NULL ORDER BY t.trial"
        ),
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )
}

/// A `kind = "gp"` study of `x` and `y` in [0, 1] minimising the metric
/// `v` (and `also`), 30 trials, written to `dir`; its path.
fn xy_study(dir: &std::path::Path, name: &str, command: &str, also: &str, seed: u64) -> std::path::PathBuf {
    let text = format!(
        r#"name = "{name}"
command = {command}
timeout = 30
[objective]
metric = "v"
direction = "minimize"
{also}
[budget]
trials = 30
[strategy]
kind = "gp"
seed = {seed}
[hyper.x]
kind = "float"
low = 0
high = 1
[hyper.y]
kind = "float"
low = 0
high = 1
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("study");
    path
}

#[test]
fn a_gp_study_on_four_slots_learns_from_every_result_and_never_repeats_a_configuration() {
    // A bowl on [0, 1]^2 with its minimum 0 at (0.3, 0.7). Random sampling
    // gets below 1e-3 within 30 trials about once in ten studies; a model
    // told every result gets there on every seed tried (the engine tells
    // the search what the agent measured, in whatever order four slots
    // finish).
    let dir = tempfile::tempdir().expect("tempdir");
    let command = r#"["awk", "-v", "x={x}", "-v", "y={y}", "BEGIN {{ printf \"TUNEFLEET epoch=1 v=%.17g\\n\", (x - 0.3) ^ 2 + (y - 0.7) ^ 2 }}"]"#;
    let study = xy_study(dir.path(), "bowl", command, "", 4);
    let store = dir.path().join("store.db");
    let out = run_with_one_agent(&study, &store, "gp-bowl", &["--slots", "4"], Duration::from_secs(300));
    let rows = trials(&store, "bowl");
    assert_eq!(rows.len(), 30, "{out}");
    let best = rows.iter().map(|r| r.3).fold(f64::INFINITY, f64::min);
    assert!(best < 1e-3, "best {best} after 30 trials: the model did not learn\n{rows:?}");
    for (i, a) in rows.iter().enumerate() {
        for b in &rows[i + 1..] {
            assert!((a.1, a.2) != (b.1, b.2), "trials {} and {} asked the same configuration", a.0, b.0);
        }
    }
}

#[test]
fn a_gp_study_with_wall_time_also_searches_the_front_of_both() {
    // v = x + y is minimised, and so is the wall time, which the trial
    // spends as (1 - x) / 5 seconds: the front trades x against time at
    // y = 0. Searching v alone would pile up at x = 0; random sampling
    // would leave y anywhere. The later trials must spread along x and
    // keep y small: the wall time each agent measured reached the model.
    let dir = tempfile::tempdir().expect("tempdir");
    let command = r#"["sh", "-c", "sleep $(awk -v x={x} 'BEGIN {{ printf \"%.3f\", (1 - x) / 5 }}'); awk -v x={x} -v y={y} 'BEGIN {{ printf \"TUNEFLEET epoch=1 v=%.17g\\n\", x + y }}'"]"#;
    let study = xy_study(dir.path(), "front", command, "also = [\"wall_time\"]", 2);
    let store = dir.path().join("store.db");
    let out = run_with_one_agent(&study, &store, "gp-front", &["--slots", "2"], Duration::from_secs(300));
    let rows = trials(&store, "front");
    assert_eq!(rows.len(), 30, "{out}");
    let late = &rows[15..];
    let mut ys: Vec<f64> = late.iter().map(|r| r.2).collect();
    ys.sort_by(f64::total_cmp);
    let xs = late.iter().map(|r| r.1);
    let spread = xs.clone().fold(f64::NEG_INFINITY, f64::max) - xs.fold(f64::INFINITY, f64::min);
    assert!(ys[ys.len() / 2] < 0.15, "the later trials keep y small (median {}): {late:?}", ys[ys.len() / 2]);
    assert!(spread > 0.4, "the later trials spread along the front (x spread {spread}): {late:?}");
}
