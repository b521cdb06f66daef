//! Fault injection with real processes. Every test ends by checking that each
//! trial of the study has exactly one accepted result.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension};
use tunefleet_tests::mosquitto::{Mosquitto, FLEET_OPTIONS};
use tunefleet_tests::*;

fn unix_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn db(store: &Path) -> Connection {
    Connection::open(store).expect("store")
}

/// Each trial has exactly one accepted result, and it is the value the trial reported.
fn assert_exactly_once(store: &Path, study: &str, trials: i64) {
    let c = db(store);
    let rows: Vec<(i64, f64)> = c
        .prepare("SELECT trial, objective FROM results WHERE study = ?1 ORDER BY trial")
        .expect("prepare")
        .query_map([study], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(rows.len() as i64, trials, "one result per trial: {rows:?}");
    for (i, (trial, v)) in rows.iter().enumerate() {
        assert_eq!(*trial, i as i64);
        assert_eq!(*v, (i + 1) as f64, "trial {trial} stored its own value");
    }
    let done: i64 = c
        .query_row("SELECT COUNT(*) FROM trials WHERE study = ?1 AND state = 'done'", [study], |r| r.get(0))
        .expect("n");
    assert_eq!(done, trials);
}

/// (trial, attempt) of an attempt `agent` holds now (running, or held
/// ahead), if any.
fn running_on(store: &Path, agent: &str) -> Option<(i64, i64)> {
    held_by(store, agent).into_iter().next()
}

fn results_count(store: &Path) -> i64 {
    Connection::open(store)
        .ok()
        .and_then(|c| c.query_row("SELECT COUNT(*) FROM results", [], |r| r.get(0)).ok())
        .unwrap_or(0)
}

#[test]
fn agent_killed_mid_trial_is_requeued_at_once_and_completes_elsewhere() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("killagent");
    let store = dir.path().join("s.db");
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "k", 6, 1.0), &store, &root, &[]);
    let victim = start_agent(&url, "victim", &root, &["--keepalive", "5"]);
    let mut running = None;
    wait_for("the victim to run a trial", Duration::from_secs(90), || {
        running = running_on(&store, "victim");
        running.is_some()
    });
    let (trial, attempt) = running.expect("running");
    let killed_at = unix_ms();
    victim.signal("KILL");
    let _other = start_agent(&url, "survivor", &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    assert_exactly_once(&store, "k", 6);
    let c = db(&store);
    let (ended, outcome): (i64, String) = c
        .query_row(
            "SELECT ended_ms, outcome FROM attempts WHERE study = 'k' AND trial = ?1 AND attempt = ?2",
            [trial, attempt],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("the killed attempt");
    assert!(outcome.contains("offline"), "requeued because the agent went offline: {outcome}");
    let winner: String =
        c.query_row("SELECT agent FROM results WHERE study = 'k' AND trial = ?1", [trial], |r| r.get(0)).expect("r");
    assert_eq!(winner, "survivor");
    let latency = ended - killed_at;
    eprintln!("requeue latency after SIGKILL: {latency} ms (keepalive 5 s)");
    // The Last Will fires on the TCP reset, not after 1.5 x keepalive (7.5 s) nor the lease (90 s).
    assert!(latency < 5_000, "requeue took {latency} ms");
    assert_agents_spools_empty(&["victim", "survivor"]);
}

/// (trial, attempt) of every attempt `agent` holds now: running or held ahead.
fn held_by(store: &Path, agent: &str) -> Vec<(i64, i64)> {
    let Ok(c) = Connection::open(store) else { return Vec::new() };
    let Ok(mut q) = c.prepare(
        "SELECT a.trial, a.attempt FROM attempts a JOIN trials t ON t.study = a.study AND t.trial = a.trial
         WHERE a.agent = ?1 AND a.ended_ms IS NULL AND t.state = 'running' ORDER BY a.trial",
    ) else {
        return Vec::new();
    };
    q.query_map([agent], |r| Ok((r.get(0)?, r.get(1)?)))
        .map(|rows| rows.filter_map(Result::ok).collect())
        .unwrap_or_default()
}

#[test]
fn an_agent_killed_while_holding_a_trial_ahead_loses_neither_and_runs_neither_twice() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("killahead");
    let store = dir.path().join("s.db");
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "h", 6, 2.0), &store, &root, &[]);
    // One slot, one trial held ahead (the default lookahead).
    let holder = start_agent(&url, "holder", &root, &["--keepalive", "5"]);
    let mut held = Vec::new();
    wait_for("the holder to hold a trial ahead of the running one", Duration::from_secs(90), || {
        held = held_by(&store, "holder");
        held.len() == 2
    });
    wait_for_workload(&holder);
    holder.signal("KILL");
    let _other = start_agent(&url, "heir", &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    assert_exactly_once(&store, "h", 6);
    let c = db(&store);
    for (trial, attempt) in &held {
        let outcome: String = c
            .query_row(
                "SELECT outcome FROM attempts WHERE study = 'h' AND trial = ?1 AND attempt = ?2",
                [trial, attempt],
                |r| r.get(0),
            )
            .expect("the holder's attempt");
        assert!(outcome.contains("offline"), "trial {trial}: ended when the agent went offline: {outcome}");
        let winner: String = c
            .query_row("SELECT agent FROM results WHERE study = 'h' AND trial = ?1", [trial], |r| r.get(0))
            .expect("r");
        assert_eq!(winner, "heir", "trial {trial} ran once, on the heir");
    }
    // Every attempt given to the heir was a trial of its own, and ran.
    let (attempts, trials): (i64, i64) = c
        .query_row(
            "SELECT COUNT(*), COUNT(DISTINCT trial) FROM attempts WHERE study = 'h' AND agent = 'heir'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("n");
    let by_holder: i64 = c
        .query_row("SELECT COUNT(*) FROM results WHERE study = 'h' AND agent = 'holder'", [], |r| r.get(0))
        .expect("n");
    assert_eq!((attempts, trials), (6 - by_holder, 6 - by_holder), "each trial left once on the heir");
    assert_agents_spools_empty(&["holder", "heir"]);
}

#[test]
fn silent_agent_is_requeued_after_its_keepalive_runs_out() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("silent");
    let store = dir.path().join("s.db");
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "q", 4, 1.0), &store, &root, &[]);
    // keepalive 2 s: the broker gives up on a silent client after 1.5 x 2 s.
    // No trial held ahead: woken, it would start one before it notices its
    // connection is gone (docs/RELIABILITY.md), a late result this test's
    // coordinator may finish without.
    let frozen = start_agent(&url, "frozen", &root, &["--keepalive", "2", "--lookahead", "0"]);
    let mut running = None;
    wait_for("the agent to run a trial", Duration::from_secs(90), || {
        running = running_on(&store, "frozen");
        running.is_some()
    });
    let (trial, attempt) = running.expect("running");
    // SIGSTOP: the process and its socket stay, it just stops talking (a partition, a frozen phone).
    let stopped_at = unix_ms();
    frozen.signal("STOP");
    let _other = start_agent(&url, "awake", &root, &[]);
    let mut ended = None;
    wait_for("the frozen agent's attempt to be requeued", Duration::from_secs(30), || {
        ended = db(&store)
            .query_row(
                "SELECT ended_ms FROM attempts WHERE study = 'q' AND trial = ?1 AND attempt = ?2 AND ended_ms IS NOT NULL",
                [trial, attempt],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .ok()
            .flatten();
        ended.is_some()
    });
    let latency = ended.expect("ended") - stopped_at;
    eprintln!("requeue latency after SIGSTOP: {latency} ms (keepalive 2 s)");
    frozen.signal("CONT");
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    assert_exactly_once(&store, "q", 4);
    // Not before the broker could know (1.5 x keepalive), not as late as the lease (90 s).
    assert!((2_000..20_000).contains(&latency), "requeue after {latency} ms");
    assert_agents_spools_empty(&["frozen", "awake"]);
}

#[test]
fn coordinator_killed_mid_study_resumes_from_its_store() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("killcoord");
    let store = dir.path().join("s.db");
    let study = sleep_study(dir.path(), "c", 10, 0.3);
    let (coord, url) = start_coordinator(&study, &store, &root, &[]);
    let _a1 = start_agent(&url, "c-agent-1", &root, &[]);
    let _a2 = start_agent(&url, "c-agent-2", &root, &[]);
    wait_for("a few results", Duration::from_secs(60), || results_count(&store) >= 3);
    coord.signal("KILL");
    drop(coord);
    let before: Vec<(i64, i64)> = db(&store)
        .prepare("SELECT trial, attempt FROM results ORDER BY trial")
        .expect("p")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("q")
        .map(|r| r.expect("row"))
        .collect();
    assert!(before.len() >= 3 && before.len() < 10, "{before:?}");
    // Same port, so the agents find it again.
    let listen = url.trim_start_matches("mqtt://").to_string();
    let (mut again, _) = start_coordinator(&study, &store, &root, &["--listen", &listen]);
    let status = again.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    assert_exactly_once(&store, "c", 10);
    let c = db(&store);
    for (trial, attempt) in before {
        let now: i64 = c.query_row("SELECT attempt FROM results WHERE trial = ?1", [trial], |r| r.get(0)).expect("r");
        assert_eq!(now, attempt, "a finished trial was not run again");
        let attempts: i64 =
            c.query_row("SELECT COUNT(*) FROM attempts WHERE trial = ?1", [trial], |r| r.get(0)).expect("n");
        assert_eq!(attempts, 1, "trial {trial} finished before the crash ran once");
    }
    assert_agents_spools_empty(&["c-agent-1", "c-agent-2"]);
}

#[test]
fn broker_down_for_30_seconds_loses_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut broker = Mosquitto::start(dir.path(), FLEET_OPTIONS);
    let url = broker.url();
    let root = unique_root("outage");
    let store = dir.path().join("s.db");
    let (mut coord, _) = start_coordinator(&sleep_study(dir.path(), "o", 8, 2.0), &store, &root, &["--broker", &url]);
    let s1 = dir.path().join("state1");
    let s2 = dir.path().join("state2");
    let a1 = start_agent(&url, "o-agent-1", &root, &["--state-dir", s1.to_str().unwrap_or_default()]);
    let a2 = start_agent(&url, "o-agent-2", &root, &["--state-dir", s2.to_str().unwrap_or_default()]);
    wait_for("both agents running trials", Duration::from_secs(90), || {
        running_on(&store, "o-agent-1").is_some() && running_on(&store, "o-agent-2").is_some()
    });
    wait_for_workload(&a1);
    wait_for_workload(&a2);
    broker.kill();
    let down = Instant::now();
    // The outage itself: the trials in flight finish while no broker exists.
    wait_for("the agents to finish their trials offline", Duration::from_secs(30), || spooled(&s1) + spooled(&s2) >= 2);
    while down.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    broker.restart();
    let status = coord.wait_exit(Duration::from_secs(180));
    assert!(status.success());
    assert_exactly_once(&store, "o", 8);
    assert_spools_empty(&[s1.clone(), s2.clone()]);
}

/// Results an agent holds in its state directory, not yet acknowledged
/// (whole files only: a `.tmp` is a result still being written).
/// The store says "running" when the assignment is sent, before the broker
/// delivers it; only the workload running under the agent proves it arrived
/// (killing the broker or the coordinator earlier loses the assignment, not
/// a result).
fn wait_for_workload(agent: &Proc) {
    let agent_pid = agent.child.id();
    wait_for("the workload under the agent", Duration::from_secs(30), || {
        children(agent_pid).iter().any(|(_, comm)| comm == "sh" || comm == "sleep")
    });
}

fn spooled(state: &Path) -> usize {
    spool(state).iter().filter(|f| f.ends_with(".bin")).count()
}

#[test]
fn agent_restarted_with_spooled_results_delivers_them() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut broker = Mosquitto::start(dir.path(), FLEET_OPTIONS);
    let url = broker.url();
    let root = unique_root("spool");
    let store = dir.path().join("s.db");
    let (mut coord, _) = start_coordinator(&sleep_study(dir.path(), "p", 3, 1.0), &store, &root, &["--broker", &url]);
    let state = dir.path().join("state");
    let args = ["--state-dir", state.to_str().unwrap_or_default()];
    let agent = start_agent(&url, "p-agent", &root, &args);
    let mut running = None;
    wait_for("a trial on the agent", Duration::from_secs(90), || {
        running = running_on(&store, "p-agent");
        running.is_some()
    });
    let (trial, attempt) = running.expect("running");
    wait_for_workload(&agent);
    broker.kill();
    wait_for("the result in the spool", Duration::from_secs(30), || spooled(&state) >= 1);
    agent.signal("KILL");
    drop(agent);
    broker.restart();
    let _agent = start_agent(&url, "p-agent", &root, &args);
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    assert_exactly_once(&store, "p", 3);
    let accepted: i64 =
        db(&store).query_row("SELECT attempt FROM results WHERE trial = ?1", [trial], |r| r.get(0)).expect("result");
    assert_eq!(accepted, attempt, "the spooled result of the killed agent was the one accepted");
    // Its file leaves the spool once acknowledged, and so does the result of a newer attempt
    // cancelled because this one delivered first: the coordinator waits for it before it exits.
    assert_spools_empty(&[state]);
}

/// Runs `tunefleet-agent ARGS` to the end; its stdout.
/// Registers in `store` the key of the agent `name` whose state directory
/// is `state`, as an operator does for a store that never saw it.
fn trust_agent(store: &Path, name: &str, state: &str) {
    let key = agent_cli(&["key", "--state-dir", state]);
    let trust = std::process::Command::new(bin("tunefleet"))
        .args(["agents", "trust", name, key.trim(), "--store"])
        .arg(store)
        .output()
        .expect("agents trust");
    assert!(trust.status.success(), "{}", String::from_utf8_lossy(&trust.stderr));
}

fn agent_cli(args: &[&str]) -> String {
    let out = std::process::Command::new(bin("tunefleet-agent")).args(args).output().expect("tunefleet-agent runs");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_result_of_another_study_is_parked_listed_and_delivered_later_to_its_own_coordinator() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("parked");
    let (store_a, store_b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let study_a = sleep_study(dir.path(), "other", 2, 1.5);
    let state = dir.path().join("state");
    let state_arg = state.to_str().expect("utf-8 path").to_string();
    // No trial held ahead: the trial after the running one would start once
    // its coordinator is gone, and the count of parked results would be
    // one or two by timing.
    let args = ["--state-dir", state_arg.as_str(), "--lookahead", "0"];
    // The agent holds a result of study "other" whose coordinator died.
    let (coord_a, url) = start_coordinator(&study_a, &store_a, &root, &[]);
    let agent = start_agent(&url, "x-agent", &root, &args);
    wait_for("a trial on the agent", Duration::from_secs(60), || running_on(&store_a, "x-agent").is_some());
    wait_for_workload(&agent);
    coord_a.signal("KILL");
    drop(coord_a);
    wait_for("the result in the spool", Duration::from_secs(30), || spooled(&state) >= 1);
    // Another coordinator, another study, same address: it cannot place that
    // result. Its store has never seen the agent: the operator registers its key.
    trust_agent(&store_b, "x-agent", &state_arg);
    let listen = url.trim_start_matches("mqtt://").to_string();
    let (mut coord_b, _) =
        start_coordinator(&sleep_study(dir.path(), "mine", 2, 0.1), &store_b, &root, &["--listen", &listen]);
    assert!(coord_b.wait_exit(Duration::from_secs(60)).success());
    let out = coord_b.rest_of_stdout().join("\n");
    assert!(out.contains("2/2 trials done"), "{out}");
    assert!(out.contains("1 results for attempts never assigned"), "refused and counted: {out}");
    assert_spools_empty(std::slice::from_ref(&state));
    agent.signal("TERM");
    let mut agent = agent;
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    let listing = agent_cli(&["spool", "--state-dir", &state_arg]);
    assert!(listing.contains("0 awaiting an acknowledgement, 1 kept aside"), "{listing}");
    assert!(listing.contains("parked  other/"), "{listing}");
    assert!(listing.contains("does not run that study"), "{listing}");
    // Handed back to the coordinator that runs "other": delivered, accepted once.
    assert!(agent_cli(&["spool", "requeue", "--state-dir", &state_arg]).starts_with("1 results moved back"));
    let (mut coord_a, _) = start_coordinator(&study_a, &store_a, &root, &["--listen", &listen]);
    let _agent = start_agent(&url, "x-agent", &root, &args);
    assert!(coord_a.wait_exit(Duration::from_secs(90)).success());
    assert_exactly_once(&store_a, "other", 2);
    assert_spools_empty(std::slice::from_ref(&state));
    let listing = agent_cli(&["spool", "--state-dir", &state_arg]);
    assert!(listing.contains("0 awaiting an acknowledgement, 0 kept aside"), "{listing}");
}

/// The trial and the value of each result of `study` in `store`, with the
/// agent and attempt that delivered it.
fn results_of(store: &Path, study: &str) -> Vec<(i64, f64, String, i64)> {
    db(store)
        .prepare("SELECT trial, objective, agent, attempt FROM results WHERE study = ?1 ORDER BY trial")
        .expect("prepare")
        .query_map([study], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect()
}

/// A result of study `exp` from store A, delivered to
/// a coordinator running ANOTHER study named `exp` on store B (same root,
/// same address) once B had finished that trial, was acknowledged as a
/// `Duplicate` (the trial number was finished) and deleted by the agent:
/// stored nowhere. Trial references now carry the study's random id, so B
/// refuses it: parked, listed, and later stored once by A's coordinator.
#[test]
fn regression_a_result_of_a_same_named_study_of_another_store_is_parked_not_deleted() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("twin");
    let (store_a, store_b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let dir_b = dir.path().join("b");
    std::fs::create_dir(&dir_b).expect("dir");
    let study_a = sleep_study(dir.path(), "exp", 2, 1.5);
    let study_b = sleep_study(&dir_b, "exp", 10, 1.0);
    let state = dir.path().join("state");
    let state_arg = state.to_str().expect("utf-8 path").to_string();
    let args = ["--state-dir", state_arg.as_str(), "--slots", "1"];
    // x-agent holds a result of A's `exp`; A dies before it arrives.
    let (coord_a, url) = start_coordinator(&study_a, &store_a, &root, &[]);
    let agent = start_agent(&url, "x-agent", &root, &args);
    let mut running = None;
    wait_for("a trial on the agent", Duration::from_secs(60), || {
        running = running_on(&store_a, "x-agent");
        running.is_some()
    });
    let (trial, attempt) = running.expect("running");
    wait_for_workload(&agent);
    coord_a.signal("KILL");
    drop(coord_a);
    wait_for("the result in the spool", Duration::from_secs(30), || spooled(&state) >= 1);
    agent.signal("KILL");
    drop(agent);
    // B runs another `exp` on another store, same address; another agent
    // finishes the same trial number there first.
    let listen = url.trim_start_matches("mqtt://").to_string();
    let (mut coord_b, _) = start_coordinator(&study_b, &store_b, &root, &["--listen", &listen]);
    let _y = start_agent(&url, "y-agent", &root, &["--slots", "1"]);
    wait_for("B's trial done", Duration::from_secs(60), || {
        results_of(&store_b, "exp").iter().any(|(t, ..)| *t == trial)
    });
    // Store B has never seen x-agent: the operator registers its key.
    trust_agent(&store_b, "x-agent", &state_arg);
    let mut agent = start_agent(&url, "x-agent", &root, &args);
    assert!(coord_b.wait_exit(Duration::from_secs(120)).success());
    let out = coord_b.rest_of_stdout().join("\n");
    assert!(out.contains("10/10 trials done"), "{out}");
    assert_exactly_once(&store_b, "exp", 10);
    let b_trial = results_of(&store_b, "exp").into_iter().find(|(t, ..)| *t == trial).expect("B's result");
    assert_eq!(b_trial.2, "y-agent", "B kept its own agent's result of that trial");
    agent.signal("TERM");
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    // Kept aside, never deleted, and listed.
    let listing = agent_cli(&["spool", "--state-dir", &state_arg]);
    assert!(listing.contains("1 kept aside"), "{listing}");
    assert!(listing.contains(&format!("parked  exp/{trial}#{attempt}")), "{listing}");
    assert!(listing.contains("another study of that name"), "{listing}");
    assert!(out.contains("1 messages of another study of the same name"), "refused and counted: {out}");
    assert!(!out.contains("duplicate results acknowledged"), "{out}");
    // Handed back to A's coordinator: delivered, stored exactly once.
    assert!(agent_cli(&["spool", "requeue", "--state-dir", &state_arg]).starts_with("1 results moved back"));
    let (mut coord_a, _) = start_coordinator(&study_a, &store_a, &root, &["--listen", &listen]);
    let _agent = start_agent(&url, "x-agent", &root, &args);
    assert!(coord_a.wait_exit(Duration::from_secs(90)).success());
    assert_exactly_once(&store_a, "exp", 2);
    let a_trial = results_of(&store_a, "exp").into_iter().find(|(t, ..)| *t == trial).expect("A's result");
    assert_eq!((a_trial.2.as_str(), a_trial.3), ("x-agent", attempt), "the parked result is the one A stored");
    assert_spools_empty(std::slice::from_ref(&state));
    let listing = agent_cli(&["spool", "--state-dir", &state_arg]);
    assert!(listing.contains("0 awaiting an acknowledgement, 0 kept aside"), "{listing}");
}
