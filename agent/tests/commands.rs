//! `tunefleet-agent probe` and `measure` run as a user runs them: a process,
//! its output and its exit status. The bundled workloads come from
//! `cargo build --workspace --bins` (next to the agent binary).

mod sysfs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sysfs::{Sysfs, INTEL_RANGE};
use tunefleet_common::measurement::{EnergySourceKind, ExitOutcome, Measurement};

fn agent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunefleet-agent"));
    cmd.env_remove("TUNEFLEET_BROKER").env_remove("TUNEFLEET_LOG");
    cmd
}

fn with_roots(cmd: &mut Command, fx: &Sysfs) {
    for (flag, dir) in
        [("--powercap-root", "powercap"), ("--hwmon-root", "hwmon"), ("--power-supply-root", "power_supply")]
    {
        cmd.arg(flag).arg(fx.path(dir));
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The JSON measurement `measure --json` prints as the last line of stderr.
fn measurement(out: &Output) -> Measurement {
    let stderr = text(&out.stderr);
    let last = stderr.lines().last().unwrap_or_else(|| panic!("no report on stderr"));
    serde_json::from_str(last).unwrap_or_else(|e| panic!("not a measurement ({e}): {last}"))
}

fn workload(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_tunefleet-agent")).parent().map(Path::to_path_buf).unwrap_or_default();
    let path = dir.join(name);
    assert!(path.exists(), "{} missing: run `cargo build --workspace --bins` first", path.display());
    path
}

#[test]
fn probe_table_shows_fixture_rapl_and_counters() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    fx.rapl_zone("0:0", "core", 0, INTEL_RANGE);
    let mut cmd = agent();
    cmd.arg("probe");
    with_roots(&mut cmd, &fx);
    let out = cmd.output().expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.contains("selected: rapl"), "{table}");
    assert!(table.contains("package-0,package-0/core"), "{table}");
    assert!(table.contains("task-clock"), "software events always open: {table}");
    assert!(table.contains("perf counters:"), "{table}");
}

#[test]
fn probe_json_reports_unreadable_sources_and_counter_support() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    let file = fx.path("powercap/intel-rapl:0/energy_uj");
    std::fs::remove_file(&file).expect("rm");
    std::fs::create_dir(&file).expect("a directory: unreadable even for root");
    let mut cmd = agent();
    cmd.args(["probe", "--json"]);
    with_roots(&mut cmd, &fx);
    let out = cmd.output().expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["energy_selected"], "Estimated");
    assert_eq!(v["energy"][0]["kind"], "Rapl");
    assert_eq!(v["energy"][0]["readable"], false);
    assert!(v["energy_skipped"][0].as_str().unwrap_or("").contains("energy_uj"), "{v}");
    let counters: Vec<&str> = v["counters"].as_array().expect("list").iter().filter_map(|c| c.as_str()).collect();
    assert!(counters.iter().any(|c| c.starts_with("task-clock")), "{counters:?}");
    let hw = counters.iter().any(|c| c.starts_with("instructions") || c.starts_with("cycles"));
    assert_eq!(v["hardware_counters"], hw);
    if !hw {
        let missing = v["counters_missing"].as_array().expect("list");
        assert!(missing
            .iter()
            .any(|m| m["event"] == "instructions" && m["reason"].as_str().is_some_and(|r| !r.is_empty())));
    }
}

#[test]
fn measure_passes_output_and_exit_status_through() {
    let out = agent().args(["measure", "--", "sh", "-c", "echo hello; exit 7"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "hello\n", "the command's stdout is its own");
    let report = text(&out.stderr);
    assert!(report.contains("exited with status 7"), "{report}");
    assert!(report.contains("s  wall") && report.contains("J  total") && report.contains("task-clock"), "{report}");
    assert!(report.contains("ESTIMATED"), "an estimate is always labelled: {report}");
}

#[test]
fn measure_reports_signals_and_commands_that_do_not_start() {
    let out = agent().args(["measure", "--", "sh", "-c", "kill -9 $$"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = agent().args(["measure", "--", "/nonexistent/tunefleet-nothing"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("/nonexistent/tunefleet-nothing"), "{}", text(&out.stderr));
}

#[test]
fn measure_json_carries_energy_provenance() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    fx.rapl_zone("0:2", "dram", 0, INTEL_RANGE);
    let mut cmd = agent();
    cmd.args(["measure", "--json", "--interval", "20ms"]);
    with_roots(&mut cmd, &fx);
    let out = cmd.args(["--", "sh", "-c", "sleep 0.2"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let m = measurement(&out);
    assert_eq!(m.exit, ExitOutcome::Exited(0));
    assert_eq!(m.energy.source, EnergySourceKind::Rapl);
    assert!(m.energy.valid, "{:?}", m.energy.note);
    let domains: Vec<&str> = m.energy.domains.iter().map(|d| d.domain.as_str()).collect();
    assert_eq!(domains, ["package-0", "package-0/dram"]);
    assert!(m.energy.interval_ms > 0 && m.energy.interval_ms < 200, "{}", m.energy.interval_ms);
    assert!(m.energy.series.len() >= 3, "sampled while it ran: {:?}", m.energy.series);
    assert!(m.counter_series.len() >= 3);
}

/// `measure -o FILE` writes the JSON report to FILE, and standard error
/// still gets what it got without: the same JSON with `--json`, the table without.
#[test]
fn measure_writes_its_json_report_to_the_output_file_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("m.json");
    let out =
        agent().args(["measure", "--json", "-o"]).arg(&file).args(["--", "sh", "-c", "exit 3"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&file).expect("the file is written");
    let m: Measurement = serde_json::from_str(&written).expect("a measurement");
    assert_eq!(m, measurement(&out), "the file holds what stderr shows");
    assert_eq!(m.exit, ExitOutcome::Exited(3));

    let out = agent().arg("measure").arg("--output").arg(&file).args(["--", "true"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("J  total"), "the table still goes to stderr: {}", text(&out.stderr));
    let m: Measurement = serde_json::from_str(&std::fs::read_to_string(&file).expect("reads")).expect("a measurement");
    assert_eq!(m.exit, ExitOutcome::Exited(0), "rewritten for the second run");

    let out = agent()
        .args(["measure", "-o", "/nonexistent/dir/m.json", "--", "touch"])
        .arg(dir.path().join("ran"))
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("-o: cannot create /nonexistent/dir/m.json"), "{}", text(&out.stderr));
    assert!(!dir.path().join("ran").exists(), "an unwritable FILE is refused before the command runs");
}

#[test]
fn version_shows_the_protocol_and_profile_versions() {
    let out = agent().arg("--version").output().expect("runs");
    assert_eq!(out.status.code(), Some(0));
    let expected = format!(
        "tunefleet-agent {} (protocol {}, profile {})\n",
        env!("CARGO_PKG_VERSION"),
        tunefleet_common::PROTOCOL_VERSION,
        tunefleet_common::profile::PROFILE_VERSION
    );
    assert_eq!(text(&out.stdout), expected);
}

#[test]
fn usage_errors_exit_with_2() {
    let out = agent().arg("measure").output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let out = agent().args(["--name", "x"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--broker"), "{}", text(&out.stderr));
    let out = agent().args(["measure", "--interval", "0s", "--", "true"]).output().expect("runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--interval"));
}

#[test]
fn the_two_bundled_workloads_have_distinct_profiles() {
    let run = |argv: &[&str]| {
        let out = agent()
            .args(["measure", "--json", "--interval", "50ms", "--"])
            .arg(workload(argv[0]))
            .args(&argv[1..])
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        measurement(&out).profile
    };
    let train = run(&["tunefleet-train", "--epochs", "3", "--hidden", "256"]);
    let stream = run(&["tunefleet-stream", "--epochs", "3", "--size-mib", "64", "--passes", "1"]);
    let distance = train.distance(&stream).expect("comparable");
    // The streaming job touches fresh memory all the time: far more page
    // faults per CPU-second (a log10 feature) than the training job.
    let faults = |p: &tunefleet_common::profile::Profile| p.get("log_minor_faults_per_cpu_s").unwrap_or(0.0);
    assert!(faults(&stream) > faults(&train) + 0.5, "train {train:?} stream {stream:?}");
    assert!(distance > 0.5, "distance {distance}: train {train:?} stream {stream:?}");
    assert!(train.get("cpus_busy").is_some_and(|b| b > 0.0));
}
