//! Runs the workload binaries with their standard input a pipe: with
//! `TUNEFLEET_CONTROL=stdin` they follow the `threads=N` lines written after
//! each epoch line, keep going when the pipe closes or a line is bad, and
//! without the variable they never read it.
//!
//! Every wait is for a line on the workload's stdout, bounded by a timeout
//! so that a workload blocked on its input fails the test instead of hanging it.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::{Map, Value};

const TRAIN: &str = env!("CARGO_BIN_EXE_tunefleet-train");
const STREAM: &str = env!("CARGO_BIN_EXE_tunefleet-stream");
const IO: &str = env!("CARGO_BIN_EXE_tunefleet-io");
/// Five short epochs, starting with one thread.
const TRAIN_ARGS: [&str; 8] = ["--hidden", "16", "--passes", "1", "--epochs", "5", "--threads", "1"];
const STREAM_ARGS: [&str; 8] = ["--size-mib", "1", "--passes", "2", "--epochs", "5", "--threads", "1"];
const IO_ARGS: [&str; 8] = ["--files", "4", "--file-kib", "16", "--epochs", "5", "--threads", "1"];
const EPOCHS: u64 = 5;

/// Longest wait for one line: far beyond a short epoch even on a busy machine.
const LINE_TIMEOUT: Duration = Duration::from_secs(120);

/// A running workload: its stdin, its stdout lines as they come, its stderr.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
}

impl Workload {
    /// Starts `binary` with stdin a pipe held open, and `TUNEFLEET_CONTROL`
    /// set to `control` (or unset).
    fn start(binary: &str, args: &[&str], control: Option<&str>) -> Self {
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .env_remove("TUNEFLEET_THREADS")
            .env_remove("OMP_NUM_THREADS")
            .env_remove("TUNEFLEET_CONTROL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(value) = control {
            cmd.env("TUNEFLEET_CONTROL", value);
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{binary} starts: {e}"));
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("stderr is piped");
        let stderr = thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        Workload { stdin: child.stdin.take(), child, lines, stderr: Some(stderr) }
    }

    /// The next stdout line, a JSON object.
    fn line(&self) -> Map<String, Value> {
        let line = match self.lines.recv_timeout(LINE_TIMEOUT) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("no line within {LINE_TIMEOUT:?}: blocked?"),
            Err(RecvTimeoutError::Disconnected) => panic!("stdout ended early"),
        };
        match serde_json::from_str(&line) {
            Ok(Value::Object(map)) => map,
            other => panic!("not a JSON object: {line:?} ({other:?})"),
        }
    }

    /// Waits for the line of epoch `n` and returns the threads it ran with.
    fn epoch(&self, n: u64) -> u64 {
        let line = self.line();
        assert_eq!((line["event"].as_str(), line["epoch"].as_u64()), (Some("epoch"), Some(n)), "{line:?}");
        line.get("threads").and_then(Value::as_u64).unwrap_or_else(|| panic!("no thread count in {line:?}"))
    }

    /// Writes one control line.
    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        stdin.write_all(format!("{line}\n").as_bytes()).expect("the workload's stdin takes a line");
        stdin.flush().expect("flushes");
    }

    fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for the final line and the end of stdout, then for the exit
    /// (stdin stays as it is); returns stderr. Fails unless the exit is 0.
    fn finish(&mut self) -> String {
        assert_eq!(self.line()["event"], "final");
        match self.lines.recv_timeout(LINE_TIMEOUT) {
            Err(RecvTimeoutError::Disconnected) => {}
            other => panic!("stdout goes on after the final line: {other:?}"),
        }
        let status = self.child.wait().expect("waits for the workload");
        let stderr = self.stderr.take().map(|h| h.join().expect("stderr reader")).unwrap_or_default();
        assert!(status.success(), "{status}: {stderr}");
        stderr
    }
}

impl Drop for Workload {
    /// A failed test leaves no workload behind.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Each line applies from the next epoch: one line is read per epoch, none
/// before the first epoch and none after the last.
fn follows_thread_changes(binary: &str, args: &[&str]) {
    let mut w = Workload::start(binary, args, Some("stdin"));
    // Queued before the first epoch ends; read only after its line.
    w.send("threads=2");
    assert_eq!(w.epoch(1), 1);
    assert_eq!(w.epoch(2), 2);
    w.send("threads=3");
    assert_eq!(w.epoch(3), 3);
    w.send("");
    assert_eq!(w.epoch(4), 3, "an empty line changes nothing");
    w.send("threads=1");
    assert_eq!(w.epoch(EPOCHS), 1);
    // No answer after the last epoch: the final line comes anyway.
    let stderr = w.finish();
    assert!(!stderr.contains("control:"), "nothing to report: {stderr}");
}

/// A line, then end of input: the last setting stays to the end.
fn runs_to_the_end_when_stdin_closes_after_the_first_epoch(binary: &str, args: &[&str]) {
    let mut w = Workload::start(binary, args, Some("stdin"));
    assert_eq!(w.epoch(1), 1);
    w.send("threads=2");
    w.close_stdin();
    for epoch in 2..=EPOCHS {
        assert_eq!(w.epoch(epoch), 2);
    }
    let stderr = w.finish();
    assert_eq!(stderr.matches("control: end of input").count(), 1, "{stderr}");
}

/// Without the variable, or with another value, stdin is never read: the
/// pipe stays open and empty, and the run ends on its own.
fn never_reads_stdin(binary: &str, args: &[&str]) {
    for control in [None, Some("fd:3")] {
        let mut w = Workload::start(binary, args, control);
        for epoch in 1..=EPOCHS {
            assert_eq!(w.epoch(epoch), 1, "{control:?}");
        }
        let stderr = w.finish();
        assert!(w.stdin.is_some(), "stdin was open throughout");
        assert!(!stderr.contains("control:"), "{control:?}: {stderr}");
    }
}

/// Each scenario as a test of each binary: `train::follows_thread_changes`, ...
macro_rules! per_binary {
    ($($scenario:ident),* $(,)?) => {
        mod train {
            $(#[test] fn $scenario() { super::$scenario(super::TRAIN, &super::TRAIN_ARGS); })*
        }
        mod stream {
            $(#[test] fn $scenario() { super::$scenario(super::STREAM, &super::STREAM_ARGS); })*
        }
        mod io {
            $(#[test] fn $scenario() { super::$scenario(super::IO, &super::IO_ARGS); })*
        }
    };
}

per_binary!(follows_thread_changes, runs_to_the_end_when_stdin_closes_after_the_first_epoch, never_reads_stdin);

#[test]
fn bad_control_lines_are_reported_and_ignored_and_the_run_goes_on() {
    let mut w = Workload::start(TRAIN, &TRAIN_ARGS, Some("stdin"));
    assert_eq!(w.epoch(1), 1);
    w.send("colour=blue threads=0");
    assert_eq!(w.epoch(2), 1);
    w.send("colour=red threads=2 fast");
    assert_eq!(w.epoch(3), 2);
    w.send("threads=many");
    assert_eq!(w.epoch(4), 2);
    w.send("");
    assert_eq!(w.epoch(5), 2);
    let stderr = w.finish();
    assert_eq!(stderr.matches("unknown key \"colour\" ignored").count(), 1, "reported once: {stderr}");
    for problem in ["threads=\"0\" ignored", "\"fast\" ignored", "threads=\"many\" ignored"] {
        assert!(stderr.contains(&format!("tunefleet-train: control: {problem}")), "{problem}: {stderr}");
    }
}
