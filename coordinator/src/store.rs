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
//! yet (see [`crate::sink`]): the engine queues them in the same batch as the
//! result they describe, and the sink deletes them once the server took them.

use std::fmt;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use rusqlite::types::Type;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tunefleet_common::measurement::{ExitOutcome, Measurement};
use tunefleet_common::message::{AgentInfo, Progress, TrialRef};
use tunefleet_common::params::{ParamValue, Params};

mod keys;

use crate::search::TrialPlan;
use crate::study::{self, Direction, Study};

/// Version of the schema below, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 1;

/// How long a writer waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS studies (
    name        TEXT PRIMARY KEY NOT NULL,
    config      TEXT NOT NULL,
    metric      TEXT NOT NULL,
    direction   TEXT NOT NULL CHECK (direction IN ('minimize', 'maximize')),
    created_ms  INTEGER NOT NULL,
    finished_ms INTEGER,
    state       TEXT NOT NULL CHECK (state IN ('running', 'finished'))
);
CREATE TABLE IF NOT EXISTS trials (
    study    TEXT NOT NULL,
    trial    INTEGER NOT NULL,
    params   TEXT NOT NULL,
    repeat   INTEGER NOT NULL,
    state    TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    reason   TEXT,
    PRIMARY KEY (study, trial)
);
CREATE INDEX IF NOT EXISTS trials_by_state ON trials (study, state);
CREATE TABLE IF NOT EXISTS attempts (
    study       TEXT NOT NULL,
    trial       INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    agent       TEXT NOT NULL,
    assigned_ms INTEGER NOT NULL,
    ended_ms    INTEGER,
    outcome     TEXT,
    superseded  INTEGER NOT NULL DEFAULT 0 CHECK (superseded IN (0, 1)),
    PRIMARY KEY (study, trial, attempt)
);
CREATE TABLE IF NOT EXISTS results (
    study         TEXT NOT NULL,
    trial         INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    agent         TEXT NOT NULL,
    success       INTEGER NOT NULL CHECK (success IN (0, 1)),
    objective     REAL,
    wall_us       INTEGER NOT NULL,
    user_us       INTEGER NOT NULL,
    sys_us        INTEGER NOT NULL,
    max_rss_kib   INTEGER NOT NULL,
    exit          TEXT NOT NULL,
    energy_j      REAL,
    energy_source TEXT,
    energy_valid  INTEGER,
    measurement   TEXT NOT NULL,
    received_ms   INTEGER NOT NULL,
    PRIMARY KEY (study, trial)
);
CREATE INDEX IF NOT EXISTS results_by_objective ON results (study, success, objective);
CREATE TABLE IF NOT EXISTS progress (
    study      TEXT NOT NULL,
    trial      INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    epoch      INTEGER NOT NULL,
    metrics    TEXT NOT NULL,
    elapsed_us INTEGER NOT NULL,
    PRIMARY KEY (study, trial, attempt, epoch)
);
CREATE TABLE IF NOT EXISTS agents (
    name          TEXT PRIMARY KEY NOT NULL,
    info          TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    online        INTEGER NOT NULL CHECK (online IN (0, 1))
);
"#;

/// Points waiting for InfluxDB, one line-protocol line each, in queue order.
/// Added to stores of schema version 1 without a version change: older
/// programs simply ignore the table. `parked` holds why the server refused a
/// point for good (such points stay here for inspection and are not retried).
const OUTBOX_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS influx_outbox (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    line      TEXT NOT NULL,
    queued_ms INTEGER NOT NULL,
    parked    TEXT
);
"#;

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{context}: {source}")]
    Sqlite { context: String, source: rusqlite::Error },
    #[error("{context}: {source}")]
    Json { context: String, source: serde_json::Error },
    #[error(
        "study {study:?} already exists in the store with a different configuration \
         (give the study a new name, or resume it with its original file)"
    )]
    ConfigMismatch { study: String },
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
    #[error("exporting study {study:?}: {source}")]
    Csv { study: String, source: csv::Error },
    #[error("exporting study {study:?}: {source}")]
    Write { study: String, source: std::io::Error },
}

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Adds what the store was doing to a SQLite error.
trait SqlContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| StoreError::Sqlite { context: context(), source })
    }
}

/// Where a trial is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TrialState {
    Pending,
    Running,
    Done,
    Failed,
}

impl TrialState {
    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Pending => "pending",
            TrialState::Running => "running",
            TrialState::Done => "done",
            TrialState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [TrialState::Pending, TrialState::Running, TrialState::Done, TrialState::Failed]
            .into_iter()
            .find(|t| t.as_str() == s)
    }

    /// Done or failed: no more attempts are assigned (a trial failed without
    /// a result may still take the late result of an attempt it had).
    pub fn is_final(self) -> bool {
        matches!(self, TrialState::Done | TrialState::Failed)
    }
}

impl fmt::Display for TrialState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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

/// What [`Batch::create_study`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StudyOpened {
    /// A new study with all its trials pending.
    Created,
    /// The study existed with the same configuration; its rows are kept.
    Resumed,
}

/// What [`Batch::record_result`] did with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The trial's one accepted result.
    Stored,
    /// This attempt's result was already stored (a retransmission).
    Duplicate,
    /// Another attempt owns the trial (or already delivered its result): the
    /// attempt is marked superseded and nothing is added to `results`.
    Superseded,
}

/// Format of [`Store::export`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// One row per trial, one column per parameter.
    Csv,
    /// An array of objects, one per trial, with the full measurement.
    Json,
}

/// A study as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StudyRow {
    pub name: String,
    /// The study file text it was created from.
    pub config: String,
    pub metric: String,
    pub direction: Direction,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
    pub state: StudyState,
    /// Trials of the study, repeats included.
    pub total: u64,
    pub pending: u64,
    pub running: u64,
    pub done: u64,
    pub failed: u64,
}

/// A trial as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialRow {
    pub trial: u64,
    pub repeat: u32,
    pub params: Params,
    pub state: TrialState,
    /// The highest attempt number assigned so far (0: never assigned).
    pub attempts: u32,
    /// Why the trial failed, when it did.
    pub reason: Option<String>,
    /// The agent of the accepted result, else of the latest attempt.
    pub agent: Option<String>,
    /// The objective of the accepted result, when it succeeded and had one.
    pub objective: Option<f64>,
    /// Attempts that ended without becoming the trial's result (requeued,
    /// reassigned, ended by [`Batch::end_attempt`]...).
    pub failures: u32,
}

impl TrialRow {
    /// The plan this trial came from, to render it again on resume.
    pub fn plan(&self) -> TrialPlan {
        TrialPlan { trial: self.trial, params: self.params.clone(), repeat: self.repeat }
    }
}

/// Counts of a study's trials by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TrialCounts {
    pub pending: u64,
    pub running: u64,
    pub done: u64,
    pub failed: u64,
}

impl TrialCounts {
    pub fn total(&self) -> u64 {
        self.pending + self.running + self.done + self.failed
    }
}

/// One attempt of a trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRow {
    pub trial: u64,
    pub attempt: u32,
    pub agent: String,
    pub assigned_ms: u64,
    pub ended_ms: Option<u64>,
    pub outcome: Option<String>,
    pub superseded: bool,
}

/// The accepted result of a trial.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResultRow {
    pub trial: u64,
    pub repeat: u32,
    pub params: Params,
    pub attempt: u32,
    pub agent: String,
    pub success: bool,
    pub objective: Option<f64>,
    pub wall_us: u64,
    pub user_us: u64,
    pub sys_us: u64,
    pub exit: String,
    pub energy_j: Option<f64>,
    pub energy_source: Option<String>,
    pub received_ms: u64,
    pub measurement: Measurement,
}

/// One of the best results of a study (see [`Store::best`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BestRow {
    pub trial: u64,
    pub repeat: u32,
    pub params: Params,
    pub objective: f64,
    pub attempt: u32,
    pub agent: String,
    pub wall_us: u64,
    pub energy_j: Option<f64>,
    pub energy_source: Option<String>,
}

/// Successful results [`Store::best`] does not rank (see [`Store::unranked`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Unranked {
    /// The objective is `energy` and the energy reading is invalid (a
    /// battery charging or on external power, a zone that vanished...).
    pub invalid_energy: u64,
    /// No value for the objective (the workload did not report the metric).
    pub no_value: u64,
}

impl Unranked {
    pub fn total(&self) -> u64 {
        self.invalid_energy + self.no_value
    }
}

/// A point waiting in the InfluxDB outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// Queue position; grows with every point queued.
    pub id: i64,
    /// The point in line protocol, millisecond timestamp, no trailing newline.
    pub line: String,
}

/// How many points the InfluxDB outbox holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutboxCounts {
    /// Points still to deliver.
    pub waiting: u64,
    /// Points the server refused for good, kept for inspection.
    pub parked: u64,
}

/// An agent the coordinator has seen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRow {
    pub name: String,
    pub info: AgentInfo,
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    pub online: bool,
}

/// The SQLite study store.
pub struct Store {
    conn: Connection,
    path: String,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the store at `path`, in WAL mode.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let conn = Connection::open(path).ctx(|| format!("{shown}: cannot open store"))?;
        conn.busy_timeout(BUSY_TIMEOUT).ctx(|| format!("{shown}: setting busy_timeout"))?;
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))
            .ctx(|| format!("{shown}: switching to WAL"))?;
        Self::prepare(conn, shown)
    }

    /// Opens an existing store for queries only.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        let conn = Connection::open_with_flags(path, flags).ctx(|| format!("{shown}: cannot open store"))?;
        conn.busy_timeout(BUSY_TIMEOUT).ctx(|| format!("{shown}: setting busy_timeout"))?;
        let found: i64 =
            conn.pragma_query_value(None, "user_version", |r| r.get(0)).ctx(|| format!("{shown}: reading schema"))?;
        if found != SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion { path: shown, found });
        }
        conn.set_prepared_statement_cache_capacity(32);
        Ok(Store { conn, path: shown })
    }

    /// A store in memory, for tests and dry runs.
    pub fn open_in_memory() -> Result<Self> {
        let conn = Connection::open_in_memory().ctx(|| "opening an in-memory store".to_string())?;
        Self::prepare(conn, ":memory:".to_string())
    }

    fn prepare(conn: Connection, path: String) -> Result<Self> {
        conn.pragma_update(None, "synchronous", "NORMAL").ctx(|| format!("{path}: setting synchronous"))?;
        conn.set_prepared_statement_cache_capacity(32);
        let mut store = Store { conn, path };
        store.migrate()?;
        Ok(store)
    }

    /// Creates the schema in a fresh file; refuses a file from a newer version.
    fn migrate(&mut self) -> Result<()> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(|| format!("{path}: starting schema transaction"))?;
        let found: i64 =
            tx.pragma_query_value(None, "user_version", |r| r.get(0)).ctx(|| format!("{path}: reading schema"))?;
        match found {
            0 => {
                tx.execute_batch(SCHEMA).ctx(|| format!("{path}: creating schema"))?;
                tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                    .ctx(|| format!("{path}: setting schema version"))?;
            }
            SCHEMA_VERSION => {}
            found => return Err(StoreError::SchemaVersion { path, found }),
        }
        tx.execute_batch(OUTBOX_SCHEMA).ctx(|| format!("{path}: creating the InfluxDB outbox"))?;
        tx.execute_batch(keys::KEYS_SCHEMA).ctx(|| format!("{path}: creating the agent keys table"))?;
        tx.commit().ctx(|| format!("{path}: committing schema"))
    }

    /// Where the store lives (`:memory:` for an in-memory store).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Starts a write transaction. Dropping the batch without
    /// [`Batch::commit`] rolls everything in it back.
    pub fn batch(&mut self) -> Result<Batch<'_>> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .ctx(|| format!("{}: starting a write transaction", self.path))?;
        Ok(Batch { tx })
    }

    /// Every study, oldest first.
    pub fn studies(&self) -> Result<Vec<StudyRow>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("{STUDY_SELECT} ORDER BY s.created_ms, s.name"))
            .ctx(|| "listing studies".into())?;
        let rows = stmt.query_map([], study_row).ctx(|| "listing studies".into())?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(|| "listing studies".into())
    }

    /// One study, if it exists.
    pub fn study(&self, name: &str) -> Result<Option<StudyRow>> {
        study_by_name(&self.conn, name)
    }

    /// Every trial of `study`, by trial id.
    pub fn trials(&self, study: &str) -> Result<Vec<TrialRow>> {
        self.trial_rows(study, &format!("{TRIAL_SELECT} ORDER BY t.trial"))
    }

    /// Trials without a final outcome (pending or running), by trial id: what
    /// a resumed study still has to run. Running trials were interrupted;
    /// [`Batch::reset_running`] turns them back into pending ones.
    pub fn pending_trials(&self, study: &str) -> Result<Vec<TrialRow>> {
        self.trial_rows(study, &format!("{TRIAL_SELECT} AND t.state IN ('pending', 'running') ORDER BY t.trial"))
    }

    fn trial_rows(&self, study: &str, sql: &str) -> Result<Vec<TrialRow>> {
        let context = || format!("reading trials of study {study:?}");
        let mut stmt = self.conn.prepare_cached(sql).ctx(context)?;
        let rows = stmt.query_map([study], trial_row).ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// How many trials of `study` are in each state.
    pub fn trial_counts(&self, study: &str) -> Result<TrialCounts> {
        let context = || format!("counting trials of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached("SELECT state, COUNT(*) FROM trials WHERE study = ?1 GROUP BY state")
            .ctx(context)?;
        let mut rows = stmt.query([study]).ctx(context)?;
        let mut counts = TrialCounts::default();
        while let Some(row) = rows.next().ctx(context)? {
            let n = get_u64(row, 1).ctx(context)?;
            match trial_state(row, 0).ctx(context)? {
                TrialState::Pending => counts.pending = n,
                TrialState::Running => counts.running = n,
                TrialState::Done => counts.done = n,
                TrialState::Failed => counts.failed = n,
            }
        }
        Ok(counts)
    }

    /// Every attempt of one trial, in order.
    pub fn attempts(&self, study: &str, trial: u64) -> Result<Vec<AttemptRow>> {
        let context = || format!("reading attempts of {study}/{trial}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT trial, attempt, agent, assigned_ms, ended_ms, outcome, superseded
                 FROM attempts WHERE study = ?1 AND trial = ?2 ORDER BY attempt",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map(params![study, to_i64("trial", trial)?], |row| {
                Ok(AttemptRow {
                    trial: get_u64(row, 0)?,
                    attempt: row.get(1)?,
                    agent: row.get(2)?,
                    assigned_ms: get_u64(row, 3)?,
                    ended_ms: get_opt_u64(row, 4)?,
                    outcome: row.get(5)?,
                    superseded: row.get(6)?,
                })
            })
            .ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// Every accepted result of `study`, by trial id.
    pub fn results(&self, study: &str) -> Result<Vec<ResultRow>> {
        let context = || format!("reading results of study {study:?}");
        let mut stmt = self.conn.prepare_cached(&format!("{RESULT_SELECT} ORDER BY r.trial")).ctx(context)?;
        let rows = stmt.query_map(params![study], result_row).ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// The `n` best successful results with an objective, in the study's
    /// direction; ties go to the lower trial id. In an `energy` study only
    /// valid energy readings are ranked (stores written before objectives
    /// left invalid readings out hold their joules anyway); [`Store::unranked`]
    /// counts what was left out.
    pub fn best(&self, study: &str, n: usize) -> Result<Vec<BestRow>> {
        let row = self.study(study)?.ok_or_else(|| StoreError::UnknownStudy(study.to_string()))?;
        let order = match row.direction {
            Direction::Minimize => "ASC",
            Direction::Maximize => "DESC",
        };
        let sql = format!(
            "SELECT r.trial, t.repeat, t.params, r.objective, r.attempt, r.agent, r.wall_us, r.energy_j,
                    r.energy_source
             FROM results r JOIN trials t ON t.study = r.study AND t.trial = r.trial
             WHERE r.study = ?1 AND r.success = 1 AND r.objective IS NOT NULL
                   AND (?3 != 'energy' OR r.energy_valid = 1)
             ORDER BY r.objective {order}, r.trial ASC LIMIT ?2"
        );
        let context = || format!("reading the best results of study {study:?}");
        let mut stmt = self.conn.prepare_cached(&sql).ctx(context)?;
        let limit = i64::try_from(n).unwrap_or(i64::MAX);
        let rows = stmt
            .query_map(params![study, limit, row.metric], |row| {
                Ok(BestRow {
                    trial: get_u64(row, 0)?,
                    repeat: row.get(1)?,
                    params: params_col(row, 2)?,
                    objective: row.get(3)?,
                    attempt: row.get(4)?,
                    agent: row.get(5)?,
                    wall_us: get_u64(row, 6)?,
                    energy_j: row.get(7)?,
                    energy_source: row.get(8)?,
                })
            })
            .ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// Successful results of `study` that [`Store::best`] leaves out, by why.
    pub fn unranked(&self, study: &str) -> Result<Unranked> {
        let row = self.study(study)?.ok_or_else(|| StoreError::UnknownStudy(study.to_string()))?;
        let context = || format!("counting the unranked results of study {study:?}");
        self.conn
            .prepare_cached(
                "SELECT COALESCE(SUM(?2 = 'energy' AND COALESCE(energy_valid, 0) = 0), 0),
                        COALESCE(SUM(objective IS NULL AND NOT (?2 = 'energy' AND COALESCE(energy_valid, 0) = 0)), 0)
                 FROM results WHERE study = ?1 AND success = 1",
            )
            .ctx(context)?
            .query_row(params![study, row.metric], |r| {
                Ok(Unranked { invalid_energy: get_u64(r, 0)?, no_value: get_u64(r, 1)? })
            })
            .ctx(context)
    }

    /// Progress reports of one attempt, by epoch: `(epoch, elapsed_us, metrics)`.
    pub fn progress(&self, trial: &TrialRef) -> Result<Vec<(u32, u64, tunefleet_common::measurement::Metrics)>> {
        let context = || format!("reading progress of {trial}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT epoch, elapsed_us, metrics FROM progress
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3 ORDER BY epoch",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map(params![trial.study, to_i64("trial", trial.trial)?, trial.attempt], |row| {
                Ok((row.get(0)?, get_u64(row, 1)?, json_col(row, 2)?))
            })
            .ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// Every agent seen, by name.
    pub fn agents(&self) -> Result<Vec<AgentRow>> {
        let context = || "listing agents".to_string();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, info, first_seen_ms, last_seen_ms, online FROM agents ORDER BY name")
            .ctx(context)?;
        let rows = stmt
            .query_map([], |row| {
                Ok(AgentRow {
                    name: row.get(0)?,
                    info: json_col(row, 1)?,
                    first_seen_ms: get_u64(row, 2)?,
                    last_seen_ms: get_u64(row, 3)?,
                    online: row.get(4)?,
                })
            })
            .ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// Writes one row per trial of `study` to `out`.
    ///
    /// CSV columns: `trial, repeat, state`, one column per parameter (named
    /// after it, prefixed `param_` if it collides with a fixed column),
    /// `objective, wall_us, energy_j, energy_source, energy_valid, agent,
    /// attempt, attempts, exit`. JSON: an array of objects with the same
    /// fields, `params` as an object and the full `measurement` (or null).
    pub fn export(&self, study: &str, format: ExportFormat, out: &mut impl Write) -> Result<()> {
        if self.study(study)?.is_none() {
            return Err(StoreError::UnknownStudy(study.to_string()));
        }
        let rows = self.export_rows(study)?;
        match format {
            ExportFormat::Csv => write_csv(study, &rows, out),
            ExportFormat::Json => write_json(study, &rows, out),
        }
    }

    /// The first `limit` points waiting for InfluxDB, oldest first (parked
    /// points are skipped).
    pub fn outbox_next(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        let context = || "reading the InfluxDB outbox".to_string();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, line FROM influx_outbox WHERE parked IS NULL ORDER BY id LIMIT ?1")
            .ctx(context)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map([limit], |row| Ok(OutboxRow { id: row.get(0)?, line: row.get(1)? })).ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }

    /// Removes delivered points; returns how many rows went.
    pub fn outbox_delete(&mut self, ids: &[i64]) -> Result<u64> {
        let context = || format!("removing {} delivered points from the InfluxDB outbox", ids.len());
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).ctx(context)?;
        let mut n = 0;
        {
            let mut stmt = tx.prepare_cached("DELETE FROM influx_outbox WHERE id = ?1").ctx(context)?;
            for id in ids {
                n += stmt.execute([id]).ctx(context)? as u64;
            }
        }
        tx.commit().ctx(context)?;
        Ok(n)
    }

    /// Marks a point the server refused for good: it stays in the outbox,
    /// with `reason`, and is not sent again. Returns false for an unknown id.
    pub fn outbox_park(&mut self, id: i64, reason: &str) -> Result<bool> {
        let context = || format!("parking point {id} of the InfluxDB outbox");
        let n = self
            .conn
            .prepare_cached("UPDATE influx_outbox SET parked = ?2 WHERE id = ?1")
            .ctx(context)?
            .execute(params![id, reason])
            .ctx(context)?;
        Ok(n > 0)
    }

    /// How many points wait in the InfluxDB outbox, and how many are parked.
    pub fn outbox_counts(&self) -> Result<OutboxCounts> {
        let context = || "counting the InfluxDB outbox".to_string();
        self.conn
            .prepare_cached(
                "SELECT COUNT(*) FILTER (WHERE parked IS NULL), COUNT(*) FILTER (WHERE parked IS NOT NULL)
                 FROM influx_outbox",
            )
            .ctx(context)?
            .query_row([], |r| Ok(OutboxCounts { waiting: get_u64(r, 0)?, parked: get_u64(r, 1)? }))
            .ctx(context)
    }

    fn export_rows(&self, study: &str) -> Result<Vec<ExportRow>> {
        let context = || format!("exporting study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT t.trial, t.repeat, t.state, t.params, t.attempts,
                        r.objective, r.wall_us, r.energy_j, r.energy_source, r.energy_valid,
                        r.agent, r.attempt, r.exit, r.measurement
                 FROM trials t LEFT JOIN results r ON r.study = t.study AND r.trial = t.trial
                 WHERE t.study = ?1 ORDER BY t.trial",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |row| {
                let measurement: Option<String> = row.get(13)?;
                let measurement = match measurement {
                    Some(text) => Some(
                        serde_json::from_str::<serde_json::Value>(&text)
                            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(13, Type::Text, Box::new(e)))?,
                    ),
                    None => None,
                };
                Ok(ExportRow {
                    trial: get_u64(row, 0)?,
                    repeat: row.get(1)?,
                    state: trial_state(row, 2)?,
                    params: params_col(row, 3)?,
                    attempts: row.get(4)?,
                    objective: row.get(5)?,
                    wall_us: get_opt_u64(row, 6)?,
                    energy_j: row.get(7)?,
                    energy_source: row.get(8)?,
                    energy_valid: row.get(9)?,
                    agent: row.get(10)?,
                    attempt: row.get(11)?,
                    exit: row.get(12)?,
                    measurement,
                })
            })
            .ctx(context)?;
        rows.collect::<rusqlite::Result<Vec<_>>>().ctx(context)
    }
}

/// A write transaction over the store; see [`Store::batch`].
pub struct Batch<'a> {
    tx: Transaction<'a>,
}

impl fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch").finish_non_exhaustive()
    }
}

impl Batch<'_> {
    /// Commits everything recorded in this batch.
    pub fn commit(self) -> Result<()> {
        self.tx.commit().ctx(|| "committing a batch".into())
    }

    /// Creates `study` with the trials of `plan`, all pending. If a study of
    /// that name exists with the same configuration it is kept as it is
    /// (resume); with a different configuration it is refused.
    ///
    /// Configurations are the same when the file text is identical, or when
    /// both texts parse to the same study (comments and layout may differ).
    pub fn create_study(&mut self, study: &Study, plan: &[TrialPlan]) -> Result<StudyOpened> {
        self.create_study_at(study, plan, unix_ms())
    }

    /// [`Batch::create_study`] with an explicit creation time.
    pub fn create_study_at(&mut self, study: &Study, plan: &[TrialPlan], at_ms: u64) -> Result<StudyOpened> {
        if let Some(existing) = study_by_name(&self.tx, &study.name)? {
            return if same_config(&existing.config, study) {
                Ok(StudyOpened::Resumed)
            } else {
                Err(StoreError::ConfigMismatch { study: study.name.clone() })
            };
        }
        let context = || format!("creating study {:?}", study.name);
        self.tx
            .prepare_cached(
                "INSERT INTO studies (name, config, metric, direction, created_ms, finished_ms, state)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL, 'running')",
            )
            .ctx(context)?
            .execute(params![
                study.name,
                study.source,
                study.objective.metric,
                study.objective.direction.as_str(),
                to_i64("time", at_ms)?
            ])
            .ctx(context)?;
        let mut insert = self
            .tx
            .prepare_cached(
                "INSERT INTO trials (study, trial, params, repeat, state, attempts)
                 VALUES (?1, ?2, ?3, ?4, 'pending', 0)",
            )
            .ctx(context)?;
        for t in plan {
            let params = params_json(&t.params);
            insert.execute(params![study.name, to_i64("trial", t.trial)?, params, t.repeat]).ctx(context)?;
        }
        Ok(StudyOpened::Created)
    }

    /// Marks `trial` running as attempt `trial.attempt` on `agent`. Earlier
    /// attempts still open are closed as reassigned.
    pub fn record_assignment(&mut self, trial: &TrialRef, agent: &str, at_ms: u64) -> Result<()> {
        let context = || format!("recording the assignment of {trial} to {agent}");
        let (state, _) = self.trial_state(trial)?;
        if state.is_final() {
            return Err(StoreError::TrialClosed { study: trial.study.clone(), trial: trial.trial, state });
        }
        let id = to_i64("trial", trial.trial)?;
        let at = to_i64("time", at_ms)?;
        self.tx
            .prepare_cached("UPDATE trials SET state = 'running', attempts = ?3 WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?4, outcome = 'reassigned'
                 WHERE study = ?1 AND trial = ?2 AND attempt <> ?3 AND ended_ms IS NULL",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt, at])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "INSERT INTO attempts (study, trial, attempt, agent, assigned_ms, ended_ms, outcome, superseded)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL, NULL, 0)
                 ON CONFLICT (study, trial, attempt) DO UPDATE SET
                     agent = excluded.agent, assigned_ms = excluded.assigned_ms,
                     ended_ms = NULL, outcome = NULL, superseded = 0",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt, agent, at])
            .ctx(context)?;
        Ok(())
    }

    /// Records the measurement of one attempt; at most one result per trial
    /// is ever accepted. An accepted result makes the trial `done` when the
    /// workload exited with status 0 and `failed` otherwise (an engine that
    /// wants to retry a failed run calls [`Batch::requeue`] instead). A trial
    /// failed without a result ([`Batch::fail_trial`]) still takes the late
    /// result of an attempt it had.
    pub fn record_result(
        &mut self,
        trial: &TrialRef,
        agent: &str,
        measurement: &Measurement,
        objective: Option<f64>,
        at_ms: u64,
    ) -> Result<RecordOutcome> {
        let context = || format!("recording the result of {trial} from {agent}");
        let id = to_i64("trial", trial.trial)?;
        let at = to_i64("time", at_ms)?;
        let exit = exit_text(&measurement.exit);

        let accepted: Option<u32> = self
            .tx
            .prepare_cached("SELECT attempt FROM results WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .query_row(params![trial.study, id], |r| r.get(0))
            .optional()
            .ctx(context)?;
        if accepted == Some(trial.attempt) {
            return Ok(RecordOutcome::Duplicate);
        }
        // An unknown trial is an error.
        self.trial_state(trial)?;
        // Any attempt really handed to this agent may complete a trial that has
        // no result yet, a trial failed because its attempts ran out included (a
        // result that arrives after its agent was presumed dead is still a good
        // result); everything after that is superseded.
        let held: bool = self
            .tx
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM attempts WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?4)",
            )
            .ctx(context)?
            .query_row(params![trial.study, id, trial.attempt, agent], |r| r.get(0))
            .ctx(context)?;
        if accepted.is_some() || !held {
            self.tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO attempts (study, trial, attempt, agent, assigned_ms, superseded)
                     VALUES (?1, ?2, ?3, ?4, ?5, 1)",
                )
                .ctx(context)?
                .execute(params![trial.study, id, trial.attempt, agent, at])
                .ctx(context)?;
            self.tx
                .prepare_cached(
                    "UPDATE attempts SET superseded = 1, ended_ms = COALESCE(ended_ms, ?4),
                         outcome = COALESCE(outcome || '; ', '') || 'superseded result: ' || ?5
                     WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?6 AND superseded = 0",
                )
                .ctx(context)?
                .execute(params![trial.study, id, trial.attempt, at, exit, agent])
                .ctx(context)?;
            return Ok(RecordOutcome::Superseded);
        }

        let success = measurement.exit.success();
        let objective = objective.filter(|v| v.is_finite());
        let json =
            serde_json::to_string(measurement).map_err(|source| StoreError::Json { context: context(), source })?;
        let energy = &measurement.energy;
        self.tx
            .prepare_cached(
                "INSERT INTO results (study, trial, attempt, agent, success, objective, wall_us, user_us, sys_us,
                     max_rss_kib, exit, energy_j, energy_source, energy_valid, measurement, received_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )
            .ctx(context)?
            .execute(params![
                trial.study,
                id,
                trial.attempt,
                agent,
                success,
                objective,
                to_i64("wall_us", measurement.wall_us)?,
                to_i64("user_us", measurement.user_us)?,
                to_i64("sys_us", measurement.sys_us)?,
                to_i64("max_rss_kib", measurement.max_rss_kib)?,
                exit,
                energy.joules.is_finite().then_some(energy.joules),
                energy.source.as_str(),
                energy.valid,
                json,
                at
            ])
            .ctx(context)?;
        let (new_state, reason) =
            if success { (TrialState::Done, None) } else { (TrialState::Failed, Some(exit.as_str())) };
        self.tx
            .prepare_cached("UPDATE trials SET state = ?3, reason = ?4 WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .execute(params![trial.study, id, new_state.as_str(), reason])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?4, outcome = ?5 WHERE study = ?1 AND trial = ?2 AND attempt = ?3",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt, at, exit])
            .ctx(context)?;
        // A newer attempt still open is cancelled: this result came first.
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?4, outcome = 'cancelled: attempt ' || ?3 || ' delivered first'
                 WHERE study = ?1 AND trial = ?2 AND attempt != ?3 AND ended_ms IS NULL",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt, at])
            .ctx(context)?;
        Ok(RecordOutcome::Stored)
    }

    /// Closes an attempt that ended without a result (the workload could not
    /// start, was cancelled...) with `outcome`; the trial state is left to
    /// [`Batch::requeue`] or [`Batch::fail_trial`]. An attempt already closed
    /// keeps its first outcome. Returns false for an attempt never assigned.
    pub fn end_attempt(&mut self, trial: &TrialRef, agent: &str, outcome: &str, at_ms: u64) -> Result<bool> {
        let context = || format!("ending attempt {trial} on {agent}");
        let n = self
            .tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = COALESCE(ended_ms, ?4), outcome = COALESCE(outcome, ?5)
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3",
            )
            .ctx(context)?
            .execute(params![
                trial.study,
                to_i64("trial", trial.trial)?,
                trial.attempt,
                to_i64("time", at_ms)?,
                outcome
            ])
            .ctx(context)?;
        Ok(n > 0)
    }

    /// Stores one epoch's metrics; a repeated report of the same epoch is ignored.
    pub fn record_progress(&mut self, progress: &Progress) -> Result<()> {
        let t = &progress.trial;
        let context = || format!("recording progress of {t}");
        let metrics = serde_json::to_string(&progress.metrics)
            .map_err(|source| StoreError::Json { context: context(), source })?;
        self.tx
            .prepare_cached(
                "INSERT OR IGNORE INTO progress (study, trial, attempt, epoch, metrics, elapsed_us)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .ctx(context)?
            .execute(params![
                t.study,
                to_i64("trial", t.trial)?,
                t.attempt,
                progress.epoch,
                metrics,
                to_i64("elapsed_us", progress.elapsed_us)?
            ])
            .ctx(context)?;
        Ok(())
    }

    /// The attempt ended without a result (timeout of the agent, refusal,
    /// agent gone): the attempt is closed with `reason` and the trial is
    /// pending again. Returns false (and changes no trial) when the trial is
    /// not running this attempt any more.
    pub fn requeue(&mut self, trial: &TrialRef, reason: &str) -> Result<bool> {
        self.requeue_at(trial, reason, unix_ms())
    }

    /// [`Batch::requeue`] with an explicit time.
    pub fn requeue_at(&mut self, trial: &TrialRef, reason: &str, at_ms: u64) -> Result<bool> {
        let context = || format!("requeueing {trial}");
        let id = to_i64("trial", trial.trial)?;
        self.trial_state(trial)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = COALESCE(ended_ms, ?4), outcome = COALESCE(outcome, ?5)
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt, to_i64("time", at_ms)?, reason])
            .ctx(context)?;
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE trials SET state = 'pending'
                 WHERE study = ?1 AND trial = ?2 AND state = 'running' AND attempts = ?3",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt])
            .ctx(context)?;
        Ok(changed > 0)
    }

    /// Gives up on a trial (attempts exhausted, study cancelled). Open
    /// attempts are closed with `reason`. A trial that already has its final
    /// outcome is left as it is; returns whether the trial changed.
    pub fn fail_trial(&mut self, study: &str, trial: u64, reason: &str) -> Result<bool> {
        self.fail_trial_at(study, trial, reason, unix_ms())
    }

    /// [`Batch::fail_trial`] with an explicit time.
    pub fn fail_trial_at(&mut self, study: &str, trial: u64, reason: &str, at_ms: u64) -> Result<bool> {
        let context = || format!("failing trial {study}/{trial}");
        let r = TrialRef { study: study.to_string(), trial, attempt: 0 };
        self.trial_state(&r)?;
        let id = to_i64("trial", trial)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?3, outcome = ?4
                 WHERE study = ?1 AND trial = ?2 AND ended_ms IS NULL",
            )
            .ctx(context)?
            .execute(params![study, id, to_i64("time", at_ms)?, reason])
            .ctx(context)?;
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE trials SET state = 'failed', reason = ?3
                 WHERE study = ?1 AND trial = ?2 AND state IN ('pending', 'running')",
            )
            .ctx(context)?
            .execute(params![study, id, reason])
            .ctx(context)?;
        Ok(changed > 0)
    }

    /// On resume: every running trial of `study` goes back to pending and its
    /// open attempt is closed with `reason`. Returns how many trials changed.
    pub fn reset_running(&mut self, study: &str, reason: &str, at_ms: u64) -> Result<u64> {
        let context = || format!("resetting running trials of study {study:?}");
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?2, outcome = ?3
                 WHERE study = ?1 AND ended_ms IS NULL
                   AND trial IN (SELECT trial FROM trials WHERE study = ?1 AND state = 'running')",
            )
            .ctx(context)?
            .execute(params![study, to_i64("time", at_ms)?, reason])
            .ctx(context)?;
        let n = self
            .tx
            .prepare_cached("UPDATE trials SET state = 'pending' WHERE study = ?1 AND state = 'running'")
            .ctx(context)?
            .execute([study])
            .ctx(context)?;
        Ok(n as u64)
    }

    /// Records an agent's announcement; it is online from now on.
    pub fn upsert_agent(&mut self, info: &AgentInfo, at_ms: u64) -> Result<()> {
        let context = || format!("recording agent {}", info.agent);
        let json = serde_json::to_string(info).map_err(|source| StoreError::Json { context: context(), source })?;
        let at = to_i64("time", at_ms)?;
        self.tx
            .prepare_cached(
                "INSERT INTO agents (name, info, first_seen_ms, last_seen_ms, online) VALUES (?1, ?2, ?3, ?3, 1)
                 ON CONFLICT (name) DO UPDATE SET info = excluded.info, last_seen_ms = excluded.last_seen_ms,
                     online = 1",
            )
            .ctx(context)?
            .execute(params![info.agent, json, at])
            .ctx(context)?;
        Ok(())
    }

    /// Sets an agent's online flag; returns false for an agent never announced.
    pub fn set_agent_online(&mut self, name: &str, online: bool, at_ms: u64) -> Result<bool> {
        let context = || format!("setting agent {name} online={online}");
        let n = self
            .tx
            .prepare_cached("UPDATE agents SET online = ?2, last_seen_ms = MAX(last_seen_ms, ?3) WHERE name = ?1")
            .ctx(context)?
            .execute(params![name, online, to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(n > 0)
    }

    /// Queues points for InfluxDB (line protocol, one point per line). They
    /// are committed with the rest of the batch, so a point exists exactly
    /// when what it describes was stored.
    pub fn enqueue_points(&mut self, lines: &[String], at_ms: u64) -> Result<()> {
        let context = || format!("queueing {} points for InfluxDB", lines.len());
        let at = to_i64("time", at_ms)?;
        let mut stmt =
            self.tx.prepare_cached("INSERT INTO influx_outbox (line, queued_ms) VALUES (?1, ?2)").ctx(context)?;
        for line in lines {
            stmt.execute(params![line, at]).ctx(context)?;
        }
        Ok(())
    }

    /// Marks the study finished.
    pub fn finish_study(&mut self, name: &str, at_ms: u64) -> Result<()> {
        let context = || format!("finishing study {name:?}");
        let n = self
            .tx
            .prepare_cached("UPDATE studies SET state = 'finished', finished_ms = ?2 WHERE name = ?1")
            .ctx(context)?
            .execute(params![name, to_i64("time", at_ms)?])
            .ctx(context)?;
        if n == 0 {
            return Err(StoreError::UnknownStudy(name.to_string()));
        }
        Ok(())
    }

    /// The state and highest attempt of a trial, or `UnknownTrial`.
    fn trial_state(&self, trial: &TrialRef) -> Result<(TrialState, u32)> {
        let context = || format!("reading the state of trial {}/{}", trial.study, trial.trial);
        self.tx
            .prepare_cached("SELECT state, attempts FROM trials WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .query_row(params![trial.study, to_i64("trial", trial.trial)?], |r| Ok((trial_state(r, 0)?, r.get(1)?)))
            .optional()
            .ctx(context)?
            .ok_or_else(|| StoreError::UnknownTrial { study: trial.study.clone(), trial: trial.trial })
    }
}

/// True when the stored study text describes the same study as `study`.
fn same_config(stored: &str, study: &Study) -> bool {
    if stored == study.source {
        return true;
    }
    match study::parse(stored, &study.origin) {
        Ok(mut old) => {
            old.source.clone_from(&study.source);
            old == *study
        }
        Err(_) => false,
    }
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

/// Parameters as a plain JSON object (`{"lr": 0.1, "opt": "sgd"}`).
pub fn params_json(params: &Params) -> String {
    let map: serde_json::Map<String, serde_json::Value> =
        params.iter().map(|(k, v)| (k.clone(), param_value_json(v))).collect();
    serde_json::Value::Object(map).to_string()
}

fn param_value_json(v: &ParamValue) -> serde_json::Value {
    match v {
        ParamValue::Int(i) => serde_json::Value::from(*i),
        ParamValue::Float(f) => serde_json::Number::from_f64(*f).map_or(serde_json::Value::Null, Into::into),
        ParamValue::Text(s) => serde_json::Value::from(s.clone()),
    }
}

/// Parses what [`params_json`] wrote.
pub fn params_from_json(text: &str) -> Result<Params, serde_json::Error> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)?;
    let mut out = Params::new();
    for (k, v) in map {
        let value = match v {
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => ParamValue::Int(i),
                None => ParamValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => ParamValue::Text(s),
            other => ParamValue::Text(other.to_string()),
        };
        out.insert(k, value);
    }
    Ok(out)
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

fn get_u64(row: &Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let v: i64 = row.get(idx)?;
    u64::try_from(v).map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Integer, Box::new(e)))
}

fn get_opt_u64(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<u64>> {
    let v: Option<i64> = row.get(idx)?;
    v.map(|v| u64::try_from(v).map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Integer, Box::new(e))))
        .transpose()
}

fn json_col<T: DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text).map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

fn params_col(row: &Row<'_>, idx: usize) -> rusqlite::Result<Params> {
    let text: String = row.get(idx)?;
    params_from_json(&text).map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, Box::new(e)))
}

fn bad_text(idx: usize, what: &str, value: &str) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, format!("unknown {what} {value:?}").into())
}

fn trial_state(row: &Row<'_>, idx: usize) -> rusqlite::Result<TrialState> {
    let text: String = row.get(idx)?;
    TrialState::parse(&text).ok_or_else(|| bad_text(idx, "trial state", &text))
}

const STUDY_SELECT: &str = "SELECT s.name, s.config, s.metric, s.direction, s.created_ms, s.finished_ms, s.state,
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name),
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'pending'),
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'running'),
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'done'),
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'failed')
    FROM studies s";

fn study_row(row: &Row<'_>) -> rusqlite::Result<StudyRow> {
    let direction: String = row.get(3)?;
    let state: String = row.get(6)?;
    Ok(StudyRow {
        name: row.get(0)?,
        config: row.get(1)?,
        metric: row.get(2)?,
        direction: Direction::parse(&direction).ok_or_else(|| bad_text(3, "direction", &direction))?,
        created_ms: get_u64(row, 4)?,
        finished_ms: get_opt_u64(row, 5)?,
        state: StudyState::parse(&state).ok_or_else(|| bad_text(6, "study state", &state))?,
        total: get_u64(row, 7)?,
        pending: get_u64(row, 8)?,
        running: get_u64(row, 9)?,
        done: get_u64(row, 10)?,
        failed: get_u64(row, 11)?,
    })
}

fn study_by_name(conn: &Connection, name: &str) -> Result<Option<StudyRow>> {
    let context = || format!("reading study {name:?}");
    conn.prepare_cached(&format!("{STUDY_SELECT} WHERE s.name = ?1"))
        .ctx(context)?
        .query_row([name], study_row)
        .optional()
        .ctx(context)
}

const TRIAL_SELECT: &str = "SELECT t.trial, t.repeat, t.params, t.state, t.attempts, t.reason,
        COALESCE(r.agent, a.agent),
        CASE WHEN r.success = 1 THEN r.objective END,
        (SELECT COUNT(*) FROM attempts f
         WHERE f.study = t.study AND f.trial = t.trial AND f.ended_ms IS NOT NULL AND f.attempt IS NOT r.attempt)
    FROM trials t
    LEFT JOIN results r ON r.study = t.study AND r.trial = t.trial
    LEFT JOIN attempts a ON a.study = t.study AND a.trial = t.trial AND a.attempt = t.attempts
    WHERE t.study = ?1";

fn trial_row(row: &Row<'_>) -> rusqlite::Result<TrialRow> {
    Ok(TrialRow {
        trial: get_u64(row, 0)?,
        repeat: row.get(1)?,
        params: params_col(row, 2)?,
        state: trial_state(row, 3)?,
        attempts: row.get(4)?,
        reason: row.get(5)?,
        agent: row.get(6)?,
        objective: row.get(7)?,
        failures: row.get(8)?,
    })
}

const RESULT_SELECT: &str = "SELECT r.trial, t.repeat, t.params, r.attempt, r.agent, r.success, r.objective,
        r.wall_us, r.user_us, r.sys_us, r.exit, r.energy_j, r.energy_source, r.received_ms, r.measurement
    FROM results r JOIN trials t ON t.study = r.study AND t.trial = r.trial
    WHERE r.study = ?1";

fn result_row(row: &Row<'_>) -> rusqlite::Result<ResultRow> {
    Ok(ResultRow {
        trial: get_u64(row, 0)?,
        repeat: row.get(1)?,
        params: params_col(row, 2)?,
        attempt: row.get(3)?,
        agent: row.get(4)?,
        success: row.get(5)?,
        objective: row.get(6)?,
        wall_us: get_u64(row, 7)?,
        user_us: get_u64(row, 8)?,
        sys_us: get_u64(row, 9)?,
        exit: row.get(10)?,
        energy_j: row.get(11)?,
        energy_source: row.get(12)?,
        received_ms: get_u64(row, 13)?,
        measurement: json_col(row, 14)?,
    })
}

/// One exported trial.
struct ExportRow {
    trial: u64,
    repeat: u32,
    state: TrialState,
    params: Params,
    attempts: u32,
    objective: Option<f64>,
    wall_us: Option<u64>,
    energy_j: Option<f64>,
    energy_source: Option<String>,
    energy_valid: Option<bool>,
    agent: Option<String>,
    attempt: Option<u32>,
    exit: Option<String>,
    measurement: Option<serde_json::Value>,
}

const FIXED_COLUMNS: [&str; 12] = [
    "trial",
    "repeat",
    "state",
    "objective",
    "wall_us",
    "energy_j",
    "energy_source",
    "energy_valid",
    "agent",
    "attempt",
    "attempts",
    "exit",
];

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(ToString::to_string).unwrap_or_default()
}

fn write_csv(study: &str, rows: &[ExportRow], out: &mut impl Write) -> Result<()> {
    let names: std::collections::BTreeSet<&str> =
        rows.iter().flat_map(|r| r.params.keys().map(String::as_str)).collect();
    let csv_err = |source| StoreError::Csv { study: study.to_string(), source };
    let mut w = csv::Writer::from_writer(out);
    let mut header: Vec<String> = vec!["trial".into(), "repeat".into(), "state".into()];
    header
        .extend(names.iter().map(|n| if FIXED_COLUMNS.contains(n) { format!("param_{n}") } else { (*n).to_string() }));
    header.extend(FIXED_COLUMNS[3..].iter().map(|s| (*s).to_string()));
    w.write_record(&header).map_err(csv_err)?;
    for r in rows {
        let mut rec: Vec<String> = vec![r.trial.to_string(), r.repeat.to_string(), r.state.to_string()];
        rec.extend(names.iter().map(|n| opt(&r.params.get(*n))));
        rec.extend([
            opt(&r.objective),
            opt(&r.wall_us),
            opt(&r.energy_j),
            opt(&r.energy_source),
            opt(&r.energy_valid),
            opt(&r.agent),
            opt(&r.attempt),
            r.attempts.to_string(),
            opt(&r.exit),
        ]);
        w.write_record(&rec).map_err(csv_err)?;
    }
    w.flush().map_err(|source| StoreError::Write { study: study.to_string(), source })
}

fn write_json(study: &str, rows: &[ExportRow], out: &mut impl Write) -> Result<()> {
    let values: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let params: serde_json::Map<String, serde_json::Value> =
                r.params.iter().map(|(k, v)| (k.clone(), param_value_json(v))).collect();
            serde_json::json!({
                "trial": r.trial,
                "repeat": r.repeat,
                "state": r.state.as_str(),
                "params": params,
                "objective": r.objective,
                "wall_us": r.wall_us,
                "energy_j": r.energy_j,
                "energy_source": r.energy_source,
                "energy_valid": r.energy_valid,
                "agent": r.agent,
                "attempt": r.attempt,
                "attempts": r.attempts,
                "exit": r.exit,
                "measurement": r.measurement,
            })
        })
        .collect();
    serde_json::to_writer_pretty(&mut *out, &values)
        .map_err(|source| StoreError::Json { context: format!("exporting study {study:?}"), source })?;
    out.write_all(b"\n").map_err(|source| StoreError::Write { study: study.to_string(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_json_round_trips_plain_values() {
        let mut p = Params::new();
        p.insert("lr".into(), ParamValue::Float(0.05));
        p.insert("whole".into(), ParamValue::Float(2.0));
        p.insert("batch".into(), ParamValue::Int(32));
        p.insert("opt".into(), ParamValue::Text("sgd".into()));
        let text = params_json(&p);
        assert_eq!(text, r#"{"batch":32,"lr":0.05,"opt":"sgd","whole":2.0}"#);
        assert_eq!(params_from_json(&text).expect("parses"), p);
    }

    #[test]
    fn exit_text_is_readable() {
        assert_eq!(exit_text(&ExitOutcome::Exited(0)), "exited 0");
        assert_eq!(exit_text(&ExitOutcome::Signaled(9)), "signal 9");
        assert_eq!(exit_text(&ExitOutcome::TimedOut), "timed out");
        assert_eq!(exit_text(&ExitOutcome::SpawnFailed("no such file".into())), "spawn failed: no such file");
    }

    #[test]
    fn schema_is_idempotent_and_versioned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.db");
        drop(Store::open(&path).expect("creates"));
        let store = Store::open(&path).expect("reopens");
        let v: i64 = store.conn.pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
        assert_eq!(v, SCHEMA_VERSION);
        let mode: String = store.conn.pragma_query_value(None, "journal_mode", |r| r.get(0)).expect("mode");
        assert_eq!(mode.to_lowercase(), "wal");
        store.conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1).expect("bump");
        drop(store);
        let e = Store::open(&path).expect_err("newer schema refused");
        assert!(matches!(e, StoreError::SchemaVersion { found, .. } if found == SCHEMA_VERSION + 1), "{e}");
    }

    #[test]
    fn trial_state_text_round_trips() {
        for s in [TrialState::Pending, TrialState::Running, TrialState::Done, TrialState::Failed] {
            assert_eq!(TrialState::parse(s.as_str()), Some(s));
        }
        assert_eq!(TrialState::parse("lost"), None);
    }

    fn lines(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix} v={i}i {i}")).collect()
    }

    #[test]
    fn outbox_keeps_order_and_deletes_only_what_was_delivered() {
        let mut store = Store::open_in_memory().expect("store");
        let mut batch = store.batch().expect("batch");
        batch.enqueue_points(&lines("a", 3), 1).expect("queue");
        batch.commit().expect("commit");
        let first = store.outbox_next(2).expect("next");
        assert_eq!(first.iter().map(|r| r.line.as_str()).collect::<Vec<_>>(), ["a v=0i 0", "a v=1i 1"]);
        // Points queued while a write is in flight are not touched by its delete.
        let mut batch = store.batch().expect("batch");
        batch.enqueue_points(&lines("b", 2), 2).expect("queue");
        batch.commit().expect("commit");
        let ids: Vec<i64> = first.iter().map(|r| r.id).collect();
        assert_eq!(store.outbox_delete(&ids).expect("delete"), 2);
        assert_eq!(store.outbox_delete(&ids).expect("delete again"), 0);
        let rest: Vec<String> = store.outbox_next(10).expect("next").into_iter().map(|r| r.line).collect();
        assert_eq!(rest, ["a v=2i 2", "b v=0i 0", "b v=1i 1"]);
        assert_eq!(store.outbox_counts().expect("counts"), OutboxCounts { waiting: 3, parked: 0 });
    }

    #[test]
    fn outbox_points_of_a_rolled_back_batch_do_not_exist() {
        let mut store = Store::open_in_memory().expect("store");
        let mut batch = store.batch().expect("batch");
        batch.enqueue_points(&lines("a", 2), 1).expect("queue");
        drop(batch);
        assert_eq!(store.outbox_counts().expect("counts"), OutboxCounts::default());
    }

    #[test]
    fn parked_points_are_kept_but_not_offered_again() {
        let mut store = Store::open_in_memory().expect("store");
        let mut batch = store.batch().expect("batch");
        batch.enqueue_points(&lines("a", 2), 1).expect("queue");
        batch.commit().expect("commit");
        let rows = store.outbox_next(10).expect("next");
        assert!(store.outbox_park(rows[0].id, "400: bad line").expect("park"));
        assert!(!store.outbox_park(-1, "x").expect("unknown id"));
        assert_eq!(store.outbox_next(10).expect("next"), rows[1..].to_vec());
        assert_eq!(store.outbox_counts().expect("counts"), OutboxCounts { waiting: 1, parked: 1 });
    }

    #[test]
    fn outbox_is_added_to_an_existing_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.db");
        drop(Store::open(&path).expect("creates"));
        // A store written before the outbox existed.
        let conn = Connection::open(&path).expect("raw open");
        conn.execute_batch("DROP TABLE influx_outbox").expect("drop");
        drop(conn);
        let store = Store::open(&path).expect("reopens");
        assert_eq!(store.outbox_counts().expect("outbox exists again"), OutboxCounts::default());
    }
}
