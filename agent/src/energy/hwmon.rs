//! hwmon energy counters and power sensors: `{root}/hwmonN/` with a `name`
//! file and `energyK_input` (cumulative microjoules, as `amd_energy`
//! exposes) or `powerK_input` / `powerK_average` (microwatts, integrated
//! over time between samples). A device with energy counters is read
//! through them only; its power sensors are then ignored.
//!
//! Domains are `{name}/{label}` (label from `energyK_label` /
//! `powerK_label`, else `energyK` / `powerK`). When a device has socket
//! counters (`Esocket*` labels, `amd_energy`), its per-core counters
//! (`Ecore*`) are parts of them: reported, not added to the total. hwmon
//! energy counters have no stated range; one that goes backwards makes the
//! reading invalid rather than being guessed at.

use std::path::Path;
use std::sync::Arc;

use tunefleet_common::measurement::EnergySourceKind;

use super::{read_text, Channel, ChannelRead, EnergyError, MeteredSource, SysfsRead};

/// The sensor number of `energy3_input` style files, for the given prefix and suffix.
pub fn sensor_index(file: &str, prefix: &str, suffix: &str) -> Option<u32> {
    file.strip_prefix(prefix)?.strip_suffix(suffix)?.parse().ok()
}

/// Finds hwmon energy counters and power sensors under `root`.
pub fn discover(root: &Path, fs: Arc<dyn SysfsRead>) -> Result<MeteredSource, EnergyError> {
    let not_found = || EnergyError::NotFound { kind: EnergySourceKind::Hwmon, root: root.to_path_buf() };
    let devices = fs.list(root).map_err(|_| not_found())?;
    let mut channels = Vec::new();
    for dev in devices {
        let Some(files) = fs.list(&dev).ok() else { continue };
        let name = read_text(fs.as_ref(), &dev.join("name")).unwrap_or_else(|_| {
            dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "hwmon".into())
        });
        let file_names: Vec<String> =
            files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        let label = |kind: &str, i: u32| {
            read_text(fs.as_ref(), &dev.join(format!("{kind}{i}_label"))).unwrap_or_else(|_| format!("{kind}{i}"))
        };
        let mut energy: Vec<(u32, String)> = file_names
            .iter()
            .filter_map(|f| sensor_index(f, "energy", "_input"))
            .map(|i| (i, label("energy", i)))
            .collect();
        energy.sort();
        if !energy.is_empty() {
            let has_sockets = energy.iter().any(|(_, l)| l.starts_with("Esocket"));
            for (i, l) in energy {
                let in_total = !(has_sockets && l.starts_with("Ecore"));
                channels.push(Channel {
                    domain: format!("{name}/{l}"),
                    read: ChannelRead::EnergyUj { path: dev.join(format!("energy{i}_input")), max_range_uj: None },
                    in_total,
                });
            }
            continue;
        }
        let mut power: Vec<(u32, &str)> = Vec::new();
        for f in &file_names {
            for suffix in ["_input", "_average"] {
                if let Some(i) = sensor_index(f, "power", suffix) {
                    // One file per sensor: `_input` when both exist.
                    if !power.iter().any(|(j, s)| *j == i && *s == "_input") {
                        power.retain(|(j, _)| *j != i);
                        power.push((i, suffix));
                    }
                }
            }
        }
        power.sort();
        for (i, suffix) in power {
            channels.push(Channel {
                domain: format!("{name}/{}", label("power", i)),
                read: ChannelRead::PowerUw { path: dev.join(format!("power{i}{suffix}")) },
                in_total: true,
            });
        }
    }
    if channels.is_empty() {
        return Err(not_found());
    }
    let source = MeteredSource {
        kind: EnergySourceKind::Hwmon,
        channels,
        status: Vec::new(),
        max_interval: None,
        note: Some("energy counters where present, else power sensors integrated over time".into()),
        fs,
    };
    source.check_readable()?;
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sensor_indices() {
        assert_eq!(sensor_index("energy12_input", "energy", "_input"), Some(12));
        assert_eq!(sensor_index("power1_average", "power", "_average"), Some(1));
        assert_eq!(sensor_index("power1_input_highest", "power", "_input"), None);
        assert_eq!(sensor_index("energy_input", "energy", "_input"), None);
    }
}
