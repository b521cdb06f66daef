//! MQTT transport, the only module that knows rumqttc. It owns the event
//! loop (polled on its own task, reconnecting with backoff forever), turns
//! incoming publishes into [`Delivery`] frames (authenticated by
//! [`crate::auth`]) and publishes encoded frames on their topics with QoS 1.
//!
//! Every connection gets a Last Will of its own (a fresh secret, see
//! [`crate::auth::will_payload`]); [`Delivery::Connected`] says which, so the
//! Hello can commit to it. On every ConnAck it subscribes to the agent's
//! `down/{id}/+` filter (one filter, so the broker keeps the coordinator's
//! messages in order) and to the coordinator status; the agent announces
//! itself when that (retained) status arrives.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, NetworkOptions, Outgoing, Packet, QoS};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tunefleet_common::auth::{login_password, Digest, DownFrame, Identity, Signed};
use tunefleet_common::topic::{AgentTopic, Topic, Topics};
use tunefleet_common::{decode, BrokerUrl, CodecError, MAX_MESSAGE_BYTES};

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
pub enum Delivery {
    /// A ConnAck: subscriptions are requested. `will_hash` is the hash of
    /// this connection's Last Will secret.
    Connected { will_hash: Digest },
    /// A frame on one of this agent's down topics, not yet authenticated.
    Coordinator { kind: AgentTopic, frame: DownFrame },
    /// The signed coordinator status; `retained` is set when the broker
    /// delivered it on subscription.
    CoordinatorStatus { signed: Signed, retained: bool },
    /// A payload that does not decode, or arrived on the wrong topic.
    Undecodable { topic: String, error: String },
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
    #[error("no randomness for the MQTT client id: {0}")]
    Random(tunefleet_common::auth::AuthError),
}

/// Connection settings.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub broker: BrokerUrl,
    /// Tried in turn after `broker`, each after a failed connection.
    pub more_brokers: Vec<BrokerUrl>,
    pub agent: String,
    pub keepalive: Duration,
    pub topics: Topics,
    /// The agent process; each connection's Last Will names it.
    pub instance: u64,
    /// Login and TLS.
    pub security: tunefleet_common::security::ClientSecurity,
    /// This agent's key: it logs in as its name with a proof of it (see
    /// [`Login`]); `None` logs in with `security`'s login alone.
    pub identity: Option<Arc<Identity>>,
}

/// How the next CONNECT logs in. An agent with a key proves it (Tunefleet's
/// embedded broker grants by identity) and carries its broker login, if it
/// has one, for a broker that requires one of strangers; a broker that
/// refuses that (Mosquitto with a password file) gets the plain login on
/// the next attempt, and the two alternate while refused.
#[derive(Debug)]
struct Login {
    identity: Option<Arc<Identity>>,
    plain: Option<(String, String)>,
    /// The next attempt uses the plain login.
    use_plain: bool,
    /// The last proof's time: each is later than the one before.
    last_ms: u64,
}

impl Login {
    /// The user name and password of the next attempt.
    fn next(&mut self, agent: &str) -> Option<(String, String)> {
        match (&self.identity, self.use_plain) {
            (Some(id), false) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                self.last_ms = now.max(self.last_ms + 1);
                let secret = self.plain.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
                Some((agent.to_string(), login_password(id, agent, self.last_ms, secret)))
            }
            _ => self.plain.clone(),
        }
    }

    /// A refused login: the other kind next time, when there is one.
    fn refused(&mut self) {
        if self.identity.is_some() && self.plain.is_some() {
            self.use_plain = !self.use_plain;
        }
    }
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

/// How often a broker that stays unreachable is reported again (the
/// failures between are logged at debug level, and counted).
pub const QUIET_REPORT: Duration = Duration::from_secs(60);

/// What a connection error probably means, for the operator: a timeout is
/// rarely the network alone.
pub fn connection_hint(error: &str, tls: bool) -> &'static str {
    let e = error.to_lowercase();
    if e.contains("timeout") || e.contains("timed out") {
        if tls {
            "no MQTT answer in time: is it an MQTT broker speaking TLS on that port?"
        } else {
            "no MQTT answer in time: is it an MQTT broker (not HTTP, not TLS: use mqtts:// for TLS) on that port?"
        }
    } else if e.contains("refused") {
        "nothing listens there: is the broker (or the coordinator with its embedded broker) running?"
    } else if e.contains("certificate") || e.contains("alert") || e.contains("tls") {
        "TLS: check --ca, --cert and --key against the broker's (docs/TROUBLESHOOTING.md, TLS mistakes)"
    } else if e.contains("connection closed") || e.contains("reset") {
        "the broker closed the connection: a coordinator that stopped, or a login or TLS setting it refused"
    } else {
        "see docs/TROUBLESHOOTING.md, The agent cannot reach the broker"
    }
}

/// The reconnect delay after `failures` consecutive failures (1 or more):
/// 100 ms doubling up to 5 s, then scaled by `jitter` (0..1) into the upper
/// half of that value so agents that lost the broker together spread out.
pub fn backoff_delay(failures: u32, jitter: f64) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    let base = BACKOFF_START.saturating_mul(1u32 << exp).min(BACKOFF_MAX);
    base.mul_f64(0.5 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// The MQTT options of a connection to `broker` as client `id`.
fn mqtt_options(
    broker: &BrokerUrl,
    id: &str,
    keepalive: Duration,
    security: &tunefleet_common::security::ClientSecurity,
) -> Result<MqttOptions, TransportError> {
    let mut opts = MqttOptions::new(id, broker.host.clone(), broker.port);
    opts.set_keep_alive(keepalive)
        .set_clean_session(true)
        .set_max_packet_size(MAX_MESSAGE_BYTES + 64 * 1024, MAX_MESSAGE_BYTES + 64 * 1024)
        .set_inflight(INFLIGHT);
    if let Some(files) = &security.tls {
        let tls = tunefleet_common::security::client_config(files).map_err(TransportError::Security)?;
        opts.set_transport(rumqttc::Transport::tls_with_config(rumqttc::TlsConfiguration::Rustls(tls)));
    }
    Ok(opts)
}

/// Longest client id this agent uses: MQTT 3.1.1 promises only 23 bytes,
/// and brokers that accept more (Mosquitto, rumqttd) take 64 without fuss.
pub const MAX_CLIENT_ID: usize = 64;

/// The MQTT client id of one agent process: `tf-agent-{name}-{8 hex}`, the
/// name cut so the whole fits [`MAX_CLIENT_ID`]. The random part keeps a
/// broker user who knows the name from taking over the agent's connection
/// (a second connection with a client id disconnects the first).
pub fn client_id(agent: &str, nonce: [u8; 4]) -> String {
    const FIXED: usize = "tf-agent-".len() + 1 + 8;
    // Agent names are ASCII (`validate_agent_id`); `get` keeps any other from panicking.
    let name = agent.get(..MAX_CLIENT_ID - FIXED).unwrap_or(agent);
    format!("tf-agent-{name}-{}", tunefleet_common::auth::hex(&nonce))
}

impl Transport {
    /// Starts connecting; returns at once. Events arrive on the receiver.
    pub fn start(config: TransportConfig) -> Result<(Transport, mpsc::Receiver<Delivery>), TransportError> {
        let TransportConfig { broker, more_brokers, agent, keepalive, topics, instance, security, identity } = config;
        let nonce = tunefleet_common::auth::random_bytes::<4>().map_err(TransportError::Random)?;
        let id = client_id(&agent, nonce);
        let mut opts = mqtt_options(&broker, &id, keepalive, &security)?;
        let mut login = Login { identity, plain: security.credentials.clone(), use_plain: false, last_ms: 0 };
        if let Some((user, pass)) = login.next(&agent) {
            opts.set_credentials(user, pass);
        }
        let (client, mut eventloop) = AsyncClient::new(opts, REQUEST_CAPACITY);
        // Each broker's options made now: a bad TLS file is refused at the start.
        let mut brokers = Vec::with_capacity(1 + more_brokers.len());
        for b in std::iter::once(broker.clone()).chain(more_brokers) {
            let options = mqtt_options(&b, &id, keepalive, &security)?;
            brokers.push((b, options));
        }
        let mut net = NetworkOptions::new();
        // Without TCP_NODELAY, Nagle's algorithm delays small request/reply exchanges by ~40 ms.
        net.set_tcp_nodelay(true);
        net.set_connection_timeout(5);
        eventloop.set_network_options(net);
        let (tx, rx) = mpsc::channel(256);
        let stop = CancellationToken::new();
        let connected = Arc::new(AtomicBool::new(false));
        let poller = Poller {
            broker: broker.clone(),
            brokers,
            at: 0,
            client: client.clone(),
            topics: topics.clone(),
            agent: agent.clone(),
            instance,
            tx,
            connected: Arc::clone(&connected),
            login,
        };
        let task = tokio::spawn(poller.run(eventloop, stop.clone()));
        Ok((Transport { client, topics, agent, task, stop, connected }, rx))
    }

    /// Publishes an encoded frame on this agent's `kind` topic, QoS 1; the
    /// agent status is retained. Never waits: when the queue is full (broker
    /// gone for long) the frame is dropped; everything that matters is
    /// published again in the next session.
    pub fn publish(&self, kind: AgentTopic, payload: Vec<u8>) -> Result<(), TransportError> {
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
    /// Where it connects, for messages.
    broker: BrokerUrl,
    /// Every broker it may connect to, with its options, and which one
    /// it tries now: after a failed connection, the next in turn.
    brokers: Vec<(BrokerUrl, MqttOptions)>,
    at: usize,
    client: AsyncClient,
    topics: Topics,
    agent: String,
    instance: u64,
    tx: mpsc::Sender<Delivery>,
    connected: Arc<AtomicBool>,
    login: Login,
}

impl Poller {
    /// With several brokers, the next connection goes to the next one in
    /// turn (its Last Will and login are set after).
    fn next_broker(&mut self, eventloop: &mut EventLoop) {
        if self.brokers.len() < 2 {
            return;
        }
        self.at = (self.at + 1) % self.brokers.len();
        let (broker, options) = &self.brokers[self.at];
        tracing::debug!(%broker, "trying the next broker");
        self.broker = broker.clone();
        eventloop.mqtt_options = options.clone();
    }

    /// Gives the next connection a Last Will of its own; returns its hash.
    fn new_will(&self, eventloop: &mut EventLoop) -> Digest {
        match crate::auth::will_payload(self.instance) {
            Ok((payload, hash)) => {
                let topic = self.topics.agent(&self.agent, AgentTopic::Status);
                eventloop.mqtt_options.set_last_will(LastWill::new(topic, payload, QoS::AtLeastOnce, true));
                hash
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot make a Last Will: this connection has none");
                [0; 32]
            }
        }
    }

    async fn run(mut self, mut eventloop: EventLoop, stop: CancellationToken) {
        let mut failures: u32 = 0;
        // When a failure was last reported at warn level (the first of a run
        // of failures, then one per QUIET_REPORT).
        let mut reported: Option<std::time::Instant> = None;
        let mut will_hash = self.new_will(&mut eventloop);
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = eventloop.poll() => event,
            };
            tracing::trace!(?event, "mqtt event");
            match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    failures = 0;
                    reported = None;
                    self.connected.store(true, Ordering::Relaxed);
                    tracing::info!(agent = %self.agent, "connected to the broker");
                    self.subscribe();
                    if self.tx.send(Delivery::Connected { will_hash }).await.is_err() {
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
                    self.next_broker(&mut eventloop);
                    will_hash = self.new_will(&mut eventloop);
                    if matches!(
                        e,
                        rumqttc::ConnectionError::ConnectionRefused(
                            rumqttc::ConnectReturnCode::BadUserNamePassword | rumqttc::ConnectReturnCode::NotAuthorized
                        )
                    ) {
                        self.login.refused();
                    }
                    if let Some((user, pass)) = self.login.next(&self.agent) {
                        eventloop.mqtt_options.set_credentials(user, pass);
                    }
                    let delay = backoff_delay(failures, rand::random::<f64>());
                    let retry_in_ms = delay.as_millis() as u64;
                    let error = e.to_string();
                    if reported.is_none_or(|at| at.elapsed() >= QUIET_REPORT) {
                        reported = Some(std::time::Instant::now());
                        let hint = connection_hint(&error, self.broker.tls);
                        tracing::warn!(%error, retry_in_ms, broker = %self.broker, failures, hint, "broker connection failed");
                    } else {
                        tracing::debug!(%error, retry_in_ms, failures, "broker connection failed again");
                    }
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

    fn classify(&self, topic: &str, payload: &[u8], retained: bool) -> Delivery {
        let bad = |error: String| Delivery::Undecodable { topic: topic.to_string(), error };
        match self.topics.parse(topic) {
            Ok(Topic::CoordinatorStatus) => match decode::<Signed>(payload) {
                Ok(signed) => Delivery::CoordinatorStatus { signed, retained },
                Err(e) => bad(e.to_string()),
            },
            Ok(Topic::Agent { agent, kind }) if agent == self.agent && AgentTopic::TO_AGENT.contains(&kind) => {
                match decode::<DownFrame>(payload) {
                    Ok(frame @ (DownFrame::Welcome(_) | DownFrame::Stale(_) | DownFrame::Refused(_)))
                        if kind == AgentTopic::Welcome =>
                    {
                        Delivery::Coordinator { kind, frame }
                    }
                    Ok(frame @ DownFrame::Sealed(_)) if kind != AgentTopic::Welcome => {
                        Delivery::Coordinator { kind, frame }
                    }
                    Ok(_) => bad(format!("a frame that does not belong on the {} topic", kind.as_str())),
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
    fn regression_client_id_is_not_the_predictable_tf_agent_name() {
        let id = client_id("victim", [0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(id, "tf-agent-victim-deadbeef");
        assert_ne!(client_id("victim", [1, 2, 3, 4]), id, "another process, another id");
        let long = "n".repeat(tunefleet_common::topic::MAX_AGENT_ID);
        let id = client_id(&long, [0; 4]);
        assert_eq!(id.len(), MAX_CLIENT_ID, "{id}");
        assert!(id.ends_with("-00000000"), "{id}");
    }

    #[test]
    fn a_connection_error_comes_with_what_it_probably_means() {
        assert!(connection_hint("I/O: Connection refused (os error 111)", false).contains("nothing listens"));
        let timeout = connection_hint("Network timeout", false);
        assert!(timeout.contains("MQTT broker") && timeout.contains("mqtts://"), "{timeout}");
        assert!(!connection_hint("Network timeout", true).contains("mqtts://"));
        assert!(connection_hint("TLS: I/O: invalid peer certificate: BadSignature", true).contains("--ca"));
        assert!(connection_hint("Mqtt state: Connection closed by peer abruptly", false).contains("closed"));
    }

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
