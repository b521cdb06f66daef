//! The embedded broker's settings, handle and errors, shared by both engines.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::counters::BrokerCounters;

/// Largest MQTT payload the embedded broker accepts.
pub const MAX_PAYLOAD: usize = tunefleet_common::MAX_MESSAGE_BYTES + 64 * 1024;

/// Why the broker could not be started.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("could not start the broker thread")]
    Thread(#[source] std::io::Error),
    #[error("the embedded broker did not start listening on {addr} within {waited:?} (port in use?)")]
    NotListening { addr: SocketAddr, waited: Duration },
    #[error("cannot listen on {addr}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("TLS file {path}")]
    TlsFile { path: std::path::PathBuf, source: std::io::Error },
    #[error("could not inspect the broker's socket")]
    Inspect(#[source] std::io::Error),
    #[error("TLS setup of the broker: {0}")]
    Tls(String),
}

/// Which code serves the embedded broker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BrokerEngine {
    /// Tunefleet's own (the default).
    #[default]
    Native,
    /// rumqttd 0.20, as before wave 4 (to compare; it falls off past 1,000-2,000 agents).
    #[cfg(feature = "rumqttd")]
    Rumqttd,
}

/// Settings of the embedded broker.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// Address to listen on; port 0 lets the OS choose.
    pub listen: SocketAddr,
    /// username -> password; `None` runs the broker open.
    pub users: Option<HashMap<String, String>>,
    /// Give accepted connections `TCP_NODELAY` (off only to measure what it buys).
    pub nodelay: bool,
    /// Serve TLS (with client certificates) on `listen`.
    pub tls: Option<BrokerTls>,
    /// Which code serves it.
    pub engine: BrokerEngine,
    /// Decides logins and what each may do; `None`: every login may do everything.
    pub gate: Option<Arc<dyn super::access::Gatekeeper>>,
}

/// The embedded broker's TLS files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerTls {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// CA that signs the client certificates the broker accepts.
    pub client_ca: std::path::PathBuf,
}

/// How the coordinator itself connects to its embedded broker.
#[derive(Debug, Clone)]
pub struct InternalAccess {
    /// Plain MQTT on loopback: the public address, or a second listener when the public one is TLS.
    pub addr: SocketAddr,
    /// A credential made up at start, when the broker requires one.
    pub credentials: Option<(String, String)>,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        BrokerSettings {
            listen: SocketAddr::from(([127, 0, 0, 1], 1883)),
            users: None,
            nodelay: true,
            tls: None,
            engine: BrokerEngine::Native,
            gate: None,
        }
    }
}

/// A running embedded broker.
#[derive(Debug)]
pub struct EmbeddedBroker {
    /// The address it really listens on (the chosen port when 0 was asked).
    pub addr: SocketAddr,
    /// Whether accepted connections get `TCP_NODELAY` (false only if the kernel refused).
    pub nodelay: bool,
    /// How the coordinator reaches it.
    pub internal: InternalAccess,
    /// What it has counted (the native engine's; rumqttd counts nothing we can read).
    pub counters: Option<Arc<BrokerCounters>>,
}

/// A user name and random password for the coordinator's own connection.
pub(crate) fn internal_credential() -> (String, String) {
    (format!("tf-coordinator-{:08x}", rand::random::<u32>()), format!("{:032x}", rand::random::<u128>()))
}
