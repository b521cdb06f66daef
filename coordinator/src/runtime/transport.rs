//! The coordinator's MQTT transport: the only module that knows rumqttc.
//!
//! It turns broker traffic into typed [`Inbound`] frames (still to be
//! authenticated by [`crate::runtime::auth`]) and publishes sealed payloads. Payloads
//! that fail to decode, or whose frame does not belong on their topic,
//! become [`Inbound::Rejected`]: counted and logged by the engine, never a
//! panic.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS, TlsConfiguration, Transport};
use tokio::sync::{mpsc, watch};
use tunefleet_common::auth::UpFrame;

use crate::runtime::engine::types::Inbound;
use tunefleet_common::security::{self, ClientSecurity, SecurityError};
use tunefleet_common::topic::{AgentTopic, Topic, Topics};
use tunefleet_common::{decode, BrokerUrl, CodecError};

/// How to reach the broker.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub url: BrokerUrl,
    pub client_id: String,
    pub topics: Topics,
    pub keepalive: Duration,
    pub security: ClientSecurity,
    /// The signed coordinator status, online (retained on every connect)
    /// and offline (the Last Will, and published by [`Outbox::close`]).
    pub online_status: Vec<u8>,
    pub offline_status: Vec<u8>,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("message does not encode: {0}")]
    Encode(#[from] CodecError),
    #[error(transparent)]
    Security(#[from] SecurityError),
    #[error("the MQTT client is gone: {0}")]
    Closed(String),
}

/// How often the coordinator publishes its status again ([`Outbox::refresh_status`]).
pub const STATUS_REFRESH: Duration = Duration::from_secs(30);

/// The sending half.
#[derive(Clone)]
pub struct Outbox {
    client: AsyncClient,
    topics: Topics,
    online_status: Vec<u8>,
    offline_status: Vec<u8>,
    /// Becomes true when the event loop has ended (after DISCONNECT is written).
    stopped: watch::Receiver<bool>,
}

impl Outbox {
    /// Publishes an encoded frame to `agent`'s `kind` topic at QoS 1.
    pub async fn send(&self, agent: &str, kind: AgentTopic, payload: Vec<u8>) -> Result<(), TransportError> {
        self.client
            .publish(self.topics.agent(agent, kind), QoS::AtLeastOnce, false, payload)
            .await
            .map_err(|e| TransportError::Closed(e.to_string()))
    }

    /// Publishes the retained online status again. A clustered broker may
    /// not hand a retained message to subscribers on another node (ejabberd
    /// 23.01 does not: docs/CLUSTER-BROKER.md); agents there that wait for
    /// it see it live instead, within [`STATUS_REFRESH`].
    pub async fn refresh_status(&self) -> Result<(), TransportError> {
        self.client
            .publish(self.topics.coordinator_status(), QoS::AtLeastOnce, true, self.online_status.clone())
            .await
            .map_err(|e| TransportError::Closed(e.to_string()))
    }

    /// Says the coordinator is going away, disconnects, and waits (at most
    /// `within`) until everything queued before has been written and the
    /// DISCONNECT has left.
    pub async fn close(&self, within: Duration) -> Result<(), TransportError> {
        let closed = |e: rumqttc::ClientError| TransportError::Closed(e.to_string());
        self.client
            .publish(self.topics.coordinator_status(), QoS::AtLeastOnce, true, self.offline_status.clone())
            .await
            .map_err(closed)?;
        self.client.disconnect().await.map_err(closed)?;
        let mut stopped = self.stopped.clone();
        let done = tokio::time::timeout(within, async move { stopped.wait_for(|s| *s).await.is_ok() }).await;
        done.map(|_| ()).map_err(|_| TransportError::Closed(format!("the disconnect did not leave within {within:?}")))
    }
}

/// Checks that a payload on `topic` is a frame that belongs there: a Hello
/// on the hello topic, a Last Will on the status topic, sealed frames on
/// every other topic agents publish on (and on the status topic).
pub fn classify(topics: &Topics, topic: &str, payload: &[u8]) -> Inbound {
    let rejected = |reason: String| Inbound::Rejected { topic: topic.to_string(), reason };
    let (agent, kind) = match topics.parse(topic) {
        Ok(Topic::Agent { agent, kind }) if kind.direction() == "up" => (agent, kind),
        Ok(_) => return rejected("not a topic agents publish on".into()),
        Err(e) => return rejected(e.to_string()),
    };
    let frame: UpFrame = match decode(payload) {
        Ok(m) => m,
        Err(e) => return rejected(e.to_string()),
    };
    let fits = match &frame {
        UpFrame::Hello(_) => kind == AgentTopic::Hello,
        UpFrame::Will(_) => kind == AgentTopic::Status,
        UpFrame::Sealed(_) => kind != AgentTopic::Hello,
    };
    if !fits {
        return rejected(format!("a {} frame on a {} topic", frame_name(&frame), kind.as_str()));
    }
    Inbound::Agent { agent, kind, frame: Box::new(frame) }
}

fn frame_name(frame: &UpFrame) -> &'static str {
    match frame {
        UpFrame::Hello(_) => "hello",
        UpFrame::Will(_) => "will",
        UpFrame::Sealed(_) => "sealed",
    }
}

/// Connects (in the background, reconnecting forever) and returns the sending
/// half and the stream of inbound events.
pub fn connect(config: TransportConfig) -> Result<(Outbox, mpsc::Receiver<Inbound>), TransportError> {
    let mut opts = MqttOptions::new(config.client_id.clone(), config.url.host.clone(), config.url.port);
    opts.set_keep_alive(config.keepalive)
        .set_clean_session(true)
        .set_inflight(1000)
        .set_request_channel_capacity(4096)
        .set_max_packet_size(crate::runtime::broker::MAX_PAYLOAD, crate::runtime::broker::MAX_PAYLOAD);
    if let Some((user, pass)) = &config.security.credentials {
        opts.set_credentials(user.clone(), pass.clone());
    }
    if let Some(files) = &config.security.tls {
        opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(security::client_config(files)?)));
    }
    opts.set_last_will(LastWill::new(
        config.topics.coordinator_status(),
        config.offline_status.clone(),
        QoS::AtLeastOnce,
        true,
    ));
    let online = config.online_status.clone();
    let offline = config.offline_status.clone();

    let (client, mut eventloop) = AsyncClient::new(opts, 4096);
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    net.set_connection_timeout(5);
    eventloop.set_network_options(net);

    let (tx, rx) = mpsc::channel(8192);
    let topics = config.topics.clone();
    let loop_client = client.clone();
    let (stopped_tx, stopped) = watch::channel(false);
    tokio::spawn(async move {
        let _stopped = Stopped(stopped_tx);
        let mut backoff = Duration::from_millis(50);
        let mut restored: Option<std::time::Instant> = None;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff = Duration::from_millis(50);
                    // try_*: these requests are drained by this very loop, so awaiting could deadlock.
                    let sub = loop_client
                        .try_subscribe(topics.from_agents(), QoS::AtLeastOnce)
                        .and_then(|()| loop_client.try_subscribe(topics.coordinator_status(), QoS::AtLeastOnce));
                    let status =
                        loop_client.try_publish(topics.coordinator_status(), QoS::AtLeastOnce, true, online.clone());
                    if let Err(e) = sub.and(status) {
                        tracing::error!(error = %e, "could not subscribe after connecting");
                    }
                    if tx.send(Inbound::Connected).await.is_err() {
                        return;
                    }
                }
                // Anyone on the broker can overwrite the retained status (it
                // cannot forge it: agents check its signature, and then wait
                // for the next refresh): ours is put back at once, at most
                // once a second.
                Ok(Event::Incoming(Packet::Publish(p))) if p.topic == topics.coordinator_status() => {
                    if p.payload[..] == online[..] || p.payload[..] == offline[..] {
                        continue;
                    }
                    if restored.is_some_and(|at: std::time::Instant| at.elapsed() < Duration::from_secs(1)) {
                        continue;
                    }
                    restored = Some(std::time::Instant::now());
                    let again =
                        loop_client.try_publish(topics.coordinator_status(), QoS::AtLeastOnce, true, online.clone());
                    let reason = match again {
                        Ok(()) => "the retained coordinator status was overwritten: published again".to_string(),
                        Err(e) => format!(
                            "the retained coordinator status was overwritten, and cannot be published again: {e}"
                        ),
                    };
                    if tx.send(Inbound::Rejected { topic: p.topic.clone(), reason }).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if tx.send(classify(&topics, &p.topic, &p.payload)).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return,
                Ok(_) => {}
                Err(e) => {
                    if tx.send(Inbound::Disconnected(e.to_string())).await.is_err() {
                        return;
                    }
                    // Jitter, so a fleet that lost its broker does not come back in lockstep.
                    tokio::time::sleep(backoff.mul_f64(0.5 + rand::random::<f64>())).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    });
    let online_status = config.online_status;
    Ok((Outbox { client, topics: config.topics, online_status, offline_status: config.offline_status, stopped }, rx))
}

/// Says the event loop has ended, however it ends.
struct Stopped(watch::Sender<bool>);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::auth::{Sealed, Signed, Will};
    use tunefleet_common::encode;

    #[test]
    fn classify_rejects_mismatches_and_garbage() {
        let topics = Topics::new("t").expect("root");
        let req = encode(&UpFrame::Sealed(Sealed { token: 1, seq: 1, body: vec![] })).expect("enc");
        assert!(matches!(
            classify(&topics, &topics.agent("a1", AgentTopic::Request), &req),
            Inbound::Agent { ref agent, kind: AgentTopic::Request, ref frame }
                if agent == "a1" && matches!(**frame, UpFrame::Sealed(_))
        ));
        // A sealed frame on the hello topic; a Hello or a will elsewhere.
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Hello), &req), Inbound::Rejected { .. }));
        let hello = encode(&UpFrame::Hello(Signed { body: vec![], signature: vec![] })).expect("enc");
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Result), &hello), Inbound::Rejected { .. }));
        let will = encode(&UpFrame::Will(Will { instance: 1, secret: [0; 32] })).expect("enc");
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Request), &will), Inbound::Rejected { .. }));
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Status), &will), Inbound::Agent { .. }));
        // A topic the coordinator itself publishes on.
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Assign), &req), Inbound::Rejected { .. }));
        // Garbage.
        let Inbound::Rejected { reason, .. } =
            classify(&topics, &topics.agent("a1", AgentTopic::Status), &[tunefleet_common::PROTOCOL_VERSION, 255, 3])
        else {
            panic!("garbage accepted")
        };
        assert!(reason.contains("decode"), "{reason}");
        assert!(matches!(classify(&topics, "other/v2/up/a1/status", &will), Inbound::Rejected { .. }));
    }
}
