//! A campaign runs its workloads as studies of their own, side by
//! side on one fleet, reports each and the whole, and resumes after the
//! coordinator is killed.

use std::time::Duration;

use rusqlite::Connection;
use tunefleet_tests::*;

#[test]
fn a_campaign_runs_each_workload_as_a_study_and_resumes_after_a_kill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let campaign = dir.path().join("campaign.toml");
    // Two workloads from the defaults, one of them from a study file.
    std::fs::write(
        dir.path().join("sleepy.toml"),
        r#"command = ["sh", "-c", "sleep {secs}; echo TUNEFLEET epoch=1 value={secs}"]
[hyper.secs]
kind = "categorical"
values = [0.2, 0.3, 0.4, 0.5]
"#,
    )
    .expect("write");
    std::fs::write(
        &campaign,
        r#"name = "camp"
[defaults]
timeout = 30
[defaults.objective]
metric = "value"
direction = "minimize"
[defaults.budget]
trials = 4
[defaults.strategy]
kind = "grid"

[[workload]]
name = "sleepy"
file = "sleepy.toml"

[[workload]]
name = "quick"
command = ["sh", "-c", "echo TUNEFLEET epoch=1 value={n}"]
hyper.n = { kind = "int", low = 1, high = 4 }
"#,
    )
    .expect("write");
    let store = dir.path().join("store.db");
    let root = unique_root("campaign");
    let agent = format!("{root}-agent");
    let start = |root: &str| {
        join_root(root, &store);
        let mut cmd = std::process::Command::new(bin("tunefleet"));
        cmd.arg("campaign").arg(&campaign).arg("--store").arg(&store).args(["--root", root, "--quiet"]);
        cmd.args(["--listen", "127.0.0.1:0"]).env("XDG_STATE_HOME", state_home());
        let mut p = Proc::spawn("coordinator", cmd);
        let line = p.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
        let url = line.trim_start_matches("broker: ").trim().to_string();
        (p, url)
    };

    // First run: killed once a few trials are done.
    let (mut coord, url) = start(&root);
    let mut a = start_agent(&url, &agent, &root, &["--slots", "1"]);
    let db = Connection::open(&store).expect("store");
    let done =
        || -> i64 { db.query_row("SELECT COUNT(*) FROM trials WHERE state = 'done'", [], |r| r.get(0)).unwrap_or(0) };
    wait_for("three trials done", Duration::from_secs(60), || done() >= 3);
    coord.signal("KILL");
    coord.wait_exit(Duration::from_secs(10));
    let before = done();
    assert!(before < 8, "killed before the end ({before} done)");
    let studies: Vec<String> = db
        .prepare("SELECT name FROM studies ORDER BY name")
        .expect("query")
        .query_map([], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("names");
    assert_eq!(studies, vec!["camp-quick", "camp-sleepy"], "one study per workload, named after the campaign");
    a.signal("TERM");
    a.wait_exit(Duration::from_secs(20));

    // Second run: the same command goes on where the first stopped.
    let root2 = unique_root("campaign2");
    let (mut coord, url) = start(&root2);
    let mut a = start_agent(&url, &agent, &root2, &["--slots", "1"]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{status:?}\n{out}");
    assert!(out.contains("study camp-sleepy: 4/4 trials done"), "{out}");
    assert!(out.contains("study camp-quick: 4/4 trials done"), "{out}");
    assert!(out.contains("campaign camp: 2/2 workloads finished, 8/8 trials done"), "{out}");
    assert_eq!(done(), 8);
    let results: i64 = db.query_row("SELECT COUNT(*) FROM results", [], |r| r.get(0)).expect("count");
    assert_eq!(results, 8, "every trial measured once, none lost to the kill");
    assert_agents_spools_empty(&[&agent]);
    a.signal("TERM");
    a.wait_exit(Duration::from_secs(20));
}
