//! Runs the built `tunefleet-stream` binary: its stdout protocol, its result
//! check and its exit codes.

mod common;

use std::process::Output;

use common::json_lines;
use serde_json::{Map, Value};

fn stream(args: &[&str]) -> Output {
    common::run(env!("CARGO_BIN_EXE_tunefleet-stream"), args)
}

fn number(line: &Map<String, Value>, key: &str) -> f64 {
    line.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("{key} is not a number in {line:?}"))
}

const SMALL: [&str; 8] = ["--size-mib", "8", "--block-size", "16", "--epochs", "3", "--threads", "2"];

#[test]
fn reports_bandwidth_per_epoch_and_a_checked_result() {
    let output = stream(&SMALL);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 4);
    for (i, line) in lines[..3].iter().enumerate() {
        assert_eq!(line["event"], "epoch");
        assert_eq!(line["epoch"].as_u64(), Some(i as u64 + 1));
        assert!(number(line, "bandwidth_gbs") > 0.0);
        assert!(number(line, "seconds") > 0.0);
        assert_eq!(line["threads"].as_u64(), Some(2), "as --threads says");
    }
    let last = &lines[3];
    assert_eq!(last["event"], "final");
    assert!(number(last, "bandwidth_gbs") > 0.0);
    assert!(number(last, "best_bandwidth_gbs") >= number(last, "bandwidth_gbs"));
}

#[test]
fn a_wrong_result_exits_with_code_1() {
    let output = stream(&[&SMALL[..], &["--inject-fault"]].concat());
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("check failed"), "{stderr}");
    assert!(json_lines(&output).iter().all(|line| line["event"] != "final"), "no final line after a failure");
}

#[test]
fn bad_flags_exit_with_code_2() {
    common::assert_usage_errors(
        env!("CARGO_BIN_EXE_tunefleet-stream"),
        &[&["--block-size", "0"], &["--size-mib", "lots"], &["--threads", "-1"], &["--bogus"]],
    );
}
