//! The SQLite store through its public API: exactly-once results, resume,
//! best ordering, exports that parse back, and a file store that survives a
//! reopen.

use std::collections::BTreeMap;
use std::path::Path;

use tunefleet_common::measurement::{
    AppliedLimits, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, MemoryLimit,
};
use tunefleet_common::message::{AgentInfo, Progress, TrialRef};
use tunefleet_common::params::ParamValue;
use tunefleet_coordinator::domain::search;
use tunefleet_coordinator::domain::study::{self, Study};
use tunefleet_coordinator::query::export::{export, ExportError, ExportFormat};
use tunefleet_coordinator::runtime::engine::{open_study, open_study_at};
use tunefleet_coordinator::store::{RecordOutcome, Store, StoreError, StudyOpened, StudyState, TrialState, Unranked};

fn study_text(name: &str, direction: &str, trials: u64) -> String {
    format!(
        r#"name = "{name}"
command = ["run", "--x", "{{x}}", "--mode", "{{mode}}"]
[objective]
metric = "loss"
direction = "{direction}"
[budget]
trials = {trials}
[strategy]
kind = "random"
seed = 11
[hyper.x]
kind = "float"
low = 0
high = 1
[hyper.mode]
kind = "categorical"
values = ["fast", "slow"]
"#
    )
}

fn study(name: &str, direction: &str, trials: u64) -> Study {
    study::parse(&study_text(name, direction, trials), "test.toml").expect("test study parses")
}

fn measurement(loss: f64, exit: ExitOutcome) -> Measurement {
    Measurement {
        started_unix_ms: 1_700_000_000_000,
        wall_us: 1_500_000,
        user_us: 1_000_000,
        sys_us: 100_000,
        max_rss_kib: 20_480,
        final_metrics: BTreeMap::from([("loss".to_string(), loss)]),
        energy: EnergyReading {
            joules: 12.5,
            interval_ms: 100,
            valid: true,
            ..EnergyReading::none(EnergySourceKind::Estimated, "model estimate")
        },
        limits: AppliedLimits { cpus: vec![0], threads: Some(1), memory: MemoryLimit::None },
        log_tail: "ok".into(),
        ..Measurement::unmeasured(exit, EnergyReading::none(EnergySourceKind::Estimated, ""))
    }
}

fn agent(name: &str) -> AgentInfo {
    AgentInfo {
        agent: name.into(),
        instance: 42,
        version: "0.1.0".into(),
        arch: "x86_64".into(),
        os: "linux".into(),
        kernel: "6.1".into(),
        cores: 2,
        memory_bytes: 4 << 30,
        slots: 2,
        lookahead: 0,
        energy: vec![],
        counters: vec!["task-clock".into()],
        tags: BTreeMap::from([("pool".to_string(), "demo".to_string())]),
        gpus: vec![],
    }
}

fn tref(study: &str, trial: u64, attempt: u32) -> TrialRef {
    TrialRef { study: study.into(), study_id: 7, trial, attempt }
}

/// A store holding `study` with its plan.
fn store_with(s: &Study) -> Store {
    let mut store = Store::open_in_memory().expect("opens");
    let mut b = store.batch().expect("batch");
    assert_eq!(open_study_at(&mut b, s, &search::plan(s), 1000).expect("creates"), StudyOpened::Created);
    b.commit().expect("commits");
    store
}

/// Assigns and completes one attempt with `loss` in its own batch.
fn run(store: &mut Store, r: &TrialRef, loss: f64, exit: ExitOutcome) -> RecordOutcome {
    let mut b = store.batch().expect("batch");
    b.record_assignment(r, "a1", 2000).expect("assigns");
    let out = b.record_result(r, "a1", &measurement(loss, exit), Some(loss), 3000).expect("records");
    b.commit().expect("commits");
    out
}

fn raw_count(path: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).expect("sqlite opens");
    conn.query_row(sql, [], |r| r.get(0)).expect("counts")
}

#[test]
fn duplicate_result_is_stored_once() {
    let s = study("dup", "minimize", 4);
    let mut store = store_with(&s);
    let r = tref("dup", 0, 1);
    assert_eq!(run(&mut store, &r, 0.5, ExitOutcome::Exited(0)), RecordOutcome::Stored);
    let mut b = store.batch().expect("batch");
    let again = b.record_result(&r, "a1", &measurement(0.4, ExitOutcome::Exited(0)), Some(0.4), 3500).expect("ok");
    assert_eq!(again, RecordOutcome::Duplicate);
    b.commit().expect("commits");

    let results = store.results("dup").expect("results");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].result.as_ref().and_then(|o| o.objective), Some(0.5), "the first result stays");
    let trials = store.trials("dup").expect("trials");
    assert_eq!(trials[0].state, TrialState::Done);
    assert_eq!(trials[0].attempts, 1);
}

#[test]
fn late_result_of_a_requeued_attempt_completes_the_trial_once() {
    let s = study("late", "minimize", 4);
    let mut store = store_with(&s);
    let first = tref("late", 2, 1);
    let second = tref("late", 2, 2);

    let mut b = store.batch().expect("batch");
    b.record_assignment(&first, "a1", 10).expect("assigns");
    assert!(b.requeue_at(&first, "agent went offline", 20).expect("requeues"));
    b.record_assignment(&second, "a2", 30).expect("assigns again");
    assert!(!b.requeue_at(&first, "stale requeue", 31).expect("ok"), "a stale requeue changes nothing");
    assert_eq!(
        b.record_result(&first, "mallory", &measurement(0.0, ExitOutcome::Exited(0)), Some(0.0), 35).expect("ok"),
        RecordOutcome::Superseded,
        "an attempt this agent never held completes nothing"
    );
    assert_eq!(
        b.record_result(&first, "a1", &measurement(0.9, ExitOutcome::Exited(0)), Some(0.9), 40).expect("ok"),
        RecordOutcome::Stored,
        "the presumed-dead agent's result is still a good result"
    );
    assert_eq!(
        b.record_result(&second, "a2", &measurement(0.1, ExitOutcome::Exited(0)), Some(0.1), 50).expect("ok"),
        RecordOutcome::Superseded,
        "another attempt already delivered"
    );
    assert_eq!(
        b.record_result(&first, "a1", &measurement(0.9, ExitOutcome::Exited(0)), Some(0.9), 60).expect("ok"),
        RecordOutcome::Duplicate
    );
    b.commit().expect("commits");

    let results = store.results("late").expect("results");
    assert_eq!(results.len(), 1);
    let o = results[0].result.as_ref().expect("a result");
    assert_eq!((o.attempt, o.agent.as_str(), o.objective), (1, "a1", Some(0.9)));
    let attempts = store.attempts("late", 2).expect("attempts");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert!(!attempts[0].superseded && attempts[1].superseded, "{attempts:?}");
    assert_eq!(attempts[0].outcome.as_deref(), Some("exited 0"));
    let row = &store.trials("late").expect("trials")[2];
    assert_eq!((row.state, row.attempts), (TrialState::Done, 2));
    assert_eq!((row.agent.as_deref(), row.objective()), (Some("a1"), Some(0.9)));
}

/// The late good result of a trial failed for want of results
/// (its agent presumed dead until its attempts ran out) was kept as superseded.
#[test]
fn regression_late_result_completes_a_trial_failed_without_a_result_once() {
    let s = study("gaveup", "minimize", 2);
    let mut store = store_with(&s);
    let first = tref("gaveup", 0, 1);
    let mut b = store.batch().expect("batch");
    b.record_assignment(&first, "a1", 10).expect("assigns");
    assert!(b.fail_trial_at("gaveup", 0, "1 attempts failed, last: agent went offline", 20).expect("fails"));
    assert_eq!(
        b.record_result(&first, "a2", &measurement(0.3, ExitOutcome::Exited(0)), Some(0.3), 30).expect("ok"),
        RecordOutcome::Superseded,
        "only the agent that held the attempt"
    );
    assert_eq!(
        b.record_result(&first, "a1", &measurement(0.3, ExitOutcome::Exited(0)), Some(0.3), 40).expect("ok"),
        RecordOutcome::Stored
    );
    assert_eq!(
        b.record_result(&first, "a1", &measurement(0.2, ExitOutcome::Exited(0)), Some(0.2), 50).expect("ok"),
        RecordOutcome::Duplicate
    );
    // A trial failed by its own result keeps it: a later attempt's result is superseded.
    let r = tref("gaveup", 1, 1);
    b.record_assignment(&r, "a1", 10).expect("assigns");
    b.record_result(&r, "a1", &measurement(0.1, ExitOutcome::Exited(2)), None, 20).expect("records");
    assert_eq!(
        b.record_result(&tref("gaveup", 1, 2), "a1", &measurement(0.1, ExitOutcome::Exited(0)), Some(0.1), 30)
            .expect("ok"),
        RecordOutcome::Superseded
    );
    b.commit().expect("commits");

    let trials = store.trials("gaveup").expect("trials");
    assert_eq!(
        (trials[0].state, trials[0].reason.as_deref(), trials[0].objective()),
        (TrialState::Done, None, Some(0.3))
    );
    assert_eq!((trials[1].state, trials[1].reason.as_deref()), (TrialState::Failed, Some("exit 2, `ok`")));
    let results = store.results("gaveup").expect("results");
    assert_eq!(results.len(), 2, "one result per trial");
    let o = results[0].result.as_ref().expect("a result");
    assert_eq!((o.attempt, o.agent.as_str()), (1, "a1"));
    assert_eq!(store.attempts("gaveup", 0).expect("attempts")[0].outcome.as_deref(), Some("exited 0"));
}

#[test]
fn end_attempt_closes_an_attempt_and_counts_as_a_failure() {
    let s = study("ended", "minimize", 2);
    let mut store = store_with(&s);
    let r = tref("ended", 0, 1);
    let mut b = store.batch().expect("batch");
    b.record_assignment(&r, "a1", 10).expect("assigns");
    assert!(b.end_attempt(&r, "a1", "could not start: no such file", 11).expect("ends"));
    assert!(b.end_attempt(&r, "a1", "later outcome", 12).expect("ends"), "known attempt");
    assert!(!b.end_attempt(&tref("ended", 0, 7), "a1", "never assigned", 12).expect("ok"));
    assert!(b.requeue_at(&r, "retry", 13).expect("requeues"));
    b.commit().expect("commits");
    let attempts = store.attempts("ended", 0).expect("attempts");
    assert_eq!(attempts[0].outcome.as_deref(), Some("could not start: no such file"), "first outcome kept");
    assert_eq!(attempts[0].ended_ms, Some(11));
    let row = &store.trials("ended").expect("trials")[0];
    assert_eq!(
        (row.state, row.failures, row.agent.as_deref(), row.objective()),
        (TrialState::Pending, 1, Some("a1"), None)
    );
}

#[test]
fn failed_runs_fail_the_trial_and_requeue_and_fail_trial_work() {
    let s = study("fails", "minimize", 4);
    let mut store = store_with(&s);
    assert_eq!(run(&mut store, &tref("fails", 0, 1), 0.2, ExitOutcome::Exited(3)), RecordOutcome::Stored);

    let mut b = store.batch().expect("batch");
    b.record_assignment(&tref("fails", 1, 1), "a1", 10).expect("assigns");
    assert!(b.requeue_at(&tref("fails", 1, 1), "timed out on the coordinator", 20).expect("requeues"));
    assert!(b.fail_trial_at("fails", 1, "attempts exhausted", 30).expect("fails"));
    assert!(!b.fail_trial_at("fails", 1, "again", 31).expect("no-op"), "already failed");
    let e = b.record_assignment(&tref("fails", 1, 2), "a1", 40).expect_err("failed trials are closed");
    assert!(matches!(e, StoreError::TrialClosed { state: TrialState::Failed, .. }), "{e}");
    let e = b.record_assignment(&tref("fails", 99, 1), "a1", 40).expect_err("unknown trial");
    assert!(matches!(e, StoreError::UnknownTrial { trial: 99, .. }), "{e}");
    b.commit().expect("commits");

    let trials = store.trials("fails").expect("trials");
    assert_eq!(trials[0].state, TrialState::Failed);
    assert_eq!(trials[0].reason.as_deref(), Some("exit 3, `ok`"));
    assert_eq!(trials[1].state, TrialState::Failed);
    assert_eq!(trials[1].reason.as_deref(), Some("attempts exhausted"));
    let counts = store.trial_counts("fails").expect("counts");
    assert_eq!((counts.pending, counts.failed, counts.total()), (2, 2, 4));
    assert!(store.best("fails", 5).expect("best").is_empty(), "failed runs are never the best");
}

#[test]
fn create_study_resumes_the_same_config_and_refuses_another() {
    let s = study("res", "minimize", 6);
    let mut store = store_with(&s);
    assert_eq!(run(&mut store, &tref("res", 0, 1), 0.5, ExitOutcome::Exited(0)), RecordOutcome::Stored);
    let mut b = store.batch().expect("batch");
    b.record_assignment(&tref("res", 1, 1), "a1", 10).expect("assigns");
    b.commit().expect("commits");

    // Same text: resumed, rows kept.
    let mut b = store.batch().expect("batch");
    assert_eq!(open_study(&mut b, &s, &search::plan(&s)).expect("resumes"), StudyOpened::Resumed);
    // Same study with a comment added: still the same configuration.
    let commented = study::parse(&format!("# resumed\n{}", s.source), "other.toml").expect("parses");
    assert_eq!(open_study(&mut b, &commented, &search::plan(&commented)).expect("resumes"), StudyOpened::Resumed);
    // A smaller budget, or another direction: refused, naming the study and the keys.
    let smaller = study("res", "minimize", 4);
    let e = open_study(&mut b, &smaller, &search::plan(&smaller)).expect_err("refused");
    let smaller_keys = "budget.trials: 6 -> 4";
    assert!(matches!(&e, StoreError::ConfigMismatch { study, keys } if study == "res" && keys == smaller_keys), "{e}");
    assert!(e.to_string().contains("\"res\"") && e.to_string().contains("(budget.trials: 6 -> 4)"), "{e}");
    assert!(e.to_string().contains("tunefleet studies rename res res-1"), "says the way out: {e}");
    let other = study("res", "maximize", 6);
    let e = open_study(&mut b, &other, &search::plan(&other)).expect_err("refused");
    assert!(
        matches!(&e, StoreError::ConfigMismatch { keys, .. } if keys == "objective.direction: \"minimize\" -> \"maximize\""),
        "{e}"
    );
    // A larger budget alone: the study continues, the store keeps the new
    // file and records the change; the old file is then a smaller budget.
    let larger = study("res", "minimize", 8);
    assert_eq!(open_study_at(&mut b, &larger, &[], 2000).expect("continues"), StudyOpened::Resumed);
    let e = open_study(&mut b, &s, &search::plan(&s)).expect_err("now smaller");
    assert!(matches!(&e, StoreError::ConfigMismatch { keys, .. } if keys == "budget.trials: 8 -> 6"), "{e}");
    assert_eq!(b.reset_running("res", "coordinator restarted", 5000).expect("resets"), 1);
    b.commit().expect("commits");

    let row = store.study("res").expect("reads").expect("exists");
    assert_eq!((row.total, row.done, row.pending, row.running, row.failed), (6, 1, 5, 0, 0));
    let trials = store.trials("res").expect("trials");
    assert_eq!(trials.len(), 6);
    assert_eq!(trials[0].state, TrialState::Done);
    assert_eq!(store.study("res").expect("reads").expect("exists").created_ms, 1000);
    let pending = store.pending_trials("res").expect("pending");
    assert_eq!(pending.iter().map(|t| t.plan.trial).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
    assert_eq!(pending[0].attempts, 1, "the next attempt of trial 1 is 2");
    assert_eq!(pending[0].plan, search::plan(&s)[1], "resume renders the same trial");
    let attempts = store.attempts("res", 1).expect("attempts");
    assert_eq!(attempts[0].outcome.as_deref(), Some("coordinator restarted"));
    let row = store.study("res").expect("reads").expect("exists");
    assert_eq!(row.config, larger.source, "the store keeps the file that raised the budget");
    let changes = store.study_changes("res").expect("reads");
    assert_eq!(changes, vec![(2000, "budget.trials: 6 -> 8".to_string())], "the change is recorded");
}

#[test]
fn best_follows_the_direction_and_breaks_ties_by_trial() {
    for (direction, want) in [("minimize", vec![3, 1, 4]), ("maximize", vec![0, 2, 1])] {
        let name = format!("best-{direction}");
        let s = study(&name, direction, 6);
        let mut store = store_with(&s);
        // trial -> loss; trials 1 and 4 tie; trial 5 failed with the best loss of all.
        for (trial, loss) in [(0, 0.9), (1, 0.5), (2, 0.7), (3, 0.1), (4, 0.5)] {
            run(&mut store, &tref(&name, trial, 1), loss, ExitOutcome::Exited(0));
        }
        run(&mut store, &tref(&name, 5, 1), if direction == "minimize" { 0.0 } else { 9.0 }, ExitOutcome::Exited(1));
        let best: Vec<u64> = store.best(&name, 3).expect("best").iter().map(|r| r.plan.trial).collect();
        assert_eq!(best, want, "{direction}");
        assert_eq!(store.best(&name, 100).expect("best").len(), 5);
    }
    let store = Store::open_in_memory().expect("opens");
    assert!(matches!(store.best("nope", 1), Err(StoreError::UnknownStudy(_))));
}

#[test]
fn results_without_an_objective_are_not_ranked() {
    let s = study("noobj", "minimize", 2);
    let mut store = store_with(&s);
    let mut b = store.batch().expect("batch");
    let r = tref("noobj", 0, 1);
    b.record_assignment(&r, "a1", 1).expect("assigns");
    b.record_result(&r, "a1", &measurement(0.1, ExitOutcome::Exited(0)), None, 2).expect("records");
    b.commit().expect("commits");
    assert_eq!(store.results("noobj").expect("results")[0].result.as_ref().map(|o| o.objective), Some(None));
    assert!(store.best("noobj", 1).expect("best").is_empty());
}

/// `best` of an `energy` study ranked trials whose energy reading
/// was invalid (a battery charging, a zone that vanished).
#[test]
fn regression_best_energy_ranks_only_valid_readings_and_counts_the_rest() {
    let text = study_text("energy", "minimize", 6).replace("metric = \"loss\"", "metric = \"energy\"");
    let s = study::parse(&text, "energy.toml").expect("parses");
    let mut store = store_with(&s);
    let mut b = store.batch().expect("batch");
    // trial -> (joules, valid); the invalid readings are the lowest of all.
    for (trial, joules, valid) in [(0, 30.0, true), (1, 1.0, false), (2, 20.0, true), (3, 2.0, false), (4, 25.0, true)]
    {
        let r = tref("energy", trial, 1);
        let mut m = measurement(0.5, ExitOutcome::Exited(0));
        m.energy.joules = joules;
        m.energy.valid = valid;
        b.record_assignment(&r, "a1", 10).expect("assigns");
        b.record_result(&r, "a1", &m, m.objective_value("energy"), 20).expect("records");
    }
    // A store written before invalid readings lost their objective holds the joules anyway.
    let r = tref("energy", 5, 1);
    let mut m = measurement(0.5, ExitOutcome::Exited(0));
    (m.energy.joules, m.energy.valid) = (0.5, false);
    b.record_assignment(&r, "a1", 10).expect("assigns");
    b.record_result(&r, "a1", &m, Some(0.5), 20).expect("records");
    b.commit().expect("commits");

    let best: Vec<(u64, f64)> =
        store.best("energy", 10).expect("best").iter().map(|r| (r.plan.trial, r.objective())).collect();
    assert_eq!(best, vec![(2, 20.0), (4, 25.0), (0, 30.0)]);
    assert_eq!(store.unranked("energy").expect("counts"), Unranked { invalid_energy: 3, no_value: 0 });
    // Another objective does not care about the energy reading.
    let s = study("loss", "minimize", 2);
    let mut store = store_with(&s);
    let mut m = measurement(0.5, ExitOutcome::Exited(0));
    m.energy.valid = false;
    let mut b = store.batch().expect("batch");
    for trial in 0..2 {
        let r = tref("loss", trial, 1);
        b.record_assignment(&r, "a1", 10).expect("assigns");
        let objective = if trial == 0 { m.objective_value("loss") } else { None };
        b.record_result(&r, "a1", &m, objective, 20).expect("records");
    }
    b.commit().expect("commits");
    assert_eq!(store.best("loss", 10).expect("best").len(), 1);
    assert_eq!(store.unranked("loss").expect("counts"), Unranked { invalid_energy: 0, no_value: 1 });
}

#[test]
fn exports_parse_back() {
    let s = study("exp", "minimize", 3);
    let mut store = store_with(&s);
    run(&mut store, &tref("exp", 1, 1), 0.25, ExitOutcome::Exited(0));
    let plan = search::plan(&s);

    let mut csv_out = Vec::new();
    export(&store, "exp", ExportFormat::Csv, &mut csv_out).expect("exports csv");
    let mut reader = csv::Reader::from_reader(csv_out.as_slice());
    let header: Vec<String> = reader.headers().expect("header").iter().map(String::from).collect();
    assert_eq!(&header[..5], ["trial", "repeat", "state", "mode", "x"]);
    for col in ["objective", "wall_us", "energy_j", "energy_source", "agent", "attempts"] {
        assert!(header.iter().any(|h| h == col), "{col} missing from {header:?}");
    }
    let col = |name: &str| header.iter().position(|h| h == name).expect("column");
    let rows: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>().expect("rows parse");
    assert_eq!(rows.len(), 3);
    assert_eq!(&rows[1][col("state")], "done");
    assert_eq!(rows[1][col("objective")].parse::<f64>().expect("number"), 0.25);
    assert_eq!(&rows[1][col("energy_source")], "estimated");
    assert_eq!(&rows[1][col("agent")], "a1");
    assert_eq!(&rows[0][col("state")], "pending");
    assert_eq!(&rows[0][col("objective")], "");
    assert_eq!(rows[2][col("x")].parse::<f64>().expect("x"), plan[2].params["x"].as_f64().expect("float"));
    assert_eq!(&rows[2][col("mode")], plan[2].params["mode"].to_string());

    let mut json_out = Vec::new();
    export(&store, "exp", ExportFormat::Json, &mut json_out).expect("exports json");
    let v: serde_json::Value = serde_json::from_slice(&json_out).expect("json parses");
    let arr = v.as_array().expect("an array");
    assert_eq!(arr.len(), 3);
    assert_eq!(arr[1]["objective"], 0.25);
    assert_eq!(arr[1]["params"]["mode"], plan[1].params["mode"].to_string());
    let m: Measurement = serde_json::from_value(arr[1]["measurement"].clone()).expect("full measurement");
    assert_eq!(m, measurement(0.25, ExitOutcome::Exited(0)));
    assert!(arr[0]["measurement"].is_null());

    assert!(matches!(
        export(&store, "nope", ExportFormat::Csv, &mut Vec::new()),
        Err(ExportError::Store(StoreError::UnknownStudy(_)))
    ));
}

#[test]
fn dropping_a_batch_rolls_it_back() {
    let s = study("rb", "minimize", 2);
    let mut store = store_with(&s);
    {
        let mut b = store.batch().expect("batch");
        b.record_assignment(&tref("rb", 0, 1), "a1", 1).expect("assigns");
    }
    assert_eq!(store.trials("rb").expect("trials")[0].state, TrialState::Pending);
}

#[test]
fn a_file_store_keeps_everything_across_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tunefleet.db");
    let s = study("file", "maximize", 4);
    {
        let mut store = Store::open(&path).expect("creates");
        let mut b = store.batch().expect("batch");
        open_study_at(&mut b, &s, &search::plan(&s), 100).expect("creates study");
        b.upsert_agent(&agent("a1"), 100).expect("agent");
        b.upsert_agent(&agent("a2"), 150).expect("agent");
        assert!(b.set_agent_online("a2", false, 160).expect("known"));
        assert!(!b.set_agent_online("ghost", false, 160).expect("unknown agent"));
        b.commit().expect("commits");
        run(&mut store, &tref("file", 0, 1), 0.8, ExitOutcome::Exited(0));
        let mut b = store.batch().expect("batch");
        for epoch in 0..3 {
            let p = Progress {
                trial: tref("file", 1, 1),
                epoch,
                elapsed_us: u64::from(epoch) * 1000,
                metrics: BTreeMap::from([("loss".to_string(), 1.0 / f64::from(epoch + 1))]),
                checkpoint: (epoch == 2).then(|| "/ckpt/2".to_string()),
                profile: None,
            };
            b.record_progress(&p).expect("progress");
            b.record_progress(&p).expect("a repeated report is ignored");
        }
        b.finish_study("file", 900).expect("finishes");
        b.commit().expect("commits");
    }

    let store = Store::open(&path).expect("reopens");
    let row = store.study("file").expect("reads").expect("study kept");
    assert_eq!((row.state, row.finished_ms, row.created_ms), (StudyState::Finished, Some(900), 100));
    assert_eq!(row.config, s.source);
    assert_eq!(store.studies().expect("studies").len(), 1);
    assert_eq!(store.trials("file").expect("trials").len(), 4);
    let results = store.results("file").expect("results");
    let stored = results[0].result.as_ref().and_then(|o| o.measurement()).map(|m| m.expect("readable"));
    assert_eq!(stored, Some(measurement(0.8, ExitOutcome::Exited(0))));
    let agents = store.agents().expect("agents");
    assert_eq!(agents.iter().map(|a| (a.name.as_str(), a.online)).collect::<Vec<_>>(), [("a1", true), ("a2", false)]);
    assert_eq!(agents[0].info, agent("a1"));
    assert_eq!(agents[1].last_seen_ms, 160);
    let progress = store.progress(&tref("file", 1, 1)).expect("progress");
    let kept: Vec<(u64, u32, Option<String>)> = store
        .study_progress("file")
        .expect("study progress")
        .into_iter()
        .map(|p| (p.trial, p.epoch, p.checkpoint))
        .collect();
    assert_eq!(kept, vec![(1, 0, None), (1, 1, None), (1, 2, Some("/ckpt/2".into()))], "checkpoints survive a restart");
    assert_eq!(progress.len(), 3);
    assert_eq!(progress[2].0, 2);
    assert_eq!(progress[2].2["loss"], 1.0 / 3.0);
    drop(store);

    // Readable with plain SQL, and read-only opens work for CLI queries.
    assert_eq!(raw_count(&path, "SELECT COUNT(*) FROM results WHERE study = 'file'"), 1);
    assert_eq!(raw_count(&path, "SELECT COUNT(*) FROM trials WHERE state = 'pending'"), 3);
    let ro = Store::open_read_only(&path).expect("read-only open");
    assert_eq!(ro.best("file", 1).expect("best")[0].plan.trial, 0);
    assert_eq!(
        ro.best("file", 1).expect("best")[0].plan.params.get("mode").map(ParamValue::to_string),
        search::plan(&s)[0].params.get("mode").map(ParamValue::to_string)
    );
}

#[test]
fn batches_record_thousands_of_events() {
    let s = study("perf", "minimize", 5000);
    let mut store = store_with(&s);
    let m = measurement(0.5, ExitOutcome::Exited(0));
    for chunk in (0..5000u64).collect::<Vec<_>>().chunks(250) {
        let mut b = store.batch().expect("batch");
        for &trial in chunk {
            let r = tref("perf", trial, 1);
            b.record_assignment(&r, "a1", trial).expect("assigns");
            b.record_result(&r, "a1", &m, Some(trial as f64), trial + 1).expect("records");
        }
        b.commit().expect("commits");
    }
    // Speed is measured by the benchmark (BENCHMARKS.md), not here.
    assert_eq!(store.trial_counts("perf").expect("counts").done, 5000);
}

#[test]
fn csv_columns_of_parameters_never_collide_with_fixed_ones() {
    let text = study_text("clash", "minimize", 2).replace("[hyper.mode]", "[hyper.state]").replace("{mode}", "{state}");
    let s = study::parse(&text, "clash.toml").expect("parses");
    let store = store_with(&s);
    let mut out = Vec::new();
    export(&store, "clash", ExportFormat::Csv, &mut out).expect("exports");
    let mut reader = csv::Reader::from_reader(out.as_slice());
    let header: Vec<String> = reader.headers().expect("header").iter().map(String::from).collect();
    assert_eq!(&header[..5], ["trial", "repeat", "state", "param_state", "x"]);
    let rows: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>().expect("rows parse");
    assert_eq!(&rows[0][2], "pending");
    assert!(["fast", "slow"].contains(&&rows[0][3]), "{:?}", rows[0]);
}

/// The page's learning curves: the metric epoch by epoch of the
/// last trials that reported epochs, each trial's latest attempt only, and
/// epochs without the metric left out.
#[test]
fn learning_curves_are_the_last_trials_latest_attempts() {
    let s = study("curves", "minimize", 4);
    let mut store = store_with(&s);
    let mut b = store.batch().expect("batch");
    let report = |b: &mut tunefleet_coordinator::store::Batch<'_>,
                  trial: u64,
                  attempt: u32,
                  epoch: u32,
                  metric: &str,
                  v: f64| {
        let p = Progress {
            trial: tref("curves", trial, attempt),
            epoch,
            elapsed_us: u64::from(epoch),
            metrics: BTreeMap::from([(metric.to_string(), v)]),
            checkpoint: None,
            profile: None,
        };
        b.record_progress(&p).expect("progress");
    };
    report(&mut b, 0, 1, 1, "loss", 3.0);
    report(&mut b, 1, 1, 1, "loss", 9.0);
    report(&mut b, 1, 2, 1, "loss", 2.0);
    report(&mut b, 1, 2, 2, "loss", 1.0);
    report(&mut b, 1, 2, 3, "accuracy", 0.9);
    report(&mut b, 3, 1, 1, "loss", 5.0);
    b.commit().expect("commits");
    let all = store.learning_curves("curves", "loss", 10).expect("curves");
    assert_eq!(all, vec![(0, vec![(1.0, 3.0)]), (1, vec![(1.0, 2.0), (2.0, 1.0)]), (3, vec![(1.0, 5.0)])]);
    let last = store.learning_curves("curves", "loss", 2).expect("curves");
    assert_eq!(last.iter().map(|c| c.0).collect::<Vec<_>>(), [3], "trials after 3 - 2 only");
}
