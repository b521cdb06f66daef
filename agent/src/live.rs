//! Changing a running trial's system parameters, for the runner to call at
//! the window boundaries of a pipelined trial. Each function acts on every
//! process (or thread) of the trial as [`procfs::Members`] finds them, and
//! skips those that exit meanwhile.
//!
//! * Cores: [`set_affinity`], `sched_setaffinity` on every thread. A new
//!   thread or process inherits its creator's mask, so setting every
//!   existing thread suffices; threads created during a pass are caught by
//!   listing again until no new one appears. When the trial has a cgroup
//!   with the `cpuset` controller, set `cpuset.cpus` first
//!   ([`crate::cgroup::TrialCgroup::set_cpus`]): an affinity outside the
//!   current cpuset is refused.
//! * Memory without a cgroup: [`set_memory_rlimit`], `prlimit(RLIMIT_AS)`
//!   on every process. It bounds address space, not resident memory, and
//!   lowering it below what a process has mapped reclaims nothing: only its
//!   later allocations fail. With a cgroup, use
//!   [`crate::cgroup::TrialCgroup::set_memory_max`] instead.
//! * Threads are an environment variable read at start: they change live
//!   only through the workload's control channel, not here.
//!
//! Sending these calls to another process needs the same user (or
//! `CAP_SYS_NICE` / `CAP_SYS_RESOURCE`). The exec wrapper sets only the soft
//! `RLIMIT_AS`, so it can be raised again without `CAP_SYS_RESOURCE`; raising
//! a hard limit needs it.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use rustix::io::Errno;
use rustix::process::{prlimit, Pid, Resource, Rlimit};
use rustix::thread::{sched_setaffinity, CpuSet};

use crate::procfs::{self, Members};

/// Listings of a trial's threads [`set_affinity`] makes at most.
pub const MAX_PASSES: usize = 8;

/// A live change that failed.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("no CPUs given for the trial")]
    NoCpus,
    #[error("CPU {cpu} is beyond the largest CPU set the kernel takes ({max} CPUs)")]
    CpuOutOfRange { cpu: u32, max: usize },
    #[error("cannot set the CPU affinity of thread {tid} of the trial to CPUs {cpus}: {source}")]
    Affinity {
        tid: i32,
        cpus: String,
        #[source]
        source: Errno,
    },
    #[error("cannot set RLIMIT_AS of process {pid} of the trial to {limit}: {source}")]
    Rlimit {
        pid: i32,
        limit: String,
        #[source]
        source: Errno,
    },
}

/// The kernel's CPU list format (`0-2,5`), ascending, each CPU once.
pub fn format_cpu_list(cpus: &[u32]) -> String {
    let set: BTreeSet<u32> = cpus.iter().copied().collect();
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for cpu in set {
        match ranges.last_mut() {
            Some((_, end)) if end.checked_add(1) == Some(cpu) => *end = cpu,
            _ => ranges.push((cpu, cpu)),
        }
    }
    let text: Vec<String> =
        ranges.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    text.join(",")
}

/// Parses the kernel's CPU list format (`Cpus_allowed_list`, `cpuset.cpus`);
/// `None` when malformed. An empty list is no CPU.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
        if a > b {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}

fn numeric_entries(dir: &Path) -> Vec<i32> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok())).collect()
}

/// Every process of the trial, ascending: those its `cgroup.procs` lists,
/// or the members of its process group (a scan of every process).
pub fn trial_processes(proc_root: &Path, members: &Members) -> Vec<i32> {
    let mut pids: Vec<i32> = match members {
        Members::Cgroup(procs) => fs::read_to_string(procs)
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default(),
        Members::Group(pgid) => numeric_entries(proc_root)
            .into_iter()
            .filter(|&pid| procfs::read_stat(proc_root, pid).map(|s| s.pgrp) == Some(*pgid))
            .collect(),
    };
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Every thread (tid, from `/proc/PID/task`) of every process of the trial,
/// ascending.
pub fn trial_tasks(proc_root: &Path, members: &Members) -> Vec<i32> {
    let mut tids: Vec<i32> = trial_processes(proc_root, members)
        .into_iter()
        .flat_map(|pid| numeric_entries(&proc_root.join(pid.to_string()).join("task")))
        .collect();
    tids.sort_unstable();
    tids.dedup();
    tids
}

/// The kernel's CPU set of `cpus`; refuses an empty list and CPUs beyond
/// what the kernel takes.
pub(crate) fn cpu_set(cpus: &[u32]) -> Result<CpuSet, LiveError> {
    if cpus.is_empty() {
        return Err(LiveError::NoCpus);
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        match usize::try_from(cpu) {
            Ok(i) if i < CpuSet::MAX_CPU => set.set(i),
            _ => return Err(LiveError::CpuOutOfRange { cpu, max: CpuSet::MAX_CPU }),
        }
    }
    Ok(set)
}

/// Pins every thread of every process of the trial to `cpus`; returns how
/// many threads were set. Threads that exit meanwhile are skipped. Lists the
/// threads again after each pass, setting only new ones, until a listing
/// shows none (at most [`MAX_PASSES`]): a thread created during a pass by a
/// thread not yet set has the old mask, one created after it by a set
/// thread inherits the new one.
pub fn set_affinity(proc_root: &Path, members: &Members, cpus: &[u32]) -> Result<usize, LiveError> {
    let set = cpu_set(cpus)?;
    let mut seen = BTreeSet::new();
    let mut count = 0;
    for _ in 0..MAX_PASSES {
        let new: Vec<i32> = trial_tasks(proc_root, members).into_iter().filter(|tid| !seen.contains(tid)).collect();
        if new.is_empty() {
            return Ok(count);
        }
        for tid in new {
            seen.insert(tid);
            let Some(pid) = Pid::from_raw(tid) else { continue };
            match sched_setaffinity(Some(pid), &set) {
                Ok(()) => count += 1,
                Err(Errno::SRCH) => {}
                Err(source) => return Err(LiveError::Affinity { tid, cpus: format_cpu_list(cpus), source }),
            }
        }
    }
    tracing::warn!(threads = count, passes = MAX_PASSES, "the trial kept creating threads while being pinned");
    Ok(count)
}

/// Sets the soft `RLIMIT_AS` (none: unlimited) of every process of the
/// trial, leaving the hard limit unlimited as the exec wrapper does, so a
/// later probe may raise it again without `CAP_SYS_RESOURCE`; returns how
/// many processes were set. A process whose hard limit is already lower
/// gets both set (raising it back then needs the capability). Processes
/// that exit meanwhile are skipped. Address space, not resident memory:
/// lowering it below what a process has mapped reclaims nothing, only its
/// later allocations (`mmap`, `brk`) fail.
pub fn set_memory_rlimit(proc_root: &Path, members: &Members, bytes: Option<u64>) -> Result<usize, LiveError> {
    let soft = Rlimit { current: bytes, maximum: None };
    let both = Rlimit { current: bytes, maximum: bytes };
    let mut count = 0;
    for pid in trial_processes(proc_root, members) {
        let Some(p) = Pid::from_raw(pid) else { continue };
        let set = match prlimit(Some(p), Resource::As, soft) {
            Err(Errno::PERM) => prlimit(Some(p), Resource::As, both),
            other => other,
        };
        match set {
            Ok(_) => count += 1,
            Err(Errno::SRCH) => {}
            Err(source) => {
                let limit = bytes.map_or_else(|| "unlimited".to_string(), |b| format!("{b} bytes"));
                return Err(LiveError::Rlimit { pid, limit, source });
            }
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Lines, Write};
    use std::os::unix::process::CommandExt;
    use std::process::{Child, ChildStdout, Command, Stdio};

    #[test]
    fn cpu_lists_round_trip() {
        assert_eq!(format_cpu_list(&[8, 0, 1, 2, 5, 7, 1]), "0-2,5,7-8");
        assert_eq!(format_cpu_list(&[]), "");
        assert_eq!(parse_cpu_list("0-2,5,7-8\n"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("3"), Some(vec![3]));
        assert_eq!(parse_cpu_list("\n"), Some(vec![]));
        assert_eq!(parse_cpu_list("2-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    /// A fixture process: its `stat` with process group `pgrp`, its threads.
    fn process(root: &Path, pid: i32, pgrp: i32, tids: &[i32]) {
        let dir = root.join(pid.to_string());
        for tid in tids {
            fs::create_dir_all(dir.join("task").join(tid.to_string())).expect("mkdir");
        }
        let stat = format!("{pid} (w) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 1 1 1");
        fs::write(dir.join("stat"), stat).expect("write");
    }

    #[test]
    fn finds_the_threads_of_a_fixture_trial() {
        let root = tempfile::tempdir().expect("tempdir");
        let proc_root = root.path();
        process(proc_root, 10, 10, &[10, 11, 12]);
        process(proc_root, 20, 10, &[20]);
        process(proc_root, 30, 30, &[30, 31]);
        fs::create_dir_all(proc_root.join("self")).expect("mkdir");
        let group = Members::Group(10);
        assert_eq!(trial_processes(proc_root, &group), vec![10, 20]);
        assert_eq!(trial_tasks(proc_root, &group), vec![10, 11, 12, 20]);
        // A cgroup lists its processes, whatever their group; a gone one has no threads.
        let procs = proc_root.join("cgroup.procs");
        fs::write(&procs, "30\n10\n99\n").expect("write");
        assert_eq!(trial_tasks(proc_root, &Members::Cgroup(procs)), vec![10, 11, 12, 30, 31]);
        assert_eq!(trial_tasks(proc_root, &Members::Group(77)), Vec::<i32>::new());
        assert!(matches!(set_affinity(proc_root, &group, &[]), Err(LiveError::NoCpus)));
        let beyond = u32::try_from(CpuSet::MAX_CPU).expect("small");
        assert!(matches!(set_affinity(proc_root, &group, &[0, beyond]), Err(LiveError::CpuOutOfRange { .. })));
    }

    /// Set in the environment of the helper process.
    const HELPER_ENV: &str = "TUNEFLEET_LIVE_TEST_HELPER";

    /// Not a test on its own: the multi-threaded workload of
    /// `set_affinity_reaches_every_thread_and_new_ones_inherit`, which runs
    /// this test binary again with only this function. Starts three
    /// threads, says `@ready`; for each `spawn` line on its input, starts
    /// one more thread that prints `@tid N`; ends with its input.
    #[test]
    #[ignore = "the helper process of set_affinity_reaches_every_thread_and_new_ones_inherit"]
    fn affinity_helper_process() {
        if std::env::var_os(HELPER_ENV).is_none() {
            return;
        }
        let start = |announce: bool| {
            std::thread::spawn(move || {
                if announce {
                    println!("@tid {}", rustix::thread::gettid().as_raw_nonzero());
                }
                loop {
                    std::thread::park();
                }
            })
        };
        for _ in 0..3 {
            start(false);
        }
        println!("@ready");
        for line in std::io::stdin().lines() {
            if line.expect("stdin") == "spawn" {
                start(true);
            }
        }
    }

    /// A child process killed and reaped when the test ends, failed or not.
    struct Reaped(Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn next_marked_line(lines: &mut Lines<BufReader<ChildStdout>>, prefix: &str) -> String {
        for line in lines.by_ref() {
            let line = line.expect("helper output");
            // libtest may print the test's name first on the same line.
            if let Some((_, rest)) = line.split_once(prefix) {
                return rest.trim().to_string();
            }
        }
        panic!("the helper ended before printing {prefix:?}");
    }

    /// `Cpus_allowed_list` of every thread of process `pid`, by tid.
    fn masks(pid: i32) -> Vec<(i32, String)> {
        numeric_entries(&Path::new("/proc").join(pid.to_string()).join("task"))
            .into_iter()
            .filter_map(|tid| {
                let status = fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
                let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
                Some((tid, list.trim().to_string()))
            })
            .collect()
    }

    fn assert_all(pid: i32, cpus: &[u32]) {
        let masks = masks(pid);
        let want = format_cpu_list(cpus);
        assert!(masks.len() >= 4, "the helper has its threads: {masks:?}");
        assert!(masks.iter().all(|(_, m)| *m == want), "every thread on {want}: {masks:?}");
    }

    #[test]
    fn set_affinity_reaches_every_thread_and_new_ones_inherit() {
        let allowed = crate::cpus::allowed_cpus();
        if allowed.len() < 2 {
            return eprintln!("skipped: needs 2 CPUs, this process may use {allowed:?}");
        }
        let (one, both) = (&allowed[..1], &allowed[..2]);
        let exe = std::env::current_exe().expect("the test binary");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", "live::tests::affinity_helper_process", "--ignored", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0);
        let mut helper = Reaped(cmd.spawn().expect("spawn the helper"));
        let mut stdin = helper.0.stdin.take().expect("piped");
        let mut lines = BufReader::new(helper.0.stdout.take().expect("piped")).lines();
        next_marked_line(&mut lines, "@ready");
        let pid = i32::try_from(helper.0.id()).expect("a pid");
        let (proc_root, members) = (Path::new("/proc"), Members::Group(pid));
        let threads = trial_tasks(proc_root, &members);
        assert!(threads.len() >= 4, "the helper and its three threads: {threads:?}");

        let set = set_affinity(proc_root, &members, one).expect("pin to one CPU");
        assert!(set >= threads.len(), "{set} threads set of {threads:?}");
        assert_all(pid, one);

        // A thread started after the change inherits the mask from its creator.
        writeln!(stdin, "spawn").expect("ask for a thread");
        let tid: i32 = next_marked_line(&mut lines, "@tid ").parse().expect("a tid");
        assert!(trial_tasks(proc_root, &members).contains(&tid));
        assert_eq!(masks(pid).into_iter().find(|(t, _)| *t == tid).map(|(_, m)| m), Some(format_cpu_list(one)));

        set_affinity(proc_root, &members, both).expect("back to two CPUs");
        assert_all(pid, both);
    }

    /// The soft and hard `Max address space` of `/proc/PID/limits`.
    fn address_space_limit(pid: i32) -> (String, String) {
        let limits = fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
        let line = limits.lines().find_map(|l| l.strip_prefix("Max address space")).expect("address space line");
        let mut words = line.split_whitespace().map(str::to_string);
        (words.next().unwrap_or_default(), words.next().unwrap_or_default())
    }

    #[test]
    fn set_memory_rlimit_limits_a_running_process() {
        let mut cmd = Command::new("sleep");
        cmd.arg("60").process_group(0);
        let sleep = Reaped(cmd.spawn().expect("spawn sleep"));
        let pid = i32::try_from(sleep.0.id()).expect("a pid");
        let (proc_root, members) = (Path::new("/proc"), Members::Group(pid));
        assert_eq!(set_memory_rlimit(proc_root, &members, Some(1 << 30)).expect("prlimit"), 1);
        let gib = (1u64 << 30).to_string();
        assert_eq!(address_space_limit(pid), (gib, "unlimited".into()), "soft limit set, hard left unlimited");
        // Raised again: a soft limit needs no CAP_SYS_RESOURCE (this container has none).
        assert_eq!(set_memory_rlimit(proc_root, &members, None).expect("prlimit"), 1);
        assert_eq!(address_space_limit(pid), ("unlimited".into(), "unlimited".into()));
    }
}
