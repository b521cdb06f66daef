//! The agent against a real broker (rumqttd, in process) and a fake
//! coordinator written with rumqttc: announce, assign, progress, result,
//! ack, refusal, coordinator restart, cancel on shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::{mpsc, oneshot};
use tunefleet_agent::AgentConfig;
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::message::{
    AgentMessage, Assignment, CoordinatorMessage, CoordinatorStatus, ResultAck, SystemParams, TrialRef, TrialSpec,
    Welcome,
};
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_common::{decode, encode, BrokerUrl};

/// Starts rumqttd on a port the OS picked, and waits until it accepts.
async fn start_broker() -> SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = probe.local_addr().expect("addr");
    drop(probe);
    let connections = rumqttd::ConnectionSettings {
        connection_timeout_ms: 10_000,
        max_payload_size: tunefleet_common::MAX_MESSAGE_BYTES + 64 * 1024,
        max_inflight_count: 500,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    let server = rumqttd::ServerSettings {
        name: "test".into(),
        listen: addr,
        tls: None,
        next_connection_delay_ms: 0,
        connections,
    };
    let config = rumqttd::Config {
        id: 0,
        router: rumqttd::RouterConfig {
            max_connections: 100,
            max_outgoing_packet_count: 1000,
            max_segment_size: 16 * 1024 * 1024,
            max_segment_count: 4,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some(HashMap::from([("1".to_string(), server)])),
        ..Default::default()
    };
    std::thread::spawn(move || {
        let _ = rumqttd::Broker::new(config).start();
    });
    tokio::time::timeout(Duration::from_secs(10), async {
        while std::net::TcpStream::connect(addr).is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("broker listening");
    addr
}

/// A fake coordinator: sees every agent message, publishes coordinator ones.
struct Coordinator {
    client: AsyncClient,
    topics: Topics,
    rx: mpsc::UnboundedReceiver<(String, AgentMessage, bool)>,
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
        let filters = [topics.from_agents()];
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        for filter in &filters {
                            sub_client.subscribe(filter.clone(), QoS::AtLeastOnce).await.expect("subscribe");
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(ack))) if usize::from(ack.pkid) == filters.len() => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let msg: AgentMessage = decode(&p.payload).expect("agent payload decodes");
                        let kind = p.topic.rsplit('/').next().unwrap_or_default().to_string();
                        assert_eq!(kind, AgentTopic::of_agent_message(&msg).as_str(), "message on its own topic");
                        if tx.send((p.topic.clone(), msg, p.retain)).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx).await.expect("coordinator subscribed").expect("ready");
        Coordinator { client, topics, rx }
    }

    /// The next agent message matching `pred`, skipping others.
    async fn expect(&mut self, what: &str, pred: impl Fn(&AgentMessage) -> bool) -> AgentMessage {
        let wait = async {
            loop {
                let (_, msg, _) = self.rx.recv().await.expect("coordinator channel open");
                if pred(&msg) {
                    return msg;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(15), wait)
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
    }

    async fn send(&self, agent: &str, msg: CoordinatorMessage) {
        let topic = self.topics.agent(agent, AgentTopic::of_coordinator_message(&msg));
        self.client.publish(topic, QoS::AtLeastOnce, false, encode(&msg).expect("encode")).await.expect("publish");
    }

    async fn status(&self, online: bool, instance: u64) {
        let payload = encode(&CoordinatorStatus { online, instance }).expect("encode");
        self.client.publish(self.topics.coordinator_status(), QoS::AtLeastOnce, false, payload).await.expect("publish");
    }
}

fn trial(n: u64) -> TrialRef {
    TrialRef { study: "mqtt-test".into(), trial: n, attempt: 0 }
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
        },
    })
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

    let broker: BrokerUrl = format!("mqtt://127.0.0.1:{}", addr.port()).parse().expect("url");
    let mut config = AgentConfig::new(broker, "a1".into(), topics.clone());
    config.wrapper = Some(PathBuf::from(env!("CARGO_BIN_EXE_tunefleet-agent")));
    config.grace = Duration::from_secs(5);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let agent = tokio::spawn(tunefleet_agent::run(config, async {
        let _ = stop_rx.await;
    }));

    // Announce on connect: online status (retained), hello; a request only once welcomed.
    let status = coord.expect("online status", |m| matches!(m, AgentMessage::Status(s) if s.online)).await;
    let AgentMessage::Status(status) = status else { unreachable!() };
    let hello = coord.expect("hello", |m| matches!(m, AgentMessage::Hello(_))).await;
    let AgentMessage::Hello(info) = hello else { unreachable!() };
    assert_eq!((info.agent.as_str(), info.instance, info.slots), ("a1", status.instance, 1));
    let instance = info.instance;
    let welcome = |token| CoordinatorMessage::Welcome(Welcome { instance, token });
    coord.send("a1", welcome(500)).await;
    coord.expect("request", |m| matches!(m, AgentMessage::Request(r) if r.free == 1 && r.token == 500)).await;

    // One trial: progress, then the result, then a new request.
    coord.send("a1", assign(1, "echo 'TUNEFLEET epoch=1 loss=0.5'; echo 'TUNEFLEET final loss=0.25'")).await;
    coord.expect("progress", |m| matches!(m, AgentMessage::Progress(p) if p.epoch == 1 && p.token == 500)).await;
    let result = coord.expect("result 1", is_result_of(1)).await;
    let AgentMessage::Result(result) = result else { unreachable!() };
    assert_eq!(result.measurement.exit, ExitOutcome::Exited(0));
    assert_eq!(result.measurement.final_metrics.get("loss"), Some(&0.25));
    coord.expect("request after result", |m| matches!(m, AgentMessage::Request(r) if r.free == 1)).await;

    // Not acked: a coordinator restart makes the agent publish it again.
    coord.status(true, 77).await;
    coord.expect("hello again", |m| matches!(m, AgentMessage::Hello(_))).await;
    coord.send("a1", welcome(501)).await;
    let again = coord.expect("result 1 again", is_result_of(1)).await;
    assert!(matches!(again, AgentMessage::Result(r) if r.token == 501), "stamped with the new session's token");

    // Acked: after another restart only trial 2's result arrives, not 1's.
    coord.send("a1", CoordinatorMessage::Ack(ResultAck { trial: trial(1) })).await;
    coord.status(true, 78).await;
    coord.expect("hello after ack", |m| matches!(m, AgentMessage::Hello(_))).await;
    coord.send("a1", welcome(502)).await;
    coord.send("a1", assign(2, "true")).await;
    let next = coord.expect("next result", |m| matches!(m, AgentMessage::Result(_))).await;
    assert!(is_result_of(2)(&next), "trial 1 was acked and must not come back: {next:?}");
    coord.send("a1", CoordinatorMessage::Ack(ResultAck { trial: trial(2) })).await;

    // Busy: a second assignment is refused.
    coord.send("a1", assign(3, "sleep 30")).await;
    // Assignments on one topic arrive in order: 3 starts before 4 is seen.
    coord.send("a1", assign(4, "true")).await;
    let refusal = coord.expect("refusal", |m| matches!(m, AgentMessage::Refuse(_))).await;
    let AgentMessage::Refuse(refusal) = refusal else { unreachable!() };
    assert_eq!(refusal.trial, trial(4));

    // Shutdown: trial 3 is cancelled and reported, then the agent goes offline.
    let _ = stop_tx.send(());
    let cancelled = coord.expect("cancelled result", is_result_of(3)).await;
    let AgentMessage::Result(cancelled) = cancelled else { unreachable!() };
    assert_eq!(cancelled.measurement.exit, ExitOutcome::Cancelled);
    coord.send("a1", CoordinatorMessage::Ack(ResultAck { trial: trial(3) })).await;
    coord.expect("offline status", |m| matches!(m, AgentMessage::Status(s) if !s.online)).await;
    let outcome = tokio::time::timeout(Duration::from_secs(10), agent).await.expect("agent stops in time");
    outcome.expect("agent task").expect("agent ran without error");
}
