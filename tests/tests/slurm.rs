//! The coordinator launches its agents as Slurm jobs, on a
//! one-node cluster the test starts itself ([`tunefleet_tests::slurm`]),
//! with the Slurm launcher line of docs/DEPLOY.md as it is written there.
//! Agents start as jobs, join with the coordinator's token, run the study
//! and exit; a job cancelled mid-trial has its trial run again, once; a
//! queue that does not move is reported and not answered with more jobs.
//! Root only (slurmd runs the jobs as their user): skipped otherwise.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension};
use tunefleet_tests::slurm::{is_root, Slurm};
use tunefleet_tests::*;

/// The `--launcher` value of the Slurm example in docs/DEPLOY.md.
fn documented_launcher() -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo").to_path_buf();
    let text = std::fs::read_to_string(repo.join("docs/DEPLOY.md")).expect("docs/DEPLOY.md");
    let from = text.find("\n# Slurm").expect("a `# Slurm` example in docs/DEPLOY.md");
    let rest = &text[from..];
    let at = rest.find("--launcher '").expect("the Slurm example has a --launcher") + "--launcher '".len();
    let line = &rest[at..at + rest[at..].find('\'').expect("the launcher's closing quote")];
    assert!(line.starts_with("sbatch "), "the Slurm launcher submits with sbatch: {line}");
    line.to_string()
}

/// `tunefleet run STUDY` launching agents with `launcher` on `slurm`,
/// its log (stderr) in `log`; returns it and its broker URL.
fn start_coordinator_on(slurm: &Slurm, study: &Path, store: &Path, launcher: &str, extra: &[&str]) -> (Proc, PathBuf) {
    let log =
        slurm.dir().join(format!("coordinator-{}.log", store.file_stem().and_then(|s| s.to_str()).unwrap_or("x")));
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.arg("run").arg(study).arg("--store").arg(store);
    cmd.args(["--listen", "127.0.0.1:0", "--quiet", "--launcher", launcher]).args(extra);
    // sbatch passes this environment on to the jobs: the agents find their
    // binary on PATH, keep their spools under the tests' state home, and
    // their `slurm-JOBID.out` lands in the cluster's dir.
    cmd.env("XDG_STATE_HOME", state_home())
        .env("PATH", path_with_bins())
        .env("SLURM_CONF", &slurm.conf)
        .env("TUNEFLEET_LOG", "warn,tunefleet_coordinator=info,rumqttd=off")
        .current_dir(slurm.dir());
    cmd.stderr(std::fs::File::create(&log).expect("log"));
    let mut p = Proc::spawn("coordinator", cmd);
    p.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    (p, log)
}

fn db(store: &Path) -> Connection {
    Connection::open(store).expect("store")
}

/// (trial, agent, attempt) of successful results.
fn results(store: &Path, study: &str) -> Vec<(i64, String, i64)> {
    db(store)
        .prepare("SELECT trial, agent, attempt FROM results WHERE study = ?1 AND success = 1 ORDER BY trial")
        .expect("prepare")
        .query_map([study], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

/// The attempts table, for a failure message.
fn attempts(store: &Path) -> String {
    db(store)
        .prepare("SELECT trial, attempt, agent, outcome FROM attempts ORDER BY trial, attempt")
        .expect("prepare")
        .query_map([], |r| {
            Ok(format!(
                "{} {} {} {:?}",
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?
            ))
        })
        .expect("query")
        .collect::<Result<Vec<_>, _>>()
        .expect("rows")
        .join("\n")
}

/// Waits for the cluster to have no job left and no process of a job.
fn assert_cluster_drains(slurm: &Slurm, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !(slurm.squeue().is_empty() && slurm.job_processes().is_empty()) {
        assert!(
            Instant::now() < deadline,
            "jobs left after {timeout:?}: {:?}, processes {:?}",
            slurm.squeue(),
            slurm
                .job_processes()
                .iter()
                .map(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default().replace('\0', " "))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One test's cluster, study and coordinator.
struct Run {
    started: Instant,
    // Fields drop in order: the coordinator before the cluster it uses.
    coord: Proc,
    log: PathBuf,
    store: PathBuf,
    slurm: Slurm,
    _dir: tempfile::TempDir,
}

/// Starts a cluster (`prepare` runs on it first), a study of `trials`
/// trials of `secs` each, and a coordinator launching agents with the
/// documented line and `extra` flags; `None` (skipped) unless root.
fn start(test: &str, trials: u32, secs: f64, prepare: impl FnOnce(&Slurm), extra: &[&str]) -> Option<Run> {
    if !is_root() {
        eprintln!("SKIPPED {test}: the Slurm tests run slurmctld and slurmd as root (CI runs as root)");
        return None;
    }
    let started = Instant::now();
    let slurm = Slurm::start();
    eprintln!("{test}: slurm cluster up in {:?}", started.elapsed());
    prepare(&slurm);
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study(dir.path(), test, trials, secs);
    let store = dir.path().join(format!("{test}.db"));
    let (coord, log) = start_coordinator_on(&slurm, &study, &store, &documented_launcher(), extra);
    Some(Run { started, coord, log, store, slurm, _dir: dir })
}

/// Waits for the coordinator to finish the study; returns its stdout.
fn finished(run: &mut Run, trials: u32) -> String {
    let status = run.coord.wait_exit(Duration::from_secs(180));
    let out = run.coord.rest_of_stdout().join("\n");
    let logged = std::fs::read_to_string(&run.log).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{out}\n{logged}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}\nattempts:\n{}", attempts(&run.store));
    logged
}

#[test]
fn agents_launched_as_slurm_jobs_run_the_study_and_leave_the_queue_empty() {
    let Some(mut run) = start("slurm", 6, 1.0, |_| {}, &["--launch-max", "2"]) else { return };
    // Watch the queue while the study runs: the agents are Slurm jobs named
    // by the launcher, at most --launch-max of them at once.
    let mut jobs = BTreeSet::new();
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(180);
    while run.coord.child.try_wait().expect("try_wait").is_none() {
        assert!(Instant::now() < deadline, "the study did not finish in 180 s\n{}", run.slurm.logs());
        let queue = run.slurm.squeue();
        let live = queue.iter().filter(|l| l.contains(" RUNNING ") || l.contains(" PENDING ")).count();
        most = most.max(live);
        jobs.extend(queue.iter().filter_map(|l| Some(l.split_whitespace().nth(1)?.to_string())));
        std::thread::sleep(Duration::from_millis(200));
    }
    let logged = finished(&mut run, 6);
    eprintln!("study done {:?} after the start", run.started.elapsed());
    assert!((1..=2).contains(&most), "at most --launch-max jobs at once (saw {most})");
    assert!(logged.contains("submitted"), "the launcher read the job ids sbatch printed:\n{logged}");

    let rows = results(&run.store, "slurm");
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), (0..6).collect::<Vec<_>>(), "each trial once");
    let agents: BTreeSet<String> = rows.into_iter().map(|r| r.1).collect();
    assert!(!agents.is_empty() && agents.len() <= 2, "{agents:?}");
    assert!(agents.iter().all(|a| jobs.contains(a)), "every agent ran as a Slurm job: {agents:?} of jobs {jobs:?}");

    // The agents leave when idle (--exit-when-idle=30s in the documented line), ending their jobs.
    assert_cluster_drains(&run.slurm, Duration::from_secs(90));
    assert_agents_spools_empty(&agents.iter().map(String::as_str).collect::<Vec<_>>());
    eprintln!("queue empty {:?} after the start", run.started.elapsed());
}

/// The agent, trial and start (unix ms) of the attempt that started last
/// among those running now, if any.
fn running(store: &Path) -> Option<(String, i64, i64)> {
    let c = Connection::open(store).ok()?;
    c.query_row(
        "SELECT a.agent, a.trial, a.assigned_ms FROM attempts a
         JOIN trials t ON t.study = a.study AND t.trial = a.trial
         WHERE a.ended_ms IS NULL AND t.state = 'running' ORDER BY a.assigned_ms DESC LIMIT 1",
        [],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .optional()
    .ok()
    .flatten()
}

fn unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[test]
fn a_job_cancelled_mid_trial_has_its_trial_run_again_exactly_once() {
    let Some(mut run) = start("cancel", 4, 3.0, |_| {}, &["--launch-max", "1"]) else { return };
    // A trial of 3 s that started less than a second ago: cancelled mid-trial.
    let mut victim = None;
    wait_for("a launched agent to start a trial", Duration::from_secs(90), || {
        victim = running(&run.store).filter(|(_, _, at)| unix_ms() - at < 1_000);
        victim.is_some()
    });
    let (agent, trial, _) = victim.expect("running");
    let queue = run.slurm.squeue();
    let job = queue
        .iter()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(1) == Some(&agent.as_str())).then(|| w[0].to_string())
        })
        .unwrap_or_else(|| panic!("no job named {agent}: {queue:?}"));
    let mut scancel = run.slurm.command("scancel");
    scancel.arg(&job);
    let (code, _, err) = tunefleet_tests::run(scancel);
    assert_eq!(code, Some(0), "scancel {job}: {err}");

    let logged = finished(&mut run, 4);
    let rows = results(&run.store, "cancel");
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), (0..4).collect::<Vec<_>>(), "each trial once");
    let all = attempts(&run.store);
    eprintln!("attempts (trial, attempt, agent, outcome):\n{all}");
    // Every attempt the cancelled job's agent did not finish was run again
    // by another job's agent, and the trial it was cancelled in is one.
    let interrupted: Vec<(i64, i64)> = db(&run.store)
        .prepare("SELECT trial, attempt FROM attempts WHERE agent = ?1 AND outcome IS NOT 'exited 0'")
        .expect("prepare")
        .query_map([&agent], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(interrupted.iter().any(|(t, _)| *t == trial), "trial {trial} was cancelled mid-way:\n{all}");
    for (t, attempt) in &interrupted {
        let (_, winner, won) = rows.iter().find(|r| r.0 == *t).expect("the cancelled trial's result");
        assert_ne!(winner, &agent, "trial {t} completed on another job's agent:\n{all}");
        assert!(won > attempt, "trial {t}: the cancelled attempt {attempt} is not the one that completed:\n{all}");
    }
    assert!(
        logged.contains(&format!("job={job}")) || logged.contains(&format!("job=\"{job}\"")),
        "the launcher followed job {job}:\n{logged}"
    );

    let mut agents: BTreeSet<String> = rows.into_iter().map(|r| r.1).collect();
    agents.insert(agent);
    assert_cluster_drains(&run.slurm, Duration::from_secs(90));
    assert_agents_spools_empty(&agents.iter().map(String::as_str).collect::<Vec<_>>());
    eprintln!("cancel test done in {:?}", run.started.elapsed());
}

#[test]
fn a_queue_that_does_not_move_is_reported_and_not_flooded() {
    // A partition that is down takes jobs and keeps them pending.
    let down = |slurm: &Slurm| {
        let mut c = slurm.command("scontrol");
        c.args(["update", "PartitionName=tf", "State=DOWN"]);
        let (code, _, err) = tunefleet_tests::run(c);
        assert_eq!(code, Some(0), "scontrol: {err}");
    };
    let Some(mut run) = start("stuck", 2, 0.1, down, &["--launch-max", "2", "--launch-grace", "2s"]) else { return };

    // Reported with Slurm's reason, and again a grace later: by then a
    // launcher counting by the grace alone would have submitted two more.
    let log = run.log.clone();
    let reports = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("still waits in the scheduler's queue") && l.contains("PartitionDown"))
            .count()
    };
    wait_for("the stuck jobs reported twice each", Duration::from_secs(60), || reports() >= 4);
    let queue = run.slurm.squeue();
    assert_eq!(queue.len(), 2, "--launch-max jobs and no more: {queue:?}");
    assert!(queue.iter().all(|l| l.contains(" PENDING PartitionDown")), "{queue:?}");

    // Stopping the coordinator cancels what still waits.
    run.coord.signal("TERM");
    run.coord.wait_exit(Duration::from_secs(30));
    assert_cluster_drains(&run.slurm, Duration::from_secs(30));
    eprintln!("stuck-queue test done in {:?}", run.started.elapsed());
}
