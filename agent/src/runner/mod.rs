//! Runs one trial for real and measures it.
//!
//! The workload runs in its own process group. A trial without a memory
//! limit is started directly, one `exec`, by a thread of the agent's pool
//! ([`launcher`]: kept for the next trial once this one's counters are
//! closed) that pins itself to the trial's CPUs and opens the perf counters on what it starts
//! ([`crate::counters`]; each counter is enabled at the workload's exec), then
//! waits for its end. A trial with a memory limit is started through the
//! exec wrapper ([`crate::exec`]), held until the runner has moved it into
//! the trial's cgroup when cgroup v2 limits memory ([`crate::cgroup`]) and
//! opened the counters on it; otherwise the wrapper applies `RLIMIT_AS`
//! itself. (Entering a cgroup or setting a limit of the child's own between
//! fork and exec needs `clone3(CLONE_INTO_CGROUP)` or a `pre_exec` hook,
//! which std offers only as `unsafe`; the agent has no `unsafe`.) Standard output and error are read line by
//! line by two tasks of the agent's event loop with bounded memory ([`crate::output`]); metric lines
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
//! [`RSS_SAMPLE_INTERVAL`] and keeps the largest. The first sample (the
//! leader alone, its resident set from `statm`, one small read) is taken as
//! the workload starts; the next
//! ones scan `/proc`, blocking I/O, so they run on a thread of its own
//! ([`crate::procfs::RssSampler`]), not on the runtime thread, started only
//! once the trial has run for an interval (a trial of a few milliseconds
//! costs no thread). Growth in the last interval before a process exits
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

mod assemble;
mod child;
mod control;
mod launcher;
mod output;
mod start;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::sync::{mpsc, oneshot};
use tunefleet_common::measurement::{ExitOutcome, Measurement};
use tunefleet_common::message::TrialSpec;

use assemble::{assemble, Ended, Monitored};
use child::{signal_group, Exited};
use control::{apply_step, boundary, on_epoch_boundary, on_step_boundary, profile_first_window, Disturbed};
use output::{micros, Collected, OutputEvent};
use start::{spawn, Spawned};

pub use control::{Control, ControlInput, TrialHandle};
pub use launcher::{Launchers, IDLE_KEEP};
pub use output::{EpochReport, MAX_EPOCHS};
pub use start::{RunnerConfig, TrialRun, CONTROL_VAR, RSS_SAMPLE_INTERVAL, STEPS_VAR, THREAD_VARS};

/// How long after a trial killed by SIGTERM the agent may say it is
/// stopping for the trial to count as stopped with it (a batch scheduler
/// signals the processes of a job one after the other).
const STOPPED_WITH_AGENT: Duration = Duration::from_millis(500);

/// Runs `run` to completion (or timeout, or [`Control::Cancel`] from its
/// [`TrialHandle`]) and measures it: `spawn`, `monitor`, `assemble`.
/// Epochs are also sent to `progress` as they are printed. Never fails: a
/// workload that cannot start is a measurement with `SpawnFailed`.
pub async fn run_trial(
    cfg: &RunnerConfig,
    run: &TrialRun,
    progress: Option<mpsc::Sender<EpochReport>>,
    control: ControlInput,
) -> Measurement {
    launch(cfg, run).finish(cfg, run, progress, control, None).await
}

/// A trial whose workload was started (or could not be), for
/// [`Launched::finish`] to watch and measure.
pub struct Launched(Result<Spawned, Box<Measurement>>);

/// Starts `run`'s workload now: when this returns its process exists (or
/// its start failed), whatever the caller does before it awaits
/// [`Launched::finish`] (the agent keeps the result of the trial before it
/// on disk meanwhile: the slot is not idle during that sync).
pub fn launch(cfg: &RunnerConfig, run: &TrialRun) -> Launched {
    Launched(spawn(cfg, run))
}

impl Launched {
    /// Watches the workload to its end and measures it (`monitor`,
    /// `assemble`); `cfg` and `run` are those it was launched with. `exited`
    /// is told the moment the workload's top process exits, before its
    /// output is drained and its measurement put together (a workload that
    /// never started never tells it).
    pub async fn finish(
        self,
        cfg: &RunnerConfig,
        run: &TrialRun,
        progress: Option<mpsc::Sender<EpochReport>>,
        control: ControlInput,
        exited: Option<oneshot::Sender<()>>,
    ) -> Measurement {
        match self.0 {
            Ok(mut spawned) => {
                let monitored = monitor(cfg, &run.spec, &mut spawned, progress, control, exited).await;
                assemble(cfg, &run.cpus, ended(spawned, monitored))
            }
            Err(not_started) => *not_started,
        }
    }
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
    mut exited: Option<oneshot::Sender<()>>,
) -> Monitored {
    let timeout = (spec.timeout_ms > 0).then(|| Duration::from_millis(spec.timeout_ms));
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::ZERO));
    tokio::pin!(deadline);
    let mut measure_tick = tokio::time::interval_at(tokio::time::Instant::now() + t.interval, t.interval);
    measure_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let far = tokio::time::Instant::now() + Duration::from_secs(365 * 86_400);
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut output_deadline: Option<tokio::time::Instant> = None;
    let mut m = Monitored {
        exited: None,
        stopped: None,
        collected: Collected::default(),
        peak_rss: None,
        disturbed: Disturbed::default(),
    };
    let mut readers_open = true;
    let rss_thread_at = tokio::time::Instant::now() + RSS_SAMPLE_INTERVAL;
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
                if let Some(tx) = exited.take() {
                    let _ = tx.send(());
                }
                on_exit(cfg, t, &mut m);
                output_deadline = Some(tokio::time::Instant::now() + cfg.output_grace);
            }
            event = t.output.recv(), if readers_open => match event {
                Some(event) => on_output(cfg, t, &mut m, event, progress.as_ref()),
                None => readers_open = false,
            },
            _ = &mut deadline, if timeout.is_some() && m.stopped.is_none() && m.exited.is_none() => {
                tracing::info!(pgid, "trial timed out; stopping its process group");
                kill_at = Some(stop(cfg, pid, &mut m, ExitOutcome::TimedOut));
            }
            c = control.next() => match c {
                // What disturbed it is noted until the end; a cancel or a
                // new configuration is moot once it stops.
                c if m.disturbed.note(&c) || m.stopped.is_some() || m.exited.is_some() => {}
                Control::Cancel => {
                    tracing::info!(pgid, "trial cancelled; stopping its process group");
                    kill_at = Some(stop(cfg, pid, &mut m, ExitOutcome::Cancelled));
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
                Control::ForeignLoad(_) | Control::Conditions(_) => {}
            },
            _ = tokio::time::sleep_until(kill_at.unwrap_or(far)), if kill_at.is_some() && m.exited.is_none() => {
                signal_group(pid, Signal::KILL);
                kill_at = None;
            }
            _ = tokio::time::sleep_until(rss_thread_at), if t.rss.deferred() && m.exited.is_none() => {
                t.rss.continue_on_thread();
            }
            _ = measure_tick.tick(), if m.exited.is_none() => {
                let elapsed = t.start.elapsed();
                t.meters.sample(elapsed);
                t.counters.sample(elapsed);
            }
            _ = tokio::time::sleep_until(output_deadline.unwrap_or(far)), if output_deadline.is_some() && readers_open => {
                tracing::warn!(pgid, "workload output still open after exit (an escaped process?); not waiting");
                break;
            }
        }
    }
    for c in control.queued() {
        m.disturbed.note(&c);
    }
    if stopped_with_agent(cfg, &m).await {
        m.stopped = Some(ExitOutcome::Cancelled);
    }
    m
}

/// Whether a workload ended by a SIGTERM it was not sent by its monitor
/// was stopped with the agent: a batch scheduler stopping the job
/// (Slurm's scancel, a time limit) or systemd stopping the unit signals
/// every process in it, the workload's just before the agent's own, so
/// the agent says it is stopping within [`STOPPED_WITH_AGENT`]. Such a
/// trial is cancelled (run again elsewhere), not a failure of the
/// workload.
async fn stopped_with_agent(cfg: &RunnerConfig, m: &Monitored) -> bool {
    let by_sigterm = matches!(&m.exited, Some(Ok(e)) if e.status.signal() == Some(Signal::TERM.as_raw()));
    let Some(mut stopping) = cfg.agent_stopping.clone().filter(|_| by_sigterm && m.stopped.is_none()) else {
        return false;
    };
    tokio::time::timeout(STOPPED_WITH_AGENT, stopping.wait_for(|s| *s)).await.is_ok_and(|r| r.is_ok())
}

/// The workload's top process exited (`m.exited` says how): its peak RSS
/// and CPU time taken, and the meter and counters sampled for the last time.
fn on_exit(cfg: &RunnerConfig, t: &mut Spawned, m: &mut Monitored) {
    m.peak_rss = t.rss.stop();
    // The leader as a zombie: its CPU time and its waited-for children's.
    let final_ticks = match &m.exited {
        Some(Ok(Exited { stat: Some(s), .. })) => Some(s.utime + s.stime + s.cutime + s.cstime),
        _ => None,
    };
    t.registration.end(final_ticks);
    let at_exit = t.start.elapsed();
    // Nothing is measured after this: a boundary read later (buffered
    // output) takes the totals at the exit, not what the machine did
    // meanwhile (the next trial starting).
    t.exited_at = Some(at_exit);
    if t.machine_busy_us.0.is_some() {
        t.machine_busy_us.1 = crate::telemetry::machine_busy_us(&cfg.proc_root);
    }
    t.meters.sample(at_exit);
    t.counters.sample(at_exit);
}

/// A line of the workload's output: an epoch or step boundary closes a
/// probe window (the first window's profile goes out with the epoch's
/// progress), and the line is collected.
fn on_output(
    cfg: &RunnerConfig,
    t: &mut Spawned,
    m: &mut Monitored,
    event: OutputEvent,
    progress: Option<&mpsc::Sender<EpochReport>>,
) {
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
    m.collected.take(event, progress, profile)
}

/// Stops the workload's process group (SIGTERM) for `why`; returns when
/// it is to be killed.
fn stop(cfg: &RunnerConfig, pid: Pid, m: &mut Monitored, why: ExitOutcome) -> tokio::time::Instant {
    m.stopped = Some(why);
    signal_group(pid, Signal::TERM);
    tokio::time::Instant::now() + cfg.kill_grace
}

/// Lets a trial that ran go: closes its output, stops its RSS sampler (its
/// last sample counts when the exit was never seen) and removes its cgroup;
/// what is left is for [`assemble`].
fn ended(t: Spawned, m: Monitored) -> Ended {
    let Spawned {
        prepared,
        counters,
        meters,
        machine_busy_us,
        started_unix_ms,
        start,
        output,
        readers,
        rss,
        pipeline,
        last_boundary,
        window_profile,
        ..
    } = t;
    drop(output);
    // A reader still waiting on a pipe an escaped process holds open.
    for reader in readers {
        reader.abort();
    }
    let peak_rss = m.peak_rss.or_else(|| rss.stop());
    if let Some(cg) = prepared.cgroup {
        cg.remove();
    }
    Ended {
        started_unix_ms,
        start,
        limits: prepared.limits,
        counters,
        meters,
        machine_busy_us,
        pipeline,
        last_boundary,
        window_profile,
        monitored: Monitored { peak_rss, ..m },
    }
}
