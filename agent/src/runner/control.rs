//! The control channel and live reconfiguration of a running trial: what
//! the agent tells it through its [`TrialHandle`] (cancel, a new system
//! configuration), and the changes its pipeline decides at epoch and step
//! boundaries, applied to the live process tree ([`crate::live`], the
//! cgroup) and, for thread counts, written to the workload's standard input
//! when it speaks the control channel (docs/PROTOCOL.md, "Control channel").

use std::io::Write;
use std::time::Duration;

use tokio::sync::mpsc;
use tunefleet_common::measurement::{SegmentRole, WindowProfile};
use tunefleet_common::params::SystemParams;
use tunefleet_common::profile::Profile;

use super::start::{RunnerConfig, Spawned};
use crate::energy::Usage;
use crate::pipeline::{Boundary, Step};
use crate::procfs;

/// What the agent can tell a running trial through its [`TrialHandle`].
#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    /// Stop it: SIGTERM to its process group, SIGKILL after the grace; the
    /// measurement says `Cancelled`.
    Cancel,
    /// Run under this system configuration from now on (a new segment).
    Apply(SystemParams, SegmentRole),
    /// A telemetry sample taken while it ran saw this load from outside it
    /// (a share of the agent's CPUs): the largest one flags its measurement
    /// past the agent's threshold.
    ForeignLoad(f64),
    /// The device's conditions turned bad for measuring while it ran
    /// (charging, throttled...): its measurement is flagged with them.
    Conditions(Vec<String>),
}

/// What disturbed a trial while it ran, as it was told: known when its
/// measurement is assembled, so the measurement is complete then.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Disturbed {
    /// The largest load from outside it a sample saw.
    pub(super) foreign_peak: Option<f64>,
    /// Bad device conditions, each once, in the order they came.
    pub(super) conditions: Vec<String>,
}

impl Disturbed {
    /// Notes `control` when it says what disturbed the trial; false for
    /// any other control.
    pub(super) fn note(&mut self, control: &Control) -> bool {
        match control {
            Control::ForeignLoad(f) if f.is_finite() => {
                self.foreign_peak = Some(self.foreign_peak.map_or(*f, |p| p.max(*f)));
            }
            Control::ForeignLoad(_) => {}
            Control::Conditions(reasons) => {
                for reason in reasons {
                    if !self.conditions.contains(reason) {
                        self.conditions.push(reason.clone());
                    }
                }
            }
            Control::Cancel | Control::Apply(..) => return false,
        }
        true
    }
}

/// The agent's handle on one running trial: the sending side of its
/// control input. Dropping every handle leaves the trial running.
#[derive(Debug, Clone)]
pub struct TrialHandle {
    tx: mpsc::UnboundedSender<Control>,
}

/// The trial's side of its control input (see `run_trial`).
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
    /// What is queued now, without waiting (what was said about a trial
    /// after its monitor stopped listening).
    pub(super) fn queued(&mut self) -> Vec<Control> {
        let mut out = Vec::new();
        while let Ok(c) = self.rx.try_recv() {
            out.push(c);
        }
        out
    }

    /// The next control; pending forever once every handle is gone.
    pub(super) async fn next(&mut self) -> Control {
        if self.open {
            if let Some(c) = self.rx.recv().await {
                return c;
            }
            self.open = false;
        }
        std::future::pending().await
    }
}

/// Once a pipelined trial's first probe window has closed: its profile,
/// from the counters (sampled at the window's end) and `/proc`, counted
/// from the end of the warm-up (the start-up is no part of what a job is
/// recognised by), kept for the measurement and sent with the next
/// epoch's progress.
pub(super) fn profile_first_window(cfg: &RunnerConfig, t: &mut Spawned) {
    if t.window_profile.is_some() {
        return;
    }
    if t.window_base.is_none() && t.pipeline.first_window_open_after_warmup() {
        let pids = crate::live::trial_processes(&cfg.proc_root, &t.members);
        t.window_base = Some((t.counters.totals(), procfs::proc_counts(&cfg.proc_root, &pids)));
    }
    let Some(window) = t.pipeline.first_window() else { return };
    let pids = crate::live::trial_processes(&cfg.proc_root, &t.members);
    let after = procfs::proc_counts(&cfg.proc_root, &pids);
    // Without a warm-up the first window starts with the workload: its counts are all it did.
    let (before_counters, before) = t.window_base.take().unwrap_or_default();
    let counters: Vec<_> = t
        .counters
        .totals()
        .into_iter()
        .map(|mut c| {
            let base = before_counters.iter().find(|b| b.event == c.event).map_or(0, |b| b.value);
            c.value = c.value.saturating_sub(base);
            c
        })
        .collect();
    let profile = Profile::window(&counters, Some(&before), &after, window.wall_us);
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

/// Energy and CPU time counted so far, sampled now (or at the exit, once
/// the workload exited), at epoch `epoch` that ended `at_us` after the start.
pub(super) fn boundary(cfg: &RunnerConfig, t: &mut Spawned, epoch: u32, at_us: u64) -> Boundary {
    // After the exit, the totals at the exit (sampled then).
    let now = match t.exited_at {
        Some(at_exit) => at_exit,
        None => {
            let now = t.start.elapsed();
            t.meters.machine.sample(now);
            t.counters.sample(now);
            now
        }
    };
    // task-clock counts nanoseconds of CPU time of the whole trial.
    let cpu_us = t.counters.total("task-clock").map(|ns| (ns / 1000.0) as u64);
    let cores = match t.pipeline.current().cores {
        Some(n) => n,
        None => cfg.machine_cpus,
    };
    let usage = Usage { wall: now, cpu: Duration::from_micros(cpu_us.unwrap_or(0)), cores };
    Boundary { at_us, epoch, joules: t.meters.so_far(&usage), cpu_us }
}

/// An epoch line: the pipeline may end a window and switch configuration;
/// the change is applied to the live process tree before the workload,
/// when it speaks the control channel, is told to go on.
pub(super) fn on_epoch_boundary(cfg: &RunnerConfig, t: &mut Spawned, epoch: u32, at_us: u64) {
    // Probing over and nothing to change: the workload goes on at once,
    // while the boundary is sampled (it waits for this line).
    let early = !t.pipeline.probing() && t.pending_line.is_empty();
    if early {
        answer(t, &[]);
    }
    let b = boundary(cfg, t, epoch, at_us);
    t.last_boundary = Some(b);
    let step = t.pipeline.on_epoch(b);
    let mut line = std::mem::take(&mut t.pending_line);
    line.extend(apply_step(cfg, t, step));
    if early {
        // Outside probing the pipeline changes nothing at an epoch.
        if !line.is_empty() {
            t.pending_line = line;
        }
    } else {
        answer(t, &line);
    }
}

/// Writes one control line (the settings `line`, empty: go on) when the
/// workload speaks the control channel.
fn answer(t: &mut Spawned, line: &[String]) {
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
pub(super) fn on_step_boundary(cfg: &RunnerConfig, t: &mut Spawned, at_us: u64) {
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
pub(super) fn apply_step(cfg: &RunnerConfig, t: &mut Spawned, step: Step) -> Vec<String> {
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
