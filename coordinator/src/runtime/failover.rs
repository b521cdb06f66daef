//! A service on a server's store among others on the same store: it
//! waits as a standby until it holds the lease (`store/lease.rs`), and
//! while active renews it on a thread of its own; losing it ends the
//! service (it steps down, writing nothing more; under systemd it comes
//! back as a standby).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::store::{Candidate, Lease, LeaseTry, Lost, StoreError};

/// How often a standby asks for the lease: a dead active's lock is free
/// as soon as the server sees its connections close.
const STANDBY_POLL: Duration = Duration::from_millis(500);

/// Waits until this process (named `holder`, see
/// [`crate::store::name_this_process`]) holds the lease of `store`'s
/// coordinators for `lease`, announcing an instance of at least
/// `min_instance`. `None` when `shutdown` came first. A server that
/// cannot be reached is tried again.
pub async fn wait_to_be_active(
    store: &Path,
    holder: &str,
    lease: Duration,
    min_instance: u64,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Lease>, StoreError> {
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let mut candidate: Option<Candidate> = None;
    let mut told: Option<String> = None;
    loop {
        let tried = match candidate.take() {
            Some(c) => c.try_acquire(holder, lease_ms, min_instance),
            None => Candidate::connect(store).and_then(|c| c.try_acquire(holder, lease_ms, min_instance)),
        };
        match tried {
            Ok(LeaseTry::Active(held)) => {
                tracing::info!(
                    epoch = held.epoch,
                    instance = held.instance,
                    holder,
                    "active: this coordinator holds the lease"
                );
                return Ok(Some(held));
            }
            Ok(LeaseTry::Standby { holder: other, left_ms, again }) => {
                if told.as_deref() != Some(other.as_str()) {
                    tracing::info!(active = %other, lease_left_ms = left_ms, "standby: another coordinator is active; taking over when its lease ends");
                    told = Some(other);
                }
                candidate = Some(again);
            }
            Err(e) if unreachable(&e) => {
                tracing::warn!(error = %e, "standby: the store's server does not answer; trying again");
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            () = tokio::time::sleep(STANDBY_POLL.min(lease / 3)) => {}
            () = shutdown.as_mut() => return Ok(None),
        }
    }
}

fn unreachable(e: &StoreError) -> bool {
    match e {
        StoreError::Sql { cause, .. } => cause.is_unreachable(),
        _ => false,
    }
}

/// How a service that stepped down ends: systemd's `Restart=on-failure`
/// brings it back as a standby.
pub const EXIT_STEPPED_DOWN: u8 = 7;

/// How long a service whose lease went a whole term unrenewed has to end
/// by itself before its process is ended ([`watch`]).
const STEP_DOWN_GRACE: Duration = Duration::from_secs(2);

/// The renewals of a service's lease, when it holds one.
#[derive(Debug, Default)]
pub struct Renewals {
    lost: Option<mpsc::UnboundedReceiver<Lost>>,
    lease: Duration,
}

impl Renewals {
    /// `held` renewed every third of `lease` from now on (none: no lease).
    pub fn of(held: Option<Lease>, lease: Option<Duration>) -> Renewals {
        match held.zip(lease) {
            Some((held, lease)) => Renewals { lost: Some(keep(held, lease)), lease },
            None => Renewals::default(),
        }
    }

    /// Completes when the lease was lost: taken over, or not renewed for a
    /// whole lease (the server out of reach or not answering, however long
    /// a renewal waits), after which a standby may hold it. Never without a
    /// lease.
    pub async fn lost(&mut self) -> Lost {
        lost(&mut self.lost).await
    }

    /// `error`, or the lost lease when the renewals say so within two leases.
    pub async fn why_it_ended<E: From<Lost>>(&mut self, error: E) -> E {
        if self.lost.is_none() {
            return error;
        }
        // Two leases: a renewal that failed on the lost connection, then one
        // on a new connection that finds the lock taken.
        match tokio::time::timeout(self.lease * 2, lost(&mut self.lost)).await {
            Ok(lost) => E::from(lost),
            Err(_) => error,
        }
    }
}

/// Renews `held` every third of `lease` on a thread of its own, and
/// watches on another that one renewal sent in each lease lands
/// ([`watch`]), until the receiver is dropped; the receiver hears when the
/// lease was lost.
fn keep(held: Lease, lease: Duration) -> mpsc::UnboundedReceiver<Lost> {
    let (tx, rx) = mpsc::unbounded_channel();
    let every = lease / 3;
    let since = held.taken;
    let epoch = held.epoch;
    // When the last renewal that landed was sent (the taking first), in
    // milliseconds after `since`.
    let renewed_ms = Arc::new(AtomicU64::new(0));
    let (noted, watched, told) = (Arc::clone(&renewed_ms), renewed_ms, tx.clone());
    // Each renewal a third of the lease after the last one that landed was
    // sent (however long it took), one that did not land tried again sooner.
    let renewing = std::thread::Builder::new().name("tunefleet-lease".into()).spawn(move || {
        let mut next = since + every;
        loop {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            if tx.is_closed() {
                return;
            }
            let sent = Instant::now();
            match held.renew() {
                Ok(true) => {
                    noted.store(u64::try_from((sent - since).as_millis()).unwrap_or(u64::MAX), Ordering::Release);
                    next = sent + every;
                }
                Ok(false) => {
                    tracing::warn!("the lease could not be renewed: the store's server does not answer");
                    next = Instant::now() + every / 4;
                }
                Err(lost) => {
                    tracing::error!(error = %lost, "stepping down");
                    let _ = tx.send(lost);
                    return;
                }
            }
        }
    });
    let watching = std::thread::Builder::new()
        .name("tunefleet-lease-watch".into())
        .spawn(move || watch(since, &watched, lease, epoch, &told));
    for e in [renewing.err(), watching.err()].into_iter().flatten() {
        // Without renewals the lease runs out: the watch steps this
        // coordinator down, or (without the watch) a standby takes over and
        // the fence stops this coordinator's writes.
        tracing::error!(error = %e, "cannot start a thread that renews or watches the lease");
    }
    rx
}

/// Waits until no renewal sent in the last `lease` has landed (the last
/// that did noted in `renewed_ms` after `since`), and says so on `told`;
/// returns once its receiver is gone. The lease's expiry on the server is
/// at least `lease` after the last renewal that landed was sent, so a
/// standby takes over for an expired lease only after this says it (one
/// may take over sooner where this coordinator's connections closed: the
/// fence then refuses its writes). A service stuck on a connection that
/// answers nothing (a statement sent into a network that loses every
/// packet waits until the connection gives up on it) may not end by
/// itself, nor its process once it did (closing its store waits on that
/// connection too): if the process still runs after [`STEP_DOWN_GRACE`],
/// it ends here, as after a kill, and its embedded broker with it (agents
/// then go to the next broker they know). Nothing is lost that way: what
/// agents sent and was not acknowledged stays in their spools, points for
/// InfluxDB wait in the store for the next active coordinator to send.
fn watch(since: Instant, renewed_ms: &AtomicU64, lease: Duration, epoch: i64, told: &mpsc::UnboundedSender<Lost>) {
    loop {
        let renewed = renewed_ms.load(Ordering::Acquire);
        let last = since + Duration::from_millis(renewed);
        std::thread::sleep((last + lease).saturating_duration_since(Instant::now()));
        if told.is_closed() {
            return;
        }
        if renewed_ms.load(Ordering::Acquire) != renewed {
            continue;
        }
        let unrenewed_ms = u64::try_from(last.elapsed().as_millis()).unwrap_or(u64::MAX);
        let lost = Lost::Unrenewed { epoch, unrenewed_ms };
        tracing::error!(error = %lost, "stepping down");
        if told.send(lost.clone()).is_err() {
            return;
        }
        std::thread::sleep(STEP_DOWN_GRACE);
        eprintln!("tunefleet: {lost}; the service did not end within {STEP_DOWN_GRACE:?}, so its process ends here");
        std::process::exit(i32::from(EXIT_STEPPED_DOWN));
    }
}

/// Completes when `lost` says the lease was lost; never when its senders
/// went without a word (the service ended first) or there is no lease.
async fn lost(lost: &mut Option<mpsc::UnboundedReceiver<Lost>>) -> Lost {
    match lost {
        Some(rx) => match rx.recv().await {
            Some(lost) => lost,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}
