//! What `/proc` tells about the workload: CPU times of a (zombie) process
//! and the peak resident set of a trial's processes. The proc root is a
//! parameter so tests can point at a fixture tree.
//!
//! Sampling the peak resident set 10 times a second is blocking file I/O,
//! so [`RssSampler`] does it on a thread of its own, never on the agent's
//! runtime thread (which also drives MQTT); only a trial's first sample,
//! its leader alone, is read where it starts. And it is kept cheap:
//!
//! * A trial with a cgroup: its `cgroup.procs` lists its processes (those
//!   that left the process group included); only theirs are read.
//! * Otherwise finding a process group's members means reading the `stat` of
//!   every process on the machine (about 0.9 ms for 77 processes on the
//!   benchmark machine). [`RssTracker`] reads only the leader at its first
//!   sample (the trial's start), then does that full scan once every
//!   [`FULL_SCAN_EVERY`] samples; in between it lists `/proc` and reads the
//!   `stat` only of processes that were not there at the previous sample
//!   (a member's new children are new processes), and the `status` of known
//!   members. `VmHWM` is a per-process peak, so a member found up to one
//!   full-scan period late (a process that joined the group, a reused pid)
//!   still shows its peak, unless it exits first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use tunefleet_common::profile::ProcCounts;

/// Fields of `/proc/PID/stat` the runner uses, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFields {
    /// The parent's process id.
    pub ppid: i32,
    pub pgrp: i32,
    pub utime: u64,
    pub stime: u64,
    /// User time of the children this process waited for.
    pub cutime: u64,
    pub cstime: u64,
}

/// Parses the contents of `/proc/PID/stat`. The command name (field 2) may
/// contain spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_stat(contents: &str) -> Option<StatFields> {
    let after = &contents[contents.rfind(')')? + 1..];
    // `after` starts at field 3 (state); field N is at index N - 3.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let num = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(StatFields {
        ppid: fields.get(4 - 3)?.parse().ok()?,
        pgrp: fields.get(5 - 3)?.parse().ok()?,
        utime: num(14)?,
        stime: num(15)?,
        cutime: num(16)?,
        cstime: num(17)?,
    })
}

/// Reads and parses `{proc_root}/{pid}/stat`.
pub fn read_stat(proc_root: &Path, pid: i32) -> Option<StatFields> {
    let text = read_small(&proc_root.join(pid.to_string()).join("stat"))?;
    parse_stat(&text)
}

/// The `VmHWM` (peak resident set, KiB) line of `/proc/PID/status`.
pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line["VmHWM:".len()..].split_whitespace().next()?.parse().ok()
}

/// The `VmHWM` of one process, KiB; `None` when it is gone or a zombie.
pub fn vm_hwm_kib(proc_root: &Path, pid: i32) -> Option<u64> {
    let status = read_small(&proc_root.join(pid.to_string()).join("status"))?;
    parse_vm_hwm_kib(&status)
}

/// The resident set of one process now, KiB (`/proc/PID/statm`, which the
/// kernel makes far more cheaply than `status`); `None` when it is gone.
pub fn resident_kib(proc_root: &Path, pid: i32) -> Option<u64> {
    let statm = read_small(&proc_root.join(pid.to_string()).join("statm"))?;
    parse_statm_resident_kib(&statm, rustix::param::page_size() as u64)
}

/// The resident set (second field, in pages of `page_size` bytes) of a
/// `/proc/PID/statm`, KiB.
pub fn parse_statm_resident_kib(statm: &str, page_size: u64) -> Option<u64> {
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages.saturating_mul(page_size) / 1024)
}

/// The largest `/proc` file [`read_small`] reads.
const SMALL_FILE_MAX: usize = 1 << 20;

/// A small file of `/proc` read whole, in one read for most: a `/proc`
/// file reports no size, so `std::fs::read_to_string` starts with reads of
/// 32 bytes and doubles, seven system calls for a process's `status`.
/// `None` when it cannot be read, is not UTF-8 or is larger than
/// [`SMALL_FILE_MAX`].
pub fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        if len == buf.len() {
            if buf.len() >= SMALL_FILE_MAX {
                return None;
            }
            buf.resize(buf.len() * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).ok()
}

/// The largest `VmHWM` among the live processes of process group `pgid`,
/// found by scanning `{proc_root}`. `None` when no member could be read.
pub fn group_peak_rss_kib(proc_root: &Path, pgid: i32) -> Option<u64> {
    let entries = std::fs::read_dir(proc_root).ok()?;
    let mut peak = None;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if read_stat(proc_root, pid).map(|s| s.pgrp) != Some(pgid) {
            continue;
        }
        if let Some(kib) = vm_hwm_kib(proc_root, pid) {
            peak = Some(peak.map_or(kib, |p: u64| p.max(kib)));
        }
    }
    peak
}

/// How a trial's processes are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Members {
    /// The members of this process group, by scanning every process.
    Group(i32),
    /// The processes listed in this `cgroup.procs` file (the trial's cgroup).
    Cgroup(PathBuf),
}

/// The largest `VmHWM` among `members`; `None` when none could be read.
pub fn peak_rss_kib(proc_root: &Path, members: &Members) -> Option<u64> {
    match members {
        Members::Group(pgid) => group_peak_rss_kib(proc_root, *pgid),
        Members::Cgroup(procs) => std::fs::read_to_string(procs)
            .ok()?
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .filter_map(|pid| vm_hwm_kib(proc_root, pid))
            .max(),
    }
}

/// Samples of a process group between two full scans of `/proc`, the first included.
pub const FULL_SCAN_EVERY: u64 = 10;

/// Finds a trial's processes and their largest `VmHWM`, sample after sample
/// (see the module doc for what is read when).
#[derive(Debug)]
pub struct RssTracker {
    proc_root: PathBuf,
    members: Members,
    /// Every process of the last listing, and whether it is in the group.
    known: BTreeMap<i32, bool>,
    samples: u64,
}

impl RssTracker {
    pub fn new(proc_root: PathBuf, members: Members) -> Self {
        RssTracker { proc_root, members, known: BTreeMap::new(), samples: 0 }
    }

    /// The largest `VmHWM` among the trial's live processes now; `None` when
    /// none could be read.
    pub fn sample(&mut self) -> Option<u64> {
        let pgid = match &self.members {
            Members::Group(pgid) => *pgid,
            cgroup @ Members::Cgroup(_) => return peak_rss_kib(&self.proc_root, cgroup),
        };
        let full = self.samples % FULL_SCAN_EVERY == 0;
        self.samples += 1;
        if self.samples == 1 {
            // The first sample is taken as the trial starts, when its group
            // is its leader alone: no scan of every process for that (it
            // was most of the agent's cost of a trial of a few
            // milliseconds), and its resident set now (`statm`) rather than
            // its peak (`status`, several times the kernel's work): the two
            // are one as a process starts. The next sample lists the group.
            let peak = resident_kib(&self.proc_root, pgid);
            self.known.insert(pgid, true);
            return peak;
        }
        let entries = std::fs::read_dir(&self.proc_root).ok()?;
        let mut known = BTreeMap::new();
        let mut peak = None;
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let member = match self.known.get(&pid) {
                Some(member) if !full => *member,
                _ => read_stat(&self.proc_root, pid).map(|s| s.pgrp) == Some(pgid),
            };
            known.insert(pid, member);
            if let Some(kib) = member.then(|| vm_hwm_kib(&self.proc_root, pid)).flatten() {
                peak = Some(peak.map_or(kib, |p: u64| p.max(kib)));
            }
        }
        self.known = known;
        peak
    }
}

#[derive(Debug, Default)]
struct RssShared {
    stop: AtomicBool,
    /// Largest `VmHWM` seen, KiB; 0: none yet.
    peak_kib: AtomicU64,
    samples: AtomicU64,
}

/// Samples the peak resident set of a trial's processes every interval on a
/// thread of its own, until [`RssSampler::stop`] (or drop).
#[derive(Debug)]
pub struct RssSampler {
    shared: Arc<RssShared>,
    thread: Option<std::thread::Thread>,
    /// The tracker and the interval, until sampling moves to a thread.
    deferred: Option<(RssTracker, Duration)>,
}

impl RssShared {
    fn record(&self, kib: Option<u64>) {
        if let Some(kib) = kib {
            self.peak_kib.fetch_max(kib, Ordering::AcqRel);
        }
        self.samples.fetch_add(1, Ordering::AcqRel);
    }
}

impl RssSampler {
    /// Takes the first sample now, on the caller's thread (as a trial
    /// starts: its leader alone, one small read), and the next ones only
    /// after [`RssSampler::continue_on_thread`]: a trial that ends before
    /// then costs no thread.
    pub fn start(proc_root: PathBuf, members: Members, every: Duration) -> Self {
        let shared = Arc::new(RssShared::default());
        let mut tracker = RssTracker::new(proc_root, members);
        shared.record(tracker.sample());
        RssSampler { shared, thread: None, deferred: Some((tracker, every)) }
    }

    /// Starts sampling now, on a thread of its own.
    pub fn spawn(proc_root: PathBuf, members: Members, every: Duration) -> Self {
        let tracker = RssTracker::new(proc_root, members);
        let mut sampler =
            RssSampler { shared: Arc::new(RssShared::default()), thread: None, deferred: Some((tracker, every)) };
        sampler.continue_on_thread();
        sampler
    }

    /// Whether the sampling waits for [`RssSampler::continue_on_thread`].
    pub fn deferred(&self) -> bool {
        self.deferred.is_some()
    }

    /// Samples at once, then every interval, on a thread of its own until
    /// stopped. Without a thread (the system refused one) no more samples
    /// are taken. Does nothing when already on its thread or stopped.
    pub fn continue_on_thread(&mut self) {
        let Some((mut tracker, every)) = self.deferred.take() else { return };
        if self.shared.stop.load(Ordering::Acquire) {
            return;
        }
        let theirs = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new().name("tf-rss".into()).stack_size(256 << 10).spawn(move || {
            while !theirs.stop.load(Ordering::Acquire) {
                theirs.record(tracker.sample());
                let next = Instant::now() + every;
                // park_timeout may wake early; stop() unparks to end at once.
                while !theirs.stop.load(Ordering::Acquire) {
                    let left = next.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::park_timeout(left);
                }
            }
        });
        self.thread = match spawned {
            Ok(handle) => Some(handle.thread().clone()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the memory sampling thread; the peak RSS is from fewer samples");
                None
            }
        };
    }

    /// Samples taken so far.
    pub fn samples(&self) -> u64 {
        self.shared.samples.load(Ordering::Acquire)
    }

    /// The largest `VmHWM` seen so far.
    pub fn peak_kib(&self) -> Option<u64> {
        Some(self.shared.peak_kib.load(Ordering::Acquire)).filter(|k| *k > 0)
    }

    /// Stops sampling and returns the peak. Does not wait for a sample in
    /// progress (it may still finish, unseen).
    pub fn stop(&self) -> Option<u64> {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.unpark();
        }
        self.peak_kib()
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Adds the fields of a `/proc/PID/io` file to `c` (`rchar`, `wchar`,
/// `syscr`, `syscw`); false when none was there.
pub fn add_io(c: &mut ProcCounts, io: &str) -> bool {
    let mut found = false;
    for line in io.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let Ok(v) = value.trim().parse::<u64>() else { continue };
        let field = match key.trim() {
            "rchar" => &mut c.rchar,
            "wchar" => &mut c.wchar,
            "syscr" => &mut c.syscr,
            "syscw" => &mut c.syscw,
            _ => continue,
        };
        *field = field.saturating_add(v);
        found = true;
    }
    found
}

/// The value of `key:` in a `/proc/PID/status` text (the number before any unit).
fn status_field(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.split_whitespace().next()?.parse().ok())
}

/// Adds a process's `/proc/PID/status` (resident set, threads) to `c`.
pub fn add_process_status(c: &mut ProcCounts, status: &str) {
    c.rss_kib = c.rss_kib.saturating_add(status_field(status, "VmRSS").unwrap_or(0));
    c.threads = c.threads.saturating_add(status_field(status, "Threads").unwrap_or(0));
}

/// Adds a thread's context switches (its `/proc/PID/task/TID/status`) to `c`.
pub fn add_thread_switches(c: &mut ProcCounts, status: &str) {
    c.voluntary = c.voluntary.saturating_add(status_field(status, "voluntary_ctxt_switches").unwrap_or(0));
    c.involuntary = c.involuntary.saturating_add(status_field(status, "nonvoluntary_ctxt_switches").unwrap_or(0));
}

/// `/proc` counts of the processes `pids` (and all their threads). A
/// process that vanished in between is left out; `processes` says how many
/// were read. Threads that already exited take their context switches with
/// them (their I/O stays in the process's `io`).
pub fn proc_counts(proc_root: &Path, pids: &[i32]) -> ProcCounts {
    let mut c = ProcCounts::default();
    for pid in pids {
        let dir = proc_root.join(pid.to_string());
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else { continue };
        add_process_status(&mut c, &status);
        if let Ok(io) = std::fs::read_to_string(dir.join("io")) {
            add_io(&mut c, &io);
        }
        if let Ok(tasks) = std::fs::read_dir(dir.join("task")) {
            for task in tasks.flatten() {
                if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
                    add_thread_switches(&mut c, &status);
                }
            }
        }
        c.processes += 1;
    }
    c
}

/// Converts clock ticks to microseconds.
pub fn ticks_to_us(ticks: u64, ticks_per_second: u64) -> u64 {
    if ticks_per_second == 0 {
        return 0;
    }
    (u128::from(ticks) * 1_000_000 / u128::from(ticks_per_second)) as u64
}

/// Fixture `/proc` trees for the tests of this crate.
#[cfg(test)]
pub(crate) mod fixture {
    use std::path::Path;

    /// Writes `{root}/{name}/stat` of a process with parent `ppid` in group
    /// `pgrp`; `ticks` are its user, system, waited-for children's user and
    /// children's system time.
    pub(crate) fn stat(root: &Path, name: &str, ppid: i32, pgrp: i32, ticks: [u64; 4]) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let [u, s, cu, cs] = ticks;
        let text = format!("1 (w) R {ppid} {pgrp} {pgrp} 0 -1 0 0 0 0 0 {u} {s} {cu} {cs} 20 0 1 0 1 1 1");
        std::fs::write(dir.join("stat"), text).expect("write stat");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (a (weird) name) Z 1 4242 4242 0 -1 4194828 100 0 0 0 250 30 7 2 20 0 1 0 1 0 0";

    #[test]
    fn parses_stat_with_odd_names() {
        let s = parse_stat(STAT).expect("parses");
        assert_eq!(s, StatFields { ppid: 1, pgrp: 4242, utime: 250, stime: 30, cutime: 7, cstime: 2 });
        assert_eq!(parse_stat("12 (x) R 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn small_files_are_read_whole_up_to_the_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Longer than the first read: read to its end.
        let long: String = (0..3000).map(|i| format!("{i}\n")).collect();
        std::fs::write(dir.path().join("long"), &long).expect("write");
        assert_eq!(read_small(&dir.path().join("long")).as_deref(), Some(long.as_str()));
        std::fs::write(dir.path().join("huge"), vec![b'x'; SMALL_FILE_MAX + 1]).expect("write");
        assert_eq!(read_small(&dir.path().join("huge")), None);
        std::fs::write(dir.path().join("binary"), [0xff, 0xfe]).expect("write");
        assert_eq!(read_small(&dir.path().join("binary")), None);
        assert_eq!(read_small(&dir.path().join("absent")), None);
        // A real /proc file, which reports no size.
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(vm_hwm_kib(Path::new("/proc"), me).is_some_and(|k| k > 0));
        let resident = resident_kib(Path::new("/proc"), me).expect("statm");
        assert!(resident > 0 && resident <= vm_hwm_kib(Path::new("/proc"), me).expect("status"));
        assert!(read_stat(Path::new("/proc"), me).is_some());
    }

    #[test]
    fn parses_vm_hwm() {
        assert_eq!(parse_vm_hwm_kib("Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 5 kB\n"), Some(1234));
        assert_eq!(parse_statm_resident_kib("2000 300 200 10 0 150 0\n", 4096), Some(1200));
        assert_eq!(parse_statm_resident_kib("2000 x", 4096), None);
        assert_eq!(parse_statm_resident_kib("", 4096), None);
        assert_eq!(parse_vm_hwm_kib("Name:\tx\n"), None);
    }

    /// Process `pid` of group `pgrp` with a `VmHWM` of `hwm` KiB, in a fixture `/proc`.
    fn process(root: &Path, pid: i32, pgrp: i32, hwm: u64) {
        let p = root.join(pid.to_string());
        std::fs::create_dir_all(&p).expect("mkdir");
        let stat = format!("{pid} (w) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 1 0 0");
        std::fs::write(p.join("stat"), stat).expect("write stat");
        std::fs::write(p.join("status"), format!("VmHWM:\t{hwm} kB\n")).expect("write status");
        let pages = hwm * 1024 / rustix::param::page_size() as u64;
        std::fs::write(p.join("statm"), format!("{} {pages} 0 0 0 0 0\n", pages * 2)).expect("write statm");
    }

    /// What the first sample reads of a fixture process of peak `hwm`: its
    /// resident set, in whole pages.
    fn resident(hwm: u64) -> Option<u64> {
        let page = rustix::param::page_size() as u64;
        Some(hwm * 1024 / page * page / 1024)
    }

    #[test]
    fn scans_a_fixture_proc_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |pid: i32, pgrp: i32, hwm: u64| process(dir.path(), pid, pgrp, hwm);
        write(10, 10, 500);
        write(11, 10, 900);
        write(12, 99, 5000);
        std::fs::create_dir_all(dir.path().join("self")).expect("mkdir");
        assert_eq!(group_peak_rss_kib(dir.path(), 10), Some(900));
        assert_eq!(group_peak_rss_kib(dir.path(), 77), None);
        assert_eq!(ticks_to_us(250, 100), 2_500_000);
        assert_eq!(ticks_to_us(1, 0), 0);

        // A cgroup lists its processes, whatever their process group (12 left it).
        let procs = dir.path().join("cgroup.procs");
        std::fs::write(&procs, "10\n12\n404\n").expect("write procs");
        assert_eq!(peak_rss_kib(dir.path(), &Members::Cgroup(procs.clone())), Some(5000));
        std::fs::write(&procs, "").expect("write procs");
        assert_eq!(peak_rss_kib(dir.path(), &Members::Cgroup(procs)), None);
        assert_eq!(peak_rss_kib(dir.path(), &Members::Group(10)), Some(900));
    }

    /// The `/proc` scan read every process's `stat` 10 times a
    /// second; now only new processes' between full scans.
    #[test]
    fn regression_tracker_reads_only_new_processes_between_full_scans() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |pid: i32, pgrp: i32, hwm: u64| process(dir.path(), pid, pgrp, hwm);
        write(10, 10, 500);
        write(20, 99, 7000);
        let mut t = RssTracker::new(dir.path().to_path_buf(), Members::Group(10));
        assert_eq!(t.sample(), resident(500), "first sample: the leader");
        // A new child is found at the next sample; a member's peak is re-read.
        write(11, 10, 800);
        write(10, 10, 600);
        assert_eq!(t.sample(), Some(800));
        // Process 20 moves into the group (or its pid is reused by a member):
        // its stat is not read again until the next full scan.
        write(20, 10, 7000);
        for _ in 2..FULL_SCAN_EVERY {
            assert_eq!(t.sample(), Some(800));
        }
        assert_eq!(t.sample(), Some(7000), "the full scan finds it");
        // Gone processes are forgotten; an empty group has no peak.
        for pid in [10, 11, 20] {
            std::fs::remove_dir_all(dir.path().join(pid.to_string())).expect("rm");
        }
        assert_eq!(t.sample(), None);
    }

    /// The first sample, as the trial starts, reads the leader
    /// alone (a scan of every process was most of a short trial's cost);
    /// the group's other members are found from the second.
    #[test]
    fn the_first_sample_reads_only_the_leader() {
        let dir = tempfile::tempdir().expect("tempdir");
        process(dir.path(), 10, 10, 500);
        process(dir.path(), 12, 10, 900);
        let mut t = RssTracker::new(dir.path().to_path_buf(), Members::Group(10));
        assert_eq!(t.sample(), resident(500));
        assert_eq!(t.sample(), Some(900));
    }

    /// The `/proc` scan ran on the agent's one runtime thread, 10
    /// times a second. The sampler needs no runtime: it runs on its own thread.
    #[test]
    fn regression_rss_sampler_runs_on_its_own_thread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |hwm: u64| process(dir.path(), 10, 10, hwm);
        let wait_for = |sampler: &RssSampler, n: u64| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while sampler.samples() < n {
                assert!(Instant::now() < deadline, "the sampler took no sample by itself");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        write(500);
        let sampler = RssSampler::spawn(dir.path().to_path_buf(), Members::Group(10), Duration::from_millis(5));
        wait_for(&sampler, 1);
        write(900);
        let seen = sampler.samples();
        wait_for(&sampler, seen + 2);
        write(100);
        let seen = sampler.samples();
        wait_for(&sampler, seen + 2);
        assert_eq!(sampler.stop(), Some(900), "the largest peak seen");
        let stopped = sampler.samples();
        std::thread::sleep(Duration::from_millis(50));
        assert!(sampler.samples() <= stopped + 1, "stop ends the sampling");
    }

    #[test]
    fn a_started_sampler_samples_once_then_waits_to_be_moved_to_a_thread() {
        let dir = tempfile::tempdir().expect("tempdir");
        process(dir.path(), 10, 10, 700);
        let mut sampler = RssSampler::start(dir.path().to_path_buf(), Members::Group(10), Duration::from_millis(5));
        assert_eq!(sampler.samples(), 1, "the first sample is taken where it starts");
        assert_eq!(sampler.peak_kib(), resident(700));
        assert!(sampler.deferred());
        process(dir.path(), 10, 10, 800);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(sampler.samples(), 1, "no thread samples before it is moved to one");
        sampler.continue_on_thread();
        assert!(!sampler.deferred());
        let deadline = Instant::now() + Duration::from_secs(10);
        while sampler.samples() < 3 {
            assert!(Instant::now() < deadline, "the thread took no sample");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sampler.stop(), Some(800), "the thread's samples count");
        let mut stopped = RssSampler::start(dir.path().to_path_buf(), Members::Group(10), Duration::from_millis(5));
        stopped.stop();
        stopped.continue_on_thread();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(stopped.samples(), 1, "a stopped sampler starts no thread");
    }
}

#[cfg(test)]
mod counts_tests {
    use super::*;

    #[test]
    fn proc_counts_of_a_fixture_process_with_two_threads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("42");
        std::fs::create_dir_all(p.join("task/42")).expect("mkdir");
        std::fs::create_dir_all(p.join("task/43")).expect("mkdir");
        std::fs::write(p.join("status"), "Name:\tw\nVmRSS:\t  2048 kB\nThreads:\t2\n").expect("write");
        std::fs::write(p.join("io"), "rchar: 100\nwchar: 50\nsyscr: 7\nsyscw: 3\nread_bytes: 0\n").expect("write");
        std::fs::write(p.join("task/42/status"), "voluntary_ctxt_switches:\t5\nnonvoluntary_ctxt_switches:\t1\n")
            .expect("write");
        std::fs::write(p.join("task/43/status"), "voluntary_ctxt_switches:\t2\nnonvoluntary_ctxt_switches:\t4\n")
            .expect("write");
        let c = proc_counts(dir.path(), &[42, 77]);
        let want = ProcCounts {
            rss_kib: 2048,
            rchar: 100,
            wchar: 50,
            syscr: 7,
            syscw: 3,
            voluntary: 7,
            involuntary: 5,
            threads: 2,
            processes: 1,
        };
        assert_eq!(c, want, "pid 77 does not exist and is left out");
        assert!(!add_io(&mut ProcCounts::default(), "garbage\nrchar: x\n"));
    }

    #[test]
    fn proc_counts_of_this_process_are_real() {
        let c = proc_counts(Path::new("/proc"), &[std::process::id() as i32]);
        assert_eq!(c.processes, 1);
        assert!(c.threads >= 1 && c.rss_kib > 0, "{c:?}");
        assert!(c.voluntary + c.involuntary > 0, "{c:?}");
    }
}
