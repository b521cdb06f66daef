//! `restart`: a fleet reconnecting at once after the coordinator is killed
//! (SIGKILL, mid-study) and started again on the same store and port.
//!
//! Each simulated agent runs the real agent's protocol state machine
//! (`tunefleet_agent::protocol::AgentState`): its Hellos, requests, held
//! and running trials, results kept until acknowledged and delivered again
//! to a new session. Only the workload (a sleep) and the disk are left out.
//! Measured: every trial done exactly once and none failed (from the
//! store), the time from the restart until 95 % (and all) of the agents
//! run a trial again, and the reconnects.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rumqttc::{Event, Packet, QoS};
use tokio::sync::mpsc;
use tunefleet_agent::protocol::{Action, AgentState};
use tunefleet_common::auth;
use tunefleet_common::message::*;
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_common::{decode, encode};
use tunefleet_tests::*;

use super::{client, fake_measurement, noop_study, rand_instance};

/// When each agent first started a trial after the restart.
type Restarted = Arc<Mutex<Vec<Option<Instant>>>>;

/// One simulated agent on the real protocol state; runs until `stop`.
#[allow(clippy::too_many_arguments)]
async fn proto_agent(
    index: usize,
    port: u16,
    topics: Topics,
    duration: Duration,
    restart_at: Arc<Mutex<Option<Instant>>>,
    restarted: Restarted,
    reconnects: Arc<std::sync::atomic::AtomicU64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let name = format!("re-{index}");
    let (c, mut el) = client(&format!("tf-agent-{name}"), port);
    let info = AgentInfo { cores: 2, memory_bytes: 1 << 30, ..AgentInfo::minimal(&name, rand_instance(&name)) };
    let mut state = AgentState::new(info, vec![0, 1], None);
    let identity = auth::Identity::generate().expect("key").0;
    let enrol = join_token_of(topics.root()).map(|t| {
        let token: auth::JoinToken = t.parse().expect("a join token");
        token.prove(&identity.public(), &name).expect("proof")
    });
    let (_, will_hash) = auth::new_will(state.instance()).expect("will");
    let mut pending: Option<auth::PendingHello> = None;
    let mut coordinator: Option<CoordinatorStatus> = None;
    let mut session: Option<auth::Session> = None;
    let mut hello_seq = 0u64;
    let mut connected = false;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<TrialRef>();
    let mut hello_retry = tokio::time::interval(Duration::from_secs(3));
    let mut request_again = tokio::time::interval(Duration::from_secs(30));
    let started = Instant::now();
    loop {
        let mut actions = Vec::new();
        state.set_clock(started.elapsed().as_micros() as u64);
        tokio::select! {
            _ = stop.changed() => return,
            Some(trial) = done_rx.recv() => {
                actions.extend(state.on_exited(trial.clone()));
                actions.extend(state.on_finished(trial, fake_measurement()));
            }
            _ = hello_retry.tick() => actions.extend(state.hello_again()),
            _ = request_again.tick() => actions.extend(state.request_again()),
            event = el.poll() => match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if std::mem::replace(&mut connected, true) {
                        reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    session = None;
                    let _ = c.try_subscribe(topics.to_agent(&name), QoS::AtLeastOnce);
                    let _ = c.try_subscribe(topics.coordinator_status(), QoS::AtLeastOnce);
                    actions.extend(state.on_connected());
                }
                Ok(Event::Incoming(Packet::Publish(p))) if p.topic == topics.coordinator_status() => {
                    let Ok(status) = decode::<auth::Signed>(&p.payload).map_err(|_| ()).and_then(|s| auth::open_status(&s).map_err(|_| ())) else { continue };
                    coordinator = Some(status.clone());
                    actions.extend(state.on_coordinator_status(status));
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let kind = p.topic.rsplit('/').next().unwrap_or_default();
                    let Some(kind) = AgentTopic::ALL.into_iter().find(|k| k.as_str() == kind) else { continue };
                    let Some(key) = coordinator.as_ref().map(|s| s.key) else { continue };
                    match decode::<auth::DownFrame>(&p.payload) {
                        Ok(auth::DownFrame::Welcome(w)) => {
                            let Some(half) = pending.take() else { continue };
                            let Ok(s) = half.finish(&name, &key, &w) else { continue };
                            session = Some(s);
                            actions.extend(state.on_welcome());
                        }
                        Ok(auth::DownFrame::Stale(signed)) => {
                            if auth::open_stale(&key, &signed).is_ok() {
                                session = None;
                                actions.extend(state.on_session_lost());
                            }
                        }
                        Ok(auth::DownFrame::Refused(_)) => {}
                        Ok(auth::DownFrame::Sealed(sealed)) => {
                            let Some(s) = session.as_mut() else { continue };
                            let msgs = s.open_coordinator(kind, &sealed).ok().and_then(|m| m.unbundle().ok());
                            for msg in msgs.unwrap_or_default() {
                                match msg {
                                    CoordinatorMessage::Assign(a) => actions.extend(state.on_assign(a)),
                                    CoordinatorMessage::Ack(a) => actions.extend(state.on_ack(a)),
                                    CoordinatorMessage::Cancel(x) => actions.extend(state.on_cancel(x)),
                                    CoordinatorMessage::Sync(n) => actions.extend(state.on_sync(n)),
                                    _ => {}
                                }
                            }
                        }
                        Err(_) => {}
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    // Lost: the coordinator (and its broker) went away. The
                    // real agent's backoff: 100 ms doubling to 5 s, jittered.
                    session = None;
                    let jitter = (index as u64).wrapping_mul(7919).wrapping_add(started.elapsed().as_nanos() as u64) % 400;
                    tokio::time::sleep(Duration::from_millis(100 + jitter)).await;
                    continue;
                }
            }
        }
        for action in actions {
            match action {
                Action::Hello(info) => {
                    let Some(status) = coordinator.as_ref() else { continue };
                    hello_seq += 1;
                    let (signed, half) =
                        auth::hello(&identity, *info, status.instance, hello_seq, will_hash, enrol.clone())
                            .expect("hello");
                    pending = Some(half);
                    session = None;
                    let payload = encode(&auth::UpFrame::Hello(signed)).expect("enc");
                    let _ = c.try_publish(topics.agent(&name, AgentTopic::Hello), QoS::AtLeastOnce, false, payload);
                }
                Action::Publish(msg) => {
                    let Some(s) = session.as_mut() else { continue };
                    let (kind, payload) = s.seal_agent(&msg).expect("seal");
                    let retain = kind == AgentTopic::Status;
                    let _ = c.try_publish(topics.agent(&name, kind), QoS::AtLeastOnce, retain, payload);
                }
                Action::Start(start) => {
                    let first_after_restart = restart_at.lock().expect("lock").is_some_and(|r| Instant::now() > r);
                    if first_after_restart {
                        restarted.lock().expect("lock")[index].get_or_insert_with(Instant::now);
                    }
                    let done = done_tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(duration).await;
                        let _ = done.send(start.trial);
                    });
                }
                _ => {}
            }
        }
    }
}

fn count(store: &std::path::Path, sql: &str) -> i64 {
    let db = rusqlite::Connection::open_with_flags(store, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("store");
    db.busy_timeout(Duration::from_secs(5)).expect("busy timeout");
    db.query_row(sql, [], |r| r.get(0)).unwrap_or(0)
}

fn percentile_s(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// `RESTART_AGENTS` (5,000 by default) agents, trials of `RESTART_TRIAL_MS`
/// (2,000), 6 trials per agent; the coordinator is killed once a third
/// of the results are stored, and started again at once.
pub async fn bench_restart() {
    let agents: usize = std::env::var("RESTART_AGENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(5_000);
    let trial_ms: u64 = std::env::var("RESTART_TRIAL_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(2_000);
    let trials = agents as u64 * 6;
    println!("\n### A fleet reconnecting after the coordinator is killed and restarted (embedded broker)\n");
    println!("| agents | trials of (ms) | trials | results stored, distinct trials | failed attempts | attempts given again | restart: coordinator up (s) | 95 % of agents working again (s) | all (s) | agent reconnects |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("restart");
    let study = noop_study(dir.path(), trials);
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let topics = Topics::new(&root).expect("root");
    let restart_at = Arc::new(Mutex::new(None));
    let restarted: Restarted = Arc::new(Mutex::new(vec![None; agents]));
    let reconnects = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let duration = Duration::from_millis(trial_ms);
    let handles: Vec<_> = (0..agents)
        .map(|i| {
            tokio::spawn(proto_agent(
                i,
                port,
                topics.clone(),
                duration,
                restart_at.clone(),
                restarted.clone(),
                reconnects.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();
    let results = |sql: &str| count(&store, sql);
    let deadline = Instant::now() + Duration::from_secs(600);
    while results("SELECT COUNT(*) FROM results") < trials as i64 / 3 {
        assert!(Instant::now() < deadline, "a third of the trials never finished");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    coord.signal("KILL");
    coord.wait_exit(Duration::from_secs(10));
    let killed = Instant::now();
    *restart_at.lock().expect("lock") = Some(killed);
    let listen = format!("127.0.0.1:{port}");
    let (mut coord, _) = start_coordinator(&study, &store, &root, &["--listen", &listen]);
    let up_s = killed.elapsed().as_secs_f64();
    let status = tokio::task::spawn_blocking(move || coord.wait_exit(Duration::from_secs(1800))).await.expect("join");
    assert!(status.success(), "the restarted coordinator failed");
    let _ = stop.send(true);
    for h in handles {
        let _ = h.await;
    }
    let mut back: Vec<f64> = restarted
        .lock()
        .expect("lock")
        .iter()
        .map(|t| t.map_or(f64::INFINITY, |t| t.duration_since(killed).as_secs_f64()))
        .collect();
    back.sort_by(f64::total_cmp);
    let stored = results("SELECT COUNT(*) FROM results");
    let distinct = results("SELECT COUNT(DISTINCT trial) FROM results");
    let failed = results("SELECT COUNT(*) FROM results WHERE success = 0");
    let again = results("SELECT COUNT(*) FROM attempts") - stored;
    println!(
        "| {agents} | {trial_ms} | {trials} | {stored}, {distinct} | {failed} | {again} | {up_s:.1} | {:.1} | {:.1} | {} |",
        percentile_s(&back, 0.95),
        back.last().copied().unwrap_or(f64::NAN),
        reconnects.load(std::sync::atomic::Ordering::Relaxed),
    );
    assert_eq!((stored, distinct), (trials as i64, trials as i64), "every trial done exactly once");
    assert_eq!(failed, 0, "none failed");
}
