//! Each connection's outgoing queue, and the one memory budget every queue
//! draws from.
//!
//! A copy routed to a connection is queued only when its queue and the
//! process's budget have room: the coordinator's publishes never wait on
//! another connection's reader, and a client's wait at most [`GRACE`] once,
//! while a subscriber that was keeping up catches up with a burst; after
//! that the subscriber is behind, and no publisher waits for it again
//! until its queue had room. A subscriber that is behind loses what does
//! not fit: a QoS 0 copy is dropped (counted), a QoS 1 copy closes the
//! connection (counted; its client reconnects and the protocol
//! resynchronises, nothing is lost silently). The coordinator's own
//! connection is the one exception: it is the fleet's only reader of
//! every agent's results, so publishers to it wait (bounded by [`STALL`]),
//! which paces the agents, never the coordinator.
//!
//! Costs are counted in KiB units: a packet costs 1 plus a unit per KiB of
//! its encoded size, which covers the queue node, the packet's struct and
//! its topic as well as its payload.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rumqttc::mqttbytes::v4::Packet;
use rumqttc::mqttbytes::QoS;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio_util::sync::CancellationToken;

use super::counters::{bump, BrokerCounters};

/// A subscriber that takes nothing from its queue for this long is disconnected.
pub const STALL: Duration = Duration::from_secs(20);
/// KiB the coordinator's own connection may have queued (it reads megabytes a second).
pub(crate) const PRIVILEGED_QUEUE_KIB: usize = 32 * 1024;
/// KiB any other connection may have queued: room for the largest message
/// twice over (an agent's queue holds a few small assignments).
pub(crate) const CLIENT_QUEUE_KIB: usize = 3 * 1024;
/// KiB all clients' queues may hold together (the coordinator's is apart).
pub(crate) const CLIENTS_QUEUED_KIB: u64 = 128 * 1024;
/// Of [`CLIENTS_QUEUED_KIB`], what only a connection with less than
/// [`LIGHT_KIB`] queued may use: a crowd of full queues cannot keep an
/// honest agent's next assignment out.
pub(crate) const RESERVE_KIB: u64 = 32 * 1024;
/// A connection with less than this queued is light (it may use the reserve).
pub(crate) const LIGHT_KIB: u32 = 256;
/// How long a client's publish may wait for a subscriber that was keeping
/// up to make room (once; see the module's doc).
pub(crate) const GRACE: Duration = Duration::from_millis(500);
/// What a writer gathers into one write.
const WRITE_BATCH: usize = 64 * 1024;

/// What the queues need of the broker: its counters, its clock and how
/// long a subscriber may take nothing.
pub(crate) struct Clock {
    pub counters: Arc<BrokerCounters>,
    pub started: Instant,
    pub stall: Duration,
}

impl Clock {
    /// Milliseconds since the broker started.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// A connection as others see it: where to queue its messages.
#[derive(Clone)]
pub(crate) struct Peer {
    pub tx: mpsc::UnboundedSender<Queued>,
    /// What may still be queued, in KiB units.
    pub budget: Arc<Semaphore>,
    /// The size of `budget` when empty.
    pub capacity: u32,
    /// The coordinator's own connection: its publishers wait rather than lose copies.
    pub privileged: bool,
    /// Cancelled to close it from outside (taken over, stuck) or when its writer ends.
    pub stop: CancellationToken,
    /// Milliseconds since the broker started at which its writer last took
    /// from its queue or finished a write.
    pub progress: Arc<AtomicU64>,
    /// Bytes its writer has written.
    pub taken: Arc<AtomicU64>,
    /// When its queue was last found full with no room (ms + 1; 0: it had
    /// room since), and what it had taken then: a subscriber that keeps its
    /// queue full while taking a trickle is as stuck as one taking nothing.
    pub full_since: Arc<AtomicU64>,
    pub taken_at_full: Arc<AtomicU64>,
    /// It used up a [`GRACE`] without making room: nobody waits for it
    /// until an offer finds room at once.
    pub behind: Arc<AtomicBool>,
}

impl Peer {
    pub fn new(privileged: bool, now_ms: u64) -> (Peer, mpsc::UnboundedReceiver<Queued>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let capacity = if privileged { PRIVILEGED_QUEUE_KIB } else { CLIENT_QUEUE_KIB };
        let peer = Peer {
            tx,
            budget: Arc::new(Semaphore::new(capacity)),
            capacity: capacity as u32,
            privileged,
            stop: CancellationToken::new(),
            progress: Arc::new(AtomicU64::new(now_ms)),
            taken: Arc::default(),
            full_since: Arc::default(),
            taken_at_full: Arc::default(),
            behind: Arc::default(),
        };
        (peer, rx)
    }

    pub fn close(&self) {
        self.stop.cancel();
    }

    /// KiB queued now.
    fn queued_kib(&self) -> u32 {
        self.capacity.saturating_sub(self.budget.available_permits() as u32)
    }
}

/// A packet's hold on the budgets, given back when it is written (or dropped).
pub(crate) struct Hold {
    _own: OwnedSemaphorePermit,
    /// KiB taken from the clients' shared budget (0 for the coordinator's).
    shared_kib: u64,
    queued: Arc<AtomicU64>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.shared_kib > 0 {
            self.queued.fetch_sub(self.shared_kib, Ordering::Relaxed);
        }
    }
}

/// A packet in a connection's queue, holding its share of the budgets until written.
pub(crate) type Queued = (Packet, Hold);

/// A packet's share of a queue's budget, in KiB units.
pub(crate) fn cost(packet: &Packet) -> u32 {
    1 + u32::try_from(packet.size() / 1024).unwrap_or(u32::MAX)
}

/// Takes `kib` from the clients' shared budget for a connection with
/// `queued` KiB already queued; false when there is no room for it.
fn take_shared(total: &AtomicU64, kib: u64, queued: u32) -> bool {
    let limit = if queued < LIGHT_KIB { CLIENTS_QUEUED_KIB } else { CLIENTS_QUEUED_KIB - RESERVE_KIB };
    total.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| (now + kib <= limit).then_some(now + kib)).is_ok()
}

/// Takes `n` KiB of the clients' shared budget for `peer`, which holds a
/// permit for them already; false when the budget has no room for it.
fn take_for(shared: &Clock, peer: &Peer, n: u32) -> bool {
    take_shared(&shared.counters.queued_kib, u64::from(n), peer.queued_kib().saturating_sub(n))
}

/// Puts `packet` in `peer`'s queue with its hold on the budgets (`shared_kib`
/// of the clients' shared one).
fn enqueue(shared: &Clock, peer: &Peer, packet: Packet, permit: OwnedSemaphorePermit, shared_kib: u32) -> Offered {
    let hold = Hold { _own: permit, shared_kib: u64::from(shared_kib), queued: shared.counters.queued_kib.clone() };
    if peer.tx.send((packet, hold)).is_ok() {
        Offered::Queued
    } else {
        Offered::Closed
    }
}

/// What became of a copy offered to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offered {
    Queued,
    /// A QoS 0 copy that did not fit: dropped, the connection kept.
    Dropped,
    /// The connection is gone, or was closed for being too far behind.
    Closed,
}

/// Queues `packet` for `peer`: at once, or after waiting at most
/// [`GRACE`] when `may_wait` (a client's publish to a subscriber that was
/// keeping up); the coordinator's own connection waits as long as it must
/// (see the module's doc).
pub(crate) async fn offer(shared: &Clock, peer: &Peer, packet: Packet, may_wait: bool) -> Offered {
    let packet = match try_offer(shared, peer, packet, false) {
        Tried::Done(offered) => {
            if offered == Offered::Queued {
                peer.behind.store(false, Ordering::Relaxed);
            }
            return offered;
        }
        Tried::Full(packet) => packet,
    };
    if peer.privileged {
        return if deliver_waiting(shared, peer, packet).await { Offered::Queued } else { Offered::Closed };
    }
    if may_wait && !peer.behind.load(Ordering::Relaxed) {
        let n = cost(&packet).min(peer.capacity);
        if let Ok(Ok(permit)) = tokio::time::timeout(GRACE, peer.budget.clone().acquire_many_owned(n)).await {
            if take_for(shared, peer, n) {
                return enqueue(shared, peer, packet, permit, n);
            }
        }
        peer.behind.store(true, Ordering::Relaxed);
    }
    lose(shared, peer, &packet)
}

/// A copy that did not fit: a QoS 0 one dropped, a QoS 1 one closing its connection.
fn lose(shared: &Clock, peer: &Peer, packet: &Packet) -> Offered {
    if peer.stop.is_cancelled() {
        // Closed already (its writer has not ended yet): nothing new to count.
        return Offered::Closed;
    }
    if matches!(packet, Packet::Publish(p) if p.qos == QoS::AtMostOnce) {
        bump(&shared.counters.dropped);
        return Offered::Dropped;
    }
    bump(&shared.counters.slow_closed);
    tracing::warn!(
        queued_kib = peer.queued_kib(),
        "broker: a subscriber too far behind to take a QoS 1 copy; disconnected (its client reconnects)"
    );
    peer.close();
    Offered::Closed
}

/// What [`try_offer`] did: what became of the packet, or the packet back.
pub(crate) enum Tried {
    Done(Offered),
    /// It did not fit: the caller waits, or [`lose`]s it.
    Full(Packet),
}

/// Queues `packet` for `peer` if it fits now; gives it back when it does
/// not (for the caller to wait, or to [`lose`] it).
pub(crate) fn try_offer(shared: &Clock, peer: &Peer, packet: Packet, own: bool) -> Tried {
    let n = cost(&packet).min(peer.capacity);
    let permit = match peer.budget.clone().try_acquire_many_owned(n) {
        Ok(p) => Some(p),
        Err(TryAcquireError::Closed) => return Tried::Done(Offered::Closed),
        Err(TryAcquireError::NoPermits) => None,
    };
    // The coordinator's own queue, and what a connection caused itself,
    // draw on its own budget alone.
    let shared_kib = if peer.privileged || own { 0 } else { n };
    match permit.filter(|_| shared_kib == 0 || take_for(shared, peer, n)) {
        Some(permit) => Tried::Done(enqueue(shared, peer, packet, permit, shared_kib)),
        // The caller decides whether to wait (a grace) or lose it.
        None => Tried::Full(packet),
    }
}

/// What a subscriber whose queue stays full must take per [`STALL`] not to be
/// disconnected: a queue's worth (a working coordinator takes megabytes a
/// second).
pub(crate) const MIN_DRAIN_BYTES: u64 = PRIVILEGED_QUEUE_KIB as u64 * 1024;

/// Whether a subscriber is stuck: its writer took nothing for `stall`, or
/// its queue has stayed full for `stall` while it took less than
/// [`MIN_DRAIN_BYTES`] (a client reading a trickle to stay connected).
pub(crate) fn stuck(idle: Duration, full_for: Duration, drained: u64, stall: Duration) -> bool {
    idle >= stall || (full_for >= stall && drained < MIN_DRAIN_BYTES)
}

/// Queues `packet` for `peer`, waiting while its own queue is full; false
/// when it is gone or was disconnected for stalling. Used for what a
/// connection causes itself (its acks, its retained copies) and for the
/// coordinator's own connection: a wait here holds up no other client.
pub(crate) async fn deliver_waiting(shared: &Clock, peer: &Peer, packet: Packet) -> bool {
    let n = cost(&packet).min(peer.capacity);
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
                    if stalled(shared, peer) {
                        return false;
                    }
                }
            }
        },
    };
    enqueue(shared, peer, packet, permit, 0) == Offered::Queued
}

/// Closes `peer` when it is stuck; true when it was.
fn stalled(shared: &Clock, peer: &Peer) -> bool {
    let now = shared.now_ms();
    let idle = now.saturating_sub(peer.progress.load(Ordering::Relaxed));
    let full_since = peer.full_since.load(Ordering::Relaxed);
    let full_for = if full_since == 0 { 0 } else { now.saturating_sub(full_since - 1) };
    let drained = peer.taken.load(Ordering::Relaxed).saturating_sub(peer.taken_at_full.load(Ordering::Relaxed));
    if !stuck(Duration::from_millis(idle), Duration::from_millis(full_for), drained, shared.stall) {
        return false;
    }
    bump(&shared.counters.stalled);
    tracing::warn!(
        stalled_s = shared.stall.as_secs(),
        drained_bytes = drained,
        "broker: a subscriber took (almost) nothing from its full queue; disconnected"
    );
    peer.close();
    true
}

/// Drains a connection's queue into its socket, many packets per write.
pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    peer: Peer,
    shared: Arc<Clock>,
) {
    let mut out = BytesMut::with_capacity(1024);
    let mut held: Vec<Hold> = Vec::new();
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
        let Some((first, hold)) = first else { break };
        peer.progress.store(shared.now_ms(), Ordering::Relaxed);
        held.push(hold);
        if !encode(first, &mut out) {
            break;
        }
        while out.len() < WRITE_BATCH {
            let Ok((p, hold)) = rx.try_recv() else { break };
            held.push(hold);
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
    // What is still queued gives its share of the budgets back now.
    rx.close();
    while rx.try_recv().is_ok() {}
    // Bounded: a TLS close waits to write its alert, and a client that reads
    // nothing would hold this socket (and its place) for ever.
    let _ = tokio::time::timeout(Duration::from_secs(2), writer.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_budget_keeps_a_reserve_for_light_queues() {
        let total = AtomicU64::new(0);
        let heavy = LIGHT_KIB;
        let open = CLIENTS_QUEUED_KIB - RESERVE_KIB;
        assert!(take_shared(&total, open, 0));
        assert!(!take_shared(&total, 1, heavy), "a heavy queue stops at the reserve");
        assert!(take_shared(&total, RESERVE_KIB, 0), "a light one may use it");
        assert!(!take_shared(&total, 1, 0), "nobody past the whole budget");
        assert_eq!(total.load(Ordering::Relaxed), CLIENTS_QUEUED_KIB);
    }
}
