//! Opening a store: the SQLite schema, its version and the migration that
//! creates it.

use std::path::Path;

use super::outbox::OUTBOX_SCHEMA;
use super::sql::{self, Conn, OpenMode};
use super::{enrol, keys, nodes, profiles, Result, SqlContext, Store, StoreError};

/// Version of the schema below, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 6;

/// The trials table (its `state` check changed in version 2, and its form
/// in version 5: a chain of comparisons, where a list of more than two
/// values after `IN` made SQLite build and drop a temporary table, with its
/// own page cache, at every write of a row: three a trial, about a tenth of
/// the coordinator's CPU time at 1,000 short trials a second).
const TRIALS: &str = r#"
CREATE TABLE IF NOT EXISTS trials (
    study    TEXT NOT NULL,
    trial    INTEGER NOT NULL,
    params   TEXT NOT NULL,
    repeat   INTEGER NOT NULL,
    state    TEXT NOT NULL CHECK (
                 state = 'pending' OR state = 'running' OR state = 'done' OR state = 'failed' OR state = 'stopped'
             ),
    attempts INTEGER NOT NULL DEFAULT 0,
    reason   TEXT,
    PRIMARY KEY (study, trial)
);
CREATE INDEX IF NOT EXISTS trials_by_state ON trials (study, state);
"#;

/// The segments of each result (version 2).
const SEGMENTS: &str = r#"
CREATE TABLE IF NOT EXISTS segments (
    study       TEXT NOT NULL,
    trial       INTEGER NOT NULL,
    idx         INTEGER NOT NULL,
    role        TEXT NOT NULL,
    system      TEXT NOT NULL,
    cpus        TEXT NOT NULL,
    first_epoch INTEGER NOT NULL,
    last_epoch  INTEGER NOT NULL,
    start_us    INTEGER NOT NULL,
    wall_us     INTEGER NOT NULL,
    energy_j    REAL,
    cpu_us      INTEGER,
    PRIMARY KEY (study, trial, idx)
);
"#;

/// Every other table.
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
    system        TEXT,
    PRIMARY KEY (study, trial)
);
CREATE INDEX IF NOT EXISTS results_by_success ON results (success, study, objective);
CREATE TABLE IF NOT EXISTS progress (
    study      TEXT NOT NULL,
    trial      INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    epoch      INTEGER NOT NULL,
    metrics    TEXT NOT NULL,
    elapsed_us INTEGER NOT NULL,
    checkpoint TEXT,
    PRIMARY KEY (study, trial, attempt, epoch)
);
CREATE TABLE IF NOT EXISTS agents (
    name          TEXT PRIMARY KEY NOT NULL,
    info          TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms  INTEGER NOT NULL,
    online        INTEGER NOT NULL CHECK (online IN (0, 1)),
    telemetry     TEXT
);
"#;

/// The random id of each study, drawn when the coordinator first runs it
/// ([`super::Batch::study_id`]). Every trial reference carries it, so a
/// result of another study of the same name (another store) is never taken
/// for this one's. Created on open, like the agent keys: a store of an
/// older program opens, and its studies get an id when next run.
pub(super) const STUDY_IDS: &str = r#"
CREATE TABLE IF NOT EXISTS study_ids (
    name TEXT PRIMARY KEY NOT NULL,
    id   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS heartbeat (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    pid        INTEGER NOT NULL,
    beat_ms    INTEGER NOT NULL,
    stopped_ms INTEGER
);
CREATE TABLE IF NOT EXISTS study_changes (
    study  TEXT NOT NULL,
    at_ms  INTEGER NOT NULL,
    change TEXT NOT NULL
);
"#;

/// On a server, a trial's changes of state (given, then done) stay on its
/// page and add no index entry (PostgreSQL's heap-only updates): its pages
/// keep room for them (a fill factor of 70, for pages written from now
/// on), and no index names `state`, whose change would need an entry in
/// every index of the table. Counting a study's trials by state then reads
/// the study's rows by the primary key (10 to 12 ms against 7 to 9 at
/// 20,000 trials); about two thirds of the changes stay on their page and
/// the simulator's 1,000 agents ran 7 % more trials a second (medians of
/// 3 runs). A file keeps its index (SQLite writes every index at every
/// change).
/// Done once: the catalog is read first, so opening a store done so
/// changes nothing (a reader's role need not own the table).
const TRIALS_ON_SERVER: &str = r#"
DO $do$ BEGIN
IF NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = to_regclass('trials')
        AND 'fillfactor=70' = ANY(COALESCE(reloptions, '{}'))) THEN
    ALTER TABLE trials SET (fillfactor = 70);
END IF;
IF to_regclass('trials_by_state') IS NOT NULL THEN
    DROP INDEX trials_by_state;
END IF;
END $do$
"#;

/// The trials table set aside, to be made again by [`TRIALS`] (versions 2
/// and 5).
const TRIALS_ASIDE: &str = r#"
ALTER TABLE trials RENAME TO trials_before;
DROP INDEX IF EXISTS trials_by_state;
"#;

/// After [`TRIALS`] exists again: the rows of the table set aside.
const TRIALS_BACK: &str = r#"
INSERT INTO trials (study, trial, params, repeat, state, attempts, reason)
    SELECT study, trial, params, repeat, state, attempts, reason FROM trials_before;
DROP TABLE trials_before;
"#;

/// Version 2: trials stopped early (`stopped`, in [`TRIALS`]), the system
/// configuration of each result (the one a pipelined trial selected), and
/// segments.
const MIGRATE_1_TO_2: &str = "ALTER TABLE results ADD COLUMN system TEXT;";

/// Version 3: each agent's latest telemetry (load, conditions).
const MIGRATE_2_TO_3: &str = "ALTER TABLE agents ADD COLUMN telemetry TEXT;";

/// Version 4: the checkpoint each epoch reported, so a coordinator that
/// restarted still moves a trial on from its last one (and early stopping
/// replays the epochs it had seen).
const MIGRATE_3_TO_4: &str = "ALTER TABLE progress ADD COLUMN checkpoint TEXT;";

/// Version 6: the joules of a result's GPUs (a column of
/// `results` in a new store too, added after [`SCHEMA`]); `energy_j` is the
/// trial's whole energy, its CPU's share and its GPUs', and NULL here
/// means it was given none.
const MIGRATE_5_TO_6: &str = "ALTER TABLE results ADD COLUMN gpu_energy_j REAL;";

/// `results.violation`: how far a result misses its study's
/// `[[constraint]]`s (0: feasible, NULL: the study has none), added to a
/// store made before it.
/// And `attempts.held`: 1 while an attempt waits on its agent
/// behind busy slots (held ahead), 0 once it runs.
fn add_results_columns(tx: &Conn) -> sql::Result<()> {
    let columns = [("results", "violation", "REAL"), ("attempts", "held", "INTEGER NOT NULL DEFAULT 0")];
    for (table, name, kind) in columns {
        if !tx.has_column(table, name)? {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {name} {kind};"))?;
        }
    }
    Ok(())
}

/// The ranking's index of a store made before it moved: it no longer
/// starts as the results' primary key does (a plan made once on empty
/// tables took it for a lookup by key: `Plans::Once`).
fn move_ranking_index(tx: &Conn) -> sql::Result<()> {
    if !tx.has_index("results_by_objective")? {
        return Ok(());
    }
    tx.execute_batch(
        "DROP INDEX IF EXISTS results_by_objective;
         CREATE INDEX IF NOT EXISTS results_by_success ON results (success, study, objective);",
    )
}

/// The heartbeat's `paused`, `broker` (the embedded broker's counters,
/// JSON) and `waits` (why studies wait, JSON) columns, added to a store
/// made before them.
fn add_heartbeat_columns(tx: &Conn) -> sql::Result<()> {
    let columns = [("paused", "paused INTEGER NOT NULL DEFAULT 0"), ("broker", "broker TEXT"), ("waits", "waits TEXT")];
    for (name, column) in columns {
        if !tx.has_column("heartbeat", name)? {
            tx.execute_batch(&format!("ALTER TABLE heartbeat ADD COLUMN {column};"))?;
        }
    }
    Ok(())
}

/// Creates the store's file 0600 when it is new, and takes group and
/// other access from it and its WAL and shared-memory files when it is not.
fn make_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // A path SQLite understands that is no plain file (":memory:", a URI): SQLite says what is wrong.
        Err(_) => return Ok(()),
    }
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_os_string();
        name.push(suffix);
        let file = Path::new(&name);
        match std::fs::metadata(file) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(m.permissions().mode() & 0o700))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the store at `path`, in WAL mode. The
    /// store holds every study's env (secrets, often): it and its WAL and
    /// shared-memory files are its owner's alone (0600), whatever the
    /// umask (SQLite gives the files it adds the database's mode).
    ///
    /// A `postgres://` location is a store on a PostgreSQL server instead
    /// (see `store/sql/postgres.rs`).
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        if sql::is_postgres(&shown) {
            return Self::open_postgres(&shown, sql::Plans::Once);
        }
        make_private(path).map_err(|source| StoreError::Private { path: shown.clone(), source })?;
        let conn = Conn::open_sqlite(path, OpenMode::ReadWrite).ctx(|| format!("{shown}: cannot open store"))?;
        Self::prepare(conn, shown)
    }

    /// Opens an existing store for queries only.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        if sql::is_postgres(&shown) {
            return Self::open_postgres(&shown, sql::Plans::EachRun);
        }
        let conn = Conn::open_sqlite(path, OpenMode::ReadOnly).ctx(|| format!("{shown}: cannot open store"))?;
        let found = conn.schema_version().ctx(|| format!("{shown}: reading schema"))?;
        if found != SCHEMA_VERSION {
            return Err(StoreError::SchemaVersion { path: shown, found });
        }
        Ok(Store { conn, path: shown })
    }

    /// The store on the PostgreSQL server `location` names, its schema
    /// created or migrated as a file's is, its statements planned as
    /// `plans` says.
    fn open_postgres(location: &str, plans: sql::Plans) -> Result<Self> {
        let mut target = sql::parse_target(location).map_err(|why| StoreError::Sql {
            context: format!("{}: cannot open store", sql::redacted(location)),
            cause: sql::Error::Closed(why),
        })?;
        target.plans = plans;
        let shown = sql::redacted(location);
        let conn = Conn::open_postgres(&target).ctx(|| format!("{shown}: cannot open store"))?;
        Self::prepare(conn, shown)
    }

    /// A store in memory, for tests and dry runs.
    pub fn open_in_memory() -> Result<Self> {
        let conn = Conn::open_sqlite_in_memory().ctx(|| "opening an in-memory store".to_string())?;
        Self::prepare(conn, ":memory:".to_string())
    }

    fn prepare(conn: Conn, path: String) -> Result<Self> {
        let mut store = Store { conn, path };
        store.migrate()?;
        Ok(store)
    }

    /// Creates the schema in a fresh file; refuses a file from a newer version.
    fn migrate(&mut self) -> Result<()> {
        let path = self.path.clone();
        let tx = self.conn.begin().ctx(|| format!("{path}: starting schema transaction"))?;
        let found = tx.schema_version().ctx(|| format!("{path}: reading schema"))?;
        match found {
            0 => {
                for sql in [SCHEMA, TRIALS, SEGMENTS, MIGRATE_5_TO_6] {
                    tx.execute_batch(sql).ctx(|| format!("{path}: creating schema"))?;
                }
                tx.set_schema_version(SCHEMA_VERSION).ctx(|| format!("{path}: setting schema version"))?;
            }
            1..=4 => {
                // The trials table of versions 1 to 4 is made again (its
                // `state` check, versions 2 and 5), its rows kept.
                for sql in [TRIALS_ASIDE, TRIALS, TRIALS_BACK] {
                    tx.execute_batch(sql).ctx(|| format!("{path}: migrating the trials table from version {found}"))?;
                }
                if found == 1 {
                    for sql in [MIGRATE_1_TO_2, SEGMENTS] {
                        tx.execute_batch(sql).ctx(|| format!("{path}: migrating the schema from version 1"))?;
                    }
                }
                if found <= 2 {
                    tx.execute_batch(MIGRATE_2_TO_3).ctx(|| format!("{path}: migrating the schema from version 2"))?;
                }
                if found <= 3 {
                    tx.execute_batch(MIGRATE_3_TO_4).ctx(|| format!("{path}: migrating the schema from version 3"))?;
                }
                tx.execute_batch(MIGRATE_5_TO_6)
                    .ctx(|| format!("{path}: migrating the schema from version {found}"))?;
                tx.set_schema_version(SCHEMA_VERSION).ctx(|| format!("{path}: setting schema version"))?;
            }
            5 => {
                tx.execute_batch(MIGRATE_5_TO_6).ctx(|| format!("{path}: migrating the schema from version 5"))?;
                tx.set_schema_version(SCHEMA_VERSION).ctx(|| format!("{path}: setting schema version"))?;
            }
            SCHEMA_VERSION => {}
            found => return Err(StoreError::SchemaVersion { path, found }),
        }
        tx.execute_batch(STUDY_IDS).ctx(|| format!("{path}: creating the study ids table"))?;
        add_heartbeat_columns(&tx).ctx(|| format!("{path}: adding the heartbeat's columns"))?;
        add_results_columns(&tx).ctx(|| format!("{path}: adding the results' violation"))?;
        move_ranking_index(&tx).ctx(|| format!("{path}: moving the ranking's index"))?;
        tx.execute_batch(OUTBOX_SCHEMA).ctx(|| format!("{path}: creating the InfluxDB outbox"))?;
        tx.execute_batch(keys::KEYS_SCHEMA).ctx(|| format!("{path}: creating the agent keys table"))?;
        tx.execute_batch(enrol::ENROL_SCHEMA).ctx(|| format!("{path}: creating the enrolment tables"))?;
        enrol::add_columns(&tx).ctx(|| format!("{path}: adding the enrolment grants"))?;
        tx.execute_batch(profiles::PROFILES_SCHEMA).ctx(|| format!("{path}: creating the profile tables"))?;
        tx.execute_batch(nodes::NODES_SCHEMA).ctx(|| format!("{path}: creating the node measurements table"))?;
        tx.execute_batch(super::refusals::REFUSALS_SCHEMA).ctx(|| format!("{path}: creating the refusals table"))?;
        tx.execute_batch(super::lifecycle::STUDY_NAMES_SCHEMA)
            .ctx(|| format!("{path}: creating the study names table"))?;
        // Last: they name the columns the steps above add.
        if tx.on_server() {
            tx.execute_batch(TRIALS_ON_SERVER).ctx(|| format!("{path}: making room for a trial's changes"))?;
            tx.execute_batch(super::attempts::grouped_functions())
                .ctx(|| format!("{path}: creating the functions that write many rows at once"))?;
        }
        tx.commit().ctx(|| format!("{path}: committing schema"))
    }

    /// Where the store lives (`:memory:` for an in-memory store).
    pub fn path(&self) -> &str {
        &self.path
    }
}

#[cfg(test)]
mod private_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn regression_the_store_and_its_wal_are_its_owners_alone_whatever_the_umask() {
        let dir = tempfile::tempdir().expect("tmp");
        let fresh = dir.path().join("fresh.db");
        let store = Store::open(&fresh).expect("open");
        drop(store);
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&fresh), 0o600, "a new store");
        // An older store made under umask 022, with its WAL.
        let old = dir.path().join("old.db");
        drop(Store::open(&old).expect("open"));
        for p in [old.clone(), dir.path().join("old.db-wal")] {
            std::fs::write(&p, std::fs::read(&p).unwrap_or_default()).expect("touch");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        let store = Store::open(&old).expect("reopen");
        assert_eq!(mode(&old), 0o600, "an older store made private");
        assert_eq!(mode(&dir.path().join("old.db-wal")), 0o600, "and its WAL");
        drop(store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    /// The trials table of versions 2 to 4.
    const TRIALS_V4: &str = r#"
CREATE TABLE IF NOT EXISTS trials (
    study    TEXT NOT NULL,
    trial    INTEGER NOT NULL,
    params   TEXT NOT NULL,
    repeat   INTEGER NOT NULL,
    state    TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed', 'stopped')),
    attempts INTEGER NOT NULL DEFAULT 0,
    reason   TEXT,
    PRIMARY KEY (study, trial)
);
CREATE INDEX IF NOT EXISTS trials_by_state ON trials (study, state);
"#;

    fn assert_keeps_state_index(store: &Store) {
        let index: i64 = store
            .conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'trials_by_state'",
                (),
                |r| r.get(0),
            )
            .expect("index");
        assert_eq!(index, 1, "the rebuilt trials table keeps its index");
    }

    /// The opcodes SQLite runs for `sql`.
    fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).expect("explain");
        let rows = stmt.query_map((), |r| r.get::<_, String>(1)).expect("rows");
        rows.map(|r| r.expect("opcode")).collect()
    }

    /// Writing a trial's state builds no temporary table (a check with `IN`
    /// and five values did, at every write), in a new store and in one
    /// migrated from version 4 with its rows; the check still refuses a
    /// state that is none of the five.
    #[test]
    fn a_trial_state_is_written_without_a_temporary_table() {
        let update = "UPDATE trials SET state = 'done' WHERE study = 's' AND trial = 0";
        let insert = "INSERT INTO trials (study, trial, params, repeat, state) VALUES ('s', 1, '{}', 0, 'pending')";
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v4.db");
        {
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(&format!("{SCHEMA}{TRIALS_V4}{SEGMENTS}")).expect("v4 schema");
            conn.pragma_update(None, "user_version", 4).expect("version");
            conn.execute(
                "INSERT INTO trials (study, trial, params, repeat, state, attempts) VALUES ('s', 0, '{}', 0, 'running', 2)",
                [],
            )
            .expect("a v4 trial");
            assert!(opcodes(&conn, update).iter().any(|o| o == "OpenEphemeral"), "the version 4 check did build one");
        }
        let migrated = Store::open(&path).expect("migrates");
        let fresh = Store::open_in_memory().expect("fresh");
        for store in [&migrated, &fresh] {
            let v: i64 = store.conn.sqlite().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
            assert_eq!(v, SCHEMA_VERSION);
            for sql in [update, insert] {
                let ops = opcodes(store.conn.sqlite(), sql);
                assert!(!ops.iter().any(|o| o == "OpenEphemeral"), "{sql}: {ops:?}");
            }
            for state in ["pending", "running", "done", "failed", "stopped"] {
                store
                    .conn
                    .execute("INSERT OR REPLACE INTO trials (study, trial, params, repeat, state) VALUES ('c', 0, '{}', 0, ?1)", [state])
                    .expect("a state of the five");
            }
            assert!(store.conn.execute("UPDATE trials SET state = 'gone' WHERE study = 'c'", ()).is_err());
        }
        let kept: (String, u32) = migrated
            .conn
            .query_row("SELECT state, attempts FROM trials WHERE study = 's' AND trial = 0", (), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("the row is kept");
        assert_eq!(kept, ("running".to_string(), 2));
        assert_keeps_state_index(&migrated);
    }

    #[test]
    fn a_version_1_store_is_migrated_and_keeps_its_trials() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v1.db");
        {
            let conn = Connection::open(&path).expect("open");
            let v1 = format!("{SCHEMA}{TRIALS_V4}")
                .replace(", 'stopped'", "")
                .replace(
                    "    received_ms   INTEGER NOT NULL,\n    system        TEXT,",
                    "    received_ms   INTEGER NOT NULL,",
                )
                .replace(",\n    telemetry     TEXT\n", "\n")
                .replace("    checkpoint TEXT,\n", "");
            conn.execute_batch(&v1).expect("v1 schema");
            conn.pragma_update(None, "user_version", 1).expect("version");
            conn.execute(
                "INSERT INTO trials (study, trial, params, repeat, state) VALUES ('s', 0, '{}', 0, 'done')",
                [],
            )
            .expect("a v1 trial");
            assert!(conn.execute("UPDATE trials SET state = 'stopped'", []).is_err(), "v1 refuses 'stopped'");
        }
        let store = Store::open(&path).expect("migrates");
        let v: i64 = store.conn.sqlite().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
        assert_eq!(v, SCHEMA_VERSION);
        assert_eq!(store.trials("s").expect("trials").len(), 1);
        store.conn.execute("UPDATE trials SET state = 'stopped'", ()).expect("v2 takes 'stopped'");
        store.conn.execute("SELECT system FROM results", ()).ok();
        assert_keeps_state_index(&store);
        let n: i64 = store.conn.query_row("SELECT COUNT(*) FROM segments", (), |r| r.get(0)).expect("segments table");
        assert_eq!(n, 0);
    }

    /// A store made with the ranking's index on (study, success, objective)
    /// gets it on (success, study, objective) instead: a plan made once
    /// for every parameter must not take it for a lookup by key.
    #[test]
    fn the_ranking_index_no_longer_starts_as_the_primary_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.db");
        let store = Store::open(&path).expect("opens");
        assert!(store.conn.has_index("results_by_success").expect("reads"));
        store
            .conn
            .execute_batch(
                "DROP INDEX results_by_success;
                 CREATE INDEX results_by_objective ON results (study, success, objective);",
            )
            .expect("the old index");
        drop(store);
        let store = Store::open(&path).expect("reopens");
        assert!(!store.conn.has_index("results_by_objective").expect("reads"), "the old index is gone");
        let columns: Vec<String> = store
            .conn
            .prepare_cached("SELECT name FROM pragma_index_info('results_by_success') ORDER BY seqno")
            .expect("prepares")
            .query_map((), |r| r.get(0))
            .expect("reads")
            .collect::<Result<_, _>>()
            .expect("columns");
        assert_eq!(columns, ["success", "study", "objective"]);
    }

    #[test]
    fn a_version_5_store_gets_the_gpu_energy_column_and_keeps_its_results() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v5.db");
        {
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(&format!("{SCHEMA}{TRIALS}{SEGMENTS}")).expect("v5 schema");
            conn.pragma_update(None, "user_version", 5).expect("version");
            conn.execute(
                "INSERT INTO results (study, trial, attempt, agent, success, wall_us, user_us, sys_us, max_rss_kib,
                     exit, energy_j, measurement, received_ms)
                 VALUES ('s', 0, 1, 'a', 1, 1, 1, 1, 1, 'exited 0', 2.5, '{}', 1)",
                [],
            )
            .expect("a v5 result");
        }
        let store = Store::open(&path).expect("migrates");
        let v: i64 = store.conn.sqlite().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
        assert_eq!(v, SCHEMA_VERSION);
        let (energy, gpu): (f64, Option<f64>) = store
            .conn
            .query_row("SELECT energy_j, gpu_energy_j FROM results WHERE study = 's'", (), |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .expect("the result is kept");
        assert_eq!((energy, gpu), (2.5, None), "no GPU part for a result from before");
        drop(store);
        Store::open(&path).expect("opens again, nothing left to migrate");
        let fresh = Store::open_in_memory().expect("fresh");
        fresh.conn.execute("SELECT gpu_energy_j FROM results", ()).expect("a new store has it");
    }

    #[test]
    fn a_version_3_store_gets_progress_checkpoints_and_keeps_its_progress() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v3.db");
        {
            let conn = Connection::open(&path).expect("open");
            let v3 = format!("{SCHEMA}{TRIALS_V4}{SEGMENTS}").replace("    checkpoint TEXT,\n", "");
            conn.execute_batch(&v3).expect("v3 schema");
            conn.pragma_update(None, "user_version", 3).expect("version");
            conn.execute(
                "INSERT INTO progress (study, trial, attempt, epoch, metrics, elapsed_us) VALUES ('s', 0, 1, 1, '{}', 5)",
                [],
            )
            .expect("a v3 progress row");
        }
        let store = Store::open(&path).expect("migrates");
        let v: i64 = store.conn.sqlite().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
        assert_eq!(v, SCHEMA_VERSION);
        let kept: Option<String> =
            store.conn.query_row("SELECT checkpoint FROM progress", (), |r| r.get(0)).expect("the row is kept");
        assert_eq!(kept, None);
    }

    /// A study of a store made before study ids gets
    /// one when next run, kept from then on; another store's study of the
    /// same name has its own.
    #[test]
    fn a_study_of_an_older_store_gets_an_id_that_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.db");
        {
            let store = Store::open(&path).expect("creates");
            store.conn.execute_batch("DROP TABLE study_ids").expect("as an older program left it");
        }
        let mut store = Store::open(&path).expect("an older store opens");
        let mut batch = store.batch().expect("batch");
        assert_eq!(batch.study_id("exp", 0xfeed_0000_0000_0001).expect("drawn"), 0xfeed_0000_0000_0001);
        assert_eq!(batch.study_id("exp", 2).expect("kept"), 0xfeed_0000_0000_0001, "a later draw changes nothing");
        assert_eq!(batch.study_id("other", u64::MAX).expect("its own"), u64::MAX, "all 64 bits are kept");
        batch.commit().expect("commit");
        drop(store);
        let mut store = Store::open(&path).expect("reopens");
        let mut batch = store.batch().expect("batch");
        assert_eq!(batch.study_id("exp", 3).expect("kept across opens"), 0xfeed_0000_0000_0001);
        assert_eq!(batch.study_id("other", 3).expect("kept across opens"), u64::MAX);
    }

    #[test]
    fn schema_is_idempotent_and_versioned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.db");
        drop(Store::open(&path).expect("creates"));
        let store = Store::open(&path).expect("reopens");
        let v: i64 = store.conn.sqlite().pragma_query_value(None, "user_version", |r| r.get(0)).expect("version");
        assert_eq!(v, SCHEMA_VERSION);
        let mode: String = store.conn.sqlite().pragma_query_value(None, "journal_mode", |r| r.get(0)).expect("mode");
        assert_eq!(mode.to_lowercase(), "wal");
        store.conn.sqlite().pragma_update(None, "user_version", SCHEMA_VERSION + 1).expect("bump");
        drop(store);
        let e = Store::open(&path).expect_err("newer schema refused");
        assert!(matches!(e, StoreError::SchemaVersion { found, .. } if found == SCHEMA_VERSION + 1), "{e}");
    }
}
