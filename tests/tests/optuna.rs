//! A Tunefleet study opened by Optuna's own tools: `tunefleet export
//! --format optuna` writes the journal `optuna.load_study` replays (Optuna
//! 5 from PyPI, in the virtual environment scripts/needs.sh makes), with
//! the same trials, parameters, values and intermediate values as the
//! study's JSON export. Real coordinator and agent processes.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;

use tunefleet_tests::*;

/// The virtual environment with Optuna (scripts/needs.sh `optuna`).
fn optuna_python() -> PathBuf {
    let venv = std::env::var_os("OPTUNA_VENV").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo").join("target/optuna-venv"),
        PathBuf::from,
    );
    venv.join("bin/python")
}

/// What Optuna reads of the journal: each trial's number, state, params,
/// values and intermediate values, and the study's directions, as JSON.
const READ: &str = r#"
import json, sys, optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
storage = JournalStorage(JournalFileBackend(sys.argv[1]))
study = optuna.load_study(study_name=sys.argv[2], storage=storage)
print(json.dumps({
    "directions": [d.name for d in study.directions],
    "trials": [{"number": t.number, "state": t.state.name, "params": t.params, "values": t.values,
                "intermediate": {str(k): v for k, v in t.intermediate_values.items()},
                "energy_source": t.user_attrs.get("energy_source"), "agent": t.user_attrs.get("agent"),
                "complete": t.datetime_complete is not None} for t in study.trials],
    "best": study.best_trials[0].params if study.best_trials else None,
}))
"#;

#[test]
fn optuna_loads_an_exported_study_with_the_same_trials_values_and_epochs() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = dir.path().join("opt.toml");
    // Two epochs each (the objective at each), a categorical and an int; two objectives.
    std::fs::write(
        &study,
        r#"name = "opt"
command = ["sh", "-c", "echo '{{\"event\":\"epoch\",\"epoch\":1,\"score\":'$0'}}'; echo '{{\"event\":\"epoch\",\"epoch\":2,\"score\":'$(($0 * 2))'}}'", "{n}", "{kind}"]
timeout = 30
[objective]
metric = "score"
direction = "maximize"
also = ["wall_time"]
[budget]
trials = 6
[strategy]
kind = "grid"
[hyper.n]
kind = "int"
low = 1
high = 3
[hyper.kind]
kind = "categorical"
values = ["a", "b"]
"#,
    )
    .expect("study");
    let (code, out, log) = run_study_logged(dir.path(), &study, &store, "optuna");
    assert_eq!(code, Some(0), "{out}\n{log}");
    let s = store.to_str().expect("utf-8");
    let journal = dir.path().join("opt.journal");
    let (code, _, err) =
        tunefleet(&["export", "opt", "--format", "optuna", "-o", journal.to_str().expect("utf-8"), "--store", s]);
    assert_eq!(code, Some(0), "{err}");
    let (code, json, err) = tunefleet(&["export", "opt", "--format", "json", "--store", s]);
    assert_eq!(code, Some(0), "{err}");
    let ours: serde_json::Value = serde_json::from_str(&json).expect("export json");

    let out = Command::new(optuna_python())
        .args(["-c", READ, journal.to_str().expect("utf-8"), "opt"])
        .output()
        .expect("the Optuna virtual environment (scripts/needs.sh optuna)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let theirs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("optuna's json");
    assert_eq!(theirs["directions"], serde_json::json!(["MAXIMIZE", "MINIMIZE"]));
    let trials = theirs["trials"].as_array().expect("trials");
    let rows = ours.as_array().expect("rows");
    assert_eq!(trials.len(), rows.len(), "every trial");
    for (t, r) in trials.iter().zip(rows) {
        assert_eq!(t["number"], r["trial"], "in trial order");
        assert_eq!(t["state"], "COMPLETE", "{t}");
        assert_eq!(t["params"], r["params"], "the same parameters, categories by value");
        let n = r["params"]["n"].as_f64().expect("n");
        assert_eq!(t["values"][0].as_f64(), r["objective"].as_f64(), "the objective");
        assert_eq!(t["values"][0].as_f64(), Some(2.0 * n), "the last epoch's score");
        let wall = r["wall_us"].as_f64().expect("wall") / 1e6;
        assert!((t["values"][1].as_f64().expect("wall time") - wall).abs() < 1e-9, "the second objective");
        assert_eq!(t["intermediate"], serde_json::json!({"1": n, "2": 2.0 * n}), "the stored epochs");
        assert_eq!(t["energy_source"], r["energy_source"]);
        assert_eq!(t["agent"], r["agent"]);
        assert_eq!(t["complete"], true);
    }
}

/// optuna-dashboard (from PyPI) serves a study Tunefleet exported, and
/// headless Chromium draws its history plot with a point a trial and the
/// same best trial as `tunefleet best`; the screenshot is kept.
#[test]
fn optuna_dashboard_serves_an_exported_study_and_draws_its_history() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = sleep_study(dir.path(), "dash", 5, 0.01);
    let (code, out, log) = run_study_logged(dir.path(), &study, &store, "dashboard");
    assert_eq!(code, Some(0), "{out}\n{log}");
    let s = store.to_str().expect("utf-8");
    let journal = dir.path().join("dash.journal");
    let (code, _, err) =
        tunefleet(&["export", "dash", "--format", "optuna", "-o", journal.to_str().expect("utf-8"), "--store", s]);
    assert_eq!(code, Some(0), "{err}");
    let (code, json, err) = tunefleet(&["export", "dash", "--format", "json", "--store", s]);
    assert_eq!(code, Some(0), "{err}");
    let rows: serde_json::Value = serde_json::from_str(&json).expect("export json");
    let best = rows.as_array().expect("rows").iter().find(|r| r["rank"] == 1).expect("a best trial")["trial"].clone();

    let port = free_port();
    let mut dashboard = Command::new(optuna_python().with_file_name("optuna-dashboard"));
    dashboard.arg(&journal).args(["--port", &port.to_string(), "--host", "127.0.0.1"]);
    let mut dashboard = Proc::spawn("optuna-dashboard", dashboard);
    let api = format!("127.0.0.1:{port}");
    wait_for("optuna-dashboard to serve the study", std::time::Duration::from_secs(60), || {
        std::net::TcpStream::connect(&api).is_ok_and(|mut c| {
            use std::io::{Read, Write};
            let _ = write!(c, "GET /api/studies HTTP/1.0\r\n\r\n");
            let mut text = String::new();
            let _ = c.read_to_string(&mut text);
            text.contains("\"study_name\": \"dash\"") || text.contains("\"study_name\":\"dash\"")
        })
    });
    let url = format!("http://{api}/dashboard/studies/0");
    let timeout = std::time::Duration::from_secs(90);
    let dom = chromium::dump_dom_url_after(&url, 10_000, timeout);
    assert!(dom.success, "chromium failed:\n{}", dom.stderr);
    let html = &dom.stdout;
    let history = html.find(">History</h6>").expect("the history plot's title");
    let plot = &html[history..];
    let plot = &plot[..plot[1..].find("MuiTypography-h6").map_or(plot.len(), |e| e + 1)];
    assert!(plot.contains("js-plotly-plot"), "a Plotly chart under History");
    assert!(
        plot.matches("class=\"point\"").count() >= 5,
        "a point a trial: {}",
        plot.matches("class=\"point\"").count()
    );
    assert!(html.contains(&format!("Best Trial (number={best})")), "the best trial as tunefleet ranks it");
    let png = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-artifacts").join("optuna-dashboard.png");
    std::fs::create_dir_all(png.parent().expect("dir")).expect("artifacts");
    let _ = std::fs::remove_file(&png);
    let shot = chromium::screenshot_url_after(&url, &png, (1400, 1000), 10_000, timeout);
    assert!(shot.success, "chromium failed:\n{}", shot.stderr);
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 20_000, "{} bytes", bytes.len());
    eprintln!("optuna-dashboard screenshot: {} ({} bytes)", png.display(), bytes.len());
    dashboard.signal("TERM");
    dashboard.wait_exit(std::time::Duration::from_secs(30));
}
