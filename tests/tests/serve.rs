//! A long-running coordinator. `tunefleet serve` with two real
//! agents; studies submitted and cancelled from "another shell" (the CLI as
//! a separate process, over the control socket); `status --json` read while
//! it runs.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tunefleet_tests::*;

fn cli(store: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = Command::new(bin("tunefleet"));
    c.args(args).arg("--store").arg(store);
    run(c)
}

/// `status --json`, parsed.
fn status(store: &Path) -> Vec<serde_json::Value> {
    let (code, out, err) = cli(store, &["status", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str(&out).expect("status --json is a list of studies")
}

fn study_state<'a>(rows: &'a [serde_json::Value], name: &str) -> Option<&'a serde_json::Value> {
    rows.iter().find(|r| r["study"] == name)
}

/// Processes whose environment holds `marker` (the cancelled study's workloads).
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()))
        })
        .collect()
}

#[test]
fn studies_submitted_to_a_service_share_the_fleet_and_a_cancelled_one_stops_everywhere() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("serve.db");
    let root = unique_root("serve");
    join_root(&root, &store);
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root", &root]).arg("--store").arg(&store);
    cmd.env("XDG_STATE_HOME", state_home());
    let mut service = Proc::spawn("service", cmd);
    let control = service.wait_line(Duration::from_secs(30), |l| l.starts_with("control: "));
    let socket = control.trim_start_matches("control: ").trim().to_string();
    assert_eq!(
        Path::new(&socket),
        store.with_extension("control").join("control.sock"),
        "the socket is in a directory beside the store"
    );
    let url = service.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let url = url.trim_start_matches("broker: ").trim().to_string();
    wait_for("the control socket", Duration::from_secs(30), || Path::new(&socket).exists());
    let names = [format!("{root}-a"), format!("{root}-b")];
    let _agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &["--slots", "1"])).collect();

    // Two studies from another shell, side by side on the two agents.
    let one = sleep_study(dir.path(), "one", 6, 0.3);
    let two = sleep_study(dir.path(), "two", 6, 0.3);
    for s in [&one, &two] {
        let (code, out, err) = cli(&store, &["submit", s.to_str().expect("path")]);
        assert_eq!(code, Some(0), "{err}");
        assert!(out.contains("submitted"), "{out}");
    }
    let (code, _, err) = cli(&store, &["submit", one.to_str().expect("path")]);
    assert_ne!(code, Some(0), "a study that runs already is refused");
    assert!(err.contains("running already"), "{err}");

    // A long study, cancelled while its attempts run.
    let marker = format!("TUNEFLEET_SERVE_TEST={root}");
    let long = dir.path().join("long.toml");
    std::fs::write(
        &long,
        format!(
            r#"name = "long"
command = ["sh", "-c", "sleep 60; echo TUNEFLEET epoch=1 v=1"]
lookahead = 0
env = {{ TUNEFLEET_SERVE_TEST = "{root}" }}
timeout = 120
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 4
[strategy]
kind = "grid"
[hyper.n]
kind = "int"
low = 1
high = 4
"#
        ),
    )
    .expect("write");

    // Both finish; meanwhile status --json matches the store.
    let start = Instant::now();
    let mut saw_both_running = false;
    loop {
        let rows = status(&store);
        let running = |n: &str| study_state(&rows, n).and_then(|r| r["running"].as_u64()).unwrap_or(0);
        saw_both_running |= running("one") > 0 && running("two") > 0;
        let finished = |n: &str| study_state(&rows, n).is_some_and(|r| r["state"] == "finished");
        if finished("one") && finished("two") {
            for r in &rows {
                let db = Connection::open(&store).expect("store");
                let done: i64 = db
                    .query_row(
                        "SELECT COUNT(*) FROM trials WHERE study = ?1 AND state = 'done'",
                        [r["study"].as_str()],
                        |x| x.get(0),
                    )
                    .expect("count");
                assert_eq!(r["done"].as_i64(), Some(done), "status matches the store: {r}");
            }
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(90), "studies did not finish: {rows:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(saw_both_running, "the two studies ran side by side, not one after the other");

    let (code, _, err) = cli(&store, &["submit", long.to_str().expect("path")]);
    assert_eq!(code, Some(0), "{err}");
    wait_for("the long study's workloads running", Duration::from_secs(30), || processes_with(&marker).len() >= 2);
    let (code, out, err) = cli(&store, &["cancel", "long"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("2 attempts cancelled on their agents"), "{out}");
    wait_for("no attempt of the cancelled study left running", Duration::from_secs(30), || {
        processes_with(&marker).is_empty()
    });
    wait_for("the cancelled study finished", Duration::from_secs(30), || {
        // Trials are created as agents have room (places held ahead count,
        // though this study takes only free slots): every one stopped.
        study_state(&status(&store), "long")
            .is_some_and(|r| r["state"] == "finished" && r["stopped"] == r["total"] && r["total"].as_u64() >= Some(2))
    });
    let (code, _, err) = cli(&store, &["cancel", "nope"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("no study \"nope\""), "{err}");

    // SIGTERM: the service drains and exits; every result was acknowledged.
    service.signal("TERM");
    let status = service.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert!(!Path::new(&socket).exists(), "the socket is removed on exit");
    assert_agents_spools_empty(&[&names[0], &names[1]]);
}

/// Starts `tunefleet serve` on `store`; returns it and its broker URL once
/// its socket exists.
fn serve(store: &Path, root: &str) -> (Proc, String) {
    join_root(root, store);
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root", root]).arg("--store").arg(store);
    cmd.env("XDG_STATE_HOME", state_home());
    let mut service = Proc::spawn("service", cmd);
    let url = service.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    wait_for("the control socket", Duration::from_secs(30), || {
        tunefleet_coordinator::runtime::control::default_path(store).exists()
    });
    (service, url.trim_start_matches("broker: ").trim().to_string())
}

#[test]
fn a_study_no_agent_took_yet_survives_a_restart_of_the_service() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("restart.db");
    let root = unique_root("serve-restart");
    let (mut service, _) = serve(&store, &root);
    let study = sleep_study(dir.path(), "waiting", 3, 0.1);
    let (code, _, err) = cli(&store, &["submit", study.to_str().expect("path")]);
    assert_eq!(code, Some(0), "{err}");
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    let rows = status(&store);
    // Its service stopped before any agent came: not running, and `status` says so.
    let waiting = study_state(&rows, "waiting");
    assert_eq!(waiting.map(|r| r["state"].clone()), Some("interrupted".into()), "{rows:?}");
    assert_eq!(waiting.map(|r| r["coordinator_running"].clone()), Some(false.into()), "{rows:?}");
    assert_eq!(waiting.map(|r| r["total"].clone()), Some(3.into()), "its budget: {rows:?}");

    // Restarted, the service resumes it; a second one on the same store is refused.
    let (mut service, url) = serve(&store, &root);
    let (code, _, err) = {
        let mut c = Command::new(bin("tunefleet"));
        c.args(["serve", "--listen", "127.0.0.1:0"]).arg("--store").arg(&store);
        run(c)
    };
    assert_ne!(code, Some(0));
    assert!(err.contains("in use by a running service"), "{err}");
    // Watched from another shell while it runs (plain lines: not a terminal).
    let watch = |what: &str| {
        let mut c = Command::new(bin("tunefleet"));
        c.args([what, "--watch"]).arg("--store").arg(&store);
        Proc::spawn(what, c)
    };
    let mut watching = watch("status");
    let agent = format!("{root}-agent");
    let _a = start_agent(&url, &agent, &root, &[]);
    let mut agents = watch("agents");
    agents.wait_line(Duration::from_secs(30), |l| l.starts_with(&agent) && l.contains("online"));
    watching.wait_line(Duration::from_secs(60), |l| l.starts_with("waiting finished: 3/3 done"));
    wait_for("the resumed study finished", Duration::from_secs(60), || {
        study_state(&status(&store), "waiting").is_some_and(|r| r["state"] == "finished" && r["done"] == 3)
    });
    for mut w in [watching, agents] {
        w.signal("INT");
        assert!(w.wait_exit(Duration::from_secs(10)).success(), "--watch ends cleanly on Ctrl-C");
    }
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    assert_agents_spools_empty(&[&agent]);
}

/// `tunefleet enqueue` into a study a service runs: the configuration is
/// the next trial created, checked as a `[[enqueue]]` entry (an unknown
/// parameter is refused with the reason), and kept in the stored file.
#[test]
fn a_configuration_enqueued_into_a_running_study_is_the_next_one_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("enqueue.db");
    let root = unique_root("serve-enqueue");
    let (mut service, url) = serve(&store, &root);
    let study = dir.path().join("random.toml");
    std::fs::write(
        &study,
        r#"name = "random"
command = ["sh", "-c", "sleep 0.2; echo TUNEFLEET final v={x}"]
lookahead = 0
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 12
[strategy]
kind = "random"
seed = 5
[hyper.x]
kind = "float"
low = 0.0
high = 1.0
[hyper.opt]
kind = "categorical"
values = ["adam", "sgd"]
"#,
    )
    .expect("write");
    let (code, _, err) = cli(&store, &["submit", study.to_str().expect("path")]);
    assert_eq!(code, Some(0), "{err}");
    let agent = format!("{root}-agent");
    let _a = start_agent(&url, &agent, &root, &["--slots", "1"]);
    let created = || -> i64 {
        let db = Connection::open(&store).expect("store");
        db.query_row("SELECT COUNT(*) FROM trials WHERE study = 'random'", [], |r| r.get(0)).expect("count")
    };
    wait_for("a few trials created", Duration::from_secs(60), || created() >= 3);
    let (code, _, err) = cli(&store, &["enqueue", "random", "depth=3"]);
    assert_ne!(code, Some(0), "an unknown parameter is refused");
    assert!(err.contains("not a parameter this study searches"), "{err}");
    let (code, out, err) = cli(&store, &["enqueue", "random", "x=0.123456", "opt=sgd"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("enqueued"), "{out}");
    let before = created();
    wait_for("the study finished", Duration::from_secs(90), || {
        study_state(&status(&store), "random").is_some_and(|r| r["state"] == "finished" && r["done"] == 12)
    });
    let db = Connection::open(&store).expect("store");
    let (trial, params): (i64, String) = db
        .query_row(
            "SELECT trial, params FROM trials WHERE study = 'random' AND params LIKE '%0.123456%' ORDER BY trial",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("the enqueued configuration ran");
    assert!(params.contains("sgd"), "{params}");
    // Trials are created as the one slot frees: the next one made after the answer.
    assert!(trial <= before, "trial {trial}, {before} created when it was enqueued");
    let config: String =
        db.query_row("SELECT config FROM studies WHERE name = 'random'", [], |r| r.get(0)).expect("config");
    assert!(config.contains("[[enqueue]]") && config.contains("x = 0.123456"), "{config}");
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    assert_agents_spools_empty(&[&agent]);
}
