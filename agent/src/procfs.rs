//! What `/proc` tells about the workload: CPU times of a (zombie) process
//! and the peak resident set of a process group. The proc root is a
//! parameter so tests can point at a fixture tree.

use std::path::Path;

/// Fields of `/proc/PID/stat` the runner uses, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFields {
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
        pgrp: fields.get(5 - 3)?.parse().ok()?,
        utime: num(14)?,
        stime: num(15)?,
        cutime: num(16)?,
        cstime: num(17)?,
    })
}

/// Reads and parses `{proc_root}/{pid}/stat`.
pub fn read_stat(proc_root: &Path, pid: i32) -> Option<StatFields> {
    let text = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    parse_stat(&text)
}

/// The `VmHWM` (peak resident set, KiB) line of `/proc/PID/status`.
pub fn parse_vm_hwm_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line["VmHWM:".len()..].split_whitespace().next()?.parse().ok()
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
        let status = std::fs::read_to_string(entry.path().join("status")).ok();
        if let Some(kib) = status.as_deref().and_then(parse_vm_hwm_kib) {
            peak = Some(peak.map_or(kib, |p: u64| p.max(kib)));
        }
    }
    peak
}

/// Converts clock ticks to microseconds.
pub fn ticks_to_us(ticks: u64, ticks_per_second: u64) -> u64 {
    if ticks_per_second == 0 {
        return 0;
    }
    (u128::from(ticks) * 1_000_000 / u128::from(ticks_per_second)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (a (weird) name) Z 1 4242 4242 0 -1 4194828 100 0 0 0 250 30 7 2 20 0 1 0 1 0 0";

    #[test]
    fn parses_stat_with_odd_names() {
        let s = parse_stat(STAT).expect("parses");
        assert_eq!(s, StatFields { pgrp: 4242, utime: 250, stime: 30, cutime: 7, cstime: 2 });
        assert_eq!(parse_stat("12 (x) R 1"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn parses_vm_hwm() {
        assert_eq!(parse_vm_hwm_kib("Name:\tx\nVmHWM:\t  1234 kB\nVmRSS:\t 5 kB\n"), Some(1234));
        assert_eq!(parse_vm_hwm_kib("Name:\tx\n"), None);
    }

    #[test]
    fn scans_a_fixture_proc_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |pid: i32, pgrp: i32, hwm: u64| {
            let p = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&p).expect("mkdir");
            let stat = format!("{pid} (w) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 1 0 0");
            std::fs::write(p.join("stat"), stat).expect("write stat");
            std::fs::write(p.join("status"), format!("VmHWM:\t{hwm} kB\n")).expect("write status");
        };
        write(10, 10, 500);
        write(11, 10, 900);
        write(12, 99, 5000);
        std::fs::create_dir_all(dir.path().join("self")).expect("mkdir");
        assert_eq!(group_peak_rss_kib(dir.path(), 10), Some(900));
        assert_eq!(group_peak_rss_kib(dir.path(), 77), None);
        assert_eq!(ticks_to_us(250, 100), 2_500_000);
        assert_eq!(ticks_to_us(1, 0), 0);
    }
}
