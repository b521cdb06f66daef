//! The `tunefleet` binary as a user runs it: what it prints, and what it
//! logs to standard error when that is not a terminal (a file, a pipe,
//! journald): plain text, no colour codes.

use std::process::{Command, Stdio};

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};
use tunefleet_common::message::TrialRef;
use tunefleet_coordinator::store::Store;
use tunefleet_coordinator::{search, study};

fn study_text(metric: &str) -> String {
    format!(
        "name = \"plain\"\ncommand = [\"true\", \"{{x}}\"]\n[objective]\nmetric = \"{metric}\"\n\
         direction = \"minimize\"\n[budget]\ntrials = 4\n[strategy]\nkind = \"grid\"\n[hyper.x]\n\
         kind = \"int\"\nlow = 1\nhigh = 4\n"
    )
}

/// `tunefleet best plain ARGS --store PATH`: its standard output, once it succeeded.
fn best(args: &[&str], store: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tunefleet"))
        .args(["best", "plain"])
        .args(args)
        .arg("--store")
        .arg(store)
        .stdin(Stdio::null())
        .output()
        .expect("tunefleet runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 8: the coordinator coloured its log even into a file or journald.
#[test]
fn regression_log_into_a_pipe_has_no_ansi_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let study = dir.path().join("s.toml");
    std::fs::write(&study, study_text("wall_time")).expect("write study");
    // The embedded broker starts (and logs that at info), then the store
    // cannot be created: the run ends at once, after one log line.
    let store = dir.path().join("missing-dir").join("t.db");
    let out = Command::new(env!("CARGO_BIN_EXE_tunefleet"))
        .arg("run")
        .arg(&study)
        .args(["--listen", "127.0.0.1:0", "--quiet", "--store"])
        .arg(&store)
        .env_remove("TUNEFLEET_LOG")
        .env_remove("TUNEFLEET_STORE")
        .env_remove("TUNEFLEET_BROKER")
        .stdin(Stdio::null())
        .output()
        .expect("tunefleet runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("embedded broker listening"), "the log line must be there to be checked: {err}");
    assert!(!out.stderr.contains(&0x1b), "ANSI escape in a piped log: {err:?}");
}

/// Issue 8: `tunefleet best` ranked energy readings that were invalid, and
/// did not say that some trials were left out.
#[test]
fn regression_best_energy_leaves_out_invalid_readings_and_says_how_many() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let s = study::parse(&study_text("energy"), "s.toml").expect("parses");
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    b.create_study(&s, &search::plan(&s)).expect("creates");
    for (trial, joules, valid) in [(0, 9.0, true), (1, 1.0, false), (2, 5.0, true), (3, 2.0, false)] {
        let energy = EnergyReading {
            joules,
            valid,
            ..EnergyReading::none(EnergySourceKind::Battery, if valid { "discharging" } else { "charging" })
        };
        let m = Measurement::unmeasured(ExitOutcome::Exited(0), energy);
        let r = TrialRef { study: "plain".into(), trial, attempt: 1 };
        b.record_assignment(&r, "a1", 10).expect("assigns");
        b.record_result(&r, "a1", &m, m.objective_value("energy"), 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);

    let text = best(&["-n", "10"], &path);
    let trials: Vec<&str> = text.lines().filter(|l| l.starts_with("trial")).collect();
    assert_eq!(trials.len(), 2, "{text}");
    assert!(trials[0].starts_with("trial    2") && trials[1].starts_with("trial    0"), "{text}");
    assert!(text.contains("2 successful trials not ranked: 2 with an invalid energy reading"), "{text}");
}

/// Issue 9: a multi-objective study's result is a Pareto front, and `best
/// --pareto` shows it: the trade-offs kept, the dominated and the invalid left out.
#[test]
fn best_pareto_shows_the_front_of_the_objective_against_energy_and_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let text = study_text("loss")
        .replace("direction = \"minimize\"", "direction = \"minimize\"\nalso = [\"energy\", \"wall_time\"]");
    let s = study::parse(&text, "s.toml").expect("parses");
    assert_eq!(s.objective.also.len(), 2);
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    b.create_study(&s, &search::plan(&s)).expect("creates");
    // (loss, joules, seconds, valid): 0 and 1 trade loss for energy, 2 is
    // beaten by 1 everywhere, 3 would win but its energy is invalid.
    for (trial, loss, joules, secs, valid) in
        [(0, 0.1, 9.0, 2.0, true), (1, 0.3, 2.0, 1.0, true), (2, 0.4, 3.0, 1.5, true), (3, 0.05, 1.0, 0.5, false)]
    {
        let energy = EnergyReading { joules, valid, ..EnergyReading::none(EnergySourceKind::Estimated, "model") };
        let m = Measurement {
            wall_us: (secs * 1e6) as u64,
            final_metrics: [("loss".to_string(), loss)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), energy)
        };
        let r = TrialRef { study: "plain".into(), trial, attempt: 1 };
        b.record_assignment(&r, "a1", 10).expect("assigns");
        b.record_result(&r, "a1", &m, m.objective_value("loss"), 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);
    let text = best(&["--pareto"], &path);
    assert!(text.contains("against energy, wall_time (minimised): 2 of 3 trials"), "{text}");
    let trials: Vec<&str> = text.lines().filter(|l| l.starts_with("trial")).collect();
    assert_eq!(trials.len(), 2, "{text}");
    assert!(trials[0].starts_with("trial    0") && trials[1].starts_with("trial    1"), "{text}");
    assert!(trials[1].contains("2.000 J") && trials[1].contains("1.000 s"), "{text}");
}

/// Issue 11: a study run on several kinds of device ranks each class apart.
#[test]
fn best_by_class_ranks_each_device_class_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let s = study::parse(&study_text("loss"), "s.toml").expect("parses");
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    b.create_study(&s, &search::plan(&s)).expect("creates");
    let mut phone = tunefleet_common::message::AgentInfo::minimal("phone", 1);
    phone.arch = "aarch64".into();
    phone.cores = 8;
    let mut server = tunefleet_common::message::AgentInfo::minimal("server", 1);
    server.arch = "x86_64".into();
    server.cores = 64;
    b.upsert_agent(&phone, 1).expect("agent");
    b.upsert_agent(&server, 1).expect("agent");
    for (trial, agent, loss) in [(0, "phone", 0.5), (1, "server", 0.2), (2, "phone", 0.3), (3, "server", 0.4)] {
        let m = Measurement {
            final_metrics: [("loss".to_string(), loss)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, "m"))
        };
        let r = TrialRef { study: "plain".into(), trial, attempt: 1 };
        b.record_assignment(&r, agent, 10).expect("assigns");
        b.record_result(&r, agent, &m, m.objective_value("loss"), 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);
    let text = best(&["--by-class", "-n", "1"], &path);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("aarch64, 8 cores") && lines[1].contains("trial    2"), "{text}");
    assert!(lines[2].starts_with("x86_64, 64 cores") && lines[3].contains("trial    1"), "{text}");
}
