//! The commits a PostgreSQL store's connection sent to its client thread
//! without waiting ([`super::PgConn::commit`]), as the connection's owner
//! and the thread see them.

use std::sync::atomic::{AtomicU64, Ordering};

/// How many commits were sent and ended, the last that failed and the
/// last failure its owner said it has seen. Until then the thread refuses
/// everything: what the owner sends was built on what the failed one did.
#[derive(Debug, Default)]
pub(crate) struct Flight {
    sent: AtomicU64,
    ended: AtomicU64,
    failed: AtomicU64,
    seen: AtomicU64,
}

impl Flight {
    /// Whether a commit sent has not ended yet.
    pub(super) fn in_flight(&self) -> bool {
        self.sent.load(Ordering::Acquire) > self.ended.load(Ordering::Acquire)
    }

    /// A commit is sent: its number among them.
    pub(super) fn send(&self) -> u64 {
        let seq = self.sent.load(Ordering::Acquire) + 1;
        self.sent.store(seq, Ordering::Release);
        seq
    }

    /// Commit `seq` ended (`ok`: committed).
    pub(super) fn end(&self, seq: u64, ok: bool) {
        if !ok {
            self.failed.fetch_max(seq, Ordering::AcqRel);
        }
        self.ended.fetch_max(seq, Ordering::AcqRel);
    }

    /// Whether a commit failed that its owner has not seen fail.
    pub(super) fn failure_unseen(&self) -> bool {
        self.failed.load(Ordering::Acquire) > self.seen.load(Ordering::Acquire)
    }

    /// Every failure so far is seen: what is sent from now on runs.
    pub(super) fn failures_seen(&self) {
        self.seen.fetch_max(self.failed.load(Ordering::Acquire), Ordering::AcqRel);
    }
}
