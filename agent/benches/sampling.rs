//! Benchmark: the agent's own CPU cost of sampling energy and perf counters
//! (and telemetry) at 1 Hz and 10 Hz, with and without the peak-RSS `/proc`
//! sampling the runner does 10 times a second while a trial runs, and
//! `measure`'s overhead on a short command compared with running it bare.
//! Results go to BENCHMARKS.md.
//!
//! Energy is read from a fixture RAPL tree (two packages with core, uncore
//! and dram sub-zones: 7 `energy_uj` files) because this machine has no
//! RAPL; counters are the perf events that open on this machine, on this
//! process. The RSS sample is the real one on the real `/proc`, for this
//! process's group (a trial without a cgroup): a full scan of every
//! process's `stat`, and the runner's way (a full scan one sample in
//! [`FULL_SCAN_EVERY`], only new processes in between); and the
//! `cgroup.procs` way (a fixture file listing this process).
//! CPU time is the process CPU clock (`CLOCK_PROCESS_CPUTIME_ID`), so the
//! sampling thread's time is counted.
//!
//! `cargo bench -p tunefleet-agent --bench sampling` (set
//! `TUNEFLEET_BENCH_SECONDS` to change the 10 s per cadence).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};
use tunefleet_agent::counters::CounterSet;
use tunefleet_agent::energy::{self, EnergySource, EstimateModel, RealFs};
use tunefleet_agent::procfs::{self, Members, RssSampler, RssTracker, FULL_SCAN_EVERY};
use tunefleet_agent::runner::RSS_SAMPLE_INTERVAL;
use tunefleet_agent::telemetry::TelemetrySampler;

fn cpu_now() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0))
}

fn fixture(dir: &Path) {
    let zones = [
        ("0", "package-0"),
        ("0:0", "core"),
        ("0:1", "uncore"),
        ("0:2", "dram"),
        ("1", "package-1"),
        ("1:0", "core"),
        ("1:2", "dram"),
    ];
    for (id, name) in zones {
        let zone = dir.join("powercap").join(format!("intel-rapl:{id}"));
        std::fs::create_dir_all(&zone).expect("mkdir");
        std::fs::write(zone.join("name"), format!("{name}\n")).expect("write");
        std::fs::write(zone.join("energy_uj"), "123456789\n").expect("write");
        std::fs::write(zone.join("max_energy_range_uj"), "262143328850\n").expect("write");
    }
}

struct Samplers {
    meter: Box<dyn energy::EnergyMeter>,
    counters: CounterSet,
    telemetry: TelemetrySampler,
    started: Instant,
}

impl Samplers {
    fn energy_and_counters(&mut self) {
        let elapsed = self.started.elapsed();
        self.meter.sample(elapsed);
        self.counters.sample(elapsed);
    }
}

fn percent(cpu: Duration, wall: Duration) -> f64 {
    100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let seconds: u64 = std::env::var("TUNEFLEET_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let dir = tempfile::tempdir().expect("tempdir");
    fixture(dir.path());
    let source =
        energy::rapl::discover(&dir.path().join("powercap"), std::sync::Arc::new(RealFs)).expect("fixture RAPL");
    let counters = CounterSet::open_for_self();
    let events = counters.open_events();
    let telemetry = TelemetrySampler::new(Path::new("/proc"), &source, EstimateModel::default());
    let mut s = Samplers { meter: source.start().expect("start"), counters, telemetry, started: Instant::now() };
    println!(
        "energy: {} RAPL domains (fixture); counters open: {} ({})",
        source.channels.len(),
        events.len(),
        events.join(",")
    );

    // Cost of one sample, averaged over many.
    let n = 5_000u32;
    let c0 = cpu_now();
    for _ in 0..n {
        s.energy_and_counters();
    }
    let per_sample = (cpu_now() - c0) / n;
    let c0 = cpu_now();
    for _ in 0..n {
        let _ = s.telemetry.sample(0);
    }
    let per_telemetry = (cpu_now() - c0) / n;
    let proc_root = Path::new("/proc");
    let processes = std::fs::read_dir(proc_root)
        .map(|d| d.flatten().filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<u32>().is_ok())).count())
        .unwrap_or(0);
    let group = Members::Group(rustix::process::getpgrp().as_raw_nonzero().get());
    let procs = dir.path().join("cgroup.procs");
    std::fs::write(&procs, format!("{}\n", std::process::id())).expect("write cgroup.procs");
    let cgroup = Members::Cgroup(procs);
    let n_rss = 500u32;
    let per_rss = |members: &Members| {
        let c0 = cpu_now();
        for _ in 0..n_rss {
            let _ = procfs::peak_rss_kib(proc_root, members);
        }
        (cpu_now() - c0) / n_rss
    };
    let (per_scan, per_cgroup) = (per_rss(&group), per_rss(&cgroup));
    let mut tracker = RssTracker::new(proc_root.to_path_buf(), group.clone());
    let c0 = cpu_now();
    for _ in 0..n_rss {
        let _ = tracker.sample();
    }
    let per_tracked = (cpu_now() - c0) / n_rss;
    println!("one energy+counters sample: {:.1} us CPU", per_sample.as_secs_f64() * 1e6);
    println!("one telemetry sample:       {:.1} us CPU", per_telemetry.as_secs_f64() * 1e6);
    println!("one RSS sample, /proc scan of {processes} processes: {:.1} us CPU", per_scan.as_secs_f64() * 1e6);
    println!(
        "one RSS sample, as the runner takes it (a full scan every {FULL_SCAN_EVERY}): {:.1} us CPU",
        per_tracked.as_secs_f64() * 1e6
    );
    println!("one RSS sample, cgroup.procs (1 process): {:.1} us CPU", per_cgroup.as_secs_f64() * 1e6);
    let rss_hz = 1.0 / RSS_SAMPLE_INTERVAL.as_secs_f64();
    for hz in [1.0, 10.0] {
        println!(
            "  computed at {hz:>4} Hz: energy+counters {:.4}% of a core, with telemetry {:.4}%, \
             with RSS at {rss_hz} Hz {:.4}% (every sample a full /proc scan: {:.4}%)",
            100.0 * per_sample.as_secs_f64() * hz,
            100.0 * (per_sample + per_telemetry).as_secs_f64() * hz,
            100.0 * ((per_sample + per_telemetry).as_secs_f64() * hz + per_tracked.as_secs_f64() * rss_hz),
            100.0 * ((per_sample + per_telemetry).as_secs_f64() * hz + per_scan.as_secs_f64() * rss_hz)
        );
    }

    // The same, for real: a tokio interval, as the runner and agent use it,
    // and the RSS sampler on its thread as the runner starts it for a trial.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    for hz in [1u64, 10] {
        for rss in [None, Some(&group)] {
            let period = Duration::from_millis(1000 / hz);
            let (cpu, wall) = rt.block_on(async {
                let mut tick = tokio::time::interval(period);
                tick.tick().await;
                let (c0, w0) = (cpu_now(), Instant::now());
                let sampler = rss.map(|m| RssSampler::spawn(proc_root.to_path_buf(), m.clone(), RSS_SAMPLE_INTERVAL));
                for _ in 0..seconds * hz {
                    tick.tick().await;
                    s.energy_and_counters();
                    let _ = s.telemetry.sample(0);
                }
                drop(sampler);
                (cpu_now() - c0, w0.elapsed())
            });
            let with = if rss.is_some() { format!(" + RSS sampler at {rss_hz} Hz") } else { String::new() };
            println!(
                "measured at {hz:>2} Hz for {:.1} s: {:.3} ms CPU = {:.4}% of a core (energy + counters + telemetry + timer{with})",
                wall.as_secs_f64(),
                cpu.as_secs_f64() * 1e3,
                percent(cpu, wall)
            );
        }
    }

    // measure's overhead on a short command.
    let agent = env!("CARGO_BIN_EXE_tunefleet-agent");
    let runs = 30;
    let time = |cmd: &mut Command| {
        let t = Instant::now();
        let status = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().expect("runs");
        assert!(status.success());
        t.elapsed()
    };
    let bare: Vec<Duration> = (0..runs).map(|_| time(&mut Command::new("true"))).collect();
    let measured: Vec<Duration> =
        (0..runs).map(|_| time(Command::new(agent).args(["measure", "--", "true"]))).collect();
    let (b, m) = (median(bare), median(measured));
    println!(
        "`true` bare: median {:.2} ms; under `tunefleet-agent measure`: median {:.2} ms (+{:.2} ms)",
        b.as_secs_f64() * 1e3,
        m.as_secs_f64() * 1e3,
        (m.saturating_sub(b)).as_secs_f64() * 1e3
    );
}
