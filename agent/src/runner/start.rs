//! What a trial runs with ([`RunnerConfig`], [`TrialRun`]) and how its
//! workload starts: directly, one `exec` by a thread of the agent's pool
//! ([`super::launcher`]) that pins itself and opens the counters on what it
//! starts; or held by the exec
//! wrapper ([`crate::exec`]) until it is in its cgroup and counted, when a
//! memory limit must be set before the exec. Then its output readers
//! ([`super::output`], tasks of the event loop), the RSS sampler (its first
//! sample now, the next ones on a thread of its own once the trial has run
//! for an interval) and its registration for telemetry.
//! A workload that cannot start is its measurement already.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Pid;
use tokio::sync::{mpsc, oneshot};
use tunefleet_common::measurement::{AppliedLimits, ExitOutcome, Measurement, MemoryLimit, WindowProfile};
use tunefleet_common::message::TrialSpec;

use super::child::{child_pid, unix_ms, wait_exit, Exited, Started};
use super::output::{spawn_reader, OutputEvent};
use crate::cgroup::{CgroupV2, TrialCgroup};
use crate::counters::CounterSet;
use crate::energy;
use crate::exec::ExecPlan;
use crate::pipeline::{Boundary, Pipeline};
use crate::procfs;

/// Environment variables set to the trial's thread count.
pub const THREAD_VARS: [&str; 5] =
    ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS", "TUNEFLEET_THREADS"];
/// How often the peak resident set of the process tree is sampled.
pub const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// The environment variable that tells a workload the control channel is
/// open on its standard input (docs/PROTOCOL.md, "Control channel").
pub const CONTROL_VAR: &str = "TUNEFLEET_CONTROL";
/// The environment variable that asks a workload for step lines (the
/// probe windows of its trial count steps).
pub const STEPS_VAR: &str = "TUNEFLEET_STEPS";

/// How trials are run on this machine.
#[derive(Clone)]
pub struct RunnerConfig {
    /// The agent executable, re-executed as the exec wrapper.
    pub wrapper: PathBuf,
    /// cgroup v2 memory limits, when usable.
    pub cgroup: Option<CgroupV2>,
    /// Where `/proc` is (a parameter for tests).
    pub proc_root: PathBuf,
    /// Between SIGTERM and SIGKILL on timeout or cancel.
    pub kill_grace: Duration,
    /// How long output may still be read after the workload exited.
    pub output_grace: Duration,
    /// Every source a trial's energy is measured with: the machine's and
    /// NVML for its GPUs.
    pub energy: energy::Registry,
    /// Interval between energy and counter samples while a trial runs.
    pub sample_interval: Duration,
    /// CPUs the agent may use (the "cores" of an unpinned trial).
    pub machine_cpus: u32,
    /// Let the workload write to the agent's own stdout and stderr (for
    /// `measure`) instead of reading them for metrics and the log tail.
    pub inherit_output: bool,
    /// Where each trial's processes are registered while it runs, so that
    /// telemetry tells its CPU time from load from outside.
    pub trials: crate::foreign::TrialRegistry,
    /// Start every workload through the exec wrapper, even one that could
    /// be started directly (for benchmarks and tests of the wrapper).
    pub always_wrap: bool,
    /// The threads that start workloads directly ([`super::launcher`]).
    pub launchers: Arc<super::launcher::Launchers>,
    /// This agent offers GPUs: a trial given none is shown none.
    pub gpus_offered: bool,
    /// A measurement is flagged when load from outside its trial exceeded
    /// this share of the agent's CPUs ([`crate::foreign::interference_reason`]).
    pub interference_threshold: f64,
    /// Says when the agent is stopping, so that a trial it stopped with is
    /// cancelled rather than failed; `None`: never (`measure`).
    pub agent_stopping: Option<tokio::sync::watch::Receiver<bool>>,
    /// Trials run beside each other (several slots): a whole-machine
    /// reading is shared among them by CPU time ([`Measurement::cpu_share`]).
    pub shared_machine: bool,
}

impl std::fmt::Debug for RunnerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerConfig")
            .field("wrapper", &self.wrapper)
            .field("cgroup", &self.cgroup)
            .field("energy", &self.energy.kind())
            .finish_non_exhaustive()
    }
}

impl RunnerConfig {
    /// Defaults: no cgroup, `/proc`, 500 ms kill grace, estimated energy,
    /// samples every second.
    pub fn new(wrapper: PathBuf) -> Self {
        RunnerConfig {
            wrapper,
            cgroup: None,
            proc_root: PathBuf::from("/proc"),
            kill_grace: Duration::from_millis(500),
            output_grace: Duration::from_secs(2),
            energy: energy::Registry::default(),
            sample_interval: crate::counters::DEFAULT_SAMPLE_INTERVAL,
            machine_cpus: u32::try_from(crate::cpus::allowed_cpus().len()).unwrap_or(u32::MAX).max(1),
            inherit_output: false,
            trials: crate::foreign::TrialRegistry::default(),
            always_wrap: false,
            launchers: Arc::default(),
            gpus_offered: false,
            shared_machine: false,
            interference_threshold: crate::foreign::DEFAULT_THRESHOLD,
            agent_stopping: None,
        }
    }
}

/// One trial to run.
#[derive(Debug, Clone)]
pub struct TrialRun {
    pub spec: TrialSpec,
    /// CPUs to pin to (see [`crate::cpus::choose_cpus`]); empty: not pinned.
    pub cpus: Vec<u32>,
    /// GPUs given to it alone ([`crate::protocol`] never gives one to two
    /// trials): named in `CUDA_VISIBLE_DEVICES`, their energy measured.
    pub gpus: Vec<tunefleet_common::message::GpuDevice>,
    /// Short name for the trial's cgroup, `[A-Za-z0-9._-]` only.
    pub label: String,
}

pub(super) struct Prepared {
    pub(super) limits: AppliedLimits,
    pub(super) cgroup: Option<TrialCgroup>,
    pub(super) rlimit_as: Option<u64>,
}

fn prepare_limits(cfg: &RunnerConfig, run: &TrialRun) -> Prepared {
    let mut prepared = Prepared {
        limits: AppliedLimits { cpus: run.cpus.clone(), threads: run.spec.system.threads, memory: MemoryLimit::None },
        cgroup: None,
        rlimit_as: None,
    };
    let Some(bytes) = run.spec.system.memory_mib.map(|m| m.saturating_mul(1 << 20)) else {
        return prepared;
    };
    match cfg.cgroup.as_ref().map(|c| c.create_trial(&run.label, bytes)) {
        Some(Ok(cg)) => {
            prepared.cgroup = Some(cg);
            prepared.limits.memory = MemoryLimit::Cgroup { bytes };
        }
        other => {
            if let Some(Err(e)) = other {
                tracing::warn!(error = %e, "cgroup memory limit failed; using RLIMIT_AS");
            }
            prepared.rlimit_as = Some(bytes);
            prepared.limits.memory = MemoryLimit::Rlimit { bytes };
        }
    }
    prepared
}

/// A measurement of a trial that never ran.
fn not_started(
    started_unix_ms: u64,
    limits: AppliedLimits,
    reason: String,
    run: &TrialRun,
    energy: &energy::Registry,
) -> Measurement {
    let counters_missing = CounterSet::all_missing("the workload did not start").finish(Duration::ZERO).missing;
    let (machine, gpus) = energy.never_ran(&run.gpus, "the workload did not start");
    Measurement {
        started_unix_ms,
        counters_missing,
        limits,
        gpus,
        ..Measurement::unmeasured(ExitOutcome::SpawnFailed(reason), machine)
    }
}

/// A pipe of the workload's output as the event loop reads it; one it
/// cannot take (never, short of a broken runtime) is read as closed.
fn async_pipe<P>(pipe: std::io::Result<P>) -> Option<P> {
    pipe.map_err(|e| tracing::warn!(error = %e, "cannot read the workload's output; that stream is ignored")).ok()
}

/// A workload started through the exec wrapper and let go: what the monitor
/// watches and the assembly reads.
pub(super) struct Spawned {
    pub(super) pid: Pid,
    pub(super) prepared: Prepared,
    pub(super) counters: CounterSet,
    /// The machine's meter and the meters of the GPUs the trial was given.
    pub(super) meters: energy::TrialMeters,
    /// The machine's busy CPU time when the workload started and when it
    /// exited, on an agent whose trials share the machine.
    pub(super) machine_busy_us: (Option<u64>, Option<u64>),
    pub(super) interval: Duration,
    pub(super) started_unix_ms: u64,
    pub(super) start: Instant,
    pub(super) output: mpsc::Receiver<OutputEvent>,
    /// The tasks reading it, aborted when the trial is over.
    pub(super) readers: Vec<tokio::task::JoinHandle<()>>,
    pub(super) waiter: oneshot::Receiver<std::io::Result<Exited>>,
    pub(super) rss: procfs::RssSampler,
    /// The trial's processes, for live changes.
    pub(super) members: procfs::Members,
    /// The same, registered for telemetry until the workload exits.
    pub(super) registration: crate::foreign::Registration,
    /// Probe windows and segments.
    pub(super) pipeline: Pipeline,
    /// The workload's standard input when it speaks the control channel.
    pub(super) control: Option<ChildStdin>,
    /// Settings for the workload's next control line (the coordinator's
    /// threads, waiting for an epoch boundary).
    pub(super) pending_line: Vec<String>,
    /// The last epoch boundary seen.
    pub(super) last_boundary: Option<Boundary>,
    /// CPUs this trial started on, then the others the agent may use.
    pub(super) cpu_pool: Vec<u32>,
    /// The profile of a pipelined trial's first window, once it closed.
    pub(super) window_profile: Option<WindowProfile>,
    /// Counter totals and `/proc` counts when the warm-up ended: what the
    /// first probe window's profile counts from.
    pub(super) window_base: Option<(Vec<tunefleet_common::measurement::CounterReading>, procfs::ProcCounts)>,
    /// ... and not yet sent with an epoch's progress.
    pub(super) profile_unsent: bool,
    /// When the workload's top process exited (since `start`): the meter
    /// and the counters were sampled then, for the last time.
    pub(super) exited_at: Option<Duration>,
}

/// Starts the workload held by the exec wrapper, moves it into its cgroup,
/// opens its counters, starts the energy meter and lets it go; a blocking
/// task waits for its end.
fn start_wrapped(cfg: &RunnerConfig, mut cmd: Command, prepared: &Prepared) -> Result<Started, String> {
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the exec wrapper {}: {e}", cfg.wrapper.display()))?;
    let pid = child_pid(&mut child)?;
    if let Some(cg) = &prepared.cgroup {
        if let Err(e) = cg.add(child.id()) {
            // Closing stdin without a byte makes the wrapper exit.
            drop(child.stdin.take());
            let _ = child.wait();
            return Err(e.to_string());
        }
    }
    let counters = CounterSet::open_for_exec(pid.as_raw_nonzero().get());
    let meter = cfg.energy.start_machine();
    let started_unix_ms = unix_ms(SystemTime::now());
    let start = Instant::now();
    let mut stdin = child.stdin.take();
    if let Some(Err(e)) = stdin.as_mut().map(|s| s.write_all(&[1])) {
        tracing::warn!(error = %e, "cannot let the exec wrapper go");
    }
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (exit_tx, waiter) = oneshot::channel();
    let proc_root = cfg.proc_root.clone();
    tokio::task::spawn_blocking(move || {
        let _ = exit_tx.send(wait_exit(child, pid, proc_root));
    });
    Ok(Started { pid, stdin, stdout, stderr, counters, meter, started_unix_ms, start, waiter })
}

/// Starts the workload (directly, or held by the exec wrapper and let go
/// once in its cgroup and counted), then its output readers and the RSS
/// sampler. A workload that cannot start is its measurement already.
pub(super) fn spawn(cfg: &RunnerConfig, run: &TrialRun) -> Result<Spawned, Box<Measurement>> {
    let spec = &run.spec;
    let prepared = prepare_limits(cfg, run);
    let energy = &cfg.energy;
    let refused = |limits, reason| Box::new(not_started(unix_ms(SystemTime::now()), limits, reason, run, energy));
    if spec.argv.is_empty() {
        return Err(refused(prepared.limits, "empty argv".into()));
    }
    let control = spec.probe.as_ref().is_some_and(|p| p.control);
    // Without a cgroup to enter or an address-space limit to set before the
    // exec, the workload is started directly by a thread of its own (one
    // exec); otherwise through the exec wrapper, held until "go".
    let direct = prepared.cgroup.is_none() && prepared.rlimit_as.is_none() && !cfg.always_wrap;
    let cmd = command(cfg, run, &prepared, control, direct);
    let interval = energy.sampling_interval(cfg.sample_interval);
    // The trial's GPUs metered from before the workload goes: loading NVML
    // takes a while, and the start of the run must not be missed.
    let gpus = energy.start_gpus(&run.gpus);
    let started = if direct {
        let meter = energy.start_machine();
        match super::launcher::start_direct(&cfg.launchers, cmd, run.cpus.clone(), cfg.proc_root.clone(), meter) {
            Ok(started) => started,
            Err(reason) => return Err(refused(prepared.limits, reason)),
        }
    } else {
        match start_wrapped(cfg, cmd, &prepared) {
            Ok(started) => started,
            Err(reason) => {
                let limits = prepared.limits;
                if let Some(cg) = prepared.cgroup {
                    cg.remove();
                }
                return Err(refused(limits, reason));
            }
        }
    };
    let Started { pid, stdin, stdout, stderr, counters, meter, started_unix_ms, start, waiter } = started;
    let shared = cfg.shared_machine && energy.kind() != tunefleet_common::measurement::EnergySourceKind::Estimated;
    let machine_busy_us = (shared.then(|| crate::telemetry::machine_busy_us(&cfg.proc_root)).flatten(), None);
    let (tx, output) = mpsc::channel::<OutputEvent>(1024);
    // Kept open as the control channel, or closed: the workload reads /dev/null.
    let control = stdin.filter(|_| control);
    let readers = [
        spawn_reader(stdout.and_then(|p| async_pipe(tokio::process::ChildStdout::from_std(p))), false, start, &tx),
        spawn_reader(stderr.and_then(|p| async_pipe(tokio::process::ChildStderr::from_std(p))), true, start, &tx),
    ]
    .into_iter()
    .flatten()
    .collect();
    drop(tx);
    let members = match &prepared.cgroup {
        Some(cg) => procfs::Members::Cgroup(cg.path().join("cgroup.procs")),
        None => procfs::Members::Group(pid.as_raw_nonzero().get()),
    };
    let rss = procfs::RssSampler::start(cfg.proc_root.clone(), members.clone(), RSS_SAMPLE_INTERVAL);
    let registration = cfg.trials.register(members.clone());
    let pipeline = Pipeline::new(spec.probe.clone(), spec.system.clone(), run.cpus.clone());
    let mut cpu_pool = run.cpus.clone();
    cpu_pool.extend(crate::cpus::allowed_cpus().into_iter().filter(|c| !run.cpus.contains(c)));
    Ok(Spawned {
        pid,
        prepared,
        counters,
        meters: energy::TrialMeters { machine: meter, gpus },
        machine_busy_us,
        interval,
        started_unix_ms,
        start,
        output,
        readers,
        waiter,
        rss,
        members,
        registration,
        pipeline,
        control,
        pending_line: Vec::new(),
        last_boundary: None,
        cpu_pool,
        window_profile: None,
        window_base: None,
        profile_unsent: false,
        exited_at: None,
    })
}

/// The command that starts `run`'s workload: the program itself when
/// `direct`, else the exec wrapper with its plan; in a process group of its
/// own, with the trial's environment (the control channel, step lines,
/// thread counts) and without the agent's secrets.
fn command(cfg: &RunnerConfig, run: &TrialRun, prepared: &Prepared, control: bool, direct: bool) -> Command {
    let spec = &run.spec;
    let mut cmd = match spec.argv.split_first() {
        Some((program, args)) if direct => {
            let mut cmd = Command::new(program);
            cmd.args(args).stdin(if control { Stdio::piped() } else { Stdio::null() });
            cmd
        }
        _ => {
            let plan = ExecPlan {
                cpus: run.cpus.clone(),
                rlimit_as: prepared.rlimit_as,
                keep_stdin: control,
                argv: spec.argv.iter().map(Into::into).collect(),
            };
            let mut cmd = Command::new(&cfg.wrapper);
            cmd.args(plan.to_args()).stdin(Stdio::piped());
            cmd
        }
    };
    scrub_secrets(&mut cmd);
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v))).process_group(0);
    if control {
        cmd.env(CONTROL_VAR, "stdin");
    }
    if spec.probe.as_ref().is_some_and(|p| p.unit == tunefleet_common::message::WindowUnit::Steps) {
        cmd.env(STEPS_VAR, "1");
    }
    if cfg.inherit_output {
        cmd.stdout(Stdio::inherit()).stderr(Stdio::inherit());
    } else {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    if let Some(t) = spec.system.threads {
        for var in THREAD_VARS {
            cmd.env(var, t.to_string());
        }
    }
    // Its own GPUs, by UUID (whatever the index order CUDA uses); on an
    // agent with GPUs, a trial given none sees none (an empty list), so it
    // never shares one with a trial that was given it.
    if !run.gpus.is_empty() || cfg.gpus_offered {
        cmd.env(GPUS_VAR, run.gpus.iter().map(|g| g.uuid.as_str()).collect::<Vec<_>>().join(","));
    }
    cmd
}

/// The variable naming a trial's GPUs.
pub const GPUS_VAR: &str = "CUDA_VISIBLE_DEVICES";

/// Takes the agent's own secrets (its join token, its broker password) out
/// of what a workload inherits: a trial runs someone else's command.
pub(crate) fn scrub_secrets(cmd: &mut Command) {
    for var in tunefleet_common::security::SECRET_ENV {
        cmd.env_remove(var);
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    /// `TUNEFLEET_JOIN` and `TUNEFLEET_PASSWORD` reached every trial's environment.
    #[test]
    fn regression_a_workload_inherits_none_of_the_agents_secrets() {
        let mut cmd = Command::new("env");
        scrub_secrets(&mut cmd);
        let removed: Vec<String> =
            cmd.get_envs().filter(|(_, v)| v.is_none()).map(|(k, _)| k.to_string_lossy().into_owned()).collect();
        assert!(removed.contains(&"TUNEFLEET_JOIN".to_string()), "{removed:?}");
        assert!(removed.contains(&"TUNEFLEET_PASSWORD".to_string()), "{removed:?}");
    }
}
