//! Overload offloading with real processes: two agents confined
//! to different CPUs; burner processes started by the test load one agent's
//! CPU; the coordinator finds it overloaded and moves its trial, or takes a
//! disturbed measurement again elsewhere.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tunefleet_tests::*;

/// The tests of this file load CPUs on purpose and measure load from
/// outside: run alone, one after the other, they do not disturb each other.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    one_at_a_time()
}

/// Busy loops pinned to `cpu`, killed when dropped.
struct Burners(Vec<Child>);

impl Burners {
    fn start(cpu: u32, n: usize) -> Burners {
        Burners(
            (0..n)
                .map(|_| {
                    Command::new("taskset")
                        .args(["-c", &cpu.to_string(), "sh", "-c", "while :; do :; done"])
                        .spawn()
                        .expect("taskset starts a burner")
                })
                .collect(),
        )
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A study of `trials` trials, each reporting an epoch every half second
/// for `epochs` epochs and using almost no CPU itself.
fn slow_study(dir: &Path, name: &str, trials: u32, epochs: u32) -> std::path::PathBuf {
    let values: Vec<String> = (1..=trials).map(|v| v.to_string()).collect();
    let values = values.join(", ");
    let text = format!(
        r#"name = "{name}"
command = ["sh", "-c", "for e in $(seq 1 {epochs}); do sleep 0.5; echo TUNEFLEET epoch=$e v={{v}}; done"]
timeout = 120
max_attempts = 1
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = {trials}
[strategy]
kind = "grid"
[hyper.v]
kind = "categorical"
values = [{values}]
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("study");
    path
}

fn attempts(store: &Path) -> Vec<(i64, i64, String, Option<String>)> {
    let Ok(db) = Connection::open(store) else { return Vec::new() };
    let Ok(mut stmt) = db.prepare("SELECT trial, attempt, agent, outcome FROM attempts ORDER BY trial, attempt") else {
        return Vec::new();
    };
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .map(|rows| rows.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

fn two_cpus() -> bool {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if n < 2 {
        eprintln!("skipped: needs 2 CPUs to confine two agents apart");
    }
    n >= 2
}

#[test]
fn an_agent_loaded_from_outside_loses_its_trial_to_another_and_it_completes_there() {
    if !two_cpus() {
        return;
    }
    let _alone = alone();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("offload");
    let store = dir.path().join("s.db");
    let study = slow_study(dir.path(), "off", 2, 16);
    let (mut coord, url) = start_coordinator(&study, &store, &root, &["--offload"]);
    let (a, b) = (format!("{root}-a"), format!("{root}-b"));
    // This machine also runs the coordinator, the broker and the test: a
    // threshold above their share keeps b's measurements clean.
    // No trial held ahead: a holds the one trial it runs, and exactly that
    // one is moved (a held one is moved too: `sched` unit tests).
    let fast = ["--slots", "1", "--lookahead", "0", "--telemetry-interval", "500ms", "--interference-threshold", "0.5"];
    let _agent_a = start_agent(&url, &a, &root, &[&["--cpus", "0"][..], &fast[..]].concat());
    // Agent b joins once a runs a trial, so the first trial is a's.
    wait_for("a trial on agent a", Duration::from_secs(60), || attempts(&store).iter().any(|r| r.2 == a));
    let _agent_b = start_agent(&url, &b, &root, &[&["--cpus", "1"][..], &fast[..]].concat());
    let load_started = Instant::now();
    let burners = Burners::start(0, 2);
    let mut moved_after = None;
    wait_for("the trial moved off agent a", Duration::from_secs(30), || {
        let moved =
            attempts(&store).iter().any(|r| r.2 == a && r.3.as_deref().is_some_and(|o| o.starts_with("moved off")));
        if moved {
            moved_after = Some(load_started.elapsed());
        }
        moved
    });
    drop(burners);
    eprintln!("load start -> decision and move recorded in the store: {:?}", moved_after.expect("moved"));
    let status = coord.wait_exit(Duration::from_secs(300));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("2/2 trials done, 0 failed"), "max_attempts 1: a move is no failure\n{out}");
    // What holds however busy the machine is: the loaded agent's trial
    // moved off it, and completed later elsewhere. Outside load on this
    // machine may flag the other agent's measurements too (their trials
    // are measured again, and moves counted): those are not asserted.
    let moves: u64 = out
        .lines()
        .find_map(|l| l.split("moved: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the summary counts the moves\n{out}"));
    let rows = attempts(&store);
    let off_a: Vec<_> =
        rows.iter().filter(|r| r.2 == a && r.3.as_deref().is_some_and(|o| o.starts_with("moved off"))).collect();
    assert!(!off_a.is_empty() && moves >= off_a.len() as u64, "{moves} moves: {rows:?}");
    let why = off_a[0].3.as_deref().unwrap_or_default();
    assert!(why.contains("load from outside its trials"), "the move is recorded with the telemetry: {why}");
    let db = Connection::open(&store).expect("store");
    let (agent, attempt): (String, i64) = db
        .query_row("SELECT agent, attempt FROM results WHERE trial = ?1", [off_a[0].0], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("the moved trial has a result");
    assert!(attempt > off_a[0].1, "completed by a later attempt: {rows:?}");
    // On the other agent, unless load from elsewhere (another program on
    // this machine) made the other agent give trials up too.
    let b_moved = rows.iter().any(|r| r.2 == b && r.3.as_deref().is_some_and(|o| o.starts_with("moved off")));
    assert!(agent == b || b_moved, "completed on the other agent, unless moved off it too: {rows:?}");
    // `tunefleet agents` shows each agent's class and its last telemetry.
    let mut list = Command::new(bin("tunefleet"));
    list.args(["agents", "--store"]).arg(&store);
    let (code, text, err) = run(list);
    assert_eq!(code, Some(0), "{err}");
    for name in [&a, &b] {
        let line = text.lines().find(|l| l.starts_with(name.as_str())).unwrap_or_else(|| panic!("{name}: {text}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols.get(2), Some(&"1"), "one CPU each (--cpus): {line}");
        assert!(line.contains("estimated") && line.contains(" %"), "energy source and outside load: {line}");
    }
    assert_agents_spools_empty(&[&a, &b]);
}

#[test]
fn a_measurement_taken_under_outside_load_is_flagged_and_taken_again_elsewhere() {
    if !two_cpus() {
        return;
    }
    let _alone = alone();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("interfere");
    let store = dir.path().join("s.db");
    let study = slow_study(dir.path(), "int", 1, 4);
    // A window far longer than the trial: the agent is never found overloaded,
    // so the trial ends under the load and its measurement says so.
    let (mut coord, url) = start_coordinator(&study, &store, &root, &["--offload", "--offload-window", "600"]);
    let (a, b) = (format!("{root}-a"), format!("{root}-b"));
    let fast = ["--slots", "1", "--telemetry-interval", "250ms", "--interference-threshold", "0.5"];
    let burners = Burners::start(0, 2);
    let _agent_a = start_agent(&url, &a, &root, &[&["--cpus", "0"][..], &fast[..]].concat());
    wait_for("the trial on agent a", Duration::from_secs(60), || attempts(&store).iter().any(|r| r.2 == a));
    let _agent_b = start_agent(&url, &b, &root, &[&["--cpus", "1"][..], &fast[..]].concat());
    wait_for("the disturbed measurement refused", Duration::from_secs(60), || {
        attempts(&store).iter().any(|r| r.2 == a && r.3.as_deref().is_some_and(|o| o.contains("measured again")))
    });
    drop(burners);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("1/1 trials done, 0 failed"), "{out}");
    let rows = attempts(&store);
    let first = rows.iter().find(|r| r.2 == a).expect("a's attempt");
    let why = first.3.as_deref().unwrap_or_default();
    assert!(why.contains("outside"), "the reason quotes the agent's flag: {why}");
    // Taken again elsewhere: the next attempt ran on the agent the test does not load.
    let second = rows.iter().find(|r| r.1 == first.1 + 1).expect("a second attempt");
    assert_eq!(second.2, b, "measured again on the agent nobody loads: {rows:?}");
    let db = Connection::open(&store).expect("store");
    let (agent, m): (String, String) =
        db.query_row("SELECT agent, measurement FROM results", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("result");
    let m: serde_json::Value = serde_json::from_str(&m).expect("json");
    let b_disturbed = second.3.as_deref().is_some_and(|o| o.contains("measured again"));
    if b_disturbed {
        // Load from outside this test reached b too (a busy machine): after
        // its re-measures the study keeps a flagged measurement, and says so.
        eprintln!("the machine was busy: agent b was disturbed too ({rows:?})");
        assert!(rows.len() <= 3, "at most two re-measures: {rows:?}");
    } else {
        assert_eq!(agent, b, "kept where it was measured clean: {rows:?}");
        assert_eq!(m["interference"], serde_json::json!([]), "the kept measurement is clean: {m}");
    }
    assert_agents_spools_empty(&[&a, &b]);
}

#[test]
fn a_moved_trial_goes_on_from_its_last_checkpoint_on_the_other_agent() {
    if !two_cpus() {
        return;
    }
    let _alone = alone();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("resume");
    let store = dir.path().join("s.db");
    let ckpt = dir.path().join("ckpt");
    let text = format!(
        r#"name = "res"
command = ["tunefleet-train", "--epochs", "40", "--passes", "8", "--lr", "{{lr}}", "--checkpoint-dir", "{}/t{{trial}}"]
resume = ["--resume", "{{checkpoint}}"]
timeout = 120
max_attempts = 1
[objective]
metric = "accuracy"
direction = "maximize"
[budget]
trials = 1
[strategy]
kind = "grid"
[hyper.lr]
kind = "categorical"
values = [0.05]
"#,
        ckpt.display()
    );
    let study = dir.path().join("res.toml");
    std::fs::write(&study, text).expect("study");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &["--offload"]);
    let (a, b) = (format!("{root}-a"), format!("{root}-b"));
    let fast = ["--slots", "1", "--telemetry-interval", "500ms", "--interference-threshold", "0.5"];
    let _agent_a = start_agent(&url, &a, &root, &[&["--cpus", "0"][..], &fast[..]].concat());
    let epochs_done = || -> i64 {
        Connection::open(&store)
            .and_then(|db| db.query_row("SELECT COUNT(*) FROM progress WHERE study = 'res'", [], |r| r.get(0)))
            .unwrap_or(0)
    };
    wait_for("two epochs on agent a", Duration::from_secs(60), || epochs_done() >= 2);
    let _agent_b = start_agent(&url, &b, &root, &[&["--cpus", "1"][..], &fast[..]].concat());
    let burners = Burners::start(0, 2);
    wait_for("the trial moved off agent a", Duration::from_secs(30), || {
        attempts(&store).iter().any(|r| r.2 == a && r.3.as_deref().is_some_and(|o| o.starts_with("moved off")))
    });
    drop(burners);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("1/1 trials done, 0 failed"), "{out}");
    let db = Connection::open(&store).expect("store");
    let (agent, m): (String, String) =
        db.query_row("SELECT agent, measurement FROM results", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("result");
    // On the other agent, unless load from elsewhere (another program on
    // this machine) made it move off that one too: then wherever it ended.
    let rows = attempts(&store);
    let b_moved = rows.iter().any(|r| r.2 == b && r.3.as_deref().is_some_and(|o| o.starts_with("moved off")));
    assert!(agent == b || b_moved, "completed on the other agent, unless moved off it too: {rows:?}");
    let m: serde_json::Value = serde_json::from_str(&m).expect("json");
    let epochs: Vec<u64> = m["epochs"].as_array().expect("epochs").iter().filter_map(|e| e["epoch"].as_u64()).collect();
    let first = *epochs.first().expect("epochs");
    assert!(first > 1, "went on from a checkpoint, not from epoch 1: {epochs:?}");
    assert_eq!(epochs, (first..=40).collect::<Vec<_>>(), "the rest of the epochs, each once");
    // The checkpoint it resumed from is the last one agent a reported before the move.
    let reported: i64 = db
        .query_row("SELECT MAX(epoch) FROM progress p JOIN attempts x ON x.study = p.study AND x.trial = p.trial AND x.attempt = p.attempt WHERE x.agent = ?1", [&a], |r| r.get(0))
        .expect("a's epochs");
    assert!(
        first as i64 <= reported + 1 && first >= 2,
        "resumed after epoch {} of {reported} reported by a",
        first - 1
    );
    assert!(m["final_metrics"]["accuracy"].as_f64().is_some_and(|acc| acc > 0.9), "{m}");
    assert_agents_spools_empty(&[&a, &b]);
}
