//! Helpers shared by the workload binaries' tests.

use std::process::{Command, Output};

use serde_json::{Map, Value};

/// Runs a workload binary with `args`, its thread count left to the flags,
/// without a control channel.
pub fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(binary)
        .args(args)
        .env_remove("TUNEFLEET_THREADS")
        .env_remove("OMP_NUM_THREADS")
        .env_remove("TUNEFLEET_CONTROL")
        .output()
        .unwrap_or_else(|e| panic!("{binary} runs: {e}"))
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
