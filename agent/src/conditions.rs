//! Device conditions that make a measurement unrepresentative, on phones
//! and laptops: on external power, a low battery, thermal throttling. Read
//! from sysfs roots given as parameters (defaults [`POWER_SUPPLY_ROOT`],
//! [`THERMAL_ROOT`], [`CPU_ROOT`]) into
//! [`tunefleet_common::measurement::Conditions`], published with every
//! telemetry sample; [`assess`] (pure) says what is wrong for measuring, and
//! [`Gate`] reports changes, so the agent takes no trials while they last
//! and flags the measurement of any trial that runs through them.
//!
//! # What is read
//!
//! * **Charging** (on external power): a system battery (`type` `Battery`,
//!   not `scope` `Device`, so no mouse) whose `status` is `Charging`,
//!   `Full` or `Not charging` (all three mean plugged in, see
//!   [`crate::energy::battery`]), or any other supply (`Mains`, `USB`...)
//!   with `online` = 1. Not charging: a battery `Discharging`, or an
//!   adapter with `online` = 0. `None` without any power supply (a server).
//! * **Battery percent**: `capacity` of the system batteries, weighted by
//!   their `energy_full` (or `charge_full`) when every one has it, else
//!   their mean. `None` without a battery.
//! * **Throttled**, when any of these says so (`None` when none of them
//!   exists here):
//!   1. a thermal zone at or above its lowest `passive` trip point: where
//!      the kernel's thermal governor starts cutting CPU frequency;
//!   2. a CPU cooling device engaged: `cur_state` above 0 on a
//!      `cooling_deviceN` whose `type` contains `cpufreq` (ARM and Android
//!      cpufreq cooling) or is `Processor` (x86 ACPI processor throttling);
//!   3. on x86, a `thermal_throttle/core_throttle_count` or
//!      `package_throttle_count` of some CPU that grew since the previous
//!      reading (the CPU hit its thermal limit in between).
//!
//!   Not used: `scaling_cur_freq` below `scaling_max_freq`. That is the
//!   governor saving power on an idle or lightly loaded CPU, the normal
//!   case, not a sign of heat; taking it for throttling would stop a
//!   healthy idle device from measuring at all.
//! * **Temperature**: the hottest thermal zone, in °C (readings outside
//!   -50 to 200 °C are sensors that are off or broken, and ignored).
//!
//! # When conditions are bad
//!
//! [`assess`]: throttled; on external power when the energy source is the
//! battery (a fuel gauge measures nothing then); or, on battery, a charge
//! below `--min-battery` (default [`DEFAULT_MIN_BATTERY`] %, where phones
//! turn on battery saving and slow down; 0 turns the check off). The
//! reasons read `device charging`, `battery 12 % below 20 %`,
//! `CPU throttled (hottest zone 91 °C)`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tunefleet_common::measurement::Conditions;

use crate::energy::{read_i64, read_text, RealFs, SysfsRead};

pub use crate::energy::POWER_SUPPLY_ROOT;
pub use tunefleet_common::agent_cli::{CPU_ROOT, DEFAULT_MIN_BATTERY, THERMAL_ROOT};

/// Where conditions are read, and the battery threshold.
#[derive(Debug, Clone)]
pub struct ConditionsConfig {
    pub power_supply: PathBuf,
    pub thermal: PathBuf,
    pub cpu: PathBuf,
    /// Percent; 0: no battery check.
    pub min_battery: f64,
    pub fs: Arc<dyn SysfsRead>,
}

impl Default for ConditionsConfig {
    fn default() -> Self {
        ConditionsConfig {
            power_supply: PathBuf::from(POWER_SUPPLY_ROOT),
            thermal: PathBuf::from(THERMAL_ROOT),
            cpu: PathBuf::from(CPU_ROOT),
            min_battery: DEFAULT_MIN_BATTERY,
            fs: Arc::new(RealFs),
        }
    }
}

impl ConditionsConfig {
    /// The three roots under one directory (`power_supply`, `thermal`, `cpu`).
    pub fn under(dir: &Path) -> Self {
        ConditionsConfig {
            power_supply: dir.join("power_supply"),
            thermal: dir.join("thermal"),
            cpu: dir.join("cpu"),
            ..ConditionsConfig::default()
        }
    }
}

/// Reads conditions; keeps the x86 throttle counters between readings.
#[derive(Debug)]
pub struct ConditionsReader {
    config: ConditionsConfig,
    throttle_counts: BTreeMap<PathBuf, i64>,
}

impl ConditionsReader {
    pub fn new(config: ConditionsConfig) -> Self {
        let mut reader = ConditionsReader { config, throttle_counts: BTreeMap::new() };
        reader.throttle_counts = throttle_counts(reader.config.fs.as_ref(), &reader.config.cpu);
        reader
    }

    /// The conditions now.
    pub fn read(&mut self) -> Conditions {
        let fs = self.config.fs.as_ref();
        let (charging, battery_percent) = power_supply(fs, &self.config.power_supply);
        let thermal = thermal(fs, &self.config.thermal);
        let counts = throttle_counts(fs, &self.config.cpu);
        let counted = (!counts.is_empty())
            .then(|| counts.iter().any(|(path, n)| self.throttle_counts.get(path).is_some_and(|before| n > before)));
        self.throttle_counts = counts;
        let signals = [thermal.past_passive, thermal.cpu_cooling, counted];
        let throttled = signals.iter().any(Option::is_some).then(|| signals.contains(&Some(true)));
        Conditions { charging, battery_percent, throttled, temperature_c: thermal.hottest_c }
    }
}

fn entries(fs: &dyn SysfsRead, dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs
        .list(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix)))
        .collect();
    found.sort();
    found
}

/// `(charging, battery percent)` from the power supplies under `root`.
pub fn power_supply(fs: &dyn SysfsRead, root: &Path) -> (Option<bool>, Option<f64>) {
    let mut external: Option<bool> = None;
    let mut note = |on: bool| external = Some(external.unwrap_or(false) || on);
    let mut batteries: Vec<(f64, Option<f64>)> = Vec::new();
    for dir in entries(fs, root, "") {
        let text = |f: &str| read_text(fs, &dir.join(f)).ok();
        if text("scope").as_deref() == Some("Device") {
            continue;
        }
        match text("type").as_deref() {
            Some("Battery") => {
                match text("status").as_deref() {
                    Some("Charging" | "Full" | "Not charging") => note(true),
                    Some("Discharging") => note(false),
                    _ => {}
                }
                if let Some(capacity) = read_i64(fs, &dir.join("capacity")).ok().filter(|c| (0..=100).contains(c)) {
                    let full = ["energy_full", "charge_full"]
                        .iter()
                        .find_map(|f| read_i64(fs, &dir.join(f)).ok().filter(|v| *v > 0))
                        .map(|v| v as f64);
                    batteries.push((capacity as f64, full));
                }
            }
            Some(_) => {
                if let Ok(online) = read_i64(fs, &dir.join("online")) {
                    note(online > 0);
                }
            }
            None => {}
        }
    }
    let percent = if batteries.is_empty() {
        None
    } else if let Some(weights) = batteries.iter().map(|(_, w)| *w).collect::<Option<Vec<f64>>>() {
        let total: f64 = weights.iter().sum();
        Some(batteries.iter().zip(&weights).map(|((c, _), w)| c * w).sum::<f64>() / total)
    } else {
        Some(batteries.iter().map(|(c, _)| c).sum::<f64>() / batteries.len() as f64)
    };
    (external, percent)
}

/// What the thermal zones and cooling devices say.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Thermal {
    pub hottest_c: Option<f64>,
    /// Some zone at or above its lowest passive trip point; `None`: no zone
    /// has one.
    pub past_passive: Option<bool>,
    /// Some CPU cooling device engaged; `None`: no CPU cooling device.
    pub cpu_cooling: Option<bool>,
}

/// Millidegrees to degrees, for plausible readings only.
fn celsius(milli: i64) -> Option<f64> {
    let c = milli as f64 / 1000.0;
    (-50.0..=200.0).contains(&c).then_some(c)
}

/// Reads the thermal zones and cooling devices under `root`.
pub fn thermal(fs: &dyn SysfsRead, root: &Path) -> Thermal {
    let mut out = Thermal::default();
    for zone in entries(fs, root, "thermal_zone") {
        let Some(temp) = read_i64(fs, &zone.join("temp")).ok().and_then(celsius) else { continue };
        out.hottest_c = Some(out.hottest_c.map_or(temp, |h: f64| h.max(temp)));
        let passive = (0..32)
            .map_while(|k| read_text(fs, &zone.join(format!("trip_point_{k}_type"))).ok().map(|t| (k, t)))
            .filter(|(_, kind)| kind == "passive")
            .filter_map(|(k, _)| read_i64(fs, &zone.join(format!("trip_point_{k}_temp"))).ok().and_then(celsius))
            .filter(|t| *t > 0.0)
            .fold(None, |low: Option<f64>, t| Some(low.map_or(t, |l| l.min(t))));
        if let Some(trip) = passive {
            out.past_passive = Some(out.past_passive.unwrap_or(false) || temp >= trip);
        }
    }
    for device in entries(fs, root, "cooling_device") {
        let Ok(kind) = read_text(fs, &device.join("type")) else { continue };
        if !(kind.contains("cpufreq") || kind == "Processor") {
            continue;
        }
        if let Ok(state) = read_i64(fs, &device.join("cur_state")) {
            out.cpu_cooling = Some(out.cpu_cooling.unwrap_or(false) || state > 0);
        }
    }
    out
}

/// Every `cpuN/thermal_throttle/{core,package}_throttle_count` under `root`.
fn throttle_counts(fs: &dyn SysfsRead, root: &Path) -> BTreeMap<PathBuf, i64> {
    let mut counts = BTreeMap::new();
    for cpu in entries(fs, root, "cpu") {
        let is_cpu = cpu.file_name().and_then(|n| n.to_str()).is_some_and(|n| n[3..].parse::<u32>().is_ok());
        if !is_cpu {
            continue;
        }
        for file in ["core_throttle_count", "package_throttle_count"] {
            let path = cpu.join("thermal_throttle").join(file);
            if let Ok(n) = read_i64(fs, &path) {
                counts.insert(path, n);
            }
        }
    }
    counts
}

/// What decides whether conditions are good for measuring.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// Percent; 0: no battery check.
    pub min_battery: f64,
    /// The energy source is the battery's fuel gauge: external power
    /// makes its figures meaningless.
    pub battery_energy: bool,
}

/// Why conditions are bad for measuring.
#[derive(Debug, Clone, PartialEq)]
pub enum Problem {
    /// On external power while the battery is the energy source.
    Charging,
    /// On battery, below the threshold.
    LowBattery { percent: f64, min: f64 },
    /// Thermally throttled; the hottest zone when known.
    Throttled { temperature_c: Option<f64> },
}

impl Problem {
    /// The kind of problem, apart from its figures.
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::Charging => "charging",
            Problem::LowBattery { .. } => "battery",
            Problem::Throttled { .. } => "throttled",
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Charging => f.write_str("device charging"),
            Problem::LowBattery { percent, min } => write!(f, "battery {percent:.0} % below {min:.0} %"),
            Problem::Throttled { temperature_c: Some(t) } => write!(f, "CPU throttled (hottest zone {t:.0} °C)"),
            Problem::Throttled { temperature_c: None } => f.write_str("CPU throttled"),
        }
    }
}

/// What is wrong with `c` for measuring; empty: good. Unknown fields
/// (`None`) are never a problem: a server has no battery.
pub fn assess(c: &Conditions, policy: &Policy) -> Vec<Problem> {
    let mut problems = Vec::new();
    let on_external_power = c.charging == Some(true);
    if on_external_power && policy.battery_energy {
        problems.push(Problem::Charging);
    }
    if let Some(percent) = c.battery_percent {
        if !on_external_power && percent < policy.min_battery {
            problems.push(Problem::LowBattery { percent, min: policy.min_battery });
        }
    }
    if c.throttled == Some(true) {
        problems.push(Problem::Throttled { temperature_c: c.temperature_c });
    }
    problems
}

/// Watches conditions sample after sample and reports changes only: the
/// agent's state hears of them (and the log says so) once per change.
#[derive(Debug)]
pub struct Gate {
    policy: Policy,
    /// The kinds of problem last reported.
    kinds: Vec<&'static str>,
}

impl Gate {
    pub fn new(policy: Policy) -> Self {
        Gate { policy, kinds: Vec::new() }
    }

    /// The reasons conditions are bad now (empty: good), when the kinds of
    /// problem changed since the last call; `None` when nothing changed.
    pub fn check(&mut self, c: &Conditions) -> Option<Vec<String>> {
        let problems = assess(c, &self.policy);
        let kinds: Vec<&'static str> = problems.iter().map(Problem::kind).collect();
        if kinds == self.kinds {
            return None;
        }
        let reasons: Vec<String> = problems.iter().map(ToString::to_string).collect();
        if reasons.is_empty() {
            tracing::info!("device conditions good again: taking trials");
        } else {
            tracing::warn!(
                reasons = %reasons.join("; "),
                "device conditions bad for measuring: no new trials, running ones flagged"
            );
        }
        self.kinds = kinds;
        Some(reasons)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture tree: `power_supply/`, `thermal/`, `cpu/` under a temp dir.
    struct Tree {
        dir: tempfile::TempDir,
    }

    impl Tree {
        fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            for sub in ["power_supply", "thermal", "cpu"] {
                std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
            }
            Tree { dir }
        }

        fn write(&self, rel: &str, content: &str) {
            let path = self.dir.path().join(rel);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, format!("{content}\n")).expect("write");
        }

        fn battery(&self, name: &str, status: &str, capacity: u32) {
            self.write(&format!("power_supply/{name}/type"), "Battery");
            self.write(&format!("power_supply/{name}/status"), status);
            self.write(&format!("power_supply/{name}/capacity"), &capacity.to_string());
        }

        fn adapter(&self, name: &str, kind: &str, online: bool) {
            self.write(&format!("power_supply/{name}/type"), kind);
            self.write(&format!("power_supply/{name}/online"), if online { "1" } else { "0" });
        }

        /// A zone at `temp_c` with a passive trip point at `passive_c`.
        fn zone(&self, n: u32, temp_c: f64, passive_c: Option<f64>) {
            let zone = format!("thermal/thermal_zone{n}");
            self.write(&format!("{zone}/type"), "cpu-thermal");
            self.write(&format!("{zone}/temp"), &((temp_c * 1000.0) as i64).to_string());
            self.write(&format!("{zone}/trip_point_0_type"), "critical");
            self.write(&format!("{zone}/trip_point_0_temp"), "105000");
            if let Some(p) = passive_c {
                self.write(&format!("{zone}/trip_point_1_type"), "passive");
                self.write(&format!("{zone}/trip_point_1_temp"), &((p * 1000.0) as i64).to_string());
            }
        }

        fn reader(&self) -> ConditionsReader {
            ConditionsReader::new(ConditionsConfig::under(self.dir.path()))
        }
    }

    const ON_BATTERY: Policy = Policy { min_battery: 20.0, battery_energy: true };

    #[test]
    fn charging_phone() {
        let t = Tree::new();
        t.battery("battery", "Charging", 64);
        t.adapter("usb", "USB", true);
        t.zone(0, 38.5, Some(70.0));
        let c = t.reader().read();
        assert_eq!(c.charging, Some(true));
        assert_eq!(c.battery_percent, Some(64.0));
        assert_eq!(c.throttled, Some(false));
        assert_eq!(c.temperature_c, Some(38.5));
        assert_eq!(assess(&c, &ON_BATTERY), [Problem::Charging]);
        assert_eq!(assess(&c, &ON_BATTERY)[0].to_string(), "device charging");
        // Measuring with RAPL, a laptop on its charger is fine.
        assert!(assess(&c, &Policy { battery_energy: false, ..ON_BATTERY }).is_empty());
    }

    #[test]
    fn discharging_with_a_low_battery() {
        let t = Tree::new();
        t.battery("BAT0", "Discharging", 12);
        t.adapter("AC", "Mains", false);
        let c = t.reader().read();
        assert_eq!((c.charging, c.battery_percent), (Some(false), Some(12.0)));
        assert_eq!(c.throttled, None, "no thermal information at all");
        let problems = assess(&c, &ON_BATTERY);
        assert_eq!(problems, [Problem::LowBattery { percent: 12.0, min: 20.0 }]);
        assert_eq!(problems[0].to_string(), "battery 12 % below 20 %");
        assert!(assess(&c, &Policy { min_battery: 0.0, ..ON_BATTERY }).is_empty(), "0 turns the check off");
        assert!(assess(&c, &Policy { min_battery: 12.0, ..ON_BATTERY }).is_empty(), "at the threshold is enough");
    }

    #[test]
    fn full_on_the_charger_is_external_power() {
        let t = Tree::new();
        t.battery("BAT0", "Full", 100);
        // A peripheral's battery says nothing of the device.
        t.battery("hid-mouse", "Discharging", 5);
        t.write("power_supply/hid-mouse/scope", "Device");
        let c = t.reader().read();
        assert_eq!((c.charging, c.battery_percent), (Some(true), Some(100.0)));
        assert_eq!(assess(&c, &ON_BATTERY), [Problem::Charging]);
        // Low charge does not matter on external power.
        t.battery("BAT0", "Not charging", 10);
        let c = t.reader().read();
        assert!(assess(&c, &Policy { battery_energy: false, ..ON_BATTERY }).is_empty());
    }

    #[test]
    fn two_batteries_weighted_by_their_capacity() {
        let t = Tree::new();
        t.battery("BAT0", "Discharging", 10);
        t.write("power_supply/BAT0/energy_full", "20000000");
        t.battery("BAT1", "Discharging", 70);
        t.write("power_supply/BAT1/energy_full", "60000000");
        assert_eq!(t.reader().read().battery_percent, Some(55.0));
        t.write("power_supply/BAT1/energy_full", "garbage");
        assert_eq!(t.reader().read().battery_percent, Some(40.0), "a mean without every weight");
    }

    #[test]
    fn throttled_past_a_passive_trip_point() {
        let t = Tree::new();
        t.battery("battery", "Discharging", 80);
        t.zone(0, 45.0, None);
        t.zone(1, 91.0, Some(85.0));
        let c = t.reader().read();
        assert_eq!((c.throttled, c.temperature_c), (Some(true), Some(91.0)));
        let problems = assess(&c, &ON_BATTERY);
        assert_eq!(problems, [Problem::Throttled { temperature_c: Some(91.0) }]);
        assert_eq!(problems[0].to_string(), "CPU throttled (hottest zone 91 °C)");
        t.zone(1, 84.9, Some(85.0));
        assert_eq!(t.reader().read().throttled, Some(false));
    }

    #[test]
    fn throttled_by_a_cpu_cooling_device() {
        let t = Tree::new();
        t.zone(0, 60.0, None);
        t.write("thermal/cooling_device0/type", "thermal-cpufreq-0");
        t.write("thermal/cooling_device0/cur_state", "0");
        t.write("thermal/cooling_device1/type", "Fan");
        t.write("thermal/cooling_device1/cur_state", "3");
        let mut reader = t.reader();
        assert_eq!(reader.read().throttled, Some(false), "a fan running is not throttling");
        t.write("thermal/cooling_device0/cur_state", "2");
        assert_eq!(reader.read().throttled, Some(true));
    }

    #[test]
    fn throttled_when_x86_throttle_counters_grow() {
        let t = Tree::new();
        for cpu in ["cpu0", "cpu1"] {
            t.write(&format!("cpu/{cpu}/thermal_throttle/core_throttle_count"), "4");
            t.write(&format!("cpu/{cpu}/thermal_throttle/package_throttle_count"), "9");
        }
        t.write("cpu/cpufreq/policy0/scaling_cur_freq", "400000");
        let mut reader = t.reader();
        assert_eq!(reader.read().throttled, Some(false), "old events are not throttling now");
        t.write("cpu/cpu1/thermal_throttle/core_throttle_count", "5");
        assert_eq!(reader.read().throttled, Some(true));
        assert_eq!(reader.read().throttled, Some(false), "no new event since");
    }

    #[test]
    fn a_server_without_battery_is_fine_and_says_nothing() {
        let t = Tree::new();
        let c = t.reader().read();
        assert_eq!(c, Conditions::default());
        assert!(assess(&c, &ON_BATTERY).is_empty());
        // Zones without trip points, and sensors that are off: only the temperature.
        t.zone(0, 52.0, None);
        t.write("thermal/thermal_zone1/temp", "-273000");
        let c = t.reader().read();
        assert_eq!((c.charging, c.battery_percent, c.throttled), (None, None, None));
        assert_eq!(c.temperature_c, Some(52.0));
        assert!(assess(&c, &ON_BATTERY).is_empty());
    }

    #[test]
    fn the_gate_reports_changes_once() {
        let mut gate = Gate::new(ON_BATTERY);
        let good = Conditions { charging: Some(false), battery_percent: Some(80.0), ..Conditions::default() };
        assert_eq!(gate.check(&good), None, "good from the start: nothing to say");
        let low = Conditions { battery_percent: Some(15.0), ..good.clone() };
        assert_eq!(gate.check(&low), Some(vec!["battery 15 % below 20 %".to_string()]));
        let lower = Conditions { battery_percent: Some(14.0), ..good.clone() };
        assert_eq!(gate.check(&lower), None, "the same problem, lower: no news");
        let hot = Conditions { throttled: Some(true), temperature_c: Some(90.0), ..lower };
        let reasons = gate.check(&hot).expect("a new problem");
        assert_eq!(reasons, ["battery 14 % below 20 %", "CPU throttled (hottest zone 90 °C)"]);
        assert_eq!(gate.check(&good), Some(Vec::new()), "good again");
        assert_eq!(gate.check(&good), None);
    }
}
