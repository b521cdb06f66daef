//! A real Spark job tuned by Tunefleet. The test starts a Spark
//! standalone cluster of its own from PyPI's pyspark
//! ([`tunefleet_tests::spark`]: a master and a worker of 2 cores), then runs
//! examples/studies/spark-submit.toml as it is written: MLlib k-means
//! (examples/python/spark_kmeans.py) submitted by `spark-submit` from an
//! agent tagged `role=spark-edge`, executor cores and memory as system
//! parameters, partitions as a hyper-parameter, an epoch line per k-means
//! iteration. Then ASHA stops trailing Spark jobs at their first rung
//! (driver and executors with them). The same study in pipelined mode is
//! refused at check, with the reason (executor settings are read when
//! spark-submit starts).

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tunefleet_tests::spark::Spark;
use tunefleet_tests::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo").to_path_buf()
}

/// Runs `study` into `spark`'s dir with one agent of one slot (`tags`
/// added), started as a Spark client in the repository (the studies'
/// script path is relative to the agent's working directory), until the
/// coordinator ends; asserts it succeeded, the agent's spool is empty and
/// every driver and executor exited. The store and the coordinator's output.
fn run_study(spark: &Spark, study: &Path, test: &str, tags: &[&str]) -> (PathBuf, String) {
    let store = spark.dir().join(format!("{test}.db"));
    let root = unique_root(test);
    let (mut coord, url) = start_coordinator(study, &store, &root, &[]);
    let agent_name = format!("{root}-agent");
    let mut launcher = spark.command(bin("tunefleet-agent").to_str().expect("path"));
    launcher.current_dir(repo());
    let mut args = vec!["--slots", "1"];
    for t in tags {
        args.extend(["--tag", t]);
    }
    let agent = start_agent_with(launcher, &url, &agent_name, &root, &args);
    let status = coord.wait_exit(Duration::from_secs(600));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{status:?}\n{out}");
    drop(agent);
    assert_agents_spools_empty(&[&agent_name]);
    wait_for("every driver and executor of the study to exit", Duration::from_secs(30), || {
        spark.job_processes().is_empty()
    });
    (store, out)
}

#[test]
fn a_spark_kmeans_study_runs_on_a_standalone_cluster_as_the_example_is_written() {
    let started = Instant::now();
    let spark = Spark::start();
    eprintln!("spark cluster up in {:?}", started.elapsed());
    let study = repo().join("examples/studies/spark-submit.toml");
    let (store, out) = run_study(&spark, &study, "spark", &["role=spark-edge"]);
    assert!(out.contains("4/4 trials done, 0 failed"), "{out}");
    eprintln!("spark study done in {:?} from the start", started.elapsed());

    // Every trial: a wall time, and an epoch line per k-means iteration
    // whose cost never rises (Lloyd's iterations only lower it).
    let rows = query(
        &store,
        "SELECT r.trial, t.params, r.objective, r.measurement FROM results r JOIN trials t USING (study, trial) \
         WHERE r.study = 'spark-kmeans' AND r.success = 1 ORDER BY r.trial",
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, f64>(2)?, r.get::<_, String>(3)?)),
    );
    assert_eq!(rows.len(), 4, "{rows:?}");
    let mut memories = std::collections::BTreeSet::new();
    for (trial, params, objective, m) in &rows {
        let params: serde_json::Value = serde_json::from_str(params).expect("params");
        memories.insert(params["memory"].as_u64().expect("memory"));
        assert!(*objective > 0.0, "trial {trial}: wall time {objective}");
        let m: serde_json::Value = serde_json::from_str(m).expect("measurement");
        let costs: Vec<f64> =
            m["epochs"].as_array().expect("epochs").iter().filter_map(|e| e["metrics"]["cost"].as_f64()).collect();
        assert_eq!(costs.len(), 5, "trial {trial}: an epoch per iteration: {m}");
        assert!(costs.windows(2).all(|w| w[1] <= w[0] * (1.0 + 1e-9)), "trial {trial}: cost rose: {costs:?}");
    }
    // The executor settings reached Spark: the worker launched executors
    // with each memory the trials asked for.
    let log = spark.worker_log();
    for m in &memories {
        assert!(log.contains(&format!("-Xmx{m}M")), "no executor of {m} MiB in the worker's log:\n{log}");
    }
    let best = {
        let mut c = Command::new(bin("tunefleet"));
        c.args(["best", "spark-kmeans", "--store"]).arg(&store);
        run(c)
    };
    assert_eq!(best.0, Some(0), "{}", best.2);
    assert!(best.1.contains("cores=") && best.1.contains("memory="), "best shows the configuration: {}", best.1);

    // ASHA on the same cluster: k-means cost per iteration as the
    // objective, k searched from the largest down, so each trial trails
    // the ones before at its first rung and is stopped there (its driver
    // and executors with it); the first runs to the end.
    let asha = spark.dir().join("asha.toml");
    std::fs::write(
        &asha,
        r#"name = "spark-asha"
command = ["spark-submit", "--driver-memory", "512m", "examples/python/spark_kmeans.py",
           "--k", "{k}", "--points", "20000", "--iterations", "5", "--partitions", "2"]
timeout = 600
[objective]
metric = "cost"
direction = "minimize"
[budget]
trials = 4
[strategy]
kind = "grid"
[early_stopping]
kind = "asha"
reduction = 2
grace = 1
[hyper.k]
kind = "categorical"
values = [12, 6, 3, 2]
"#,
    )
    .expect("study");
    let (store, out) = run_study(&spark, &asha, "spark-asha", &[]);
    let rows =
        query(&store, "SELECT trial, state, reason FROM trials WHERE study = 'spark-asha' ORDER BY trial", |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<String>>(2)?))
        });
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert_eq!(rows[0].1, "done", "the first at a rung goes on: {rows:?}\n{out}");
    let stopped: Vec<_> = rows.iter().filter(|r| r.1 == "stopped").collect();
    assert!(stopped.len() >= 2, "trailing Spark jobs stopped early: {rows:?}\n{out}");
    assert!(stopped.iter().all(|r| r.2.as_deref().is_some_and(|w| w.contains("ASHA"))), "{rows:?}");
}

#[test]
fn a_pipelined_spark_study_is_refused_at_check_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(repo().join("examples/studies/spark-submit.toml")).expect("example");
    let pipelined = dir.path().join("pipelined.toml");
    std::fs::write(&pipelined, format!("{text}\n[pipeline]\nmode = \"pipelined\"\n")).expect("write");
    let (code, _, err) = run({
        let mut c = Command::new(bin("tunefleet"));
        c.arg("check").arg(&pipelined);
        c
    });
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("{cores} is read when the process starts"), "{err}");
    let (code, _, err) = run({
        let mut c = Command::new(bin("tunefleet"));
        c.arg("check").arg(repo().join("examples/studies/spark-submit.toml"));
        c
    });
    assert_eq!(code, Some(0), "the example as written checks: {err}");
}
