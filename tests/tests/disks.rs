//! Issue 40, finding 8: full disks. An agent whose state directory fills up
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
use std::time::Duration;

use tunefleet_tests::*;

/// A tmpfs of `size` mounted at `dir` for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir.to_path_buf())),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs (root only; CI runs as root): {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

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
