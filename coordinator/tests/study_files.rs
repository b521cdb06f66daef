//! Study files on disk: the fixtures load, their plans and rendered trials are
//! what the file says, and broken files are refused with the line at fault.

use std::path::PathBuf;

use tunefleet_common::message::{SystemParams, TrialRef};
use tunefleet_common::params::ParamValue;
use tunefleet_coordinator::domain::search::{self, TrialPlan};
use tunefleet_coordinator::domain::study::{self, Direction, ParamSpec, Strategy, StudyError, SystemParam};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn refused(name: &str) -> (String, usize) {
    let path = fixture(name);
    let e = study::load(&path).expect_err("fixture must be refused");
    let line = e.location().map(|l| l.line).unwrap_or_else(|| panic!("no location in {e}"));
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}:{line}:", path.display())), "{msg}");
    (msg, line)
}

/// `program` is one of the example workloads the workspace builds.
fn assert_is_a_workload(program: &str) {
    let bins = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/workloads/src/bin");
    let source = bins.join(format!("{program}.rs"));
    assert!(source.is_file(), "{program} is not a workload of examples/workloads ({} is missing)", source.display());
}

#[test]
fn documented_example_loads_and_plans() {
    let s = study::load(&fixture("train.toml")).expect("loads");
    assert_eq!(s.name, "train-example");
    assert_eq!(s.objective.direction, Direction::Maximize);
    assert_eq!(s.strategy, Strategy::Random { seed: 7 });
    assert_eq!(s.system.get(&SystemParam::Threads), Some(&ParamSpec::Int { low: 1, high: 2, step: 1 }));
    assert_eq!(s.source, std::fs::read_to_string(fixture("train.toml")).expect("reads"));

    let plan = search::plan(&s);
    assert_eq!(plan.len(), 12);
    assert_eq!(plan, search::plan(&study::load(&fixture("train.toml")).expect("loads")), "seeded: same plan");
    for t in &plan {
        let lr = t.params["lr"].as_f64().expect("lr is a float");
        assert!((0.01..=1.0).contains(&lr), "{lr}");
        assert!(matches!(t.params["batch_size"], ParamValue::Int(16 | 64 | 256)));
        assert!(matches!(t.params["threads"], ParamValue::Int(1 | 2)));
    }

    let t = &plan[5];
    let spec = search::render(&s, t, &TrialRef { study: s.name.clone(), study_id: 7, trial: t.trial, attempt: 1 })
        .expect("renders");
    assert_eq!(spec.argv[0], "tunefleet-train");
    assert_is_a_workload(&spec.argv[0]);
    assert_eq!(spec.argv[2], t.params["lr"].to_string());
    assert_eq!(spec.argv[4], t.params["batch_size"].to_string());
    assert_eq!(spec.env, vec![("TUNEFLEET_SEED".to_string(), "5".to_string())]);
    assert_eq!(spec.system.threads, t.params["threads"].as_u64().map(|v| v as u32));
    assert_eq!(spec.timeout_ms, 120_000);
}

#[test]
fn grid_example_runs_every_configuration_twice() {
    let s = study::load(&fixture("grid.toml")).expect("loads");
    assert_eq!(search::grid_size(&s), 8);
    let plan = search::plan(&s);
    assert_eq!(plan.len(), 16);
    let first: &TrialPlan = &plan[0];
    assert_eq!(first.params["block_size"], ParamValue::Int(16));
    assert_eq!(first.params["threads"], ParamValue::Int(1));
    assert_eq!(first.params["memory"], ParamValue::Int(256));
    // The last system parameter (memory) varies fastest; each configuration twice.
    assert_eq!(plan[1].params, plan[0].params);
    assert_eq!(plan[2].params["memory"], ParamValue::Int(1024));
    assert_eq!(plan[15].params["block_size"], ParamValue::Int(64));

    let t = &plan[3];
    let spec =
        search::render(&s, t, &TrialRef { study: s.name.clone(), study_id: 7, trial: 3, attempt: 2 }).expect("renders");
    assert_eq!(
        spec.argv,
        ["tunefleet-stream", "--size-mib", "64", "--block-size", "16", "--epochs", "2", "--threads", "1"]
    );
    assert_eq!(spec.env, [("TUNEFLEET_RUN".to_string(), "grid-example-3-1".to_string())]);
    assert_is_a_workload(&spec.argv[0]);
    assert_eq!(spec.system, SystemParams { cores: None, threads: Some(1), memory_mib: Some(1024) });
    assert_eq!(spec.timeout_ms, study::DEFAULT_TIMEOUT_S * 1000);
}

#[test]
fn low_above_high_is_refused_at_its_line() {
    let (msg, line) = refused("bad_low_high.toml");
    assert_eq!(line, 16, "{msg}");
    assert!(msg.contains("hyper.lr: low (2) must be below high (1)"), "{msg}");
}

#[test]
fn unknown_key_is_refused_at_its_line() {
    let (msg, line) = refused("bad_unknown_key.toml");
    assert_eq!(line, 10, "{msg}");
    assert!(msg.contains("max"), "{msg}");
}

#[test]
fn unknown_placeholder_is_refused_at_its_line() {
    let (msg, line) = refused("bad_placeholder.toml");
    assert_eq!(line, 2, "{msg}");
    assert!(msg.contains("{learning_rate}"), "{msg}");
}

#[test]
fn missing_file_names_the_path() {
    let path = fixture("does_not_exist.toml");
    let e = study::load(&path).expect_err("missing");
    assert!(matches!(e, StudyError::Read { .. }));
    assert!(e.to_string().contains("does_not_exist.toml"), "{e}");
}
