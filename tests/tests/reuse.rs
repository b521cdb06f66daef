//! Profiles, clusters and reuse with real processes. One store,
//! coordinators started one after another (so every run after the first
//! loads the clusters a previous process learned), a real agent, the real
//! training and I/O workloads:
//!
//! 1. a training study probes and teaches the model;
//! 2. after a restart, a recurring training job (other learning rate)
//!    skips probing and runs the cluster's configuration; the same program
//!    with more data per epoch (another fixed argument) is another
//!    workload and probes;
//! 3. an I/O job is not taken for a training job;
//! 4. an agent of another device class gets nothing learned on this one;
//! 5. a reused configuration that runs slower than its record gets the
//!    next job of its cluster probed again.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;
use tunefleet_tests::*;

/// These tests judge jobs by their measured windows and profiles: run side
/// by side, each one's workloads are the others' noise (on 2 cores a job
/// then fell into another cluster, or its probes disagreed). One at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pipelined study of `trials` trials over threads 1 and 2 (one warm-up
/// epoch, one epoch per configuration), `rest` its command, objective and
/// hyper-parameters.
fn pipelined_study(dir: &Path, name: &str, trials: u32, rest: &str) -> PathBuf {
    let text = format!(
        "name = \"{name}\"\ntimeout = 120\n{rest}\n[budget]\ntrials = {trials}\n[strategy]\nkind = \"grid\"\n\
         [system.threads]\nkind = \"int\"\nlow = 1\nhigh = 2\n{PIPELINE_EPOCH_WINDOWS}control = true\n"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write study");
    path
}

/// A pipelined training study; `reuse` false: every trial probes (its
/// profile still teaches the model). `passes` is a fixed argument, so
/// studies of other passes are other workloads.
/// With `lookahead = 0`: each trial is assigned once the one before it on
/// the agent has ended, so its reuse decision sees what that one taught
/// (held ahead, it could start before its predecessor's verdict is learnt).
fn train_study(dir: &Path, name: &str, lrs: &str, passes: u32, trials: u32, reuse: bool) -> PathBuf {
    let rest = format!(
        r#"lookahead = 0
command = ["tunefleet-train", "--lr", "{{lr}}", "--epochs", "6", "--passes", "{passes}", "--hidden", "256", "--threads", "{{threads}}"]
objective = {{ metric = "accuracy", direction = "maximize" }}
hyper.lr = {{ kind = "categorical", values = [{lrs}] }}
reuse = {{ enabled = {reuse} }}"#
    );
    pipelined_study(dir, name, trials, &rest)
}

fn io_study(dir: &Path, name: &str) -> PathBuf {
    let rest = r#"command = ["tunefleet-io", "--files", "24", "--file-kib", "256", "--epochs", "6", "--threads", "{threads}"]
objective = { metric = "throughput_mibs", direction = "maximize" }"#;
    pipelined_study(dir, name, 1, rest)
}

/// Runs `study` to the end with one agent (`extra` its flags) on a fresh
/// coordinator process over `store`; returns the coordinator's output.
fn run(study: &Path, store: &Path, agent: &str, extra: &[&str]) -> String {
    let root = unique_root("reuse");
    let (mut coord, url) = start_coordinator(study, store, &root, &[]);
    let mut a = start_agent(&url, agent, &root, extra);
    let status = coord.wait_exit(Duration::from_secs(180));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    assert_agents_spools_empty(&[agent]);
    a.signal("TERM");
    a.wait_exit(Duration::from_secs(20));
    out
}

/// `(trial, decision, reason)` of every reuse decision of `study`.
fn decisions(db: &Connection, study: &str) -> Vec<(u64, String, String)> {
    let mut stmt = db
        .prepare("SELECT trial, decision, reason FROM reuse_decisions WHERE study = ?1 ORDER BY trial, at_ms, decision")
        .expect("query");
    stmt.query_map([study], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("decisions")
}

/// The segment roles of `study`'s trial `trial`.
fn roles(db: &Connection, study: &str, trial: u64) -> Vec<String> {
    let mut stmt = db.prepare("SELECT role FROM segments WHERE study = ?1 AND trial = ?2 ORDER BY idx").expect("query");
    stmt.query_map(rusqlite::params![study, trial as i64], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("roles")
}

#[test]
fn a_reused_job_is_verified_against_its_first_probe_window_not_its_start_up() {
    let _serial = one_at_a_time();
    // Two jobs probed that start slowly (1.5 s before their first epoch),
    // then the same program starting at once: its reused configuration must
    // be judged as fast as promised. Relative to the first window with the
    // start-up in it, it looked several times slower.
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store.db");
    let agent = format!("{}-agent", unique_root("reuse-s"));
    let study = |name: &str, startup: &str, lrs: &str, trials: u32, reuse: bool| {
        let rest = format!(
            r#"lookahead = 0
command = ["sh", "-c", "sleep {{startup}} && exec tunefleet-train --lr {{lr}} --epochs 6 --passes 4 --hidden 256 --threads {{threads}}"]
objective = {{ metric = "accuracy", direction = "maximize" }}
hyper.lr = {{ kind = "categorical", values = [{lrs}] }}
hyper.startup = {{ kind = "categorical", values = [{startup}] }}
reuse = {{ enabled = {reuse} }}"#
        );
        pipelined_study(dir.path(), name, trials, &rest)
    };
    let one_slot = ["--slots", "1"];
    let out = run(&study("slow", "1.5", "0.05, 0.1", 2, false), &store, &agent, &one_slot);
    assert!(out.contains("2/2 trials done"), "{out}");
    let out = run(&study("quick", "0", "0.2", 1, true), &store, &agent, &one_slot);
    assert!(out.contains("1/1 trials done"), "{out}");
    let db = Connection::open(&store).expect("store");
    let quick = decisions(&db, "quick");
    assert_eq!(quick.first().map(|d| d.1.as_str()), Some("reuse"), "{quick:?}");
    assert!(quick.iter().any(|d| d.1 == "kept"), "a quicker start-up is no slower configuration: {quick:?}");
    assert!(!quick.iter().any(|d| d.1 == "worse"), "{quick:?}");
}

#[test]
fn recurring_jobs_reuse_known_configurations_and_other_jobs_do_not() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store.db");
    let agent = format!("{}-agent", unique_root("reuse-a"));
    let one_slot = ["--slots", "1"];

    // 1. Two training jobs, both probed (reuse off: a reuse checked against
    //    one job's noisy windows could have the next job probe again).
    let out = run(&train_study(dir.path(), "learn", "0.05, 0.1", 4, 2, false), &store, &agent, &one_slot);
    assert!(out.contains("2/2 trials done"), "{out}");
    let db = Connection::open(&store).expect("store");
    let learned = decisions(&db, "learn");
    assert_eq!(learned[0].1, "probe", "{learned:?}");
    assert!(learned[0].2.contains("no profiles of this device class yet"), "{learned:?}");
    assert_eq!(roles(&db, "learn", 0), vec!["warmup", "probe", "probe", "selected"]);
    let profiles: i64 = db.query_row("SELECT COUNT(*) FROM profiles", [], |r| r.get(0)).expect("count");
    let models: i64 = db.query_row("SELECT COUNT(*) FROM cluster_models", [], |r| r.get(0)).expect("count");
    assert_eq!((profiles, models), (2, 1), "both jobs joined one class's model");

    // 2. A new coordinator process: the recurring job (another learning
    //    rate) reuses and skips probing.
    let out = run(&train_study(dir.path(), "recur", "0.2", 4, 1, true), &store, &agent, &one_slot);
    assert!(out.contains("1/1 trials done"), "{out}");
    let recur = decisions(&db, "recur");
    assert_eq!(recur[0].1, "reuse", "{recur:?}");
    assert!(recur[0].2.contains("reused threads=") && recur[0].2.contains("<= threshold"), "{recur:?}");
    assert_eq!(
        roles(&db, "recur", 0),
        vec!["warmup", "probe", "reused"],
        "only the first probe window ran (the default configuration, the window every job ran)"
    );
    assert!(recur.iter().any(|d| d.1 == "kept" || d.1 == "worse"), "the reuse is checked: {recur:?}");

    // 2b. The same program with twice the data per epoch (another fixed
    //     argument: another workload) probes, though its profile is close:
    //     only jobs of its own workload decide by default.
    let out = run(&train_study(dir.path(), "bigger", "0.2", 8, 1, true), &store, &agent, &one_slot);
    assert!(out.contains("1/1 trials done"), "{out}");
    let bigger = decisions(&db, "bigger");
    assert_eq!(bigger[0].1, "probe", "{bigger:?}");
    assert!(bigger[0].2.contains("no probed job of this workload"), "{bigger:?}");

    // 3. An I/O job is another kind: probed.
    let out = run(&io_study(dir.path(), "io"), &store, &agent, &one_slot);
    assert!(out.contains("1/1 trials done"), "{out}");
    let io = decisions(&db, "io");
    assert_eq!(io[0].1, "probe", "{io:?}");
    assert!(io[0].2.contains("a new kind of job"), "{io:?}");
    assert!(roles(&db, "io", 0).contains(&"probe".to_string()));

    // 4. An agent of another device class (one CPU) learns on its own.
    let other = format!("{}-agent", unique_root("reuse-b"));
    let out = run(
        &train_study(dir.path(), "other-class", "0.3", 4, 1, true),
        &store,
        &other,
        &["--slots", "1", "--cpus", "0"],
    );
    assert!(out.contains("1/1 trials done"), "{out}");
    let oc = decisions(&db, "other-class");
    assert_eq!(oc[0].1, "probe", "{oc:?}");
    assert!(oc[0].2.contains("no profiles of this device class yet"), "{oc:?}");

    // 5. A record that promises too much: every configuration of the
    //    training jobs said to run 20 times faster than the first window.
    let records: Vec<(i64, String)> = db
        .prepare("SELECT id, record FROM profiles WHERE workload = 'tunefleet-train'")
        .expect("query")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("records");
    for (id, record) in records {
        let mut r: serde_json::Value = serde_json::from_str(&record).expect("json");
        // Every record names the same best (threads=2, as this machine's
        // probes find it when nothing else runs), with a tiny noise: under
        // the full suite's load two probed jobs' noisy windows could tie or
        // disagree, and reuse (which needs two in agreement) then probed.
        for o in r["outcomes"].as_array_mut().expect("outcomes") {
            let best = o["system"]["threads"] == serde_json::json!(2);
            o["rel_time"] = serde_json::json!(if best { 0.05 } else { 0.06 });
            o["noise"] = serde_json::json!(0.01);
        }
        // Whatever the verification of step 2 found on this noisy machine
        // (a reuse judged worse has its cluster probed again) is forgotten:
        // this step is about the promise alone.
        r["worse"] = serde_json::Value::Null;
        db.execute("UPDATE profiles SET record = ?1 WHERE id = ?2", rusqlite::params![r.to_string(), id])
            .expect("update");
    }
    let out = run(&train_study(dir.path(), "promised", "0.07, 0.09", 4, 2, true), &store, &agent, &one_slot);
    assert!(out.contains("2/2 trials done"), "{out}");
    let p = decisions(&db, "promised");
    let of = |trial: u64| p.iter().filter(|d| d.0 == trial).map(|d| d.1.as_str()).collect::<Vec<_>>();
    assert_eq!(of(0), vec!["reuse", "worse"], "{p:?}");
    assert!(p.iter().any(|d| d.1 == "worse" && d.2.contains("slower than the cluster's")), "{p:?}");
    assert_eq!(of(1), vec!["probe"], "{p:?}");
    assert!(p.iter().any(|d| d.0 == 1 && d.2.starts_with("probed again: promised/0")), "{p:?}");
    assert!(roles(&db, "promised", 1).contains(&"probe".to_string()));

    // What a user sees: the clusters and the decisions.
    let (code, listing, err) = tunefleet_tests::run({
        let mut c = std::process::Command::new(bin("tunefleet"));
        c.args(["profiles", "--store"]).arg(&store);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    assert!(listing.contains("tunefleet-train") && listing.contains("tunefleet-io"), "{listing}");
    assert!(listing.contains("1 cores") && listing.contains("2 cores"), "two device classes: {listing}");
    let (code, classified, err) = tunefleet_tests::run({
        let mut c = std::process::Command::new(bin("tunefleet"));
        c.args(["profiles", "classify", "recur", "0", "--store"]).arg(&store);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    assert!(classified.contains("cluster 0: distance"), "{classified}");
    // ... and the study's report lists its decisions.
    let page = dir.path().join("recur.html");
    let (code, _, err) = tunefleet_tests::run({
        let mut c = std::process::Command::new(bin("tunefleet"));
        c.args(["report", "recur", "-o"]).arg(&page).arg("--store").arg(&store);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    let html = std::fs::read_to_string(&page).expect("report");
    assert!(
        html.contains("reused threads=") && html.contains("&lt;= threshold"),
        "the reuse decision is in the report"
    );
    assert!(html.contains("id=\"table-clusters\"") && html.contains("tunefleet-train x"), "and its cluster");
}

/// A fleet member's profiles joined the shared reuse
/// model for good. `tunefleet profiles forget --agent NAME` (the real
/// binary, on a store file) drops exactly that agent's profiles and fits
/// the class's clusters again on the rest.
#[test]
fn regression_profiles_forget_drops_exactly_one_agents_profiles() {
    let _serial = one_at_a_time();
    use tunefleet_common::profile::Profile;
    use tunefleet_coordinator::domain::reuse::Record;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("forget.db");
    let class = "x86_64, 2 cores, estimate";
    // Trials 0..6: even ones ran on `mallory`, odd ones on `honest`.
    let agent_of = |trial: u64| if trial % 2 == 0 { "mallory" } else { "honest" };
    {
        let mut s = tunefleet_coordinator::store::Store::open(&store).expect("store");
        let mut batch = s.batch().expect("batch");
        for trial in 0..6u64 {
            let mut profile = Profile::empty();
            profile.set("cpus_busy", Some(1.0 + trial as f64 / 10.0));
            profile.set("log_io_kib_per_s", Some(0.5 + trial as f64 / 20.0));
            let record = Record {
                study: "s".into(),
                trial,
                class: class.into(),
                workload: "w".into(),
                identity: "w".into(),
                group: "{}".into(),
                profile,
                outcomes: vec![],
                reused: false,
                worse: None,
                at_ms: trial,
            };
            batch.record_profile(&record).expect("profile");
        }
        batch.commit().expect("commit");
    }
    let db = Connection::open(&store).expect("db");
    for trial in 0..6i64 {
        db.execute(
            "INSERT INTO results (study, trial, attempt, agent, success, wall_us, user_us, sys_us, max_rss_kib, exit,
                                  measurement, received_ms)
             VALUES ('s', ?1, 1, ?2, 1, 1, 1, 1, 1, 'exited 0', '{}', 1)",
            rusqlite::params![trial, agent_of(trial as u64)],
        )
        .expect("result row");
    }
    let forget = |agent: &str| {
        let out = std::process::Command::new(bin("tunefleet"))
            .args(["profiles", "forget", "--agent", agent, "--store"])
            .arg(&store)
            .output()
            .expect("runs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let out = forget("mallory");
    assert!(out.contains(&format!("mallory: 3 profiles forgotten in {class}")), "{out}");
    let left: Vec<i64> = db
        .prepare("SELECT trial FROM profiles ORDER BY trial")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(left, vec![1, 3, 5], "exactly mallory's profiles went");
    let fitted_on: i64 = db
        .query_row("SELECT records FROM cluster_models WHERE class = ?1", [class], |r| r.get(0))
        .expect("the class's model, fitted again");
    assert_eq!(fitted_on, 3, "fitted on what is left");
    let again = forget("mallory");
    assert!(again.contains("no profiles learnt from it"), "{again}");
    assert_eq!(db.query_row("SELECT COUNT(*) FROM profiles", [], |r| r.get::<_, i64>(0)).expect("count"), 3);
}
