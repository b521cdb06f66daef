//! A Spark standalone cluster of the test's own, from PyPI's `pyspark` in
//! the virtual environment scripts/needs.sh makes (`target/spark-venv`, or
//! `$SPARK_VENV`), on the machine's Java.
//!
//! The pip package has no `sbin/start-master.sh`, so the master and one
//! worker (2 cores, 4 GiB) run as `spark-class ...deploy.master.Master` and
//! `...deploy.worker.Worker`, children of the test in process groups of
//! their own, on loopback ports that were free a moment ago, with logs,
//! work and local dirs in a temp dir. The cluster is up once the master
//! logged the worker's registration. [`Spark::env`] gives a command what a
//! Spark client needs (`MASTER`, `SPARK_HOME`, `PYSPARK_PYTHON`, the venv on
//! `PATH`, loopback only). Dropping it stops both daemons and kills every
//! process still carrying its local dir in its environment (executors,
//! drivers), so nothing of it outlives the test.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{free_port, path_with_bins, run, Proc};

/// Starts that lose a port to another process are tried again this often.
const TRIES: usize = 3;

/// The virtual environment with pyspark and numpy.
pub fn venv() -> PathBuf {
    std::env::var_os("SPARK_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo").join("target/spark-venv"))
}

/// A running cluster; stopped and removed when dropped.
pub struct Spark {
    dir: tempfile::TempDir,
    /// `spark://127.0.0.1:PORT`.
    pub master: String,
    home: PathBuf,
    /// Master, worker.
    procs: Vec<Proc>,
}

impl Spark {
    /// Starts a master and a worker; returns once the worker registered.
    pub fn start() -> Spark {
        let python = venv().join("bin/python");
        assert!(
            python.exists(),
            "pyspark is not installed in {}: scripts/test.sh installs it (scripts/needs.sh, need `spark`)",
            venv().display()
        );
        let (code, out, err) = run({
            let mut c = Command::new(&python);
            c.args(["-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"]);
            c
        });
        assert_eq!(code, Some(0), "pyspark: {err}");
        let home = PathBuf::from(out.trim());
        let dir = tempfile::Builder::new().prefix("tunefleet-spark-").tempdir().expect("tempdir");
        for sub in ["local", "work", "logs"] {
            std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        }
        let mut spark = Spark { dir, master: String::new(), home, procs: Vec::new() };
        for attempt in 1..=TRIES {
            match spark.start_daemons() {
                Ok(()) => return spark,
                Err(why) if attempt < TRIES => {
                    eprintln!("spark: {why}; trying other ports");
                    spark.procs.clear();
                }
                Err(why) => panic!("spark did not start: {why}\n{}", spark.logs()),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn start_daemons(&mut self) -> Result<(), String> {
        let (port, ui, worker_ui) = (free_port(), free_port(), free_port());
        self.master = format!("spark://127.0.0.1:{port}");
        let master_log = self.dir.path().join("logs/master.log");
        let mut c = self.command("spark-class");
        // A port taken meanwhile: fail (and be tried again on others), not
        // bind the next one while the URL names this one.
        c.env("SPARK_MASTER_OPTS", "-Dspark.port.maxRetries=0");
        c.args(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--webui-port", &ui.to_string()])
            .stderr(File::create(&master_log).expect("log"));
        self.procs.push(Proc::spawn("spark-master", c));
        self.wait_log(&master_log, "Successfully started service 'sparkMaster'", Duration::from_secs(60))?;
        let mut c = self.command("spark-class");
        c.env("SPARK_WORKER_OPTS", "-Dspark.port.maxRetries=0");
        c.args(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2", "--memory", "4g"])
            .args(["--webui-port", &worker_ui.to_string(), "--work-dir"])
            .arg(self.dir.path().join("work"))
            .arg(&self.master)
            .stderr(File::create(self.dir.path().join("logs/worker.log")).expect("log"));
        self.procs.push(Proc::spawn("spark-worker", c));
        self.wait_log(&master_log, "Registering worker", Duration::from_secs(60))
    }

    /// Waits for `line` in `log` while every daemon runs.
    fn wait_log(&mut self, log: &Path, line: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if std::fs::read_to_string(log).unwrap_or_default().contains(line) {
                return Ok(());
            }
            for p in &mut self.procs {
                if let Ok(Some(status)) = p.child.try_wait() {
                    return Err(format!("{} exited with {status} before {line:?}", p.name));
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no {line:?} in {} within {timeout:?}", log.display()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The temp dir everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Sets what a Spark client or daemon needs on `cmd`.
    pub fn env(&self, cmd: &mut Command) {
        let mut path = std::ffi::OsString::from(venv().join("bin"));
        path.push(":");
        path.push(path_with_bins());
        cmd.env("PATH", path)
            .env("SPARK_HOME", &self.home)
            .env("PYSPARK_PYTHON", venv().join("bin/python"))
            .env("SPARK_LOCAL_IP", "127.0.0.1")
            .env("SPARK_LOCAL_DIRS", self.dir.path().join("local"))
            .env("SPARK_LOG_DIR", self.dir.path().join("logs"))
            .env("SPARK_WORKER_DIR", self.dir.path().join("work"))
            .env("MASTER", &self.master);
    }

    /// `program` with this cluster's environment.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        self.env(&mut c);
        c
    }

    /// The worker's log: each executor's launch command is in it.
    pub fn worker_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("logs/worker.log")).unwrap_or_default()
    }

    /// Processes other than the daemons that carry this cluster's local
    /// dir in their environment (executors, drivers).
    pub fn job_processes(&self) -> Vec<u32> {
        let mark = format!("SPARK_LOCAL_DIRS={}", self.dir.path().join("local").display());
        let daemons: Vec<u32> = self.procs.iter().map(|p| p.child.id()).collect();
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| !daemons.contains(pid) && *pid != std::process::id())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == mark.as_bytes()))
            })
            .collect()
    }

    fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join("logs").join(f)).unwrap_or_default();
        let tail =
            |s: String| s.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        format!("--- master.log\n{}\n--- worker.log\n{}", tail(read("master.log")), tail(read("worker.log")))
    }
}

impl Drop for Spark {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("spark logs:\n{}", self.logs());
        }
        // The daemons (their process groups: the worker's executors with
        // it), then whatever else carries the cluster's environment.
        self.procs.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.job_processes();
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("spark: processes left after 10 s of SIGKILL: {left:?}");
                break;
            }
            for pid in left {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
