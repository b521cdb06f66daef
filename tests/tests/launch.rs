//! The coordinator launches its own agents (`--launcher`), here
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
    // command line), made for its name alone.
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

/// Before, a launched container restarted with empty state (Kubernetes'
/// `restartPolicy: OnFailure`, AWS Batch's retries) came back under its
/// name with a new key and was refused for ever. Now the launch token that
/// enrolled the name re-keys it, and the trial the lost container held runs
/// again: every trial once.
#[test]
fn a_launched_agent_restarted_with_empty_state_rejoins_and_nothing_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display().to_string();
    let study = dir.path().join("restart.toml");
    std::fs::write(
        &study,
        format!(
            "name = \"restart\"\ncommand = [\"sh\", \"-c\", \"touch {d}/started; sleep 0.5; echo '{{{{\\\"event\\\":\\\"final\\\",\\\"v\\\":'$0'}}}}'\", \"{{x}}\"]\n\
             timeout = 30\n[objective]\nmetric = \"v\"\ndirection = \"maximize\"\n[budget]\ntrials = 4\n\
             [strategy]\nkind = \"grid\"\n[hyper.x]\nkind = \"int\"\nlow = 1\nhigh = 4\n"
        ),
    )
    .expect("study");
    // The container: its agent killed once its first trial started, then
    // started again with a state directory of its own, as a restarted one is.
    let script = dir.path().join("container.sh");
    let agent = bin("tunefleet-agent");
    std::fs::write(
        &script,
        format!(
            "A={agent}\nS={d}/state-$2\n$A --broker $1 --name $2 --root $3 --state-dir $S-1 --exit-when-idle=2s &\np=$!\n\
             while [ ! -e {d}/started ]; do sleep 0.05; done\nkill -9 $p\n\
             exec $A --broker $1 --name $2 --root $3 --state-dir $S-2 --exit-when-idle=2s\n",
            agent = agent.display()
        ),
    )
    .expect("script");
    let store = dir.path().join("store.db");
    let root = unique_root("restart");
    let log = dir.path().join("coordinator.log");
    let template = format!("sh {} {{broker}} {{name}} {{root}}", script.display());
    let extra = ["--launcher", &template, "--launch-max", "1", "--launch-grace", "30s"];
    let (mut coord, _url) = start_coordinator_logged(&study, &store, &root, &extra, Some(&log));
    let status = coord.wait_exit(Duration::from_secs(90));
    let out = coord.rest_of_stdout().join("\n");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{out}\n{log}");
    assert!(out.contains("4/4 trials done, 0 failed"), "{out}");
    assert!(log.contains("agent re-keyed by the launch token that enrolled it"), "{log}");
    let db = Connection::open(&store).expect("store");
    let once: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM (SELECT trial FROM results WHERE success = 1 GROUP BY trial HAVING COUNT(*) = 1)",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(once, 4, "every trial done once");
    let names: Vec<String> = db
        .prepare("SELECT DISTINCT agent FROM results")
        .expect("query")
        .query_map([], |r| r.get(0))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("agents");
    let dirs: Vec<std::path::PathBuf> = names
        .iter()
        .flat_map(|n| [1, 2].map(|i| dir.path().join(format!("state-{n}-{i}"))))
        .filter(|p| p.exists())
        .collect();
    assert!(!dirs.is_empty(), "{names:?}");
    assert_spools_empty(&dirs);
}
