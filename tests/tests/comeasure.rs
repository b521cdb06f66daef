//! The energy of a trial that spans nodes. A study names the
//! agents that measure with its trials (`[measure] nodes`); each measures
//! its machine over the trial's window, and the result carries one entry
//! per node with its source and validity, and their sum. Three real agent
//! processes on this machine, each confined to a CPU: the one that runs the
//! trials, one co-measuring with the estimate, one with a fixture RAPL tree
//! whose counter a thread of this test advances at a known power.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tunefleet_tests::*;

/// The fixture RAPL zone's power.
const WATTS: f64 = 50.0;

/// A RAPL tree under `dir` whose package counter advances at [`WATTS`]
/// until the returned flag is set.
fn rapl_at_constant_power(dir: &Path) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let zone = dir.join("powercap/intel-rapl:0");
    std::fs::create_dir_all(&zone).expect("mkdir");
    for d in ["hwmon", "power_supply"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    std::fs::write(zone.join("name"), "package-0\n").expect("write");
    std::fs::write(zone.join("max_energy_range_uj"), "262143328850\n").expect("write");
    std::fs::write(zone.join("energy_uj"), "0\n").expect("write");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let handle = std::thread::spawn(move || {
        let start = Instant::now();
        let (file, tmp) = (zone.join("energy_uj"), zone.join("energy_uj.tmp"));
        while !flag.load(Ordering::Relaxed) {
            let uj = (start.elapsed().as_secs_f64() * WATTS * 1e6) as u64;
            // Written whole and renamed: the agent never reads half a number.
            std::fs::write(&tmp, format!("{uj}\n")).expect("write");
            std::fs::rename(&tmp, &file).expect("rename");
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    (stop, handle)
}

#[test]
fn nodes_named_by_tags_measure_each_trial_and_the_result_sums_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let study = dir.path().join("spans.toml");
    std::fs::write(
        &study,
        r#"name = "spans"
command = ["sh", "-c", "sleep 1.2; echo TUNEFLEET epoch=1 v={n}"]
timeout = 60
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 3
[strategy]
kind = "random"
seed = 5
[hyper.n]
kind = "int"
low = 1
high = 100
[selector]
tags = { role = "driver" }
[measure]
nodes = { tags = { role = "worker" } }
"#,
    )
    .expect("write");
    let empty = dir.path().join("none");
    for d in ["powercap", "hwmon", "power_supply"] {
        std::fs::create_dir_all(empty.join(d)).expect("mkdir");
    }
    let rapl = dir.path().join("rapl");
    let (stop, writer) = rapl_at_constant_power(&rapl);
    let roots = |d: &Path| -> Vec<String> {
        ["powercap", "hwmon", "power_supply"].iter().map(|s| d.join(s).display().to_string()).collect()
    };
    let (e, r) = (roots(&empty), roots(&rapl));

    let store = dir.path().join("store.db");
    let root = unique_root("comeasure");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let (driver, est, metered) = (format!("{root}-driver"), format!("{root}-est"), format!("{root}-rapl"));
    let energy = |r: &[String]| {
        vec![
            "--powercap-root".to_string(),
            r[0].clone(),
            "--hwmon-root".into(),
            r[1].clone(),
            "--power-supply-root".into(),
            r[2].clone(),
        ]
    };
    // A node measures others' trials only with the tag its token granted
    //: the operator makes the workers' token so.
    let worker_token = create_join_token(&store, &["--tag", "role=worker"]);
    let worker_args = |r: &[String]| {
        let mut a = vec!["--join".to_string(), worker_token.clone(), "--cpus".into(), "1".into()];
        a.extend(["--sample-interval".into(), "200ms".into()]);
        a.extend(energy(r));
        a
    };
    let args = worker_args(&e);
    let _est = start_agent(&url, &est, &root, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let args = worker_args(&r);
    let _metered = start_agent(&url, &metered, &root, &args.iter().map(String::as_str).collect::<Vec<_>>());
    // A member claiming the workers' tag that its token
    // never granted measures no one's trial.
    let claimer = format!("{root}-claims");
    let args: Vec<String> =
        ["--tag", "role=worker", "--cpus", "1"].iter().map(|s| s.to_string()).chain(energy(&e)).collect();
    let _claimer = start_agent(&url, &claimer, &root, &args.iter().map(String::as_str).collect::<Vec<_>>());
    // The nodes are in the fleet before the first trial is assigned.
    wait_for("the nodes welcomed", Duration::from_secs(30), || {
        let online: Vec<String> = query(&store, "SELECT name FROM agents WHERE online = 1", |row| row.get(0));
        online.contains(&est) && online.contains(&metered) && online.contains(&claimer)
    });
    let args: Vec<String> =
        ["--tag", "role=driver", "--cpus", "0"].iter().map(|s| s.to_string()).chain(energy(&e)).collect();
    let _driver = start_agent(&url, &driver, &root, &args.iter().map(String::as_str).collect::<Vec<_>>());
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    assert!(status.success(), "{status:?}\n{out}");

    // One entry per node and trial, with its source and validity.
    type Row = (u64, String, Option<String>, Option<f64>, bool, Option<String>, Option<i64>, Option<i64>, Option<i64>);
    let rows: Vec<Row> = query(
        &store,
        "SELECT trial, agent, source, joules, valid, note, from_ms, to_ms, covered_ms FROM node_measurements
         WHERE study = 'spans' ORDER BY trial, agent",
        |row| {
            Ok((
                row.get::<_, i64>(0)? as u64,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
                row.get(6)?,
                row.get(7)?,
                row.get(8)?,
            ))
        },
    );
    assert_eq!(rows.len(), 6, "two nodes for each of three trials: {rows:#?}");
    assert!(rows.iter().all(|r| r.1 != claimer), "a claimed tag grants nothing: {rows:#?}");
    for (trial, agent, source, joules, valid, note, from, to, covered) in &rows {
        assert_ne!(agent, &driver, "the trial's own agent is no node of it");
        assert!(valid, "trial {trial} on {agent}: {note:?}");
        let (from, to, covered) = (from.expect("from"), to.expect("to"), covered.expect("covered"));
        let window_s = (to - from) as f64 / 1000.0;
        assert!((1.1..10.0).contains(&window_s), "the trial's window: {window_s} s");
        // The node starts when the trial is assigned, before it starts: all
        // of it covered but for the delivery of the Start racing the spawn.
        assert!(covered * 10 >= 9 * (to - from), "the samples cover the window: {covered} of {} ms", to - from);
        let joules = joules.expect("joules");
        if agent == &metered {
            assert_eq!(source.as_deref(), Some("rapl"));
            let expected = WATTS * window_s;
            assert!((joules - expected).abs() <= 0.1 * expected, "{joules} J over {window_s} s at {WATTS} W");
        } else {
            assert_eq!(source.as_deref(), Some("estimated"));
            // One CPU: at least its idle watt over the window, at most idle and busy.
            assert!(joules >= 0.9 * window_s && joules <= 5.5 * window_s, "{joules} J over {window_s} s");
            assert!(note.as_deref().is_some_and(|n| n.contains("co-measured")), "{note:?}");
        }
    }

    // The export carries the entries and the sum over every machine.
    let (code, json, err) = run({
        let mut c = std::process::Command::new(bin("tunefleet"));
        c.args(["export", "spans", "--format", "json", "--store"]).arg(&store);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    let trials: Vec<serde_json::Value> = serde_json::from_str(&json).expect("json");
    assert_eq!(trials.len(), 3);
    for t in &trials {
        let nodes = t["nodes"].as_array().expect("nodes");
        assert_eq!(nodes.len(), 2, "{t}");
        let own = t["energy_j"].as_f64().expect("the trial's own energy");
        let sum: f64 = own + nodes.iter().map(|n| n["joules"].as_f64().expect("joules")).sum::<f64>();
        let total = t["energy_nodes_j"].as_f64().expect("the sum");
        assert!((total - sum).abs() < 1e-9, "{total} != {sum}");
        assert!(total > own, "the nodes add to the trial's energy");
        assert_eq!(t["energy_nodes_valid"], serde_json::Value::Bool(true));
    }
    assert_agents_spools_empty(&[&driver, &est, &metered, &claimer]);
}
