//! The study store: one SQLite file holding studies, their trials, every
//! attempt, the one accepted result of each trial, progress reports and the
//! agents seen.
//!
//! Columns are plain and readable from the `sqlite3` shell; nested data
//! (parameters, the measurement record, agent info, metrics) is JSON text.
//! Writes go through a [`Batch`], one transaction for many events, so the
//! engine can record thousands of events per second on a small machine.
//!
//! Results are accepted exactly once per trial: a result repeated for the same
//! attempt is a [`RecordOutcome::Duplicate`], a result of an attempt that is
//! no longer the running one is kept in `attempts` as superseded and never
//! becomes a second row in `results`.
//!
//! The `influx_outbox` table holds points for InfluxDB that are not delivered
//! yet (see [`crate::runtime::sink`]): the engine queues them in the same batch as the
//! result they describe, and the sink deletes them once the server took them.
//!
//! One file per concern: `schema` opens and migrates, `record` is the one
//! trial record every read of trials and results answers in, `queries`
//! reads, `batch` writes, `outbox` queues points for InfluxDB, `export`
//! reads what an export writes, `report` reads what the HTML report draws,
//! `keys` pins agent keys. This file holds the types and column helpers
//! they share.

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;
use sql::{ColumnIndex, Conn, Row, Tx};
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::params::Params;

pub(crate) use crate::domain::params::param_value_json;
pub use crate::domain::params::{params_from_json, params_json};

mod attempts;
mod batch;
mod enrol;
mod export;
mod keys;
mod lease;
mod lifecycle;
mod nodes;
mod outbox;
mod profiles;
mod queries;
mod record;
mod refusals;
mod report;
mod requests;
mod running;
mod schema;
pub(crate) mod sql;
mod transfer;

pub use crate::domain::trial::{Outcome, Ranked, StoredEnergy, TrialRecord, TrialState};
pub use batch::{Committing, RecordOutcome, StudyOpened};
pub use enrol::{token_id, Grant, Known, TokenRow, TokenShare, TokenState};
pub use export::AttemptTimes;
pub use lease::{name_this_process, Candidate, Lease, Lost, Try as LeaseTry};
pub use lifecycle::LifecycleError;
pub use nodes::NodeRow;
pub use outbox::{OutboxCounts, OutboxRow};
pub use profiles::DecisionRow;
pub use queries::{AgentRow, AttemptRow, Curve, ProgressRow, StudyRow, TrialCounts, Unranked};
pub use record::Measured;
pub use refusals::RefusalRow;
pub use report::{ProvenanceRow, WindowRow};
pub use requests::Requests;
pub use running::RunLock;
pub use schema::SCHEMA_VERSION;
pub use transfer::{copy, TableCopy};

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database's error is part of the message (`cause`, not a
    /// `source`, so a printed chain does not say it twice).
    #[error("{context}: {cause}")]
    Sql { context: String, cause: sql::Error },
    #[error("{context}: {source}")]
    Json { context: String, source: serde_json::Error },
    #[error(
        "study {study:?} already exists in the store with another configuration ({keys}): to run this file from \
         the start, keep what ran under another name (`tunefleet studies rename {study} {study}-1`) or delete it \
         (`tunefleet studies delete {study}`), or give this file another name; to resume, use the original file \
         (a larger [budget], timeout, max_attempts, lookahead or [selector] alone continue it)"
    )]
    ConfigMismatch { study: String, keys: String },
    #[error("unknown study {0:?}")]
    UnknownStudy(String),
    #[error("unknown trial {study}/{trial}")]
    UnknownTrial { study: String, trial: u64 },
    #[error("trial {study}/{trial} is {state}: it cannot be assigned again")]
    TrialClosed { study: String, trial: u64, state: TrialState },
    #[error("{path}: schema version {found} is not one this program knows (it knows {SCHEMA_VERSION})")]
    SchemaVersion { path: String, found: i64 },
    #[error("{what} {value} is too large for the store")]
    OutOfRange { what: &'static str, value: u64 },
    #[error("{path}: the database is unreachable: {cause}")]
    Unreachable { path: String, cause: sql::Error },
    #[error("{path} already holds rows ({rows} in table {table}): a copy goes into an empty store, never merges")]
    NotEmpty { path: String, table: String, rows: i64 },
    #[error("{path}: cannot make the store private to its owner: {source}")]
    Private { path: String, source: std::io::Error },
    /// Another coordinator took the lease over: nothing more is written.
    #[error("{path}: {cause}")]
    SteppedDown { path: String, cause: sql::Error },
    /// A write the server's answer refused, said as a file's store says it
    /// at once ([`StoreError::TrialClosed`], [`StoreError::UnknownTrial`]):
    /// on a server, its batch settling or committing says it.
    #[error("{0}")]
    Refused(String),
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// Whether the store's database was lost (unreachable, its connection
    /// closed or its server gone) rather than refusing what was asked.
    pub fn database_lost(&self) -> bool {
        match self {
            StoreError::Unreachable { .. } => true,
            StoreError::Sql { cause, .. } => cause.is_unreachable(),
            _ => false,
        }
    }
}

/// Adds what the store was doing to a database error.
trait SqlContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> SqlContext<T> for sql::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|cause| match cause {
            sql::Error::Fenced { .. } => StoreError::SteppedDown { path: context(), cause },
            sql::Error::Refused(why) => StoreError::Refused(why),
            cause => StoreError::Sql { context: context(), cause },
        })
    }
}

/// Whether a study still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StudyState {
    Running,
    Finished,
}

impl StudyState {
    pub fn as_str(self) -> &'static str {
        match self {
            StudyState::Running => "running",
            StudyState::Finished => "finished",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(StudyState::Running),
            "finished" => Some(StudyState::Finished),
            _ => None,
        }
    }
}

impl fmt::Display for StudyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The study store.
pub struct Store {
    conn: Conn,
    path: String,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish_non_exhaustive()
    }
}

/// A write transaction over the store; see [`Store::batch`].
/// What a result is ranked by: its objective and, in a study with
/// `[[constraint]]`s, its violation of them (0: feasible; `None`: the
/// study has none). An objective alone converts into one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Score {
    pub objective: Option<f64>,
    pub violation: Option<f64>,
    /// The system configuration the result is ranked under: the one its
    /// pipelined trial selected, else the one it ran under.
    pub system: Option<tunefleet_common::message::SystemParams>,
}

impl From<Option<f64>> for Score {
    fn from(objective: Option<f64>) -> Score {
        Score { objective, violation: None, system: None }
    }
}

/// What a row costs beside its payload, as [`Batch::written`] counts it.
pub const ROW_BYTES: u64 = 64;

pub struct Batch<'a> {
    tx: Tx<'a>,
    /// Bytes of results and progress written in it so far ([`Batch::written`]).
    written: u64,
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").finish_non_exhaustive()
    }
}

/// FNV-1a's offset basis, where a hash starts ([`fnv`]).
const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `bytes`, going on from `h`: a stable hash (the same in every
/// build), for digests and lock keys.
fn fnv(bytes: &[u8], mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Whether `store` names a store on a database server (`postgres://`)
/// rather than a file.
pub fn is_remote(store: &std::path::Path) -> bool {
    store.to_str().is_some_and(sql::is_postgres)
}

/// `store` as it may be shown (a password in a URL replaced by `***`).
pub fn shown(store: &std::path::Path) -> String {
    let text = store.display().to_string();
    if is_remote(store) {
        sql::redacted(&text)
    } else {
        text
    }
}

/// Whether there is a store at `store`: a file, or any store on a
/// database server (connecting says whether the server answers).
pub fn exists(store: &std::path::Path) -> bool {
    is_remote(store) || store.exists()
}

/// How the workload ended, as readable text.
pub fn exit_text(exit: &ExitOutcome) -> String {
    match exit {
        ExitOutcome::Exited(code) => format!("exited {code}"),
        ExitOutcome::Signaled(sig) => format!("signal {sig}"),
        ExitOutcome::TimedOut => "timed out".into(),
        ExitOutcome::Cancelled => "cancelled".into(),
        ExitOutcome::SpawnFailed(why) => format!("spawn failed: {why}"),
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn to_i64(what: &'static str, value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { what, value })
}

// Each `*Row` type is mapped in one function, which reads its columns by
// the names its SELECT gives them (an expression carries an `AS name`),
// never by position: a mapper and its SELECT cannot drift apart. Columns
// several types share are mapped in one place per table ([`trial_cols`]
// for `trials`, `record::outcome` and [`energy_cols`] for `results`). Only a
// lookup of two or three columns into a tuple reads by position.

/// Where column `idx` (a name or a position) is in `row`.
fn at<I: ColumnIndex>(row: &Row<'_>, idx: I) -> sql::Result<usize> {
    idx.index(row)
}

fn get_u64<I: ColumnIndex>(row: &Row<'_>, idx: I) -> sql::Result<u64> {
    let i = at(row, idx)?;
    let v: i64 = row.get(i)?;
    u64::try_from(v).map_err(|e| sql::Error::conversion(i, e))
}

fn get_opt_u64<I: ColumnIndex>(row: &Row<'_>, idx: I) -> sql::Result<Option<u64>> {
    let i = at(row, idx)?;
    let v: Option<i64> = row.get(i)?;
    v.map(|v| u64::try_from(v).map_err(|e| sql::Error::conversion(i, e))).transpose()
}

fn json_col<T: DeserializeOwned, I: ColumnIndex>(row: &Row<'_>, idx: I) -> sql::Result<T> {
    let i = at(row, idx)?;
    let text: String = row.get(i)?;
    serde_json::from_str(&text).map_err(|e| sql::Error::conversion(i, e))
}

fn params_col<I: ColumnIndex>(row: &Row<'_>, idx: I) -> sql::Result<Params> {
    let i = at(row, idx)?;
    let text: String = row.get(i)?;
    params_from_json(&text).map_err(|e| sql::Error::conversion(i, e))
}

fn bad_text<I: ColumnIndex>(row: &Row<'_>, idx: I, what: &str, value: &str) -> sql::Error {
    let i = at(row, idx).unwrap_or(0);
    sql::Error::conversion(i, format!("unknown {what} {value:?}"))
}

fn trial_state<I: ColumnIndex>(row: &Row<'_>, idx: I) -> sql::Result<TrialState> {
    let text: String = row.get(idx)?;
    TrialState::parse(&text).ok_or_else(|| bad_text(row, idx, "trial state", &text))
}

/// A trial's identity as the `trials` table keeps it: the columns
/// `trial`, `repeat` and `params` of a row joined with it.
fn trial_cols(row: &Row<'_>) -> sql::Result<(u64, u32, Params)> {
    Ok((get_u64(row, "trial")?, row.get("repeat")?, params_col(row, "params")?))
}

/// A result's energy as the `results` table keeps it: the columns
/// `energy_j` and `energy_valid` (NULL read as not valid).
fn energy_cols(row: &Row<'_>) -> sql::Result<tunefleet_common::measurement::EnergyFigure> {
    Ok(tunefleet_common::measurement::EnergyFigure {
        joules: row.get("energy_j")?,
        valid: row.get::<_, Option<bool>>("energy_valid")?.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_text_is_readable() {
        assert_eq!(exit_text(&ExitOutcome::Exited(0)), "exited 0");
        assert_eq!(exit_text(&ExitOutcome::Signaled(9)), "signal 9");
        assert_eq!(exit_text(&ExitOutcome::TimedOut), "timed out");
        assert_eq!(exit_text(&ExitOutcome::SpawnFailed("no such file".into())), "spawn failed: no such file");
    }

    #[test]
    fn trial_state_text_round_trips() {
        for s in [TrialState::Pending, TrialState::Running, TrialState::Done, TrialState::Failed] {
            assert_eq!(TrialState::parse(s.as_str()), Some(s));
        }
        assert_eq!(TrialState::parse("lost"), None);
    }

    /// Only a database out of reach pauses the engine (then it takes its
    /// studies back): a refusal, a lost lease or a client thread that has
    /// ended stop it.
    #[test]
    fn only_a_database_out_of_reach_is_lost() {
        let sql = |cause| StoreError::Sql { context: "committing a batch".into(), cause };
        let path = || "postgres://db".to_string();
        assert!(sql(sql::Error::Closed("connection closed".into())).database_lost());
        assert!(StoreError::Unreachable { path: path(), cause: sql::Error::Closed("refused".into()) }.database_lost());
        assert!(!sql(sql::Error::Gone).database_lost());
        assert!(!sql(sql::Error::Refused("trial s/1 is done".into())).database_lost());
        assert!(!sql(sql::Error::Fenced { mine: 1, now: Some(2) }).database_lost());
        assert!(
            !StoreError::SteppedDown { path: path(), cause: sql::Error::Fenced { mine: 1, now: None } }.database_lost()
        );
    }
}
