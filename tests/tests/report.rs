//! The HTML report of a real study, opened in a real headless Chromium
//! (Debian's `chromium`): a pipelined study runs on two agents with the
//! training workload, `tunefleet report` writes the page, and Chromium loads
//! it with no console message, finds every chart, and takes a screenshot
//! kept as a test artifact.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunefleet_coordinator::report::CHART_IDS;
use tunefleet_tests::*;

/// Four trials, each probing one and two cores for an epoch apiece after a
/// warm-up epoch, then going on with the faster.
fn pipelined_study(dir: &Path, name: &str) -> PathBuf {
    let text = format!(
        r#"name = "{name}"
command = ["tunefleet-train", "--lr", "{{lr}}", "--epochs", "5", "--passes", "2"]
env = {{ REPORT_TAG = "{{tag}}" }}
timeout = 120
[objective]
metric = "accuracy"
direction = "maximize"
[budget]
trials = 4
[strategy]
kind = "grid"
[hyper.lr]
kind = "categorical"
values = [0.02, 0.05, 0.1, 0.2]
# A value that needs escaping in the page.
[hyper.tag]
kind = "categorical"
values = ["<b>&x"]
[system.cores]
kind = "int"
low = 1
high = 2
{PIPELINE_EPOCH_WINDOWS}"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write study");
    path
}

/// Where the test keeps what it made: the page and its screenshot.
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir
}

#[test]
fn the_report_of_a_pipelined_study_loads_in_chromium_with_every_chart_and_no_console_error() {
    chromium::binary();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = unique_root("report");
    let study_name = "report";
    let study = pipelined_study(dir.path(), study_name);
    let store = dir.path().join("store.db");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let agents = [format!("{root}-a1"), format!("{root}-a2")];
    let _running: Vec<Proc> = agents.iter().map(|a| start_agent(&url, a, &root, &[])).collect();
    let status = coord.wait_exit(Duration::from_secs(180));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    assert!(out.contains("4/4 trials done, 0 failed"), "{out}");

    let page = artifacts().join("report.html");
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["report", study_name, "-o"]).arg(&page).arg("--store").arg(&store);
    let (code, stdout, stderr) = run(cmd);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let size = std::fs::metadata(&page).expect("report written").len();
    assert_eq!(stdout.trim(), format!("report: {} ({size} bytes)", page.display()));
    let html = std::fs::read_to_string(&page).expect("read report");
    assert!(html.contains("<title>Tunefleet report: report</title>"));
    assert!(html.contains("tag=&lt;b&gt;&amp;x") && !html.contains("<b>&x"), "parameters are escaped");
    assert!(!html.contains("<script"), "no script");
    assert!(html.contains("class=\"w probe"), "probe windows drawn");
    assert!(html.contains("class=\"mark\""), "the kept probe window is marked");
    // No meter here: energy is a model of CPU time, labelled as such, and
    // time is not drawn against a function of itself.
    assert!(html.contains("class=\"est\"") && !html.contains("class=\"ok\">valid"), "an estimate is no valid reading");
    assert!(html.contains("Not drawn: every energy figure here is estimated"), "no time against estimated energy");
    for agent in &agents {
        assert!(html.contains(agent.as_str()), "{agent} has a timeline row");
    }

    let dom = chromium::dump_dom(&page, Duration::from_secs(60));
    assert!(dom.success, "chromium failed:\n{}", dom.stderr);
    assert_eq!(dom.console_lines(), Vec::<&str>::new(), "the page logged to the console");
    for id in CHART_IDS.iter().chain(&["table-classes", "table-best", "table-reuse"]) {
        assert!(dom.stdout.contains(&format!("id=\"{id}\"")), "{id} is not in the DOM Chromium built");
    }
    assert!(dom.stdout.contains("Clusters and reuse decisions"));

    let png = artifacts().join("report.png");
    let _ = std::fs::remove_file(&png);
    let shot = chromium::screenshot(&page, &png, (1280, 2000), Duration::from_secs(60));
    assert!(shot.success, "chromium failed:\n{}", shot.stderr);
    assert_eq!(shot.console_lines(), Vec::<&str>::new());
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(bytes.len() > 30_000, "a screenshot of charts, not a blank page: {} bytes", bytes.len());
    eprintln!("report: {} ({size} bytes), screenshot: {} ({} bytes)", page.display(), png.display(), bytes.len());
    assert_agents_spools_empty(&agents.iter().map(String::as_str).collect::<Vec<_>>());
}
