//! The HTML report at 100,000 trials: `cargo bench -p tunefleet-tests --bench
//! report` (needs Debian's `chromium`). Prints a markdown table (copied into
//! BENCHMARKS.md).
//!
//! * fill: a durable store (WAL) gets 100,000 trials of a pipelined study
//!   through the store's real write API (assignment, result, segments: a
//!   warm-up, three probe windows and the selected rest), 16 agents in three
//!   device classes, 2,000 results per transaction.
//! * report: reading the store ([`report::load`]), rendering the page
//!   ([`report::render`]), and its size.
//! * Chromium: `chromium --headless --dump-dom` and `--screenshot` (1280 x
//!   2000) on the report and on an empty page, alternated, five runs each;
//!   the page's load time is the median on the report less the median on
//!   the empty page (Chromium's own start-up).
//!
//! The page and its screenshot stay in `target/tmp/bench-report/`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tunefleet_common::measurement::{
    CounterKind, CounterReading, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, Segment, SegmentRole,
};
use tunefleet_common::message::{AgentInfo, EnergySourceInfo, SystemParams, TrialRef};
use tunefleet_common::params::{ParamValue, Params};
use tunefleet_coordinator::domain::search::TrialPlan;
use tunefleet_coordinator::domain::study;
use tunefleet_coordinator::report::{self, CHART_IDS};
use tunefleet_coordinator::runtime::engine::open_study_at;
use tunefleet_coordinator::store::Store;
use tunefleet_tests::chromium;

const TRIALS: u64 = 100_000;
const AGENTS: u64 = 16;
const PER_BATCH: usize = 2000;
const RUNS: usize = 5;

const STUDY: &str = r#"name = "bench"
command = ["tunefleet-train", "--lr", "{lr}", "--batch-size", "{batch}"]
[objective]
metric = "accuracy"
direction = "maximize"
[budget]
trials = 100000
[strategy]
kind = "random"
seed = 1
[hyper.lr]
kind = "log_float"
low = 0.001
high = 0.3
[hyper.batch]
kind = "categorical"
values = [16, 32, 64, 128]
[system.cores]
kind = "int"
low = 1
high = 4
[pipeline]
mode = "pipelined"
window = { epochs = 1, warmup = 1 }
select = "energy"
"#;

/// A deterministic pseudo-random number in [0, 1) from `i` (splitmix64).
fn unit(i: u64) -> f64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as f64 / u64::MAX as f64
}

fn cores(n: u32) -> SystemParams {
    SystemParams { cores: Some(n), ..SystemParams::default() }
}

fn agent(i: u64) -> AgentInfo {
    let mut info = AgentInfo::minimal(&format!("bench-agent-{i:02}"), i);
    let (arch, n, kind) = match i % 3 {
        0 => ("x86_64", 4, EnergySourceKind::Rapl),
        1 => ("aarch64", 4, EnergySourceKind::Battery),
        _ => ("x86_64", 8, EnergySourceKind::Estimated),
    };
    info.arch = arch.into();
    info.cores = n;
    info.energy = vec![EnergySourceInfo { kind, domains: Vec::new(), readable: true, note: None }];
    info
}

/// Trial `t`'s measurement: four probe-sized windows and the rest under
/// the configuration that used the least energy per epoch.
fn measurement(t: u64, source: EnergySourceKind) -> (Measurement, SystemParams) {
    let epoch_us = 200_000 + (unit(t) * 400_000.0) as u64;
    let mut segments = Vec::new();
    let mut start = 0;
    let mut push = |role, system: SystemParams, epochs: u32, factor: f64| {
        let wall_us = (epoch_us as f64 * f64::from(epochs) * factor) as u64;
        let first = segments.last().map_or(1, |s: &Segment| s.last_epoch + 1);
        segments.push(Segment {
            role,
            system,
            cpus: Vec::new(),
            first_epoch: first,
            last_epoch: first + epochs - 1,
            steps: 0,
            start_us: start,
            wall_us,
            energy_j: Some(wall_us as f64 / 1e6 * 12.0 * factor),
            cpu_us: Some(wall_us),
            unit_median_us: None,
            unit_spread: None,
            margin: None,
        });
        start += wall_us;
    };
    push(SegmentRole::Warmup, cores(4), 1, 1.0);
    let speed = |c: u32| 1.0 / f64::from(c).sqrt() + 0.1 * unit(t * 7 + u64::from(c));
    for c in [4, 1, 2] {
        push(SegmentRole::Probe, cores(c), 1, speed(c));
    }
    let best = [4, 1, 2].into_iter().min_by(|a, b| speed(*a).total_cmp(&speed(*b))).unwrap_or(4);
    push(SegmentRole::Selected, cores(best), 4, speed(best));
    let wall_us = start;
    let joules: f64 = segments.iter().filter_map(|s| s.energy_j).sum();
    let valid = t % 50 != 0;
    let accuracy = 0.9 + 0.08 * (1.0 - (t as f64 / TRIALS as f64 - 0.7).abs()) * unit(t * 3);
    let m = Measurement {
        started_unix_ms: 0,
        wall_us,
        user_us: wall_us,
        sys_us: wall_us / 20,
        max_rss_kib: 40_000,
        final_metrics: BTreeMap::from([("accuracy".to_string(), accuracy)]),
        counters: vec![CounterReading {
            event: "task-clock".into(),
            kind: CounterKind::Software,
            value: wall_us * 1000,
            time_enabled_ns: wall_us * 1000,
            time_running_ns: wall_us * 1000,
        }],
        energy: EnergyReading {
            joules,
            valid,
            interval_ms: 100,
            note: (!valid).then(|| "battery charging".to_string()),
            ..EnergyReading::none(source, "")
        },
        selected: Some(cores(best)),
        segments,
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(source, ""))
    };
    (m, cores(best))
}

fn fill(path: &Path) -> Duration {
    let started = Instant::now();
    let mut store = Store::open(path).expect("store");
    let study = study::parse(STUDY, "bench.toml").expect("study");
    let plans: Vec<TrialPlan> = (0..TRIALS)
        .map(|trial| {
            let params = Params::from([
                ("lr".to_string(), ParamValue::Float(0.001 + unit(trial * 11) * 0.3)),
                ("batch".to_string(), ParamValue::Int(16 << (trial % 4))),
            ]);
            TrialPlan { trial, params, repeat: 0 }
        })
        .collect();
    let base_ms = 1_750_000_000_000u64;
    let mut b = store.batch().expect("batch");
    open_study_at(&mut b, &study, &plans, base_ms).expect("create");
    let agents: Vec<AgentInfo> = (0..AGENTS).map(agent).collect();
    for a in &agents {
        b.upsert_agent(a, base_ms).expect("agent");
    }
    b.commit().expect("commit");
    // Each agent runs its trials one after the other.
    let mut clock = vec![base_ms; AGENTS as usize];
    for chunk in (0..TRIALS).collect::<Vec<_>>().chunks(PER_BATCH) {
        let mut b = store.batch().expect("batch");
        for &t in chunk {
            let i = (t % AGENTS) as usize;
            let a = &agents[i];
            let source = a.energy[0].kind;
            let (m, system) = measurement(t, source);
            let tr = TrialRef { study: "bench".into(), study_id: 7, trial: t, attempt: 1 };
            b.record_assignment(&tr, &a.agent, clock[i]).expect("assign");
            clock[i] += m.wall_us / 1000 + 5;
            let objective = m.final_metrics.get("accuracy").copied();
            let score = tunefleet_coordinator::store::Score { objective, violation: None, system: Some(system) };
            b.record_result(&tr, &a.agent, &m, score, clock[i]).expect("result");
            b.record_segments(&tr, &m).expect("segments");
        }
        b.commit().expect("commit");
    }
    started.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

fn main() {
    chromium::binary();
    let dir = tempfile::tempdir().expect("tmp");
    let store_path = dir.path().join("bench.db");
    let fill_time = fill(&store_path);
    let db_size = std::fs::metadata(&store_path).map(|m| m.len()).unwrap_or(0)
        + std::fs::metadata(store_path.with_extension("db-wal")).map(|m| m.len()).unwrap_or(0);

    let store = Store::open_read_only(&store_path).expect("store");
    let started = Instant::now();
    let data = report::load(&store, "bench", report::Options::default()).expect("load");
    let load_time = started.elapsed();
    let started = Instant::now();
    let page = report::render(&data);
    let render_time = started.elapsed();
    // Kept after the run, with a screenshot, to look at.
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-report");
    std::fs::create_dir_all(&kept).expect("artifact dir");
    let report_path = kept.join("report-100k.html");
    std::fs::write(&report_path, &page).expect("write report");
    let empty_path = dir.path().join("empty.html");
    std::fs::write(&empty_path, "<!DOCTYPE html>\n<html><head><title>empty</title></head><body></body></html>\n")
        .expect("write empty page");

    let timeout = Duration::from_secs(60);
    let (mut dom_report, mut dom_empty, mut shot_report, mut shot_empty) = (vec![], vec![], vec![], vec![]);
    for i in 0..RUNS {
        let run = chromium::dump_dom(&report_path, timeout);
        assert!(run.success && run.console_lines().is_empty(), "{}", run.stderr);
        for id in CHART_IDS {
            assert!(run.stdout.contains(&format!("id=\"{id}\"")), "{id} missing");
        }
        dom_report.push(run.elapsed);
        dom_empty.push(chromium::dump_dom(&empty_path, timeout).elapsed);
        let png = if i == 0 { kept.join("report-100k.png") } else { dir.path().join("report.png") };
        let run = chromium::screenshot(&report_path, &png, (1280, 2000), timeout);
        assert!(run.success && png.exists(), "{}", run.stderr);
        shot_report.push(run.elapsed);
        shot_empty
            .push(chromium::screenshot(&empty_path, &dir.path().join("empty.png"), (1280, 2000), timeout).elapsed);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (dr, de, sr, se) = (median(dom_report), median(dom_empty), median(shot_report), median(shot_empty));

    println!("| what | figure |");
    println!("|---|---|");
    println!(
        "| fill the store (write API, {TRIALS} trials, {} segments) | {:.1} s, {:.0} MB |",
        TRIALS * 5,
        fill_time.as_secs_f64(),
        db_size as f64 / 1e6
    );
    println!("| read the store (`report::load`) | {:.0} ms |", ms(load_time));
    println!("| render the page (`report::render`) | {:.0} ms |", ms(render_time));
    println!("| page size | {} bytes ({:.0} KiB) |", page.len(), page.len() as f64 / 1024.0);
    println!(
        "| Chromium `--dump-dom`, median of {RUNS}: report / empty page | {:.0} ms / {:.0} ms: **{:.0} ms** for the page |",
        ms(dr),
        ms(de),
        ms(dr.saturating_sub(de))
    );
    println!(
        "| Chromium `--screenshot` 1280x2000, median of {RUNS}: report / empty page | {:.0} ms / {:.0} ms: **{:.0} ms** for the page |",
        ms(sr),
        ms(se),
        ms(sr.saturating_sub(se))
    );
}
