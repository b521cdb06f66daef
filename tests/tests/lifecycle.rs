//! One ranking in every view, and a study's life after a run
//! (fixed and run again, renamed, deleted). Real coordinator and agent
//! processes on the embedded broker.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tunefleet_tests::*;

/// Two configurations (`x` = 1, 2), four runs each, maximised: `x = 1`
/// scores 50, 10, 30, 30 (a lucky first run, mean 30); `x = 2` scores 41,
/// 39, 40, 40 (mean 40).
fn repeated_study(dir: &Path, name: &str) -> PathBuf {
    let text = r#"name = "NAME"
command = ["awk", "-v", "x={x}", "-v", "r={repeat}", 'BEGIN {{ split(x == 1 ? "50 10 30 30" : "41 39 40 40", v, " "); printf "{{\"event\":\"final\",\"score\":%s}}\n", v[r + 1] }}']
timeout = 60
repeats = 4
[objective]
metric = "score"
direction = "maximize"
[budget]
trials = 8
[strategy]
kind = "grid"
[hyper.x]
kind = "int"
low = 1
high = 2
"#
    .replace("NAME", name);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("study file");
    path
}

#[test]
fn every_view_ranks_configurations_by_the_same_rule() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = repeated_study(dir.path(), "ranked");
    let out = run_with_one_agent(&study, &store, "rank-views", &[], Duration::from_secs(120));
    let s = store.to_str().expect("utf-8");
    // The best run of the better mean: x = 2's first run (41).
    let leader: Vec<i64> =
        query(&store, "SELECT trial FROM trials WHERE study = 'ranked' AND repeat = 0 AND params LIKE '%2%'", |r| {
            r.get(0)
        });
    let lucky: Vec<i64> =
        query(&store, "SELECT trial FROM trials WHERE study = 'ranked' AND repeat = 0 AND params LIKE '%1%'", |r| {
            r.get(0)
        });
    let (leader, lucky) = (leader[0] as u64, lucky[0] as u64);

    // The run's summary: its first best trial is the leader's, with its mean.
    let summary: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("best trials:")).collect();
    assert!(
        summary
            .get(1)
            .is_some_and(|l| l.contains(&format!("trial {leader:>4}")) && l.contains("(mean 40.000000 of 4 runs)")),
        "{out}"
    );

    // `status`: the leader's mean over its 4 runs.
    let (code, text, err) = tunefleet(&["status", "--store", s, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let status: serde_json::Value = serde_json::from_str(&text).expect("json");
    let row = status.as_array().and_then(|a| a.first()).cloned().unwrap_or(status.clone());
    let row = row.get("studies").and_then(|s| s.get(0)).cloned().unwrap_or(row);
    assert_eq!(row["best"], serde_json::json!([40.0, leader]), "{text}");
    assert_eq!(row["best_runs"], 4, "{text}");
    let (_, text, _) = tunefleet(&["status", "--store", s]);
    assert!(text.contains(&format!("best score=40.000000 (mean of 4 runs, best run trial {leader})")), "{text}");

    // `best`: configurations by mean, x = 2 first.
    let (code, text, err) = tunefleet(&["best", "ranked", "--store", s, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let best: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(best["view"], "configurations", "{text}");
    let first = &best["configurations"][0];
    assert_eq!((first["mean"].as_f64(), first["runs"][0][0].as_u64()), (Some(40.0), Some(leader)), "{text}");

    // The report: the first row of the best table is the leader's best run.
    let page = dir.path().join("r.html");
    let (code, _, err) = tunefleet(&["report", "ranked", "--store", s, "-o", page.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    let html = std::fs::read_to_string(&page).expect("page");
    let table = &html[html.find("id=\"table-best\"").expect("the best table")..];
    let first_row = &table[table.find("<td class=\"n\">1</td>").expect("a first row")..];
    assert!(first_row.starts_with(&format!("<td class=\"n\">1</td><td class=\"n\">{leader}</td>")), "{first_row:.300}");
    assert!(first_row[..400.min(first_row.len())].contains("mean 40 of 4 runs"), "{first_row:.400}");
    assert!(!first_row.starts_with(&format!("<td class=\"n\">1</td><td class=\"n\">{lucky}</td>")));

    // The export: the same places, with the configuration's mean and runs.
    let (code, text, err) = tunefleet(&["export", "ranked", "--store", s, "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&text).expect("json");
    let row = |t: u64| rows.as_array().and_then(|a| a.iter().find(|r| r["trial"] == t)).expect("a row").clone();
    assert_eq!((row(leader)["rank"].as_u64(), row(leader)["config_mean"].as_f64()), (Some(1), Some(40.0)));
    assert_eq!(row(leader)["config_runs"], 4);
    assert_eq!(row(lucky)["rank"], 5, "the lucky 50 ranks after the four runs of the better mean");
}

/// A grid study of 3 trials running `command` (a TOML array), reporting `v`.
fn fixable_study(dir: &Path, name: &str, command: &str, timeout: u32) -> PathBuf {
    let text = format!(
        "name = \"{name}\"\ncommand = {command}\ntimeout = {timeout}\nmax_attempts = 1\n\
         [objective]\nmetric = \"v\"\ndirection = \"maximize\"\n[budget]\ntrials = 3\n\
         [strategy]\nkind = \"grid\"\n[hyper.x]\nkind = \"int\"\nlow = 1\nhigh = 3\n"
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("study file");
    path
}

use tunefleet_tests::run_study_logged as run_study;

#[test]
fn a_failed_study_is_fixed_and_run_again_under_its_name_and_the_old_one_stays_readable() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let s = store.to_str().expect("utf-8");
    let crashing = r#"["sh", "-c", "echo 'no such file: data.csv' >&2; exit 3", "{x}"]"#;
    let study = fixable_study(dir.path(), "fixme", crashing, 60);
    let (code, out, log) = run_study(dir.path(), &study, &store, "fix-1");
    assert_eq!(code, Some(4), "every trial crashed: {out}\n{log}");

    // The fixed file is refused, naming the value that differs and the way out.
    let fixed = r#"["sh", "-c", "echo \"{{\\\"event\\\":\\\"final\\\",\\\"v\\\":$0}}\"", "{x}"]"#;
    let study = fixable_study(dir.path(), "fixme", fixed, 60);
    let (code, out, err) = tunefleet(&["run", study.to_str().expect("utf-8"), "--store", s, "--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("command: [\"sh\", \"-c\", \"echo 'no such file: data.csv' >&2; exit 3\""), "{err}");
    assert!(err.contains("tunefleet studies rename fixme fixme-1"), "{err}");

    // Renamed, the old study stays readable; the fixed file runs from the start.
    let (code, out, err) = tunefleet(&["studies", "rename", "fixme", "fixme-1", "--store", s]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, log) = run_study(dir.path(), &study, &store, "fix-2");
    assert_eq!(code, Some(0), "{out}\n{log}");
    assert!(out.contains("3/3 trials done, 0 failed"), "{out}");
    let (code, text, err) = tunefleet(&["best", "fixme", "--store", s, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(text.contains("\"objective\": 3.0"), "the fixed study ranks its own trials: {text}");
    let (code, _, err) = tunefleet(&["best", "fixme-1", "--store", s]);
    assert_eq!(code, Some(1), "the old study's failures stay readable: {err}");
    assert!(err.contains("no such file: data.csv"), "{err}");
    let (_, list, _) = tunefleet(&["studies", "--store", s]);
    assert!(list.contains("fixme-1") && list.contains("fixme "), "{list}");

    // A longer timeout alone continues the study (nothing runs again).
    let study = fixable_study(dir.path(), "fixme", fixed, 120);
    let (code, out, log) = run_study(dir.path(), &study, &store, "fix-3");
    assert_eq!(code, Some(0), "{out}\n{log}");
    assert!(log.contains("timeout: 60 -> 120"), "{log}");
    let attempts = query(&store, "SELECT COUNT(*) FROM attempts WHERE study = 'fixme'", |r| r.get::<_, i64>(0));
    assert_eq!(attempts, vec![3]);

    // Deleted, the old study is gone everywhere; the new one is untouched.
    let (code, out, err) = tunefleet(&["studies", "delete", "fixme-1", "--store", s]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("3 trials"), "{out}");
    for table in ["trials", "attempts", "results", "studies"] {
        let column = if table == "studies" { "name" } else { "study" };
        let left =
            query(&store, &format!("SELECT COUNT(*) FROM {table} WHERE {column} = 'fixme-1'"), |r| r.get::<_, i64>(0));
        assert_eq!(left, vec![0], "{table}");
    }
    assert_eq!(query(&store, "SELECT COUNT(*) FROM results WHERE study = 'fixme'", |r| r.get::<_, i64>(0)), vec![3]);
    let (code, _, err) = tunefleet(&["studies", "delete", "fixme-1", "--store", s]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no study \"fixme-1\""), "{err}");
}

#[test]
fn relative_paths_in_a_command_are_relative_to_the_agents_workdir() {
    let dir = tempfile::tempdir().expect("tmp");
    let work = dir.path().join("work");
    std::fs::create_dir_all(work.join("scripts")).expect("workdir");
    std::fs::write(work.join("scripts/job.sh"), "echo TUNEFLEET final v=$1\n").expect("script");
    let study = fixable_study(dir.path(), "relative", r#"["sh", "scripts/job.sh", "{x}"]"#, 60);
    let store = dir.path().join("s.db");
    let work_arg = work.to_str().expect("utf-8").to_string();
    // The agent starts elsewhere (the test's directory); --workdir says where trials run.
    let out = run_with_one_agent(&study, &store, "workdir", &["--workdir", &work_arg], Duration::from_secs(60));
    assert!(out.contains("3/3 trials done, 0 failed"), "{out}");
    let values = query(&store, "SELECT objective FROM results ORDER BY trial", |r| r.get::<_, f64>(0));
    assert_eq!(values, vec![1.0, 2.0, 3.0]);
}

/// Before, `studies rename` trusted the coordinator's heartbeat: stalled
/// 11 s, a running coordinator was taken for gone and its study renamed
/// under it (it then exited on `unknown trial`).
#[test]
fn a_stalled_coordinator_still_keeps_its_study_from_being_renamed_or_deleted() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let s = store.to_str().expect("utf-8");
    let root = unique_root("stall");
    let study = sleep_study(dir.path(), "stall", 6, 1.0);
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let name = format!("{root}-a");
    let _agent = start_agent(&url, &name, &root, &[]);
    let running = || {
        let (_, out, _) = tunefleet(&["status", "stall", "--store", s, "--json"]);
        out.contains("\"coordinator_running\": true") || out.contains("\"coordinator_running\":true")
    };
    wait_for("the study running", Duration::from_secs(30), running);
    coord.signal("STOP");
    // Stopped past the heartbeat's age: status no longer takes it for running.
    wait_for("the heartbeat gone stale", Duration::from_secs(30), || !running());
    for args in [["studies", "rename", "stall", "stall-1"].as_slice(), ["studies", "delete", "stall"].as_slice()] {
        let (code, out, err) = tunefleet(&[args, &["--store", s]].concat());
        assert_eq!(code, Some(1), "{args:?} went through: {out}{err}");
        assert!(err.contains("running lock"), "{err}");
    }
    coord.signal("CONT");
    assert!(coord.wait_exit(Duration::from_secs(60)).success(), "the study finished");
    let (code, out, err) = tunefleet(&["studies", "rename", "stall", "stall-1", "--store", s]);
    assert_eq!(code, Some(0), "once it stopped: {out}{err}");
    assert_agents_spools_empty(&[&name]);
}

/// Before, `last seen` was an agent's Hello: a busy agent showed `last seen
/// 8 min ago`. Now it is the last message heard (written every 5 s at most).
#[test]
fn last_seen_follows_what_a_busy_agent_says() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("seen");
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "seen", 2, 6.0), &store, &root, &[]);
    let name = format!("{root}-a");
    let _agent = start_agent(&url, &name, &root, &["--telemetry-interval", "1s"]);
    let seen = || {
        let rows: Vec<(i64, i64)> =
            query(&store, "SELECT first_seen_ms, last_seen_ms FROM agents", |r| Ok((r.get(0)?, r.get(1)?)));
        rows.first().map_or(0, |(first, last)| last - first)
    };
    wait_for("last seen to move on while the agent works", Duration::from_secs(11), || seen() >= 5_000);
    let (_, out, _) = tunefleet(&["agents", "--store", store.to_str().expect("utf-8")]);
    assert!(!out.contains("min ago"), "{out}");
    assert!(coord.wait_exit(Duration::from_secs(60)).success());
    assert_agents_spools_empty(&[&name]);
}

/// A study over `x` in [`low`, `high`] scoring `-(x - 0.3)^2`, with `strategy`
/// and `extra` lines (a `[warm_start]`).
fn parabola(dir: &Path, name: &str, strategy: &str, low: f64, high: f64, trials: u32, extra: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    // TOML literal strings: awk reads the backslashes; `{{` is a literal brace to the template.
    let command = r#"command = ['awk', '-v', 'x={x}', 'BEGIN {{ printf "{{\"event\":\"final\",\"v\":%f}}\n", -(x - 0.3) ^ 2 }}']"#;
    let text = format!(
        "name = \"{name}\"\n{command}\ntimeout = 30\n[objective]\nmetric = \"v\"\ndirection = \"maximize\"\n\
         [budget]\ntrials = {trials}\n[strategy]\n{strategy}\n{extra}\n[hyper.x]\nkind = \"float\"\nlow = {low:?}\nhigh = {high:?}\n"
    );
    std::fs::write(&p, text).expect("study");
    p
}

/// Before, a study whose range had to change could only start again cold.
/// Now `[warm_start]` tells its search the earlier study's results that lie
/// in its space: its first ask is near the earlier best where the same
/// study started cold asks elsewhere.
#[test]
fn a_study_with_a_narrowed_range_starts_warm_from_the_earlier_results() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let first = parabola(dir.path(), "first", "kind = \"random\"\nseed = 1", 0.0, 1.0, 16, "");
    let (code, out, log) = run_study(dir.path(), &first, &store, "warm-1");
    assert_eq!(code, Some(0), "{out}\n{log}");
    let inside: Vec<i64> = query(
        &store,
        "SELECT COUNT(*) FROM trials WHERE study = 'first' AND json_extract(params, '$.x') BETWEEN 0.1 AND 0.6",
        |r| r.get(0),
    );
    let gp = "kind = \"gp\"\nseed = 3";
    let warm = parabola(dir.path(), "warm", gp, 0.1, 0.6, 1, "[warm_start]\nstudies = [\"first\"]");
    let (code, out, log) = run_study(dir.path(), &warm, &store, "warm-2");
    assert_eq!(code, Some(0), "{out}\n{log}");
    assert!(log.contains(&format!("told={}", inside[0])), "the results inside the new range told: {log}");
    let cold = parabola(dir.path(), "cold", gp, 0.1, 0.6, 1, "");
    let (code, out, log) = run_study(dir.path(), &cold, &store, "warm-3");
    assert_eq!(code, Some(0), "{out}\n{log}");
    let x0 = |study: &str| -> f64 {
        let v: Vec<f64> = query(
            &store,
            &format!("SELECT json_extract(params, '$.x') FROM trials WHERE study = '{study}' AND trial = 0"),
            |r| r.get(0),
        );
        v[0]
    };
    let (w, c) = (x0("warm"), x0("cold"));
    assert!((w - 0.3).abs() < 0.08, "the warm study's first trial, x = {w}, is near the earlier best 0.3");
    assert!((w - c).abs() > 1e-9, "the cold one's first, x = {c}, is another");
}
