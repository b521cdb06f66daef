//! The agent against a real broker (the coordinator's embedded rumqttd, in
//! process) and a fake coordinator written with rumqttc: announce, assign,
//! progress, result, ack, refusal, coordinator restart, cancel on shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::collections::VecDeque;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::{mpsc, oneshot};
use tunefleet_agent::AgentConfig;
use tunefleet_broker::{self as broker, BrokerSettings};
use tunefleet_common::auth::{self, DownFrame, Hello, Identity, Sealed, Session, UpFrame};
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::message::{
    AckOutcome, AgentMessage, Assignment, CoordinatorMessage, CoordinatorStatus, ResultAck, SystemParams, TrialRef,
    TrialSpec,
};
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_common::{decode, encode, BrokerUrl};

/// Starts rumqttd (the coordinator's embedded broker, in this process) on a
/// port the OS chose for its listener; returns once it accepts.
async fn start_broker() -> SocketAddr {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let settings = BrokerSettings { listen: any, ..BrokerSettings::default() };
    tokio::task::spawn_blocking(move || broker::start(&settings))
        .await
        .expect("broker start task")
        .expect("broker listening")
        .addr
}

/// A fake coordinator: speaks the coordinator's side of the authenticated
/// protocol (its own key, signed status, Welcome, sealed messages) with
/// rumqttc, and sees every frame the agent sends.
struct Coordinator {
    client: AsyncClient,
    topics: Topics,
    identity: Identity,
    rx: mpsc::UnboundedReceiver<(AgentTopic, UpFrame)>,
    session: Option<Session>,
    hellos: VecDeque<(Hello, auth::Digest)>,
    /// Sealed frames of an earlier session (sent before the agent saw the new Welcome).
    stale: u32,
    /// The rest of a bundle already opened.
    queued: VecDeque<AgentMessage>,
}

impl Coordinator {
    async fn connect(addr: SocketAddr, topics: Topics) -> Self {
        let opts = MqttOptions::new(format!("tf-coord-{}", topics.root().replace('/', "-")), "127.0.0.1", addr.port());
        let mut opts = opts;
        opts.set_max_packet_size(2 << 20, 2 << 20);
        let (client, mut eventloop) = AsyncClient::new(opts, 100);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = oneshot::channel();
        let sub_client = client.clone();
        let filter = topics.from_agents();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        sub_client.subscribe(filter.clone(), QoS::AtLeastOnce).await.expect("subscribe");
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let frame: UpFrame = decode(&p.payload).expect("agent payload decodes");
                        let kind = p.topic.rsplit('/').next().unwrap_or_default();
                        let kind = AgentTopic::ALL.into_iter().find(|k| k.as_str() == kind).expect("known topic");
                        if tx.send((kind, frame)).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx).await.expect("coordinator subscribed").expect("ready");
        let identity = Identity::generate().expect("key").0;
        Coordinator {
            client,
            topics,
            identity,
            rx,
            session: None,
            hellos: VecDeque::new(),
            stale: 0,
            queued: VecDeque::new(),
        }
    }

    /// Takes the next message: of a bundle already opened, or of the next
    /// frame; Hellos are queued, sealed frames opened (bundles taken apart).
    async fn next(&mut self) -> Option<AgentMessage> {
        if let Some(msg) = self.queued.pop_front() {
            return Some(msg);
        }
        let msg = self.next_frame().await?;
        self.queued.extend(msg.unbundle().expect("a well-formed bundle"));
        self.queued.pop_front()
    }

    async fn next_frame(&mut self) -> Option<AgentMessage> {
        let (kind, frame) = self.rx.recv().await.expect("coordinator channel open");
        match frame {
            UpFrame::Hello(signed) => {
                let (hello, digest) = auth::open_hello(&signed).expect("a Hello signed with the key it carries");
                self.hellos.push_back((hello, digest));
                None
            }
            UpFrame::Will(_) => None,
            UpFrame::Sealed(sealed) => match self.session.as_mut().map(|s| s.open_agent(kind, &sealed)) {
                Some(Ok(msg)) => Some(msg),
                Some(Err(auth::AuthError::Token { .. })) | None => {
                    self.stale += 1;
                    None
                }
                Some(Err(e)) => panic!("a sealed frame of this session fails: {e}"),
            },
        }
    }

    /// The next agent message matching `pred`, skipping others.
    async fn expect(&mut self, what: &str, pred: impl Fn(&AgentMessage) -> bool) -> AgentMessage {
        let wait = async {
            loop {
                if let Some(msg) = self.next().await {
                    if pred(&msg) {
                        return msg;
                    }
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    /// The next Hello, answered with a Welcome: a new session.
    async fn welcome_next_hello(&mut self, token: u64) -> Hello {
        let wait = async {
            while self.hellos.is_empty() {
                self.next().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(15), wait).await.expect("a Hello in time");
        let (hello, digest) = self.hellos.pop_front().expect("a Hello");
        let (signed, session) = auth::welcome(&self.identity, "a1", &hello, digest, token).expect("welcome");
        self.session = Some(session);
        self.hellos.clear();
        self.publish(AgentTopic::Welcome, encode(&DownFrame::Welcome(signed)).expect("encode")).await;
        hello
    }

    async fn publish(&self, kind: AgentTopic, payload: Vec<u8>) {
        let topic = self.topics.agent("a1", kind);
        self.client.publish(topic, QoS::AtLeastOnce, false, payload).await.expect("publish");
    }

    async fn send(&mut self, msg: CoordinatorMessage) {
        let (kind, payload) = self.session.as_mut().expect("a session").seal_coordinator(&msg).expect("seal");
        self.publish(kind, payload).await;
    }

    /// Publishes the signed status, retained as the real coordinator does.
    async fn status(&self, online: bool, instance: u64, started_unix_ms: u64) {
        let status = CoordinatorStatus { online, instance, started_unix_ms, key: self.identity.public() };
        let payload = encode(&auth::sign_status(&self.identity, &status).expect("sign")).expect("encode");
        self.client.publish(self.topics.coordinator_status(), QoS::AtLeastOnce, true, payload).await.expect("publish");
    }
}

fn trial(n: u64) -> TrialRef {
    TrialRef { study: "mqtt-test".into(), study_id: 7, trial: n, attempt: 0 }
}

fn assign(n: u64, script: &str) -> CoordinatorMessage {
    CoordinatorMessage::Assign(Assignment {
        trial: trial(n),
        request_seq: 1,
        spec: TrialSpec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: vec![],
            system: SystemParams::default(),
            timeout_ms: 60_000,
            probe: None,
            gpus: 0,
        },
    })
}

fn ack(n: u64, outcome: AckOutcome) -> CoordinatorMessage {
    CoordinatorMessage::Ack(ResultAck { trial: trial(n), outcome })
}

fn is_result_of(n: u64) -> impl Fn(&AgentMessage) -> bool {
    move |m| matches!(m, AgentMessage::Result(r) if r.trial == trial(n))
}

#[tokio::test]
async fn agent_runs_an_assigned_trial_and_follows_the_protocol() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TUNEFLEET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("tunefleet_agent=debug"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    let addr = start_broker().await;
    let topics = Topics::new("agent-mqtt-test").expect("root");
    let mut coord = Coordinator::connect(addr, topics.clone()).await;
    coord.status(true, 1, 100).await;
    let state = tempfile::tempdir().expect("state dir");
    let marker = state.path().join("forged-assignment-ran");

    let broker: BrokerUrl = format!("mqtt://127.0.0.1:{}", addr.port()).parse().expect("url");
    let mut config = AgentConfig::new(broker, "a1".into(), topics.clone());
    config.wrapper = Some(PathBuf::from(env!("CARGO_BIN_EXE_tunefleet-agent")));
    config.grace = Duration::from_secs(5);
    config.state_dir = Some(state.path().to_path_buf());
    config.join = Some(auth::JoinToken::generate(&coord.identity.public()).expect("a join token"));
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let agent = tokio::spawn(tunefleet_agent::run(config, async {
        let _ = stop_rx.await;
    }));

    // The retained coordinator status brings a signed Hello; once welcomed:
    // the online status and a request, sealed in the session.
    let info = coord.welcome_next_hello(500).await.info;
    // The automatic lookahead announces four places per slot (it holds one
    // but for trials shorter than two round trips).
    assert_eq!((info.agent.as_str(), info.slots, info.lookahead), ("a1", 1, tunefleet_agent::AUTO_LOOKAHEAD_PER_SLOT));
    assert_eq!(tunefleet_agent::AUTO_LOOKAHEAD_PER_SLOT, 4);
    let status = coord.expect("online status", |m| matches!(m, AgentMessage::Status(s) if s.online)).await;
    assert!(matches!(status, AgentMessage::Status(s) if s.instance == info.instance));
    coord.expect("request", |m| matches!(m, AgentMessage::Request(r) if r.free == 1)).await;
    let pinned = std::fs::read_to_string(state.path().join("coordinator.pub")).expect("coordinator key pinned");
    assert_eq!(pinned.trim(), auth::hex(&coord.identity.public()));

    // A forged assignment (another client, no session key) and one in the old
    // unauthenticated format: neither runs.
    let cmd = format!("touch {}", marker.display());
    let forged = Sealed { token: 500, seq: 1_000, body: encode(&assign(90, &cmd)).expect("enc") };
    coord.publish(AgentTopic::Assign, encode(&DownFrame::Sealed(forged)).expect("enc")).await;
    coord.publish(AgentTopic::Assign, encode(&assign(91, &cmd)).expect("enc")).await;

    // One trial: progress, then the result, then a new request.
    coord.send(assign(1, "echo 'TUNEFLEET epoch=1 loss=0.5'; echo 'TUNEFLEET final loss=0.25'")).await;
    coord.expect("progress", |m| matches!(m, AgentMessage::Progress(p) if p.epoch == 1)).await;
    let result = coord.expect("result 1", is_result_of(1)).await;
    let AgentMessage::Result(result) = result else { unreachable!() };
    assert_eq!(result.measurement.exit, ExitOutcome::Exited(0));
    assert_eq!(result.measurement.final_metrics.get("loss"), Some(&0.25));
    coord.expect("request after result", |m| matches!(m, AgentMessage::Request(r) if r.free == 1)).await;
    assert!(!marker.exists(), "a forged assignment ran");

    // Not acked: a coordinator restart makes the agent publish it again, in the new session.
    coord.status(true, 77, 200).await;
    coord.welcome_next_hello(501).await;
    coord.expect("result 1 again", is_result_of(1)).await;

    // Acked: after another restart only trial 2's result arrives, not 1's.
    coord.send(ack(1, AckOutcome::Stored)).await;
    coord.status(true, 78, 300).await;
    coord.welcome_next_hello(502).await;
    coord.send(assign(2, "true")).await;
    let next = coord.expect("next result", |m| matches!(m, AgentMessage::Result(_))).await;
    assert!(is_result_of(2)(&next), "trial 1 was acked and must not come back: {next:?}");

    // Refused: the agent keeps it aside (parked), does not send it again.
    coord.send(ack(2, AckOutcome::Refused("not a study of this coordinator".into()))).await;
    coord.send(CoordinatorMessage::Sync(9)).await;
    coord.expect("synced", |m| matches!(m, AgentMessage::Synced(9))).await;
    let parked = std::fs::read_dir(state.path().join("parked")).expect("parked dir").count();
    assert_eq!(parked, 2, "the parked result and its reason");

    // Busy: the next four assignments are held ahead (the four places per
    // slot an automatic lookahead announces), a sixth refused.
    coord.send(assign(3, "sleep 30")).await;
    // Assignments on one topic arrive in order: 3 starts before 4 is seen.
    for held in 4..=8 {
        coord.send(assign(held, "true")).await;
    }
    let refusal = coord.expect("refusal", |m| matches!(m, AgentMessage::Refuse(_))).await;
    let AgentMessage::Refuse(refusal) = refusal else { unreachable!() };
    assert_eq!(refusal.trial, trial(8), "4 to 7 are held, 8 has no room");

    // Shutdown: the held trials 4 to 7 are given back, never started;
    // trial 3 is cancelled and reported, then the agent goes offline.
    let _ = stop_tx.send(());
    for held in 4..=7 {
        let given_back = coord.expect("held trial given back", |m| matches!(m, AgentMessage::Refuse(_))).await;
        assert!(matches!(&given_back, AgentMessage::Refuse(r) if r.trial == trial(held)), "{given_back:?}");
    }
    let cancelled = coord.expect("cancelled result", is_result_of(3)).await;
    let AgentMessage::Result(cancelled) = cancelled else { unreachable!() };
    assert_eq!(cancelled.measurement.exit, ExitOutcome::Cancelled);
    coord.send(ack(3, AckOutcome::Stored)).await;
    coord.expect("offline status", |m| matches!(m, AgentMessage::Status(s) if !s.online)).await;
    let outcome = tokio::time::timeout(Duration::from_secs(10), agent).await.expect("agent stops in time");
    outcome.expect("agent task").expect("agent ran without error");
    assert!(!marker.exists(), "a forged assignment ran");
    let spooled = tunefleet_agent::pending::SpoolView::open(state.path()).load();
    assert!(spooled.is_empty(), "spool empty: {} result(s) left", spooled.len());
}
