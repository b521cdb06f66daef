//! hwmon energy counters and power sensors: `{root}/hwmonN/` with a `name`
//! file and `energyK_input` (cumulative microjoules, as `amd_energy`
//! exposes) or `powerK_input` / `powerK_average` (microwatts, integrated
//! over time between samples). A device with energy counters is read
//! through them only; its power sensors are then ignored. Domains are
//! `{name}/{label}` (label from `energyK_label` / `powerK_label`, else
//! `energyK` / `powerK`). hwmon energy counters have no stated range; one
//! that goes backwards makes the reading invalid rather than being guessed at.
//!
//! # What is added to the total
//!
//! The sensors of one device are often rails of one another (an INA3221's
//! `VDD_IN` feeds its `VDD_CPU_GPU_CV` and `VDD_SOC`; a PSU's `pin` feeds
//! its `pout1`), and hwmon does not say which. So every sensor is read and
//! reported, but the total counts, per device, only:
//!
//! 1. its *input* sensor when it has one: the first whose label has the word
//!    `in`, `input`, `pin` or `total` (`VDD_IN`, `POM_5V_IN`, `Input Power`),
//!    or any sensor of an ACPI `power_meter` (the whole machine); the
//!    device's other sensors are parts of it;
//! 2. else its socket counters (`Esocket*`, `amd_energy`), one per socket:
//!    the per-core counters (`Ecore*`) are parts of them;
//! 3. else its one sensor;
//! 4. else (several sensors, topology unknown) its first sensor only: the
//!    others may be sub-rails of it, and the source's note names the one
//!    counted. This may undercount; it never counts a rail twice.
//!
//! Across devices: when some device has an input sensor, devices without
//! one are not added either (an input measures what is downstream of it:
//! the Jetson module's `VDD_IN` includes the rails of its second INA3221).
//! Devices that each have an input (two PSUs) are added up. Which domains
//! were counted is in every reading (`in_total`) and in the source's note.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tunefleet_common::measurement::EnergySourceKind;

use super::metered::{Channel, ChannelRead, MeteredSource};
use super::source::{read_text, EnergyError, SysfsRead};

/// The sensor number of `energy3_input` style files, for the given prefix and suffix.
pub fn sensor_index(file: &str, prefix: &str, suffix: &str) -> Option<u32> {
    file.strip_prefix(prefix)?.strip_suffix(suffix)?.parse().ok()
}

/// Names the ACPI power meter driver registers: the whole machine's input.
const WHOLE_MACHINE_DEVICES: [&str; 2] = ["power_meter", "acpi_power_meter"];

/// True when a sensor label names a device's input (or total) power:
/// one of its words (split at anything not a letter or digit) is `in`,
/// `input`, `pin` or `total`, in any case.
pub fn is_input_label(label: &str) -> bool {
    label
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| ["in", "input", "pin", "total"].iter().any(|k| w.eq_ignore_ascii_case(k)))
}

/// Why a device's sensors are counted the way they are (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Its input sensor alone (rule 1).
    Input,
    /// Its socket counters (rule 2).
    Sockets,
    /// Its only sensor (rule 3).
    Single,
    /// The first of several sensors whose topology is unknown (rule 4).
    First,
}

/// Which of one device's sensors (labels in sensor order) count towards the
/// total, and by which rule. `device` is the hwmon `name`.
pub fn counted_sensors(device: &str, labels: &[String]) -> (Vec<bool>, Counted) {
    let only = |i: usize| (0..labels.len()).map(|j| j == i).collect::<Vec<bool>>();
    if WHOLE_MACHINE_DEVICES.contains(&device) && !labels.is_empty() {
        return (only(0), Counted::Input);
    }
    if let Some(i) = labels.iter().position(|l| is_input_label(l)) {
        return (only(i), Counted::Input);
    }
    if labels.iter().any(|l| l.starts_with("Esocket")) {
        return (labels.iter().map(|l| l.starts_with("Esocket")).collect(), Counted::Sockets);
    }
    match labels.len() {
        1 => (vec![true], Counted::Single),
        _ => (only(0), Counted::First),
    }
}

/// One device's sensors of the kind it is read through.
struct Device {
    name: String,
    /// `(label, read)` in sensor order.
    sensors: Vec<(String, ChannelRead)>,
}

/// Finds hwmon energy counters and power sensors under `root`.
pub fn discover(root: &Path, fs: Arc<dyn SysfsRead>) -> Result<MeteredSource, EnergyError> {
    let not_found = || EnergyError::NotFound { kind: EnergySourceKind::Hwmon, root: root.to_path_buf() };
    let dirs = fs.list(root).map_err(|_| not_found())?;
    let devices: Vec<Device> = dirs.iter().filter_map(|dev| device(fs.as_ref(), dev)).collect();
    let plans: Vec<(Vec<bool>, Counted)> = devices
        .iter()
        .map(|d| counted_sensors(&d.name, &d.sensors.iter().map(|(l, _)| l.clone()).collect::<Vec<_>>()))
        .collect();
    let any_input = plans.iter().any(|(_, rule)| *rule == Counted::Input);
    let mut channels = Vec::new();
    let mut counted = Vec::new();
    for (dev, (in_total, rule)) in devices.into_iter().zip(plans) {
        let device_counts = !any_input || rule == Counted::Input;
        for ((label, read), in_total) in dev.sensors.into_iter().zip(in_total) {
            let domain = format!("{}/{label}", dev.name);
            let in_total = in_total && device_counts;
            if in_total {
                counted.push(match rule {
                    Counted::Input => format!("{domain} (input)"),
                    Counted::Sockets => format!("{domain} (socket)"),
                    Counted::Single => domain.clone(),
                    Counted::First => format!("{domain} (first of several rails)"),
                });
            }
            channels.push(Channel { domain, read, in_total });
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
        note: Some(format!(
            "energy counters where present, else power sensors integrated over time; counted: {} \
             (one figure per device, inputs over their rails)",
            counted.join(", ")
        )),
        fs,
    };
    source.check_readable()?;
    Ok(source)
}

/// A device's energy counters, else its power sensors; `None` without either.
fn device(fs: &dyn SysfsRead, dev: &Path) -> Option<Device> {
    let files = fs.list(dev).ok()?;
    let name = read_text(fs, &dev.join("name")).unwrap_or_else(|_| {
        dev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "hwmon".into())
    });
    let file_names: Vec<String> =
        files.iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
    let label = |kind: &str, i: u32| {
        read_text(fs, &dev.join(format!("{kind}{i}_label"))).unwrap_or_else(|_| format!("{kind}{i}"))
    };
    let mut energy: Vec<u32> = file_names.iter().filter_map(|f| sensor_index(f, "energy", "_input")).collect();
    energy.sort_unstable();
    let sensors: Vec<(String, ChannelRead)> = if !energy.is_empty() {
        energy
            .into_iter()
            .map(|i| {
                let path = dev.join(format!("energy{i}_input"));
                (label("energy", i), ChannelRead::EnergyUj { path, max_range_uj: None })
            })
            .collect()
    } else {
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
        power.sort_unstable();
        power
            .into_iter()
            .map(|(i, suffix)| {
                let path: PathBuf = dev.join(format!("power{i}{suffix}"));
                (label("power", i), ChannelRead::PowerUw { path })
            })
            .collect()
    };
    (!sensors.is_empty()).then_some(Device { name, sensors })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn sensor_indices() {
        assert_eq!(sensor_index("energy12_input", "energy", "_input"), Some(12));
        assert_eq!(sensor_index("power1_average", "power", "_average"), Some(1));
        assert_eq!(sensor_index("power1_input_highest", "power", "_input"), None);
        assert_eq!(sensor_index("energy_input", "energy", "_input"), None);
    }

    #[test]
    fn input_labels_are_whole_words() {
        for l in ["VDD_IN", "POM_5V_IN", "Input Power", "pin", "total", "P_in"] {
            assert!(is_input_label(l), "{l}");
        }
        for l in ["VDD_SYS_GPU", "VDD_CPU_GPU_CV", "power1", "Esocket0", "SVI2_P_Core", "PPT", "pout1", "VINT"] {
            assert!(!is_input_label(l), "{l}");
        }
    }

    #[test]
    fn one_figure_per_device() {
        let (c, r) = counted_sensors("ina3221", &labels(&["VDD_CPU_GPU_CV", "VDD_IN", "VDD_SOC"]));
        assert_eq!((c, r), (vec![false, true, false], Counted::Input));
        let (c, r) = counted_sensors("power_meter", &labels(&["power1"]));
        assert_eq!((c, r), (vec![true], Counted::Input));
        let (c, r) = counted_sensors("amd_energy", &labels(&["Ecore000", "Esocket0", "Esocket1"]));
        assert_eq!((c, r), (vec![false, true, true], Counted::Sockets));
        let (c, r) = counted_sensors("amdgpu", &labels(&["PPT"]));
        assert_eq!((c, r), (vec![true], Counted::Single));
        let (c, r) = counted_sensors("zenpower", &labels(&["SVI2_P_Core", "SVI2_P_SoC"]));
        assert_eq!((c, r), (vec![true, false], Counted::First));
    }
}
