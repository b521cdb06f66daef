//! perf counters over the workload's whole process tree.
//!
//! Counters count from the workload's first instruction, with
//! `enable_on_exec`, and over its children and threads, with `inherit`.
//! A workload started directly gets them through the thread that starts
//! it: opened, disabled, on that thread ([`CounterSet::open_for_children`]),
//! inherited by the child and enabled when it execs. A workload started
//! through the exec wrapper gets them on the wrapper's pid before it is let
//! go ([`CounterSet::open_for_exec`]). Events the kernel does not have are
//! learnt at the first open and not asked for again. Kernel-mode counts
//! are included when the kernel permits it; otherwise the counter counts
//! user mode only and its event name gets perf's `:u` suffix, so the record
//! says what was measured. Events the kernel does not offer (hardware events
//! in VMs, everything under qemu-user) are listed as missing with the reason.
//!
//! Hardware events the kernel refuses (no PMU here) are recorded missing
//! with the reason and the run carries on with the software events.
//! Multiplexed counters keep their enabled and running times, so
//! [`CounterReading::scaled`] and [`CounterReading::multiplexed`] say what
//! happened.
//!
//! While the workload runs the runner calls [`CounterSet::sample`] at an
//! interval (default 1 s): the scaled increments since the previous sample
//! form the measurement's counter series, from which (with the totals) the
//! profile vector is derived ([`tunefleet_common::profile`]).
//!
//! Only Linux on x86_64 and aarch64 has the perf backend (perf-event2 has
//! no 32-bit ARM bindings); elsewhere every event is reported missing.

use std::time::Duration;

#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
use tunefleet_common::measurement::push_counter_sample;
use tunefleet_common::measurement::{CounterKind, CounterReading, CounterSample, MissingCounter};

/// Software events, always asked for.
pub const SOFTWARE_EVENTS: [&str; 6] =
    ["task-clock", "context-switches", "cpu-migrations", "page-faults", "minor-faults", "major-faults"];
/// Hardware events, asked for when the kernel offers them.
pub const HARDWARE_EVENTS: [&str; 10] = [
    "instructions",
    "cycles",
    "cache-references",
    "cache-misses",
    "branch-instructions",
    "branch-misses",
    "LLC-loads",
    "LLC-load-misses",
    "stalled-cycles-frontend",
    "stalled-cycles-backend",
];

/// Default interval between counter samples.
pub const DEFAULT_SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Counters attached to one workload.
#[derive(Debug)]
pub struct CounterSet {
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    open: Vec<backend::OpenCounter>,
    missing: Vec<MissingCounter>,
    /// Scaled totals at the previous sample, one per open counter.
    #[cfg_attr(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))), allow(dead_code))]
    previous: Vec<f64>,
    series: Vec<CounterSample>,
    /// Dropped after the counters above are closed: tells the thread they
    /// are attached to that it may start another workload.
    release: Option<std::sync::mpsc::Sender<()>>,
}

/// What the counters of one run add up to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CounterOutcome {
    pub readings: Vec<CounterReading>,
    pub missing: Vec<MissingCounter>,
    /// Scaled increments per interval, in the order of `readings`.
    pub series: Vec<CounterSample>,
}

/// Scaled increments from `previous` to `now` (a counter never goes down;
/// a scaled estimate that does is clamped to 0).
pub fn scaled_deltas(previous: &[f64], now: &[f64]) -> Vec<f64> {
    now.iter().enumerate().map(|(i, n)| (n - previous.get(i).copied().unwrap_or(0.0)).max(0.0)).collect()
}

impl CounterSet {
    /// Every event missing for `reason`.
    pub fn all_missing(reason: &str) -> Self {
        let missing = SOFTWARE_EVENTS
            .iter()
            .chain(HARDWARE_EVENTS.iter())
            .map(|e| MissingCounter { event: e.to_string(), reason: reason.to_string() })
            .collect();
        CounterSet {
            #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
            open: Vec::new(),
            missing,
            previous: Vec::new(),
            series: Vec::new(),
            release: None,
        }
    }

    /// The same set, which drops `release` once its counters are closed
    /// (its receiver then sees the channel disconnected).
    pub fn released_to(mut self, release: std::sync::mpsc::Sender<()>) -> Self {
        self.release = Some(release);
        self
    }

    /// Opens every event on `pid` (disabled until it execs).
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn open_for_exec(pid: i32) -> Self {
        let (open, missing) = backend::open_all(backend::Target::Exec(pid));
        let previous = vec![0.0; open.len()];
        CounterSet { open, missing, previous, series: Vec::new(), release: None }
    }

    /// Opens every event on the calling thread, disabled, inherited by the
    /// processes it starts and enabled in each when it execs: the counters
    /// of a workload this thread spawns directly (no exec wrapper), counted
    /// from its first instruction. The thread must start nothing else while
    /// the set is open.
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn open_for_children() -> Self {
        let (open, missing) = backend::open_all(backend::Target::Children);
        let previous = vec![0.0; open.len()];
        CounterSet { open, missing, previous, series: Vec::new(), release: None }
    }

    /// Opens every event on the calling thread's future children.
    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    pub fn open_for_children() -> Self {
        CounterSet::all_missing("perf counters are not supported on this platform")
    }

    /// Opens every event on this process (for benchmarks and `probe`).
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn open_for_self() -> Self {
        let (open, missing) = backend::open_all(backend::Target::This);
        let previous = vec![0.0; open.len()];
        CounterSet { open, missing, previous, series: Vec::new(), release: None }
    }

    /// Opens every event on this process (for benchmarks and `probe`).
    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    pub fn open_for_self() -> Self {
        CounterSet::all_missing("perf counters are not supported on this platform")
    }

    /// Names of the events being counted.
    pub fn open_events(&self) -> Vec<String> {
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            self.open.iter().map(|c| c.name.clone()).collect()
        }
        #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
        {
            Vec::new()
        }
    }

    /// The scaled total of `event` at the last [`CounterSet::sample`], when it is counted.
    pub fn total(&self, event: &str) -> Option<f64> {
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let i = self.open.iter().position(|c| c.name == event)?;
            self.previous.get(i).copied()
        }
        #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
        {
            let _ = event;
            None
        }
    }

    /// Every open counter's scaled total at the last
    /// [`CounterSet::sample`], as readings (already scaled: enabled and
    /// running times are both 1).
    pub fn totals(&self) -> Vec<CounterReading> {
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            self.open
                .iter()
                .zip(&self.previous)
                .map(|(c, total)| CounterReading {
                    event: c.name.clone(),
                    kind: kind_of(&c.name),
                    value: *total as u64,
                    time_enabled_ns: 1,
                    time_running_ns: 1,
                })
                .collect()
        }
        #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
        {
            Vec::new()
        }
    }

    /// Events asked for and not counted, with the reason.
    pub fn missing(&self) -> &[MissingCounter] {
        &self.missing
    }

    /// Reads every open counter at `elapsed` since the start and appends the
    /// scaled increments to the series. A counter that fails to read counts
    /// as unchanged in this sample.
    pub fn sample(&mut self, elapsed: Duration) {
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            if self.open.is_empty() {
                return;
            }
            let now: Vec<f64> = self
                .open
                .iter_mut()
                .zip(&self.previous)
                .map(|(c, prev)| c.peek().map_or(*prev, |r| r.scaled()))
                .collect();
            let deltas = scaled_deltas(&self.previous, &now);
            self.previous = now;
            let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
            push_counter_sample(&mut self.series, CounterSample { elapsed_ms, deltas });
        }
        #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
        {
            let _ = elapsed;
        }
    }

    /// Opens every event on `pid` (disabled until it execs).
    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    pub fn open_for_exec(_pid: i32) -> Self {
        CounterSet::all_missing("perf counters are not supported on this platform")
    }

    /// Takes a last sample at `elapsed` and reads the totals; call after the
    /// process tree has exited. A counter that cannot be read is moved to
    /// the missing list, and its column is dropped from the series.
    pub fn finish(mut self, elapsed: Duration) -> CounterOutcome {
        let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        if self.series.last().is_none_or(|s| s.elapsed_ms < elapsed_ms) {
            self.sample(elapsed);
        }
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let mut readings = Vec::new();
            let mut missing = self.missing;
            let mut keep = Vec::new();
            for mut counter in self.open {
                match counter.peek() {
                    Ok(r) => {
                        readings.push(r);
                        keep.push(true);
                    }
                    Err(m) => {
                        missing.push(m);
                        keep.push(false);
                    }
                }
            }
            let mut series = self.series;
            if keep.iter().any(|k| !k) {
                for s in &mut series {
                    s.deltas = s.deltas.iter().zip(&keep).filter(|(_, k)| **k).map(|(d, _)| *d).collect();
                }
            }
            CounterOutcome { readings, missing, series }
        }
        #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
        {
            CounterOutcome { readings: Vec::new(), missing: self.missing, series: Vec::new() }
        }
    }
}

/// The events that can be opened on this process right now, as recorded
/// names (`task-clock` or `task-clock:u`), for the agent's capabilities.
pub fn probe() -> Vec<String> {
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        backend::open_all(backend::Target::This).0.iter().map(|c| c.name.clone()).collect()
    }
    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    {
        Vec::new()
    }
}

/// The kind of a known event name (with or without a `:u` suffix).
pub fn kind_of(event: &str) -> CounterKind {
    let base = event.strip_suffix(":u").unwrap_or(event);
    if HARDWARE_EVENTS.contains(&base) {
        CounterKind::Hardware
    } else {
        CounterKind::Software
    }
}

/// Explains a `perf_event_open` failure.
pub fn explain_open_error(err: &std::io::Error) -> String {
    let why = match err.raw_os_error().map(rustix::io::Errno::from_raw_os_error) {
        Some(rustix::io::Errno::NOSYS) => {
            "perf_event_open is not implemented here (ENOSYS; qemu-user or a kernel without perf)"
        }
        Some(rustix::io::Errno::NOENT) => "the kernel does not offer this event (ENOENT; no PMU access, e.g. in a VM)",
        Some(rustix::io::Errno::OPNOTSUPP) => "the PMU does not support this event (EOPNOTSUPP)",
        Some(rustix::io::Errno::ACCESS) | Some(rustix::io::Errno::PERM) => {
            "not permitted (EACCES/EPERM; see /proc/sys/kernel/perf_event_paranoid or CAP_PERFMON)"
        }
        Some(rustix::io::Errno::NODEV) => "no such PMU device (ENODEV)",
        _ => "perf_event_open failed",
    };
    format!("{why}: {err}")
}

#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
mod backend {
    //! The perf-event2 backend.

    use perf_event::events::{Cache, CacheId, CacheOp, CacheResult, Event, Hardware, Software};
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};

    use perf_event::{Builder, Counter};
    use tunefleet_common::measurement::{CounterReading, MissingCounter};

    use super::{explain_open_error, kind_of};

    /// One open counter and the name it is recorded under.
    #[derive(Debug)]
    pub struct OpenCounter {
        pub name: String,
        counter: Counter,
    }

    impl OpenCounter {
        pub fn peek(&mut self) -> Result<CounterReading, MissingCounter> {
            match self.counter.read_count_and_time() {
                Ok(ct) => Ok(CounterReading {
                    kind: kind_of(&self.name),
                    event: self.name.clone(),
                    value: ct.count,
                    time_enabled_ns: ct.time_enabled,
                    time_running_ns: ct.time_running,
                }),
                Err(e) => {
                    Err(MissingCounter { event: self.name.clone(), reason: format!("reading the counter failed: {e}") })
                }
            }
        }
    }

    /// Whom a set of counters observes.
    #[derive(Debug, Clone, Copy)]
    pub enum Target {
        /// A held process: counting starts when it execs; its children count.
        Exec(i32),
        /// The calling thread's children: inherited, disabled, each enabled
        /// when it execs (the thread itself never counts).
        Children,
        /// This thread, counting now.
        This,
        /// This thread, never counting (disabled, not inherited): held only
        /// to keep the event's code switched on in the kernel.
        Idle,
    }

    fn build<E: Event + Clone>(event: E, target: Target, include_kernel: bool) -> std::io::Result<Counter> {
        let mut b = Builder::new(event);
        match target {
            Target::Exec(pid) => {
                b.observe_pid(pid).enable_on_exec(true).inherit(true);
            }
            Target::Children => {
                b.observe_self().enable_on_exec(true).inherit(true);
            }
            Target::This => {
                b.observe_self().enabled(true);
            }
            Target::Idle => {
                b.observe_self();
            }
        }
        b.any_cpu().exclude_kernel(!include_kernel).exclude_hv(true);
        b.build()
    }

    fn is_permission(err: &std::io::Error) -> bool {
        matches!(
            err.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
            Some(rustix::io::Errno::ACCESS) | Some(rustix::io::Errno::PERM)
        )
    }

    /// Opens `event` including kernel mode when permitted, else user mode only.
    fn open_one<E: Event + Clone>(name: &str, event: E, target: Target) -> Result<OpenCounter, MissingCounter> {
        match build(event.clone(), target, true) {
            Ok(counter) => Ok(OpenCounter { name: name.to_string(), counter }),
            Err(e) if is_permission(&e) => match build(event, target, false) {
                Ok(counter) => Ok(OpenCounter { name: format!("{name}:u"), counter }),
                Err(e) => Err(MissingCounter { event: name.to_string(), reason: explain_open_error(&e) }),
            },
            Err(e) => Err(MissingCounter { event: name.to_string(), reason: explain_open_error(&e) }),
        }
    }

    fn software(name: &str) -> Option<Software> {
        Some(match name {
            "task-clock" => Software::TASK_CLOCK,
            "context-switches" => Software::CONTEXT_SWITCHES,
            "cpu-migrations" => Software::CPU_MIGRATIONS,
            "page-faults" => Software::PAGE_FAULTS,
            "minor-faults" => Software::PAGE_FAULTS_MIN,
            "major-faults" => Software::PAGE_FAULTS_MAJ,
            _ => return None,
        })
    }

    fn hardware(name: &str) -> Option<Hardware> {
        Some(match name {
            "instructions" => Hardware::INSTRUCTIONS,
            "cycles" => Hardware::CPU_CYCLES,
            "cache-references" => Hardware::CACHE_REFERENCES,
            "cache-misses" => Hardware::CACHE_MISSES,
            "branch-instructions" => Hardware::BRANCH_INSTRUCTIONS,
            "branch-misses" => Hardware::BRANCH_MISSES,
            "stalled-cycles-frontend" => Hardware::STALLED_CYCLES_FRONTEND,
            "stalled-cycles-backend" => Hardware::STALLED_CYCLES_BACKEND,
            _ => return None,
        })
    }

    fn cache(name: &str) -> Option<Cache> {
        let result = match name {
            "LLC-loads" => CacheResult::ACCESS,
            "LLC-load-misses" => CacheResult::MISS,
            _ => return None,
        };
        Some(Cache { which: CacheId::LL, operation: CacheOp::READ, result })
    }

    /// Events this kernel does not have (ENOENT, ENODEV, EOPNOTSUPP, ENOSYS:
    /// answers that do not change while the agent runs), with the reason,
    /// learnt at the first open: a trial does not ask the kernel again for
    /// the ten hardware events a VM refuses. Permission refusals are not
    /// kept (a sysctl can change them).
    static UNSUPPORTED: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());

    fn is_unsupported(reason: &str) -> bool {
        ["ENOENT", "ENODEV", "EOPNOTSUPP", "ENOSYS"].iter().any(|e| reason.contains(e))
    }

    /// One disabled counter of each software event, open for as long as the
    /// agent runs. The kernel turns each software event's code on (a static
    /// key: the kernel text patched, every CPU interrupted) when the first
    /// event of its kind is created and off when the last goes; a trial's
    /// counters, created and closed per trial, did that twice per trial
    /// when nothing else held them. These keep them on. They count nothing
    /// (never enabled, not inherited).
    static WARM: OnceLock<Mutex<Vec<OpenCounter>>> = OnceLock::new();

    fn keep_warm() {
        WARM.get_or_init(|| {
            let warm = super::SOFTWARE_EVENTS
                .iter()
                .filter_map(|name| open_one(name, software(name)?, Target::Idle).ok())
                .collect();
            Mutex::new(warm)
        });
    }

    /// What each kept-warm counter has counted (nothing, ever).
    #[cfg(test)]
    pub fn warm_counts() -> Vec<u64> {
        keep_warm();
        let Some(Ok(mut warm)) = WARM.get().map(Mutex::lock) else { return Vec::new() };
        warm.iter_mut().filter_map(|c| c.peek().ok()).map(|r| r.value).collect()
    }

    /// Opens every known event on `target`. Once the syscall itself is
    /// missing (ENOSYS), the rest is not tried; events found unsupported
    /// before are reported missing without asking the kernel again.
    pub fn open_all(target: Target) -> (Vec<OpenCounter>, Vec<MissingCounter>) {
        keep_warm();
        // Held while opening: trials starting at once wait a few syscalls.
        let mut unsupported = UNSUPPORTED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut open = Vec::new();
        let mut missing: Vec<MissingCounter> = Vec::new();
        let mut no_syscall: Option<String> = None;
        let names = super::SOFTWARE_EVENTS.iter().chain(super::HARDWARE_EVENTS.iter());
        for &name in names {
            if let Some(reason) = no_syscall.as_ref().or_else(|| unsupported.get(name)) {
                missing.push(MissingCounter { event: name.to_string(), reason: reason.clone() });
                continue;
            }
            let result = match (software(name), hardware(name), cache(name)) {
                (Some(ev), _, _) => open_one(name, ev, target),
                (None, Some(ev), _) => open_one(name, ev, target),
                (None, None, Some(ev)) => open_one(name, ev, target),
                (None, None, None) => continue,
            };
            match result {
                Ok(c) => open.push(c),
                Err(m) => {
                    if m.reason.contains("ENOSYS") {
                        no_syscall = Some(m.reason.clone());
                    }
                    if is_unsupported(&m.reason) {
                        unsupported.insert(name, m.reason.clone());
                    }
                    missing.push(m);
                }
            }
        }
        (open, missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_reasons() {
        assert_eq!(kind_of("instructions"), CounterKind::Hardware);
        assert_eq!(kind_of("cycles:u"), CounterKind::Hardware);
        assert_eq!(kind_of("task-clock"), CounterKind::Software);
        let nosys = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSYS.raw_os_error());
        assert!(explain_open_error(&nosys).contains("ENOSYS"));
        let all = CounterSet::all_missing("because");
        let outcome = all.finish(Duration::from_secs(1));
        assert!(outcome.readings.is_empty());
        assert!(outcome.series.is_empty());
        assert_eq!(outcome.missing.len(), SOFTWARE_EVENTS.len() + HARDWARE_EVENTS.len());
    }

    #[test]
    fn deltas_are_increments_never_negative() {
        assert_eq!(scaled_deltas(&[0.0, 10.0], &[5.0, 12.5]), vec![5.0, 2.5]);
        // A multiplexing estimate may step back a little: clamped, not negative.
        assert_eq!(scaled_deltas(&[10.0], &[9.0]), vec![0.0]);
        assert_eq!(scaled_deltas(&[], &[3.0]), vec![3.0]);
    }

    #[test]
    fn self_counters_sample_a_series_with_software_events() {
        let mut set = CounterSet::open_for_self();
        let events = set.open_events();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        set.sample(Duration::from_millis(10));
        let outcome = set.finish(Duration::from_millis(20));
        assert_eq!(outcome.readings.len(), events.len());
        assert_eq!(outcome.series.len(), 2);
        assert!(outcome.series.iter().all(|s| s.deltas.len() == events.len()));
        if let Some(i) = outcome.readings.iter().position(|r| r.event.starts_with("task-clock")) {
            let summed: f64 = outcome.series.iter().map(|s| s.deltas[i]).sum();
            assert!(summed > 0.0, "task-clock advanced");
            // The totals are read just after the last sample, on a running process.
            assert!(summed <= outcome.readings[i].scaled() + 1.0);
        }
        // Every asked-for event is either counted or missing with a reason.
        assert_eq!(outcome.readings.len() + outcome.missing.len(), SOFTWARE_EVENTS.len() + HARDWARE_EVENTS.len());
        assert!(outcome.missing.iter().all(|m| !m.reason.is_empty()));
    }

    /// The software events kept open to spare every trial the
    /// kernel's patching never count, whatever runs.
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    #[test]
    fn the_counters_kept_warm_count_nothing() {
        let counted = CounterSet::open_for_self();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let warm = backend::warm_counts();
        if counted.open_events().is_empty() {
            return; // no perf here: nothing is kept either
        }
        assert_eq!(warm.len(), SOFTWARE_EVENTS.len(), "one per software event");
        assert!(warm.iter().all(|&c| c == 0), "{warm:?}");
    }

    #[test]
    fn probe_lists_only_known_events() {
        for name in probe() {
            let base = name.strip_suffix(":u").unwrap_or(&name);
            assert!(SOFTWARE_EVENTS.contains(&base) || HARDWARE_EVENTS.contains(&base), "{name}");
        }
    }
}
