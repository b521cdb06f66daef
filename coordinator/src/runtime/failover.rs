//! A service on a server's store among others on the same store: it
//! waits as a standby until it holds the lease (`store/lease.rs`), and
//! while active renews it on a thread of its own; losing it ends the
//! service (it steps down, writing nothing more; under systemd it comes
//! back as a standby).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::oneshot;

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

/// The renewals of a service's lease, when it holds one.
#[derive(Debug, Default)]
pub struct Renewals {
    lost: Option<oneshot::Receiver<Lost>>,
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

    /// Completes when the lease was lost; never without a lease.
    pub async fn lost(&mut self) -> Lost {
        lost(&mut self.lost).await
    }

    /// `error`, or the lost lease when the renewals say so within two leases.
    pub async fn why_it_ended<E: From<Lost>>(&mut self, error: E) -> E {
        why_it_ended(error, &mut self.lost, self.lease).await
    }
}

/// Renews `held` every third of `lease` on a thread of its own until the
/// receiver is dropped; the receiver hears when the lease was lost.
fn keep(held: Lease, lease: Duration) -> oneshot::Receiver<Lost> {
    let (tx, rx) = oneshot::channel();
    let every = lease / 3;
    let spawned = std::thread::Builder::new().name("tunefleet-lease".into()).spawn(move || loop {
        std::thread::sleep(every);
        if tx.is_closed() {
            return;
        }
        match held.renew() {
            Ok(true) => {}
            Ok(false) => tracing::warn!("the lease could not be renewed: the store's server does not answer"),
            Err(lost) => {
                tracing::error!(error = %lost, "stepping down");
                let _ = tx.send(lost);
                return;
            }
        }
    });
    if let Err(e) = spawned {
        // Without renewals the lease runs out and a standby takes over: the
        // fence then stops this coordinator's writes.
        tracing::error!(error = %e, "cannot start the thread that renews the lease");
    }
    rx
}

/// Completes when `lost` says the lease was lost; never when its sender
/// went without a word (the service ended first) or there is no lease.
async fn lost(lost: &mut Option<oneshot::Receiver<Lost>>) -> Lost {
    match lost {
        Some(rx) => match rx.await {
            Ok(lost) => lost,
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Whether a service that failed with `error` (its server went away in
/// the middle of a turn, say) lost its lease too: the renewals say so
/// within two leases, and then it stepped down rather than failed.
async fn why_it_ended<E: From<Lost>>(error: E, renewals: &mut Option<oneshot::Receiver<Lost>>, lease: Duration) -> E {
    if renewals.is_none() {
        return error;
    }
    // Two leases: a renewal that failed on the lost connection, then one
    // on a new connection that finds the lock taken.
    match tokio::time::timeout(lease * 2, lost(renewals)).await {
        Ok(lost) => E::from(lost),
        Err(_) => error,
    }
}
