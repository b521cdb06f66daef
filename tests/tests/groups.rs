//! One study file tunes the same workload on several device
//! groups at once, each with its own selector and budget, reported apart.

use std::time::Duration;

use rusqlite::Connection;
use tunefleet_tests::*;

#[test]
fn each_group_runs_its_budget_on_its_own_agents_and_reports_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let study = dir.path().join("grouped.toml");
    std::fs::write(
        &study,
        r#"name = "grouped"
command = ["sh", "-c", "echo TUNEFLEET epoch=1 v={n}"]
timeout = 30
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 2
[strategy]
kind = "random"
seed = 3
[hyper.n]
kind = "int"
low = 1
high = 100

[[group]]
name = "big"
budget = 5
selector = { tags = { pool = "big" } }

[[group]]
name = "small"
selector = { tags = { pool = "small" } }
"#,
    )
    .expect("write");
    let (code, out, err) = run({
        let mut c = std::process::Command::new(bin("tunefleet"));
        c.arg("check").arg(&study);
        c
    });
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("grouped-big: 5 trials") && out.contains("grouped-small: 2 trials"), "{out}");

    let store = dir.path().join("store.db");
    let root = unique_root("groups");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let big = format!("{root}-big");
    let small = format!("{root}-small");
    let _a = start_agent(&url, &big, &root, &["--tag", "pool=big"]);
    let _b = start_agent(&url, &small, &root, &["--tag", "pool=small"]);
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{status:?}\n{out}");
    assert!(out.contains("study grouped-big: 5/5 trials done"), "{out}");
    assert!(out.contains("study grouped-small: 2/2 trials done"), "{out}");

    let db = Connection::open(&store).expect("store");
    let agents_of = |study: &str| -> Vec<String> {
        db.prepare("SELECT DISTINCT agent FROM results WHERE study = ?1")
            .expect("query")
            .query_map([study], |r| r.get(0))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("agents")
    };
    assert_eq!(agents_of("grouped-big"), vec![big.clone()], "a group's trials run only on its agents");
    assert_eq!(agents_of("grouped-small"), vec![small.clone()]);
    assert_agents_spools_empty(&[&big, &small]);
}
