//! Full disks. An agent whose state directory fills up
//! mid-study stops taking trials (a result it cannot keep would be lost with
//! the link or a crash), keeps what it has, and goes on once space returns;
//! every result is stored once. The state directory is a real tmpfs of
//! 1 MiB, filled by the test (mounting needs root, as CI runs).

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, EpochMetrics, ExitOutcome, Measurement, Metrics};
use tunefleet_common::message::*;
use tunefleet_tests::member::{Answer, Member};
use tunefleet_tests::tmpfs::Tmpfs;
use tunefleet_tests::*;

/// Fills the filesystem of `dir` with `dir/fill` until it is full.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("fill");
    let mut f = std::fs::File::create(&path).expect("fill file");
    let block = vec![0xA5u8; 16 * 1024];
    while f.write_all(&block).is_ok() {}
    // The last partial block, a byte at a time.
    while f.write_all(&[0]).is_ok() {}
    let _ = f.sync_all();
    path
}

fn count(store: &Path, sql: &str) -> i64 {
    query(store, sql, |r| r.get::<_, i64>(0)).first().copied().unwrap_or(-1)
}

#[test]
fn an_agent_whose_state_directory_fills_takes_no_trials_until_space_returns_and_loses_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let Some(mnt) = Tmpfs::mount(&dir.path().join("state"), "1m") else { return };
    let state = mnt.0.join("agent");
    let trials = 150;
    let study = sleep_study(dir.path(), "full", trials, 0.01);
    let store = dir.path().join("s.db");
    let root = unique_root("disk-full");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let log_path = dir.path().join("agent.log");
    let mut agent_cmd = Command::new(bin("tunefleet-agent"));
    agent_cmd.stderr(std::fs::File::create(&log_path).expect("agent log"));
    let state_arg = state.to_str().expect("utf-8").to_string();
    let agent = start_agent_with(agent_cmd, &url, "filled", &root, &["--state-dir", &state_arg, "--lookahead", "2"]);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    wait_for("some results", Duration::from_secs(60), || count(&store, "SELECT COUNT(*) FROM results") >= 10);
    let filler = fill(&mnt.0);
    wait_for("the agent to say it cannot store results", Duration::from_secs(60), || {
        log().contains("cannot store results in the state directory")
    });
    // It stops: nothing runs on it while its state directory is full.
    wait_for("the agent to run nothing", Duration::from_secs(60), || {
        count(&store, "SELECT COUNT(*) FROM trials WHERE state = 'running'") == 0
    });
    let stalled = count(&store, "SELECT COUNT(*) FROM results");
    assert!(stalled < i64::from(trials), "the study did not finish while the disk was full");

    std::fs::remove_file(&filler).expect("free the space");
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{:?}", coord.rest_of_stdout());
    let text = log();
    let blocked = text.find("cannot store results in the state directory").expect("blocked");
    let resumed = text.find("the state directory stores results again").expect("resumed");
    assert!(resumed > blocked);
    assert!(!text[blocked..resumed].contains("starting trial"), "no trial started while results could not be kept");
    // Every trial has one result, each trial's own value.
    assert_eq!(count(&store, "SELECT COUNT(*) FROM results"), i64::from(trials));
    assert_eq!(count(&store, "SELECT COUNT(*) FROM results WHERE objective != trial + 1"), 0);
    drop(agent);
    assert_spools_empty(&[state]);
}

/// Bytes free on the filesystem of `dir` (`df`).
fn avail(dir: &Path) -> u64 {
    let out = Command::new("df").args(["-B1", "--output=avail"]).arg(dir).output().expect("df");
    String::from_utf8_lossy(&out.stdout).lines().nth(1).and_then(|l| l.trim().parse().ok()).expect("a figure")
}

#[test]
fn a_coordinator_whose_store_disk_fills_pauses_and_goes_on_with_nothing_lost() {
    let dir = tempfile::tempdir().expect("tmp");
    let Some(mnt) = Tmpfs::mount(&dir.path().join("store"), "24m") else { return };
    let trials = 120;
    let study = sleep_study(dir.path(), "storefull", trials, 0.01);
    let store = mnt.0.join("s.db");
    let root = unique_root("store-full");
    let log_path = dir.path().join("coordinator.log");
    let (mut coord, url) =
        start_coordinator_logged(&study, &store, &root, &["--store-min-free-mib", "8"], Some(&log_path));
    let agent = start_agent(&url, "patient", &root, &["--lookahead", "2"]);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    wait_for("some results", Duration::from_secs(60), || count(&store, "SELECT COUNT(*) FROM results") >= 10);

    // Leave 4 MiB: below the floor of 8.
    let filler = mnt.0.join("fill");
    let size = avail(&mnt.0).saturating_sub(4 << 20);
    std::fs::write(&filler, vec![0xA5u8; usize::try_from(size).expect("size")]).expect("fill");
    wait_for("the coordinator to pause", Duration::from_secs(30), || {
        log().contains("the store's disk is nearly full: paused")
    });
    let at_pause = count(&store, "SELECT COUNT(*) FROM results");
    // The agent keeps what it finishes meanwhile: nothing is acknowledged.
    let state = agent_state_dir("patient");
    wait_for("the agent to hold results", Duration::from_secs(30), || spool(&state).len() >= 2);
    assert_eq!(count(&store, "SELECT COUNT(*) FROM results"), at_pause, "nothing stored while paused");
    let (_, status, _) = run({
        let mut c = Command::new(bin("tunefleet"));
        c.arg("status").arg("--store").arg(&store).env("XDG_STATE_HOME", state_home());
        c
    });
    assert!(status.contains("the store's disk is nearly full"), "{status}");
    // The paused coordinator still beats: its study is paused, not interrupted.
    let state = || {
        let (_, json, _) = run({
            let mut c = Command::new(bin("tunefleet"));
            c.args(["status", "--json", "--store"]).arg(&store).env("XDG_STATE_HOME", state_home());
            c
        });
        let rows: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
        rows.as_array().and_then(|r| r.first()).and_then(|r| r["state"].as_str()).unwrap_or_default().to_string()
    };
    wait_for("status to say paused", Duration::from_secs(30), || state() == "paused");

    std::fs::remove_file(&filler).expect("free the space");
    let code = coord.wait_exit(Duration::from_secs(120));
    assert!(code.success(), "{}", log());
    let text = log();
    assert!(text.contains("the store's disk has room again: going on"), "{text}");
    assert_eq!(count(&store, "SELECT COUNT(*) FROM results"), i64::from(trials));
    assert_eq!(count(&store, "SELECT COUNT(*) FROM results WHERE objective != trial + 1"), 0);
    drop(agent);
    assert_agents_spools_empty(&["patient"]);
}

/// What a hog member did: results the coordinator stored and refused, and
/// the first refusal's reason.
#[derive(Default)]
struct Hogged {
    stored: u32,
    refused: u32,
    why: String,
}

/// A member that takes trials as fast as it is given them and answers each
/// with the most it may write: 1 MiB of progress and a result of about
/// 0.75 MB. Goes offline once refused and given nothing more for a second.
fn hog(port: u16, root: &str, token: &str, name: &str, stop: &AtomicBool) -> Hogged {
    let token = token.parse().expect("token");
    let mut member = Member::connect(port, root, name);
    assert!(matches!(member.hello(AgentInfo::minimal("x", 0), Some(&token)), Answer::Welcome));
    let wide: Metrics = (0..200).map(|i| (format!("{}{i:03}", "p".repeat(200)), f64::from(i))).collect();
    let long_name = "r".repeat(200);
    let epochs: Vec<EpochMetrics> = (0..3_000u32)
        .map(|epoch| EpochMetrics {
            epoch,
            elapsed_us: u64::from(epoch),
            metrics: [(long_name.clone(), 1.0)].into(),
            checkpoint: None,
        })
        .collect();
    let (mut done, mut seq, mut idle_since) = (Hogged::default(), 0, None::<Instant>);
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        member.send(&AgentMessage::Request(WorkRequest { seq, free: 4, ahead: 0, running: vec![], held: vec![] }));
        let mut assigned = 0;
        for m in member.receive(Duration::from_millis(200)) {
            match m {
                CoordinatorMessage::Assign(a) => {
                    assigned += 1;
                    for epoch in 0..24u32 {
                        member.send(&AgentMessage::Progress(Progress {
                            trial: a.trial.clone(),
                            epoch,
                            elapsed_us: u64::from(epoch),
                            metrics: wide.clone(),
                            checkpoint: None,
                            profile: None,
                        }));
                    }
                    let measurement = Measurement {
                        epochs: epochs.clone(),
                        final_metrics: [("v".to_string(), 1e6)].into(),
                        ..Measurement::unmeasured(
                            ExitOutcome::Exited(0),
                            EnergyReading::none(EnergySourceKind::Estimated, ""),
                        )
                    };
                    member.send(&AgentMessage::Result(TrialResult { trial: a.trial, measurement }));
                }
                CoordinatorMessage::Ack(ack) => match ack.outcome {
                    AckOutcome::Refused(why) => {
                        done.refused += 1;
                        if done.why.is_empty() {
                            done.why = why;
                        }
                    }
                    _ => done.stored += 1,
                },
                _ => {}
            }
        }
        if assigned > 0 || done.refused == 0 {
            idle_since = None;
        } else if idle_since.get_or_insert_with(Instant::now).elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    member.go_offline();
    member.receive(Duration::from_millis(300));
    done
}

/// Runs a 0.1 s study of `trials` on two honest agents with the store on
/// a tmpfs of 48 MiB (floor 8 MiB), beside a hog when `hogged`; the
/// study's seconds, the coordinator's log and what the hog did.
/// Who hogs a run's store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hogs {
    None,
    /// One member, each agent's share 4 MiB.
    One,
    /// Two members of one token whose names share 4 MiB, each agent's own share 100.
    TwoOfOneToken,
}

fn shared_store_run(dir: &Path, name: &str, trials: u32, hogs: Hogs) -> (f64, String, Hogged) {
    let Some(mnt) = Tmpfs::mount(&dir.join(name), "48m") else { return (0.0, String::new(), Hogged::default()) };
    let study = sleep_study(dir, name, trials, 0.1);
    let store = mnt.0.join("s.db");
    let root = unique_root(name);
    let log_path = dir.join(format!("{name}.log"));
    let share = if hogs == Hogs::TwoOfOneToken { "100" } else { "4" };
    let limits = ["--store-min-free-mib", "8", "--store-share-mib", share];
    let (mut coord, url) = start_coordinator_logged(&study, &store, &root, &limits, Some(&log_path));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let (members, token) = match hogs {
        Hogs::None => (0, String::new()),
        Hogs::One => (1, join_token_of(&root).expect("token")),
        Hogs::TwoOfOneToken => (2, create_join_token(&store, &["--total-store-mib", "4"])),
    };
    let hoggers: Vec<_> = (0..members)
        .map(|i| {
            let (root, stop, token) = (root.clone(), stop.clone(), token.clone());
            let port = port_of(&url);
            std::thread::spawn(move || hog(port, &root, &token, &format!("{root}-hog{i}"), &stop))
        })
        .collect();
    let names = [format!("{root}-h1"), format!("{root}-h2")];
    let started = Instant::now();
    let agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &["--slots", "2"])).collect();
    let status = coord.wait_exit(Duration::from_secs(180));
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    // A hog whose connection the broker closed (a publish that failed) did what it could.
    let hogged = hoggers.into_iter().filter_map(|h| h.join().ok()).fold(Hogged::default(), |all, h| Hogged {
        stored: all.stored + h.stored,
        refused: all.refused + h.refused,
        why: if all.why.is_empty() { h.why } else { all.why },
    });
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{name}: {out}\n{log}");
    assert_eq!(count(&store, "SELECT COUNT(*) FROM trials WHERE state = 'done'"), i64::from(trials), "{out}");
    drop(agents);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
    (secs, format!("{out}\n{log}"), hogged)
}

/// A member answering every trial it is given with
/// the most it may write filled a 400 MiB disk in 10 s, and the disk pause
/// stopped the whole fleet. Now its share of the study's store is a grant
/// (`--store-share-mib`): past it, its results are refused, it is told
/// why and given nothing more, and the honest agents go on.
#[test]
fn regression_a_member_writing_the_most_it_may_cannot_pause_the_fleet() {
    let _alone = one_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let trials = 80;
    let (quiet, _, _) = shared_store_run(dir.path(), "calm", trials, Hogs::None);
    if quiet == 0.0 {
        return;
    }
    let (attacked, text, hogged) = shared_store_run(dir.path(), "hogged", trials, Hogs::One);
    eprintln!(
        "{trials} trials: {quiet:.1} s without the hog, {attacked:.1} s beside it ({:.2}x the trials/s); the hog had \
         {} results stored and {} refused: {}",
        quiet / attacked,
        hogged.stored,
        hogged.refused,
        hogged.why
    );
    assert!(!text.contains("paused"), "the store's disk filled: the fleet paused\n{text}");
    assert!(hogged.refused >= 1 && hogged.why.contains("share of the study's store"), "told why: {:?}", hogged.why);
    // 4 MiB: about two of its results with their progress, and the one that passed it.
    assert!(hogged.stored <= 3, "{} of its results stored", hogged.stored);
    assert!(text.contains("results past an agent's share of the store"), "counted in the summary: {text}");
    assert!(attacked < 2.0 * quiet + 5.0, "{attacked:.1} s against {quiet:.1} s");
}

/// Store space per token as well as per name. Two members of a
/// token made with `--total-store-mib 4`, each agent's own share 100 MiB:
/// together they get about what one got above, then are refused.
#[test]
fn two_members_of_one_token_share_its_store_grant() {
    let _alone = one_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let (secs, text, hogged) = shared_store_run(dir.path(), "pair", 80, Hogs::TwoOfOneToken);
    if secs == 0.0 {
        return;
    }
    eprintln!("two members of one token: {} results stored, {} refused, {secs:.1} s", hogged.stored, hogged.refused);
    assert!(!text.contains("paused"), "the store's disk filled\n{text}");
    assert!(hogged.refused >= 2, "both told: {} refused ({:?})", hogged.refused, hogged.why);
    // 4 MiB together: about two results with their progress, and one more each that passed it.
    assert!(hogged.stored <= 4, "{} of their results stored", hogged.stored);
}
