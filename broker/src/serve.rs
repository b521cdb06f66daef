//! The embedded broker's connections: MQTT 3.1.1 over TCP or TLS, on a
//! runtime of its own (its own thread), so a busy engine never delays a
//! packet and a flood of packets never starves the engine.
//!
//! Each connection is two tasks: a reader that authenticates the CONNECT,
//! then routes what the client publishes into the queues of the
//! connections subscribed to it ([`super::routes`]), and a writer that
//! drains its own queue into the socket, many packets per write. The
//! queues and the process's memory for them are bounded ([`super::queue`]):
//! no publisher waits on another client's reader; a subscriber that falls
//! behind loses its QoS 0 copies or its connection, counted, never silently.
//!
//! Logins: the coordinator's own connection logs in with a credential made
//! up at start and is the one privileged login (see [`super::queue`]);
//! every other connection is a client. MQTT 3.1 and 5 CONNECTs are answered
//! with the refusal their specifications ask for and logged.
//!
//! Sessions are not kept across connections (every Tunefleet client asks
//! for a clean session; a client asking otherwise is told no session was
//! present). QoS 2 is accepted from publishers and delivered at QoS 1.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rumqttc::mqttbytes::v4::{
    ConnAck, ConnectReturnCode, Packet, PubAck, PubComp, PubRec, Publish, SubAck, SubscribeReasonCode, UnsubAck,
};
use rumqttc::mqttbytes::{Protocol, QoS};
use rumqttc::tokio_rustls::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::access::{Gatekeeper, Grants, KindCount, LoginKind, Rate, Refusal, STRANGER_MAX_PACKET};
use super::connect::{refuse_level, same_secret};
use super::counters::{bump, BrokerCounters};
use super::queue::{deliver_waiting, offer, try_offer, write_loop, Clock, Offered, Peer, Tried};
use super::read::{read_connect, read_packet, ReadError, ReadRoom, READ_BUFFERS_KIB};
use super::routes::{check_filter, check_topic, ConnId, Retained, Subscriptions};

/// Retained messages kept at most (beyond it a retained publish is routed but not kept).
const MAX_RETAINED: usize = 100_000;
/// Bytes the retained messages may cost, counted as [`retained_cost`] does.
const MAX_RETAINED_BYTES: usize = 96 * 1024 * 1024;
/// What one level of a retained topic costs in the tree (its node, its
/// name and its parent's table slot), measured: 100,000 retained messages
/// on 32-level topics took 1.8 GB, about 560 bytes a level.
const RETAINED_LEVEL_BYTES: usize = 640;
/// Retained copies a client's SUBSCRIBE is sent at most (what its queue
/// holds); the coordinator's own connection gets them all.
const MAX_RETAINED_PER_SUBSCRIBE: usize = 2_048;
/// A client with no keep-alive is closed after this long without a packet.
const IDLE_WITHOUT_KEEPALIVE: Duration = Duration::from_secs(300);
/// The longest keep-alive honoured (a client asking for more gets this).
const MAX_KEEPALIVE: Duration = Duration::from_secs(1_200);
/// A CONNECT must arrive this soon after the TCP (and TLS) handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Subscriptions one connection may hold (Tunefleet's clients hold 2).
const MAX_FILTERS: usize = 64;
/// Sockets open at once, logged in or not (10,000 agents by default, room
/// for reconnects and a coordinator); past it a new socket is closed at once.
pub const MAX_SOCKETS: u64 = 20_000;

#[derive(Default)]
struct Tables {
    subs: Subscriptions,
    retained: Retained<Publish>,
    peers: HashMap<ConnId, Peer>,
    /// Client id -> the connection holding it, and that login's identity.
    clients: HashMap<String, (ConnId, Arc<str>)>,
}

/// The broker's state, shared by every connection.
pub struct Shared {
    tables: Mutex<Tables>,
    /// Read buffers beyond their first 64 KiB, in KiB ([`READ_BUFFERS_KIB`]).
    read_budget: Arc<Semaphore>,
    next_id: AtomicU64,
    /// The queues' view of the broker (its counters, clock and stall).
    clock: Arc<Clock>,
    pub counters: Arc<BrokerCounters>,
    max_payload: usize,
    nodelay: bool,
    max_sockets: u64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("counters", &self.counters).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing in the tables is left half-changed by a panic that matters
    // more than keeping the broker up: go on with what is there.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub fn new(max_payload: usize, nodelay: bool, stall: Duration, max_sockets: u64) -> Arc<Shared> {
        let counters: Arc<BrokerCounters> = Arc::default();
        Arc::new(Shared {
            tables: Mutex::new(Tables::default()),
            read_budget: Arc::new(Semaphore::new(READ_BUFFERS_KIB)),
            next_id: AtomicU64::new(1),
            clock: Arc::new(Clock { counters: counters.clone(), started: Instant::now(), stall }),
            counters,
            max_payload,
            nodelay,
            max_sockets,
        })
    }
}

/// One listening socket and how it admits clients.
pub struct Listener {
    pub socket: std::net::TcpListener,
    pub tls: Option<TlsAcceptor>,
    /// username -> password; `None` runs it open.
    pub users: Option<Arc<HashMap<String, String>>>,
    /// The coordinator's own login (privileged), whichever `users` are.
    pub internal: Option<Arc<(String, String)>>,
    /// Decides every other login and what it may do (`users` are then its to read).
    pub gate: Option<Arc<dyn Gatekeeper>>,
}

/// Serves `listeners` on a runtime of its own, on the calling thread, forever.
pub fn serve(shared: Arc<Shared>, listeners: Vec<Listener>) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().thread_name("tunefleet-broker").enable_all().build()?;
    runtime.block_on(async move {
        let mut accepting = Vec::new();
        for l in listeners {
            l.socket.set_nonblocking(true)?;
            let socket = tokio::net::TcpListener::from_std(l.socket)?;
            let admit = Arc::new(Admission { users: l.users, internal: l.internal, gate: l.gate });
            accepting.push(tokio::spawn(accept(shared.clone(), socket, l.tls, admit)));
        }
        for task in accepting {
            let _ = task.await;
        }
        Ok(())
    })
}

/// How a listener admits logins.
struct Admission {
    users: Option<Arc<HashMap<String, String>>>,
    internal: Option<Arc<(String, String)>>,
    gate: Option<Arc<dyn Gatekeeper>>,
}

impl Admission {
    /// The grants a CONNECT's login earns, or the refusal it gets.
    fn check(
        &self,
        client_id: &str,
        login: Option<&rumqttc::mqttbytes::v4::Login>,
        counters: &BrokerCounters,
    ) -> Result<Grants, ConnectReturnCode> {
        if let (Some(l), Some(internal)) = (login, &self.internal) {
            if l.username == internal.0 {
                if same_secret(internal.1.as_bytes(), l.password.as_bytes()) {
                    return Ok(Grants::all(LoginKind::Coordinator, "coordinator"));
                }
                bump(&counters.refused_privileged);
                return Err(ConnectReturnCode::BadUserNamePassword);
            }
        }
        if let Some(gate) = &self.gate {
            return gate.login(client_id, login.map(|l| (l.username.as_str(), l.password.as_str()))).map_err(|r| {
                bump(&counters.refused_login);
                match r {
                    Refusal::BadLogin => ConnectReturnCode::BadUserNamePassword,
                    Refusal::NotAuthorized => ConnectReturnCode::NotAuthorized,
                    Refusal::Unavailable => ConnectReturnCode::ServiceUnavailable,
                }
            });
        }
        let open = |who: &str| Grants::all(LoginKind::Open, who);
        let Some(users) = &self.users else { return Ok(open(login.map_or("", |l| l.username.as_str()))) };
        match login {
            Some(l) if users.get(&l.username).is_some_and(|p| same_secret(p.as_bytes(), l.password.as_bytes())) => {
                Ok(open(&l.username))
            }
            Some(_) => Err(ConnectReturnCode::BadUserNamePassword),
            None => Err(ConnectReturnCode::NotAuthorized),
        }
    }
}

async fn accept(shared: Arc<Shared>, socket: tokio::net::TcpListener, tls: Option<TlsAcceptor>, admit: Arc<Admission>) {
    loop {
        let (stream, peer) = match socket.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, mostly: wait a little rather than spin.
                tracing::warn!(error = %e, "broker: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.counters.sockets.fetch_add(1, Ordering::Relaxed) >= shared.max_sockets {
            shared.counters.sockets.fetch_sub(1, Ordering::Relaxed);
            bump(&shared.counters.over_capacity);
            tracing::warn!(%peer, max = shared.max_sockets, "broker: too many sockets open; closed a new one");
            drop(stream);
            continue;
        }
        if shared.nodelay {
            let _ = stream.set_nodelay(true);
        }
        let (shared, tls, admit) = (shared.clone(), tls.clone(), admit.clone());
        tokio::spawn(async move {
            // Counted down however the connection ends.
            let _open = SocketCount(shared.clone());
            match tls {
                Some(acceptor) => match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => connection(shared, stream, peer, admit).await,
                    Ok(Err(e)) => {
                        bump(&shared.counters.refused);
                        tracing::debug!(%peer, error = %e, "broker: TLS handshake failed");
                    }
                    Err(_) => bump(&shared.counters.refused),
                },
                None => connection(shared, stream, peer, admit).await,
            }
        });
    }
}

/// One open socket, counted in [`BrokerCounters::sockets`] while it lives.
struct SocketCount(Arc<Shared>);

impl Drop for SocketCount {
    fn drop(&mut self) {
        self.0.counters.sockets.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection<S>(shared: Arc<Shared>, stream: S, addr: std::net::SocketAddr, admit: Arc<Admission>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(1024);
    let first = tokio::time::timeout(CONNECT_TIMEOUT, read_connect(&mut reader, &mut buf)).await;
    let connect = match first {
        Ok(Ok(Some(Packet::Connect(c)))) => c,
        Ok(Err(ReadError::Level(level))) => {
            bump(&shared.counters.refused_protocol);
            bump(&shared.counters.refused);
            tracing::warn!(
                peer = %addr,
                level,
                "broker: refused a CONNECT of MQTT protocol level {level} (this broker speaks MQTT 3.1.1, level 4; \
                 a Mosquitto bridge needs bridge_protocol_version mqttv311)"
            );
            return refuse_level(&mut writer, level).await;
        }
        _ => {
            bump(&shared.counters.refused);
            return;
        }
    };
    if connect.protocol != Protocol::V4 {
        return refuse(&shared, &mut writer, ConnectReturnCode::RefusedProtocolVersion).await;
    }
    if connect.last_will.as_ref().is_some_and(|w| check_topic(&w.topic).is_err()) {
        // A will it could never publish: a protocol error, no ConnAck.
        bump(&shared.counters.malformed);
        return;
    }
    if connect.client_id.is_empty() && !connect.clean_session {
        return refuse(&shared, &mut writer, ConnectReturnCode::BadClientId).await;
    }
    let grants = match admit.check(&connect.client_id, connect.login.as_ref(), &shared.counters) {
        Ok(grants) => grants,
        Err(code) => return refuse(&shared, &mut writer, code).await,
    };
    let Some(kind) = KindCount::take(&shared.counters, grants.kind, shared.max_sockets) else {
        bump(&shared.counters.refused_login);
        return refuse(&shared, &mut writer, ConnectReturnCode::ServiceUnavailable).await;
    };
    let mut connect = connect;
    if connect.last_will.as_ref().is_some_and(|w| !grants.may_will(&w.topic, w.retain)) {
        // A will on a topic not its own is dropped, not the connection: an
        // agent whose name another key holds can still ask to be enrolled.
        bump(&shared.counters.denied);
        connect.last_will = None;
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let client_id = if connect.client_id.is_empty() { format!("tf-anon-{id}") } else { connect.client_id.clone() };
    let privileged = grants.kind == LoginKind::Coordinator;
    let (peer, rx) = Peer::new(privileged, shared.clock.now_ms());
    let identity: Arc<str> = Arc::from(grants.identity.as_str());
    if !register(&shared, id, &client_id, &identity, &peer) {
        // Only the same login takes a client id over: no one can
        // disconnect another's connection by copying its client id.
        bump(&shared.counters.denied);
        return refuse(&shared, &mut writer, ConnectReturnCode::BadClientId).await;
    }
    bump(&shared.counters.accepted);
    shared.counters.connected.fetch_add(1, Ordering::Relaxed);
    let writing = tokio::spawn(write_loop(writer, rx, peer.clone(), shared.clock.clone()));

    let keep_alive = match connect.keep_alive {
        0 => IDLE_WITHOUT_KEEPALIVE,
        k => (Duration::from_secs(u64::from(k)) * 3 / 2).min(MAX_KEEPALIVE),
    };
    let room = ReadRoom { budget: (!privileged).then(|| shared.read_budget.clone()), held: None };
    let rate = (grants.kind == LoginKind::Stranger).then(Rate::new);
    let mut session = Client {
        shared: &shared,
        id,
        peer: &peer,
        filters: HashSet::new(),
        qos2: HashSet::new(),
        room,
        grants,
        gate: admit.gate.clone(),
        rate,
        published: false,
        kind,
    };
    let ended = session.read_loop(&mut reader, &mut buf, keep_alive).await;
    let filters = std::mem::take(&mut session.filters);

    let still_ours = forget(&shared, id, &client_id, &filters);
    shared.counters.connected.fetch_sub(1, Ordering::Relaxed);
    if ended != Ended::Disconnected && still_ours {
        if let Some(will) = connect.last_will {
            let mut p = Publish::from_bytes(will.topic, will.qos, will.message);
            p.retain = will.retain;
            route(&shared, p, false).await;
        }
    }
    peer.stop.cancel();
    let _ = writing.await;
}

/// Queues the ConnAck (first: nothing routed to the connection can be
/// written before it) and registers connection `id` under `client_id`,
/// closing the connection that held it, when that was the same `identity`.
/// False when another identity holds it.
fn register(shared: &Shared, id: ConnId, client_id: &str, identity: &Arc<str>, peer: &Peer) -> bool {
    let mut t = lock(&shared.tables);
    if t.clients.get(client_id).is_some_and(|(_, who)| who != identity) {
        return false;
    }
    // The queue is empty: the ConnAck waits for nothing.
    let ack = Packet::ConnAck(ConnAck::new(ConnectReturnCode::Success, false));
    let _ = try_offer(&shared.clock, peer, ack, true);
    let old = t.clients.insert(client_id.to_string(), (id, identity.clone()));
    if let Some(old) = old.and_then(|(old, _)| t.peers.get(&old).cloned()) {
        bump(&shared.counters.taken_over);
        // Its will is not published: the connection cleaning up
        // publishes one only while it still holds the client id.
        old.close();
    }
    t.peers.insert(id, peer.clone());
    true
}

/// Forgets connection `id` (`client_id`, subscribed to `filters`) once it
/// ended, and says whether it still held its client id: decided under the
/// lock, so one taken over (whatever else closed it first) publishes no
/// will, and an "offline" will never follows the client's new "online".
fn forget(shared: &Shared, id: ConnId, client_id: &str, filters: &HashSet<String>) -> bool {
    let mut t = lock(&shared.tables);
    for f in filters {
        t.subs.remove(f, id);
    }
    t.peers.remove(&id);
    let ours = t.clients.get(client_id).is_some_and(|(held, _)| *held == id);
    if ours {
        t.clients.remove(client_id);
    }
    ours
}

/// Answers a refused CONNECT and closes.
async fn refuse<W: AsyncWrite + Unpin>(shared: &Shared, writer: &mut W, code: ConnectReturnCode) {
    bump(&shared.counters.refused);
    let mut out = BytesMut::new();
    if Packet::ConnAck(ConnAck::new(code, false)).write(&mut out, usize::MAX).is_ok() {
        let _ = writer.write_all(&out).await;
        let _ = writer.flush().await;
    }
}

/// How a reader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The client said DISCONNECT: no will.
    Disconnected,
    /// The socket closed, failed, went quiet past its keep-alive, broke the protocol, or was closed from outside.
    Lost,
}

struct Client<'a> {
    shared: &'a Arc<Shared>,
    id: ConnId,
    peer: &'a Peer,
    filters: HashSet<String>,
    /// QoS 2 packet ids received and not yet released.
    qos2: HashSet<u16>,
    room: ReadRoom,
    /// What it may do.
    grants: Grants,
    /// Who decided that (asked again when a publish is refused).
    gate: Option<Arc<dyn Gatekeeper>>,
    /// A stranger's publishes.
    rate: Option<Rate>,
    /// A publish went through since the gatekeeper was last asked anew
    /// (a stranger's Hello: what enrols it).
    published: bool,
    /// Counts it among its kind of login while it lives.
    kind: KindCount,
}

impl Client<'_> {
    async fn read_loop<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        buf: &mut BytesMut,
        keep_alive: Duration,
    ) -> Ended {
        loop {
            // An idle connection holds a small buffer, not the largest packet it ever sent.
            if buf.is_empty() && buf.capacity() > 64 * 1024 {
                *buf = BytesMut::with_capacity(1024);
                self.room.release();
            }
            // A stranger sends a Hello at most: its packets are small.
            let max =
                if self.grants.kind == LoginKind::Stranger { STRANGER_MAX_PACKET } else { self.shared.max_payload };
            let next = read_packet(reader, buf, max, &mut self.room);
            let packet = tokio::select! {
                biased;
                () = self.peer.stop.cancelled() => return Ended::Lost,
                r = tokio::time::timeout(keep_alive, next) => match r {
                    Ok(r) => r,
                    Err(_) => {
                        bump(&self.shared.counters.idle_closed);
                        return Ended::Lost;
                    }
                },
            };
            let packet = match packet {
                Ok(Some(p)) => p,
                Ok(None) | Err(ReadError::Io) => return Ended::Lost,
                Err(ReadError::TooSlow) => {
                    bump(&self.shared.counters.malformed);
                    tracing::debug!("broker: a large packet arrived too slowly, connection closed");
                    return Ended::Lost;
                }
                Err(ReadError::Codec(e)) => {
                    bump(&self.shared.counters.malformed);
                    tracing::debug!(error = %e, "broker: malformed packet, connection closed");
                    return Ended::Lost;
                }
                Err(ReadError::Level(_)) => return Ended::Lost,
            };
            // (A close from outside is seen by the select above: checking
            // the token here, per packet, takes its lock every time.)
            match self.handle(packet).await {
                After::Go => {}
                After::Close => return Ended::Lost,
                After::Disconnect => return Ended::Disconnected,
            }
        }
    }

    /// Queues a packet for this connection itself: its acks wait like
    /// anything else queued for it, so a client that does not read its acks
    /// slows only itself.
    async fn own(&self, packet: Packet) -> bool {
        deliver_waiting(&self.shared.clock, self.peer, packet).await
    }

    async fn handle(&mut self, packet: Packet) -> After {
        let c = &self.shared.counters;
        match packet {
            Packet::Publish(mut p) => {
                if check_topic(&p.topic).is_err() {
                    bump(&c.malformed);
                    return After::Close;
                }
                // Small payloads get their own copy: a view into the read
                // buffer would keep the whole buffer alive while queued.
                if p.payload.len() < 64 * 1024 {
                    p.payload = bytes::Bytes::copy_from_slice(&p.payload);
                }
                let pkid = p.pkid;
                if !self.allowed(&p) {
                    // Acknowledged and dropped, as MQTT 3.1.1 leaves it to
                    // the server: a retried copy would be refused again.
                    return match p.qos {
                        QoS::AtMostOnce => After::Go,
                        QoS::AtLeastOnce => self.step(self.own(Packet::PubAck(PubAck::new(pkid))).await),
                        QoS::ExactlyOnce => self.step(self.own(Packet::PubRec(PubRec::new(pkid))).await),
                    };
                }
                match p.qos {
                    QoS::AtMostOnce => {
                        route(self.shared, p, self.peer.privileged).await;
                        After::Go
                    }
                    QoS::AtLeastOnce => {
                        route(self.shared, p, self.peer.privileged).await;
                        self.step(self.own(Packet::PubAck(PubAck::new(pkid))).await)
                    }
                    QoS::ExactlyOnce => {
                        // Routed once, on first sight of its id; released by PUBREL.
                        if self.qos2.insert(pkid) {
                            p.qos = QoS::AtLeastOnce;
                            route(self.shared, p, self.peer.privileged).await;
                        }
                        self.step(self.own(Packet::PubRec(PubRec::new(pkid))).await)
                    }
                }
            }
            Packet::PubRel(r) => {
                self.qos2.remove(&r.pkid);
                self.step(self.own(Packet::PubComp(PubComp::new(r.pkid))).await)
            }
            Packet::Subscribe(s) => self.subscribe(s).await,
            Packet::Unsubscribe(u) => {
                {
                    let mut t = lock(&self.shared.tables);
                    for f in &u.topics {
                        t.subs.remove(f, self.id);
                        self.filters.remove(f);
                    }
                }
                self.step(self.own(Packet::UnsubAck(UnsubAck::new(u.pkid))).await)
            }
            Packet::PingReq => self.step(self.own(Packet::PingResp).await),
            // Acks of what was delivered to it: nothing is kept to resend.
            Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) => After::Go,
            Packet::Disconnect => After::Disconnect,
            Packet::Connect(_) | Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                bump(&c.malformed);
                After::Close
            }
        }
    }

    /// A SUBSCRIBE: each distinct filter once (at most [`MAX_FILTERS`] held),
    /// and the retained messages that match, each once, at the highest QoS
    /// granted for it: at most [`MAX_RETAINED_PER_SUBSCRIBE`] for a client
    /// (a walk that stops there, so the tables' lock is held for a bounded
    /// time whatever is retained). The SubAck and those copies are offered
    /// under the lock, so that no live message of those topics, routed from
    /// then on, can overtake its older retained copy; a retained copy that
    /// does not fit a client's queue is dropped (counted).
    async fn subscribe(&mut self, s: rumqttc::mqttbytes::v4::Subscribe) -> After {
        let c = &self.shared.counters;
        let limit = if self.peer.privileged { usize::MAX } else { MAX_RETAINED_PER_SUBSCRIBE };
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut seen: HashMap<&str, SubscribeReasonCode> = HashMap::new();
        let mut snapshot: std::collections::BTreeMap<String, Publish> = std::collections::BTreeMap::new();
        let mut later: Vec<Packet> = Vec::new();
        {
            let mut t = lock(&self.shared.tables);
            for f in &s.filters {
                if let Some(code) = seen.get(f.path.as_str()) {
                    codes.push(*code);
                    continue;
                }
                let room = self.filters.len() < MAX_FILTERS || self.filters.contains(&f.path);
                let code = if check_filter(&f.path).is_err() || !room {
                    bump(&c.refused_filters);
                    SubscribeReasonCode::Failure
                } else if !self.grants.may_subscribe(&f.path) {
                    bump(&c.denied);
                    tracing::debug!(who = %self.grants.identity, filter = %f.path, "broker: subscription denied");
                    SubscribeReasonCode::Failure
                } else {
                    let granted = if f.qos == QoS::AtMostOnce { QoS::AtMostOnce } else { QoS::AtLeastOnce };
                    t.subs.add(&f.path, self.id, granted as u8);
                    self.filters.insert(f.path.clone());
                    for r in t.retained.matching(&f.path, limit.saturating_sub(snapshot.len())) {
                        let qos = lower(r.qos, granted);
                        match snapshot.get_mut(&r.topic) {
                            Some(kept) => kept.qos = if (qos as u8) > (kept.qos as u8) { qos } else { kept.qos },
                            None => {
                                let mut r = r.clone();
                                r.qos = qos;
                                snapshot.insert(r.topic.clone(), r);
                            }
                        }
                    }
                    SubscribeReasonCode::Success(granted)
                };
                seen.insert(f.path.as_str(), code);
                codes.push(code);
            }
            let suback = Packet::SubAck(SubAck::new(s.pkid, codes));
            match try_offer(&self.shared.clock, self.peer, suback, true) {
                Tried::Done(Offered::Queued) => {}
                Tried::Done(_) => return After::Close,
                Tried::Full(p) => later.push(p),
            }
            for packet in snapshot.into_values().map(Packet::Publish) {
                if !later.is_empty() {
                    later.push(packet);
                    continue;
                }
                match try_offer(&self.shared.clock, self.peer, packet, false) {
                    Tried::Done(Offered::Queued) => bump(&c.delivered),
                    Tried::Done(Offered::Dropped) => bump(&c.dropped),
                    Tried::Done(Offered::Closed) => return After::Close,
                    // The coordinator's own waits; a client's retained copies that do not fit are dropped.
                    Tried::Full(p) if self.peer.privileged => later.push(p),
                    Tried::Full(_) => bump(&c.dropped),
                }
            }
        }
        for packet in later {
            let publish = matches!(packet, Packet::Publish(_));
            if !self.own(packet).await {
                return After::Close;
            }
            if publish {
                bump(&c.delivered);
            }
        }
        After::Go
    }

    /// Whether its grants (asked anew once when they refuse) and, for a
    /// stranger, its rate let this publish through; counted when not.
    fn allowed(&mut self, p: &Publish) -> bool {
        let c = &self.shared.counters;
        if !self.grants.may_publish(&p.topic, p.retain) {
            // The gatekeeper (a store read) is asked anew once after each
            // publish that went through (a Hello, which may have enrolled
            // it), else at a stranger's rate: a flood of refused
            // publishes costs the store one read a second, not one each.
            let after_publish = std::mem::take(&mut self.published);
            if !after_publish && self.rate.as_mut().is_some_and(|r| !r.take()) {
                bump(&c.denied);
                bump(&c.rate_limited);
                return false;
            }
            match self.gate.as_ref().and_then(|g| g.regrant(&self.grants)) {
                Some(grants) if grants.may_publish(&p.topic, p.retain) => {
                    self.kind.moved(grants.kind);
                    tracing::debug!(from = %self.grants.identity, to = %grants.identity, "broker: login regranted");
                    self.rate = (grants.kind == LoginKind::Stranger).then(Rate::new);
                    self.grants = grants;
                    return true;
                }
                _ => {
                    bump(&c.denied);
                    tracing::debug!(who = %self.grants.identity, topic = %p.topic, "broker: publish denied");
                    return false;
                }
            }
        }
        if self.rate.as_mut().is_some_and(|r| !r.take()) {
            bump(&c.rate_limited);
            return false;
        }
        self.published = true;
        true
    }

    fn step(&self, queued: bool) -> After {
        if queued {
            After::Go
        } else {
            After::Close
        }
    }
}

/// What a reader does after a packet.
enum After {
    Go,
    Disconnect,
    Close,
}

/// The lower of two QoS levels.
fn lower(a: QoS, b: QoS) -> QoS {
    if (a as u8) <= (b as u8) {
        a
    } else {
        b
    }
}

/// What a retained message costs the broker: its payload and topic, and
/// a node per level of its topic in the tree.
fn retained_cost(r: &Publish) -> usize {
    r.payload.len() + 2 * r.topic.len() + RETAINED_LEVEL_BYTES * (1 + r.topic.matches('/').count())
}

/// Keeps (or forgets) a retained publish, within [`MAX_RETAINED`] and [`MAX_RETAINED_BYTES`].
fn retain(t: &mut Tables, p: &Publish, c: &BrokerCounters) {
    if p.payload.is_empty() {
        t.retained.set(&p.topic, None, retained_cost);
    } else {
        let old = t.retained.get(&p.topic).map(retained_cost);
        let new = retained_cost(p);
        let count_ok = old.is_some() || t.retained.len() < MAX_RETAINED;
        if count_ok && t.retained.bytes() - old.unwrap_or(0) + new <= MAX_RETAINED_BYTES {
            // Its own copy: a view into the read buffer would keep
            // the whole buffer (and whatever else came with it) alive.
            let mut kept = p.clone();
            kept.payload = bytes::Bytes::copy_from_slice(&p.payload);
            t.retained.set(&p.topic, Some((kept, new)), retained_cost);
        } else {
            bump(&c.retained_refused);
        }
    }
    c.retained.store(t.retained.len() as u64, Ordering::Relaxed);
    c.retained_bytes.store(t.retained.bytes() as u64, Ordering::Relaxed);
}

/// Routes a publish to its subscribers, and keeps it when it is retained.
/// A publish `from_coordinator` never waits on a client's queue; a
/// client's waits at most a grace (see [`super::queue`]).
async fn route(shared: &Arc<Shared>, mut p: Publish, from_coordinator: bool) {
    let c = &shared.counters;
    bump(&c.received);
    let targets: Vec<(Peer, u8)> = {
        let mut t = lock(&shared.tables);
        if p.retain {
            retain(&mut t, &p, c);
        }
        t.subs.matching(&p.topic).into_iter().filter_map(|(id, q)| Some((t.peers.get(&id)?.clone(), q))).collect()
    };
    // Live copies go out without the retain flag (MQTT 3.1.1, 3.3.1.3).
    p.retain = false;
    p.dup = false;
    p.pkid = 0;
    let qos = p.qos;
    for (peer, granted) in targets {
        let mut copy = p.clone();
        copy.qos = if granted == 0 { QoS::AtMostOnce } else { lower(qos, QoS::AtLeastOnce) };
        if offer(&shared.clock, &peer, Packet::Publish(copy), !from_coordinator).await == Offered::Queued {
            bump(&c.delivered);
        }
    }
}

/// The broker's packet handling as a fuzz target drives it (`fuzz/`).
#[cfg(feature = "fuzzing")]
#[path = "fuzz.rs"]
mod fuzz;
#[cfg(feature = "fuzzing")]
pub use fuzz::fuzz_connection;
