//! Every energy source against fixture sysfs trees: Intel and AMD RAPL
//! layouts, several packages, sub-zones, wrap-around, permission denied, an
//! unreadable file, a zone that disappears, hwmon counters and power
//! sensors (rails that overlap counted once), batteries discharging,
//! charging and plugged in, an unreadable battery, and the fallback order.

mod sysfs;

use std::time::Duration;

use sysfs::{Sysfs, AMD_RANGE, INTEL_RANGE};
use tunefleet_agent::energy::{self, EnergySource, EstimateModel, Usage};
use tunefleet_common::measurement::{EnergyReading, EnergySourceKind};

const NO_USAGE: Usage = Usage { wall: Duration::ZERO, cpu: Duration::ZERO, cores: 1 };

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn domain(r: &EnergyReading, name: &str) -> (f64, bool) {
    let d = r.domains.iter().find(|d| d.domain == name).unwrap_or_else(|| panic!("no domain {name} in {r:?}"));
    (d.joules, d.in_total)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn intel_two_packages(fx: &Sysfs) {
    fx.rapl_zone("0", "package-0", 1_000_000, INTEL_RANGE);
    fx.rapl_zone("0:0", "core", 500_000, INTEL_RANGE);
    fx.rapl_zone("0:1", "uncore", 100_000, INTEL_RANGE);
    fx.rapl_zone("0:2", "dram", 200_000, INTEL_RANGE);
    fx.rapl_zone("1", "package-1", 3_000_000, INTEL_RANGE);
    fx.rapl_zone("1:0", "core", 0, INTEL_RANGE);
    fx.rapl_zone("1:2", "dram", 0, INTEL_RANGE);
    // The control-type directory and the MMIO duplicate are not zones to count.
    fx.write("powercap/intel-rapl/enabled", "1");
    fx.write("powercap/intel-rapl-mmio:0/name", "package-0");
    fx.write("powercap/intel-rapl-mmio:0/energy_uj", "999999999");
}

#[test]
fn intel_two_packages_with_sub_zones_are_counted_once() {
    let fx = Sysfs::new();
    intel_two_packages(&fx);
    let sel = energy::select(&fx.roots(), EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Rapl);
    assert!(sel.skipped.is_empty());
    let info = sel.source.info();
    assert!(info.readable);
    assert_eq!(
        info.domains,
        [
            "package-0",
            "package-0/core",
            "package-0/uncore",
            "package-0/dram",
            "package-1",
            "package-1/core",
            "package-1/dram"
        ]
    );
    let mut meter = sel.source.start().expect("starts");
    // One second: package-0 +20 J (core 12, uncore 3), dram-0 +2 J, package-1 +30 J (core 25), dram-1 +1 J.
    fx.set_energy("0", 21_000_000);
    fx.set_energy("0:0", 12_500_000);
    fx.set_energy("0:1", 3_100_000);
    fx.set_energy("0:2", 2_200_000);
    fx.set_energy("1", 33_000_000);
    fx.set_energy("1:0", 25_000_000);
    fx.set_energy("1:2", 1_000_000);
    meter.sample(secs(1));
    let r = meter.stop(secs(1), &NO_USAGE);
    assert!(r.valid, "{:?}", r.note);
    assert_eq!(r.source, EnergySourceKind::Rapl);
    assert_eq!(domain(&r, "package-0"), (20.0, true));
    assert_eq!(domain(&r, "package-0/core"), (12.0, false));
    assert_eq!(domain(&r, "package-0/uncore"), (3.0, false));
    assert_eq!(domain(&r, "package-0/dram"), (2.0, true));
    assert_eq!(domain(&r, "package-1"), (30.0, true));
    assert_eq!(domain(&r, "package-1/dram"), (1.0, true));
    assert!(close(r.joules, 20.0 + 2.0 + 30.0 + 1.0), "{}", r.joules);
    assert_eq!(r.series.len(), 1);
    assert!(close(r.series[0].watts, 53.0));
    assert_eq!(r.series[0].elapsed_ms, 1000);
}

#[test]
fn amd_layout_package_and_core_only() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 5_000_000, AMD_RANGE);
    fx.rapl_zone("0:0", "core", 4_000_000, AMD_RANGE);
    let source = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    let meter = source.start().expect("starts");
    fx.set_energy("0", 15_000_000);
    fx.set_energy("0:0", 12_000_000);
    let r = meter.stop(secs(2), &NO_USAGE);
    assert!(close(r.joules, 10.0), "core is part of the package: {}", r.joules);
    assert_eq!(domain(&r, "package-0/core"), (8.0, false));
    assert!(close(r.series[0].watts, 5.0));
}

#[test]
fn psys_counts_only_without_packages() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    fx.rapl_zone("1", "psys", 0, INTEL_RANGE);
    let with_pkg = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    assert!(with_pkg.channels.iter().any(|c| c.domain == "psys" && !c.in_total));
    let fx = Sysfs::new();
    fx.rapl_zone("1", "psys", 0, INTEL_RANGE);
    let alone = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    assert!(alone.channels.iter().all(|c| c.in_total));
}

#[test]
fn wrap_around_between_samples_is_added_not_lost() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", INTEL_RANGE - 1_000_000, INTEL_RANGE);
    let source = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    let mut meter = source.start().expect("starts");
    fx.set_energy("0", 2_000_000); // wrapped: 1 J before the wrap, 2 J after
    meter.sample(secs(1));
    fx.set_energy("0", 7_000_000);
    let r = meter.stop(secs(2), &NO_USAGE);
    assert!(r.valid, "{:?}", r.note);
    assert!(close(r.joules, 8.0), "{}", r.joules);
    assert_eq!(r.series.len(), 2);
    assert!(close(r.series[0].watts, 3.0) && close(r.series[1].watts, 5.0), "{:?}", r.series);
}

#[test]
fn small_range_shortens_the_sampling_interval() {
    let fx = Sysfs::new();
    // 60 J range at a stated 100 W maximum: wraps in 0.6 s, sample every 0.3 s.
    fx.rapl_zone("0", "package-0", 0, 60_000_000);
    fx.write("powercap/intel-rapl:0/constraint_0_max_power_uw", "100000000");
    let source = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    let interval = energy::sampling_interval(secs(1), &source);
    assert!((interval.as_secs_f64() - 0.3).abs() < 1e-6, "{interval:?}");
    assert_eq!(energy::sampling_interval(Duration::from_millis(100), &source), Duration::from_millis(100));
}

#[test]
fn a_zone_that_disappears_invalidates_the_reading_and_keeps_its_energy() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    fx.rapl_zone("1", "package-1", 0, INTEL_RANGE);
    let source = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    let mut meter = source.start().expect("starts");
    fx.set_energy("0", 1_000_000);
    fx.set_energy("1", 4_000_000);
    meter.sample(secs(1));
    fx.remove_dir("powercap/intel-rapl:1");
    fx.set_energy("0", 3_000_000);
    let r = meter.stop(secs(2), &NO_USAGE);
    assert!(!r.valid);
    let note = r.note.clone().unwrap_or_default();
    assert!(note.contains("package-1 disappeared"), "{note}");
    assert_eq!(domain(&r, "package-1"), (4.0, true));
    assert!(close(r.joules, 3.0 + 4.0));
}

#[test]
fn permission_denied_explains_and_falls_back_to_the_next_source() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    fx.write("hwmon/hwmon0/name", "ina3221");
    fx.write("hwmon/hwmon0/power1_input", "5000000");
    // Running as root, chmod 000 would not stop a read: the seam denies it.
    let roots = fx.roots_denying(&["powercap/intel-rapl:0/energy_uj"]);
    let err = energy::rapl::discover(&roots.powercap, roots.fs.clone()).expect_err("denied");
    assert!(err.is_permission());
    let sel = energy::select(&roots, EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Hwmon);
    assert_eq!(sel.skipped.len(), 1);
    assert!(
        sel.skipped[0].contains("permission denied") && sel.skipped[0].contains("ExecStartPre"),
        "{:?}",
        sel.skipped
    );
    let rapl = sel.found.iter().find(|i| i.kind == EnergySourceKind::Rapl).expect("listed");
    assert!(!rapl.readable);
    let r = sel.source.start().expect("hwmon starts").stop(secs(2), &NO_USAGE);
    assert_eq!(r.source, EnergySourceKind::Hwmon);
    assert!(close(r.joules, 10.0));
    assert!(r.note.unwrap_or_default().contains("skipped: rapl"), "the reading says a source was skipped");
}

#[test]
fn an_unreadable_energy_file_falls_back_to_the_estimate() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    // Unreadable in another way than permissions (works as root): a directory.
    let file = fx.path("powercap/intel-rapl:0/energy_uj");
    std::fs::remove_file(&file).expect("rm");
    std::fs::create_dir(&file).expect("mkdir");
    let sel = energy::select(&fx.roots(), EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Estimated);
    assert!(sel.skipped[0].contains("energy_uj"), "{:?}", sel.skipped);
    let usage = Usage { wall: secs(1), cpu: secs(1), cores: 1 };
    let r = sel.source.start().expect("starts").stop(secs(1), &usage);
    let note = r.note.unwrap_or_default();
    assert!(note.starts_with("estimated") && note.contains("skipped: rapl"), "{note}");
}

#[test]
fn chmod_000_is_permission_denied_for_non_root() {
    if rustix::process::geteuid().is_root() {
        // Root reads any file whatever its mode; the seam test above covers this path.
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    let file = fx.path("powercap/intel-rapl:0/energy_uj");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    let err = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect_err("denied");
    assert!(err.is_permission(), "{err}");
}

#[test]
fn hwmon_socket_counters_count_cores_once_and_backwards_is_invalid() {
    let fx = Sysfs::new();
    fx.write("hwmon/hwmon3/name", "amd_energy");
    for (i, label, uj) in [(1, "Ecore000", 100), (2, "Ecore001", 200), (3, "Esocket0", 1_000)] {
        fx.write(&format!("hwmon/hwmon3/energy{i}_label"), label);
        fx.write(&format!("hwmon/hwmon3/energy{i}_input"), &uj.to_string());
    }
    let source = energy::hwmon::discover(&fx.path("hwmon"), fx.roots().fs).expect("found");
    let mut meter = source.start().expect("starts");
    fx.write("hwmon/hwmon3/energy1_input", "2000100");
    fx.write("hwmon/hwmon3/energy2_input", "3000200");
    fx.write("hwmon/hwmon3/energy3_input", "6001000");
    meter.sample(secs(1));
    let r = meter.stop(secs(1), &NO_USAGE);
    assert!(r.valid);
    assert_eq!(domain(&r, "amd_energy/Ecore000"), (2.0, false));
    assert_eq!(domain(&r, "amd_energy/Esocket0"), (6.0, true));
    assert!(close(r.joules, 6.0));

    let meter = source.start().expect("starts");
    fx.write("hwmon/hwmon3/energy3_input", "5");
    let r = meter.stop(secs(1), &NO_USAGE);
    assert!(!r.valid);
    assert!(r.note.unwrap_or_default().contains("went backwards"));
}

#[test]
fn hwmon_power_sensors_are_integrated_over_time() {
    let fx = Sysfs::new();
    fx.write("hwmon/hwmon0/name", "ina3221");
    fx.write("hwmon/hwmon0/power1_input", "10000000"); // 10 W
    fx.write("hwmon/hwmon0/power1_label", "VDD_CPU");
    fx.write("hwmon/hwmon0/power2_average", "2000000"); // 2 W
    let source = energy::hwmon::discover(&fx.path("hwmon"), fx.roots().fs).expect("found");
    let mut meter = source.start().expect("starts");
    meter.sample(secs(1));
    fx.write("hwmon/hwmon0/power1_input", "20000000"); // ramps to 20 W over the next second
    let r = meter.stop(secs(2), &NO_USAGE);
    // Trapezoids: 10 W for 1 s, then 15 W average for 1 s; plus 2 W for 2 s,
    // reported but not added: two rails of one device may overlap.
    assert_eq!(domain(&r, "ina3221/VDD_CPU"), (25.0, true));
    assert_eq!(domain(&r, "ina3221/power2"), (4.0, false));
    assert!(close(r.joules, 25.0));
    assert_eq!(r.series.len(), 2);
}

fn hwmon_power(fx: &Sysfs, dev: &str, name: &str, rails: &[(&str, u64)]) {
    fx.write(&format!("hwmon/{dev}/name"), name);
    for (i, (label, watts)) in rails.iter().enumerate() {
        fx.write(&format!("hwmon/{dev}/power{}_input", i + 1), &(watts * 1_000_000).to_string());
        fx.write(&format!("hwmon/{dev}/power{}_label", i + 1), label);
    }
}

/// Every hwmon power sensor was added to the total, so a rail and
/// the input that feeds it were counted twice.
#[test]
fn regression_hwmon_overlapping_rails_are_counted_once() {
    // A Jetson: the module input and two of its rails on one INA3221, more
    // rails (also fed by the input) on a second one.
    let fx = Sysfs::new();
    hwmon_power(&fx, "hwmon0", "ina3221", &[("VDD_CPU_GPU_CV", 4), ("VDD_IN", 10), ("VDD_SOC", 3)]);
    hwmon_power(&fx, "hwmon1", "ina3221b", &[("VDDQ_VDD2_1V8AO", 1)]);
    let source = energy::hwmon::discover(&fx.path("hwmon"), fx.roots().fs).expect("found");
    let r = source.start().expect("starts").stop(secs(2), &NO_USAGE);
    assert!(r.valid, "{:?}", r.note);
    assert_eq!(domain(&r, "ina3221/VDD_IN"), (20.0, true));
    assert_eq!(domain(&r, "ina3221/VDD_CPU_GPU_CV"), (8.0, false));
    assert_eq!(domain(&r, "ina3221/VDD_SOC"), (6.0, false));
    assert_eq!(domain(&r, "ina3221b/VDDQ_VDD2_1V8AO"), (2.0, false), "downstream of the input");
    assert!(close(r.joules, 20.0), "the input alone: {}", r.joules);
    let note = source.info().note.unwrap_or_default();
    assert!(note.contains("counted: ina3221/VDD_IN (input)"), "{note}");

    // Two PSUs, each with its input and output: the inputs add up.
    let fx = Sysfs::new();
    hwmon_power(&fx, "hwmon0", "psu0", &[("pin", 100), ("pout1", 90)]);
    hwmon_power(&fx, "hwmon1", "psu1", &[("pin", 50), ("pout1", 45)]);
    let source = energy::hwmon::discover(&fx.path("hwmon"), fx.roots().fs).expect("found");
    let r = source.start().expect("starts").stop(secs(1), &NO_USAGE);
    assert!(close(r.joules, 150.0), "{}", r.joules);

    // No input anywhere, topology unknown: one sensor per device, named.
    let fx = Sysfs::new();
    hwmon_power(&fx, "hwmon0", "zenpower", &[("SVI2_P_Core", 20), ("SVI2_P_SoC", 5)]);
    hwmon_power(&fx, "hwmon1", "amdgpu", &[("PPT", 30)]);
    let source = energy::hwmon::discover(&fx.path("hwmon"), fx.roots().fs).expect("found");
    let r = source.start().expect("starts").stop(secs(1), &NO_USAGE);
    assert_eq!(domain(&r, "zenpower/SVI2_P_SoC"), (5.0, false));
    assert!(close(r.joules, 50.0), "{}", r.joules);
    let note = source.info().note.unwrap_or_default();
    assert!(note.contains("zenpower/SVI2_P_Core (first of several rails), amdgpu/PPT"), "{note}");
}

fn battery(fx: &Sysfs, name: &str, status: &str) {
    fx.write(&format!("power_supply/{name}/type"), "Battery");
    fx.write(&format!("power_supply/{name}/status"), status);
    fx.write(&format!("power_supply/{name}/current_now"), "500000"); // 0.5 A
    fx.write(&format!("power_supply/{name}/voltage_now"), "4000000"); // 4 V
}

#[test]
fn discharging_battery_integrates_current_times_voltage() {
    let fx = Sysfs::new();
    battery(&fx, "BAT0", "Discharging");
    fx.write("power_supply/AC/type", "Mains");
    fx.write("power_supply/hid-mouse/type", "Battery");
    fx.write("power_supply/hid-mouse/scope", "Device");
    let sel = energy::select(&fx.roots(), EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Battery);
    assert_eq!(sel.source.info().domains, ["BAT0"]);
    let mut meter = sel.source.start().expect("starts");
    meter.sample(secs(5));
    let r = meter.stop(secs(10), &NO_USAGE);
    assert!(r.valid, "{:?}", r.note);
    assert!(close(r.joules, 20.0), "2 W for 10 s: {}", r.joules);
}

#[test]
fn battery_power_now_is_preferred() {
    let fx = Sysfs::new();
    battery(&fx, "BAT1", "Discharging");
    fx.write("power_supply/BAT1/power_now", "3000000");
    let source = energy::battery::discover(&fx.path("power_supply"), fx.roots().fs).expect("found");
    let r = source.start().expect("starts").stop(secs(2), &NO_USAGE);
    assert!(close(r.joules, 6.0));
}

#[test]
fn charging_or_full_battery_makes_the_reading_invalid() {
    let fx = Sysfs::new();
    battery(&fx, "BAT0", "Charging");
    let source = energy::battery::discover(&fx.path("power_supply"), fx.roots().fs).expect("found");
    let r = source.start().expect("starts").stop(secs(1), &NO_USAGE);
    assert!(!r.valid);
    assert!(r.note.unwrap_or_default().contains("BAT0 was Charging"));

    battery(&fx, "BAT0", "Discharging");
    let mut meter = source.start().expect("starts");
    meter.sample(secs(1));
    fx.write("power_supply/BAT0/status", "Full"); // plugged in mid-run
    let r = meter.stop(secs(2), &NO_USAGE);
    assert!(!r.valid);
    assert!(r.note.unwrap_or_default().contains("Full"));
}

/// A battery "Not charging" (plugged in, charging paused or
/// capped) was taken as a valid reading of the machine's energy.
#[test]
fn regression_battery_not_charging_makes_the_reading_invalid() {
    let fx = Sysfs::new();
    battery(&fx, "BAT0", "Not charging");
    let source = energy::battery::discover(&fx.path("power_supply"), fx.roots().fs).expect("found");
    let r = source.start().expect("starts").stop(secs(1), &NO_USAGE);
    assert!(!r.valid);
    let note = r.note.unwrap_or_default();
    assert!(note.contains("BAT0 was Not charging: on external power"), "{note}");

    // Only Discharging is the machine running on its battery.
    for status in ["Unknown", "Discharging"] {
        battery(&fx, "BAT0", status);
        let r = source.start().expect("starts").stop(secs(1), &NO_USAGE);
        assert_eq!(r.valid, status == "Discharging", "{status}: {:?}", r.note);
    }
}

/// A battery whose `power_now` could not be read was reported as
/// no battery at all, instead of permission denied with how to fix it.
#[test]
fn regression_unreadable_battery_power_now_is_permission_denied_not_absent() {
    let fx = Sysfs::new();
    fx.write("power_supply/BAT0/type", "Battery");
    fx.write("power_supply/BAT0/status", "Discharging");
    fx.write("power_supply/BAT0/power_now", "3000000");
    // Running as root, chmod 000 would not stop a read: the seam denies it.
    let roots = fx.roots_denying(&["power_supply/BAT0/power_now"]);
    let err = energy::battery::discover(&roots.power_supply, roots.fs.clone()).expect_err("denied");
    assert!(err.is_permission(), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("BAT0/power_now: permission denied"), "{msg}");
    assert!(msg.contains("chmod g+r") && msg.contains("BAT0/power_now'"), "the hint names the file: {msg}");
    let sel = energy::select(&roots, EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Estimated);
    let battery = sel.found.iter().find(|i| i.kind == EnergySourceKind::Battery).expect("listed, not absent");
    assert!(!battery.readable);
    assert!(
        sel.skipped.iter().any(|s| s.starts_with("battery:") && s.contains("permission denied")),
        "{:?}",
        sel.skipped
    );

    // With current and voltage readable, the battery is measured through them.
    fx.write("power_supply/BAT0/current_now", "500000");
    fx.write("power_supply/BAT0/voltage_now", "4000000");
    let source = energy::battery::discover(&roots.power_supply, roots.fs.clone()).expect("found");
    let r = source.start().expect("starts").stop(secs(1), &NO_USAGE);
    assert!(r.valid && close(r.joules, 2.0), "{r:?}");
}

#[test]
fn sources_are_tried_in_order_and_the_estimate_is_last() {
    let fx = Sysfs::new();
    battery(&fx, "BAT0", "Discharging");
    fx.write("hwmon/hwmon0/name", "x");
    fx.write("hwmon/hwmon0/power1_input", "1");
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    let sel = energy::select(&fx.roots(), EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Rapl);
    let kinds: Vec<_> = sel.found.iter().map(|i| i.kind).collect();
    assert_eq!(
        kinds,
        [EnergySourceKind::Rapl, EnergySourceKind::Hwmon, EnergySourceKind::Battery, EnergySourceKind::Estimated]
    );
    let empty = Sysfs::new();
    let sel = energy::select(&empty.roots(), EstimateModel::default());
    assert_eq!(sel.source.kind(), EnergySourceKind::Estimated);
    assert!(sel.skipped.is_empty());
}

#[test]
fn a_source_that_fails_at_start_falls_back_to_the_estimate_for_that_run() {
    let fx = Sysfs::new();
    fx.rapl_zone("0", "package-0", 0, INTEL_RANGE);
    let source = energy::rapl::discover(&fx.path("powercap"), fx.roots().fs).expect("found");
    fx.remove_dir("powercap/intel-rapl:0");
    let meter = energy::start_or_estimate(&source, EstimateModel::default());
    let usage = Usage { wall: secs(2), cpu: secs(1), cores: 1 };
    let r = meter.stop(secs(2), &usage);
    assert_eq!(r.source, EnergySourceKind::Estimated);
    assert!(close(r.joules, 2.0 + 4.0));
    assert!(r.note.unwrap_or_default().contains("skipped: rapl"));
}

#[test]
#[ignore = "needs RAPL"]
fn real_rapl_counts_energy_while_busy() {
    let source =
        energy::rapl::discover(std::path::Path::new(energy::POWERCAP_ROOT), std::sync::Arc::new(energy::RealFs))
            .expect("RAPL readable here");
    let start = std::time::Instant::now();
    let mut meter = source.start().expect("starts");
    let mut x = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
    }
    meter.sample(start.elapsed());
    let r = meter.stop(start.elapsed(), &NO_USAGE);
    assert!(r.valid, "{:?}", r.note);
    assert!(r.joules > 0.0, "{r:?}");
}
