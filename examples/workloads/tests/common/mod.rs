//! Helpers shared by the workload binaries' tests.

use std::process::{Command, Output};

use serde_json::{Map, Value};

/// A workload binary to run, its thread count left to the flags, without a
/// control channel or step lines.
pub fn command(binary: &str) -> Command {
    let mut cmd = Command::new(binary);
    cmd.env_remove("TUNEFLEET_THREADS")
        .env_remove("OMP_NUM_THREADS")
        .env_remove("TUNEFLEET_CONTROL")
        .env_remove("TUNEFLEET_STEPS");
    cmd
}

/// Runs a workload binary with `args` (see [`command`]).
pub fn run(binary: &str, args: &[&str]) -> Output {
    command(binary).args(args).output().unwrap_or_else(|e| panic!("{binary} runs: {e}"))
}

/// Each of `cases` is refused as a usage error: exit code 2, a message on
/// stderr, nothing on stdout.
pub fn assert_usage_errors(binary: &str, cases: &[&[&str]]) {
    for args in cases {
        let output = run(binary, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?} printed on stdout");
        assert!(!output.stderr.is_empty(), "{args:?} gave no message");
    }
}

/// Every stdout line, each of which must be a JSON object.
pub fn json_lines(output: &Output) -> Vec<Map<String, Value>> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| match serde_json::from_str(line) {
            Ok(Value::Object(map)) => map,
            other => panic!("not a JSON object: {line:?} ({other:?})"),
        })
        .collect()
}
