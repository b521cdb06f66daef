//! The embedded broker's connections: MQTT 3.1.1 over TCP or TLS, on a
//! runtime of its own (its own thread), so a busy engine never delays a
//! packet and a flood of packets never starves the engine.
//!
//! Each connection is two tasks: a reader that authenticates the CONNECT,
//! then routes what the client publishes into the queues of the
//! connections subscribed to it ([`super::routes`]), and a writer that
//! drains its own queue into the socket, many packets per write. The
//! queues are bounded: a publisher whose subscriber is behind waits (the
//! wait reaches the publisher through TCP), and a subscriber that has taken
//! nothing for [`STALL`], or kept its queue full that long while taking a
//! trickle, is disconnected (its client reconnects and its state is
//! resynchronised by the protocol), so one stuck client cannot hold memory
//! or hold others up for long. Nothing is dropped silently.
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
use rumqttc::mqttbytes::{Error as CodecError, Protocol, QoS};
use rumqttc::tokio_rustls::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;

use super::routes::{check_filter, check_topic, ConnId, Retained, Subscriptions};

/// A subscriber that takes nothing from its queue for this long is disconnected.
pub const STALL: Duration = Duration::from_secs(20);
/// KiB of packets queued for one connection before its publishers wait
/// (a packet costs 1 plus a unit per KiB of payload).
const QUEUE_KIB: usize = 16 * 1024;
/// A CONNECT must arrive this soon after the TCP (and TLS) handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Retained messages kept at most (beyond it a retained publish is routed but not kept).
const MAX_RETAINED: usize = 200_000;
/// Bytes of retained payload kept at most.
const MAX_RETAINED_BYTES: usize = 256 * 1024 * 1024;
/// What a writer gathers into one write.
const WRITE_BATCH: usize = 64 * 1024;
/// The largest CONNECT taken (before a client has logged in, it holds no
/// more than this of the broker's memory; Tunefleet's are a few hundred bytes).
const MAX_CONNECT_BYTES: usize = 64 * 1024;
/// Subscriptions one connection may hold (Tunefleet's clients hold 2).
const MAX_FILTERS: usize = 64;
/// Sockets open at once, logged in or not (10,000 agents by default, room
/// for reconnects and a coordinator); past it a new socket is closed at once.
pub const MAX_SOCKETS: u64 = 20_000;

/// What the broker has counted since it started.
#[derive(Debug, Default)]
pub struct BrokerCounters {
    /// Connections open now (logged in).
    pub connected: AtomicU64,
    /// Sockets open now, logged in or not.
    pub sockets: AtomicU64,
    /// Sockets closed at once: [`MAX_SOCKETS`] were open.
    pub over_capacity: AtomicU64,
    /// Subscriptions refused (a bad filter, or more than a connection may hold).
    pub refused_filters: AtomicU64,
    /// Connections that logged in.
    pub accepted: AtomicU64,
    /// CONNECTs refused (bad login, a protocol other than 3.1.1, no CONNECT in time, TLS failed).
    pub refused: AtomicU64,
    /// Connections closed for a malformed or oversized packet or a bad topic.
    pub malformed: AtomicU64,
    /// Subscribers disconnected for taking nothing from their queue for [`STALL`].
    pub stalled: AtomicU64,
    /// A client id connecting again while connected (the old connection closed).
    pub taken_over: AtomicU64,
    /// Retained publishes not kept (the retained store full).
    pub retained_refused: AtomicU64,
    /// Messages received from publishers.
    pub received: AtomicU64,
    /// Copies queued to subscribers.
    pub delivered: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A connection as others see it: where to queue its messages.
#[derive(Clone)]
struct Peer {
    tx: mpsc::UnboundedSender<Queued>,
    /// What may still be queued, in [`QUEUE_KIB`] units.
    budget: Arc<Semaphore>,
    /// Cancelled to close it from outside (taken over, stuck) or when its writer ends.
    stop: CancellationToken,
    /// Milliseconds since the broker started at which its writer last took
    /// from its queue or finished a write.
    progress: Arc<AtomicU64>,
    /// Bytes its writer has written.
    taken: Arc<AtomicU64>,
    /// When its queue was last found full with no room (ms + 1; 0: it had
    /// room since), and what it had taken then: a subscriber that keeps its
    /// queue full while taking a trickle is as stuck as one taking nothing.
    full_since: Arc<AtomicU64>,
    taken_at_full: Arc<AtomicU64>,
}

/// What a subscriber whose queue stays full must take per [`STALL`] not to be
/// disconnected: a queue's worth (a working coordinator takes megabytes a
/// second; an agent's queue never fills).
pub(super) const MIN_DRAIN_BYTES: u64 = QUEUE_KIB as u64 * 1024;

/// Whether a subscriber is stuck: its writer took nothing for `stall`, or
/// its queue has stayed full for `stall` while it took less than
/// [`MIN_DRAIN_BYTES`] (a client reading a trickle to stay connected).
pub(super) fn stuck(idle: Duration, full_for: Duration, drained: u64, stall: Duration) -> bool {
    idle >= stall || (full_for >= stall && drained < MIN_DRAIN_BYTES)
}

impl Peer {
    fn close(&self) {
        self.stop.cancel();
    }
}

#[derive(Default)]
struct Tables {
    subs: Subscriptions,
    retained: Retained<Publish>,
    peers: HashMap<ConnId, Peer>,
    clients: HashMap<String, ConnId>,
}

/// The broker's state, shared by every connection.
pub struct Shared {
    tables: Mutex<Tables>,
    next_id: AtomicU64,
    started: Instant,
    pub counters: Arc<BrokerCounters>,
    max_payload: usize,
    nodelay: bool,
    stall: Duration,
    max_sockets: u64,
}

/// A packet in a connection's queue, holding its share of the queue's budget until written.
type Queued = (Packet, OwnedSemaphorePermit);

/// A packet's share of a queue's budget.
fn cost(packet: &Packet) -> u32 {
    1 + u32::try_from(packet.size() / 1024).unwrap_or(u32::MAX)
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
        Arc::new(Shared {
            tables: Mutex::new(Tables::default()),
            next_id: AtomicU64::new(1),
            started: Instant::now(),
            counters: Arc::default(),
            max_payload,
            nodelay,
            stall,
            max_sockets,
        })
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// One listening socket and how it admits clients.
pub struct Listener {
    pub socket: std::net::TcpListener,
    pub tls: Option<TlsAcceptor>,
    /// username -> password; `None` runs it open.
    pub users: Option<Arc<HashMap<String, String>>>,
}

/// Serves `listeners` on a runtime of its own, on the calling thread, forever.
pub fn serve(shared: Arc<Shared>, listeners: Vec<Listener>) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().thread_name("tunefleet-broker").enable_all().build()?;
    runtime.block_on(async move {
        let mut accepting = Vec::new();
        for l in listeners {
            l.socket.set_nonblocking(true)?;
            let socket = tokio::net::TcpListener::from_std(l.socket)?;
            accepting.push(tokio::spawn(accept(shared.clone(), socket, l.tls, l.users)));
        }
        for task in accepting {
            let _ = task.await;
        }
        Ok(())
    })
}

async fn accept(
    shared: Arc<Shared>,
    socket: tokio::net::TcpListener,
    tls: Option<TlsAcceptor>,
    users: Option<Arc<HashMap<String, String>>>,
) {
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
        let (shared, tls, users) = (shared.clone(), tls.clone(), users.clone());
        tokio::spawn(async move {
            // Counted down however the connection ends.
            let _open = SocketCount(shared.clone());
            match tls {
                Some(acceptor) => match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(stream)) => connection(shared, stream, users).await,
                    Ok(Err(e)) => {
                        bump(&shared.counters.refused);
                        tracing::debug!(%peer, error = %e, "broker: TLS handshake failed");
                    }
                    Err(_) => bump(&shared.counters.refused),
                },
                None => connection(shared, stream, users).await,
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

/// Reads one packet, waiting for more bytes as needed.
async fn read_packet<R: AsyncRead + Unpin>(
    stream: &mut R,
    buf: &mut BytesMut,
    max: usize,
) -> Result<Option<Packet>, ReadError> {
    loop {
        match Packet::read(buf, max) {
            Ok(p) => return Ok(Some(p)),
            Err(CodecError::InsufficientBytes(n)) => {
                buf.reserve(n.max(1024));
                if stream.read_buf(buf).await.map_err(|_| ReadError::Io)? == 0 {
                    return Ok(None);
                }
            }
            Err(e) => return Err(ReadError::Codec(e)),
        }
    }
}

#[derive(Debug)]
enum ReadError {
    /// The socket failed (reset, TLS error): the connection is lost either way.
    Io,
    Codec(CodecError),
}

async fn connection<S>(shared: Arc<Shared>, stream: S, users: Option<Arc<HashMap<String, String>>>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(1024);
    let first = tokio::time::timeout(CONNECT_TIMEOUT, read_packet(&mut reader, &mut buf, MAX_CONNECT_BYTES)).await;
    let connect = match first {
        Ok(Ok(Some(Packet::Connect(c)))) => c,
        _ => {
            bump(&shared.counters.refused);
            return;
        }
    };
    if connect.protocol != Protocol::V4 {
        return refuse(&shared, &mut writer, ConnectReturnCode::RefusedProtocolVersion).await;
    }
    if let Some(users) = &users {
        let ok = connect
            .login
            .as_ref()
            .is_some_and(|l| users.get(&l.username).is_some_and(|p| same_secret(p.as_bytes(), l.password.as_bytes())));
        if !ok {
            let code = if connect.login.is_some() {
                ConnectReturnCode::BadUserNamePassword
            } else {
                ConnectReturnCode::NotAuthorized
            };
            return refuse(&shared, &mut writer, code).await;
        }
    }
    if connect.last_will.as_ref().is_some_and(|w| check_topic(&w.topic).is_err()) {
        // A will it could never publish: a protocol error, no ConnAck.
        bump(&shared.counters.malformed);
        return;
    }
    if connect.client_id.is_empty() && !connect.clean_session {
        return refuse(&shared, &mut writer, ConnectReturnCode::BadClientId).await;
    }
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let client_id = if connect.client_id.is_empty() { format!("tf-anon-{id}") } else { connect.client_id.clone() };
    let (tx, rx) = mpsc::unbounded_channel();
    let peer = Peer {
        tx,
        budget: Arc::new(Semaphore::new(QUEUE_KIB)),
        stop: CancellationToken::new(),
        progress: Arc::new(AtomicU64::new(shared.now_ms())),
        taken: Arc::default(),
        full_since: Arc::default(),
        taken_at_full: Arc::default(),
    };
    // The ConnAck is the first thing queued: nothing routed to this
    // connection can be written before it.
    if !deliver(&shared, &peer, Packet::ConnAck(ConnAck::new(ConnectReturnCode::Success, false))).await {
        return;
    }
    {
        let mut t = lock(&shared.tables);
        if let Some(old) = t.clients.insert(client_id.clone(), id).and_then(|old| t.peers.get(&old).cloned()) {
            bump(&shared.counters.taken_over);
            // Its will is not published: the connection cleaning up
            // publishes one only while it still holds the client id.
            old.close();
        }
        t.peers.insert(id, peer.clone());
    }
    bump(&shared.counters.accepted);
    shared.counters.connected.fetch_add(1, Ordering::Relaxed);
    let writing = tokio::spawn(write_loop(writer, rx, peer.clone(), shared.clone()));

    let keep_alive = (connect.keep_alive > 0).then(|| Duration::from_millis(u64::from(connect.keep_alive) * 1500));
    let mut session = Session { shared: &shared, id, peer: &peer, filters: HashSet::new(), qos2: HashSet::new() };
    let ended = session.read_loop(&mut reader, &mut buf, keep_alive).await;
    let filters = std::mem::take(&mut session.filters);

    let still_ours = forget(&shared, id, &client_id, &filters);
    shared.counters.connected.fetch_sub(1, Ordering::Relaxed);
    if ended != Ended::Disconnected && still_ours {
        if let Some(will) = connect.last_will {
            let mut p = Publish::from_bytes(will.topic, will.qos, will.message);
            p.retain = will.retain;
            route(&shared, p).await;
        }
    }
    peer.stop.cancel();
    let _ = writing.await;
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
    let ours = t.clients.get(client_id) == Some(&id);
    if ours {
        t.clients.remove(client_id);
    }
    ours
}

/// Compares a password in time that does not depend on where it differs
/// (only on the lengths), so its bytes cannot be found one by one by timing.
pub(super) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
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

struct Session<'a> {
    shared: &'a Arc<Shared>,
    id: ConnId,
    peer: &'a Peer,
    filters: HashSet<String>,
    /// QoS 2 packet ids received and not yet released.
    qos2: HashSet<u16>,
}

impl Session<'_> {
    async fn read_loop<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut R,
        buf: &mut BytesMut,
        keep_alive: Option<Duration>,
    ) -> Ended {
        loop {
            // An idle connection holds a small buffer, not the largest packet it ever sent.
            if buf.is_empty() && buf.capacity() > 64 * 1024 {
                *buf = BytesMut::with_capacity(1024);
            }
            let next = read_packet(reader, buf, self.shared.max_payload);
            let packet = tokio::select! {
                biased;
                () = self.peer.stop.cancelled() => return Ended::Lost,
                r = async {
                    match keep_alive {
                        Some(k) => tokio::time::timeout(k, next).await.unwrap_or(Ok(None)),
                        None => next.await,
                    }
                } => r,
            };
            let packet = match packet {
                Ok(Some(p)) => p,
                Ok(None) | Err(ReadError::Io) => return Ended::Lost,
                Err(ReadError::Codec(e)) => {
                    bump(&self.shared.counters.malformed);
                    tracing::debug!(error = %e, "broker: malformed packet, connection closed");
                    return Ended::Lost;
                }
            };
            // (A close from outside is seen by the select above: checking
            // the token here, per packet, takes its lock every time.)
            match self.handle(packet).await {
                Step::Go => {}
                Step::Close => return Ended::Lost,
                Step::Disconnect => return Ended::Disconnected,
            }
        }
    }

    /// Queues a packet for this connection itself: its acks wait like
    /// anything else queued for it, so a client that does not read its acks
    /// slows only itself.
    async fn own(&self, packet: Packet) -> bool {
        deliver(self.shared, self.peer, packet).await
    }

    async fn handle(&mut self, packet: Packet) -> Step {
        let c = &self.shared.counters;
        match packet {
            Packet::Publish(mut p) => {
                if check_topic(&p.topic).is_err() {
                    bump(&c.malformed);
                    return Step::Close;
                }
                // Small payloads get their own copy: a view into the read
                // buffer would keep the whole buffer alive while queued.
                if p.payload.len() < 64 * 1024 {
                    p.payload = bytes::Bytes::copy_from_slice(&p.payload);
                }
                let pkid = p.pkid;
                match p.qos {
                    QoS::AtMostOnce => {
                        route(self.shared, p).await;
                        Step::Go
                    }
                    QoS::AtLeastOnce => {
                        route(self.shared, p).await;
                        self.step(self.own(Packet::PubAck(PubAck::new(pkid))).await)
                    }
                    QoS::ExactlyOnce => {
                        // Routed once, on first sight of its id; released by PUBREL.
                        if self.qos2.insert(pkid) {
                            p.qos = QoS::AtLeastOnce;
                            route(self.shared, p).await;
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
            Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) => Step::Go,
            Packet::Disconnect => Step::Disconnect,
            Packet::Connect(_) | Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                bump(&c.malformed);
                Step::Close
            }
        }
    }

    /// A SUBSCRIBE: each distinct filter once (at most [`MAX_FILTERS`] held),
    /// each retained message that matches once, at the highest QoS granted
    /// for it. The SubAck and those copies are queued under the tables' lock
    /// while the queue has room, so that no live message of those topics,
    /// routed from then on, can overtake its older retained copy; the rest
    /// (a queue already full) waits like any delivery.
    async fn subscribe(&mut self, s: rumqttc::mqttbytes::v4::Subscribe) -> Step {
        let c = &self.shared.counters;
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
                } else {
                    let granted = if f.qos == QoS::AtMostOnce { QoS::AtMostOnce } else { QoS::AtLeastOnce };
                    t.subs.add(&f.path, self.id, granted as u8);
                    self.filters.insert(f.path.clone());
                    for r in t.retained.matching(&f.path) {
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
            let packets = std::iter::once(Packet::SubAck(SubAck::new(s.pkid, codes)))
                .chain(snapshot.into_values().map(Packet::Publish));
            for packet in packets {
                if !later.is_empty() {
                    later.push(packet);
                    continue;
                }
                let n = cost(&packet).min(QUEUE_KIB as u32);
                match self.peer.budget.clone().try_acquire_many_owned(n) {
                    Ok(permit) => {
                        if matches!(packet, Packet::Publish(_)) {
                            bump(&c.delivered);
                        }
                        if self.peer.tx.send((packet, permit)).is_err() {
                            return Step::Close;
                        }
                    }
                    Err(_) => later.push(packet),
                }
            }
        }
        for packet in later {
            let publish = matches!(packet, Packet::Publish(_));
            if !self.own(packet).await {
                return Step::Close;
            }
            if publish {
                bump(&c.delivered);
            }
        }
        Step::Go
    }

    fn step(&self, queued: bool) -> Step {
        if queued {
            Step::Go
        } else {
            Step::Close
        }
    }
}

/// What a reader does after a packet.
enum Step {
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

/// Routes a publish to its subscribers, and keeps it when it is retained.
async fn route(shared: &Arc<Shared>, mut p: Publish) {
    let c = &shared.counters;
    bump(&c.received);
    let targets: Vec<(Peer, u8)> = {
        let mut t = lock(&shared.tables);
        if p.retain {
            let size_of = |r: &Publish| r.payload.len() + r.topic.len();
            if p.payload.is_empty() {
                t.retained.set(&p.topic, None, size_of);
            } else {
                let old = t.retained.get(&p.topic).map(size_of);
                let new = size_of(&p);
                let count_ok = old.is_some() || t.retained.len() < MAX_RETAINED;
                if count_ok && t.retained.bytes() - old.unwrap_or(0) + new <= MAX_RETAINED_BYTES {
                    // Its own copy: a view into the read buffer would keep
                    // the whole buffer (and whatever else came with it) alive.
                    let mut kept = p.clone();
                    kept.payload = bytes::Bytes::copy_from_slice(&p.payload);
                    t.retained.set(&p.topic, Some((kept, new)), size_of);
                } else {
                    bump(&c.retained_refused);
                }
            }
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
        if deliver(shared, &peer, Packet::Publish(copy)).await {
            bump(&c.delivered);
        }
    }
}

/// Queues `packet` for `peer`, waiting while its queue is full; false when
/// it is gone or was disconnected for stalling.
async fn deliver(shared: &Arc<Shared>, peer: &Peer, packet: Packet) -> bool {
    let n = cost(&packet).min(QUEUE_KIB as u32);
    let permit = match peer.budget.clone().try_acquire_many_owned(n) {
        Ok(p) => {
            peer.full_since.store(0, Ordering::Relaxed);
            p
        }
        Err(TryAcquireError::Closed) => return false,
        Err(TryAcquireError::NoPermits) => loop {
            if peer.full_since.load(Ordering::Relaxed) == 0 {
                peer.taken_at_full.store(peer.taken.load(Ordering::Relaxed), Ordering::Relaxed);
                peer.full_since.store(shared.now_ms() + 1, Ordering::Relaxed);
            }
            match tokio::time::timeout(Duration::from_secs(1), peer.budget.clone().acquire_many_owned(n)).await {
                Ok(Ok(p)) => break p,
                Ok(Err(_)) => return false,
                Err(_) => {
                    if peer.stop.is_cancelled() {
                        return false;
                    }
                    let now = shared.now_ms();
                    let idle = now.saturating_sub(peer.progress.load(Ordering::Relaxed));
                    let full_since = peer.full_since.load(Ordering::Relaxed);
                    let full_for = if full_since == 0 { 0 } else { now.saturating_sub(full_since - 1) };
                    let drained =
                        peer.taken.load(Ordering::Relaxed).saturating_sub(peer.taken_at_full.load(Ordering::Relaxed));
                    if stuck(Duration::from_millis(idle), Duration::from_millis(full_for), drained, shared.stall) {
                        bump(&shared.counters.stalled);
                        tracing::warn!(
                            stalled_s = shared.stall.as_secs(),
                            drained_bytes = drained,
                            "broker: a subscriber took (almost) nothing from its full queue; disconnected"
                        );
                        peer.close();
                        return false;
                    }
                }
            }
        },
    };
    peer.tx.send((packet, permit)).is_ok()
}

/// Drains a connection's queue into its socket, many packets per write.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    peer: Peer,
    shared: Arc<Shared>,
) {
    let mut out = BytesMut::with_capacity(1024);
    let mut held: Vec<OwnedSemaphorePermit> = Vec::new();
    let mut pkid: u16 = 0;
    let mut encode = |packet: Packet, out: &mut BytesMut| {
        let packet = match packet {
            Packet::Publish(mut p) if p.qos != QoS::AtMostOnce => {
                pkid = pkid.checked_add(1).unwrap_or(1);
                p.pkid = pkid;
                Packet::Publish(p)
            }
            other => other,
        };
        packet.write(out, usize::MAX).is_ok()
    };
    'serve: loop {
        let first = tokio::select! {
            () = peer.stop.cancelled() => break,
            p = rx.recv() => p,
        };
        let Some((first, permit)) = first else { break };
        peer.progress.store(shared.now_ms(), Ordering::Relaxed);
        held.push(permit);
        if !encode(first, &mut out) {
            break;
        }
        while out.len() < WRITE_BATCH {
            let Ok((p, permit)) = rx.try_recv() else { break };
            held.push(permit);
            if !encode(p, &mut out) {
                break 'serve;
            }
        }
        let wrote = tokio::select! {
            () = peer.stop.cancelled() => break,
            r = async {
                writer.write_all(&out).await?;
                writer.flush().await
            } => r,
        };
        if wrote.is_err() {
            break;
        }
        peer.progress.store(shared.now_ms(), Ordering::Relaxed);
        peer.taken.fetch_add(out.len() as u64, Ordering::Relaxed);
        held.clear();
        out.clear();
        if out.capacity() > 4 * WRITE_BATCH {
            out = BytesMut::with_capacity(1024);
        }
    }
    // The reader sees this and ends the connection; publishers waiting on
    // the budget give up.
    peer.stop.cancel();
    peer.budget.close();
    // Bounded: a TLS close waits to write its alert, and a client that reads
    // nothing would hold this socket (and its place) for ever.
    let _ = tokio::time::timeout(Duration::from_secs(2), writer.shutdown()).await;
}
