//! The InfluxDB sink benchmark: `cargo bench -p tunefleet-tests --bench sink`
//! (needs Debian's `victoria-metrics`). Prints a markdown table (copied into
//! BENCHMARKS.md).
//!
//! * queueing: what the sink adds to the engine's store batch per accepted
//!   result (build the points, insert them into the outbox), for results
//!   with a 100-sample power series, 50 results per transaction as in a busy
//!   engine turn, on a durable store (WAL, synchronous=NORMAL).
//! * delivery: points per second from the outbox to a VictoriaMetrics on
//!   loopback, batches of 5,000 points, until the outbox is empty (the
//!   server's time to store them included).

use std::time::{Duration, Instant};

use tunefleet_common::measurement::{
    DomainEnergy, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, PowerSample,
};
use tunefleet_common::message::TrialRef;
use tunefleet_coordinator::runtime::sink::{trial_points, Flusher, InfluxUrl, SinkConfig};
use tunefleet_coordinator::store::Store;
use tunefleet_tests::victoria::Victoria;
use tunefleet_tests::wait_for;

const RESULTS: u64 = 2000;
const SAMPLES: u64 = 100;
const PER_BATCH: u64 = 50;

fn measurement(started_unix_ms: u64, i: u64) -> Measurement {
    let joules = 10.0 + i as f64 / 7.0;
    Measurement {
        started_unix_ms,
        wall_us: SAMPLES * 100_000,
        user_us: 9_000_000,
        sys_us: 400_000,
        max_rss_kib: 50_000,
        energy: EnergyReading {
            joules,
            domains: vec![
                DomainEnergy { domain: "package-0".into(), joules, in_total: true },
                DomainEnergy { domain: "package-0/core".into(), joules: joules * 0.7, in_total: false },
                DomainEnergy { domain: "dram".into(), joules: joules * 0.1, in_total: true },
            ],
            interval_ms: 100,
            valid: true,
            note: None,
            series: (1..=SAMPLES).map(|s| PowerSample { elapsed_ms: s * 100, watts: 20.0 + (s % 7) as f64 }).collect(),
            ..EnergyReading::none(EnergySourceKind::Rapl, "")
        },
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("tmp");
    let store_path = dir.path().join("bench.db");
    let mut store = Store::open(&store_path).expect("store");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let base = now - 3_600_000;
    let results: Vec<(TrialRef, Measurement)> = (0..RESULTS)
        .map(|i| {
            (TrialRef { study: "bench".into(), study_id: 7, trial: i, attempt: 1 }, measurement(base + i * 1000, i))
        })
        .collect();

    // Queueing, as the engine does it inside its batch.
    let started = Instant::now();
    let mut points = 0u64;
    for chunk in results.chunks(PER_BATCH as usize) {
        let mut batch = store.batch().expect("batch");
        for (t, m) in chunk {
            let lines = trial_points(t, "bench-agent", m, Some(m.energy.joules));
            points += lines.len() as u64;
            batch.enqueue_points(&lines, now).expect("queue");
        }
        batch.commit().expect("commit");
    }
    let queue_time = started.elapsed();

    // Delivery.
    let vm = Victoria::start(&dir.path().join("vm"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    let flusher = {
        let _in = rt.enter();
        Flusher::spawn(SinkConfig::new(InfluxUrl::parse(&vm.url()).expect("url"), "o", "b", None), &store_path)
            .expect("sink")
    };
    wait_for("the outbox to drain", Duration::from_secs(600), || flusher.stats().delivered == points);
    let deliver_time = started.elapsed();
    let stats = rt.block_on(flusher.drain(Duration::from_secs(5))).expect("drain");
    assert_eq!((stats.waiting, stats.parked), (0, 0));

    println!("| what | amount | time (s) | rate |");
    println!("|---|---|---|---|");
    println!(
        "| queue points in the engine's batch | {RESULTS} results, {points} points | {:.3} | {:.0} µs per result |",
        queue_time.as_secs_f64(),
        queue_time.as_secs_f64() * 1e6 / RESULTS as f64
    );
    println!(
        "| deliver to VictoriaMetrics 1.79 (loopback) | {points} points | {:.3} | {:.0} points/s |",
        deliver_time.as_secs_f64(),
        points as f64 / deliver_time.as_secs_f64()
    );
}
