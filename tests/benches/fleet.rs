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
//! * `sched` (also run by `sim`): the scheduler alone, in this process, no
//!   broker and no store: cost per trial at 1,000 and 100,000 trials with 1,
//!   100 and 1,000 agents, and the cost of one expiry tick and of one agent
//!   going offline as the study grows.
//! * `memory` (also run by `sim`): the coordinator's resident memory per
//!   connected agent, 10 then 1,000 idle protocol-speaking agents, with the
//!   embedded broker and with Mosquitto (when installed).
//! * `fleet`: the fleet simulator: 10, 100, 1,000 and 5,000 authenticated
//!   protocol-speaking agents in this process (`FLEET_AGENTS=10,100` to
//!   choose), one slot each, trials of `FLEET_TRIAL_MS` (0 by default; a
//!   length is drawn from 0.5 to 1.5 times that),
//!   20 trials per agent between 20,000 and 100,000 (`FLEET_TRIALS`), with the
//!   embedded broker and with Mosquitto. The fleet is welcomed first, then
//!   asks: assigned and completed trials/s, assignment latency, the
//!   coordinator's CPU seconds for the welcome and for the study, its peak
//!   memory, Mosquitto's, the simulator's own CPU, the attempts given
//!   again (leases that expired) and the simulated agents' connection
//!   errors (each one a reconnect). `FLEET_STORE_PG=postgres://USER@HOST:PORT/DB`
//!   runs the coordinator on that PostgreSQL server instead of a SQLite
//!   file (a schema per run).
//! * `restart` (not in the default set): `support/fleet_restart.rs`, a fleet
//!   reconnecting after the coordinator is killed and started again.
//! * `flat`: the coordinator's CPU per trial at 1,000, 10,000 and 100,000
//!   trials, 100 and 1,000 simulated agents.

#[path = "support/fleet_restart.rs"]
mod fleet_restart;

use std::collections::VecDeque;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicU64, Ordering};

use rumqttc::{AsyncClient, Event, MqttOptions, NetworkOptions, Packet, QoS};
use tokio::sync::mpsc;
use tunefleet_common::auth;
use tunefleet_common::measurement::*;
use tunefleet_common::message::*;
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_common::{decode, encode};
use tunefleet_coordinator::domain::sched::{Effect, Restored, ResultKind, Scheduler, Selector, StudyPolicy};
use tunefleet_coordinator::runtime::broker::{self, BrokerEngine, BrokerSettings};
use tunefleet_tests::mosquitto::{Mosquitto, FLEET_OPTIONS};
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
    for (label, engine, nodelay, n) in [
        ("embedded (Tunefleet's own, default)", BrokerEngine::Native, true, 2000),
        #[cfg(feature = "rumqttd")]
        ("embedded rumqttd, TCP_NODELAY set", BrokerEngine::Rumqttd, true, 2000),
        #[cfg(feature = "rumqttd")]
        ("embedded rumqttd, as shipped (no TCP_NODELAY)", BrokerEngine::Rumqttd, false, 40),
    ] {
        let b = broker::start(&BrokerSettings {
            listen: "127.0.0.1:0".parse().expect("addr"),
            users: None,
            nodelay,
            tls: None,
            engine,
            gate: None,
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

/// A protocol-speaking agent that answers every assignment at once; with
/// `free` 0 it asks for nothing and stays connected, idle. Says on
/// `welcomed` when its session is open. Returns the assignment latencies it
/// saw, in milliseconds.
async fn sim_agent(
    name: String,
    port: u16,
    topics: Topics,
    free: u32,
    welcomed: mpsc::UnboundedSender<()>,
) -> Vec<f64> {
    sim_agent_for(name, port, topics, free, Duration::ZERO, None, welcomed).await
}

/// [`sim_agent`] whose trials take `duration`: it answers an assignment
/// that long after it arrived, keeping its connection served meanwhile.
/// With `go`, it asks for its first trial only once `go` turns true.
async fn sim_agent_for(
    name: String,
    port: u16,
    topics: Topics,
    free: u32,
    duration: Duration,
    mut go: Option<tokio::sync::watch::Receiver<bool>>,
    welcomed: mpsc::UnboundedSender<()>,
) -> Vec<f64> {
    let info = AgentInfo { cores: 2, memory_bytes: 1 << 30, ..AgentInfo::minimal(&name, rand_instance(&name)) };
    // Authenticated like the real agent: its own key, a login proving it, a signed Hello, sealed messages.
    let identity = auth::Identity::generate().expect("key").0;
    let (c, mut el) = client(&format!("tf-agent-{name}"), port);
    el.mqtt_options.set_credentials(name.clone(), key_login(&identity, &name, None));
    // Admitted with the coordinator's join token, as the real agent is.
    let enrol = join_token_of(topics.root()).map(|t| {
        let token: auth::JoinToken = t.parse().expect("a join token");
        token.prove(&identity.public(), &name).expect("proof")
    });
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
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<TrialRef>();
    let mut errors = 0;
    let mut held_request = false;
    let mut last_status: Option<(bool, u64)> = None;
    let mut connected = false;
    let mut first_welcome = true;
    // As the real agent does (lib.rs, HELLO_RETRY): no Welcome for a Hello
    // in 3 s (the coordinator's Hello budget was spent), say Hello again.
    let mut hello_retry = tokio::time::interval(Duration::from_secs(3));
    hello_retry.tick().await;
    let mut online: Option<u64> = None;
    let mut rng = rand_instance(&name) | 1;
    loop {
        let event = tokio::select! {
            e = el.poll() => e,
            _ = hello_retry.tick(), if session.is_none() && online.is_some() => {
                let Some(instance) = online else { continue };
                hello_seq += 1;
                let (signed, half) =
                    auth::hello(&identity, info.clone(), instance, hello_seq, will_hash, enrol.clone()).expect("hello");
                pending = Some(half);
                send(&c, AgentTopic::Hello, encode(&auth::UpFrame::Hello(signed)).expect("enc"));
                continue;
            }
            Some(trial) = done_rx.recv() => {
                let Some(s) = session.as_mut() else { continue };
                seq += 1;
                asked = Instant::now();
                let (k, payload) = s.seal_agent(&answer(trial, &m, seq)).expect("seal");
                send(&c, k, payload);
                continue;
            }
            _ = async {
                if let Some(g) = go.as_mut() {
                    let _ = g.wait_for(|v| *v).await;
                }
            }, if held_request => {
                held_request = false;
                let Some(s) = session.as_mut() else { continue };
                seq += 1;
                asked = Instant::now();
                let req = AgentMessage::Request(WorkRequest { seq, free, ahead: 0, running: vec![], held: vec![] });
                let (k, payload) = s.seal_agent(&req).expect("seal");
                send(&c, k, payload);
                continue;
            }
        };
        if event.is_ok() {
            errors = 0;
        }
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                // A connection after the first: the broker dropped this one.
                // As the real agent does (protocol.rs, on_connected), it says
                // Hello again: its Request then tells the coordinator that
                // nothing runs here, and a lost assignment goes back at once.
                if std::mem::replace(&mut connected, true) {
                    RECONNECTS.fetch_add(1, Ordering::Relaxed);
                    session = None;
                }
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
                if status.as_ref().is_some_and(|s| !s.online) && session.is_some() {
                    return lat; // the coordinator is gone: the study is over
                }
                // As the real agent does (protocol.rs): announce to a new or
                // returning instance, or while not welcomed; not again at the
                // coordinator's periodic refresh of the same status.
                let changed = status.as_ref().is_some_and(|s| last_status != Some((true, s.instance)));
                if let Some(s) = &status {
                    last_status = Some((s.online, s.instance));
                    online = s.online.then_some(s.instance);
                }
                if let Some(status) = status.filter(|s| s.online && (changed || session.is_none())) {
                    hello_seq += 1;
                    let (signed, half) =
                        auth::hello(&identity, info.clone(), status.instance, hello_seq, will_hash, enrol.clone())
                            .expect("hello");
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
                        if go.as_ref().is_some_and(|g| !*g.borrow()) {
                            held_request = true;
                        } else {
                            seq += 1;
                            asked = Instant::now();
                            let req = AgentMessage::Request(WorkRequest {
                                seq,
                                free,
                                ahead: 0,
                                running: vec![],
                                held: vec![],
                            });
                            let (k, payload) = s.seal_agent(&req).expect("seal");
                            send(&c, k, payload);
                        }
                        session = Some(s);
                        if std::mem::take(&mut first_welcome) {
                            let _ = welcomed.send(());
                        }
                    }
                    // The simulator's sessions never go stale on their own.
                    Ok(auth::DownFrame::Stale(_) | auth::DownFrame::Refused(_)) => {}
                    Ok(auth::DownFrame::Sealed(sealed)) => {
                        let Some(s) = session.as_mut() else { continue };
                        // A bundle (an ack and the next assignment) is its messages, in order.
                        let msgs = s.open_coordinator(kind, &sealed).ok().and_then(|m| m.unbundle().ok());
                        for msg in msgs.unwrap_or_default() {
                            if let CoordinatorMessage::Sync(n) = msg {
                                // Confirm delivery, as the real agent does, so the coordinator exits at once.
                                let (k, payload) = s.seal_agent(&AgentMessage::Synced(n)).expect("seal");
                                send(&c, k, payload);
                            }
                            if let CoordinatorMessage::Assign(a) = msg {
                                lat.push(asked.elapsed().as_secs_f64() * 1e3);
                                if !duration.is_zero() {
                                    let done = done_tx.clone();
                                    // Lengths spread over 0.5 to 1.5 times the mean, as real
                                    // trials' are: equal lengths keep a fleet that started
                                    // together asking together, in waves.
                                    rng ^= rng << 13;
                                    rng ^= rng >> 7;
                                    rng ^= rng << 17;
                                    let this = duration.mul_f64(0.5 + (rng % 1_000) as f64 / 1_000.0);
                                    tokio::spawn(async move {
                                        tokio::time::sleep(this).await;
                                        let _ = done.send(a.trial);
                                    });
                                    continue;
                                }
                                seq += 1;
                                asked = Instant::now();
                                let (k, payload) = s.seal_agent(&answer(a.trial, &m, seq)).expect("seal");
                                send(&c, k, payload);
                            }
                        }
                    }
                    Err(_) => {}
                }
            }
            Ok(_) => {}
            // The connection is lost: when the coordinator's embedded broker
            // goes, or when a connection storm made the broker drop this one;
            // the client reconnects on the next poll, up to 5 s in a row.
            Err(e) if errors < 25 => {
                // The first few, for the reader of a run (the table counts them all).
                if CONNECTION_ERRORS.fetch_add(1, Ordering::Relaxed) < 3 {
                    eprintln!("sim: {name}: connection error: {e}");
                }
                errors += 1;
                // A new proof for the next attempt (attempts are 200 ms apart: each is later).
                el.mqtt_options.set_credentials(name.clone(), key_login(&identity, &name, None));
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(_) => return lat,
        }
    }
}

/// A finished trial's result and the request (number `seq`) for the next,
/// bundled in one frame as the real agent sends them.
fn answer(trial: TrialRef, m: &Measurement, seq: u64) -> AgentMessage {
    AgentMessage::bundle(&[
        AgentMessage::Result(TrialResult { trial, measurement: m.clone() }),
        AgentMessage::Request(WorkRequest { seq, free: 1, ahead: 0, running: vec![], held: vec![] }),
    ])
    .expect("bundles")
}

/// Connection errors the simulated agents saw (the embedded broker going
/// with the coordinator at the end of a run included).
static CONNECTION_ERRORS: AtomicU64 = AtomicU64::new(0);
/// Connections of simulated agents after their first: each one a connection
/// the broker dropped during the run.
static RECONNECTS: AtomicU64 = AtomicU64::new(0);

fn rand_instance(name: &str) -> u64 {
    // Within the store's range (an i64), as the real agent's are: the
    // coordinator refuses a Hello whose instance is past it.
    name.bytes().fold(std::process::id() as u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64)) & (i64::MAX as u64)
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
        let (welcomed, _) = mpsc::unbounded_channel();
        let handles: Vec<_> = (0..agents)
            .map(|i| tokio::spawn(sim_agent(format!("sim-{i}"), port, topics.clone(), 1, welcomed.clone())))
            .collect();
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
                cpu = stat_cpu_s(&stat).1;
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

/// The engine's expiry tick (`coordinator/src/runtime/engine/core.rs`).
const TICK_MS: u64 = 250;

fn sched_policy(max_attempts: u32) -> StudyPolicy {
    StudyPolicy {
        name: "s".into(),
        id: 7,
        selector: Selector::default(),
        max_attempts,
        ahead_per_slot: tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT,
        ahead_per_agent: None,
        lease_ms: 65_000,
        gpus: 0,
        store_share: u64::MAX,
    }
}

fn sched_request(seq: u64, free: u32) -> WorkRequest {
    WorkRequest { seq, free, ahead: 0, running: vec![], held: vec![] }
}

/// `agents` agents with one slot each against one open study of `trials`
/// no-op trials, driven as the engine drives the scheduler: each turn takes
/// one result and that agent's next request, expires leases when a 250 ms
/// tick is due, creates trials up to the demand, assigns, and reads the
/// counts and the number of live agents. Simulated time runs at 10,000
/// trials/s. Returns the wall time per trial in microseconds.
fn sched_run(trials: u64, agents: usize) -> f64 {
    let mut s = Scheduler::new();
    s.add_study(sched_policy(3), Vec::new(), 0);
    s.set_open("s", true);
    let names: Vec<String> = (0..agents).map(|i| format!("agent-{i}")).collect();
    let mut seqs = vec![1u64; agents];
    for n in &names {
        s.hello(AgentInfo::minimal(n, 1));
        s.request(n, &sched_request(1, 1));
    }
    let mut held: VecDeque<(usize, TrialRef)> = VecDeque::new();
    let (mut created, mut done, mut last_tick) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    loop {
        let now = done / 10;
        if let Some((a, trial)) = held.pop_front() {
            black_box(s.result(&names[a], &trial, ResultKind::Complete { success: true }, now));
            seqs[a] += 1;
            black_box(s.request(&names[a], &sched_request(seqs[a], 1)));
            done += 1;
        }
        if now >= last_tick + TICK_MS {
            last_tick = now;
            black_box(s.expire(now));
        }
        let mut want = s.demand("s");
        while want > 0 && created < trials {
            s.add_trial("s");
            created += 1;
            want -= 1;
        }
        if created == trials {
            s.set_open("s", false);
        }
        for e in s.assign(now) {
            if let Effect::Assign { agent, trial, .. } = e {
                let a = agent.strip_prefix("agent-").and_then(|i| i.parse().ok()).expect("a bench agent");
                held.push_back((a, trial));
            }
        }
        black_box(s.live_agents());
        if s.counts("s").is_some_and(|c| c.finished()) {
            break;
        }
    }
    assert_eq!(done, trials);
    t0.elapsed().as_secs_f64() * 1e6 / trials as f64
}

/// [`sched_run`] in 5 samples of about 100,000 trials each (one run of
/// 100,000 trials, or 100 runs of 1,000): the fastest sample, the one that
/// other work on the machine disturbed least. Samples of equal length for
/// every size, so that no size has more chances to find a quiet moment.
fn sched_cost(trials: u64, agents: usize) -> f64 {
    let runs = (100_000 / trials).max(1);
    let sample = || (0..runs).map(|_| sched_run(trials, agents)).sum::<f64>() / runs as f64;
    (0..5).map(|_| sample()).fold(f64::INFINITY, f64::min)
}

/// A study of `trials` trials, all done but `running` of them, which run
/// on agent `a`; and 99 other agents, idle.
fn sched_mostly_done(trials: u64, running: u64) -> Scheduler {
    let mut s = Scheduler::new();
    let mut states = vec![Restored::Done; (trials - running) as usize];
    states.extend((0..running).map(|_| Restored::Pending { last_attempt: 0, failures: 0 }));
    s.add_study(sched_policy(u32::MAX), states, 0);
    for i in 0..100 {
        s.hello(AgentInfo::minimal(&format!("agent-{i}"), 1));
    }
    // As many slots as it runs: a request is capped at the announced slots.
    s.hello(AgentInfo { slots: u32::try_from(running).unwrap_or(u32::MAX), ..AgentInfo::minimal("a", 1) });
    s.request("a", &sched_request(1, running as u32));
    assert_eq!(s.assign(0).len() as u64, running);
    s
}

/// Microseconds per expiry tick that finds nothing due, and per agent
/// going offline (it held 10 leases, requeued; then it asks again and gets
/// them back, untimed), with `trials` trials in the study.
fn sched_expiry_offline(trials: u64) -> (f64, f64) {
    let mut s = sched_mostly_done(trials, 10);
    let ticks = 2_000;
    let t0 = Instant::now();
    for i in 0..ticks {
        black_box(s.expire(i));
    }
    let tick = t0.elapsed().as_secs_f64() * 1e6 / ticks as f64;
    let rounds = 500;
    let mut offline = Duration::ZERO;
    for i in 0..rounds {
        let t0 = Instant::now();
        let effects = s.status("a", &AgentStatus { online: false, instance: 1 });
        offline += t0.elapsed();
        let released = effects.iter().filter(|e| matches!(e, Effect::Requeued { .. })).count();
        assert!(released >= 1, "the held leases are released: {effects:?}");
        s.request("a", &sched_request(i + 2, 10));
        // An agent that lost held trials gets fewer back at once.
        assert!(!s.assign(0).is_empty());
    }
    (tick, offline.as_secs_f64() * 1e6 / rounds as f64)
}

fn bench_sched() {
    println!(
        "\n### Scheduler alone: wall time per trial (µs, fastest of 5 samples), one result per turn, 250 ms tick\n"
    );
    println!("| agents | 1,000 trials | 100,000 trials | 100,000 / 1,000 |");
    println!("|---|---|---|---|");
    for agents in [1usize, 100, 1_000] {
        let small = sched_cost(1_000, agents);
        let large = sched_cost(100_000, agents);
        println!("| {agents} | {small:.2} | {large:.2} | {:.2} |", large / small);
    }
    println!("\n### Scheduler alone: expiry tick and agent offline (µs per event; 10 leases held)\n");
    println!("| trials in the study | expiry tick, nothing due | agent offline, 10 leases |");
    println!("|---|---|---|");
    for trials in [1_000u64, 100_000] {
        let (tick, offline) = sched_expiry_offline(trials);
        println!("| {trials} | {tick:.3} | {offline:.3} |");
    }
}

/// `VmRSS` and `VmHWM` of process `pid`, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("a memory field")
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Starts `count` idle agents (named from `first` on) and waits until the
/// coordinator has opened a session with each.
async fn idle_agents(first: usize, count: usize, port: u16, topics: &Topics) -> Vec<tokio::task::JoinHandle<Vec<f64>>> {
    let (welcomed, mut rx) = mpsc::unbounded_channel();
    let handles = (first..first + count)
        .map(|i| tokio::spawn(sim_agent(format!("idle-{i}"), port, topics.clone(), 0, welcomed.clone())))
        .collect();
    for _ in 0..count {
        tokio::time::timeout(Duration::from_secs(120), rx.recv()).await.expect("every agent welcomed");
    }
    handles
}

/// The coordinator's resident memory once it settles: sampled every 200 ms
/// until three samples in a row agree within 1 % (at most 10 s).
async fn settled_rss(pid: u32) -> (u64, u64) {
    let mut last = rss_kib(pid);
    let mut same = 0;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = rss_kib(pid);
        same = if now.0.abs_diff(last.0) * 100 <= last.0 { same + 1 } else { 0 };
        last = now;
        if same == 3 {
            break;
        }
    }
    last
}

/// The coordinator's memory per connected agent: a real `tunefleet run`
/// (store, and the embedded broker or Mosquitto) with 10 idle agents, then
/// `agents` in all; the growth of its resident set between the two, per
/// added agent, and Mosquitto's own.
async fn bench_memory(agents: usize) {
    println!("\n### Coordinator memory per connected agent (10, then {agents} idle authenticated agents)\n");
    println!("| broker | coordinator VmRSS, 10 agents (MiB) | {agents} agents (MiB) | coordinator per added agent (KiB) | its peak (VmHWM) per added agent (KiB) | broker process per added agent (KiB) | connect + welcome {} agents (s) |", agents - 10);
    println!("|---|---|---|---|---|---|---|");
    for which in fleet_brokers() {
        let external = which == FleetBroker::Mosquitto;
        let dir = tempfile::tempdir().expect("tmp");
        let root = unique_root("mem");
        let broker = external.then(|| Mosquitto::start(dir.path(), FLEET_OPTIONS));
        let mut extra: Vec<String> = broker.iter().flat_map(|m| ["--broker".to_string(), m.url()]).collect();
        if which == FleetBroker::Rumqttd {
            extra.extend(["--embedded-broker".to_string(), "rumqttd".to_string()]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        let (coord, url) = start_coordinator(&noop_study(dir.path(), 1), &dir.path().join("s.db"), &root, &extra);
        let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
        let topics = Topics::new(&root).expect("root");
        let pid = coord.child.id();
        let broker_rss = || broker.as_ref().and_then(Mosquitto::pid).map_or(0, |p| rss_kib(p).0);
        let mut handles = idle_agents(0, 10, port, &topics).await;
        let ((base, _), broker_base) = (settled_rss(pid).await, broker_rss());
        let t0 = Instant::now();
        handles.extend(idle_agents(10, agents - 10, port, &topics).await);
        let connect_s = t0.elapsed().as_secs_f64();
        let ((rss, hwm), broker_end) = (settled_rss(pid).await, broker_rss());
        let added = (agents - 10) as f64;
        let per = |end: u64, start: u64| end.saturating_sub(start) as f64 / added;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {connect_s:.1} |",
            which.label(),
            base as f64 / 1024.0,
            rss as f64 / 1024.0,
            per(rss, base),
            per(hwm, base),
            if external { format!("{:.1}", per(broker_end, broker_base)) } else { "(included)".into() },
        );
        drop(coord);
        for h in handles {
            h.abort();
        }
    }
}

/// CPU seconds (user + system) and peak resident memory (`VmHWM`, KiB) of
/// process `pid`, sampled every 50 ms by a thread until it exits: the last
/// sample of CPU time, the largest of memory.
fn sample_until_exit(pid: u32) -> std::thread::JoinHandle<(f64, u64)> {
    std::thread::spawn(move || {
        let (mut cpu, mut hwm) = (0.0, 0u64);
        while let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            let (state, now) = stat_cpu_s(&stat);
            if state == "Z" {
                break;
            }
            cpu = now;
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                let v = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next());
                hwm = hwm.max(v.and_then(|v| v.parse().ok()).unwrap_or(0));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (cpu, hwm)
    })
}

/// A process's state and the CPU seconds (user + system, 100 ticks a
/// second) it has used, from its `/proc/PID/stat` text.
fn stat_cpu_s(stat: &str) -> (&str, f64) {
    let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (f.first().copied().unwrap_or(""), (tick(11) + tick(12)) / 100.0)
}

/// CPU seconds (user + system) process `pid` ("self" for this one) has used so far.
fn cpu_s(pid: &str) -> f64 {
    stat_cpu_s(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()).1
}

/// What one fleet run measured.
struct FleetOutcome {
    assigned_per_s: f64,
    completed_per_s: f64,
    latency_median_ms: f64,
    latency_p99_ms: f64,
    /// p99 without each agent's first three assignments (the fleet's first
    /// requests arrive at once: a wave, not a load).
    latency_p99_steady_ms: f64,
    study_s: f64,
    welcome_all_s: f64,
    welcome_cpu_s: f64,
    coordinator_cpu_s: f64,
    coordinator_hwm_kib: u64,
    broker_cpu_s: Option<f64>,
    broker_hwm_kib: Option<u64>,
    fleet_cpu_s: f64,
    /// Attempts beyond one per trial (leases that expired and were given again).
    requeued: i64,
    /// Connections the broker dropped and the simulated agents made again.
    reconnects: u64,
}

/// One study of `trials` no-op trials on `agents` simulated agents (one slot
/// each, trials lasting `duration`), through the embedded broker or through
/// Mosquitto; a fresh coordinator, store and broker per run.
/// Which broker a fleet run meets on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FleetBroker {
    /// The coordinator's embedded broker (its own, the default).
    Embedded,
    /// The embedded rumqttd it replaced (`--embedded-broker rumqttd`).
    Rumqttd,
    /// Debian's Mosquitto in a process of its own.
    Mosquitto,
}

impl FleetBroker {
    fn label(self) -> &'static str {
        match self {
            FleetBroker::Embedded => "embedded (own)",
            FleetBroker::Rumqttd => "embedded rumqttd (before)",
            FleetBroker::Mosquitto => "Mosquitto 2.0",
        }
    }
}

/// The brokers to compare: `FLEET_BROKERS=embedded,rumqttd,mosquitto` (all by default; Mosquitto when installed;
/// rumqttd in builds with the `rumqttd` feature: `cargo bench -p tunefleet-tests --features rumqttd`).
fn fleet_brokers() -> Vec<FleetBroker> {
    let mosquitto = Command::new("mosquitto").arg("-h").output().is_ok();
    let wanted = std::env::var("FLEET_BROKERS").unwrap_or_else(|_| "embedded,rumqttd,mosquitto".into());
    wanted
        .split(',')
        .filter_map(|w| match w.trim() {
            "embedded" => Some(FleetBroker::Embedded),
            "rumqttd" if cfg!(feature = "rumqttd") => Some(FleetBroker::Rumqttd),
            "mosquitto" if mosquitto => Some(FleetBroker::Mosquitto),
            _ => None,
        })
        .collect()
}

/// The store a fleet run writes: `FLEET_STORE_PG` (a PostgreSQL URL
/// without `?schema=`) gives each run a schema of its own there; else a
/// SQLite file in `dir`. With the schema, when on PostgreSQL.
fn fleet_store(dir: &Path, root: &str) -> (PathBuf, Option<(String, String)>) {
    match std::env::var("FLEET_STORE_PG") {
        Ok(base) => {
            let schema = root.replace('-', "_").to_lowercase();
            (PathBuf::from(format!("{base}?schema={schema}")), Some((base, schema)))
        }
        Err(_) => (dir.join("s.db"), None),
    }
}

/// One row of numbers from a run's store (SQLite or PostgreSQL).
fn store_numbers(store: &Path, pg: Option<&(String, String)>, sql: &str) -> Vec<i64> {
    match pg {
        Some((base, schema)) => {
            let out = std::process::Command::new("psql")
                .args([base.as_str(), "-At", "-c", &format!("SET search_path TO {schema}; {sql}")])
                .output()
                .expect("psql");
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().last().unwrap_or_default();
            line.split('|').map(|v| v.trim().parse().unwrap_or(0)).collect()
        }
        None => {
            let db = rusqlite::Connection::open(store).expect("store");
            let n = sql.matches("(SELECT").count().max(1);
            db.query_row(sql, [], |r| (0..n).map(|i| r.get::<_, i64>(i)).collect::<Result<Vec<_>, _>>()).expect("query")
        }
    }
}

async fn fleet_run(agents: usize, duration: Duration, trials: u64, which: FleetBroker) -> FleetOutcome {
    let dir = tempfile::tempdir().expect("tmp");
    let root = unique_root("fleet");
    let (store, pg) = fleet_store(dir.path(), &root);
    let broker = (which == FleetBroker::Mosquitto).then(|| Mosquitto::start(dir.path(), FLEET_OPTIONS));
    let mut extra: Vec<String> = broker.iter().flat_map(|m| ["--broker".to_string(), m.url()]).collect();
    if which == FleetBroker::Rumqttd {
        extra.extend(["--embedded-broker".to_string(), "rumqttd".to_string()]);
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let (mut coord, url) = start_coordinator(&noop_study(dir.path(), trials), &store, &root, &extra);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let pid = coord.child.id();
    let sampler = sample_until_exit(pid);
    let broker_sampler = broker.as_ref().and_then(Mosquitto::pid).map(sample_until_exit);
    let topics = Topics::new(&root).expect("root");
    let t0 = Instant::now();
    let reconnects_before = RECONNECTS.load(Ordering::Relaxed);
    let (welcomed, mut rx) = mpsc::unbounded_channel();
    let (go, go_rx) = tokio::sync::watch::channel(false);
    let handles: Vec<_> = (0..agents)
        .map(|i| {
            let (name, go) = (format!("fleet-{i}"), Some(go_rx.clone()));
            tokio::spawn(sim_agent_for(name, port, topics.clone(), 1, duration, go, welcomed.clone()))
        })
        .collect();
    drop(welcomed);
    // The whole fleet connects and is welcomed first; then every agent asks.
    for _ in 0..agents {
        tokio::time::timeout(Duration::from_secs(300), rx.recv()).await.expect("every agent welcomed");
    }
    let welcome_all_s = t0.elapsed().as_secs_f64();
    let welcome_cpu_s = cpu_s(&pid.to_string());
    let fleet_cpu = cpu_s("self");
    go.send_replace(true);
    let status = tokio::task::spawn_blocking(move || {
        let s = coord.wait_exit(Duration::from_secs(1800));
        (s, coord)
    })
    .await
    .expect("join");
    let reconnects = RECONNECTS.load(Ordering::Relaxed) - reconnects_before;
    assert!(status.0.success(), "the coordinator failed");
    let (coordinator_cpu_s, coordinator_hwm_kib) = sampler.join().expect("sampler");
    let mut lat: Vec<f64> = Vec::new();
    let mut steady: Vec<f64> = Vec::new();
    for h in handles {
        let mine = h.await.expect("agent");
        steady.extend(mine.iter().skip(3));
        lat.extend(mine);
    }
    steady.sort_by(f64::total_cmp);
    let fleet_cpu_s = cpu_s("self") - fleet_cpu;
    lat.sort_by(f64::total_cmp);
    let numbers = store_numbers(
        &store,
        pg.as_ref(),
        "SELECT (SELECT COUNT(*) FROM results), (SELECT COUNT(*) FROM attempts), (SELECT MIN(assigned_ms) FROM attempts), (SELECT MAX(assigned_ms) FROM attempts), (SELECT MAX(received_ms) FROM results)",
    );
    let [n, attempts, first_assign, last_assign, last_result] = numbers[..] else {
        panic!("store numbers: {numbers:?}")
    };
    assert_eq!(n as u64, trials, "every trial has its result");
    let study_s = (last_result - first_assign).max(1) as f64 / 1e3;
    let (broker_cpu_s, broker_hwm_kib) = match (broker_sampler, broker) {
        (Some(sampler), Some(mut b)) => {
            b.kill();
            let (cpu, hwm) = sampler.join().expect("sampler");
            (Some(cpu), Some(hwm))
        }
        _ => (None, None),
    };
    FleetOutcome {
        assigned_per_s: attempts as f64 / ((last_assign - first_assign).max(1) as f64 / 1e3),
        completed_per_s: n as f64 / study_s,
        latency_median_ms: percentile(&lat, 0.5),
        latency_p99_ms: percentile(&lat, 0.99),
        latency_p99_steady_ms: percentile(&steady, 0.99),
        study_s,
        welcome_all_s,
        welcome_cpu_s,
        coordinator_cpu_s: coordinator_cpu_s - welcome_cpu_s,
        coordinator_hwm_kib,
        broker_cpu_s,
        broker_hwm_kib,
        fleet_cpu_s,
        requeued: attempts - n,
        reconnects,
    }
}

/// Trials of a run of `agents` agents: 20 per agent, at least 20,000 and at
/// most 100,000 (or `FLEET_TRIALS`).
fn fleet_trials(agents: usize) -> u64 {
    std::env::var("FLEET_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(((agents as u64) * 20).clamp(20_000, 100_000))
}

async fn bench_fleet() {
    let sizes: Vec<usize> = std::env::var("FLEET_AGENTS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10, 100, 1_000, 5_000]);
    let trial_ms: u64 = std::env::var("FLEET_TRIAL_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let duration = Duration::from_millis(trial_ms);
    println!("\n### Fleet simulator: N authenticated agents in one process, trials of {trial_ms} ms, durable store\n");
    println!("| broker | agents | trials | assigned/s | completed/s | assignment latency median (ms) | p99 (ms) | p99 after each agent's first 3 (ms) | study (s) | welcome all: s, coordinator CPU s | study: coordinator CPU s (µs per trial) | coordinator peak memory MiB (KiB per agent) | broker CPU s, peak MiB | simulator CPU s | attempts given again, agent reconnects |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &agents in &sizes {
        for which in fleet_brokers() {
            let trials = fleet_trials(agents);
            let o = fleet_run(agents, duration, trials, which).await;
            println!(
                "| {} | {agents} | {trials} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1}, {:.1} | {:.1} ({:.0}) | {:.0} ({:.1}) | {} | {:.1} | {}, {} |",
                which.label(),
                o.assigned_per_s,
                o.completed_per_s,
                o.latency_median_ms,
                o.latency_p99_ms,
                o.latency_p99_steady_ms,
                o.study_s,
                o.welcome_all_s,
                o.welcome_cpu_s,
                o.coordinator_cpu_s,
                o.coordinator_cpu_s * 1e6 / trials as f64,
                o.coordinator_hwm_kib as f64 / 1024.0,
                o.coordinator_hwm_kib as f64 / agents as f64,
                match (o.broker_cpu_s, o.broker_hwm_kib) {
                    (Some(c), Some(m)) => format!("{c:.1}, {:.0}", m as f64 / 1024.0),
                    _ => "(in the coordinator)".into(),
                },
                o.fleet_cpu_s,
                o.requeued,
                o.reconnects,
            );
        }
    }
}

/// The coordinator's cost per trial as the study grows: 100 and 1,000
/// agents, the embedded broker, 1,000 then 10,000 then 100,000 trials.
async fn bench_fleet_flat() {
    println!("\n### Fleet simulator: cost per trial as the study grows (embedded broker, trials of 0 ms)\n");
    println!("| agents | trials | completed/s | coordinator CPU µs per trial | per trial / at 1,000 trials | attempts given again, agent reconnects |");
    println!("|---|---|---|---|---|---|");
    for agents in [100usize, 1_000] {
        let mut first = None;
        for trials in [1_000u64, 10_000, 100_000] {
            let o = fleet_run(agents, Duration::ZERO, trials, FleetBroker::Embedded).await;
            let per = o.coordinator_cpu_s * 1e6 / trials as f64;
            let base = *first.get_or_insert(per);
            println!(
                "| {agents} | {trials} | {:.0} | {per:.0} | {:.2} | {}, {} |",
                o.completed_per_s,
                per / base,
                o.requeued,
                o.reconnects
            );
        }
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
    // `SIM_ONLY=1`: the coordinator's capacity table alone (to compare two builds).
    let sim_all = want("sim") && std::env::var_os("SIM_ONLY").is_none();
    if sim_all || want("sched") {
        bench_sched();
    }
    if sim_all || want("memory") {
        rt.block_on(bench_memory(1_000));
    }
    if want("sim") {
        rt.block_on(bench_sim(std::env::var("SIM_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)));
    }
    if want("real") {
        bench_real(2_000);
    }
    if want("fleet") {
        rt.block_on(bench_fleet());
    }
    if want("flat") {
        rt.block_on(bench_fleet_flat());
    }
    if what.iter().any(|a| a == "restart") {
        rt.block_on(fleet_restart::bench_restart());
    }
}
