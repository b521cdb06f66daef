//! Issue 12: the coordinator launches its own agents (`--launcher`), here
//! local `tunefleet-agent` processes standing in for AWS Batch, Kubernetes
//! or Slurm jobs: at most `--launch-max` at once, trusting only this
//! coordinator's key, exiting when idle once the study is done.

use std::time::Duration;

use rusqlite::Connection;
use tunefleet_tests::*;

/// Processes running the agent binary whose command line names `root`.
fn launched_agents(root: &str) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                args.first().is_some_and(|a| a.ends_with(b"tunefleet-agent")) && args.contains(&root.as_bytes())
            })
        })
        .count()
}

#[test]
fn launched_agents_run_the_study_within_the_bound_and_exit_when_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study(dir.path(), "launched", 8, 0.3);
    let store = dir.path().join("store.db");
    let root = unique_root("launch");
    let agent = bin("tunefleet-agent");
    let template = format!(
        "{} --broker {{broker}} --name {{name}} --root {{root}} --slots 1 --exit-when-idle=1s",
        agent.display()
    );
    let (mut coord, _url) = start_coordinator(
        &study,
        &store,
        &root,
        &["--launcher", &template, "--launch-max", "2", "--launch-grace", "30s"],
    );
    let mut most = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while coord.child.try_wait().expect("try_wait").is_none() && std::time::Instant::now() < deadline {
        most = most.max(launched_agents(&root));
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{status:?}\n{out}");
    assert!(out.contains("8/8 trials done"), "{out}");
    assert!((1..=2).contains(&most), "at most --launch-max agents at once (saw {most})");

    let db = Connection::open(&store).expect("store");
    let names: Vec<String> = db
        .prepare("SELECT DISTINCT agent FROM results ORDER BY agent")
        .expect("query")
        .query_map([], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("agents");
    assert!(!names.is_empty() && names.len() <= 2, "{names:?}");
    assert!(names.iter().all(|n| n.starts_with("launched-")), "the launcher named them: {names:?}");
    // Each joined with its batch's token (from the environment, not the
    // command line), made for its name alone (issue 35).
    let bound: Vec<String> = db
        .prepare("SELECT names FROM join_tokens WHERE names IS NOT NULL")
        .expect("query")
        .query_map([], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("tokens");
    for n in &names {
        assert!(bound.iter().any(|b| b.contains(&format!("\"{n}\""))), "{n} has a token of its own: {bound:?}");
    }
    assert!(!out.contains("--join"), "no token on a command line: {out}");
    wait_for("the launched agents exit when idle", Duration::from_secs(30), || launched_agents(&root) == 0);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
}
