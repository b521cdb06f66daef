//! Pipelined tuning with real processes: a coordinator, an agent and the
//! training workload, whose system configuration changes inside the trial.
//! The test reads the workload's threads from `/proc` while it runs.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tunefleet_tests::*;

/// The `/proc` entries of processes whose environment holds `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()))
                && std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "tunefleet-train")
        })
        .collect()
}

/// `Cpus_allowed_list` of every thread of `pid`.
fn thread_masks(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.ok()?.path().join("status")).ok()?;
            status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|v| v.trim().to_string())
        })
        .collect()
}

fn cpu_count(mask: &str) -> usize {
    mask.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap_or(0) + 1 - a.parse::<usize>().unwrap_or(0),
            None => 1,
        })
        .sum()
}

/// The shared part of the study files below: one trial, maximise accuracy,
/// cores probed between 1 and 2.
const ONE_TRIAL_ON_CORES: &str = r#"timeout = 120
[objective]
metric = "accuracy"
direction = "maximize"
[budget]
trials = 1
[strategy]
kind = "grid"
[system.cores]
kind = "int"
low = 1
high = 2"#;

fn pipelined_study(dir: &Path, name: &str, marker: &str) -> std::path::PathBuf {
    let (key, value) = marker.split_once('=').expect("KEY=VALUE");
    let text = format!(
        r#"name = "{name}"
command = ["tunefleet-train", "--lr", "{{lr}}", "--epochs", "7", "--passes", "8", "--threads", "{{threads}}"]
env = {{ {key} = "{value}" }}
{ONE_TRIAL_ON_CORES}
[hyper.lr]
kind = "categorical"
values = [0.05]

[system.threads]
kind = "int"
low = 1
high = 2

{PIPELINE_EPOCH_WINDOWS}control = true
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write study");
    path
}

#[test]
fn a_pipelined_trial_probes_each_configuration_live_and_keeps_the_fastest() {
    if std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) < 2 {
        eprintln!("skipped: probing cores needs 2 CPUs");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("pipelined");
    let marker = format!("TUNEFLEET_PIPELINE_TEST={root}");
    let study = pipelined_study(dir.path(), "pipe", &marker);
    let store = dir.path().join("store.db");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let agent_name = format!("{root}-agent");
    let _agent = start_agent(&url, &agent_name, &root, &[]);

    // Watch the workload's threads while it runs: which CPU masks they have,
    // in the order seen.
    let mut seen: Vec<(Vec<String>, usize)> = Vec::new();
    let start = Instant::now();
    let mut ran = false;
    while start.elapsed() < Duration::from_secs(120) {
        let pids = processes_with(&marker);
        if pids.is_empty() && ran {
            break;
        }
        for pid in pids {
            ran = true;
            let masks: Vec<String> = thread_masks(pid).into_iter().collect::<BTreeSet<_>>().into_iter().collect();
            let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
            if !masks.is_empty() && seen.last().map(|(m, _)| m) != Some(&masks) {
                seen.push((masks, threads));
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    assert!(out.contains("1/1 trials done"), "{out}");

    // The measurement: warm-up, four probe windows, then the selected configuration.
    let db = Connection::open(&store).expect("store");
    let (m, system): (String, Option<String>) = db
        .query_row("SELECT measurement, system FROM results WHERE study = 'pipe'", [], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("one result");
    let m: serde_json::Value = serde_json::from_str(&m).expect("json");
    let segments = m["segments"].as_array().expect("segments").clone();
    let roles: Vec<&str> = segments.iter().map(|s| s["role"].as_str().unwrap_or("?")).collect();
    assert_eq!(roles, vec!["Warmup", "Probe", "Probe", "Probe", "Probe", "Selected"], "{m}");
    let sys = |s: &serde_json::Value| (s["system"]["cores"].as_u64(), s["system"]["threads"].as_u64());
    let probes: Vec<_> = segments.iter().filter(|s| s["role"] == "Probe").collect();
    assert_eq!(
        probes.iter().map(|s| sys(s)).collect::<Vec<_>>(),
        vec![(Some(2), Some(2)), (Some(1), Some(1)), (Some(1), Some(2)), (Some(2), Some(1))],
        "the default first, then the grid"
    );
    // The selected configuration is the fastest probe per epoch.
    let per_epoch = |s: &serde_json::Value| {
        s["wall_us"].as_f64().unwrap_or(f64::MAX)
            / (s["last_epoch"].as_f64().unwrap_or(0.0) - s["first_epoch"].as_f64().unwrap_or(0.0) + 1.0)
    };
    let fastest = probes.iter().min_by(|a, b| per_epoch(a).total_cmp(&per_epoch(b))).expect("probes");
    assert_eq!(m["selected"], fastest["system"], "selected by time: {m}");
    assert_eq!(sys(&segments[5]), sys(fastest));
    let stored: serde_json::Value = serde_json::from_str(&system.expect("system recorded")).expect("json");
    assert_eq!(stored, m["selected"]);
    // Each window's CPUs match its cores, and every epoch ran with the
    // threads its window asked for (the control channel).
    let epochs = m["epochs"].as_array().expect("epochs");
    for s in &segments {
        let (cores, threads) = sys(s);
        assert_eq!(s["cpus"].as_array().map(|c| c.len() as u64), cores, "{s}");
        for e in s["first_epoch"].as_u64().unwrap_or(0)..=s["last_epoch"].as_u64().unwrap_or(0) {
            let reported = epochs.iter().find(|x| x["epoch"].as_u64() == Some(e)).expect("epoch reported");
            let ran_with = reported["metrics"]["threads"].as_f64().map(|t| t as u64);
            // The warm-up epoch runs with the thread count the workload started with.
            assert_eq!(ran_with, threads, "epoch {e} in {s}");
        }
    }
    // What the test saw in /proc: all threads on both CPUs, then on one,
    // and in the end on as many as the selected configuration has.
    let masks: Vec<usize> = seen.iter().map(|(m, _)| m.iter().map(|x| cpu_count(x)).max().unwrap_or(0)).collect();
    assert!(masks.contains(&2) && masks.contains(&1), "affinity changed while running: {seen:?}");
    let (last, _) = seen.last().expect("observed");
    let selected_cores = m["selected"]["cores"].as_u64().expect("cores") as usize;
    assert!(last.iter().all(|x| cpu_count(x) == selected_cores), "stays at the selection: {seen:?}");
    assert_agents_spools_empty(&[&agent_name]);
}

/// A trial of the store: (trial, state, attempts, reason).
type TrialRow = (i64, String, i64, Option<String>);

/// Runs six trials, one at a time in file order (q = 6, 5, ..., 1), of a
/// workload reporting v = q x epoch at `epochs` (a shell list), with ASHA
/// (grace 1, `reduction`): each trails the ones before at the first rung it
/// reaches. Checks that the first went on and at least three trailing ones
/// were stopped before their fourth report; returns the trials, each
/// trial's count of reported epochs, and the coordinator's output.
fn asha_run(epochs: &str, reduction: u32) -> (Vec<TrialRow>, Vec<i64>, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        r#"name = "asha"
command = ["sh", "-c", "for e in {epochs}; do echo TUNEFLEET epoch=$e v=$(( {{q}} * e )); sleep 0.3; done"]
timeout = 60
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 6
[strategy]
kind = "grid"
[early_stopping]
kind = "asha"
reduction = {reduction}
grace = 1
[hyper.q]
kind = "categorical"
values = [6, 5, 4, 3, 2, 1]
"#
    );
    let study = dir.path().join("asha.toml");
    std::fs::write(&study, text).expect("study");
    let store = dir.path().join("store.db");
    let out = run_with_one_agent(&study, &store, "asha", &["--slots", "1"], Duration::from_secs(120));
    let rows: Vec<TrialRow> =
        query(&store, "SELECT trial, state, attempts, reason FROM trials WHERE study = 'asha' ORDER BY trial", |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        });
    let epochs: Vec<i64> = query(
        &store,
        "SELECT COUNT(DISTINCT p.epoch) FROM trials t LEFT JOIN progress p ON p.study = t.study AND p.trial = t.trial \
         WHERE t.study = 'asha' GROUP BY t.trial ORDER BY t.trial",
        |r| r.get(0),
    );
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert_eq!(rows[0].1, "done", "the first trial at a rung goes on: {rows:?}");
    let stopped: Vec<_> = rows.iter().filter(|r| r.1 == "stopped").collect();
    assert!(stopped.len() >= 3, "trailing trials stopped: {rows:?}\n{out}");
    assert!(stopped.iter().all(|r| epochs[r.0 as usize] < 4), "fewer epochs when stopped: {rows:?} {epochs:?}");
    (rows, epochs, out)
}

#[test]
fn asha_stops_trials_whose_epochs_trail_and_never_retries_them() {
    let (rows, epochs, out) = asha_run("1 2 3 4", 2);
    assert!(rows.iter().all(|r| r.1 == "done" || r.1 == "stopped"), "none failed: {rows:?}");
    assert!(rows.iter().all(|r| r.2 == 1), "stopped trials are never retried: {rows:?}");
    let stopped = rows.iter().filter(|r| r.1 == "stopped");
    assert!(stopped.clone().all(|r| r.3.as_deref().is_some_and(|w| w.contains("ASHA"))), "{rows:?}");
    assert_eq!(epochs[0], 4);
    assert!(out.contains("0 failed") && out.contains("stopped early"), "{out}");
}

#[test]
fn asha_judges_a_workload_reporting_every_second_epoch() {
    // Rungs at epochs 1, 3, 9; the workload reports 2, 4, 6, 8: each rung
    // is judged at the first report past it (no report is ever at a rung;
    // judged only at exact rungs, all six ran to the end).
    let (_, epochs, _) = asha_run("2 4 6 8", 3);
    assert_eq!(epochs[0], 4);
}

#[test]
fn windows_of_steps_probe_inside_the_first_epoch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("steps");
    let text = format!(
        r#"name = "steps"
command = ["tunefleet-train", "--epochs", "3", "--passes", "4", "--batch-size", "{{batch}}"]
{ONE_TRIAL_ON_CORES}
[hyper.batch]
kind = "categorical"
values = [32]
[pipeline]
mode = "pipelined"
window = {{ steps = 40, warmup = 10 }}
select = "time"
"#
    );
    let study = dir.path().join("steps.toml");
    std::fs::write(&study, text).expect("study");
    let store = dir.path().join("store.db");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let agent_name = format!("{root}-agent");
    let _agent = start_agent(&url, &agent_name, &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    let db = Connection::open(&store).expect("store");
    let m: String =
        db.query_row("SELECT measurement FROM results WHERE study = 'steps'", [], |r| r.get(0)).expect("result");
    let m: serde_json::Value = serde_json::from_str(&m).expect("json");
    let segments = m["segments"].as_array().expect("segments");
    let shape: Vec<(&str, u64, u64)> = segments
        .iter()
        .map(|s| {
            (s["role"].as_str().unwrap_or("?"), s["steps"].as_u64().unwrap_or(0), s["last_epoch"].as_u64().unwrap_or(0))
        })
        .collect();
    // 1438 training samples in batches of 32: 45 steps a pass, 180 an epoch:
    // the warm-up and both windows end inside epoch 1. Both configurations
    // run this workload about as fast: when their windows' noise cannot tell
    // them apart, both are measured again (at most twice; an epoch end cuts
    // a window, which is then taken again).
    assert_eq!(shape[..3], [("Warmup", 10, 1), ("Probe", 40, 1), ("Probe", 40, 1)], "{m}");
    assert_eq!(shape.last().map(|s| s.0), Some("Selected"), "{m}");
    let probes = shape.iter().filter(|s| s.0 == "Probe").count();
    assert!([2, 4, 6].contains(&probes), "{m}");
    let cores = |s: &serde_json::Value| s["system"]["cores"].as_u64();
    assert_eq!((cores(&segments[1]), cores(&segments[2])), (Some(2), Some(1)));
    let last = segments.last().expect("selected");
    assert_eq!(m["selected"], last["system"], "{m}");
    assert_eq!(last["cpus"].as_array().map(|c| c.len() as u64), cores(last));
    if probes == 2 {
        let per_step = |s: &serde_json::Value| s["unit_median_us"].as_f64().unwrap_or(f64::MAX);
        let fastest = if per_step(&segments[1]) <= per_step(&segments[2]) { &segments[1] } else { &segments[2] };
        assert_eq!(m["selected"], fastest["system"], "{m}");
    }
    // Step lines are not epochs: the measurement keeps three epochs.
    assert_eq!(m["epochs"].as_array().map(Vec::len), Some(3));
    assert_agents_spools_empty(&[&agent_name]);
}

/// A workload whose epochs take 0.1 s on one CPU, but its second epoch
/// there 1 s (a checkpoint, a collection), and 0.15 s on two CPUs: the
/// number of CPUs it may run on (`nproc`) is what the probes change.
const ONE_SLOW_EPOCH: &str = r#"i=0; k=0; while [ $i -lt 16 ]; do i=$((i+1)); n=$(nproc); if [ "$n" = 1 ]; then k=$((k+1)); if [ $k = 2 ]; then sleep 1; else sleep 0.1; fi; else sleep 0.15; fi; echo "TUNEFLEET epoch=$i"; done; echo "TUNEFLEET final accuracy=1""#;

#[test]
fn a_probe_window_with_one_outlying_epoch_is_judged_by_its_median_epoch() {
    if std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) < 2 {
        eprintln!("skipped: needs 2 CPUs to probe 1 against 2");
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let command = serde_json::to_string(&["sh", "-c", ONE_SLOW_EPOCH]).expect("json");
    let text = format!(
        r#"name = "outlier"
command = {command}
{ONE_TRIAL_ON_CORES}
[hyper.v]
kind = "categorical"
values = [1]

[pipeline]
mode = "pipelined"
probe = "grid"
window = {{ epochs = 5, warmup = 1 }}
select = "time"
"#
    );
    let study = dir.path().join("outlier.toml");
    std::fs::write(&study, text).expect("study");
    let out = run_with_one_agent(&study, &store, "outlier", &["--slots", "1"], Duration::from_secs(120));
    assert!(out.contains("1/1 trials done"), "{out}");
    let kept: Vec<String> = query(&store, "SELECT system FROM results WHERE study = 'outlier'", |r| r.get(0));
    let kept: serde_json::Value = serde_json::from_str(&kept[0]).expect("system");
    // By the mean, one CPU's window (0.28 s an epoch) loses to two's (0.15 s).
    assert_eq!(kept["cores"], 1, "the median epoch decides: {kept}");
    let measurement: Vec<String> =
        query(&store, "SELECT measurement FROM results WHERE study = 'outlier'", |r| r.get(0));
    let m: serde_json::Value = serde_json::from_str(&measurement[0]).expect("measurement");
    let probes: Vec<&serde_json::Value> =
        m["segments"].as_array().expect("segments").iter().filter(|s| s["role"] == "Probe").collect();
    // Told apart at once on a quiet machine; a busy one may take the two
    // windows again (at most twice).
    assert!([2, 4, 6].contains(&probes.len()), "{probes:?}");
    let one = probes.iter().find(|s| s["system"]["cores"] == 1).expect("the window on one CPU");
    let median = one["unit_median_us"].as_u64().expect("a median unit");
    assert!((90_000..300_000).contains(&median), "median epoch about 0.1 s, not the 1 s one: {median}");
    let selected = m["segments"].as_array().and_then(|s| s.iter().find(|s| s["role"] == "Selected")).expect("selected");
    assert!(selected["margin"].as_f64().is_some(), "the choice's margin recorded: {selected}");
}
