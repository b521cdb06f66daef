//! perf counters over the workload's whole process tree.
//!
//! Counters are opened on the exec wrapper's pid before it is let go, with
//! `enable_on_exec` (counting starts at the workload's first instruction)
//! and `inherit` (children and threads are counted too). Kernel-mode counts
//! are included when the kernel permits it; otherwise the counter counts
//! user mode only and its event name gets perf's `:u` suffix, so the record
//! says what was measured. Events the kernel does not offer (hardware events
//! in VMs, everything under qemu-user) are listed as missing with the reason.
//!
//! Only Linux on x86_64 and aarch64 has the perf backend; elsewhere every
//! event is reported missing.

use tunefleet_common::measurement::{CounterKind, CounterReading, MissingCounter};

/// Software events, always asked for.
pub const SOFTWARE_EVENTS: [&str; 6] =
    ["task-clock", "context-switches", "cpu-migrations", "page-faults", "minor-faults", "major-faults"];
/// Hardware events, asked for when the kernel offers them.
pub const HARDWARE_EVENTS: [&str; 6] =
    ["instructions", "cycles", "cache-references", "cache-misses", "branch-instructions", "branch-misses"];

/// Counters attached to one workload.
#[derive(Debug)]
pub struct CounterSet {
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    open: Vec<backend::OpenCounter>,
    missing: Vec<MissingCounter>,
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
        }
    }

    /// Opens every event on `pid` (disabled until it execs).
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn open_for_exec(pid: i32) -> Self {
        let (open, missing) = backend::open_all(Some(pid));
        CounterSet { open, missing }
    }

    /// Opens every event on `pid` (disabled until it execs).
    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    pub fn open_for_exec(_pid: i32) -> Self {
        CounterSet::all_missing("perf counters are not supported on this platform")
    }

    /// Reads the counters; call after the process tree has exited.
    pub fn finish(self) -> (Vec<CounterReading>, Vec<MissingCounter>) {
        #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            let mut readings = Vec::new();
            let mut missing = self.missing;
            for counter in self.open {
                match counter.read() {
                    Ok(r) => readings.push(r),
                    Err(m) => missing.push(m),
                }
            }
            (readings, missing)
        }
        #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
        {
            (Vec::new(), self.missing)
        }
    }
}

/// The events that can be opened on this process right now, as recorded
/// names (`task-clock` or `task-clock:u`), for the agent's capabilities.
pub fn probe() -> Vec<String> {
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        backend::open_all(None).0.iter().map(|c| c.name.clone()).collect()
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

    use perf_event::events::{Event, Hardware, Software};
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
        pub fn read(mut self) -> Result<CounterReading, MissingCounter> {
            match self.counter.read_count_and_time() {
                Ok(ct) => Ok(CounterReading {
                    kind: kind_of(&self.name),
                    event: self.name,
                    value: ct.count,
                    time_enabled_ns: ct.time_enabled,
                    time_running_ns: ct.time_running,
                }),
                Err(e) => Err(MissingCounter { event: self.name, reason: format!("reading the counter failed: {e}") }),
            }
        }
    }

    fn build<E: Event + Copy>(event: E, pid: Option<i32>, include_kernel: bool) -> std::io::Result<Counter> {
        let mut b = Builder::new(event);
        match pid {
            Some(pid) => {
                b.observe_pid(pid).enable_on_exec(true).inherit(true);
            }
            None => {
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
    fn open_one<E: Event + Copy>(name: &str, event: E, pid: Option<i32>) -> Result<OpenCounter, MissingCounter> {
        match build(event, pid, true) {
            Ok(counter) => Ok(OpenCounter { name: name.to_string(), counter }),
            Err(e) if is_permission(&e) => match build(event, pid, false) {
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
            _ => return None,
        })
    }

    /// Opens every known event on `pid` (or on this process when `None`).
    /// Once the syscall itself is missing (ENOSYS), the rest is not tried.
    pub fn open_all(pid: Option<i32>) -> (Vec<OpenCounter>, Vec<MissingCounter>) {
        let mut open = Vec::new();
        let mut missing: Vec<MissingCounter> = Vec::new();
        let mut no_syscall: Option<String> = None;
        let names = super::SOFTWARE_EVENTS.iter().chain(super::HARDWARE_EVENTS.iter());
        for name in names {
            if let Some(reason) = &no_syscall {
                missing.push(MissingCounter { event: name.to_string(), reason: reason.clone() });
                continue;
            }
            let result = match (software(name), hardware(name)) {
                (Some(ev), _) => open_one(name, ev, pid),
                (None, Some(ev)) => open_one(name, ev, pid),
                (None, None) => continue,
            };
            match result {
                Ok(c) => open.push(c),
                Err(m) => {
                    if m.reason.contains("ENOSYS") {
                        no_syscall = Some(m.reason.clone());
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
        let (readings, missing) = all.finish();
        assert!(readings.is_empty());
        assert_eq!(missing.len(), SOFTWARE_EVENTS.len() + HARDWARE_EVENTS.len());
    }

    #[test]
    fn probe_lists_only_known_events() {
        for name in probe() {
            let base = name.strip_suffix(":u").unwrap_or(&name);
            assert!(SOFTWARE_EVENTS.contains(&base) || HARDWARE_EVENTS.contains(&base), "{name}");
        }
    }
}
