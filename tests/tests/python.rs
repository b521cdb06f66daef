//! The Python workload helper passes its own tests, and a Python
//! workload speaking the protocol through it is probed and steered for
//! real: a pipelined study whose agent changes the workload's thread count
//! between epochs over the control channel, and keeps the faster
//! configuration. The helper is a package (`python/`), built and
//! installed with pip, its pytest suite passes, and it reads a real store
//! through the real CLI as Optuna's records and DataFrame.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunefleet_tests::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The package's virtual environment (scripts/needs.sh `python-package`).
fn venv_python() -> PathBuf {
    let venv = std::env::var_os("PYTHON_VENV").map_or_else(|| repo().join("target/python-venv"), PathBuf::from);
    venv.join("bin/python")
}

/// Builds and installs `python/` into the package's virtual environment,
/// as a user would with `pip install ./python` (no network: no build isolation).
fn install_package() {
    let (code, out, err) = run({
        let mut c = Command::new(venv_python());
        c.args(["-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--force-reinstall"])
            .args(["--disable-pip-version-check", "./python"])
            .current_dir(repo());
        c
    });
    assert_eq!(code, Some(0), "pip install ./python: {out}\n{err}");
}

#[test]
fn the_python_package_installs_and_passes_its_own_tests() {
    let _alone = one_at_a_time();
    install_package();
    // Run from elsewhere: the installed package is what is tested, not the source tree.
    let dir = tempfile::tempdir().expect("tmp");
    let (code, out, err) = run({
        let mut c = Command::new(venv_python());
        c.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(repo().join("python/tests"))
            .current_dir(dir.path());
        c
    });
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("17 passed, 3 skipped"), "every test ran, the live ones skipped without a service: {out}");
    let (_, origin, _) = run({
        let mut c = Command::new(venv_python());
        c.args(["-c", "import tunefleet; print(tunefleet.__file__)"]).current_dir(dir.path());
        c
    });
    assert!(origin.contains("site-packages"), "the installed package: {origin}");
}

/// `tunefleet.Client` against a real service with real agents, from the
/// package's own pytest suite (`python/tests/test_live.py`): a study
/// submitted as a dict, followed, read as a DataFrame equal to `export`'s
/// CSV; a running one cancelled; an external study driven to its budget by
/// Optuna 5's CMA-ES sampler, every trial told once.
#[test]
fn the_client_drives_a_real_service_from_pytest() {
    let _alone = one_at_a_time();
    install_package();
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("live.db");
    let root = unique_root("pylive");
    let (mut service, broker) = start_service(&store, &root, &[]);
    let names = ["pylive-a", "pylive-b"];
    let _agents: Vec<Proc> = names.iter().map(|n| start_agent(&broker, n, &root, &["--slots", "2"])).collect();
    let (code, out, err) = run({
        let mut c = Command::new(venv_python());
        c.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
            .arg(repo().join("python/tests/test_live.py"))
            .env("TUNEFLEET_LIVE_STORE", &store)
            .env("TUNEFLEET_BIN", bin("tunefleet").parent().expect("bin dir"))
            .current_dir(dir.path());
        c
    });
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("3 passed") && !out.contains("skipped"), "every live test ran: {out}");
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    assert_agents_spools_empty(&names);
}

/// A real study read from Python through the real CLI: every trial a
/// record, the DataFrame in Optuna's columns, the best one the CLI's best.
#[test]
fn python_reads_a_real_study_as_records_and_a_dataframe() {
    let _alone = one_at_a_time();
    install_package();
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = sleep_study(dir.path(), "pyread", 4, 0.01);
    run_with_one_agent(&study, &store, "pyread", &[], Duration::from_secs(120));
    let script = r#"
import json, sys, tunefleet
s = tunefleet.load("pyread", store=sys.argv[1], tunefleet=sys.argv[2])
df = s.trials_dataframe()
print(json.dumps({
    "numbers": [t.number for t in s.trials()],
    "states": sorted(set(df["state"])),
    "values": [t.value for t in s.trials()],
    "columns": sorted(c for c in df.columns if c.startswith(("params_", "user_attrs_energy", "value"))),
    "best": s.best().number,
    "agent": s.trials()[0].user_attrs["agent"],
}))
"#;
    let (code, out, err) = run({
        let mut c = Command::new(venv_python());
        c.args(["-c", script]).arg(&store).arg(bin("tunefleet")).env("XDG_STATE_HOME", state_home());
        c
    });
    assert_eq!(code, Some(0), "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["numbers"], serde_json::json!([0, 1, 2, 3]));
    assert_eq!(v["states"], serde_json::json!(["COMPLETE"]));
    assert_eq!(v["values"], serde_json::json!([1.0, 2.0, 3.0, 4.0]), "v = trial + 1");
    let columns: Vec<&str> = v["columns"].as_array().expect("columns").iter().filter_map(|c| c.as_str()).collect();
    for want in ["params_v", "user_attrs_energy_j", "user_attrs_energy_source", "value"] {
        assert!(columns.contains(&want), "{want} in {columns:?}");
    }
    // The best by the CLI's rule (v maximised): trial 3, as `tunefleet best` says.
    assert_eq!(v["best"], 3);
    let (_, best, _) = tunefleet(&["best", "pyread", "--store", store.to_str().expect("utf-8"), "-n", "1"]);
    assert!(best.lines().any(|l| l.starts_with("trial    3")), "{best}");
    assert!(v["agent"].as_str().is_some_and(|a| a.ends_with("-agent")), "{v}");
}

#[test]
fn a_python_workload_is_steered_through_the_helper_and_keeps_the_faster_thread_count() {
    let dir = tempfile::tempdir().expect("tmp");
    let script = repo().join("examples/python/spin.py");
    let study = dir.path().join("py.toml");
    std::fs::write(
        &study,
        format!(
            "name = \"py\"\ncommand = [\"python3\", \"{}\", \"--epochs\", \"5\", \"--seconds\", \"0.3\", \"--scale\", \"{{scale}}\"]\n\
             timeout = 60\n[objective]\nmetric = \"loss\"\ndirection = \"minimize\"\n[budget]\ntrials = 2\n\
             [strategy]\nkind = \"grid\"\n[hyper.scale]\nkind = \"categorical\"\nvalues = [1, 2]\n\
             [system.threads]\nkind = \"int\"\nlow = 1\nhigh = 2\n\
             [pipeline]\nmode = \"pipelined\"\nwindow = {{ epochs = 1, warmup = 1 }}\ncontrol = true\n\
             [reuse]\nenabled = false\n",
            script.display()
        ),
    )
    .expect("study");
    let store = dir.path().join("s.db");
    let out = run_with_one_agent(&study, &store, "python", &[], Duration::from_secs(120));
    assert!(out.contains("2/2 trials done, 0 failed"), "{out}");
    // The epochs reported the thread count they ran with: warm-up and the
    // first probe at the default (2), the second probe at 1, then the kept one.
    let results: Vec<(i64, String)> =
        query(&store, "SELECT trial, measurement FROM results WHERE study = 'py' ORDER BY trial", |r| {
            Ok((r.get(0)?, r.get(1)?))
        });
    assert_eq!(results.len(), 2);
    for (trial, m) in &results {
        let m: serde_json::Value = serde_json::from_str(m).expect("measurement");
        let seen: Vec<i64> = m["epochs"]
            .as_array()
            .expect("epochs")
            .iter()
            .map(|e| e["metrics"]["threads"].as_f64().unwrap_or(0.0) as i64)
            .collect();
        assert_eq!(seen, [2, 2, 1, 2, 2], "trial {trial}: threads per epoch as steered");
    }
    // Each trial kept threads = 2, the faster, and says so in its result.
    let kept: Vec<String> = query(&store, "SELECT system FROM results WHERE study = 'py' ORDER BY trial", |r| r.get(0));
    assert_eq!(kept.len(), 2);
    for k in &kept {
        let k: serde_json::Value = serde_json::from_str(k).expect("system");
        assert_eq!(k["threads"], 2, "{kept:?}");
    }
}

#[path = "../../agent/tests/nvml/mod.rs"]
mod nvml;

/// The GPU example (`examples/python/torch_mlp.py`, its study
/// `examples/studies/torch-gpu.toml` cut to three trials of two epochs) runs
/// on an agent with one GPU (the stand-in NVML, drawing 250 W): each trial
/// gets it, reports its epochs through the helper, and its energy is its
/// CPU's and its GPU's, energy a second objective. PyTorch is never
/// installed here: where it is absent the plain fallback trains.
#[test]
fn the_gpu_example_trains_on_its_gpu_or_its_fallback_and_counts_the_gpus_energy() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = nvml::standin(dir.path());
    nvml::fixture(&lib, "H200 GPU-aaaa rate:250000 250000\n");
    let text = std::fs::read_to_string(repo().join("examples/studies/torch-gpu.toml")).expect("the example study");
    let text = text.replace("trials = 16", "trials = 3").replace("\"--epochs\", \"5\"", "\"--epochs\", \"2\"");
    assert!(text.contains("trials = 3") && text.contains("\"2\"") && text.contains("gpus = 1"), "{text}");
    let study = dir.path().join("torch-gpu.toml");
    std::fs::write(&study, text).expect("study");
    let store = dir.path().join("s.db");
    let workdir = repo().display().to_string();
    let lib_arg = lib.display().to_string();
    let agent = ["--workdir", workdir.as_str(), "--nvml-lib", lib_arg.as_str()];
    let out = run_with_one_agent(&study, &store, "torch", &agent, Duration::from_secs(180));
    assert!(out.contains("3/3 trials done, 0 failed"), "{out}");
    let rows: Vec<(f64, f64, Option<f64>, String)> = query(
        &store,
        "SELECT objective, energy_j, gpu_energy_j, measurement FROM results WHERE study = 'torch-gpu'",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    );
    assert_eq!(rows.len(), 3);
    let torch = Command::new("python3").args(["-c", "import torch"]).status().is_ok_and(|s| s.success());
    for (accuracy, energy, gpu, m) in rows {
        let m: serde_json::Value = serde_json::from_str(&m).expect("measurement");
        assert!(accuracy > 0.7, "it learnt: {accuracy}");
        assert_eq!(m["final_metrics"]["torch"], if torch { 1.0 } else { 0.0 }, "{}", m["final_metrics"]);
        assert_eq!(m["epochs"].as_array().map(Vec::len), Some(2));
        assert_eq!(m["gpus"][0]["uuid"], "GPU-aaaa");
        let gpu = gpu.expect("its GPU's part");
        assert!(gpu > 0.0 && (energy - gpu - m["energy"]["joules"].as_f64().expect("cpu")).abs() < 1e-6);
    }
}
