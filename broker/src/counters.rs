//! What the broker counts: connections, refusals, what it dropped or
//! closed, and what it holds; as Prometheus text for the live page.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the broker has counted since it started.
#[derive(Debug, Default)]
pub struct BrokerCounters {
    /// Connections open now (logged in).
    pub connected: AtomicU64,
    /// Sockets open now, logged in or not.
    pub sockets: AtomicU64,
    /// Sockets closed at once: the socket budget were open.
    pub over_capacity: AtomicU64,
    /// Subscriptions refused (a bad filter, or more than a connection may hold).
    pub refused_filters: AtomicU64,
    /// Connections that logged in.
    pub accepted: AtomicU64,
    /// CONNECTs refused (bad login, a protocol other than 3.1.1, no CONNECT in time, TLS failed).
    pub refused: AtomicU64,
    /// Connections closed for a malformed or oversized packet or a bad topic.
    pub malformed: AtomicU64,
    /// Subscribers disconnected for taking nothing from their full queue for the stall.
    pub stalled: AtomicU64,
    /// Subscribers disconnected for being too far behind to take a QoS 1 copy.
    pub slow_closed: AtomicU64,
    /// QoS 0 copies dropped: their subscriber's queue (or the clients' budget) was full.
    pub dropped: AtomicU64,
    /// CONNECTs of another protocol version (MQTT 3.1, 5), answered with a refusal.
    pub refused_protocol: AtomicU64,
    /// Logins as the coordinator with the wrong secret.
    pub refused_privileged: AtomicU64,
    /// Connections closed for going quiet past their keep-alive (or 300 s without one).
    pub idle_closed: AtomicU64,
    /// Retained messages kept now, and what they cost (bytes, as counted against the budget).
    pub retained: AtomicU64,
    pub retained_bytes: AtomicU64,
    /// KiB queued for clients now (the coordinator's own queue apart).
    pub queued_kib: Arc<AtomicU64>,
    /// A client id connecting again while connected (the old connection closed).
    pub taken_over: AtomicU64,
    /// Retained publishes not kept (the retained store full).
    pub retained_refused: AtomicU64,
    /// Messages received from publishers.
    pub received: AtomicU64,
    /// Copies queued to subscribers.
    pub delivered: AtomicU64,
    /// Logins the gatekeeper refused (a bad proof or password, none, too many strangers).
    pub refused_login: AtomicU64,
    /// Publishes, subscriptions, wills and client-id take-overs outside a login's grants.
    pub denied: AtomicU64,
    /// Strangers' publishes past their rate.
    pub rate_limited: AtomicU64,
    /// Connections open now by kind of login ([`KINDS`] order, the order of `LoginKind`).
    pub by_kind: [AtomicU64; 5],
}

/// The kinds of login, in the order of [`BrokerCounters::by_kind`].
pub const KINDS: [&str; 5] = ["coordinator", "agent", "operator", "stranger", "open"];

impl BrokerCounters {
    /// Every counter and gauge: its name, what it counts, whether it is a
    /// gauge (a level now) rather than a count since the start, and its value.
    pub fn snapshot(&self) -> Vec<(&'static str, &'static str, bool, u64)> {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("connections", "connections logged in now", true, v(&self.connected)),
            ("sockets", "sockets open now, logged in or not", true, v(&self.sockets)),
            ("queued_bytes", "bytes queued for clients now", true, v(&self.queued_kib) * 1024),
            ("retained_messages", "retained messages kept now", true, v(&self.retained)),
            ("retained_bytes", "what the retained messages cost now", true, v(&self.retained_bytes)),
            ("accepted_total", "logins accepted", false, v(&self.accepted)),
            ("refused_total", "CONNECTs refused", false, v(&self.refused)),
            ("refused_protocol_total", "CONNECTs of MQTT 3.1 or 5 refused", false, v(&self.refused_protocol)),
            (
                "refused_privileged_total",
                "logins as the coordinator with a wrong secret",
                false,
                v(&self.refused_privileged),
            ),
            (
                "over_capacity_total",
                "sockets closed at once: the socket budget was full",
                false,
                v(&self.over_capacity),
            ),
            (
                "malformed_total",
                "connections closed for a malformed, oversized or too slow packet",
                false,
                v(&self.malformed),
            ),
            ("refused_filters_total", "subscriptions refused", false, v(&self.refused_filters)),
            ("dropped_total", "QoS 0 copies dropped: their subscriber was behind", false, v(&self.dropped)),
            (
                "slow_closed_total",
                "subscribers disconnected: too far behind for a QoS 1 copy",
                false,
                v(&self.slow_closed),
            ),
            ("stalled_total", "subscribers disconnected: took nothing for the stall", false, v(&self.stalled)),
            ("idle_closed_total", "connections closed: quiet past their keep-alive", false, v(&self.idle_closed)),
            ("taken_over_total", "client ids connecting again while connected", false, v(&self.taken_over)),
            (
                "retained_refused_total",
                "retained publishes not kept: the budget was full",
                false,
                v(&self.retained_refused),
            ),
            ("received_total", "messages received from publishers", false, v(&self.received)),
            ("delivered_total", "copies queued to subscribers", false, v(&self.delivered)),
            ("refused_login_total", "logins refused by identity or password", false, v(&self.refused_login)),
            (
                "denied_total",
                "publishes, subscriptions, wills and take-overs outside a login's grants",
                false,
                v(&self.denied),
            ),
            ("rate_limited_total", "strangers' publishes past their rate", false, v(&self.rate_limited)),
        ]
    }

    /// Connections open now by kind of login: (kind, count).
    pub fn by_kind(&self) -> Vec<(&'static str, u64)> {
        KINDS.iter().zip(&self.by_kind).map(|(k, n)| (*k, n.load(Ordering::Relaxed))).collect()
    }

    /// The counters as Prometheus text, each named `tunefleet_broker_*`.
    pub fn prometheus(&self) -> String {
        let mut out = String::from(
            "# HELP tunefleet_broker_logins connections open now by kind of login\n# TYPE tunefleet_broker_logins gauge\n",
        );
        for (kind, n) in self.by_kind() {
            out.push_str(&format!("tunefleet_broker_logins{{kind=\"{kind}\"}} {n}\n"));
        }
        for (name, help, gauge, value) in self.snapshot() {
            let kind = if gauge { "gauge" } else { "counter" };
            out.push_str(&format!(
                "# HELP tunefleet_broker_{name} {help}\n# TYPE tunefleet_broker_{name} {kind}\ntunefleet_broker_{name} {value}\n"
            ));
        }
        out
    }
}

pub(crate) fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}
