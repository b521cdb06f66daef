//! The embedded broker as it was up to wave 4: rumqttd on a dedicated
//! thread, kept behind `--embedded-broker rumqttd` so the two can be
//! measured side by side (BENCHMARKS.md).
//!
//! rumqttd's `Broker::start()` blocks forever and has no stop, so it lives on
//! its own `std::thread` and ends with the process. Its config is built here
//! in code (its shipped defaults open a console and a metrics port).
//!
//! Latency: rumqttd never sets `TCP_NODELAY` on the sockets it accepts, and a
//! QoS 1 request/reply then waits for Nagle against delayed ACK (about 44 ms).
//! Linux copies `TCP_NODELAY` from a listening socket to the sockets it
//! accepts, so once rumqttd has bound its listener we find that socket among
//! our own descriptors, take a duplicate with `pidfd_getfd` (a duplicate
//! shares the socket) and set the option on it. The same search tells us the
//! port when the caller asked for port 0: rumqttd binds port 0 itself and the
//! OS chooses, so no other process can take the port between a choice and
//! its use.
//!
//! Security: with `users`, every connection must log in. With `tls`, the
//! public listener speaks TLS and requires a client certificate signed by
//! `client_ca` (rumqttd reads a certificate's Organization as a tenant
//! namespace, so fleet certificates carry none). The coordinator itself then
//! connects through a second, loopback-only listener with a credential made
//! up at start.

use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use rumqttd::{Config, ConnectionSettings, RouterConfig, ServerSettings, TlsConfig};
use rustix::process::{getpid, pidfd_getfd, pidfd_open, PidfdFlags, PidfdGetfdFlags};

use super::settings::{internal_credential, BrokerError, BrokerSettings, EmbeddedBroker, InternalAccess, MAX_PAYLOAD};
use super::sockets::{socket_fds, to_std};

fn server(
    name: &str,
    listen: SocketAddr,
    auth: Option<HashMap<String, String>>,
    tls: Option<TlsConfig>,
) -> ServerSettings {
    ServerSettings {
        name: name.into(),
        listen,
        tls,
        next_connection_delay_ms: 0,
        connections: ConnectionSettings {
            connection_timeout_ms: 10_000,
            max_payload_size: MAX_PAYLOAD,
            max_inflight_count: 500,
            auth,
            external_auth: None,
            dynamic_filters: true,
        },
    }
}

fn rumqttd_config(servers: Vec<ServerSettings>) -> Config {
    Config {
        id: 0,
        router: RouterConfig {
            max_connections: 10_000,
            max_outgoing_packet_count: 1_000,
            // The router keeps what it routes per subscription in a log of
            // at most this many segments of this size: 4 x 16 MiB bounds
            // what a flood of large payloads (1 MiB Hellos under new names)
            // holds in the coordinator's memory to 64 MiB (it was 256 MiB),
            // and still holds some 30,000 results of backlog.
            max_segment_size: 16 * 1024 * 1024,
            max_segment_count: 4,
            custom_segment: None,
            initialized_filters: None,
            shared_subscriptions_strategy: Default::default(),
        },
        v4: Some(servers.into_iter().enumerate().map(|(i, s)| (i.to_string(), s)).collect()),
        ..Default::default()
    }
}

/// Held by a start from its snapshot of this process's sockets until it has
/// found rumqttd's listeners among the new ones: two starts at once (tests
/// run brokers side by side in one process) would otherwise each take the
/// other's port-0 listener for its own. Other code of this process that opens
/// a listener on the same address at that moment could still be mistaken for
/// rumqttd's; the coordinator opens none, and tests that do hold this lock.
pub(super) static STARTING: Mutex<()> = Mutex::new(());

/// Starts rumqttd and returns once it accepts connections.
pub(super) fn start(settings: &BrokerSettings) -> Result<EmbeddedBroker, BrokerError> {
    // rumqttd only logs a failed bind on its own thread: a fixed port is
    // bound here first, which finds a taken one at once. Port 0 goes to
    // rumqttd as it is: the OS chooses the port of the socket that listens,
    // and the port is read back from that socket (a port chosen here and
    // handed over could be taken by any other process in between).
    if settings.listen.port() != 0 {
        std::net::TcpListener::bind(settings.listen)
            .map_err(|source| BrokerError::Bind { addr: settings.listen, source })?;
    }
    let Servers { servers, internal_listen, credentials } = server_settings(settings)?;

    // A poisoned lock guards nothing broken: the data is ().
    let _starting = STARTING.lock().unwrap_or_else(PoisonError::into_inner);
    let before: HashSet<u64> = socket_fds().into_iter().map(|(_, ino)| ino).collect();
    let config = rumqttd_config(servers);
    std::thread::Builder::new()
        .name("tunefleet-broker".into())
        .spawn(move || {
            let mut broker = rumqttd::Broker::new(config);
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded broker stopped");
            }
        })
        .map_err(BrokerError::Thread)?;

    let waited = Duration::from_secs(5);
    let deadline = Instant::now() + waited;
    let mut nodelay = settings.nodelay;
    let mut listening = |want| listening_at(&before, want, settings.nodelay, &mut nodelay, (deadline, waited));
    let addr = listening(settings.listen)?;
    let internal = match internal_listen {
        Some(want) => listening(want)?,
        None if addr.ip().is_unspecified() => SocketAddr::from(([127, 0, 0, 1], addr.port())),
        None => addr,
    };
    Ok(EmbeddedBroker { addr, nodelay, internal: InternalAccess { addr: internal, credentials }, counters: None })
}

/// rumqttd's servers for a start, and how the coordinator reaches them.
struct Servers {
    /// A public listener, and with TLS a loopback one for the coordinator.
    servers: Vec<ServerSettings>,
    /// Where that loopback one listens.
    internal_listen: Option<SocketAddr>,
    /// The credential the coordinator logs in with, when it needs one.
    credentials: Option<(String, String)>,
}

/// rumqttd's servers for `settings`.
fn server_settings(settings: &BrokerSettings) -> Result<Servers, BrokerError> {
    let mut servers = Vec::new();
    let (internal_listen, credentials) = match &settings.tls {
        Some(tls) => {
            for path in [&tls.cert, &tls.key, &tls.client_ca] {
                std::fs::metadata(path).map_err(|source| BrokerError::TlsFile { path: path.clone(), source })?;
            }
            let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
            let tls_config = TlsConfig::Rustls {
                capath: Some(path(&tls.client_ca)),
                certpath: path(&tls.cert),
                keypath: path(&tls.key),
            };
            servers.push(server("tunefleet-tls", settings.listen, settings.users.clone(), Some(tls_config)));
            let addr = internal_listen_addr(settings.listen);
            let credentials = internal_credential();
            let auth = HashMap::from([credentials.clone()]);
            servers.push(server("tunefleet-internal", addr, Some(auth), None));
            (Some(addr), Some(credentials))
        }
        None => {
            let credentials = settings.users.as_ref().map(|_| internal_credential());
            let mut users = settings.users.clone();
            if let (Some(map), Some((u, p))) = (users.as_mut(), &credentials) {
                map.insert(u.clone(), p.clone());
            }
            servers.push(server("tunefleet", settings.listen, users, None));
            (None, credentials)
        }
    };
    Ok(Servers { servers, internal_listen, credentials })
}

/// Where rumqttd's listener for `want` ended up, once it listens (by
/// `deadline`, `waited` after the start): among the sockets not in
/// `before`, `TCP_NODELAY` set on it when `set_nodelay`; `nodelay` cleared
/// when that could not be done.
fn listening_at(
    before: &HashSet<u64>,
    want: SocketAddr,
    set_nodelay: bool,
    nodelay: &mut bool,
    (deadline, waited): (Instant, Duration),
) -> Result<SocketAddr, BrokerError> {
    loop {
        match find_listener(before, want).map_err(BrokerError::Inspect)? {
            ListenerLook::Found(fd, local) => {
                if set_nodelay && rustix::net::sockopt::set_tcp_nodelay(&fd, true).is_err() {
                    tracing::warn!("could not set TCP_NODELAY on the broker's listener: replies may wait for Nagle");
                    *nodelay = false;
                }
                return Ok(local);
            }
            // A seccomp filter without @debug (a systemd unit's
            // SystemCallFilter=@system-service) refuses pidfd_getfd:
            // a known port is found by connecting to it instead.
            ListenerLook::Hidden if want.port() != 0 => {
                let dial =
                    if want.ip().is_unspecified() { SocketAddr::from(([127, 0, 0, 1], want.port())) } else { want };
                if std::net::TcpStream::connect_timeout(&dial, Duration::from_millis(100)).is_ok() {
                    if *nodelay {
                        tracing::warn!(
                            "cannot look at the broker's listener (pidfd_getfd refused: a seccomp filter?): no \
                             TCP_NODELAY, replies may wait for Nagle; allow pidfd_getfd (the unit does)"
                        );
                    }
                    *nodelay = false;
                    return Ok(want);
                }
            }
            ListenerLook::Hidden | ListenerLook::NotYet => {}
        }
        if Instant::now() > deadline {
            return Err(BrokerError::NotListening { addr: want, waited });
        }
        // Waiting on a condition (the listener exists) that no event announces.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Where the coordinator's own listener goes beside a TLS one: loopback, a
/// port the OS chooses, and an address the public listener does not use, so
/// that the two new sockets are told apart by their address.
fn internal_listen_addr(public: SocketAddr) -> SocketAddr {
    let ip = if public.ip() == Ipv4Addr::LOCALHOST { Ipv4Addr::new(127, 0, 0, 2) } else { Ipv4Addr::LOCALHOST };
    SocketAddr::from((ip, 0))
}

/// What a look for the broker's listener found.
enum ListenerLook {
    /// A new listening TCP socket bound to the address wanted, and its address.
    Found(OwnedFd, SocketAddr),
    /// None yet.
    NotYet,
    /// New sockets this process may not look at (pidfd_getfd refused).
    Hidden,
}

/// A new listening TCP socket bound to `want` (any port when `want`'s is 0).
fn find_listener(before: &HashSet<u64>, want: SocketAddr) -> std::io::Result<ListenerLook> {
    let pidfd = pidfd_open(getpid(), PidfdFlags::empty())?;
    let mut hidden = false;
    for (fd, ino) in socket_fds() {
        if before.contains(&ino) {
            continue;
        }
        let dup = match pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()) {
            Ok(dup) => dup,
            Err(rustix::io::Errno::PERM | rustix::io::Errno::ACCESS | rustix::io::Errno::NOSYS) => {
                hidden = true;
                continue;
            }
            Err(_) => continue,
        };
        if !rustix::net::sockopt::socket_acceptconn(&dup).unwrap_or(false) {
            continue;
        }
        let Some(local) = rustix::net::getsockname(&dup).ok().as_ref().and_then(to_std) else { continue };
        let ip_ok = local.ip() == want.ip() || want.ip().is_unspecified() && local.ip().is_unspecified();
        let port_ok = want.port() == 0 || local.port() == want.port();
        if ip_ok && port_ok {
            return Ok(ListenerLook::Found(dup, local));
        }
    }
    Ok(if hidden { ListenerLook::Hidden } else { ListenerLook::NotYet })
}
