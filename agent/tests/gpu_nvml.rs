//! GPU energy through NVML, against a stand-in library built here from
//! `tests/nvml/standin.c` (the few NVML calls the agent makes, over a
//! fixture each test controls), loaded through the same path as the
//! driver's. The last test, ignored, runs the real library where a GPU is.

#![cfg(feature = "nvml")]

use std::time::Duration;

use tunefleet_agent::energy::gpu::{self, GpuMeter, GpuMethod, GpuReport};

#[path = "nvml/mod.rs"]
mod nvml;
use nvml::{fixture, standin};

#[test]
fn probe_lists_each_gpu_its_counter_and_its_power() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = standin(dir.path());
    fixture(&lib, "H200 GPU-aaaa 1000 82000\nT4 GPU-bbbb - 70500\n");
    let report = gpu::probe(Some(&lib));
    let GpuReport::Found { gpus, .. } = &report else { panic!("{report:?}") };
    assert_eq!(gpus.len(), 2);
    assert_eq!((gpus[0].name.as_str(), gpus[0].uuid.as_str()), ("H200", "GPU-aaaa"));
    assert!(gpus[0].energy_counter);
    assert_eq!(gpus[0].power_w, Some(82.0));
    assert!(!gpus[1].energy_counter, "a GPU without the counter is said so");
    assert_eq!(gpus[1].power_w, Some(70.5));
    let table = report.render();
    assert!(table.contains("GPU-bbbb") && table.contains("power x time"), "{table}");
}

#[test]
fn the_energy_of_a_window_is_the_counter_difference() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = standin(dir.path());
    fixture(&lib, "H200 GPU-aaaa 1000 82000\n");
    let mut meter = GpuMeter::start(Some(&lib), &[0]).expect("starts");
    fixture(&lib, "H200 GPU-aaaa 4000 300000\n");
    meter.sample(Duration::from_secs(1));
    fixture(&lib, "H200 GPU-aaaa 6500 300000\n");
    let got = meter.stop(Duration::from_secs(2));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].method, GpuMethod::Counter);
    assert!((got[0].joules - 5.5).abs() < 1e-9, "{got:?}");
    assert!(got[0].valid && got[0].note.is_none(), "{got:?}");
    assert_eq!(got[0].uuid, "GPU-aaaa");
}

/// The runner samples at the workload's exit and stops at that moment:
/// what the GPU does after it (the next trial starting) is not counted.
#[test]
fn the_sample_at_the_exit_ends_the_window() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = standin(dir.path());
    fixture(
        &lib,
        "H200 GPU-aaaa 1000 82000
",
    );
    let mut meter = GpuMeter::start(Some(&lib), &[0]).expect("starts");
    fixture(
        &lib,
        "H200 GPU-aaaa 4000 82000
",
    );
    meter.sample(Duration::from_secs(1));
    fixture(
        &lib,
        "H200 GPU-aaaa 9000 82000
",
    );
    let got = meter.stop(Duration::from_secs(1));
    assert!((got[0].joules - 3.0).abs() < 1e-9, "{got:?}");
}

#[test]
fn without_a_counter_the_power_is_integrated_over_the_samples() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = standin(dir.path());
    fixture(&lib, "H200 GPU-aaaa 1000 82000\nT4 GPU-bbbb - 100000\n");
    let mut meter = GpuMeter::start(Some(&lib), &[1]).expect("starts");
    fixture(&lib, "H200 GPU-aaaa 1000 82000\nT4 GPU-bbbb - 200000\n");
    meter.sample(Duration::from_secs(1)); // (100 + 200) / 2 x 1 s
    let got = meter.stop(Duration::from_secs(3)); // + 200 x 2 s
    assert_eq!(got[0].method, GpuMethod::PowerIntegrated);
    assert!((got[0].joules - 550.0).abs() < 1e-9, "{got:?}");
    assert!(got[0].valid);
}

#[test]
fn a_failing_read_makes_the_figure_invalid_and_says_why() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = standin(dir.path());
    fixture(&lib, "H200 GPU-aaaa 1000 82000\nT4 GPU-bbbb - 100000\n");
    let mut meter = GpuMeter::start(Some(&lib), &[0, 1]).expect("starts");
    fixture(&lib, "H200 GPU-aaaa fail 82000\nT4 GPU-bbbb - fail\n");
    meter.sample(Duration::from_secs(1));
    let got = meter.stop(Duration::from_secs(2));
    assert!(got.iter().all(|g| !g.valid), "{got:?}");
    assert!(got[0].note.as_deref().unwrap_or("").contains("energy read at 1.0 s"), "{got:?}");
    assert!(got[1].note.as_deref().unwrap_or("").contains("power read at 1.0 s"), "{got:?}");
    // A counter that went back (the driver reloaded) is no figure either.
    assert!(GpuMeter::start(Some(&lib), &[1]).is_err(), "a GPU with neither a counter nor power cannot be measured");
    fixture(&lib, "H200 GPU-aaaa 9000 82000\n");
    let m = GpuMeter::start(Some(&lib), &[0]).expect("starts");
    fixture(&lib, "H200 GPU-aaaa 10 82000\n");
    let got = m.stop(Duration::from_secs(1));
    assert!(!got[0].valid && got[0].note.as_deref().unwrap_or("").contains("went back"), "{got:?}");
}

#[test]
fn no_library_or_no_driver_is_said_plainly() {
    let dir = tempfile::tempdir().expect("tmp");
    let missing = dir.path().join("nowhere/libnvidia-ml.so.1");
    let report = gpu::probe(Some(&missing));
    assert!(matches!(&report, GpuReport::Unavailable { lib, .. } if *lib == missing), "{report:?}");
    assert!(report.render().contains("did not load"), "{}", report.render());
    let lib = standin(dir.path());
    fixture(&lib, "init-fail\nH200 GPU-aaaa 1000 82000\n");
    let report = gpu::probe(Some(&lib));
    let GpuReport::Unavailable { reason, .. } = &report else { panic!("{report:?}") };
    assert!(reason.to_lowercase().contains("driver"), "{reason}");
    assert!(GpuMeter::start(Some(&lib), &[0]).is_err());
    // The fixture trees of the other energy tests never reach the machine's NVML.
    let roots = tunefleet_agent::energy::EnergyRoots::under(dir.path());
    assert!(roots.nvml_lib.as_deref().is_some_and(|p| p.starts_with(dir.path())));
}

/// Co-measurement: the node's GPUs are read over the window like its CPU;
/// a stand-in GPU drawing 100 W all along gives 100 W times the window.
#[test]
fn a_co_measured_window_counts_the_nodes_gpus() {
    use std::time::{SystemTime, UNIX_EPOCH};
    use tunefleet_agent::comeasure::CoMeter;
    use tunefleet_agent::energy::Registry;
    use tunefleet_common::message::{CoMeasure, CoMeasureStep, GpuDevice, TrialRef};
    let unix_ms = || SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let dir = tempfile::tempdir().expect("tmp");
    let lib = standin(dir.path());
    fixture(&lib, "H200 GPU-aaaa rate:100000 100000\n");
    let gpu = GpuDevice { index: 0, uuid: "GPU-aaaa".into(), name: "H200".into() };
    let energy = Registry::default().with_nvml(Some(lib));
    let mut co = CoMeter::new(energy, "/proc".into(), vec![0], Duration::from_millis(10)).with_gpus(vec![gpu]);
    let trial = TrialRef { study: "s".into(), study_id: 1, trial: 1, attempt: 1 };
    co.on(CoMeasure { trial: trial.clone(), step: CoMeasureStep::Start { within_ms: 60_000 } });
    std::thread::sleep(Duration::from_millis(50));
    co.sample();
    let from = unix_ms();
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(50));
        co.sample();
    }
    let to = unix_ms();
    std::thread::sleep(Duration::from_millis(50));
    let a = co.on(CoMeasure { trial, step: CoMeasureStep::Window { from_unix_ms: from, to_unix_ms: to } });
    let a = a.expect("answered");
    assert_eq!(a.gpus.len(), 1, "{a:?}");
    let g = &a.gpus[0];
    assert!(g.valid && g.uuid == "GPU-aaaa", "{g:?}");
    let expected = 100.0 * (to - from) as f64 / 1000.0;
    assert!((g.joules / expected - 1.0).abs() < 0.25, "{} J over {} ms, expected {expected}", g.joules, to - from);
    assert_eq!(a.energy_figure().joules, Some(a.energy.joules + g.joules));
}

/// Where a GPU is (`cargo test -p tunefleet-agent --test gpu_nvml -- --ignored`):
/// the driver's NVML lists it, and its energy over two seconds is read.
#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn real_nvml_lists_gpus_and_measures_a_window() {
    let report = gpu::probe(None);
    println!("{}", report.render());
    let GpuReport::Found { gpus, .. } = &report else { panic!("{report:?}") };
    assert!(!gpus.is_empty(), "NVML loaded and lists no GPU");
    let indices: Vec<u32> = gpus.iter().map(|g| g.index).collect();
    let mut meter = GpuMeter::start(None, &indices).expect("starts");
    for i in 1..=20 {
        std::thread::sleep(Duration::from_millis(100));
        meter.sample(Duration::from_millis(100 * i));
    }
    for g in meter.stop(Duration::from_secs(2)) {
        println!("GPU {} {}: {:.3} J ({:?}, valid {}) {:?}", g.index, g.uuid, g.joules, g.method, g.valid, g.note);
        assert!(g.valid && g.joules > 0.0, "{g:?}");
    }
}
