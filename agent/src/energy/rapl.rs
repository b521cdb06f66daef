//! RAPL through the powercap sysfs interface, as Intel and (on recent
//! kernels) AMD expose it: `{root}/intel-rapl:N` are top-level zones
//! (`package-N`, `psys`), `{root}/intel-rapl:N:M` their sub-zones (`core`,
//! `uncore`, `dram`), each named by its `name` file, each with a cumulative
//! `energy_uj` that wraps after `max_energy_range_uj`. `intel-rapl-mmio:*`
//! zones repeat the package counters through another interface and are
//! ignored.
//!
//! What is counted in the total, so nothing is counted twice:
//! packages, plus `dram` sub-zones (DRAM is outside the package's energy);
//! `core` and `uncore` are parts of their package and only reported;
//! `psys` (the whole platform, overlapping the packages) is counted only on
//! a machine without package zones. Domains are named `package-0`,
//! `package-0/core`, `psys`...
//!
//! Wrap-around: [`counter_delta`] assumes at most one wrap between two
//! samples; several wraps are indistinguishable from one, so the runner
//! samples at least every [`max_sampling_interval`] (half the time the
//! counter needs to go through its range at the zone's maximum power).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tunefleet_common::measurement::EnergySourceKind;

pub use super::metered::counter_delta;
use super::metered::{Channel, ChannelRead, MeteredSource};
use super::source::{read_i64, read_text, EnergyError, SysfsRead};

/// Power assumed when a zone does not state its maximum (`constraint_0_max_power_uw`).
pub const ASSUMED_MAX_WATTS: f64 = 500.0;

/// The longest interval between samples that cannot hide a wrap: half the
/// time a counter with range `max_range_uj` needs to wrap at `max_watts`.
pub fn max_sampling_interval(max_range_uj: u64, max_watts: f64) -> Option<Duration> {
    if max_range_uj == 0 || !max_watts.is_finite() || max_watts <= 0.0 {
        return None;
    }
    let secs_to_wrap = max_range_uj as f64 / 1e6 / max_watts;
    Duration::try_from_secs_f64(secs_to_wrap / 2.0).ok()
}

/// A zone directory's id: `intel-rapl:0` -> `[0]`, `intel-rapl:0:2` -> `[0, 2]`.
pub fn zone_id(dir_name: &str) -> Option<Vec<u32>> {
    let rest = dir_name.strip_prefix("intel-rapl:")?;
    let parts: Option<Vec<u32>> = rest.split(':').map(|p| p.parse().ok()).collect();
    parts.filter(|p| !p.is_empty() && p.len() <= 2)
}

#[derive(Debug)]
struct Zone {
    id: Vec<u32>,
    dir: PathBuf,
    name: String,
}

/// Finds the RAPL zones under `root`. `NotFound` when there are none;
/// `PermissionDenied` when a zone's `energy_uj` cannot be read.
pub fn discover(root: &Path, fs: Arc<dyn SysfsRead>) -> Result<MeteredSource, EnergyError> {
    let not_found = || EnergyError::NotFound { kind: EnergySourceKind::Rapl, root: root.to_path_buf() };
    let entries = fs.list(root).map_err(|_| not_found())?;
    let mut zones = Vec::new();
    for dir in entries {
        let Some(id) = dir.file_name().and_then(|n| n.to_str()).and_then(zone_id) else { continue };
        let Ok(name) = read_text(fs.as_ref(), &dir.join("name")) else {
            tracing::debug!(zone = %dir.display(), "RAPL zone without a readable name; ignored");
            continue;
        };
        zones.push(Zone { id, dir, name });
    }
    if zones.is_empty() {
        return Err(not_found());
    }
    zones.sort_by(|a, b| a.id.cmp(&b.id));
    let has_package = zones.iter().any(|z| z.id.len() == 1 && z.name.starts_with("package"));
    let mut channels = Vec::new();
    let mut max_interval: Option<Duration> = None;
    for zone in &zones {
        let domain = if zone.id.len() == 1 {
            zone.name.clone()
        } else {
            let parent = zones.iter().find(|p| p.id.len() == 1 && p.id[0] == zone.id[0]);
            match parent {
                Some(p) => format!("{}/{}", p.name, zone.name),
                None => format!("zone-{}/{}", zone.id[0], zone.name),
            }
        };
        let in_total = match (zone.id.len(), zone.name.as_str()) {
            (1, "psys") => !has_package,
            (1, _) => true,
            (_, "dram") => true,
            _ => false,
        };
        let range =
            read_i64(fs.as_ref(), &zone.dir.join("max_energy_range_uj")).ok().and_then(|v| u64::try_from(v).ok());
        let max_watts = read_i64(fs.as_ref(), &zone.dir.join("constraint_0_max_power_uw"))
            .ok()
            .filter(|uw| *uw > 0)
            .map_or(ASSUMED_MAX_WATTS, |uw| uw as f64 / 1e6);
        if let Some(limit) = range.and_then(|r| max_sampling_interval(r, max_watts)) {
            max_interval = Some(max_interval.map_or(limit, |m: Duration| m.min(limit)));
        }
        channels.push(Channel {
            domain,
            read: ChannelRead::EnergyUj { path: zone.dir.join("energy_uj"), max_range_uj: range },
            in_total,
        });
    }
    let source = MeteredSource {
        kind: EnergySourceKind::Rapl,
        channels,
        status: Vec::new(),
        max_interval,
        note: Some(
            "total = packages + dram; core/uncore are parts of their package; psys only without packages".into(),
        ),
        fs,
    };
    source.check_readable()?;
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: u64 = 262_143_328_850;

    #[test]
    fn delta_without_wrap_and_with_one_wrap() {
        assert_eq!(counter_delta(100, 250, Some(RANGE)), Some(150));
        assert_eq!(counter_delta(5, 5, None), Some(0));
        assert_eq!(counter_delta(RANGE - 10, 30, Some(RANGE)), Some(40));
        assert_eq!(counter_delta(RANGE, 0, Some(RANGE)), Some(0));
    }

    #[test]
    fn backwards_without_a_usable_range_is_unknown_not_zero() {
        assert_eq!(counter_delta(500, 100, None), None);
        assert_eq!(counter_delta(500, 100, Some(0)), None);
        // A previous value above the range means the range is wrong.
        assert_eq!(counter_delta(RANGE + 5, 100, Some(RANGE)), None);
    }

    #[test]
    fn several_wraps_look_like_one() {
        let prev = RANGE - 10;
        let advance = |uj: u64| (prev + uj) % RANGE;
        assert_eq!(advance(40), 30);
        // 40 uJ and a whole range more leave the counter at the same value...
        assert_eq!(advance(40), advance(40 + RANGE));
        // ...so both read as 40 uJ: why the interval must be short enough.
        assert_eq!(counter_delta(prev, advance(40 + RANGE), Some(RANGE)), Some(40));
    }

    #[test]
    fn interval_from_range_and_power() {
        // 262143 J at 100 W wraps in 2621.4 s; sample at least every half of that.
        let d = max_sampling_interval(RANGE, 100.0).expect("limit");
        assert!((d.as_secs_f64() - 1310.7).abs() < 0.1, "{d:?}");
        // A small 32-bit counter at 200 W: 65.5 J range wraps in 0.33 s.
        let d = max_sampling_interval(65_532_610, 200.0).expect("limit");
        assert!(d < Duration::from_millis(200), "{d:?}");
        assert_eq!(max_sampling_interval(0, 100.0), None);
        assert_eq!(max_sampling_interval(RANGE, 0.0), None);
    }

    #[test]
    fn zone_ids() {
        assert_eq!(zone_id("intel-rapl:0"), Some(vec![0]));
        assert_eq!(zone_id("intel-rapl:1:2"), Some(vec![1, 2]));
        assert_eq!(zone_id("intel-rapl"), None);
        assert_eq!(zone_id("intel-rapl-mmio:0"), None);
        assert_eq!(zone_id("intel-rapl:x"), None);
        assert_eq!(zone_id("intel-rapl:0:1:2"), None);
    }
}
