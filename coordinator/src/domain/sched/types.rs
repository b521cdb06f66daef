//! The scheduler's vocabulary: what it knows of a study ([`StudyPolicy`]),
//! the states a study's trials come back in ([`Restored`]), what it decides
//! ([`Effect`]), its verdicts on results ([`Judgement`]) and its counts
//! ([`StudyCounts`]). No behaviour: the scheduler's parts all speak it.

use tunefleet_common::message::TrialRef;

pub use crate::domain::study::Selector;

/// What the scheduler needs to know of a study.
#[derive(Debug, Clone)]
pub struct StudyPolicy {
    pub name: String,
    /// The random id the store keeps for the study: every trial reference
    /// carries it, and one with another id is of another study of that name.
    pub id: u64,
    pub selector: Selector,
    pub max_attempts: u32,
    /// How many of its trials an agent may hold ahead per slot, its slots
    /// busy ([`crate::domain::study::Study::ahead_per_slot`]); 0: only a
    /// free slot takes one.
    pub ahead_per_slot: u32,
    /// At most this many held ahead per agent, whatever its slots
    /// ([`crate::domain::study::Study::ahead_per_agent`]: a search that
    /// learns from results has its trials asked just in time); `None`: no
    /// bound but the slots'.
    pub ahead_per_agent: Option<u32>,
    /// How long an attempt may hold its lease (trial timeout plus a grace);
    /// one held ahead may hold it twice as long: it waits at most for one
    /// of the trials running there.
    pub lease_ms: u64,
    /// GPUs each trial needs (`gpus = N`): an agent takes one of its
    /// trials only while that many of its GPUs are not leased to others.
    pub gpus: u32,
    /// The bytes of the study's store one agent's results and progress may
    /// take (`u64::MAX`: no bound): past it, its progress and results are
    /// refused and it is given none of the study's trials.
    pub store_share: u64,
}

/// A trial's state when a study is (re)loaded from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    Pending { last_attempt: u32, failures: u32 },
    Running { agent: String, attempt: u32, failures: u32 },
    Done,
    Failed,
    Stopped,
}

/// What the engine must do because of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send this attempt to this agent (and record the assignment); `ahead`:
    /// to be held until a slot frees there.
    Assign { agent: String, trial: TrialRef, request_seq: u64, ahead: bool },
    /// An attempt assigned to be held ahead has started on its agent.
    Started { agent: String, trial: TrialRef },
    /// Tell this agent to stop this attempt.
    Cancel { agent: String, trial: TrialRef, reason: String },
    /// This attempt ended without a usable result; the trial is queued again.
    Requeued { trial: TrialRef, reason: String },
    /// The trial has used up its attempts.
    Failed { trial: TrialRef, reason: String },
    /// The trial was stopped early (final, not a failure, never retried).
    Stopped { trial: TrialRef, reason: String },
    /// This attempt was taken off `from` (overloaded, or its measurement
    /// disturbed): the trial is queued again, not counted as a failure, and
    /// kept off `from` for a while.
    Moved { trial: TrialRef, from: String, reason: String },
    /// `agent` lost `trials` it held before they started (offline,
    /// restarted, or their lease ran out): none counted a failure; it may
    /// now hold `places` at once.
    LostHeld { agent: String, trials: u32, places: u32 },
}

/// How a result relates to what the scheduler knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The trial is complete with this result.
    Accepted,
    /// This very attempt's result was already accepted.
    Duplicate,
    /// Another attempt's result was accepted first; keep this one as such.
    Superseded,
    /// The attempt failed for reasons of its own (could not start, cancelled): retried.
    Retried,
    /// No such study, trial, or attempt of this agent: refuse it.
    Unknown,
    /// The measurement was disturbed (load from outside, the device's
    /// conditions): the trial is measured again elsewhere.
    Remeasured,
    /// The agent has used its share of the study's store: refused, the
    /// trial goes to another agent.
    PastShare,
}

/// A result's verdict and what it does to its trial, from
/// `Scheduler::judge`, done by `Scheduler::settle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub verdict: Verdict,
    pub(super) change: Change,
    pub(super) agent: String,
    pub(super) trial: TrialRef,
}

/// What settling a judgement changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Change {
    Nothing,
    /// A stopped attempt's own result arrived.
    Delivered,
    /// Measured again elsewhere, for this reason.
    Remeasure(String),
    /// The attempt ended without a result, for this reason.
    Retry(String),
    /// The trial is done; `revive` when it had failed for want of a result.
    Complete {
        success: bool,
        revive: bool,
        this_is_live: bool,
    },
}

/// Whether a result completes its trial or asks for another attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultKind {
    /// The workload ran; `success` is false when it exited non-zero or was killed.
    Complete {
        success: bool,
    },
    Retry(String),
    /// The workload ran, but its measurement says it was disturbed.
    Interfered {
        success: bool,
        reason: String,
    },
}

/// Measurements refused for interference before a disturbed one is taken.
pub const MAX_REMEASURES: u32 = 2;
/// How long a trial moved off an agent stays off it.
pub const AVOID_MS: u64 = 60_000;

/// Progress of one study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StudyCounts {
    pub total: u64,
    pub done: u64,
    pub failed: u64,
    pub running: u64,
    /// Stopped early: final, neither done nor failed.
    pub stopped: u64,
    /// More trials may still come.
    pub open: bool,
}

impl StudyCounts {
    /// Every trial is final and no more will be added.
    pub fn finished(&self) -> bool {
        !self.open && self.done + self.failed + self.stopped == self.total
    }
}
