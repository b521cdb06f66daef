//! `[[constraint]]` with real coordinator and agent processes:
//! feasible trials rank first in every view (the run's summary, `best`,
//! `status --json`, `export`), the others after by how far they miss;
//! a study with no feasible trial says so and exits 6.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tunefleet_tests::*;

/// [`sleep_study`] (v = 1..=trials, maximised) with `constraint` appended.
fn constrained(dir: &Path, name: &str, trials: u32, constraint: &str) -> PathBuf {
    let path = sleep_study(dir, name, trials, 0.01);
    let text = std::fs::read_to_string(&path).expect("study");
    std::fs::write(&path, format!("{text}\n[[constraint]]\n{constraint}\n")).expect("study");
    path
}

fn status_json(store: &str) -> serde_json::Value {
    let (code, out, err) = tunefleet(&["status", "--json", "--store", store]);
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str(&out).expect("json")
}

#[test]
fn feasible_trials_rank_first_in_every_view_and_the_others_by_how_far_they_miss() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let s = store.to_str().expect("utf-8");
    // Maximised v, but v <= 3: trial 2 (v = 3) is the best feasible one.
    let study = constrained(dir.path(), "capped", 6, "metric = \"v\"\nat_most = 3.0");
    let out = run_with_one_agent(&study, &store, "capped", &[], Duration::from_secs(120));
    let ranked: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("best trials:")).skip(1).take(3).collect();
    assert!(ranked[0].contains("trial    2") && !ranked[0].contains("infeasible"), "{out}");
    assert!(ranked[1].contains("trial    1"), "feasible ones before any other: {out}");
    let (code, best, err) = tunefleet(&["best", "capped", "--store", s, "-n", "6"]);
    assert_eq!(code, Some(0), "{err}");
    let order: Vec<&str> = best.lines().filter(|l| l.starts_with("trial")).collect();
    let trials: Vec<&str> = order.iter().filter_map(|l| l.split_whitespace().nth(1)).collect();
    // Feasible by v (3, 2, 1), then by violation (v = 4 misses by 1, 5 by 2, 6 by 3).
    assert_eq!(trials, ["2", "1", "0", "3", "4", "5"], "{best}");
    assert!(order[3].contains("infeasible (misses its constraints by 1.000000)"), "{best}");
    assert_eq!(status_json(s)[0]["best"][1], 2, "status: the best feasible trial");
    // The report draws the 3 infeasible trials apart, and the best feasible.
    let html = dir.path().join("capped.html");
    let (code, _, err) = tunefleet(&["report", "capped", "--store", s, "--output", html.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    let html = std::fs::read_to_string(&html).expect("report");
    let apart = html.split("class=\"dot infeasible\" d=\"").nth(1).and_then(|d| d.split('"').next()).expect("dots");
    assert_eq!(apart.matches("h0").count(), 3, "{apart}");
    assert!(html.contains("best feasible"), "the legend says what the line is");
    assert_eq!(status_json(s)[0]["best_feasible"], true);
    let (code, csv, err) = tunefleet(&["export", "capped", "--store", s]);
    assert_eq!(code, Some(0), "{err}");
    let mut rows = csv.lines();
    let header: Vec<&str> = rows.next().expect("header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("{name} in {header:?}"));
    let (feasible, violation, rank) = (col("feasible"), col("violation"), col("rank"));
    for row in rows {
        let cells: Vec<&str> = row.split(',').collect();
        let trial: u32 = cells[0].parse().expect("trial");
        let miss = f64::from(trial + 1) - 3.0;
        assert_eq!(cells[feasible], if miss <= 0.0 { "true" } else { "false" }, "{row}");
        assert_eq!(cells[violation].parse::<f64>().expect("violation"), miss.max(0.0), "{row}");
        let want_rank = if miss <= 0.0 { 3 - trial } else { trial + 1 };
        assert_eq!(cells[rank], want_rank.to_string(), "{row}");
    }
}

#[test]
fn a_study_with_no_feasible_trial_says_so_and_exits_6() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = constrained(dir.path(), "unreachable", 4, "metric = \"v\"\nat_least = 100.0");
    let (code, out, log) = run_study_logged(dir.path(), &study, &store, "unreachable");
    assert_eq!(code, Some(6), "{out}\n{log}");
    assert!(log.contains("none meets its constraints"), "{log}");
    // The one that misses least (v = 4, by 96) leads, marked.
    assert!(out.contains("trial    3") && out.contains("infeasible (misses its constraints by 96.000000)"), "{out}");
    let status = status_json(store.to_str().expect("utf-8"));
    assert_eq!(status[0]["best_feasible"], false, "{status}");
    let (_, text, _) = tunefleet(&["status", "--store", store.to_str().expect("utf-8")]);
    assert!(text.contains("infeasible: no trial meets the constraints"), "{text}");
}

/// Time to a target from the epochs a real agent stored: each
/// trial's objective is its time until its accuracy first reached 6; the
/// trial that never did ranks last, missing the target by its best gap.
#[test]
fn time_to_target_counts_up_to_the_first_epoch_that_reached_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = dir.path().join("target.toml");
    // accuracy = epoch * rate: rate 3 reaches 6 at epoch 2, rate 2 at epoch 3, rate 1 never (4 at most).
    let text = r#"name = "target"
command = ["sh", "-c", "for e in 1 2 3 4; do sleep 0.2; echo TUNEFLEET epoch=$e accuracy=$((e * {rate})); done"]
[objective]
metric = "wall_time"
direction = "minimize"
to_target = { metric = "accuracy", at_least = 6.0 }
[budget]
trials = 3
[strategy]
kind = "grid"
[hyper.rate]
kind = "int"
low = 1
high = 3
"#;
    std::fs::write(&study, text).expect("study");
    run_with_one_agent(&study, &store, "target", &["--slots", "1"], Duration::from_secs(120));
    let s = store.to_str().expect("utf-8");
    let (code, best, err) = tunefleet(&["best", "target", "--store", s, "-n", "3"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = best.lines().filter(|l| l.starts_with("trial")).collect();
    let rates: Vec<&str> = lines.iter().filter_map(|l| l.split("rate=").nth(1)?.split_whitespace().next()).collect();
    assert_eq!(rates, ["3", "2", "1"], "{best}");
    assert!(lines[2].contains("infeasible (misses its constraints by 2.000000)"), "{best}");
    // Each objective is the time of the epoch that reached 6, under its whole run.
    let rows: Vec<(f64, f64)> =
        query(&store, "SELECT objective, wall_us / 1e6 FROM results ORDER BY trial", |r| Ok((r.get(0)?, r.get(1)?)));
    let (slow, fast) = (rows[1], rows[2]);
    assert!(fast.0 < slow.0 && slow.0 < slow.1 && fast.0 < fast.1, "{rows:?}");
    assert!(fast.0 >= 0.4 && slow.0 >= 0.6, "two and three epochs of 0.2 s: {rows:?}");
    assert!(rows[0].0 >= rows[0].1 - 1e-6, "never reached: its whole run: {rows:?}");
}

/// Energy (here time) to a target with early stopping: ASHA judges the
/// target's metric at its rungs (the objective is known only when a trial
/// ends), so a trial trailing on the way to the target is stopped at the
/// first rung instead of running its epochs out; the one that reached it
/// is the best. Refused before: `[early_stopping]` with a measured objective.
#[test]
fn early_stopping_judges_the_target_s_metric_and_stops_a_trailing_trial() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = dir.path().join("early.toml");
    // rate 3 reaches 6 at epoch 2; rate 1 reports 1 at epoch 1, behind 3: stopped there.
    let text = r#"name = "early"
command = ["sh", "-c", "for e in 1 2 3 4 5 6 7 8; do sleep 0.3; echo TUNEFLEET epoch=$e accuracy=$((e * {rate})); done"]
[objective]
metric = "wall_time"
direction = "minimize"
to_target = { metric = "accuracy", at_least = 6.0 }
[early_stopping]
kind = "asha"
reduction = 2
grace = 1
[budget]
trials = 2
[strategy]
kind = "grid"
[hyper.rate]
kind = "categorical"
values = [3, 1]
"#;
    std::fs::write(&study, text).expect("study");
    let out = run_with_one_agent(&study, &store, "early-target", &["--slots", "1"], Duration::from_secs(120));
    assert!(out.contains("1 stopped"), "{out}");
    let rows: Vec<(i64, String)> =
        query(&store, "SELECT trial, state FROM trials ORDER BY trial", |r| Ok((r.get(0)?, r.get(1)?)));
    assert_eq!(rows.iter().map(|r| r.1.as_str()).collect::<Vec<_>>(), ["done", "stopped"], "{rows:?}");
    let epochs: i64 = query(&store, "SELECT COUNT(*) FROM progress WHERE trial = 1", |r| r.get(0))[0];
    assert!(epochs < 8, "the trailing trial did not run its epochs out: {epochs}");
    let s = store.to_str().expect("utf-8");
    let (code, best, err) = tunefleet(&["best", "early", "--store", s, "-n", "1"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(best.contains("rate=3"), "{best}");
}
