//! Runs the built `tunefleet-io` binary: its stdout protocol, its checksums,
//! its scratch directory, step lines, checkpoints and exit codes. (Its
//! control channel is tested with the other workloads' in `control.rs`.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::json_lines;
use serde_json::{Map, Value};

const IO: &str = env!("CARGO_BIN_EXE_tunefleet-io");

/// Three short epochs of six files of 16 KiB on two threads.
const SMALL: [&str; 10] = ["--files", "6", "--file-kib", "16", "--block-kib", "2", "--epochs", "3", "--threads", "2"];

fn io(args: &[&str]) -> Output {
    common::run(IO, args)
}

/// Runs with `TMPDIR` set to `tmp`, and `TUNEFLEET_STEPS` set or not.
fn io_in(tmp: &Path, steps: bool, args: &[&str]) -> Output {
    let mut cmd = common::command(IO);
    cmd.args(args).env("TMPDIR", tmp);
    if steps {
        cmd.env("TUNEFLEET_STEPS", "1");
    }
    cmd.output().expect("tunefleet-io runs")
}

fn succeeded(output: &Output) -> Vec<Map<String, Value>> {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    json_lines(output)
}

fn number(line: &Map<String, Value>, key: &str) -> f64 {
    line.get(key).and_then(Value::as_f64).unwrap_or_else(|| panic!("{key} is not a number in {line:?}"))
}

fn text<'a>(line: &'a Map<String, Value>, key: &str) -> &'a str {
    line.get(key).and_then(Value::as_str).unwrap_or_else(|| panic!("{key} is not a string in {line:?}"))
}

fn keys(line: &Map<String, Value>) -> Vec<&str> {
    let mut keys: Vec<&str> = line.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// The checksums of the epoch lines and of the final line, in order.
fn checksums(lines: &[Map<String, Value>]) -> Vec<String> {
    lines.iter().filter(|l| l["event"] != "step").map(|l| text(l, "checksum").to_string()).collect()
}

/// The scratch directory the run names on stderr.
fn scratch_dir(output: &Output) -> PathBuf {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let (_, rest) = stderr.split_once(" per epoch in ").unwrap_or_else(|| panic!("no scratch dir in {stderr}"));
    let (dir, _) = rest.split_once(", ").unwrap_or_else(|| panic!("no scratch dir in {stderr}"));
    PathBuf::from(dir)
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).expect("reads the directory").map(|e| e.expect("an entry").path()).collect()
}

#[test]
fn prints_throughput_and_checksum_per_epoch_and_a_final_line() {
    let lines = succeeded(&io(&SMALL));
    assert_eq!(lines.len(), 4, "3 epochs and a final line");
    for (i, line) in lines[..3].iter().enumerate() {
        assert_eq!(keys(line), ["checksum", "epoch", "event", "seconds", "threads", "throughput_mibs"]);
        assert_eq!(line["event"], "epoch");
        assert_eq!(line["epoch"].as_u64(), Some(i as u64 + 1));
        assert_eq!(line["threads"].as_u64(), Some(2), "as --threads says");
        assert!(number(line, "seconds") > 0.0);
        // 6 files of 16 KiB written and read back: 0.1875 MiB.
        let expected = 0.1875 / number(line, "seconds");
        assert!((number(line, "throughput_mibs") / expected - 1.0).abs() < 1e-6, "{line:?}");
        let checksum = text(line, "checksum");
        assert!(checksum.len() == 16 && checksum.bytes().all(|b| b.is_ascii_hexdigit()), "{checksum}");
    }
    let sums = checksums(&lines);
    assert!(sums[0] != sums[1] && sums[1] != sums[2], "each epoch writes new contents: {sums:?}");
    let last = &lines[3];
    assert_eq!(keys(last), ["best_throughput_mibs", "checksum", "event", "seconds", "throughput_mibs"]);
    assert_eq!(last["event"], "final");
    let total: f64 = lines[..3].iter().map(|l| number(l, "seconds")).sum();
    assert!((number(last, "seconds") - total).abs() < 1e-9, "the final line adds the epochs up");
    assert!(number(last, "best_throughput_mibs") >= number(last, "throughput_mibs"));
}

#[test]
fn the_checksums_follow_the_seed_and_not_the_threads() {
    let run = |seed: &str, threads: &str| {
        let args = ["--files", "5", "--file-kib", "8", "--epochs", "2", "--seed", seed, "--threads", threads];
        checksums(&succeeded(&io(&args)))
    };
    let first = run("11", "1");
    assert_eq!(run("11", "1"), first, "same seed, same checksums");
    assert_eq!(run("11", "3"), first, "the thread count changes nothing");
    let other = run("12", "1");
    assert!(other.iter().zip(&first).all(|(a, b)| a != b), "{other:?} and {first:?}");
}

#[test]
fn the_default_scratch_dir_is_new_in_tmpdir_and_removed_at_the_end() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let output = io_in(tmp.path(), false, &SMALL);
    succeeded(&output);
    let dir = scratch_dir(&output);
    assert_eq!(dir.parent(), Some(tmp.path()), "in $TMPDIR");
    assert!(dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("tunefleet-io-")), "{}", dir.display());
    assert!(!dir.exists(), "{} removed", dir.display());
    assert_eq!(entries(tmp.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_given_scratch_dir_is_created_kept_and_left_empty() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("new").join("scratch");
    let dir_arg = dir.to_str().expect("UTF-8 path");
    let output = io(&[&SMALL[..], &["--scratch-dir", dir_arg]].concat());
    succeeded(&output);
    assert_eq!(scratch_dir(&output), dir);
    assert!(dir.is_dir(), "kept");
    assert_eq!(entries(&dir), Vec::<PathBuf>::new(), "every file deleted");
}

#[test]
fn a_wrong_read_exits_with_code_1_and_leaves_no_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let kept = tmp.path().join("kept");
    let kept_arg = kept.to_str().expect("UTF-8 path");
    for extra in [&["--inject-fault"][..], &["--inject-fault", "--scratch-dir", kept_arg]] {
        let output = io_in(tmp.path(), false, &[&SMALL[..], extra].concat());
        assert_eq!(output.status.code(), Some(1), "{extra:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("check failed"), "{stderr}");
        let lines = json_lines(&output);
        assert_eq!(lines.len(), 2, "the epochs before the corrupted one, no final line: {lines:?}");
        assert!(lines.iter().all(|line| line["event"] == "epoch"));
    }
    assert_eq!(entries(&kept), Vec::<PathBuf>::new());
    assert_eq!(entries(tmp.path()), [kept], "the default scratch dir is removed on failure too");
}

#[test]
fn step_lines_count_the_files_when_tunefleet_steps_is_1() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let lines = succeeded(&io_in(tmp.path(), true, &SMALL));
    let steps: Vec<u64> = lines.iter().filter(|l| l["event"] == "step").filter_map(|l| l["step"].as_u64()).collect();
    assert_eq!(steps, (1..=18).collect::<Vec<_>>(), "one per file, numbered over the run");
    let events: Vec<&str> = lines.iter().filter_map(|l| l["event"].as_str()).collect();
    assert_eq!(events.len(), 22);
    for (epoch, at) in [6, 13, 20].into_iter().enumerate() {
        assert_eq!((events[at], lines[at]["epoch"].as_u64()), ("epoch", Some(epoch as u64 + 1)), "{events:?}");
    }
    let without = succeeded(&io_in(tmp.path(), false, &SMALL));
    assert!(without.iter().all(|l| l["event"] != "step"));
}

#[test]
fn a_resumed_run_goes_on_after_its_checkpoint_and_ends_with_the_same_checksum() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let saved = tmp.path().to_str().expect("UTF-8 path");
    let shape = ["--files", "4", "--file-kib", "8", "--seed", "5"];
    let whole = succeeded(&io(&[&shape[..], &["--epochs", "4"]].concat()));

    let first = succeeded(&io(&[&shape[..], &["--epochs", "2", "--checkpoint-dir", saved]].concat()));
    let named: Vec<&str> = first[..2].iter().map(|l| text(l, "checkpoint")).collect();
    for (epoch, path) in named.iter().enumerate() {
        assert!(path.ends_with(&format!("epoch-{}.ckpt", epoch + 1)), "{path}");
        assert!(Path::new(path).is_file(), "{path}");
    }
    let rest = succeeded(&io(&[&shape[..], &["--epochs", "4", "--resume", named[1]]].concat()));
    let epochs: Vec<u64> = rest.iter().filter_map(|l| l.get("epoch").and_then(Value::as_u64)).collect();
    assert_eq!(epochs, [3, 4], "goes on after the saved epoch");
    assert_eq!(checksums(&rest), checksums(&whole)[2..], "epochs 3, 4 and the run's checksum as if never stopped");

    // An empty --resume starts from scratch.
    assert_eq!(
        checksums(&succeeded(&io(&[&shape[..], &["--epochs", "4", "--resume", ""]].concat()))),
        checksums(&whole)
    );
}

#[test]
fn a_checkpoint_that_cannot_be_resumed_exits_with_code_2_or_1() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let garbage = tmp.path().join("garbage.ckpt");
    std::fs::write(&garbage, b"TFIOCK01 but short").expect("writes");
    let missing = tmp.path().join("missing.ckpt");
    for path in [&garbage, &missing] {
        let output = io(&["--resume", path.to_str().expect("UTF-8 path")]);
        assert_eq!(output.status.code(), Some(2), "{}", path.display());
        assert!(String::from_utf8_lossy(&output.stderr).contains("cannot resume"));
        assert!(output.stdout.is_empty());
    }
    // A whole checkpoint of another shape is refused when the run starts.
    let saved = tmp.path().to_str().expect("UTF-8 path");
    succeeded(&io(&["--files", "2", "--file-kib", "4", "--epochs", "1", "--checkpoint-dir", saved]));
    let checkpoint = tmp.path().join("epoch-1.ckpt");
    let output = io(&["--files", "3", "--file-kib", "4", "--resume", checkpoint.to_str().expect("UTF-8 path")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("saved with 2 files of 4 KiB"));
    assert!(output.stdout.is_empty());
}

#[test]
fn bad_flags_exit_with_code_2() {
    common::assert_usage_errors(
        IO,
        &[
            &["--files", "0"],
            &["--file-kib", "0"],
            &["--file-kib", "65537"],
            &["--block-kib", "0"],
            &["--epochs", "0"],
            &["--threads", "0"],
            &["--seed", "-1"],
            &["--bogus"],
        ],
    );
}
