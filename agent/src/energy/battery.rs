//! Battery fuel gauges (phones, laptops): `{root}/*` with `type` =
//! `Battery` (peripheral batteries, `scope` = `Device`, are ignored). Power
//! is `power_now` (microwatts) where present, else `current_now`
//! (microamperes) times `voltage_now` (microvolts); it is integrated over
//! time between samples. A fuel gauge sees the workload only while the
//! battery discharges: the reading is invalid if `status` says `Charging` or
//! `Full` at any sample.

use std::path::Path;
use std::sync::Arc;

use tunefleet_common::measurement::EnergySourceKind;

use super::{read_text, Channel, ChannelRead, EnergyError, MeteredSource, SysfsRead};

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
        let read = if text("power_now").is_some() {
            ChannelRead::PowerUw { path: dir.join("power_now") }
        } else if text("current_now").is_some() && text("voltage_now").is_some() {
            ChannelRead::CurrentVoltage { current: dir.join("current_now"), voltage: dir.join("voltage_now") }
        } else {
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
        note: Some("fuel gauge power integrated over time; invalid while charging or full".into()),
        fs,
    };
    source.check_readable()?;
    Ok(source)
}
