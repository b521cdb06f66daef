//! The fleet benchmark: `cargo build --release --workspace --bins && cargo
//! bench -p tunefleet-tests --bench fleet [-- rtt|sim|real]`. Prints markdown
//! tables (copied into BENCHMARKS.md).
//!
//! * `rtt`: QoS 1 request/reply round trip through the embedded broker, with
//!   and without `TCP_NODELAY` on its accepted sockets, and through Mosquitto.
//! * `sim`: coordinator capacity: a real `tunefleet run` process (embedded
//!   broker, SQLite store) against 1, 4 and 16 protocol-speaking agents in this
//!   process that answer every assignment at once. Trials/s and assignment
//!   latency (work request published -> assignment received).
//! * `real`: the whole path: 1, 4 and 16 `tunefleet-agent` processes running
//!   `true` as the workload (wrapper, perf counters, energy estimate, store).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rumqttc::{AsyncClient, Event, MqttOptions, NetworkOptions, Packet, QoS};
use tokio::sync::mpsc;
use tunefleet_common::auth;
use tunefleet_common::measurement::*;
use tunefleet_common::message::*;
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_common::{decode, encode};
use tunefleet_coordinator::broker::{self, BrokerSettings};
use tunefleet_tests::mosquitto::Mosquitto;
use tunefleet_tests::*;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn client(id: &str, port: u16) -> (AsyncClient, rumqttc::EventLoop) {
    let mut opts = MqttOptions::new(id, "127.0.0.1", port);
    opts.set_keep_alive(Duration::from_secs(30)).set_inflight(1000).set_max_packet_size(1 << 21, 1 << 21);
    let (c, mut el) = AsyncClient::new(opts, 1024);
    let mut net = NetworkOptions::new();
    net.set_tcp_nodelay(true);
    el.set_network_options(net);
    (c, el)
}

/// Median and p99 of `n` QoS 1 request/reply round trips, in milliseconds.
async fn rtt(port: u16, n: usize) -> (f64, f64) {
    let tag = format!("{}", std::process::id());
    let (responder, mut rel) = client(&format!("rtt-r-{tag}"), port);
    let (requester, mut qel) = client(&format!("rtt-q-{tag}"), port);
    let (req_topic, rep_topic) = (format!("rtt/{tag}/req"), format!("rtt/{tag}/rep"));
    let (sub_tx, mut sub_rx) = mpsc::channel::<()>(4);
    let rt = req_topic.clone();
    let rp = rep_topic.clone();
    let r2 = responder.clone();
    let stx = sub_tx.clone();
    tokio::spawn(async move {
        loop {
            match rel.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = r2.try_subscribe(rt.clone(), QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = stx.send(()).await;
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = r2.try_publish(rp.clone(), QoS::AtLeastOnce, false, p.payload);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    let (rep_tx, mut rep_rx) = mpsc::channel::<()>(16);
    let q2 = requester.clone();
    let rp = rep_topic.clone();
    tokio::spawn(async move {
        loop {
            match qel.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = q2.try_subscribe(rp.clone(), QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = sub_tx.send(()).await;
                }
                Ok(Event::Incoming(Packet::Publish(_))) => {
                    let _ = rep_tx.send(()).await;
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(10), sub_rx.recv()).await.expect("subscribed");
    }
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + 20 {
        let t0 = Instant::now();
        requester.publish(req_topic.clone(), QoS::AtLeastOnce, false, vec![0u8; 64]).await.expect("publish");
        tokio::time::timeout(Duration::from_secs(10), rep_rx.recv()).await.expect("reply in time");
        if i >= 20 {
            samples.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    let _ = requester.disconnect().await;
    let _ = responder.disconnect().await;
    samples.sort_by(f64::total_cmp);
    (percentile(&samples, 0.5), percentile(&samples, 0.99))
}

async fn bench_rtt() {
    println!("\n### QoS 1 request/reply round trip (ms)\n");
    println!("| broker | round trips | median | p99 |");
    println!("|---|---|---|---|");
    for (label, nodelay, n) in [
        ("embedded rumqttd, TCP_NODELAY set (default)", true, 2000),
        ("embedded rumqttd, as shipped (no TCP_NODELAY)", false, 40),
    ] {
        let b = broker::start(&BrokerSettings {
            listen: "127.0.0.1:0".parse().expect("addr"),
            users: None,
            nodelay,
            tls: None,
        })
        .expect("broker");
        let (med, p99) = rtt(b.addr.port(), n).await;
        println!("| {label} | {n} | {med:.3} | {p99:.3} |");
    }
    if Command::new("mosquitto").arg("-h").output().is_ok() {
        let dir = tempfile::tempdir().expect("tmp");
        let m = Mosquitto::start(dir.path(), "allow_anonymous true\nset_tcp_nodelay true\n");
        let (med, p99) = rtt(m.port, 2000).await;
        println!("| mosquitto 2.0, set_tcp_nodelay true | 2000 | {med:.3} | {p99:.3} |");
    }
}

fn noop_study(dir: &Path, trials: u64) -> std::path::PathBuf {
    let p = dir.join("noop.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"noop\"\ncommand = [\"true\", \"{{x}}\"]\ntimeout = 60\nmax_attempts = 3\n[objective]\nmetric = \"wall_time\"\ndirection = \"minimize\"\n[budget]\ntrials = {trials}\n[strategy]\nkind = \"random\"\nseed = 1\n[hyper.x]\nkind = \"int\"\nlow = 0\nhigh = 1000000000\n"
        ),
    )
    .expect("study");
    p
}

fn fake_measurement() -> Measurement {
    Measurement {
        wall_us: 900,
        user_us: 300,
        sys_us: 200,
        max_rss_kib: 1000,
        counters: vec![CounterReading {
            event: "task-clock".into(),
            kind: CounterKind::Software,
            value: 500_000,
            time_enabled_ns: 500_000,
            time_running_ns: 500_000,
        }],
        energy: EnergyReading {
            joules: 0.01,
            interval_ms: 1000,
            valid: true,
            note: None,
            ..EnergyReading::none(EnergySourceKind::Estimated, "")
        },
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    }
}

/// A protocol-speaking agent that answers every assignment at once.
/// Returns the assignment latencies it saw, in milliseconds.
async fn sim_agent(name: String, port: u16, topics: Topics) -> Vec<f64> {
    let (c, mut el) = client(&format!("tf-agent-{name}"), port);
    let info = AgentInfo { cores: 2, memory_bytes: 1 << 30, ..AgentInfo::minimal(&name, rand_instance(&name)) };
    // Authenticated like the real agent: its own key, a signed Hello, sealed messages.
    let identity = auth::Identity::generate().expect("key").0;
    let (_, will_hash) = auth::new_will(info.instance).expect("will");
    let send = |c: &AsyncClient, kind: AgentTopic, payload: Vec<u8>| {
        let _ = c.try_publish(topics.agent(&name, kind), QoS::AtLeastOnce, kind == AgentTopic::Status, payload);
    };
    let mut pending: Option<auth::PendingHello> = None;
    let mut coordinator_key: Option<auth::PublicKey> = None;
    let mut session: Option<auth::Session> = None;
    let mut hello_seq = 0u64;
    let mut seq = 0u64;
    let mut asked = Instant::now();
    let mut lat = Vec::new();
    let m = fake_measurement();
    loop {
        match el.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                let _ = c.try_subscribe(topics.to_agent(&name), QoS::AtLeastOnce);
                let _ = c.try_subscribe(topics.coordinator_status(), QoS::AtLeastOnce);
            }
            Ok(Event::Incoming(Packet::Publish(p))) if p.topic == topics.coordinator_status() => {
                // Announce to every coordinator that comes online, as the real agent does.
                // The bench pins nothing: it trusts the key the status names.
                let status = decode::<auth::Signed>(&p.payload).ok().and_then(|s| auth::open_status(&s).ok());
                if let Some(s) = &status {
                    coordinator_key = Some(s.key);
                }
                if let Some(status) = status.filter(|s| s.online) {
                    hello_seq += 1;
                    let (signed, half) =
                        auth::hello(&identity, info.clone(), status.instance, hello_seq, will_hash).expect("hello");
                    pending = Some(half);
                    session = None;
                    send(&c, AgentTopic::Hello, encode(&auth::UpFrame::Hello(signed)).expect("enc"));
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let kind = p.topic.rsplit('/').next().unwrap_or_default();
                let Some(kind) = AgentTopic::ALL.into_iter().find(|k| k.as_str() == kind) else { continue };
                match decode::<auth::DownFrame>(&p.payload) {
                    Ok(auth::DownFrame::Welcome(w)) => {
                        let (Some(half), Some(key)) = (pending.take(), coordinator_key) else { continue };
                        let Ok(mut s) = half.finish(&name, &key, &w) else { continue };
                        seq += 1;
                        asked = Instant::now();
                        let req = AgentMessage::Request(WorkRequest { seq, free: 1, running: vec![] });
                        let (k, payload) = s.seal_agent(&req).expect("seal");
                        send(&c, k, payload);
                        session = Some(s);
                    }
                    Ok(auth::DownFrame::Sealed(sealed)) => {
                        let Some(s) = session.as_mut() else { continue };
                        let msg = s.open_coordinator(kind, &sealed);
                        if let Ok(CoordinatorMessage::Sync(n)) = msg {
                            // Confirm delivery, as the real agent does, so the coordinator exits at once.
                            let (k, payload) = s.seal_agent(&AgentMessage::Synced(n)).expect("seal");
                            send(&c, k, payload);
                        }
                        if let Ok(CoordinatorMessage::Assign(a)) = msg {
                            lat.push(asked.elapsed().as_secs_f64() * 1e3);
                            let result = AgentMessage::Result(TrialResult { trial: a.trial, measurement: m.clone() });
                            let (k, payload) = s.seal_agent(&result).expect("seal");
                            send(&c, k, payload);
                            seq += 1;
                            asked = Instant::now();
                            let req = AgentMessage::Request(WorkRequest { seq, free: 1, running: vec![] });
                            let (k, payload) = s.seal_agent(&req).expect("seal");
                            send(&c, k, payload);
                        }
                    }
                    Err(_) => {}
                }
            }
            Ok(_) => {}
            Err(_) => return lat,
        }
    }
}

fn rand_instance(name: &str) -> u64 {
    name.bytes().fold(std::process::id() as u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
}

/// Trials per second between the first assignment and the last stored result.
fn store_rate(store: &Path) -> (u64, f64) {
    let db = rusqlite::Connection::open(store).expect("store");
    let (n, first, last): (i64, i64, i64) = db
        .query_row(
            "SELECT (SELECT COUNT(*) FROM results), (SELECT MIN(assigned_ms) FROM attempts), (SELECT MAX(received_ms) FROM results)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("query");
    (n as u64, n as f64 / ((last - first).max(1) as f64 / 1e3))
}

async fn bench_sim(trials: u64) {
    println!(
        "\n### Coordinator capacity: simulated agents, no process per trial ({trials} trials, durable SQLite store)\n"
    );
    println!("| agents | trials/s | assignment latency median (ms) | p99 (ms) |");
    println!("|---|---|---|---|");
    for agents in [1usize, 4, 16] {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("s.db");
        let root = unique_root("sim");
        let (mut coord, url) = start_coordinator(&noop_study(dir.path(), trials), &store, &root, &[]);
        let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
        let topics = Topics::new(&root).expect("root");
        let handles: Vec<_> =
            (0..agents).map(|i| tokio::spawn(sim_agent(format!("sim-{i}"), port, topics.clone()))).collect();
        let status = tokio::task::spawn_blocking(move || {
            let s = coord.wait_exit(Duration::from_secs(600));
            (s, coord)
        })
        .await
        .expect("join");
        assert!(status.0.success());
        let mut lat: Vec<f64> = Vec::new();
        for h in handles {
            lat.extend(h.await.expect("agent"));
        }
        lat.sort_by(f64::total_cmp);
        let (n, rate) = store_rate(&store);
        assert_eq!(n, trials);
        println!("| {agents} | {rate:.0} | {:.3} | {:.3} |", percentile(&lat, 0.5), percentile(&lat, 0.99));
    }
}

fn bench_real(trials: u64) {
    println!("\n### Whole path: agent processes running `true` ({trials} trials, wrapper + counters + store)\n");
    println!("| agents | trials/s | coordinator CPU s | mean wall per trial (ms) |");
    println!("|---|---|---|---|");
    for agents in [1usize, 4, 16] {
        let dir = tempfile::tempdir().expect("tmp");
        let store = dir.path().join("s.db");
        let root = unique_root("real");
        let (mut coord, url) = start_coordinator(&noop_study(dir.path(), trials), &store, &root, &[]);
        let _agents: Vec<Proc> = (0..agents).map(|i| start_agent(&url, &format!("real-{i}"), &root, &[])).collect();
        let pid = coord.child.id();
        let mut cpu = 0.0;
        wait_for("the study", Duration::from_secs(600), || {
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
                let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
                    + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
                cpu = ticks / 100.0;
            }
            matches!(coord.child.try_wait(), Ok(Some(_)))
        });
        let (n, rate) = store_rate(&store);
        assert_eq!(n, trials);
        let db = rusqlite::Connection::open(&store).expect("store");
        let wall: f64 = db.query_row("SELECT AVG(wall_us) FROM results", [], |r| r.get(0)).expect("avg");
        println!("| {agents} | {rate:.0} | {cpu:.2} | {:.2} |", wall / 1e3);
    }
}

fn main() {
    let what: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |w: &str| what.is_empty() || what.iter().any(|a| a == w);
    println!(
        "machine: {} cores, {}",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        std::env::consts::ARCH
    );
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    if want("rtt") {
        rt.block_on(bench_rtt());
    }
    if want("sim") {
        rt.block_on(bench_sim(std::env::var("SIM_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)));
    }
    if want("real") {
        bench_real(2_000);
    }
}
