//! The store's one seam to its database: a connection ([`Conn`]), its
//! statements ([`Stmt`]) and rows ([`Row`]), values bound in and read out
//! through [`ToSql`] and [`FromSql`], and one write transaction at a time
//! ([`Tx`]). The store's queries are written once against it; each backend
//! is a file of this folder (`sqlite.rs`), and nothing of a database
//! library is named outside it.
//!
//! The store's SQL keeps to what its backends share: `?N` placeholders,
//! `INTEGER`, `REAL`, `TEXT` and `BLOB` columns (booleans as integers),
//! `ON CONFLICT` clauses, savepoints. What differs (opening, the schema's
//! version, whether a column exists) is a method of [`Conn`].

use std::fmt;
use std::path::Path;

mod dialect;
mod postgres;
mod row;
mod sqlite;
mod value;

pub use postgres::{
    application_name, is_postgres, parse_target, redacted, set_application_name, PgTarget, Plans, CREATING,
};

/// The table of the lease that says which of the coordinators sharing a
/// server's store is active (`store/lease.rs`); every write transaction
/// of the active one checks its epoch first ([`Conn::set_fence`]).
pub const LEASE_TABLE: &str = "coordinator_lease";

/// What every write transaction of the active coordinator reads first: the
/// lease's epoch, its row held as it is until the transaction ends.
const FENCE: &str = "SELECT epoch FROM coordinator_lease WHERE id = 1 FOR SHARE";

/// The table of `submit` and `cancel` requests to the active coordinator
/// through a server's store (`store/requests.rs`).
pub const REQUESTS_TABLE: &str = "control_requests";
use row::RowInner;
pub use row::{Check, ColumnIndex, Row};
pub(crate) use sqlite::OpenMode;
pub use value::{Error, Params, Result, ToSql, Value, ValueRef};

/// Parameters of mixed types: `params![study, trial]`.
macro_rules! params {
    ($($value:expr),* $(,)?) => {
        &[$(&$value as &dyn $crate::store::sql::ToSql),*] as &[&dyn $crate::store::sql::ToSql]
    };
}
pub(crate) use params;

/// A connection to the store's database.
pub struct Conn(ConnInner);

enum ConnInner {
    Sqlite(rusqlite::Connection),
    Pg(postgres::PgConn),
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            ConnInner::Sqlite(_) => "Conn(sqlite)",
            ConnInner::Pg(_) => "Conn(postgres)",
        })
    }
}

/// A prepared statement.
pub struct Stmt<'c>(StmtInner<'c>);

enum StmtInner<'c> {
    Sqlite(rusqlite::CachedStatement<'c>),
    Pg { conn: &'c postgres::PgConn, id: usize, columns: std::sync::Arc<Vec<String>> },
}

impl Conn {
    /// `sql` prepared, from the connection's cache when it was before.
    pub fn prepare_cached(&self, sql: &str) -> Result<Stmt<'_>> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(Stmt(StmtInner::Sqlite(c.prepare_cached(sql)?))),
            ConnInner::Pg(c) => {
                let (id, columns) = c.prepare(sql)?;
                Ok(Stmt(StmtInner::Pg { conn: c, id, columns }))
            }
        }
    }

    /// Whether the database is a server's (PostgreSQL): where a statement
    /// the file has no syntax for saves a round trip.
    pub fn on_server(&self) -> bool {
        matches!(self.0, ConnInner::Pg(_))
    }

    /// Runs one statement; the rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    /// Runs one statement whose count is not needed ([`Stmt::write`]).
    pub fn write<P: Params>(&self, sql: &str, params: P) -> Result<()> {
        self.prepare_cached(sql)?.write(params)
    }

    /// Runs statements separated by `;`, with no parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            ConnInner::Pg(c) => c.batch(sql),
        }
    }

    /// The first row of `sql`'s answer mapped by `f`; [`Error::NoRows`]
    /// when there is none.
    pub fn query_row<T, P: Params>(&self, sql: &str, params: P, f: impl FnOnce(&Row<'_>) -> Result<T>) -> Result<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// Starts the one write transaction, holding the database's write
    /// lock from its first statement. Dropped without [`Tx::commit`], it
    /// is rolled back.
    ///
    /// On a server, the transaction's writes are sent without waiting for
    /// their answers ([`Stmt::write`]), together with the next statement
    /// that needs one: its `BEGIN` with the lease's check, its last writes
    /// with its `COMMIT`, the rest with its reads or [`Conn::settle`].
    /// While a commit sent without waiting is under way
    /// ([`Tx::commit_pipelined`]), the `BEGIN` and the lease's check wait
    /// for the transaction's first answer (the check judged before its
    /// `COMMIT` is sent): the transaction is built while the one before
    /// commits. Otherwise they are answered here, and a database that
    /// cannot be reached is said before anything is done.
    pub fn begin(&mut self) -> Result<Tx<'_>> {
        match &self.0 {
            // Sent with the lease's check, in one round trip.
            ConnInner::Pg(c) if c.fence.get().is_some() || c.in_flight() => c.defer("BEGIN IMMEDIATE"),
            _ => self.execute_batch("BEGIN IMMEDIATE")?,
        }
        let tx = Tx { conn: self, open: true };
        // Refused (and rolled back as it is dropped) once fenced off.
        tx.conn.check_fence()?;
        if let ConnInner::Pg(c) = &tx.conn.0 {
            c.set_deferring(true);
        }
        Ok(tx)
    }

    /// Sends the writes not sent yet and waits for them: the first error
    /// among them (a file's writes are done as they are asked).
    pub fn settle(&self) -> Result<()> {
        match &self.0 {
            ConnInner::Sqlite(_) => Ok(()),
            ConnInner::Pg(c) => c.settle(),
        }
    }

    /// Answers the checked writes not answered yet ([`Stmt::write_grouped`])
    /// with the writes before them: a refusal, or the first error of those.
    pub fn settle_checks(&self) -> Result<()> {
        match &self.0 {
            ConnInner::Pg(c) if c.checks_pending() => c.settle(),
            _ => Ok(()),
        }
    }

    /// Runs `sql` (statements separated by `;`, no parameters) after the
    /// writes not sent yet, whose errors it forgives: what rolls back to a
    /// savepoint undoes them anyway.
    pub fn execute_batch_forgiving(&self, sql: &str) -> Result<()> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            ConnInner::Pg(c) => c.batch_forgiving(sql),
        }
    }

    /// The owner has seen every commit sent without waiting that failed,
    /// and starts over from what the store holds: what it sends from now
    /// on runs again ([`Tx::commit_pipelined`]).
    pub fn failed_commit_seen(&self) {
        if let ConnInner::Pg(c) = &self.0 {
            c.failed_commit_seen();
        }
    }

    /// From now on every write transaction on a server first holds the
    /// lease's row as it is (shared) and goes on only while its epoch is
    /// `epoch` ([`LEASE_TABLE`]): a coordinator whose lease was taken over
    /// commits nothing after the takeover, and the takeover waits for a
    /// transaction it let begin. A file has no lease.
    pub fn set_fence(&self, epoch: i64) {
        if let ConnInner::Pg(c) = &self.0 {
            c.fence.set(Some(epoch));
        }
    }

    fn check_fence(&self) -> Result<()> {
        let ConnInner::Pg(c) = &self.0 else { return Ok(()) };
        let Some(mine) = c.fence.get() else { return Ok(()) };
        if c.in_flight() {
            c.defer_fence(FENCE, mine);
            return Ok(());
        }
        let now = match self.query_row(FENCE, (), |r| r.get::<_, i64>(0)) {
            Ok(epoch) => Some(epoch),
            Err(Error::NoRows) => None,
            Err(e) => return Err(e),
        };
        match now == Some(mine) {
            true => Ok(()),
            false => Err(Error::Fenced { mine, now }),
        }
    }

    /// Writes run as they are asked again (the transaction ended).
    fn stop_deferring(&self) {
        if let ConnInner::Pg(c) = &self.0 {
            c.set_deferring(false);
        }
    }

    /// Whether a transaction is open (a failed commit may have ended it).
    fn in_transaction(&self) -> bool {
        match &self.0 {
            ConnInner::Sqlite(c) => !c.is_autocommit(),
            // The server ends a transaction whose commit failed; a rollback
            // then only warns.
            ConnInner::Pg(_) => true,
        }
    }

    /// The schema version the database says it holds (0: none yet).
    pub fn schema_version(&self) -> Result<i64> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(c.pragma_query_value(None, "user_version", |r| r.get(0))?),
            ConnInner::Pg(_) => {
                // Under the server's lock: connections opening a new store
                // at once (the coordinator's, its broker's logins) would
                // race on `CREATE TABLE IF NOT EXISTS`, and one would fail.
                self.create_table_once(
                    "tunefleet_schema",
                    "id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL",
                )?;
                let found = self
                    .query_row("SELECT version FROM tunefleet_schema WHERE id = 1", (), |r| r.get::<_, i64>(0))
                    .optional()?;
                Ok(found.unwrap_or(0))
            }
        }
    }

    /// Records the schema version the database now holds.
    pub fn set_schema_version(&self, version: i64) -> Result<()> {
        match &self.0 {
            ConnInner::Sqlite(c) => Ok(c.pragma_update(None, "user_version", version)?),
            ConnInner::Pg(_) => {
                self.execute(
                    "INSERT INTO tunefleet_schema (id, version) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET version = excluded.version",
                    [version],
                )?;
                Ok(())
            }
        }
    }

    /// Whether `table` has a column named `column`.
    pub fn has_column(&self, table: &str, column: &str) -> Result<bool> {
        match &self.0 {
            ConnInner::Sqlite(c) => {
                let sql = format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = ?1");
                Ok(c.query_row(&sql, [column], |r| r.get::<_, i64>(0))? > 0)
            }
            ConnInner::Pg(_) => {
                let sql = "SELECT COUNT(*) FROM information_schema.columns
                           WHERE table_schema = current_schema() AND table_name = ?1 AND column_name = ?2";
                Ok(self.query_row(sql, [table, column], |r| r.get::<_, i64>(0))? > 0)
            }
        }
    }

    /// Whether the store has an index named `name`.
    pub fn has_index(&self, name: &str) -> Result<bool> {
        let sql = match &self.0 {
            ConnInner::Sqlite(_) => "SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = ?1",
            ConnInner::Pg(_) => {
                "SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = ?1"
            }
        };
        Ok(self.query_row(sql, [name], |r| r.get::<_, i64>(0))? > 0)
    }

    /// Opens the SQLite file at `path` as `mode` says.
    pub fn open_sqlite(path: &Path, mode: OpenMode) -> Result<Conn> {
        Ok(Conn(ConnInner::Sqlite(sqlite::open(path, mode)?)))
    }

    /// A SQLite database in memory, gone with the connection.
    pub fn open_sqlite_in_memory() -> Result<Conn> {
        Ok(Conn(ConnInner::Sqlite(sqlite::open_in_memory()?)))
    }

    /// The store's tables, by name (not the schema's own bookkeeping).
    pub fn tables(&self) -> Result<Vec<String>> {
        let sql = match &self.0 {
            ConnInner::Sqlite(_) => {
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
            }
            // Neither the schema's version, the coordinators' lease nor the
            // requests to the active one are the store's content.
            ConnInner::Pg(_) => {
                "SELECT table_name FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_name <> 'tunefleet_schema'
                 AND table_name NOT IN ('coordinator_lease', 'control_requests') ORDER BY table_name"
            }
        };
        self.prepare_cached(sql)?.query_map((), |r| r.get::<_, String>(0))?.collect()
    }

    /// After rows were written with their own ids into `table`: the ids
    /// the database hands out next come after them (PostgreSQL's
    /// sequences do not follow explicit ids; SQLite's rowids do).
    pub fn ids_follow(&self, table: &str) -> Result<()> {
        match &self.0 {
            ConnInner::Sqlite(_) => Ok(()),
            ConnInner::Pg(_) => {
                if self.has_column(table, "id")? {
                    self.execute_batch(&format!(
                        "SELECT setval(pg_get_serial_sequence('{table}', 'id'), COALESCE(MAX(id), 0) + 1, false) FROM {table}"
                    ))?;
                }
                Ok(())
            }
        }
    }

    /// Connects to the PostgreSQL store `target`.
    pub fn open_postgres(target: &PgTarget) -> Result<Conn> {
        Ok(Conn(ConnInner::Pg(postgres::PgConn::connect(target)?)))
    }

    /// A connection of its own to the server the store URL `store` names
    /// (a lock's, the lease's, the requests'), and where it points.
    pub fn open_server(store: &Path) -> Result<(Conn, PgTarget)> {
        let target = parse_target(store.to_str().unwrap_or_default()).map_err(Error::Closed)?;
        Ok((Conn::open_postgres(&target)?, target))
    }

    /// Creates a table of the server's own with `columns` unless it is
    /// there, in one statement (so one transaction) under the lock that
    /// keeps two coordinators starting at once from racing on it.
    pub fn create_table_once(&self, table: &str, columns: &str) -> Result<()> {
        self.execute_batch(&format!(
            "DO $$ BEGIN PERFORM pg_advisory_xact_lock({CREATING}); CREATE TABLE IF NOT EXISTS {table} ({columns}); \
             END $$"
        ))
    }

    /// The SQLite connection underneath, for tests that look at the file
    /// as SQLite sees it.
    #[cfg(test)]
    pub fn sqlite(&self) -> &rusqlite::Connection {
        match &self.0 {
            ConnInner::Sqlite(c) => c,
            ConnInner::Pg(_) => panic!("a test asked a PostgreSQL store for its SQLite connection"),
        }
    }
}

impl Stmt<'_> {
    /// The names of the columns its rows have.
    pub fn column_names(&self) -> Vec<String> {
        match &self.0 {
            StmtInner::Sqlite(s) => s.column_names().map(str::to_string).collect(),
            StmtInner::Pg { columns, .. } => columns.to_vec(),
        }
    }

    /// Runs the statement; the rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        match &mut self.0 {
            StmtInner::Sqlite(s) => Ok(s.execute(sqlite::binds(&params)?)?),
            StmtInner::Pg { conn, id, .. } => conn.execute(*id, &params),
        }
    }

    /// Runs the statement when its count is not needed: inside a write
    /// transaction on a server it is sent with the next statement that
    /// needs an answer ([`Conn::begin`]), and an error of it is that
    /// statement's (or [`Conn::settle`]'s).
    pub fn write<P: Params>(&mut self, params: P) -> Result<()> {
        match &mut self.0 {
            StmtInner::Sqlite(s) => Ok(s.execute(sqlite::binds(&params)?).map(drop)?),
            StmtInner::Pg { conn, id, .. } => conn.write(*id, &params),
        }
    }

    /// A checked write of a statement whose every parameter is an array
    /// (one value a row): on a server, inside a write transaction, the row
    /// is sent with the rows of the same statement around it as one
    /// statement (rows of one `key` in their order, rows of different keys
    /// as if at once: a row goes ahead of no other statement but the
    /// grouped rows of other keys just before it), with the next statement
    /// that needs an answer like [`Stmt::write`]; each row the statement
    /// answers is one it did not take, refused by `check`: that statement's
    /// error, or
    /// [`Conn::settle`]'s (a commit settles what is checked first, and
    /// commits nothing a check refused). Elsewhere it runs at once, the row
    /// alone, its every answered row judged.
    pub fn write_grouped<P: Params>(&mut self, params: P, key: String, check: Check) -> Result<()> {
        match &mut self.0 {
            StmtInner::Sqlite(_) => self.query_map(params, check)?.collect(),
            StmtInner::Pg { conn, id, columns } => conn.write_grouped(*id, &params, key, columns, check),
        }
    }

    /// Every row of the answer mapped by `f`, in order.
    pub fn query_map<T, P: Params>(
        &mut self,
        params: P,
        mut f: impl FnMut(&Row<'_>) -> Result<T>,
    ) -> Result<std::vec::IntoIter<Result<T>>> {
        let mut out = Vec::new();
        match &mut self.0 {
            StmtInner::Sqlite(s) => {
                let mut rows = s.query(sqlite::binds(&params)?)?;
                while let Some(row) = rows.next()? {
                    out.push(f(&Row(RowInner::Sqlite(row))));
                }
            }
            StmtInner::Pg { conn, id, columns } => {
                for values in conn.query(*id, &params)? {
                    out.push(f(&Row(RowInner::Pg { values: &values, columns })));
                }
            }
        }
        Ok(out.into_iter())
    }

    /// The first row of the answer mapped by `f`; [`Error::NoRows`] when
    /// there is none.
    pub fn query_row<T, P: Params>(&mut self, params: P, f: impl FnOnce(&Row<'_>) -> Result<T>) -> Result<T> {
        match &mut self.0 {
            StmtInner::Sqlite(s) => {
                let mut rows = s.query(sqlite::binds(&params)?)?;
                match rows.next()? {
                    Some(row) => f(&Row(RowInner::Sqlite(row))),
                    None => Err(Error::NoRows),
                }
            }
            StmtInner::Pg { conn, id, columns } => match conn.query(*id, &params)?.first() {
                Some(values) => f(&Row(RowInner::Pg { values, columns })),
                None => Err(Error::NoRows),
            },
        }
    }
}

/// A write transaction; derefs to its connection.
pub struct Tx<'c> {
    conn: &'c mut Conn,
    open: bool,
}

impl Tx<'_> {
    /// Makes everything written in the transaction durable. When that
    /// fails, the transaction is rolled back as it is dropped.
    pub fn commit(mut self) -> Result<()> {
        // The writes not sent yet go with the COMMIT; a failed one fails it
        // (the server then ends the transaction without committing).
        // What is checked is answered first: a refusal commits nothing.
        self.conn.settle_checks()?;
        let committed = self.conn.execute_batch("COMMIT");
        self.conn.stop_deferring();
        committed?;
        self.open = false;
        Ok(())
    }
}

impl Tx<'_> {
    /// [`Tx::commit`] without waiting for the server: everything written
    /// goes with the `COMMIT`, sent only once what is checked is judged
    /// (a refusal or a failed lease's check rolls back), and the answer
    /// comes to [`Committing::landed`]. Once one fails, nothing sent on
    /// the connection runs until its owner says it starts over
    /// ([`Conn::failed_commit_seen`]): whoever awaits the answer, what the
    /// owner builds next was built on it. A file commits here.
    pub fn commit_pipelined(mut self) -> Result<Committing> {
        let ConnInner::Pg(c) = &self.conn.0 else {
            return self.commit().map(|()| Committing(None));
        };
        let (seq, answer) = c.commit()?;
        self.conn.stop_deferring();
        self.open = false;
        Ok(Committing(Some(Landing { seq, answer })))
    }
}

/// A commit under way ([`Tx::commit_pipelined`]); none for one done.
#[derive(Default)]
pub struct Committing(Option<Landing>);

struct Landing {
    seq: u64,
    answer: tokio::sync::oneshot::Receiver<Result<()>>,
}

impl fmt::Debug for Committing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(l) => write!(f, "Committing(commit {} under way)", l.seq),
            None => f.write_str("Committing(done)"),
        }
    }
}

impl Committing {
    /// Waits for the commit's answer: `Ok` once it is durable. Cancel-safe:
    /// dropped before its answer, it may be awaited again.
    pub async fn landed(&mut self) -> Result<()> {
        let Some(landing) = self.0.as_mut() else { return Ok(()) };
        let answer = (&mut landing.answer).await.unwrap_or_else(|_| Err(postgres::gone()));
        self.0 = None;
        answer
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        // What was deferred and not sent is dropped with the transaction.
        self.conn.stop_deferring();
        if self.open && self.conn.in_transaction() {
            if let Err(e) = self.conn.execute_batch("ROLLBACK") {
                tracing::warn!(error = %e, "rolling back a store transaction");
            }
        }
    }
}

/// A query that may find nothing.
pub trait Optional<T> {
    /// `None` for [`Error::NoRows`].
    fn optional(self) -> Result<Option<T>>;
}

impl<T> Optional<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fence_reads_the_lease_table() {
        assert!(super::FENCE.contains(&format!(" {} ", super::LEASE_TABLE)), "{}", super::FENCE);
    }
}
