//! End to end with real processes: a coordinator (embedded broker on a port
//! the OS chose, or Debian's mosquitto), agent processes, the real training
//! workload, and the SQLite store read back with plain SQL.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rusqlite::Connection;
use tunefleet_tests::mosquitto::{Mosquitto, FLEET_OPTIONS};
use tunefleet_tests::*;

struct StoredResult {
    trial: i64,
    agent: String,
    objective: Option<f64>,
    measurement: serde_json::Value,
}

fn stored_results(store: &Path, study: &str) -> Vec<StoredResult> {
    let db = Connection::open(store).expect("open store");
    let mut stmt = db
        .prepare("SELECT trial, agent, objective, measurement FROM results WHERE study = ?1 ORDER BY trial")
        .expect("prepare");
    stmt.query_map([study], |r| {
        let m: String = r.get(3)?;
        Ok(StoredResult {
            trial: r.get(0)?,
            agent: r.get(1)?,
            objective: r.get(2)?,
            measurement: serde_json::from_str(&m).expect("measurement json"),
        })
    })
    .expect("query")
    .map(|r| r.expect("row"))
    .collect()
}

fn attempts_by(store: &Path, agent: &str) -> i64 {
    let db = Connection::open(store).expect("open store");
    db.query_row("SELECT COUNT(*) FROM attempts WHERE agent = ?1", [agent], |r| r.get(0)).expect("count")
}

/// Every trial stored exactly once, with metrics, counters and energy.
fn assert_complete(store: &Path, study: &str, trials: i64, allowed_agents: &[&str]) {
    let results = stored_results(store, study);
    let ids: Vec<i64> = results.iter().map(|r| r.trial).collect();
    assert_eq!(ids, (0..trials).collect::<Vec<_>>(), "each trial exactly once");
    for r in &results {
        assert!(allowed_agents.contains(&r.agent.as_str()), "trial {} ran on {}", r.trial, r.agent);
        let m = &r.measurement;
        assert_eq!(m["exit"], serde_json::json!({"Exited": 0}), "trial {}: {m}", r.trial);
        let acc = m["final_metrics"]["accuracy"].as_f64().expect("accuracy reported");
        assert!((0.0..=1.0).contains(&acc));
        assert_eq!(r.objective, Some(acc), "objective is the reported accuracy");
        assert_eq!(m["epochs"].as_array().map(Vec::len), Some(3), "three epochs reported");
        let counters = m["counters"].as_array().expect("counters");
        let task_clock = counters.iter().find(|c| c["event"] == "task-clock").expect("task-clock counted");
        assert!(task_clock["value"].as_u64().unwrap_or(0) > 0, "task-clock > 0");
        assert_eq!(task_clock["kind"], "Software");
        assert_eq!(m["energy"]["source"], "Estimated", "no meter here: labelled estimate");
        assert!(m["energy"]["joules"].as_f64().unwrap_or(0.0) > 0.0);
        assert!(m["wall_us"].as_u64().unwrap_or(0) > 0);
    }
}

#[test]
fn study_of_12_trials_on_embedded_broker_with_two_agents_and_a_selector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("embedded");
    let study = train_study(dir.path(), "e2e", 12, "[selector]\ntags = { pool = \"it\" }");
    let store = dir.path().join("store.db");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let _a1 = start_agent(&url, "it-agent-1", &root, &["--tag", "pool=it"]);
    let _a2 = start_agent(&url, "it-agent-2", &root, &["--tag", "pool=it", "--tag", "extra=yes"]);
    let _outsider = start_agent(&url, "other-pool", &root, &["--tag", "pool=batch"]);
    let status = coord.wait_exit(Duration::from_secs(240));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    assert!(out.contains("12/12 trials done, 0 failed"), "{out}");
    assert_complete(&store, "e2e", 12, &["it-agent-1", "it-agent-2"]);
    assert_eq!(attempts_by(&store, "other-pool"), 0, "the agent with the wrong tag got nothing");
    assert_agents_spools_empty(&["it-agent-1", "it-agent-2", "other-pool"]);
    let db = Connection::open(&store).expect("open");
    let agents: i64 = db.query_row("SELECT COUNT(*) FROM agents", [], |r| r.get(0)).expect("agents");
    assert_eq!(agents, 3, "all three agents announced themselves");
    let progress: i64 = db.query_row("SELECT COUNT(*) FROM progress", [], |r| r.get(0)).expect("progress");
    assert!(progress >= 12 * 3, "per-epoch progress stored ({progress})");

    // The results can be read back through the CLI.
    let (code, best, err) = run({
        let mut c = Command::new(bin("tunefleet"));
        c.args(["best", "e2e", "-n", "3", "--store"]).arg(&store);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    // Three trials (each may carry a line of what disturbed it, and a note).
    assert_eq!(best.lines().filter(|l| l.starts_with("trial ")).count(), 3, "{best}");
    // Which parameters mattered, over the 12 ranked trials.
    let importance = best.lines().find(|l| l.starts_with("importance (")).unwrap_or_else(|| panic!("{best}"));
    assert!(importance.contains("over 12 trials") && importance.contains("lr "), "{importance}");
    let (code, csv, err) = run({
        let mut c = Command::new(bin("tunefleet"));
        c.args(["export", "e2e", "--format", "csv", "--store"]).arg(&store);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(csv.lines().count(), 13, "header + 12 rows:\n{csv}");

    // The listings' --json parses and matches the store.
    let json = |args: &[&str]| -> serde_json::Value {
        let (code, out, err) = run({
            let mut c = Command::new(bin("tunefleet"));
            c.args(args).arg("--json").arg("--store").arg(&store);
            c
        });
        assert_eq!(code, Some(0), "{args:?}: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?} --json is not JSON ({e}): {out}"))
    };
    let studies = json(&["studies"]);
    let (state, total, done): (String, i64, i64) = db
        .query_row(
            "SELECT s.state, COUNT(*), SUM(t.state = 'done') FROM studies s JOIN trials t ON t.study = s.name \
             WHERE s.name = 'e2e' GROUP BY s.name",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("study");
    assert_eq!(studies.as_array().map(Vec::len), Some(1), "{studies}");
    let s = &studies[0];
    assert_eq!(
        (&s["name"], &s["state"], &s["total"], &s["done"]),
        (&"e2e".into(), &state.into(), &total.into(), &done.into())
    );
    let agents = json(&["agents"]);
    let mut names: Vec<&str> = agents.as_array().expect("a list").iter().filter_map(|a| a["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["it-agent-1", "it-agent-2", "other-pool"], "{agents}");
    for a in agents.as_array().expect("a list") {
        let stored: String =
            db.query_row("SELECT info FROM agents WHERE name = ?1", [a["name"].as_str()], |r| r.get(0)).expect("agent");
        let stored: serde_json::Value = serde_json::from_str(&stored).expect("info");
        assert_eq!(a["info"], stored, "the agent's announcement as stored");
    }
    let best = json(&["best", "e2e", "-n", "3"]);
    assert_eq!(best["view"], "ranked", "{best}");
    let shown: Vec<(i64, f64, String)> = best["trials"]
        .as_array()
        .expect("trials")
        .iter()
        .map(|t| {
            let agent = t["agent"].as_str().expect("agent").to_string();
            (t["trial"].as_i64().expect("trial"), t["objective"].as_f64().expect("objective"), agent)
        })
        .collect();
    let mut stored: Vec<(i64, f64, String)> =
        stored_results(&store, "e2e").into_iter().filter_map(|r| r.objective.map(|o| (r.trial, o, r.agent))).collect();
    // Accuracy is maximised: the best first, ties by trial.
    stored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    stored.truncate(3);
    assert_eq!(shown, stored, "{best}");
    // Parameters are plain JSON values, as the store keeps them (not
    // `{"lr":{"Float":0.1}}`).
    for t in best["trials"].as_array().expect("trials") {
        let trial = t["trial"].as_i64().expect("trial");
        let kept: String = db
            .query_row("SELECT params FROM trials WHERE study = 'e2e' AND trial = ?1", [trial], |r| r.get(0))
            .expect("params");
        let kept: serde_json::Value = serde_json::from_str(&kept).expect("params JSON");
        assert_eq!(t["params"], kept, "{best}");
    }
}

#[test]
fn same_study_against_an_external_mosquitto() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mosquitto = Mosquitto::start(dir.path(), FLEET_OPTIONS);
    let url = mosquitto.url();
    let root = unique_root("mosquitto");
    let study = train_study(dir.path(), "ext", 12, "");
    let store = dir.path().join("store.db");
    let (mut coord, printed) = start_coordinator(&study, &store, &root, &["--broker", &url]);
    assert_eq!(printed, url);
    let _a1 = start_agent(&url, "m-agent-1", &root, &[]);
    let _a2 = start_agent(&url, "m-agent-2", &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(240));
    assert!(status.success(), "coordinator failed: {status:?}");
    assert_complete(&store, "ext", 12, &["m-agent-1", "m-agent-2"]);
    assert_agents_spools_empty(&["m-agent-1", "m-agent-2"]);
}

/// A configuration is measured again until its objective is stable.
#[test]
fn repeats_until_the_spread_is_below_the_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("stable");
    // Runs 0 and 1 report 90 and 110 (spread 14 %), run 2 reports 100:
    // three runs have a spread of 10 %, under the bound of 12 %.
    let text = r#"name = "stable"
command = ["sh", "-c", "echo TUNEFLEET final v=$(( {repeat} == 0 ? 90 : ({repeat} == 1 ? 110 : 100) ))"]
timeout = 30
repeats = 2
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 2
[strategy]
kind = "grid"
[hyper.x]
kind = "categorical"
values = [1]
[stability]
spread = 0.12
max_repeats = 6
"#;
    let study = dir.path().join("stable.toml");
    std::fs::write(&study, text).expect("study");
    let store = dir.path().join("s.db");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let name = format!("{root}-agent");
    let _agent = start_agent(&url, &name, &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("3/3 trials done"), "two planned runs and one more: {out}");
    let mut best = Command::new(bin("tunefleet"));
    best.args(["best", "stable", "--store"]).arg(&store);
    let (code, text, err) = run(best);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("100.000000") && text.contains("10.00 %") && text.contains("3 runs"), "{text}");
    assert_agents_spools_empty(&[&name]);
}
