//! A workload's process once started: what the runner holds of it, how
//! its end is waited for, and how its process group is signalled.

use std::path::PathBuf;
use std::process::{Child, ChildStdin, ExitStatus};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rustix::process::{kill_process_group, waitid, Pid, Signal, WaitId, WaitIdOptions};
use tokio::sync::oneshot;

use crate::counters::CounterSet;
use crate::energy;
use crate::procfs;

/// The top process's end, observed on a blocking thread.
#[derive(Debug)]
pub(super) struct Exited {
    pub(super) status: ExitStatus,
    pub(super) at: Instant,
    pub(super) stat: Option<procfs::StatFields>,
}

/// Waits for the leader to exit, reads its CPU times as a zombie, kills what
/// is left of its process group, then reaps it.
pub(super) fn wait_exit(mut child: Child, pid: Pid, proc_root: PathBuf) -> std::io::Result<Exited> {
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

pub(super) fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

pub(super) fn signal_group(pid: Pid, sig: Signal) {
    if let Err(e) = kill_process_group(pid, sig) {
        if e != rustix::io::Errno::SRCH {
            tracing::warn!(pgid = pid.as_raw_nonzero().get(), error = %e, "cannot signal the trial's process group");
        }
    }
}

/// A workload just started, with what watches it.
pub(super) struct Started {
    pub(super) pid: Pid,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) stdout: Option<std::process::ChildStdout>,
    pub(super) stderr: Option<std::process::ChildStderr>,
    pub(super) counters: CounterSet,
    pub(super) meter: Box<dyn energy::EnergyMeter>,
    pub(super) started_unix_ms: u64,
    pub(super) start: Instant,
    /// The leader's end, from the thread that waits for it.
    pub(super) waiter: oneshot::Receiver<std::io::Result<Exited>>,
}

/// The pid of a child just started; a child that has none as a positive
/// i32 (never, on Linux) is killed and reaped.
pub(super) fn child_pid(child: &mut Child) -> Result<Pid, String> {
    match i32::try_from(child.id()).ok().and_then(Pid::from_raw) {
        Some(pid) => Ok(pid),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            Err("invalid child pid".into())
        }
    }
}
