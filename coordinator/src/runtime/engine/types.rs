//! The engine's vocabulary, shared by its parts and spoken by what is
//! around it: what comes in from the broker ([`Inbound`], which the
//! transport makes), what the control socket asks and is answered
//! ([`Ask`], [`Answer`]), why it stops ([`EngineError`]), what it counts
//! ([`EngineStats`]), a turn's clocks ([`Now`]), and how loudly a repeated
//! refusal is logged ([`loud`]).

use std::time::Instant;

use serde::{Deserialize, Serialize};
use tunefleet_common::auth::UpFrame;
use tunefleet_common::topic::AgentTopic;

use crate::store::StoreError;

/// What the engine takes from the broker (the transport makes these).
#[derive(Debug)]
pub enum Inbound {
    /// (Re)connected and subscribed.
    Connected,
    /// Lost the broker; the transport keeps reconnecting.
    Disconnected(String),
    /// A well-formed frame from an agent, not yet authenticated (boxed: a
    /// result is large, a status small).
    Agent { agent: String, kind: AgentTopic, frame: Box<UpFrame> },
    /// A payload that was refused, with the reason.
    Rejected { topic: String, reason: String },
}

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// Run this study file (its text) on the fleet, beside the others;
    /// resumed if the store has it.
    Submit { study: String, origin: String },
    /// Stop this study: no more trials, running attempts cancelled on their agents.
    Cancel { study: String },
    /// Try this configuration (parameter, value as written in TOML) of a
    /// running study before anything else not created yet.
    Enqueue { study: String, params: Vec<(String, String)> },
    /// A configuration (parameter, value as TOML) an outside sampler chose
    /// for a study with `[strategy] kind = "external"`; answered with the
    /// trials it became.
    Tell { study: String, params: Vec<(String, String)> },
}

/// The service's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Ok {
        message: String,
    },
    Error {
        message: String,
    },
    /// Done, and these trials were created.
    Created {
        message: String,
        trials: Vec<u64>,
    },
}

/// Why the engine stopped early.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the broker connection closed for good")]
    TransportClosed,
}

impl EngineError {
    /// Whether the store's database was lost ([`StoreError::database_lost`]).
    pub fn database_lost(&self) -> bool {
        matches!(self, EngineError::Store(e) if e.database_lost())
    }
}

/// Counters a user (or a test) can read after a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Payloads that do not decode or do not belong on their topic.
    pub rejected_messages: u64,
    /// Sealed frames that fail authentication: no session, another
    /// session's token, a bad MAC, a replayed sequence number.
    pub bad_tokens: u64,
    /// Hellos refused: bad signature, wrong name or instance, replayed,
    /// changed key, too many agents.
    pub refused_hellos: u64,
    /// Hellos dropped by the rate limit.
    pub rate_limited_hellos: u64,
    /// Last Wills that match no session of the agent (forged or replayed).
    pub forged_wills: u64,
    /// Authenticated messages with a field out of bounds (validate.rs).
    pub invalid_messages: u64,
    /// Messages (or the bookkeeping after one) whose store writes failed:
    /// rolled back alone, the turn went on.
    pub store_errors: u64,
    /// Progress past an attempt's bound of rows or bytes: not kept.
    pub refused_progress: u64,
    /// Checkpoints outside their study's `resume_prefix`: not kept.
    pub refused_checkpoints: u64,
    /// Results and progress of agents past their share of a study's store:
    /// refused (progress is counted in `refused_progress` too).
    pub past_share: u64,
    /// Results the coordinator cannot place, answered so the agent parks them.
    pub unknown_results: u64,
    /// Results, progress, refusals and running attempts of another study of
    /// a name this coordinator runs (another study id: another store).
    /// Results are refused (the agent parks them), the rest is ignored.
    pub other_study_refs: u64,
    pub duplicate_results: u64,
    pub superseded_results: u64,
    pub requeued: u64,
    pub assignments: u64,
    /// Trials stopped early (ASHA).
    pub stopped: u64,
    /// Attempts moved off an overloaded agent, or measured again because
    /// their measurement was disturbed.
    pub moved: u64,
    /// Trials agents lost before they started (offline, restarted, a held
    /// trial's lease run out): queued again, no failure counted.
    pub lost_held: u64,
    /// Trials that skipped probing for a configuration reused from jobs
    /// that profiled alike, and reuses that then ran slower than promised.
    pub reused: u64,
    pub reuse_worse: u64,
    /// Window profiles refused as malformed (the trial probes as usual).
    pub bad_profiles: u64,
    /// Co-measurements refused: from a node not asked, for another window,
    /// twice, or out of range ([`crate::domain::comeasure::Refusal`]).
    pub refused_comeasures: u64,
    /// Nodes recorded as missing: no answer in time.
    pub comeasures_missing: u64,
    /// Connections to the broker lost or refused (each retry counts).
    pub broker_losses: u64,
}

/// The clocks of one turn, read once by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Milliseconds since the engine started: the scheduler's clock (leases,
    /// the offloading decider).
    pub engine_ms: u64,
    /// Milliseconds since the Unix epoch: the times the store records.
    pub unix_ms: u64,
    /// The monotonic clock: the session limits (Hello rates, stale notices)
    /// and a study's elapsed time.
    pub instant: Instant,
}

/// Milliseconds since the Unix epoch now (0 before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Logs the first ten of a kind of refusal, then at powers of two.
pub fn loud(n: u64) -> bool {
    n <= 10 || n.is_power_of_two()
}
