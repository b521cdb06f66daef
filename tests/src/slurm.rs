//! A one-node Slurm cluster of the test's own, from Debian's `slurmctld`,
//! `slurmd`, `slurm-client` and `munge` (scripts/needs.sh installs them).
//!
//! Everything lives in a temp dir: a munge key, `munged --key-file
//! --socket` on a socket in a directory of its own, a `slurm.conf` with
//! `AuthInfo=socket=...`, `ProctrackType=proctrack/linuxproc`,
//! `TaskPlugin=task/none` and one node `tf-node` of `CPUs=2` on 127.0.0.1,
//! with ports that were free a moment ago, and state, spool, pid and log
//! files. `slurmctld -D` and `slurmd -D` run in the foreground as children
//! of the test; the cluster is up once `sinfo` lists the node idle. Clients
//! find it through `SLURM_CONF` ([`Slurm::command`]), which `sbatch` passes
//! on to its jobs. Dropping it cancels every job, stops the daemons and
//! kills every process still carrying that `SLURM_CONF` (job steps, agents),
//! so nothing of it outlives the test. Root only: slurmd runs jobs as their
//! user, and the daemons run as root here.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{free_port, run, wait_for, Proc};

/// Slurm's daemons, where Debian installs them.
const SBIN: &str = "/usr/sbin";

/// Starts that lose a port to another process are tried again this often.
const TRIES: usize = 3;

/// Whether the test runs as root (the Slurm tests need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines().any(|l| l.strip_prefix("Uid:").is_some_and(|ids| ids.split_whitespace().next() == Some("0")))
    })
}

/// A running cluster; stopped and removed when dropped.
pub struct Slurm {
    dir: tempfile::TempDir,
    /// The `slurm.conf` clients read (`SLURM_CONF`).
    pub conf: PathBuf,
    /// munged, slurmctld, slurmd.
    procs: Vec<Proc>,
}

impl Slurm {
    /// Starts munged, slurmctld and slurmd; returns once the node is idle.
    pub fn start() -> Slurm {
        assert!(
            Path::new(SBIN).join("slurmctld").exists() && Command::new("sbatch").arg("--help").output().is_ok(),
            "Slurm is not installed: apt-get install slurmctld slurmd slurm-client munge (scripts/test.sh does)"
        );
        let dir = tempfile::Builder::new().prefix("tunefleet-slurm-").tempdir().expect("tempdir");
        let conf = dir.path().join("slurm.conf");
        let mut slurm = Slurm { dir, conf, procs: Vec::new() };
        slurm.start_munge();
        for attempt in 1..=TRIES {
            match slurm.start_daemons() {
                Ok(()) => return slurm,
                Err(why) if attempt < TRIES => eprintln!("slurm: {why}; trying other ports"),
                Err(why) => panic!("slurm did not start: {why}\n{}", slurm.logs()),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The temp dir everything lives in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `program` (a Slurm client) talking to this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// `squeue` lines `ID NAME STATE REASON` of every job it lists.
    pub fn squeue(&self) -> Vec<String> {
        let mut c = self.command("squeue");
        c.args(["--noheader", "--format", "%i %j %T %r"]);
        let (code, out, err) = run(c);
        assert_eq!(code, Some(0), "squeue: {err}");
        out.lines().map(str::to_string).collect()
    }

    /// Processes other than the daemons (and their helpers) that carry this
    /// cluster's `SLURM_CONF` in their environment: job steps (slurmstepd),
    /// their scripts and agents.
    pub fn job_processes(&self) -> Vec<u32> {
        let daemons: Vec<u32> = self.procs.iter().map(|p| p.child.id()).collect();
        let needle = format!("SLURM_CONF={}", self.conf.display());
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| *pid != std::process::id() && !daemons.contains(pid))
            // slurmctld's helper (slurmscriptd) goes with the daemon.
            .filter(|pid| {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                !matches!(comm.trim(), "slurmctld" | "slurmscriptd" | "slurmd")
            })
            .filter(|pid| {
                // A zombie has no environment left; it is its parent's to reap.
                std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
            })
            .collect()
    }

    fn start_munge(&mut self) {
        let d = self.dir.path();
        // munged wants its key private and its socket's directory open to all.
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o711)).expect("chmod");
        for (sub, mode) in [("munge-key", 0o700), ("munge", 0o755), ("state", 0o700), ("spool", 0o700), ("log", 0o755)]
        {
            let p = d.join(sub);
            std::fs::create_dir(&p).expect("mkdir");
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode)).expect("chmod");
        }
        let key = d.join("munge-key/munge.key");
        let (code, _, err) = run({
            let mut c = Command::new(Path::new(SBIN).join("mungekey"));
            c.arg("--create").arg("--keyfile").arg(&key);
            c
        });
        assert_eq!(code, Some(0), "mungekey: {err}");
        let m = d.join("munge");
        let mut c = Command::new(Path::new(SBIN).join("munged"));
        c.arg("--foreground")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", m.join("munge.socket").display()))
            .arg(format!("--log-file={}", d.join("log/munged.log").display()))
            .arg(format!("--pid-file={}", m.join("munged.pid").display()))
            .arg(format!("--seed-file={}", m.join("munged.seed").display()));
        c.stderr(File::create(d.join("log/munged.err")).expect("log"));
        self.procs.push(Proc::spawn("munged", c));
        let socket = m.join("munge.socket");
        wait_for("munged's socket", Duration::from_secs(20), || socket.exists());
    }

    fn write_conf(&self, ctld_port: u16, slurmd_port: u16) {
        let d = self.dir.path();
        let host = run(Command::new("hostname")).1.trim().split('.').next().unwrap_or("localhost").to_string();
        let p = |s: &str| d.join(s).display().to_string();
        let conf = format!(
            "ClusterName=tunefleet\n\
             SlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={slurmd_port}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={socket}\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/none\n\
             MpiDefault=none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             SlurmdParameters=config_overrides\n\
             ReturnToService=2\n\
             SchedulerParameters=sched_interval=2\n\
             KillWait=5\n\
             MailProg=/bin/true\n\
             StateSaveLocation={state}\n\
             SlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctld_pid}\n\
             SlurmdPidFile={slurmd_pid}\n\
             SlurmctldLogFile={ctld_log}\n\
             SlurmdLogFile={slurmd_log}\n\
             NodeName=tf-node NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n\
             PartitionName=tf Nodes=tf-node Default=YES MaxTime=INFINITE State=UP\n",
            socket = p("munge/munge.socket"),
            state = p("state"),
            spool = p("spool"),
            ctld_pid = p("log/slurmctld.pid"),
            slurmd_pid = p("log/slurmd.pid"),
            ctld_log = p("log/slurmctld.log"),
            slurmd_log = p("log/slurmd.log"),
        );
        std::fs::write(&self.conf, conf).expect("slurm.conf");
    }

    /// slurmctld and slurmd on ports free a moment ago; `Err` when one of
    /// them exited before the node was idle (a port taken first).
    fn start_daemons(&mut self) -> Result<(), String> {
        // Daemons of an earlier attempt go first.
        self.procs.truncate(1);
        let (ctld_port, slurmd_port) = (free_port(), free_port());
        self.write_conf(ctld_port, slurmd_port);
        let d = self.dir.path().to_path_buf();
        for (name, args) in [("slurmctld", &["-D", "-i"][..]), ("slurmd", &["-D", "-N", "tf-node"][..])] {
            let mut c = Command::new(Path::new(SBIN).join(name));
            c.args(args).env("SLURM_CONF", &self.conf).current_dir(&d);
            c.stderr(File::create(d.join(format!("log/{name}.err"))).expect("log"));
            self.procs.push(Proc::spawn(name, c));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            for p in &mut self.procs {
                if let Ok(Some(status)) = p.child.try_wait() {
                    return Err(format!("{} exited ({status}) before the node was up", p.name));
                }
            }
            let mut c = self.command("sinfo");
            c.args(["--noheader", "--nodes=tf-node", "--format=%t"]);
            let (code, out, _) = run(c);
            if code == Some(0) && out.trim() == "idle" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("the node is not idle after 60 s (sinfo: {:?})", out.trim()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The tails of the daemons' logs, for a failure message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for f in ["munged.err", "slurmctld.log", "slurmctld.err", "slurmd.log", "slurmd.err"] {
            let text = std::fs::read_to_string(self.dir.path().join("log").join(f)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {f}\n{}\n", lines[lines.len().saturating_sub(15)..].join("\n")));
        }
        out
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("slurm logs:\n{}", self.logs());
        }
        if self.procs.len() == 3 {
            let mut c = self.command("scancel");
            c.args(["--partition=tf", "--full"]);
            let _ = run(c);
        }
        // The daemons (their process groups), then whatever the jobs left.
        self.procs.clear();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = self.job_processes();
            if left.is_empty() || Instant::now() > deadline {
                break;
            }
            for pid in left {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
