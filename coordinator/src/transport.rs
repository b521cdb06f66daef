//! The coordinator's MQTT transport: the only module that knows rumqttc.
//!
//! It turns broker traffic into typed [`Inbound`] events and typed
//! [`CoordinatorMessage`]s into publishes. Payloads that fail to decode, or
//! that arrive on a topic that does not match what they claim to be, become
//! [`Inbound::Rejected`]: counted and logged by the engine, never a panic.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS, TlsConfiguration, Transport};
use tokio::sync::mpsc;
use tunefleet_common::message::{AgentMessage, CoordinatorMessage, CoordinatorStatus};
use tunefleet_common::security::{self, ClientSecurity, SecurityError};
use tunefleet_common::topic::{AgentTopic, Topic, Topics};
use tunefleet_common::{decode, encode, BrokerUrl, CodecError};

/// How to reach the broker.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    pub url: BrokerUrl,
    pub client_id: String,
    pub topics: Topics,
    pub keepalive: Duration,
    pub security: ClientSecurity,
    /// Random per coordinator start; agents re-announce when it changes.
    pub instance: u64,
}

/// What the transport hands to the engine.
#[derive(Debug)]
pub enum Inbound {
    /// (Re)connected and subscribed.
    Connected,
    /// Lost the broker; the transport keeps reconnecting.
    Disconnected(String),
    /// A well-formed message from an agent (boxed: a result is large, a status small).
    Agent { agent: String, msg: Box<AgentMessage> },
    /// A payload that was refused, with the reason.
    Rejected { topic: String, reason: String },
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

/// The sending half.
#[derive(Clone)]
pub struct Outbox {
    client: AsyncClient,
    topics: Topics,
    instance: u64,
}

impl Outbox {
    /// Publishes `msg` to `agent` at QoS 1.
    pub async fn send(&self, agent: &str, msg: &CoordinatorMessage) -> Result<(), TransportError> {
        let topic = self.topics.agent(agent, AgentTopic::of_coordinator_message(msg));
        let payload = encode(msg)?;
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .map_err(|e| TransportError::Closed(e.to_string()))
    }

    /// Says the coordinator is going away, then disconnects.
    pub async fn close(&self) -> Result<(), TransportError> {
        let status = encode(&CoordinatorStatus { online: false, instance: self.instance })?;
        let closed = |e: rumqttc::ClientError| TransportError::Closed(e.to_string());
        self.client.publish(self.topics.coordinator_status(), QoS::AtLeastOnce, true, status).await.map_err(closed)?;
        self.client.disconnect().await.map_err(closed)
    }
}

/// Checks that a payload on `topic` is a message of the kind the topic says,
/// from the agent the topic names.
pub fn classify(topics: &Topics, topic: &str, payload: &[u8]) -> Inbound {
    let rejected = |reason: String| Inbound::Rejected { topic: topic.to_string(), reason };
    let (agent, kind) = match topics.parse(topic) {
        Ok(Topic::Agent { agent, kind }) if kind.direction() == "up" => (agent, kind),
        Ok(_) => return rejected("not a topic agents publish on".into()),
        Err(e) => return rejected(e.to_string()),
    };
    let msg: AgentMessage = match decode(payload) {
        Ok(m) => m,
        Err(e) => return rejected(e.to_string()),
    };
    if AgentTopic::of_agent_message(&msg) != kind {
        return rejected(format!("a {:?} message on a {} topic", AgentTopic::of_agent_message(&msg), kind.as_str()));
    }
    if let AgentMessage::Hello(info) = &msg {
        if info.agent != agent {
            return rejected(format!("agent {:?} announced itself on the topic of {agent:?}", info.agent));
        }
    }
    Inbound::Agent { agent, msg: Box::new(msg) }
}

/// Connects (in the background, reconnecting forever) and returns the sending
/// half and the stream of inbound events.
pub fn connect(config: TransportConfig) -> Result<(Outbox, mpsc::Receiver<Inbound>), TransportError> {
    let mut opts = MqttOptions::new(config.client_id.clone(), config.url.host.clone(), config.url.port);
    opts.set_keep_alive(config.keepalive)
        .set_clean_session(true)
        .set_inflight(1000)
        .set_request_channel_capacity(4096)
        .set_max_packet_size(crate::broker::MAX_PAYLOAD, crate::broker::MAX_PAYLOAD);
    if let Some((user, pass)) = &config.security.credentials {
        opts.set_credentials(user.clone(), pass.clone());
    }
    if let Some(files) = &config.security.tls {
        opts.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(security::client_config(files)?)));
    }
    let will = encode(&CoordinatorStatus { online: false, instance: config.instance })?;
    opts.set_last_will(LastWill::new(config.topics.coordinator_status(), will, QoS::AtLeastOnce, true));
    let online = encode(&CoordinatorStatus { online: true, instance: config.instance })?;

    let (client, mut eventloop) = AsyncClient::new(opts, 4096);
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    net.set_connection_timeout(5);
    eventloop.set_network_options(net);

    let (tx, rx) = mpsc::channel(8192);
    let topics = config.topics.clone();
    let loop_client = client.clone();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff = Duration::from_millis(50);
                    // try_*: these requests are drained by this very loop, so awaiting could deadlock.
                    let sub = loop_client.try_subscribe(topics.from_agents(), QoS::AtLeastOnce);
                    let status =
                        loop_client.try_publish(topics.coordinator_status(), QoS::AtLeastOnce, true, online.clone());
                    if let Err(e) = sub.and(status) {
                        tracing::error!(error = %e, "could not subscribe after connecting");
                    }
                    if tx.send(Inbound::Connected).await.is_err() {
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
    Ok((Outbox { client, topics: config.topics, instance: config.instance }, rx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::message::{AgentStatus, WorkRequest};

    #[test]
    fn classify_rejects_mismatches_and_garbage() {
        let topics = Topics::new("t").expect("root");
        let req =
            encode(&AgentMessage::Request(WorkRequest { token: 1, seq: 1, free: 1, running: vec![] })).expect("enc");
        assert!(matches!(
            classify(&topics, &topics.agent("a1", AgentTopic::Request), &req),
            Inbound::Agent { ref agent, ref msg } if agent == "a1" && matches!(**msg, AgentMessage::Request(_))
        ));
        // Right payload, wrong topic kind.
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Result), &req), Inbound::Rejected { .. }));
        // A topic the coordinator itself publishes on.
        assert!(matches!(classify(&topics, &topics.agent("a1", AgentTopic::Assign), &req), Inbound::Rejected { .. }));
        // Garbage.
        let Inbound::Rejected { reason, .. } =
            classify(&topics, &topics.agent("a1", AgentTopic::Status), &[tunefleet_common::PROTOCOL_VERSION, 255, 3])
        else {
            panic!("garbage accepted")
        };
        assert!(reason.contains("decode"), "{reason}");
        let st = encode(&AgentMessage::Status(AgentStatus { online: true, instance: 1 })).expect("enc");
        assert!(matches!(classify(&topics, "other/v1/up/a1/status", &st), Inbound::Rejected { .. }));
    }
}
