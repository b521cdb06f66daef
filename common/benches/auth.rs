//! Benchmark: what message authentication ([`tunefleet_common::auth`]) costs
//! per message and per session, against plain encoding of the same message.
//! Results go to BENCHMARKS.md.
//!
//! * Sealed messages: the whole path of one message, sender to receiver, as
//!   the agent and the coordinator run it: `seal_*` (encode the message, HMAC
//!   it, encode the frame), then decode the frame and `open_*` (HMAC check,
//!   sequence check, decode the message). Beside it, the same message plain:
//!   `encode` then `decode`, which is what it costs without authentication;
//!   and the HMAC alone (`seal` + `open` of the already encoded body).
//! * Signatures, once per session: `auth::hello` (a fresh X25519 key, encode,
//!   Ed25519 sign), `auth::open_hello` (decode, Ed25519 verify), and a whole
//!   handshake (hello, open_hello, welcome, finish: two signatures, two
//!   verifications, two X25519 agreements, HKDF).
//!
//! Each case runs a warm-up, then [`ROUNDS`] rounds of about [`ROUND`] each;
//! it reports the median round in ns per operation.
//!
//! `cargo bench -p tunefleet-common --bench auth`

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;
use tunefleet_common::auth::{self, DownFrame, Identity, Session, UpFrame};
use tunefleet_common::measurement::*;
use tunefleet_common::message::*;
use tunefleet_common::profile::{Profile, FEATURES, PROFILE_VERSION};
use tunefleet_common::topic::AgentTopic;
use tunefleet_common::{decode, encode};

const ROUNDS: usize = 11;
const ROUND: Duration = Duration::from_millis(200);
const WARM_UP: Duration = Duration::from_millis(300);

/// Median over [`ROUNDS`] rounds of `op`, in ns per call.
fn time(mut op: impl FnMut()) -> f64 {
    // Calibrate: how many calls fill a round (the warm-up runs them too).
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < WARM_UP {
        op();
        calls += 1;
    }
    let per_round = (calls as f64 * ROUND.as_secs_f64() / start.elapsed().as_secs_f64()).max(1.0) as u64;
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..per_round {
                op();
            }
            t0.elapsed().as_nanos() as f64 / per_round as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn trial() -> TrialRef {
    TrialRef { study: "resnet-energy".into(), study_id: 7, trial: 1234, attempt: 1 }
}

/// What an agent with two slots sends when one frees up.
fn work_request() -> AgentMessage {
    AgentMessage::Request(WorkRequest {
        seq: 4711,
        free: 1,
        ahead: 0,
        running: vec![TrialRef { study: "resnet-energy".into(), study_id: 7, trial: 1233, attempt: 1 }],
        held: vec![],
    })
}

/// The counters an agent opens on a machine with a PMU: the agent's
/// `SOFTWARE_EVENTS` and `HARDWARE_EVENTS` (agent/src/counters.rs), which
/// this crate cannot import (the agent depends on it).
const EVENTS: [&str; 16] = [
    "task-clock",
    "context-switches",
    "cpu-migrations",
    "page-faults",
    "minor-faults",
    "major-faults",
    "cycles",
    "instructions",
    "cache-references",
    "cache-misses",
    "branch-instructions",
    "branch-misses",
    "LLC-loads",
    "LLC-load-misses",
    "stalled-cycles-frontend",
    "stalled-cycles-backend",
];

/// The result of a 60 s trial sampled at 1 Hz: 16 counters, a 60-sample
/// counter series, a 60-sample power series over 3 RAPL domains, 10 epochs
/// of 2 metrics, the profile vector and a 50-line log tail.
fn trial_result() -> AgentMessage {
    let counters: Vec<CounterReading> = EVENTS
        .iter()
        .enumerate()
        .map(|(i, e)| CounterReading {
            event: (*e).into(),
            kind: if i < 6 { CounterKind::Software } else { CounterKind::Hardware },
            value: 1_000_003 * (i as u64 + 1) * 7919,
            time_enabled_ns: 60_000_000_000,
            time_running_ns: if i < 6 { 60_000_000_000 } else { 45_000_000_000 },
        })
        .collect();
    let counter_series = (0..60u64)
        .map(|s| CounterSample {
            elapsed_ms: (s + 1) * 1000,
            deltas: (0..EVENTS.len()).map(|i| 1.0e6 * (i as f64 + 1.0) + s as f64 * 17.25).collect(),
        })
        .collect();
    let epochs = (0..10u32)
        .map(|e| EpochMetrics {
            epoch: e,
            elapsed_us: u64::from(e + 1) * 6_000_000,
            metrics: BTreeMap::from([
                ("loss".into(), 1.0 / f64::from(e + 1)),
                ("accuracy".into(), 0.5 + 0.04 * f64::from(e)),
            ]),
            checkpoint: None,
        })
        .collect();
    let log_tail: String =
        (0..50).map(|i| format!("step {i:4}/500  lr 0.0010  throughput 1843.2 samples/s  eta 00:{i:02}\n")).collect();
    let measurement = Measurement {
        started_unix_ms: 1_750_000_000_000,
        wall_us: 60_012_345,
        user_us: 118_000_000,
        sys_us: 1_200_000,
        max_rss_kib: 812_345,
        exit: ExitOutcome::Exited(0),
        epochs,
        final_metrics: BTreeMap::from([("loss".into(), 0.1), ("accuracy".into(), 0.86)]),
        counters,
        counters_missing: vec![MissingCounter { event: "ref-cycles".into(), reason: "not supported".into() }],
        counter_series,
        profile: Profile {
            version: PROFILE_VERSION,
            values: (0..FEATURES.len()).map(|i| Some(i as f64 * 0.37)).collect(),
        },
        energy: EnergyReading {
            source: EnergySourceKind::Rapl,
            joules: 2345.6,
            domains: ["package-0", "package-0/core", "dram"]
                .iter()
                .enumerate()
                .map(|(i, d)| DomainEnergy { domain: (*d).into(), joules: 1000.0 / (i as f64 + 1.0), in_total: i != 1 })
                .collect(),
            interval_ms: 1000,
            valid: true,
            note: None,
            series: (0..60u64)
                .map(|s| PowerSample { elapsed_ms: (s + 1) * 1000, watts: 38.0 + s as f64 * 0.1 })
                .collect(),
        },
        limits: AppliedLimits { cpus: vec![0, 1], threads: Some(2), memory: MemoryLimit::Cgroup { bytes: 2 << 30 } },
        log_tail,
        segments: Vec::new(),
        selected: None,
        window_profile: None,
        interference: Vec::new(),
        gpus: vec![],
        cpu_share: None,
    };
    AgentMessage::Result(TrialResult { trial: trial(), measurement })
}

fn assignment() -> CoordinatorMessage {
    CoordinatorMessage::Assign(Assignment {
        trial: trial(),
        request_seq: 4711,
        spec: TrialSpec {
            argv: ["python3", "train.py", "--lr", "0.001", "--batch", "128", "--epochs", "10"]
                .map(String::from)
                .to_vec(),
            env: vec![("OMP_NUM_THREADS".into(), "2".into())],
            system: SystemParams { cores: Some(2), threads: Some(2), memory_mib: Some(2048) },
            timeout_ms: 600_000,
            probe: None,
            gpus: 0,
        },
    })
}

fn ack() -> CoordinatorMessage {
    CoordinatorMessage::Ack(ResultAck { trial: trial(), outcome: AckOutcome::Stored })
}

fn agent_info() -> AgentInfo {
    AgentInfo {
        agent: "node-17".into(),
        instance: 0x5eed_1234,
        version: "0.1.0".into(),
        arch: "aarch64".into(),
        os: "linux".into(),
        kernel: "6.6.0".into(),
        cores: 4,
        memory_bytes: 8 << 30,
        slots: 2,
        lookahead: 0,
        energy: vec![EnergySourceInfo {
            kind: EnergySourceKind::Hwmon,
            domains: vec!["soc".into()],
            readable: true,
            note: None,
        }],
        counters: EVENTS.iter().map(|e| (*e).to_string()).collect(),
        tags: BTreeMap::from([("site".into(), "lab".into())]),
        gpus: vec![],
    }
}

/// A fresh pair of sessions (agent side, coordinator side) for `agent`.
fn sessions(agent_id: &Identity, coord_id: &Identity, agent: &str) -> (Session, Session) {
    let (signed, pending) = auth::hello(agent_id, agent_info(), 1, 1, [7; 32], None).expect("hello");
    let (hello, digest) = auth::open_hello(&signed).expect("hello verifies");
    let (welcome, coord) = auth::welcome(coord_id, agent, &hello, digest, 0xfeed).expect("welcome");
    let agent = pending.finish(agent, &coord_id.public(), &welcome).expect("welcome verifies");
    (agent, coord)
}

struct Row {
    what: String,
    ns: f64,
    note: String,
}

/// Size and cost (ns) of `encode` then `decode` of `msg`: the message
/// without authentication.
fn plain<M: Serialize + DeserializeOwned>(msg: &M) -> (usize, f64) {
    let bytes = encode(msg).expect("encode").len();
    let ns = time(|| {
        let payload = encode(black_box(msg)).expect("encode");
        black_box(decode::<M>(&payload).expect("decode"));
    });
    (bytes, ns)
}

/// The rows of one message, plain and sealed: `(bytes, ns)` each.
fn push_pair(
    rows: &mut Vec<Row>,
    label: &str,
    (plain_bytes, plain): (usize, f64),
    (sealed_bytes, sealed): (usize, f64),
) {
    rows.push(Row {
        what: format!("{label}: encode + decode (no authentication)"),
        ns: plain,
        note: format!("{plain_bytes} B"),
    });
    rows.push(Row {
        what: format!("{label}: seal + open (authenticated)"),
        ns: sealed,
        note: format!("{sealed_bytes} B; +{:.0} ns, ×{:.2}", sealed - plain, sealed / plain),
    });
}

fn main() {
    let (agent_id, _) = Identity::generate().expect("key");
    let (coord_id, _) = Identity::generate().expect("key");
    let name = "node-17";
    let mut rows: Vec<Row> = Vec::new();

    // Agent to coordinator: seal, frame, unframe, open.
    for (label, msg) in [("WorkRequest", work_request()), ("TrialResult", trial_result())] {
        let without = plain(&msg);
        let sealed_bytes = sessions(&agent_id, &coord_id, name).0.seal_agent(&msg).expect("seal").1.len();
        let (mut up, mut down) = sessions(&agent_id, &coord_id, name);
        let sealed = time(|| {
            let (kind, payload) = up.seal_agent(black_box(&msg)).expect("seal");
            let Ok(UpFrame::Sealed(frame)) = decode::<UpFrame>(&payload) else { panic!("not a sealed frame") };
            black_box(down.open_agent(kind, &frame).expect("opens"));
        });
        let body = encode(&msg).expect("encode");
        let kind = AgentTopic::of_agent_message(&msg);
        let (mut up, mut down) = sessions(&agent_id, &coord_id, name);
        let hmac = time(|| {
            let frame = up.seal(kind, black_box(body.clone())).expect("seal");
            black_box(down.open(kind, &frame).expect("opens").len());
        });
        let clone = time(|| {
            black_box(black_box(&body).clone());
        });
        let frame = auth::UpFrame::Sealed(up.seal(kind, body.clone()).expect("seal"));
        let framing = time(|| {
            let bytes = encode(black_box(&frame)).expect("encode");
            black_box(decode::<UpFrame>(&bytes).expect("decode"));
        });
        push_pair(&mut rows, label, without, (sealed_bytes, sealed));
        rows.push(Row {
            what: format!("{label}: HMAC-SHA256 alone (seal + open of the encoded body)"),
            ns: hmac - clone,
            note: format!("two MACs over {} B", body.len()),
        });
        rows.push(Row {
            what: format!("{label}: the sealed frame's own encode + decode (body as `Vec<u8>`)"),
            ns: framing,
            note: format!("{} B body", body.len()),
        });
    }

    // Coordinator to agent.
    for (label, msg) in [("Assignment", assignment()), ("ResultAck", ack())] {
        let without = plain(&msg);
        let sealed_bytes = sessions(&agent_id, &coord_id, name).1.seal_coordinator(&msg).expect("seal").1.len();
        let (mut agent, mut coord) = sessions(&agent_id, &coord_id, name);
        let sealed = time(|| {
            let (kind, payload) = coord.seal_coordinator(black_box(&msg)).expect("seal");
            let Ok(DownFrame::Sealed(frame)) = decode::<DownFrame>(&payload) else { panic!("not a sealed frame") };
            black_box(agent.open_coordinator(kind, &frame).expect("opens"));
        });
        push_pair(&mut rows, label, without, (sealed_bytes, sealed));
    }

    // Once per session.
    let info = agent_info();
    let sign = time(|| {
        black_box(auth::hello(&agent_id, black_box(info.clone()), 1, 1, [7; 32], None).expect("hello"));
    });
    let (signed, _) = auth::hello(&agent_id, info.clone(), 1, 1, [7; 32], None).expect("hello");
    let verify = time(|| {
        black_box(auth::open_hello(black_box(&signed)).expect("verifies"));
    });
    let handshake = time(|| {
        black_box(sessions(&agent_id, &coord_id, name));
    });
    rows.push(Row {
        what: "Hello: `auth::hello` (X25519 key, Ed25519 sign)".into(),
        ns: sign,
        note: format!("{} B body", signed.body.len()),
    });
    rows.push(Row { what: "Hello: `auth::open_hello` (Ed25519 verify)".into(), ns: verify, note: String::new() });
    rows.push(Row {
        what: "whole handshake: hello, open_hello, welcome, finish".into(),
        ns: handshake,
        note: "both sides, one thread".into(),
    });

    println!(
        "machine: {} cores, {}; median of {ROUNDS} rounds of {} ms each\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        std::env::consts::ARCH,
        ROUND.as_millis()
    );
    println!("| operation | ns/op | µs/op | note |");
    println!("|---|---|---|---|");
    for r in rows {
        println!("| {} | {:.0} | {:.2} | {} |", r.what, r.ns, r.ns / 1e3, r.note);
    }
}
