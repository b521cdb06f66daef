//! MQTT transport, the only module that knows rumqttc. It owns the event
//! loop (polled on its own task, reconnecting with backoff forever), turns
//! incoming publishes into typed [`Inbound`] events and publishes typed
//! [`AgentMessage`]s on their topics with QoS 1.
//!
//! On every ConnAck it subscribes to the agent's `down/{id}/+` filter (one
//! filter, so the broker keeps the coordinator's messages in order) and to
//! the coordinator status, then reports [`Inbound::Connected`]
//! so the agent announces itself (subscriptions are queued first, so they
//! reach the broker before the announce).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, NetworkOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tunefleet_common::message::{AgentMessage, CoordinatorMessage, CoordinatorStatus};
use tunefleet_common::topic::{AgentTopic, Topic, Topics};
use tunefleet_common::{decode, encode, BrokerUrl, CodecError, MAX_MESSAGE_BYTES};

/// Requests the client may queue while the connection is down.
const REQUEST_CAPACITY: usize = 1024;
/// Messages in flight (published, not yet acknowledged by the broker).
const INFLIGHT: u16 = 100;
/// First reconnect delay.
pub const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest reconnect delay.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What the broker delivered, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// A ConnAck: subscriptions are requested, announce now.
    Connected,
    Coordinator(CoordinatorMessage),
    /// `retained` is set when the broker delivered it on subscription.
    CoordinatorStatus {
        status: CoordinatorStatus,
        retained: bool,
    },
    /// A payload that does not decode, or arrived on the wrong topic.
    Undecodable {
        topic: String,
        error: String,
    },
}

/// Transport failures.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot encode a {kind} message: {source}")]
    Encode { kind: &'static str, source: CodecError },
    #[error("the MQTT request queue is full or closed; {kind} message dropped")]
    Queue { kind: &'static str },
    #[error(transparent)]
    Security(tunefleet_common::security::SecurityError),
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub broker: BrokerUrl,
    pub agent: String,
    pub keepalive: Duration,
    pub topics: Topics,
    /// Published by the broker (retained) if the connection is lost.
    pub will: AgentMessage,
    /// Login and TLS.
    pub security: tunefleet_common::security::ClientSecurity,
}

/// A running MQTT connection.
#[derive(Debug)]
pub struct Transport {
    client: AsyncClient,
    topics: Topics,
    agent: String,
    task: JoinHandle<()>,
    stop: CancellationToken,
    connected: Arc<AtomicBool>,
}

/// The reconnect delay after `failures` consecutive failures (1 or more):
/// 100 ms doubling up to 5 s, then scaled by `jitter` (0..1) into the upper
/// half of that value so agents that lost the broker together spread out.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let base = BACKOFF_START.saturating_mul(1u32 << exp).min(BACKOFF_MAX);
    base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

fn kind_name(msg: &AgentMessage) -> &'static str {
    AgentTopic::of_agent_message(msg).as_str()
}

impl Transport {
    /// Starts connecting; returns at once. Events arrive on the receiver.
    pub fn start(config: TransportConfig) -> Result<(Transport, mpsc::Receiver<Inbound>), TransportError> {
        let TransportConfig { broker, agent, keepalive, topics, will, security } = config;
        let will_payload = encode(&will).map_err(|source| TransportError::Encode { kind: kind_name(&will), source })?;
        let mut opts = MqttOptions::new(format!("tf-agent-{agent}"), broker.host.clone(), broker.port);
        opts.set_keep_alive(keepalive)
            .set_clean_session(true)
            .set_max_packet_size(MAX_MESSAGE_BYTES + 64 * 1024, MAX_MESSAGE_BYTES + 64 * 1024)
            .set_inflight(INFLIGHT)
            .set_last_will(LastWill::new(
                topics.agent(&agent, AgentTopic::Status),
                will_payload,
                QoS::AtLeastOnce,
                true,
            ));
        if let Some((user, pass)) = &security.credentials {
            opts.set_credentials(user.clone(), pass.clone());
        }
        if let Some(files) = &security.tls {
            let tls = tunefleet_common::security::client_config(files).map_err(TransportError::Security)?;
            opts.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(tls)));
        }
        let (client, mut eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
        let mut net = NetworkOptions::new();
        // Without TCP_NODELAY, Nagle's algorithm delays small request/reply exchanges by ~40 ms.
        net.set_tcp_nodelay(true);
        net.set_connection_timeout(5);
        eventloop.set_network_options(net);
        let (tx, rx) = mpsc::channel(256);
        let stop = CancellationToken::new();
        let connected = Arc::new(AtomicBool::new(false));
        let poller = Poller {
            client: client.clone(),
            topics: topics.clone(),
            agent: agent.clone(),
            tx,
            connected: Arc::clone(&connected),
        };
        let task = tokio::spawn(poller.run(eventloop, stop.clone()));
        Ok((Transport { client, topics, agent, task, stop, connected }, rx))
    }

    /// Publishes `msg` on its topic, QoS 1; the agent status is retained.
    /// Never waits: when the queue is full (broker gone for long) the message
    /// is dropped; everything that matters is published again on reconnect.
    pub fn publish(&self, msg: &AgentMessage) -> Result<(), TransportError> {
        let kind = AgentTopic::of_agent_message(msg);
        let payload = encode(msg).map_err(|source| TransportError::Encode { kind: kind.as_str(), source })?;
        let retain = kind == AgentTopic::Status;
        self.client
            .try_publish(self.topics.agent(&self.agent, kind), QoS::AtLeastOnce, retain, payload)
            .map_err(|_| TransportError::Queue { kind: kind.as_str() })
    }

    /// True between a ConnAck and the next connection error.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Sends DISCONNECT after everything queued, and waits (at most `within`)
    /// for it to be written; then stops the event loop.
    /// Without a connection there is nothing to flush: it stops at once.
    pub async fn disconnect(self, within: Duration) {
        if !self.connected.load(Ordering::Relaxed) {
            tracing::info!("not connected to the broker; nothing to flush");
            self.stop.cancel();
            let _ = self.task.await;
            return;
        }
        if self.client.try_disconnect().is_err() {
            tracing::debug!("disconnect request could not be queued");
        }
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            tracing::warn!("broker did not take the disconnect in time");
            self.stop.cancel();
            let _ = task.await;
        }
    }
}

struct Poller {
    client: AsyncClient,
    topics: Topics,
    agent: String,
    tx: mpsc::Sender<Inbound>,
    connected: Arc<AtomicBool>,
}

impl Poller {
    async fn run(self, mut eventloop: EventLoop, stop: CancellationToken) {
        let mut failures: u32 = 0;
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = eventloop.poll() => event,
            };
            tracing::trace!(?event, "mqtt event");
            match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    failures = 0;
                    self.connected.store(true, Ordering::Relaxed);
                    tracing::info!(agent = %self.agent, "connected to the broker");
                    self.subscribe();
                    if self.tx.send(Inbound::Connected).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let inbound = self.classify(&p.topic, &p.payload, p.retain);
                    if self.tx.send(inbound).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Outgoing(Outgoing::Disconnect)) => return,
                Ok(_) => {}
                Err(e) => {
                    failures = failures.saturating_add(1);
                    self.connected.store(false, Ordering::Relaxed);
                    let delay = backoff_delay(failures, rand::random::<f64>());
                    tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "broker connection failed");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    fn subscribe(&self) {
        // One filter for everything sent to this agent keeps it in order.
        for filter in [self.topics.to_agent(&self.agent), self.topics.coordinator_status()] {
            if let Err(e) = self.client.try_subscribe(filter.clone(), QoS::AtLeastOnce) {
                tracing::error!(%filter, error = %e, "cannot queue a subscription");
            }
        }
    }

    fn classify(&self, topic: &str, payload: &[u8], retained: bool) -> Inbound {
        let bad = |error: String| Inbound::Undecodable { topic: topic.to_string(), error };
        match self.topics.parse(topic) {
            Ok(Topic::CoordinatorStatus) => match decode::<CoordinatorStatus>(payload) {
                Ok(status) => Inbound::CoordinatorStatus { status, retained },
                Err(e) => bad(e.to_string()),
            },
            Ok(Topic::Agent { agent, kind }) if agent == self.agent && AgentTopic::TO_AGENT.contains(&kind) => {
                match decode::<CoordinatorMessage>(payload) {
                    Ok(msg) if AgentTopic::of_coordinator_message(&msg) == kind => Inbound::Coordinator(msg),
                    Ok(msg) => bad(format!(
                        "a {} message on the {} topic",
                        AgentTopic::of_coordinator_message(&msg).as_str(),
                        kind.as_str()
                    )),
                    Err(e) => bad(e.to_string()),
                }
            }
            Ok(_) => bad("not a topic this agent subscribed to".into()),
            Err(e) => bad(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_cap_with_jitter() {
        assert_eq!(backoff_delay(1, 1.0), Duration::from_millis(100));
        assert_eq!(backoff_delay(1, 0.0), Duration::from_millis(50));
        assert_eq!(backoff_delay(2, 1.0), Duration::from_millis(200));
        assert_eq!(backoff_delay(4, 1.0), Duration::from_millis(800));
        assert_eq!(backoff_delay(7, 1.0), BACKOFF_MAX);
        assert_eq!(backoff_delay(u32::MAX, 1.0), BACKOFF_MAX);
        for f in 1..40 {
            let d = backoff_delay(f, 0.37);
            assert!(d >= Duration::from_millis(50) && d <= BACKOFF_MAX, "{d:?}");
        }
    }
}
