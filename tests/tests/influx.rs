//! The InfluxDB sink against a real server: Debian's VictoriaMetrics, which
//! takes the influxdb2 client's `/api/v2/write` and gives the points back
//! through `/api/v1/export`. Each test starts its own server on a loopback
//! port the OS chose, with its own storage directory, stops it, restarts it, and
//! checks that every point arrived once with the value the store holds.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::process::Command;
use std::time::Duration;

use rusqlite::Connection;
use tunefleet_common::measurement::{
    DomainEnergy, EnergyReading, EnergySourceKind, ExitOutcome, Measurement, PowerSample,
};
use tunefleet_common::message::TrialRef;
use tunefleet_coordinator::runtime::sink::{trial_points, Backoff, Flusher, InfluxUrl, SinkConfig};
use tunefleet_coordinator::store::Store;
use tunefleet_tests::ports::ClosedPort;
use tunefleet_tests::victoria::{Series, Victoria};
use tunefleet_tests::*;

/// How many samples `lines` make in VictoriaMetrics: one per field of each
/// point (measurement and field joined with `_`). Test tags hold no spaces.
fn samples_in(lines: &[String]) -> usize {
    lines.iter().map(|l| l.split(' ').nth(1).expect("fields").split(',').count()).sum()
}

/// Every sample once: no series has a timestamp twice, and the total is `expected`.
fn assert_exactly_once(series: &[Series], expected: usize) {
    for s in series {
        let mut ts = s.timestamps.clone();
        ts.sort_unstable();
        ts.dedup();
        assert_eq!(ts.len(), s.timestamps.len(), "duplicated samples in {:?}: {:?}", s.labels, s.timestamps);
    }
    let total: usize = series.iter().map(|s| s.values.len()).sum();
    assert_eq!(total, expected, "samples in the server");
}

fn total_samples(series: &[Series]) -> usize {
    series.iter().map(|s| s.values.len()).sum()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A measurement with two domains and a power series of `samples` points.
fn measurement(started_unix_ms: u64, joules: f64, samples: u64) -> Measurement {
    Measurement {
        started_unix_ms,
        wall_us: samples * 100_000,
        user_us: 70_000 * samples,
        sys_us: 5_000 * samples,
        max_rss_kib: 2048,
        energy: EnergyReading {
            joules,
            domains: vec![
                DomainEnergy { domain: "package-0".into(), joules, in_total: true },
                DomainEnergy { domain: "package-0/core".into(), joules: joules * 0.75, in_total: false },
            ],
            interval_ms: 100,
            valid: true,
            note: None,
            series: (1..=samples).map(|i| PowerSample { elapsed_ms: i * 100, watts: 3.0 + i as f64 / 8.0 }).collect(),
            ..EnergyReading::none(EnergySourceKind::Rapl, "")
        },
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    }
}

fn fast_config(url: &str) -> SinkConfig {
    let mut c = SinkConfig::new(InfluxUrl::parse(url).expect("url"), "tunefleet", "tests", None);
    c.poll = Duration::from_millis(50);
    c.batch = 16;
    c.request_timeout = Duration::from_secs(5);
    c.backoff = Backoff { min: Duration::from_millis(50), max: Duration::from_millis(200) };
    c
}

/// Queues the points of `results` the way the engine does, in one batch.
fn queue(store: &mut Store, results: &[(TrialRef, Measurement)]) -> Vec<String> {
    let mut all = Vec::new();
    let mut batch = store.batch().expect("batch");
    for (t, m) in results {
        let lines = trial_points(t, "agent-a", m, Some(m.energy.joules));
        batch.enqueue_points(&lines, unix_ms()).expect("queue");
        all.extend(lines);
    }
    batch.commit().expect("commit");
    all
}

fn results(study: &str, trials: std::ops::Range<u64>, samples: u64) -> Vec<(TrialRef, Measurement)> {
    let base = unix_ms() - 600_000;
    trials
        .map(|i| {
            (
                TrialRef { study: study.into(), study_id: 7, trial: i, attempt: 1 },
                measurement(base + i * 10_000, 10.0 + i as f64, samples),
            )
        })
        .collect()
}

#[test]
fn points_wait_while_the_server_is_down_and_arrive_exactly_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut vm = Victoria::start(&dir.path().join("vm"));
    let store_path = dir.path().join("s.db");
    let mut store = Store::open(&store_path).expect("store");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let flusher = {
        let _in = rt.enter();
        Flusher::spawn(fast_config(&vm.url()), &store_path).expect("sink")
    };

    // Server up: the points go out and leave the outbox (batches of 16).
    let first = results("outage", 0..2, 20);
    let mut lines = queue(&mut store, &first);
    wait_for("the first points delivered", Duration::from_secs(30), || flusher.stats().delivered == lines.len() as u64);
    assert_eq!(store.outbox_counts().expect("counts").waiting, 0);
    wait_for("the first points visible", Duration::from_secs(30), || total_samples(&vm.export()) == samples_in(&lines));

    // Server down: new points wait in the store while the flusher retries.
    vm.stop();
    let second = results("outage", 2..5, 30);
    let waiting = queue(&mut store, &second);
    let failed_before = flusher.stats().failed_writes;
    wait_for("writes failing while the server is down", Duration::from_secs(30), || {
        flusher.stats().failed_writes >= failed_before + 3
    });
    let stats = flusher.stats();
    assert!(stats.last_error.is_some(), "the failure is reported: {stats:?}");
    assert_eq!(store.outbox_counts().expect("counts").waiting, waiting.len() as u64, "nothing left the store");
    lines.extend(waiting);

    // Server back: everything delivered, nothing twice.
    vm.restart();
    wait_for("the outbox drained", Duration::from_secs(60), || store.outbox_counts().expect("counts").waiting == 0);
    let expected = samples_in(&lines);
    wait_for("every point visible", Duration::from_secs(30), || total_samples(&vm.export()) >= expected);
    let series = vm.export();
    assert_exactly_once(&series, expected);
    let stats = rt.block_on(flusher.drain(Duration::from_secs(5))).expect("drain");
    assert_eq!(stats.delivered, lines.len() as u64);
    assert_eq!((stats.waiting, stats.parked), (0, 0));

    // The values are the measurements'.
    for (t, m) in first.iter().chain(&second) {
        let of = |name: &str| {
            series.iter().filter(|s| s.name() == name && s.label("trial") == t.trial.to_string()).collect::<Vec<_>>()
        };
        let wall = of("tunefleet_trial_wall_s");
        assert_eq!(wall.len(), 1, "trial {}", t.trial);
        assert_eq!(wall[0].values, [m.wall_us as f64 / 1e6]);
        assert_eq!(wall[0].timestamps, [(m.started_unix_ms + m.wall_us / 1000) as i64]);
        assert_eq!(wall[0].label("study"), "outage");
        assert_eq!(wall[0].label("attempt"), "1");
        assert_eq!(wall[0].label("agent"), "agent-a");
        assert_eq!(wall[0].label("source"), "rapl");
        let energy = of("tunefleet_energy_joules");
        let core = energy.iter().find(|s| s.label("domain") == "package-0/core").expect("core domain");
        assert_eq!(core.values, [m.energy.joules * 0.75]);
        assert_eq!(core.label("in_total"), "false");
        let power = of("tunefleet_power_watts");
        assert_eq!(power.len(), 1);
        let want_ts: Vec<i64> = m.energy.series.iter().map(|p| (m.started_unix_ms + p.elapsed_ms) as i64).collect();
        let want_w: Vec<f64> = m.energy.series.iter().map(|p| p.watts).collect();
        let mut got: Vec<(i64, f64)> =
            power[0].timestamps.iter().copied().zip(power[0].values.iter().copied()).collect();
        got.sort_by_key(|p| p.0);
        assert_eq!(got, want_ts.into_iter().zip(want_w).collect::<Vec<_>>());
    }
}

/// The coordinator's flags for an InfluxDB at `url`, flushing for at most 1 s at exit.
fn influx_flags(url: &str) -> [&str; 6] {
    ["--influx-url", url, "--influx-bucket", "tests", "--influx-grace", "1"]
}

/// The `influx: N points delivered, M waiting...` line of a finished run.
fn influx_line(lines: &[String]) -> (u64, u64) {
    let line =
        lines.iter().find(|l| l.starts_with("influx: ")).unwrap_or_else(|| panic!("no influx line in {lines:?}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].parse().expect("delivered"), words[4].parse().expect("waiting"))
}

#[test]
fn a_study_run_while_influx_is_down_is_delivered_by_the_next_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("influx");
    let store = dir.path().join("s.db");
    let study = sleep_study(dir.path(), "energy", 4, 0.3);

    // Nothing listens on the port: the study runs, its points wait in the store.
    let down = ClosedPort::new();
    let down_url = format!("http://127.0.0.1:{}", down.port);
    let (mut coord, broker) = start_coordinator(&study, &store, &root, &influx_flags(&down_url));
    let agent = start_agent(&broker, "influx-agent", &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "coordinator: {status}");
    drop(agent);
    assert_agents_spools_empty(&["influx-agent"]);
    let (delivered, waiting) = influx_line(&coord.rest_of_stdout());
    assert_eq!(delivered, 0);
    let db = Connection::open(&store).expect("store");
    let outbox: i64 = db.query_row("SELECT COUNT(*) FROM influx_outbox", [], |r| r.get(0)).expect("outbox");
    assert_eq!(outbox as u64, waiting);
    let stored: Vec<(i64, i64, String, i64, f64, serde_json::Value)> = db
        .prepare("SELECT trial, attempt, agent, wall_us, objective, measurement FROM results WHERE study = 'energy'")
        .expect("prepare")
        .query_map([], |r| {
            let m: String = r.get(5)?;
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, serde_json::from_str(&m).expect("json")))
        })
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(stored.len(), 4, "every trial stored");
    // One summary and one point per domain and per power sample, per result.
    let per_result: i64 = stored
        .iter()
        .map(|r| {
            let e = &r.5["energy"];
            1 + e["domains"].as_array().map_or(0, Vec::len) as i64 + e["series"].as_array().map_or(0, Vec::len) as i64
        })
        .sum();
    assert_eq!(outbox, per_result, "the outbox holds exactly the results' points");

    // A server comes up; the next run (the study is finished: nothing to
    // schedule) delivers what waited there.
    let vm = Victoria::start(&dir.path().join("vm"));
    let vm_url = vm.url();
    let (mut again, _) = start_coordinator(&study, &store, &root, &influx_flags(&vm_url));
    assert!(again.wait_exit(Duration::from_secs(60)).success());
    assert_eq!(influx_line(&again.rest_of_stdout()), (waiting, 0));
    let outbox: i64 = db.query_row("SELECT COUNT(*) FROM influx_outbox", [], |r| r.get(0)).expect("outbox");
    assert_eq!(outbox, 0);

    wait_for("the summaries visible", Duration::from_secs(30), || {
        vm.export().iter().filter(|s| s.name() == "tunefleet_trial_wall_s").count() == 4
    });
    let series = vm.export();
    let power_samples: usize = stored.iter().map(|r| r.5["energy"]["series"].as_array().map_or(0, Vec::len)).sum();
    for s in &series {
        if s.name() == "tunefleet_power_watts" {
            let mut ts = s.timestamps.clone();
            ts.dedup();
            assert_eq!(ts.len(), s.timestamps.len(), "power samples once: {s:?}");
        } else {
            assert_eq!(s.values.len(), 1, "each summary and energy series is one point, once: {s:?}");
        }
    }
    let power: usize = series.iter().filter(|s| s.name() == "tunefleet_power_watts").map(|s| s.values.len()).sum();
    assert_eq!(power, power_samples, "every power sample, once");
    for (trial, attempt, agent, wall_us, objective, m) in &stored {
        let find = |name: &str| {
            series
                .iter()
                .find(|s| s.name() == name && s.label("trial") == trial.to_string())
                .unwrap_or_else(|| panic!("{name} of trial {trial} missing"))
        };
        let wall = find("tunefleet_trial_wall_s");
        assert_eq!(wall.values[0], *wall_us as f64 / 1e6);
        assert_eq!(wall.label("study"), "energy");
        assert_eq!(wall.label("attempt"), attempt.to_string());
        assert_eq!(wall.label("agent"), agent);
        assert_eq!(wall.label("exit"), "exited");
        let source = m["energy"]["source"].as_str().expect("source").to_lowercase();
        assert_eq!(wall.label("source"), source);
        assert_eq!(find("tunefleet_trial_objective").values[0], *objective);
        assert_eq!(find("tunefleet_trial_success").values[0], 1.0);
        if let Some(j) = m["energy"]["joules"].as_f64() {
            assert!((find("tunefleet_trial_energy_j").values[0] - j).abs() <= 1e-9 * j.abs().max(1.0));
        }
        for d in m["energy"]["domains"].as_array().expect("domains") {
            let domain = d["domain"].as_str().expect("name");
            let s = series
                .iter()
                .find(|s| {
                    s.name() == "tunefleet_energy_joules"
                        && s.label("trial") == trial.to_string()
                        && s.label("domain") == domain
                })
                .unwrap_or_else(|| panic!("energy of {domain} in trial {trial} missing"));
            let j = d["joules"].as_f64().expect("joules");
            assert!((s.values[0] - j).abs() <= 1e-9 * j.abs().max(1.0), "{domain}: {} vs {j}", s.values[0]);
        }
    }
}

#[test]
fn a_bad_influx_url_is_a_usage_error_from_the_flag_or_the_environment() {
    let dir = tempfile::tempdir().expect("tmp");
    let study = sleep_study(dir.path(), "bad-url", 1, 0.3);
    let store = dir.path().join("s.db");
    let mut by_flag = Command::new(bin("tunefleet"));
    by_flag.arg("run").arg(&study).arg("--store").arg(&store).args(["--influx-url", "ftp://influx:8086"]);
    let (code, _, stderr) = run(by_flag);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--influx-url") && stderr.contains("http or https"), "{stderr}");
    let mut by_env = Command::new(bin("tunefleet"));
    by_env.arg("run").arg(&study).arg("--store").arg(&store).env("TUNEFLEET_INFLUX_URL", "http://influx:8086/write");
    let (code, _, stderr) = run(by_env);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no path"), "{stderr}");
    let mut empty_bucket = Command::new(bin("tunefleet"));
    empty_bucket.arg("run").arg(&study).arg("--store").arg(&store);
    empty_bucket.args(["--influx-url", "http://influx:8086", "--influx-bucket", ""]);
    let (code, _, stderr) = run(empty_bucket);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--influx-bucket"), "{stderr}");
    assert!(!store.exists(), "nothing ran");
}

/// A stand-in InfluxDB that refuses (400) any write containing a line with
/// `bad`, takes (204) everything else, and records the lines it took.
fn picky_server() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = taken.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { break };
            let mut reader = BufReader::new(conn);
            let mut length = 0usize;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                    break;
                }
                if let Some(v) = header.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let body = String::from_utf8_lossy(&body).into_owned();
            let answer = if body.lines().any(|l| l.contains("bad")) {
                "HTTP/1.1 400 Bad Request\r\nContent-Length: 15\r\nConnection: close\r\n\r\nunable to parse"
            } else {
                record.lock().expect("lock").extend(body.lines().map(str::to_string));
                "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"
            };
            let _ = reader.get_mut().write_all(answer.as_bytes());
        }
    });
    (port, taken)
}

#[test]
fn a_point_the_server_refuses_is_parked_and_the_rest_delivered() {
    let (port, taken) = picky_server();
    let dir = tempfile::tempdir().expect("tmp");
    let store_path = dir.path().join("s.db");
    let mut store = Store::open(&store_path).expect("store");
    let good: Vec<String> = (0..9).map(|i| format!("good,n={i} v={i}i 1000")).collect();
    let mut lines = good.clone();
    lines.insert(5, "bad,n=5 v=1i 1000".to_string());
    let mut batch = store.batch().expect("batch");
    batch.enqueue_points(&lines, unix_ms()).expect("queue");
    batch.commit().expect("commit");

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let flusher = {
        let _in = rt.enter();
        Flusher::spawn(fast_config(&format!("http://127.0.0.1:{port}")), &store_path).expect("sink")
    };
    wait_for("the bad point parked", Duration::from_secs(30), || flusher.stats().parked == 1);
    wait_for("the good points delivered", Duration::from_secs(30), || flusher.stats().delivered == 9);
    let stats = rt.block_on(flusher.drain(Duration::from_secs(5))).expect("drain");
    assert_eq!((stats.delivered, stats.parked, stats.waiting), (9, 1, 0));
    let mut got = taken.lock().expect("lock").clone();
    got.sort();
    assert_eq!(got, good, "each good point taken once, the bad one never");
    let counts = store.outbox_counts().expect("counts");
    assert_eq!((counts.waiting, counts.parked), (0, 1));
    let db = Connection::open(&store_path).expect("db");
    let (line, why): (String, String) =
        db.query_row("SELECT line, parked FROM influx_outbox", [], |r| Ok((r.get(0)?, r.get(1)?))).expect("parked row");
    assert_eq!(line, "bad,n=5 v=1i 1000");
    assert!(why.contains("400") && why.contains("unable to parse"), "{why}");
}
