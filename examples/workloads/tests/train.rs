//! Runs the built `tunefleet-train` binary: its stdout protocol, that it
//! learns, and its exit codes.

mod common;

use std::process::{Command, Output};

use common::json_lines;
use serde_json::{Map, Value};

fn train(args: &[&str]) -> Output {
    common::run(env!("CARGO_BIN_EXE_tunefleet-train"), args)
}

fn keys(line: &Map<String, Value>) -> Vec<&str> {
    let mut keys: Vec<&str> = line.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

fn number(line: &Map<String, Value>, key: &str) -> f64 {
    line.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("{key} is not a number in {line:?}"))
}

#[test]
fn learns_and_prints_one_json_line_per_epoch() {
    let output = train(&["--epochs", "4", "--passes", "1", "--lr", "0.02", "--hidden", "128", "--seed", "1"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = json_lines(&output);
    assert_eq!(lines.len(), 5, "4 epochs and a final line");

    let (epochs, last) = lines.split_at(4);
    for (i, line) in epochs.iter().enumerate() {
        assert_eq!(keys(line), ["accuracy", "epoch", "epoch_seconds", "event", "loss", "threads"]);
        assert_eq!(line["threads"].as_u64(), Some(1), "one thread without --threads or a variable");
        assert_eq!(line["event"], "epoch");
        assert_eq!(line["epoch"].as_u64(), Some(i as u64 + 1));
        assert!(number(line, "epoch_seconds") > 0.0);
        assert!(number(line, "loss") > 0.0);
        assert!((0.0..=1.0).contains(&number(line, "accuracy")));
    }
    let first = number(&epochs[0], "accuracy");
    let final_line = &last[0];
    assert_eq!(keys(final_line), ["accuracy", "event", "loss"]);
    assert_eq!(final_line["event"], "final");
    let accuracy = number(final_line, "accuracy");
    assert_eq!(accuracy, number(&epochs[3], "accuracy"), "final line repeats the last epoch");
    assert!(accuracy > first, "accuracy fell from {first} to {accuracy}");
    assert!(accuracy > 0.85, "accuracy only {accuracy}");
    assert!(number(final_line, "loss") < number(&epochs[0], "loss"));
}

#[test]
fn two_threads_learn_the_same_model() {
    let args = ["--epochs", "1", "--passes", "1", "--hidden", "64", "--seed", "3"];
    let one = json_lines(&train(&[&args[..], &["--threads", "1"]].concat()));
    let two = json_lines(&train(&[&args[..], &["--threads", "2"]].concat()));
    // Summation order differs between thread counts, so compare with a tolerance.
    let (a, b) = (number(&one[1], "loss"), number(&two[1], "loss"));
    assert!((a - b).abs() < 1e-3, "1 thread: {a}, 2 threads: {b}");
}

#[test]
fn the_thread_count_comes_from_the_environment_when_no_flag_is_given() {
    let run = |var: &str, value: &str| {
        Command::new(env!("CARGO_BIN_EXE_tunefleet-train"))
            .args(["--epochs", "1", "--passes", "1", "--hidden", "16"])
            .env_remove("TUNEFLEET_THREADS")
            .env_remove("OMP_NUM_THREADS")
            .env(var, value)
            .output()
            .expect("tunefleet-train runs")
    };
    let output = run("OMP_NUM_THREADS", "2");
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("2 thread(s)"));
    let output = run("TUNEFLEET_THREADS", "many");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("TUNEFLEET_THREADS"));
    assert!(output.stdout.is_empty());
}

#[test]
fn bad_flags_exit_with_code_2_and_say_why() {
    common::assert_usage_errors(
        env!("CARGO_BIN_EXE_tunefleet-train"),
        &[
            &["--lr", "-0.1"],
            &["--lr", "fast"],
            &["--momentum", "1"],
            &["--batch-size", "0"],
            &["--hidden", "0"],
            &["--threads", "0"],
            &["--epochs", "0"],
            &["--no-such-flag"],
        ],
    );
}

/// Regression: `--resume ""` (what a study's resume template gives a trial
/// with no checkpoint) starts from scratch; clap used to refuse the empty path.
#[test]
fn an_empty_resume_starts_from_scratch() {
    let args = ["--epochs", "2", "--passes", "1", "--hidden", "32"];
    let fresh = train(&args);
    let resumed = train(&[&args[..], &["--resume", ""]].concat());
    assert!(fresh.status.success() && resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let losses = |o: &Output| json_lines(o).iter().map(|l| number(l, "loss")).collect::<Vec<f64>>();
    assert_eq!(losses(&fresh), losses(&resumed), "the same run, from scratch");
}
