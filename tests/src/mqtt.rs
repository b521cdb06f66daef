//! An MQTT client of the tests (rumqttc) for what a test does by hand on
//! a broker: connect, subscribe, publish raw bytes, take the messages that
//! arrive, disconnect, and see the connection closed, each under a timeout.
//! Async, on the test's own runtime: its event loop is a task there, polled
//! while that runtime runs (a multi-thread runtime keeps it connected while
//! the test blocks on something else).

use std::time::Duration;

use rumqttc::{AsyncClient, ClientError, Event, MqttOptions, Packet, QoS};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// How long a connection or a subscription may take.
const WAIT: Duration = Duration::from_secs(10);
/// Largest packet either way: room for the largest protocol message.
const MAX_PACKET: usize = 1 << 22;
/// Requests (publishes, subscriptions) queued for the event loop.
const QUEUE: usize = 4096;

/// Why [`TestClient::next_message`] brought none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoMessage {
    /// None arrived within the timeout.
    TimedOut,
    /// The connection is over (the broker went away, or closed it).
    Closed,
}

/// One connection to the broker on 127.0.0.1. Dropped, its socket closes
/// without a DISCONNECT.
pub struct TestClient {
    client: AsyncClient,
    messages: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    /// Each SUBACK: whether each filter was granted.
    subacks: mpsc::UnboundedReceiver<Vec<bool>>,
    /// The task polling the connection until it ends. It reads on after
    /// a DISCONNECT until the broker closes: a socket closed with data
    /// still unread is reset, and the broker may lose what it had not read.
    poller: JoinHandle<()>,
}

impl TestClient {
    /// Connects to the broker on 127.0.0.1:`port` as client `id`; returns
    /// once the broker accepted the connection, or why it did not.
    pub async fn connect(port: u16, id: &str) -> Result<TestClient, String> {
        TestClient::connect_as(port, id, None).await
    }

    /// [`TestClient::connect`] with a user name and password.
    pub async fn connect_as(port: u16, id: &str, login: Option<(&str, &str)>) -> Result<TestClient, String> {
        let mut opts = MqttOptions::new(id, "127.0.0.1", port);
        opts.set_max_packet_size(MAX_PACKET, MAX_PACKET);
        if let Some((user, pass)) = login {
            opts.set_credentials(user, pass);
        }
        let (client, mut el) = AsyncClient::new(opts, QUEUE);
        let (message_tx, messages) = mpsc::unbounded_channel();
        let (suback_tx, subacks) = mpsc::unbounded_channel();
        let (connack_tx, connack) = oneshot::channel();
        let poller = tokio::spawn(async move {
            let mut connack_tx = Some(connack_tx);
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if let Some(tx) = connack_tx.take() {
                            let _ = tx.send(Ok(()));
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(ack))) => {
                        let granted = ack
                            .return_codes
                            .iter()
                            .map(|c| matches!(c, rumqttc::SubscribeReasonCode::Success(_)))
                            .collect();
                        let _ = suback_tx.send(granted);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = message_tx.send((p.topic.clone(), p.payload.to_vec()));
                    }
                    Ok(_) => {}
                    // The broker closed the connection (as it does after
                    // a DISCONNECT, once it has read everything before), or
                    // it failed. No reconnecting: the test sees it closed.
                    Err(e) => {
                        if let Some(tx) = connack_tx.take() {
                            let _ = tx.send(Err(e.to_string()));
                        }
                        break;
                    }
                }
            }
        });
        let accepted = match tokio::time::timeout(WAIT, connack).await {
            Ok(Ok(accepted)) => accepted,
            Ok(Err(_)) => Err("the connection ended before its CONNACK".to_string()),
            Err(_) => Err(format!("no CONNACK within {WAIT:?}")),
        };
        let client = TestClient { client, messages, subacks, poller };
        accepted.map(|()| client)
    }

    /// Subscribes to `filters` (QoS 1); returns once each is granted.
    pub async fn subscribe(&mut self, filters: &[String]) {
        let granted = self.try_subscribe(filters).await;
        assert!(granted.iter().all(|g| *g), "subscriptions refused: {filters:?} -> {granted:?}");
    }

    /// Subscribes to each of `filters` (QoS 1) and says which the broker granted.
    pub async fn try_subscribe(&mut self, filters: &[String]) -> Vec<bool> {
        for filter in filters {
            self.client.subscribe(filter.clone(), QoS::AtLeastOnce).await.expect("subscribe");
        }
        let mut granted = Vec::new();
        for filter in filters {
            let acked = tokio::time::timeout(WAIT, self.subacks.recv()).await;
            match acked {
                Ok(Some(codes)) => granted.extend(codes),
                _ => panic!("subscribed: no SUBACK for {filter} within {WAIT:?}"),
            }
        }
        granted
    }

    /// Queues `payload` for `topic` at QoS 1 (written by the event loop).
    pub async fn publish(
        &self,
        topic: impl Into<String>,
        payload: impl Into<Vec<u8>>,
        retain: bool,
    ) -> Result<(), ClientError> {
        self.client.publish(topic, QoS::AtLeastOnce, retain, payload).await
    }

    /// Queues `payload` for `topic` at QoS 0: nothing waits for the broker
    /// (a flood).
    pub async fn publish_at_most_once(
        &self,
        topic: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Result<(), ClientError> {
        self.client.publish(topic, QoS::AtMostOnce, false, payload).await
    }

    /// The next message (topic, payload) within `timeout`.
    pub async fn next_message(&mut self, timeout: Duration) -> Result<(String, Vec<u8>), NoMessage> {
        match tokio::time::timeout(timeout, self.messages.recv()).await {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err(NoMessage::Closed),
            Err(_) => Err(NoMessage::TimedOut),
        }
    }

    /// A message already arrived, without waiting.
    pub fn try_message(&mut self) -> Option<(String, Vec<u8>)> {
        self.messages.try_recv().ok()
    }

    /// Queues a DISCONNECT after everything queued before; the connection
    /// ends once the broker has read it and closed ([`TestClient::wait_closed`]).
    pub async fn disconnect(&self) -> Result<(), ClientError> {
        self.client.disconnect().await
    }

    /// Whether the connection ended within `timeout`: closed by the broker
    /// (after a DISCONNECT, or of its own accord) or failed.
    pub async fn wait_closed(&mut self, timeout: Duration) -> bool {
        // A finished task is awaited once.
        self.poller.is_finished() || tokio::time::timeout(timeout, &mut self.poller).await.is_ok()
    }
}

impl Drop for TestClient {
    fn drop(&mut self) {
        self.poller.abort();
    }
}
