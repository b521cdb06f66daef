//! Runs one trial for real and measures it.
//!
//! The workload runs in its own process group. A trial without a memory
//! limit is started directly, one `exec`, by a thread of its own that pins
//! itself to the trial's CPUs and opens the perf counters on what it starts
//! ([`crate::counters`]; each counter is enabled at the workload's exec), then
//! waits for its end. A trial with a memory limit is started through the
//! exec wrapper ([`crate::exec`]), held until the runner has moved it into
//! the trial's cgroup when cgroup v2 limits memory ([`crate::cgroup`]) and
//! opened the counters on it; otherwise the wrapper applies `RLIMIT_AS`
//! itself. (Entering a cgroup or setting a limit of the child's own between
//! fork and exec needs `clone3(CLONE_INTO_CGROUP)` or a `pre_exec` hook,
//! which std offers only as `unsafe`; the agent has no `unsafe`.) Standard output and error are read line by
//! line on two threads with bounded memory ([`crate::output`]); metric lines
//! ([`crate::metrics`]) become epochs, forwarded as progress while the trial
//! runs, and the rest feeds the log tail.
//!
//! Wall time runs from the start (just before the direct spawn, or "go") to
//! the exit of the workload's top process. CPU
//! time is read from `/proc/PID/stat` of that process while it is a zombie
//! (after `waitid(WNOWAIT)`, before reaping): its own user/system time plus
//! that of the children it waited for; orphans it did not wait for are not
//! included there (the perf `task-clock` counter includes them). Then the
//! remaining members of the process group are killed and the zombie reaped;
//! since the leader stays a zombie until then, its process group id cannot be
//! reused by an unrelated process while the group is signalled.
//!
//! `max_rss_kib` is best effort: the runner samples `VmHWM` (the kernel's
//! peak resident set) of every live process of the trial (those listed by
//! its cgroup when it has one, else the members of its process group) every
//! [`RSS_SAMPLE_INTERVAL`] and keeps the largest. That is blocking `/proc`
//! I/O, so it runs on a thread of its own ([`procfs::RssSampler`]), not on
//! the runtime thread. Growth in the last interval before a process exits
//! and processes shorter than one interval are missed; 0 means no sample
//! could be taken.
//!
//! Energy and counters are sampled every [`RunnerConfig::sample_interval`]
//! (shortened when the energy source's counters could wrap faster, see
//! [`crate::energy::sampling_interval`]) and once more when the exit is
//! seen: the measurement gets a power series, a counter series and the
//! profile vector derived from them. An energy source that fails to start
//! falls back to the estimate, and the reading says so.
//!
//! Timeout or cancel: SIGTERM to the whole group, SIGKILL after the grace.
//!
//! While the workload runs its processes are registered in
//! [`RunnerConfig::trials`], so that telemetry counts their CPU time as the
//! trial's and not as load from outside ([`crate::foreign`]).

use std::io::{BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::{kill_process_group, waitid, Pid, Signal, WaitId, WaitIdOptions};
use tokio::sync::{mpsc, oneshot};
use tunefleet_common::measurement::{
    AppliedLimits, EpochMetrics, ExitOutcome, Measurement, MemoryLimit, Metrics, MissingCounter, SegmentRole,
    WindowProfile,
};
use tunefleet_common::message::TrialSpec;
use tunefleet_common::params::SystemParams;
use tunefleet_common::profile::Profile;

use crate::cgroup::{CgroupV2, TrialCgroup};
use crate::counters::CounterSet;
use crate::energy::{self, EnergySource, Estimate, EstimateModel, Usage};
use crate::exec::{ExecPlan, EXEC_FAILED_MARKER, EXIT_EXEC_FAILED};
use crate::metrics::{parse_metric_line, MetricLine};
use crate::output::{LineReader, LogTail, MAX_LINE_BYTES};
use crate::pipeline::{Boundary, Pipeline, Step};
use crate::procfs;

/// Environment variables set to the trial's thread count.
pub const THREAD_VARS: [&str; 5] =
    ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS", "TUNEFLEET_THREADS"];
/// Epochs kept in one measurement (the message must stay far below 1 MiB).
pub const MAX_EPOCHS: usize = 2000;
/// How often the peak resident set of the process tree is sampled.
pub const RSS_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

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
    pub energy: Arc<dyn EnergySource>,
    /// The model used when `energy` fails to start.
    pub energy_model: EstimateModel,
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
            energy: Arc::new(Estimate::default()),
            energy_model: EstimateModel::default(),
            sample_interval: crate::counters::DEFAULT_SAMPLE_INTERVAL,
            machine_cpus: u32::try_from(crate::sched::allowed_cpus().len()).unwrap_or(u32::MAX).max(1),
            inherit_output: false,
            trials: crate::foreign::TrialRegistry::default(),
            always_wrap: false,
        }
    }
}

/// One trial to run.
#[derive(Debug, Clone)]
pub struct TrialRun {
    pub spec: TrialSpec,
    /// CPUs to pin to (see [`crate::sched::choose_cpus`]); empty: not pinned.
    pub cpus: Vec<u32>,
    /// Short name for the trial's cgroup, `[A-Za-z0-9._-]` only.
    pub label: String,
}

/// A line of output, classified on the reader thread.
#[derive(Debug)]
enum OutputEvent {
    Epoch { epoch: u32, metrics: Metrics, checkpoint: Option<String>, elapsed_us: u64 },
    Step { elapsed_us: u64 },
    Final(Metrics),
    Log { text: String, truncated: bool },
    ExecFailed(String),
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn read_stream(pipe: impl Read, is_stderr: bool, start: Instant, tx: mpsc::Sender<OutputEvent>) {
    let mut reader = LineReader::new(BufReader::new(pipe), MAX_LINE_BYTES);
    while let Ok(Some(line)) = reader.next_line() {
        let event = match (is_stderr, line.text.strip_prefix(EXEC_FAILED_MARKER)) {
            (true, Some(reason)) => OutputEvent::ExecFailed(reason.to_string()),
            _ => match parse_metric_line(&line.text) {
                MetricLine::Epoch { epoch, metrics, checkpoint } => {
                    OutputEvent::Epoch { epoch, metrics, checkpoint, elapsed_us: micros(start.elapsed()) }
                }
                MetricLine::Step { .. } => OutputEvent::Step { elapsed_us: micros(start.elapsed()) },
                MetricLine::Final { metrics } => OutputEvent::Final(metrics),
                MetricLine::Log => OutputEvent::Log { text: line.text, truncated: line.truncated },
            },
        };
        if tx.blocking_send(event).is_err() {
            break;
        }
    }
}

fn spawn_reader(
    pipe: Option<impl Read + Send + 'static>,
    is_stderr: bool,
    start: Instant,
    tx: &mpsc::Sender<OutputEvent>,
) {
    let Some(pipe) = pipe else { return };
    let tx = tx.clone();
    let name = if is_stderr { "tf-stderr" } else { "tf-stdout" };
    if let Err(e) = std::thread::Builder::new().name(name.into()).spawn(move || read_stream(pipe, is_stderr, start, tx))
    {
        tracing::warn!(error = %e, "cannot start an output reader thread; that stream is ignored");
    }
}

/// What the workload's output added up to.
#[derive(Debug, Default)]
struct Collected {
    epochs: Vec<EpochMetrics>,
    epochs_dropped: u64,
    final_metrics: Option<Metrics>,
    tail: LogTail,
    exec_failed: Option<String>,
}

/// One finished epoch, as the trial reports it while it runs; the first
/// after a pipelined trial's first window closed carries its profile.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    pub metrics: EpochMetrics,
    pub profile: Option<WindowProfile>,
}

impl Collected {
    fn take(
        &mut self,
        event: OutputEvent,
        progress: Option<&mpsc::Sender<EpochReport>>,
        profile: Option<WindowProfile>,
    ) {
        match event {
            OutputEvent::Epoch { epoch, metrics, checkpoint, elapsed_us } => {
                let e = EpochMetrics { epoch, elapsed_us, metrics, checkpoint };
                if let Some(tx) = progress {
                    // Progress is advisory: dropped when the agent lags.
                    let _ = tx.try_send(EpochReport { metrics: e.clone(), profile });
                }
                if self.epochs.len() < MAX_EPOCHS {
                    self.epochs.push(e);
                } else {
                    self.epochs_dropped += 1;
                }
            }
            OutputEvent::Step { .. } => {}
            OutputEvent::Final(m) => self.final_metrics = Some(m),
            OutputEvent::Log { text, truncated } => self.tail.push(&text, truncated),
            OutputEvent::ExecFailed(reason) => self.exec_failed = Some(reason),
        }
    }
}

/// The top process's end, observed on a blocking thread.
#[derive(Debug)]
struct Exited {
    status: ExitStatus,
    at: Instant,
    stat: Option<procfs::StatFields>,
}

/// Waits for the leader to exit, reads its CPU times as a zombie, kills what
/// is left of its process group, then reaps it.
fn wait_exit(mut child: Child, pid: Pid, proc_root: PathBuf) -> std::io::Result<Exited> {
    loop {
        match waitid(WaitId::Pid(pid), WaitIdOptions::EXITED | WaitIdOptions::NOWAIT) {
            Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => break,
            Err(e) => {
                tracing::warn!(error = %e, "waitid failed; CPU times will be missing");
                break;
            }
        }
    }
    let at = Instant::now();
    let stat = procfs::read_stat(&proc_root, pid.as_raw_nonzero().get());
    // The leader is an unreaped zombie, so its group id is still reserved.
    let _ = kill_process_group(pid, Signal::KILL);
    let status = child.wait()?;
    Ok(Exited { status, at, stat })
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

fn signal_group(pid: Pid, sig: Signal) {
    if let Err(e) = kill_process_group(pid, sig) {
        if e != rustix::io::Errno::SRCH {
            tracing::warn!(pgid = pid.as_raw_nonzero().get(), error = %e, "cannot signal the trial's process group");
        }
    }
}

struct Prepared {
    limits: AppliedLimits,
    cgroup: Option<TrialCgroup>,
    rlimit_as: Option<u64>,
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
fn not_started(started_unix_ms: u64, limits: AppliedLimits, reason: String, energy: &dyn EnergySource) -> Measurement {
    let usage = Usage { wall: Duration::ZERO, cpu: Duration::ZERO, cores: 0 };
    let counters_missing = CounterSet::all_missing("the workload did not start").finish(Duration::ZERO).missing;
    let model = EstimateModel::default();
    Measurement {
        started_unix_ms,
        counters_missing,
        limits,
        ..Measurement::unmeasured(
            ExitOutcome::SpawnFailed(reason),
            energy::start_or_estimate(energy, model).stop(Duration::ZERO, &usage),
        )
    }
}

/// What the agent can tell a running trial through its [`TrialHandle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Stop it: SIGTERM to its process group, SIGKILL after the grace; the
    /// measurement says `Cancelled`.
    Cancel,
    /// Run under this system configuration from now on (a new segment).
    Apply(SystemParams, SegmentRole),
}

/// The environment variable that tells a workload the control channel is
/// open on its standard input (docs/PROTOCOL.md, "Control channel").
pub const CONTROL_VAR: &str = "TUNEFLEET_CONTROL";
/// The environment variable that asks a workload for step lines (the
/// probe windows of its trial count steps).
pub const STEPS_VAR: &str = "TUNEFLEET_STEPS";

/// The agent's handle on one running trial: the sending side of its
/// control input. Dropping every handle leaves the trial running.
#[derive(Debug, Clone)]
pub struct TrialHandle {
    tx: mpsc::UnboundedSender<Control>,
}

/// The trial's side of its control input (see [`run_trial`]).
#[derive(Debug)]
pub struct ControlInput {
    rx: mpsc::UnboundedReceiver<Control>,
    open: bool,
}

impl TrialHandle {
    /// A handle and the control input it drives.
    pub fn new() -> (TrialHandle, ControlInput) {
        let (tx, rx) = mpsc::unbounded_channel();
        (TrialHandle { tx }, ControlInput { rx, open: true })
    }

    /// Sends `control`; false when the trial has ended.
    pub fn send(&self, control: Control) -> bool {
        self.tx.send(control).is_ok()
    }

    pub fn cancel(&self) -> bool {
        self.send(Control::Cancel)
    }
}

impl ControlInput {
    /// The next control; pending forever once every handle is gone.
    async fn next(&mut self) -> Control {
        if self.open {
            if let Some(c) = self.rx.recv().await {
                return c;
            }
            self.open = false;
        }
        std::future::pending().await
    }
}

/// A workload started through the exec wrapper and let go: what the monitor
/// watches and the assembly reads.
struct Spawned {
    pid: Pid,
    prepared: Prepared,
    counters: CounterSet,
    meter: Box<dyn energy::EnergyMeter>,
    interval: Duration,
    started_unix_ms: u64,
    start: Instant,
    output: mpsc::Receiver<OutputEvent>,
    waiter: oneshot::Receiver<std::io::Result<Exited>>,
    rss: procfs::RssSampler,
    /// The trial's processes, for live changes.
    members: procfs::Members,
    /// The same, registered for telemetry until the workload exits.
    registration: crate::foreign::Registration,
    /// Probe windows and segments.
    pipeline: Pipeline,
    /// The workload's standard input when it speaks the control channel.
    control: Option<ChildStdin>,
    /// Settings for the workload's next control line (the coordinator's
    /// threads, waiting for an epoch boundary).
    pending_line: Vec<String>,
    /// The last epoch boundary seen.
    last_boundary: Option<Boundary>,
    /// CPUs this trial started on, then the others the agent may use.
    cpu_pool: Vec<u32>,
    /// The profile of a pipelined trial's first window, once it closed.
    window_profile: Option<WindowProfile>,
    /// ... and not yet sent with an epoch's progress.
    profile_unsent: bool,
}

/// What the monitor saw until the workload ended and its output closed.
struct Monitored {
    exited: Option<Result<Exited, String>>,
    stopped: Option<ExitOutcome>,
    collected: Collected,
    peak_rss: Option<u64>,
}

/// Runs `run` to completion (or timeout, or [`Control::Cancel`] from its
/// [`TrialHandle`]) and measures it: [`spawn`], [`monitor`], [`assemble`].
/// Epochs are also sent to `progress` as they are printed. Never fails: a
/// workload that cannot start is a measurement with `SpawnFailed`.
pub async fn run_trial(
    cfg: &RunnerConfig,
    run: &TrialRun,
    progress: Option<mpsc::Sender<EpochReport>>,
    control: ControlInput,
) -> Measurement {
    match spawn(cfg, run) {
        Ok(mut spawned) => {
            let monitored = monitor(cfg, &run.spec, &mut spawned, progress, control).await;
            assemble(cfg, run, spawned, monitored)
        }
        Err(not_started) => *not_started,
    }
}

/// A workload just started, with what watches it.
struct Started {
    pid: Pid,
    stdin: Option<ChildStdin>,
    stdout: Option<std::process::ChildStdout>,
    stderr: Option<std::process::ChildStderr>,
    counters: CounterSet,
    meter: Box<dyn energy::EnergyMeter>,
    started_unix_ms: u64,
    start: Instant,
    /// The leader's end, from the thread that waits for it.
    waiter: oneshot::Receiver<std::io::Result<Exited>>,
}

/// The pid of a child just started; a child that has none as a positive
/// i32 (never, on Linux) is killed and reaped.
fn child_pid(child: &mut Child) -> Result<Pid, String> {
    match i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
        Some(pid) => Ok(pid),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err("invalid child pid".into())
        }
    }
}

/// Starts the workload directly (one exec) from a thread of its own: the
/// thread pins itself to the trial's CPUs (the workload inherits them),
/// opens the counters on the processes it will start (each enabled at its
/// exec), spawns, hands the workload over and then waits for its end.
/// The thread starts nothing else, so the counters count the workload's
/// process tree only. `meter` was started just before.
fn start_direct(
    mut cmd: Command,
    cpus: Vec<u32>,
    proc_root: PathBuf,
    meter: Box<dyn energy::EnergyMeter>,
) -> Result<Started, String> {
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel::<Result<Started, String>>(1);
    let (exit_tx, waiter) = oneshot::channel();
    let program = cmd.get_program().to_owned();
    let thread = std::thread::Builder::new().name("tf-trial".into()).stack_size(256 << 10).spawn(move || {
        if let Err(e) = crate::exec::pin_current_thread(&cpus) {
            let _ = started_tx.send(Err(e));
            return;
        }
        let counters = CounterSet::open_for_children();
        let started_unix_ms = unix_ms(SystemTime::now());
        let start = Instant::now();
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                let _ = started_tx.send(Err(format!("cannot execute {program:?}: {e}")));
                return;
            }
        };
        let pid = match child_pid(&mut child) {
            Ok(pid) => pid,
            Err(e) => {
                let _ = started_tx.send(Err(e));
                return;
            }
        };
        let started = Started {
            pid,
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            counters,
            meter,
            started_unix_ms,
            start,
            waiter,
        };
        if started_tx.send(Ok(started)).is_err() {
            // The runner is gone: stop the workload rather than leave it.
            signal_group(pid, Signal::KILL);
        }
        let _ = exit_tx.send(wait_exit(child, pid, proc_root));
    });
    if let Err(e) = thread {
        return Err(format!("cannot start the trial's thread: {e}"));
    }
    started_rx.recv().unwrap_or_else(|_| Err("the trial's thread ended before the workload started".into()))
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
    let meter = energy::start_or_estimate(cfg.energy.as_ref(), cfg.energy_model);
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
fn spawn(cfg: &RunnerConfig, run: &TrialRun) -> Result<Spawned, Box<Measurement>> {
    let spec = &run.spec;
    let prepared = prepare_limits(cfg, run);
    let energy = cfg.energy.as_ref();
    let refused = |limits, reason| Box::new(not_started(unix_ms(SystemTime::now()), limits, reason, energy));
    if spec.argv.is_empty() {
        return Err(refused(prepared.limits, "empty argv".into()));
    }
    let control = spec.probe.as_ref().is_some_and(|p| p.control);
    // Without a cgroup to enter or an address-space limit to set before the
    // exec, the workload is started directly by a thread of its own (one
    // exec); otherwise through the exec wrapper, held until "go".
    let direct = prepared.cgroup.is_none() && prepared.rlimit_as.is_none() && !cfg.always_wrap;
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
    let interval = energy::sampling_interval(cfg.sample_interval, energy);
    let started = if direct {
        let meter = energy::start_or_estimate(energy, cfg.energy_model);
        match start_direct(cmd, run.cpus.clone(), cfg.proc_root.clone(), meter) {
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
    let (tx, output) = mpsc::channel::<OutputEvent>(1024);
    // Kept open as the control channel, or closed: the workload reads /dev/null.
    let control = stdin.filter(|_| control);
    spawn_reader(stdout, false, start, &tx);
    spawn_reader(stderr, true, start, &tx);
    drop(tx);
    let members = match &prepared.cgroup {
        Some(cg) => procfs::Members::Cgroup(cg.path().join("cgroup.procs")),
        None => procfs::Members::Group(pid.as_raw_nonzero().get()),
    };
    let rss = procfs::RssSampler::spawn(cfg.proc_root.clone(), members.clone(), RSS_SAMPLE_INTERVAL);
    let registration = cfg.trials.register(members.clone());
    let pipeline = Pipeline::new(spec.probe.clone(), spec.system.clone(), run.cpus.clone());
    let mut cpu_pool = run.cpus.clone();
    cpu_pool.extend(crate::sched::allowed_cpus().into_iter().filter(|c| !run.cpus.contains(c)));
    Ok(Spawned {
        pid,
        prepared,
        counters,
        meter,
        interval,
        started_unix_ms,
        start,
        output,
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
        profile_unsent: false,
    })
}

/// Watches a running workload until it has exited and its output closed:
/// metric lines (forwarded as progress), energy and counter samples, the
/// timeout, and the control input; stops the process group when told to or
/// when time is up.
async fn monitor(
    cfg: &RunnerConfig,
    spec: &TrialSpec,
    t: &mut Spawned,
    progress: Option<mpsc::Sender<EpochReport>>,
    mut control: ControlInput,
) -> Monitored {
    let timeout = (spec.timeout_ms > 0).then(|| Duration::from_millis(spec.timeout_ms));
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::ZERO));
    tokio::pin!(deadline);
    let mut measure_tick = tokio::time::interval_at(tokio::time::Instant::now() + t.interval, t.interval);
    measure_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 86_400);
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut output_deadline: Option<tokio::time::Instant> = None;
    let mut m = Monitored { exited: None, stopped: None, collected: Collected::default(), peak_rss: None };
    let mut readers_open = true;
    let (pid, pgid) = (t.pid, t.pid.as_raw_nonzero().get());
    loop {
        if m.exited.is_some() && !readers_open {
            break;
        }
        tokio::select! {
            res = &mut t.waiter, if m.exited.is_none() => {
                m.exited = Some(match res {
                    Ok(Ok(e)) => Ok(e),
                    Ok(Err(e)) => Err(format!("waiting for the workload failed: {e}")),
                    Err(_) => Err("the thread waiting for the workload ended without a word".to_string()),
                });
                m.peak_rss = t.rss.stop();
                // The leader as a zombie: its CPU time and its waited-for children's.
                let final_ticks = match &m.exited {
                    Some(Ok(Exited { stat: Some(s), .. })) => Some(s.utime + s.stime + s.cutime + s.cstime),
                    _ => None,
                };
                t.registration.end(final_ticks);
                let at_exit = t.start.elapsed();
                t.meter.sample(at_exit);
                t.counters.sample(at_exit);
                output_deadline = Some(tokio::time::Instant::now() + cfg.output_grace);
            }
            event = t.output.recv(), if readers_open => match event {
                Some(event) => {
                    let mut profile = None;
                    match &event {
                        OutputEvent::Epoch { epoch, elapsed_us, .. } => {
                            on_epoch_boundary(cfg, t, *epoch, *elapsed_us);
                            profile_first_window(cfg, t);
                            if t.profile_unsent {
                                t.profile_unsent = false;
                                profile = t.window_profile.clone();
                            }
                        }
                        OutputEvent::Step { elapsed_us } => {
                            on_step_boundary(cfg, t, *elapsed_us);
                            profile_first_window(cfg, t);
                        }
                        _ => {}
                    }
                    m.collected.take(event, progress.as_ref(), profile)
                }
                None => readers_open = false,
            },
            _ = &mut deadline, if timeout.is_some() && m.stopped.is_none() && m.exited.is_none() => {
                tracing::info!(pgid, "trial timed out; stopping its process group");
                m.stopped = Some(ExitOutcome::TimedOut);
                signal_group(pid, Signal::TERM);
                kill_at = Some(tokio::time::Instant::now() + cfg.kill_grace);
            }
            c = control.next(), if m.stopped.is_none() && m.exited.is_none() => match c {
                Control::Cancel => {
                    tracing::info!(pgid, "trial cancelled; stopping its process group");
                    m.stopped = Some(ExitOutcome::Cancelled);
                    signal_group(pid, Signal::TERM);
                    kill_at = Some(tokio::time::Instant::now() + cfg.kill_grace);
                }
                Control::Apply(system, role) => {
                    let at = t.start.elapsed();
                    let epoch = t.last_boundary.map_or(0, |b| b.epoch);
                    let b = boundary(cfg, t, epoch, micros(at));
                    let step = t.pipeline.reconfigure(b, system, role);
                    let line = apply_step(cfg, t, step);
                    // Thread counts change when the workload next listens.
                    t.pending_line.extend(line);
                }
            },
            _ = tokio::time::sleep_until(kill_at.unwrap_or(far)), if kill_at.is_some() && m.exited.is_none() => {
                signal_group(pid, Signal::KILL);
                kill_at = None;
            }
            _ = measure_tick.tick(), if m.exited.is_none() => {
                let elapsed = t.start.elapsed();
                t.meter.sample(elapsed);
                t.counters.sample(elapsed);
            }
            _ = tokio::time::sleep_until(output_deadline.unwrap_or(far)), if output_deadline.is_some() && readers_open => {
                tracing::warn!(pgid, "workload output still open after exit (an escaped process?); not waiting");
                break;
            }
        }
    }
    m
}

/// Once a pipelined trial's first window has closed: its profile, from the
/// counters (sampled at the window's end) and `/proc`, kept for the
/// measurement and sent with the next epoch's progress.
fn profile_first_window(cfg: &RunnerConfig, t: &mut Spawned) {
    if t.window_profile.is_some() {
        return;
    }
    let Some(window) = t.pipeline.first_window() else { return };
    let pids = crate::live::trial_processes(&cfg.proc_root, &t.members);
    let after = procfs::proc_counts(&cfg.proc_root, &pids);
    // The first window starts with the workload: its counts are all it did.
    let profile = Profile::window(&t.counters.totals(), Some(&procfs::ProcCounts::default()), &after, window.wall_us);
    tracing::debug!(epochs = window.epochs(), wall_us = window.wall_us, "first window profiled");
    t.window_profile = Some(WindowProfile {
        system: window.system.clone(),
        epochs: window.epochs(),
        steps: window.steps,
        wall_us: window.wall_us,
        profile,
    });
    t.profile_unsent = true;
}

/// Energy and CPU time counted so far, sampled now, at epoch `epoch`
/// that ended `at_us` after the start.
fn boundary(cfg: &RunnerConfig, t: &mut Spawned, epoch: u32, at_us: u64) -> Boundary {
    let now = t.start.elapsed();
    t.meter.sample(now);
    t.counters.sample(now);
    // task-clock counts nanoseconds of CPU time of the whole trial.
    let cpu_us = t.counters.total("task-clock").map(|ns| (ns / 1000.0) as u64);
    let cores = match t.pipeline.current().cores {
        Some(n) => n,
        None => cfg.machine_cpus,
    };
    let usage = Usage { wall: now, cpu: Duration::from_micros(cpu_us.unwrap_or(0)), cores };
    Boundary { at_us, epoch, joules: t.meter.so_far(&usage), cpu_us }
}

/// An epoch line: the pipeline may end a window and switch configuration;
/// the change is applied to the live process tree before the workload,
/// when it speaks the control channel, is told to go on.
fn on_epoch_boundary(cfg: &RunnerConfig, t: &mut Spawned, epoch: u32, at_us: u64) {
    let b = boundary(cfg, t, epoch, at_us);
    t.last_boundary = Some(b);
    let step = t.pipeline.on_epoch(b);
    let mut line = std::mem::take(&mut t.pending_line);
    line.extend(apply_step(cfg, t, step));
    if let Some(w) = t.control.as_mut() {
        let text = format!("{}\n", line.join(" "));
        if let Err(e) = w.write_all(text.as_bytes()).and_then(|()| w.flush()) {
            tracing::warn!(error = %e, "the workload's control channel closed; no more live thread changes");
            t.control = None;
        }
    }
}

/// A step line of a trial whose probe windows count steps: a window may
/// end and the configuration change (applied at once; the workload does
/// not wait, so the switch lands within the next step).
fn on_step_boundary(cfg: &RunnerConfig, t: &mut Spawned, at_us: u64) {
    if t.pipeline.unit() != Some(tunefleet_common::message::WindowUnit::Steps) || !t.pipeline.probing() {
        return;
    }
    let epoch = t.last_boundary.map_or(0, |b| b.epoch);
    let b = boundary(cfg, t, epoch, at_us);
    let step = t.pipeline.on_step(b);
    // Thread counts cannot change within an epoch (refused at check time).
    let _ = apply_step(cfg, t, step);
}

/// Applies `step` to the running trial: CPU affinity of every thread (and
/// the cgroup's cpuset), the memory limit (cgroup or `RLIMIT_AS`), and the
/// thread count as control-channel settings (returned, to be sent when the
/// workload next listens). What cannot be applied is logged, never fatal.
fn apply_step(cfg: &RunnerConfig, t: &mut Spawned, step: Step) -> Vec<String> {
    let Step::Apply(system) = step else { return Vec::new() };
    let mut line = Vec::new();
    if let Some(n) = system.cores {
        let cpus: Vec<u32> = t.cpu_pool.iter().copied().take(n.max(1) as usize).collect();
        if let Some(cg) = &t.prepared.cgroup {
            if cg.controllers().cpuset {
                if let Err(e) = cg.set_cpus(&cpus) {
                    tracing::warn!(error = %e, "cannot set the trial cgroup's cpuset");
                }
            }
        }
        match crate::live::set_affinity(&cfg.proc_root, &t.members, &cpus) {
            Ok(threads) => {
                tracing::debug!(?cpus, threads, "trial re-pinned");
                t.pipeline.set_cpus(cpus);
            }
            Err(e) => tracing::warn!(error = %e, ?cpus, "cannot re-pin the trial"),
        }
    }
    if let Some(threads) = system.threads {
        line.push(format!("threads={threads}"));
    }
    if let Some(mib) = system.memory_mib {
        let bytes = mib.saturating_mul(1 << 20);
        let done = match &t.prepared.cgroup {
            Some(cg) => cg.set_memory_max(Some(bytes)).map_err(|e| e.to_string()),
            None => crate::live::set_memory_rlimit(&cfg.proc_root, &t.members, Some(bytes))
                .map(|_| ())
                .map_err(|e| e.to_string()),
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, mib, "cannot change the trial's memory limit");
        }
    }
    line
}

/// The measurement of a trial that ran: times, exit, counters, profile,
/// energy, metrics and the log tail.
fn assemble(cfg: &RunnerConfig, run: &TrialRun, t: Spawned, m: Monitored) -> Measurement {
    let Spawned {
        prepared,
        counters,
        meter,
        started_unix_ms,
        start,
        output,
        rss,
        pipeline,
        last_boundary,
        window_profile,
        ..
    } = t;
    let Monitored { exited, stopped, mut collected, peak_rss } = m;
    drop(output);
    let peak_rss = peak_rss.or_else(|| rss.stop());
    if let Some(cg) = prepared.cgroup {
        cg.remove();
    }
    let ticks = rustix::param::clock_ticks_per_second();
    let (wall, user_us, sys_us, status) = match &exited {
        Some(Ok(e)) => {
            let (user, sys) = e.stat.map_or((0, 0), |s| {
                (procfs::ticks_to_us(s.utime + s.cutime, ticks), procfs::ticks_to_us(s.stime + s.cstime, ticks))
            });
            (e.at.saturating_duration_since(start), user, sys, Some(e.status))
        }
        _ => (start.elapsed(), 0, 0, None),
    };
    let crate::counters::CounterOutcome { readings: counters, missing: mut counters_missing, series: counter_series } =
        counters.finish(wall);
    let exit = match (stopped, status, &exited) {
        (Some(outcome), _, _) => outcome,
        (None, Some(status), _) => match (status.code(), collected.exec_failed.take()) {
            (Some(EXIT_EXEC_FAILED), Some(reason)) => ExitOutcome::SpawnFailed(reason),
            (Some(code), _) => ExitOutcome::Exited(code),
            (None, _) => ExitOutcome::Signaled(status.signal().unwrap_or(0)),
        },
        (None, None, Some(Err(reason))) => ExitOutcome::SpawnFailed(reason.clone()),
        (None, None, _) => ExitOutcome::SpawnFailed("the workload's end was not observed".into()),
    };
    if matches!(exit, ExitOutcome::SpawnFailed(_)) {
        // Counters of a workload that never ran say nothing.
        counters_missing = CounterSet::all_missing("the workload did not start").finish(Duration::ZERO).missing;
    }
    let spawn_failed = matches!(exit, ExitOutcome::SpawnFailed(_));
    let counters = if spawn_failed { Vec::new() } else { counters };
    let counter_series = if spawn_failed { Vec::new() } else { counter_series };
    let profile = Profile::derive(&counters, &counter_series, micros(wall));
    let cores = if run.cpus.is_empty() { cfg.machine_cpus } else { u32::try_from(run.cpus.len()).unwrap_or(u32::MAX) };
    let usage = Usage { wall, cpu: Duration::from_micros(user_us + sys_us), cores };
    let end = last_boundary.unwrap_or_else(|| Boundary {
        at_us: micros(wall),
        epoch: 0,
        joules: meter.so_far(&usage),
        cpu_us: Some(user_us + sys_us),
    });
    let (segments, selected) = pipeline.finish(end);
    let energy = meter.stop(wall, &usage);
    if collected.epochs_dropped > 0 {
        let note =
            format!("[tunefleet: {} epoch lines beyond the first {MAX_EPOCHS} not kept]", collected.epochs_dropped);
        collected.tail.push(&note, false);
    }
    let final_metrics = collected
        .final_metrics
        .take()
        .or_else(|| collected.epochs.last().map(|e| e.metrics.clone()))
        .unwrap_or_default();
    let missing: Vec<MissingCounter> = counters_missing;
    Measurement {
        started_unix_ms,
        wall_us: micros(wall),
        user_us,
        sys_us,
        max_rss_kib: peak_rss.unwrap_or(0),
        exit,
        epochs: collected.epochs,
        final_metrics,
        counters,
        counters_missing: missing,
        counter_series,
        profile,
        energy,
        limits: prepared.limits,
        log_tail: collected.tail.render(),
        segments,
        selected,
        window_profile,
        interference: Vec::new(),
    }
}
