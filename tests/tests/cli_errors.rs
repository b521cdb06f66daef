//! Bad input on the command line and in study files: a clear message that
//! names the problem, exit code 2, and nothing started.

use std::process::Command;

use tunefleet_tests::*;

fn tunefleet(args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = Command::new(bin("tunefleet"));
    c.args(args);
    run(c)
}

fn agent(args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = Command::new(bin("tunefleet-agent"));
    c.args(args);
    run(c)
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.to_string_lossy().into_owned()
}

const GOOD: &str = r#"name = "ok"
command = ["true", "{x}"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = 2
[strategy]
kind = "grid"
[hyper.x]
kind = "int"
low = 1
high = 2
"#;

#[test]
fn bad_study_files_are_refused_with_the_line_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("never-created.db");
    let cases = [
        ("unknown-key.toml", GOOD.replace("trials = 2", "trials = 2\ntrails = 3"), "trails", ":8"),
        ("bad-range.toml", GOOD.replace("high = 2", "high = 0"), "low", ":12"),
        ("typo.toml", GOOD.replace("{x}", "{y}"), "{y}", ""),
        ("no-space.toml", GOOD.split("[hyper.x]").next().unwrap_or_default().to_string(), "space", ""),
        ("syntax.toml", GOOD.replace("trials = 2", "trials = "), "syntax.toml", ":7"),
    ];
    for (file, text, needle, line) in cases {
        let path = write(dir.path(), file, &text);
        let (code, _out, err) =
            tunefleet(&["run", &path, "--store", store.to_str().unwrap_or_default(), "--listen", "127.0.0.1:0"]);
        assert_eq!(code, Some(2), "{file}: {err}");
        assert!(err.contains(needle), "{file}: message should name {needle:?}: {err}");
        assert!(err.contains(&format!("{file}{line}")), "{file}: message should give the place {line}: {err}");
        assert!(!store.exists(), "{file}: nothing may start for a bad study");
    }
    let (code, out, err) = tunefleet(&["check", &write(dir.path(), "good.toml", GOOD)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("2 trials"), "{out}");
}

#[test]
fn bad_command_lines_exit_2_with_a_message() {
    let (code, _, err) = tunefleet(&["run"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = tunefleet(&["run", "x.toml", "--broker", "http://nope"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("http://nope"), "{err}");
    let (code, _, err) = tunefleet(&["run", "/does/not/exist.toml"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/does/not/exist.toml"), "{err}");
    let (code, _, err) = tunefleet(&["best", "nostudy", "--store", "/does/not/exist.db"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("/does/not/exist.db"), "{err}");

    let (code, _, err) = agent(&["--broker", "tcp://x:1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("tcp://x:1"), "{err}");
    let (code, _, err) = agent(&["--broker", "mqtt://127.0.0.1:1", "--tag", "novalue"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("novalue"), "{err}");
    let (code, _, err) = agent(&["--broker", "mqtt://127.0.0.1:1", "--slots", "0"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, _, err) = agent(&["--broker", "mqtt://127.0.0.1:1", "--name", "bad/name"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("bad/name"), "{err}");
}

#[test]
fn regression_check_piped_into_head_does_not_panic() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    // Enough trials that the output overflows the pipe after the reader is gone.
    let big = GOOD.replace("trials = 2", "trials = 50000").replace("high = 2", "high = 100000");
    let path = write(dir.path(), "big.toml", &big);
    let mut child = Command::new(bin("tunefleet"))
        .args(["check", &path])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("a line");
    assert!(first.contains("50000 trials"), "{first}");
    // The reader is gone now, like `| head -1`.
    let out = child.wait_with_output().expect("exit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}
