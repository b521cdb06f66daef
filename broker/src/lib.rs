//! The embedded MQTT broker: Tunefleet's own ([`serve`], [`routes`]) on a
//! thread and runtime of its own, or, behind `--embedded-broker rumqttd`
//! in builds with the `rumqttd` feature, the rumqttd router it replaced,
//! kept to measure the two side by side. It imports nothing of the
//! coordinator: one constant of the wire protocol (the largest message).
//!
//! Why its own: rumqttd's router matches every newly seen topic against
//! every filter and every new filter against every topic it has cached, so
//! a fleet joining costs N x N work; on 2 cores it fell off between 1,000
//! and 2,000 agents (connection timeouts, a reconnect storm) where
//! Mosquitto stayed flat. Ours routes through trees of topic levels, gives
//! each connection bounded queues (a slow subscriber slows its publishers,
//! a stuck one is disconnected), sets `TCP_NODELAY` on what it accepts, and
//! binds its own sockets (port 0 is read back from the socket).
//!
//! Security: with `users`, every connection must log in. With `tls`, the
//! public listener speaks TLS and requires a client certificate signed by
//! `client_ca`. The coordinator itself then connects through a second,
//! loopback-only listener with a credential made up at start.

mod access;
mod connect;
mod counters;
mod queue;
mod read;
pub mod routes;
#[cfg(feature = "rumqttd")]
mod rumqttd;
pub mod serve;
mod settings;
#[cfg(any(test, feature = "rumqttd"))]
mod sockets;

pub use settings::*;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rumqttc::tokio_rustls::rustls;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use access::{covers, matches, Gatekeeper, Grants, LoginKind, Refusal};
pub use connect::same_secret;
pub use counters::BrokerCounters;
pub use queue::STALL;

/// Starts the embedded broker and returns once it accepts connections.
pub fn start(settings: &BrokerSettings) -> Result<EmbeddedBroker, BrokerError> {
    match settings.engine {
        BrokerEngine::Native => start_native(settings),
        #[cfg(feature = "rumqttd")]
        BrokerEngine::Rumqttd => rumqttd::start(settings),
    }
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, BrokerError> {
    std::net::TcpListener::bind(addr).map_err(|source| BrokerError::Bind { addr, source })
}

fn start_native(settings: &BrokerSettings) -> Result<EmbeddedBroker, BrokerError> {
    start_native_with(settings, STALL, socket_room(serve::MAX_SOCKETS))
}

/// The counters of the embedded broker this process started last.
static RUNNING: std::sync::Mutex<Option<Arc<BrokerCounters>>> = std::sync::Mutex::new(None);

/// The counters of the embedded broker running in this process, if any
/// (what the live page's `/metrics` shows).
pub fn running_counters() -> Option<Arc<BrokerCounters>> {
    RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// Descriptors kept out of the broker's reach: the store, the page and
/// its clients, the control socket, logs, launched processes.
pub const RESERVED_DESCRIPTORS: u64 = 512;

/// How many sockets the broker may hold: `wanted`, within what the
/// process's descriptor limit leaves after [`RESERVED_DESCRIPTORS`]. The
/// soft limit is raised to the hard one first (systemd's default soft
/// limit is 1,024; the units set `LimitNOFILE`).
pub fn socket_room(wanted: u64) -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        if setrlimit(Resource::Nofile, limit).is_err() {
            limit = getrlimit(Resource::Nofile);
        }
    }
    let room = limit.current.map_or(wanted, |n| n.saturating_sub(RESERVED_DESCRIPTORS));
    if room < wanted {
        tracing::info!(
            descriptors = limit.current.unwrap_or(0),
            sockets = room,
            "broker: the descriptor limit bounds the sockets it will hold (raise LimitNOFILE for more)"
        );
    }
    wanted.min(room).max(1)
}

/// [`start_native`] with how long a subscriber may take nothing and how
/// many sockets may be open (tests lower both).
fn start_native_with(
    settings: &BrokerSettings,
    stall: Duration,
    max_sockets: u64,
) -> Result<EmbeddedBroker, BrokerError> {
    let public = bind(settings.listen)?;
    let addr = public.local_addr().map_err(BrokerError::Inspect)?;
    let mut listeners = Vec::new();
    // The coordinator's own login, privileged, on every listener it may use.
    let credentials = internal_credential();
    let internal = Some(Arc::new(credentials.clone()));
    let internal_addr = match &settings.tls {
        Some(tls) => {
            let acceptor = tls_acceptor(tls)?;
            let users = settings.users.clone().map(Arc::new);
            let gate = settings.gate.clone();
            listeners.push(serve::Listener { socket: public, tls: Some(acceptor), users, internal: None, gate });
            let own = bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
            let own_addr = own.local_addr().map_err(BrokerError::Inspect)?;
            // Only the coordinator's login opens the loopback listener.
            let users = Some(Arc::new(HashMap::new()));
            listeners.push(serve::Listener { socket: own, tls: None, users, internal, gate: None });
            own_addr
        }
        None => {
            let users = settings.users.clone().map(Arc::new);
            let gate = settings.gate.clone();
            listeners.push(serve::Listener { socket: public, tls: None, users, internal, gate });
            if addr.ip().is_unspecified() {
                SocketAddr::from(([127, 0, 0, 1], addr.port()))
            } else {
                addr
            }
        }
    };
    let shared = serve::Shared::new(MAX_PAYLOAD, settings.nodelay, stall, max_sockets);
    let counters = shared.counters.clone();
    *RUNNING.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(counters.clone());
    std::thread::Builder::new()
        .name("tunefleet-broker".into())
        .spawn(move || {
            if let Err(e) = serve::serve(shared, listeners) {
                tracing::error!(error = %e, "embedded broker stopped");
            }
        })
        .map_err(BrokerError::Thread)?;
    // The sockets are bound and listening already: connections wait in the
    // kernel's backlog until the runtime takes them.
    Ok(EmbeddedBroker {
        addr,
        nodelay: settings.nodelay,
        internal: InternalAccess { addr: internal_addr, credentials: Some(credentials) },
        counters: Some(counters),
    })
}

/// A TLS acceptor that requires client certificates signed by `client_ca`.
fn tls_acceptor(tls: &BrokerTls) -> Result<rumqttc::tokio_rustls::TlsAcceptor, BrokerError> {
    for path in [&tls.cert, &tls.key, &tls.client_ca] {
        std::fs::metadata(path).map_err(|source| BrokerError::TlsFile { path: path.clone(), source })?;
    }
    let bad = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        BrokerError::Tls(format!("{what} {}: {e}", path.display()))
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| bad("certificate", &tls.cert, &e))?;
    if certs.is_empty() {
        return Err(bad("certificate", &tls.cert, &"no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| bad("key", &tls.key, &e))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&tls.client_ca).map_err(|e| bad("client CA", &tls.client_ca, &e))? {
        let cert = cert.map_err(|e| bad("client CA", &tls.client_ca, &e))?;
        roots.add(cert).map_err(|e| bad("client CA", &tls.client_ca, &e))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| bad("client CA", &tls.client_ca, &e))?;
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_client_cert_verifier(verifier).with_single_cert(certs, key))
        .map_err(|e| bad("certificate", &tls.cert, &e))?;
    Ok(rumqttc::tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// The host agents should use for a listener bound to `ip`: `ip` itself,
/// or, for a wildcard (`0.0.0.0`, `::`), no address anyone can dial, this
/// machine's address on its default route (found by connecting a UDP
/// socket, which sends nothing), else its host name, else loopback.
pub fn reachable_host(ip: std::net::IpAddr) -> String {
    if !ip.is_unspecified() {
        return ip.to_string();
    }
    // A documentation address (TEST-NET-1): never dialled, only routed.
    let routed = std::net::UdpSocket::bind((ip, 0))
        .and_then(|s| s.connect(("192.0.2.1", 9)).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .ok()
        .filter(|a| !a.is_unspecified() && !a.is_loopback());
    if let Some(addr) = routed {
        return addr.to_string();
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let resolves = |n: &str| std::net::ToSocketAddrs::to_socket_addrs(&(n, 0u16)).is_ok_and(|mut a| a.next().is_some());
    if !name.is_empty() && resolves(&name) {
        return name;
    }
    if ip.is_ipv4() {
        "127.0.0.1".to_string()
    } else {
        "::1".to_string()
    }
}

#[cfg(test)]
mod tests;
