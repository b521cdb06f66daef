//! `tunefleet-agent --cpus LIST` as a user runs it: the agent process and
//! every thread it starts are confined to the list, and a CPU the process
//! may not use is a usage error (exit status 2).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use tunefleet_agent::cpus::allowed_cpus;
use tunefleet_agent::live::format_cpu_list;

fn agent(state_dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunefleet-agent"));
    cmd.env_remove("TUNEFLEET_BROKER")
        .env_remove("TUNEFLEET_CPUS")
        .env("TUNEFLEET_LOG", "info")
        // Nothing listens there: the agent keeps trying, which is all this needs.
        .args(["--broker", "mqtt://127.0.0.1:1", "--name", "confined", "--trust-first-coordinator", "--state-dir"])
        .arg(state_dir);
    cmd
}

/// The agent, stopped and reaped when the test ends, failed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `Cpus_allowed_list` of every thread of process `pid`.
fn thread_masks(pid: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the agent's threads");
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|m| m.trim().to_string()))
        .collect()
}

#[test]
fn the_agent_and_its_threads_run_on_its_cpus_only() {
    let allowed = allowed_cpus();
    if allowed.len() < 2 {
        return eprintln!("skipped: needs 2 CPUs, this process may use {allowed:?}");
    }
    let cpu = allowed[allowed.len() - 1].to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = agent(dir.path());
    cmd.args(["--cpus", &cpu]).stderr(Stdio::piped());
    let mut running = Running(cmd.spawn().expect("spawn the agent"));
    let stderr = running.0.stderr.take().expect("piped");
    // The runtime and its threads exist once the agent logs its start.
    let mut lines = BufReader::new(stderr).lines();
    let mut log = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("the agent's log");
        let started = line.contains("agent starting");
        log.push(line);
        if started {
            break;
        }
    }
    assert!(log.last().is_some_and(|l| l.contains("agent starting")), "the agent did not start: {log:#?}");
    // The rest of the log is read until the agent exits (a closed pipe would fail its writes).
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<String>>());
    let masks = thread_masks(running.0.id());
    assert!(!masks.is_empty());
    assert!(masks.iter().all(|m| *m == cpu), "every thread on CPU {cpu}: {masks:?}");
    let pid = rustix::process::Pid::from_child(&running.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let status = running.0.wait().expect("the agent exits");
    log.extend(rest.join().expect("the log reader"));
    assert_eq!(status.code(), Some(0), "a clean stop after SIGTERM: {log:#?}");
}

#[test]
fn a_cpu_this_process_may_not_use_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (list, said) in [
        ("4096", "--cpus 4096: CPU 4096 is not among those this process may use".to_string()),
        ("0-", "--cpus \"0-\": expected a non-empty CPU list".to_string()),
    ] {
        let out = agent(dir.path()).args(["--cpus", list]).output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&said), "{stderr}");
        assert!(stderr.contains(&format!("({})", format_cpu_list(&allowed_cpus()))) || list == "0-", "{stderr}");
    }
}
