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

use std::collections::VecDeque;
use std::hint::black_box;
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
use tunefleet_coordinator::sched::{Effect, Restored, ResultKind, Scheduler, Selector, StudyPolicy};
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
                        let req = AgentMessage::Request(WorkRequest { seq, free, running: vec![] });
                        let (k, payload) = s.seal_agent(&req).expect("seal");
                        send(&c, k, payload);
                        session = Some(s);
                        let _ = welcomed.send(());
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

/// The engine's expiry tick (`coordinator/src/engine.rs`).
const TICK_MS: u64 = 250;

fn sched_policy(max_attempts: u32) -> StudyPolicy {
    StudyPolicy { name: "s".into(), selector: Selector::default(), max_attempts, lease_ms: 65_000 }
}

fn sched_request(seq: u64, free: u32) -> WorkRequest {
    WorkRequest { seq, free, running: vec![] }
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
    s.hello(AgentInfo::minimal("a", 1));
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
        assert_eq!(effects.len(), 10);
        s.request("a", &sched_request(i + 2, 10));
        assert_eq!(s.assign(0).len(), 10);
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
    let mosquitto = Command::new("mosquitto").arg("-h").output().is_ok();
    for external in [false, true].into_iter().filter(|&e| !e || mosquitto) {
        let dir = tempfile::tempdir().expect("tmp");
        let root = unique_root("mem");
        let broker = external.then(|| Mosquitto::start(dir.path(), FLEET_OPTIONS));
        let extra: Vec<String> = broker.iter().flat_map(|m| ["--broker".to_string(), m.url()]).collect();
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
            if external { "Mosquitto 2.0 (separate process)" } else { "embedded rumqttd (in the coordinator)" },
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
    if want("sim") || want("sched") {
        bench_sched();
    }
    if want("sim") || want("memory") {
        rt.block_on(bench_memory(1_000));
    }
    if want("sim") {
        rt.block_on(bench_sim(std::env::var("SIM_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)));
    }
    if want("real") {
        bench_real(2_000);
    }
}
