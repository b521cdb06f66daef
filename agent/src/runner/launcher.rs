//! The threads that start workloads directly, kept for the next trial.
//!
//! A workload started directly (one exec) is started by a thread that pins
//! itself to the trial's CPUs and opens the trial's counters on itself,
//! inherited by what it spawns and enabled at the exec; the thread then
//! waits for the workload's top process to end. Such a thread must start
//! nothing else while those counters are open (a second workload would
//! inherit them too), so it takes the next trial only once the first one's
//! [`CounterSet`] is dropped: the set holds the sending half of a channel
//! the thread waits on ([`CounterSet::released_to`]). Until then another
//! thread of the pool starts the next trial (a held trial starts as the
//! previous one's top process exits, before its measurement is assembled,
//! so a slot alternates between two threads). A thread idle for
//! [`IDLE_KEEP`] ends. Creating a thread and ending it cost about a tenth
//! of the agent's CPU time per trial at 1,000 short trials a second.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustix::process::Signal;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use tokio::sync::oneshot;

use super::child::{child_pid, signal_group, unix_ms, wait_exit, Exited, Started};
use crate::counters::CounterSet;
use crate::energy;

/// How long a thread of the pool waits for another trial before it ends.
pub const IDLE_KEEP: Duration = Duration::from_secs(10);

/// The pool (one an agent, shared by its slots through [`super::RunnerConfig`]).
#[derive(Debug)]
pub struct Launchers {
    /// How long a thread waits for another trial before it ends.
    keep: Duration,
    /// The idle threads, each by its number and the sending half of its
    /// job channel.
    idle: Mutex<Vec<(u64, Sender<Spawn>)>>,
    /// Threads started so far.
    threads: AtomicU64,
}

/// One workload to start: what the thread needs, and where it answers.
struct Spawn {
    cmd: Command,
    cpus: Vec<u32>,
    meter: Box<dyn energy::EnergyMeter>,
    started: mpsc::SyncSender<Result<Started, String>>,
    /// Where the top process's end is told, and what the runner waits on.
    exit: oneshot::Sender<std::io::Result<Exited>>,
    waiter: oneshot::Receiver<std::io::Result<Exited>>,
    proc_root: PathBuf,
}

impl std::fmt::Debug for Spawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spawn").field("cmd", &self.cmd).field("cpus", &self.cpus).finish_non_exhaustive()
    }
}

impl Default for Launchers {
    fn default() -> Self {
        Launchers::keeping(IDLE_KEEP)
    }
}

impl Launchers {
    /// A pool whose threads end once idle for `keep`.
    pub fn keeping(keep: Duration) -> Self {
        Launchers { keep, idle: Mutex::default(), threads: AtomicU64::new(0) }
    }

    /// Threads the pool has started so far.
    pub fn threads_started(&self) -> u64 {
        self.threads.load(Ordering::Relaxed)
    }

    /// Hands `job` to an idle thread of the pool, or to a new one.
    fn dispatch(self: &Arc<Self>, mut job: Spawn) -> Result<(), String> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop();
            let Some((_, thread)) = idle else { break };
            // A listed thread takes its job (one that waited too long
            // leaves the list itself, or takes the job it was popped for);
            // one gone all the same gives it back.
            match thread.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::SendError(back)) => job = back,
            }
        }
        let (tx, rx) = mpsc::channel();
        let me = tx.clone();
        let pool = Arc::clone(self);
        let number = self.threads.fetch_add(1, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("tf-trial".into())
            .stack_size(256 << 10)
            .spawn(move || pool.serve(number, &rx, &me))
            .map_err(|e| format!("cannot start the trial's thread: {e}"))?;
        tx.send(job).map_err(|_| "the trial's thread ended before the workload started".to_string())
    }

    /// A thread of the pool: starts the jobs it is given, one at a time,
    /// each only once the counters of the one before are closed.
    fn serve(&self, number: u64, jobs: &Receiver<Spawn>, me: &Sender<Spawn>) {
        // What the thread may run on when a trial is not pinned.
        let unpinned = sched_getaffinity(None).ok();
        let mut pinned = false;
        loop {
            let job = match jobs.recv_timeout(self.keep) {
                Ok(job) => job,
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if let Some(i) = idle.iter().position(|(n, _)| *n == number) {
                        idle.swap_remove(i);
                        return;
                    }
                    drop(idle);
                    // Taken off the list by a dispatch: its job is coming.
                    match jobs.recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    }
                }
            };
            let Some(released) = start(job, &mut pinned, unpinned.as_ref()) else {
                // Its CPUs could not be set: a thread that might refuse the
                // next trial too ends instead.
                return;
            };
            // Disconnected once the trial's counters are dropped (or at once
            // when none were handed over).
            if let Some(released) = released {
                let _ = released.recv();
            }
            self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((number, me.clone()));
        }
    }
}

/// Starts one workload, hands it over and waits for its top process to
/// end; returns what tells when its counters are closed, `Some(None)` when
/// it did not start, and `None` when this thread's CPUs could not be set.
fn start(job: Spawn, pinned: &mut bool, unpinned: Option<&CpuSet>) -> Option<Option<Receiver<()>>> {
    if let Err(e) = pin(&job.cpus, pinned, unpinned) {
        let _ = job.started.send(Err(e));
        return None;
    }
    Some(spawn_counted(job))
}

/// Opens the counters on this thread, starts the job's command, hands it
/// over and waits for its top process to end; what tells when the
/// counters are closed, or `None` when it did not start.
fn spawn_counted(job: Spawn) -> Option<Receiver<()>> {
    let Spawn { mut cmd, meter, started: started_tx, exit, waiter, proc_root, .. } = job;
    let (release, released) = mpsc::channel();
    let counters = CounterSet::open_for_children().released_to(release);
    let started_unix_ms = unix_ms(SystemTime::now());
    let start = Instant::now();
    let program = cmd.get_program().to_owned();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = started_tx.send(Err(format!("cannot execute {program:?}: {e}")));
            return None;
        }
    };
    let pid = match child_pid(&mut child) {
        Ok(pid) => pid,
        Err(e) => {
            let _ = started_tx.send(Err(e));
            return None;
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
    if let Err(mpsc::SendError(unwanted)) = started_tx.send(Ok(started)) {
        // The runner is gone: stop the workload rather than leave it.
        signal_group(pid, Signal::KILL);
        drop(unwanted);
    }
    let _ = exit.send(wait_exit(child, pid, proc_root));
    Some(released)
}

/// Pins this thread to `cpus`, or back to where it started when `cpus` is
/// empty and an earlier trial pinned it.
fn pin(cpus: &[u32], pinned: &mut bool, unpinned: Option<&CpuSet>) -> Result<(), String> {
    if !cpus.is_empty() {
        crate::exec::pin_current_thread(cpus)?;
        *pinned = true;
    } else if *pinned {
        let set = unpinned.ok_or("cannot unpin the trial's thread: the CPUs it started on are unknown")?;
        sched_setaffinity(None, set).map_err(|e| format!("cannot unpin the trial's thread: {e}"))?;
        *pinned = false;
    }
    Ok(())
}

/// Starts the workload directly (one exec) from a thread of the pool: the
/// thread pins itself to the trial's CPUs (the workload inherits them),
/// opens the counters on the processes it will start (each enabled at its
/// exec), spawns, hands the workload over and then waits for its end.
/// `meter` was started just before.
pub(super) fn start_direct(
    pool: &Arc<Launchers>,
    cmd: Command,
    cpus: Vec<u32>,
    proc_root: PathBuf,
    meter: Box<dyn energy::EnergyMeter>,
) -> Result<Started, String> {
    let (started, started_rx) = mpsc::sync_channel(1);
    let (exit, waiter) = oneshot::channel();
    pool.dispatch(Spawn { cmd, cpus, meter, started, exit, waiter, proc_root })?;
    started_rx.recv().unwrap_or_else(|_| Err("the trial's thread ended before the workload started".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleep_for(pool: &Arc<Launchers>, seconds: &str) -> Started {
        let meter = energy::start_or_estimate(&energy::Estimate::default(), energy::EstimateModel::default());
        let mut cmd = Command::new("sleep");
        cmd.arg(seconds);
        start_direct(pool, cmd, Vec::new(), PathBuf::from("/proc"), meter).expect("started")
    }

    fn end(started: Started) {
        let Started { counters, waiter, .. } = started;
        let exited = waiter.blocking_recv().expect("exit sent").expect("exited");
        assert!(exited.status.success());
        drop(counters);
    }

    /// A thread with a trial's counters open starts no other trial, even
    /// once the trial's top process ended; once they are closed it is given
    /// the next one (no new thread a trial).
    #[test]
    fn a_thread_takes_the_next_trial_once_the_counters_of_the_last_are_closed() {
        let pool = Arc::new(Launchers::default());
        let Started { counters, waiter, .. } = sleep_for(&pool, "0");
        assert!(waiter.blocking_recv().expect("exit sent").expect("exited").status.success());
        assert_eq!(pool.threads_started(), 1);
        let second = sleep_for(&pool, "0");
        assert_eq!(pool.threads_started(), 2, "a thread with open counters took another trial");
        drop(counters);
        end(second);
        for _ in 0..5 {
            // Both threads go back to the pool once their trial's counters are closed.
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.idle.lock().expect("lock").len() < 2 {
                assert!(Instant::now() < deadline, "the threads never became idle again");
                std::thread::yield_now();
            }
            end(sleep_for(&pool, "0"));
        }
        assert_eq!(pool.threads_started(), 2, "idle threads were not reused");
    }

    /// A thread that waited too long leaves the list itself: a trial
    /// handed to it as it leaves is never lost (threads here end the
    /// moment they are idle, so every trial meets one leaving).
    #[test]
    fn no_trial_is_lost_to_a_thread_that_ends() {
        let pool = Arc::new(Launchers::keeping(Duration::ZERO));
        for _ in 0..1000 {
            end(sleep_for(&pool, "0"));
        }
    }
}
