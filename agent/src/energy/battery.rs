//! Battery fuel gauges (phones, laptops): `{root}/*` with `type` =
//! `Battery` (peripheral batteries, `scope` = `Device`, are ignored). Power
//! is `power_now` (microwatts) where present, else `current_now`
//! (microamperes) times `voltage_now` (microvolts); it is integrated over
//! time between samples.
//!
//! A fuel gauge sees the workload only while the machine runs on its
//! battery, so the reading is valid only if `status` says `Discharging` at
//! every sample. `Charging`, `Full` and `Not charging` all mean external
//! power (`Not charging`: plugged in, but charging is paused or capped), and
//! whatever the battery gives or takes then is not the machine's energy;
//! `Unknown` cannot be told apart from them.
//!
//! A power file that is there but may not be read is `PermissionDenied`
//! with how to grant access, never taken for a missing battery.

use std::path::Path;
use std::sync::Arc;

use tunefleet_common::measurement::EnergySourceKind;

pub use super::metered::{status_meaning, DISCHARGING};
use super::metered::{Channel, ChannelRead, MeteredSource};
use super::source::{read_i64, read_text, EnergyError, SysfsRead};

/// Finds battery fuel gauges under `root`.
pub fn discover(root: &Path, fs: Arc<dyn SysfsRead>) -> Result<MeteredSource, EnergyError> {
    let not_found = || EnergyError::NotFound { kind: EnergySourceKind::Battery, root: root.to_path_buf() };
    let supplies = fs.list(root).map_err(|_| not_found())?;
    let mut channels = Vec::new();
    let mut status = Vec::new();
    for dir in supplies {
        let text = |f: &str| read_text(fs.as_ref(), &dir.join(f)).ok();
        if text("type").as_deref() != Some("Battery") || text("scope").as_deref() == Some("Device") {
            continue;
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "battery".into());
        let Some(read) = power_files(fs.as_ref(), &dir)? else {
            tracing::debug!(battery = %name, "battery without power_now or current_now/voltage_now; ignored");
            continue;
        };
        status.push((name.clone(), dir.join("status")));
        channels.push(Channel { domain: name, read, in_total: true });
    }
    if channels.is_empty() {
        return Err(not_found());
    }
    let source = MeteredSource {
        kind: EnergySourceKind::Battery,
        channels,
        status,
        max_interval: None,
        note: Some("fuel gauge power integrated over time; valid only while discharging".into()),
        fs,
    };
    source.check_readable()?;
    Ok(source)
}

/// How a battery's power is read: `power_now` when it reads, else
/// `current_now` × `voltage_now`. Files that are there decide, not files
/// that read: when no way reads, the error is returned (a permission error
/// first, with how to grant access); `None` when the battery has neither.
fn power_files(fs: &dyn SysfsRead, dir: &Path) -> Result<Option<ChannelRead>, EnergyError> {
    let present: Vec<String> = fs
        .list(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let has = |f: &str| present.iter().any(|p| p == f);
    let mut ways = Vec::new();
    if has("power_now") {
        ways.push((ChannelRead::PowerUw { path: dir.join("power_now") }, vec![dir.join("power_now")]));
    }
    if has("current_now") && has("voltage_now") {
        let (current, voltage) = (dir.join("current_now"), dir.join("voltage_now"));
        ways.push((
            ChannelRead::CurrentVoltage { current: current.clone(), voltage: voltage.clone() },
            vec![current, voltage],
        ));
    }
    let mut errors = Vec::new();
    for (way, files) in ways {
        match files.iter().try_for_each(|f| read_i64(fs, f).map(drop)) {
            Ok(()) => return Ok(Some(way)),
            Err(e) => errors.push(e),
        }
    }
    match errors.iter().position(EnergyError::is_permission) {
        Some(i) => Err(errors.swap_remove(i)),
        None => errors.into_iter().next().map_or(Ok(None), Err),
    }
}
