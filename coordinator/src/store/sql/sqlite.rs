//! SQLite, the embedded backend: one file beside the coordinator, in WAL
//! mode, private to its owner.

use std::path::Path;
use std::time::Duration;

use rusqlite::types::{ToSqlOutput, ValueRef as LiteValue};
use rusqlite::{Connection, OpenFlags};

use super::value::{Error, Params, Result, ValueRef};

/// How long a writer waits for another connection's lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Statements each connection keeps prepared.
const CACHED_STATEMENTS: usize = 32;

/// How a store file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode {
    /// Read and write, created when missing, in WAL mode.
    ReadWrite,
    /// Queries only; the file must exist.
    ReadOnly,
}

/// Opens the SQLite file at `path` as `mode` says.
pub(super) fn open(path: &Path, mode: OpenMode) -> Result<Connection> {
    let conn = match mode {
        OpenMode::ReadWrite => Connection::open(path)?,
        OpenMode::ReadOnly => {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
            Connection::open_with_flags(path, flags)?
        }
    };
    conn.busy_timeout(BUSY_TIMEOUT)?;
    if mode == OpenMode::ReadWrite {
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get::<_, String>(0))?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
    }
    conn.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
    Ok(conn)
}

/// A SQLite database in memory, gone with the connection.
pub(super) fn open_in_memory() -> Result<Connection> {
    let conn = Connection::open_in_memory()?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.set_prepared_statement_cache_capacity(CACHED_STATEMENTS);
    Ok(conn)
}

/// Column `i` of `row`.
pub(super) fn value<'a>(row: &'a rusqlite::Row<'a>, i: usize) -> Result<ValueRef<'a>> {
    Ok(match row.get_ref(i)? {
        LiteValue::Null => ValueRef::Null,
        LiteValue::Integer(v) => ValueRef::Integer(v),
        LiteValue::Real(v) => ValueRef::Real(v),
        LiteValue::Text(t) => ValueRef::Text(std::str::from_utf8(t).map_err(|e| Error::conversion(i, e))?),
        LiteValue::Blob(b) => ValueRef::Blob(b),
    })
}

/// A parameter as SQLite binds it.
pub(super) struct Bind<'a>(ValueRef<'a>);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self.0 {
            ValueRef::Null => LiteValue::Null,
            ValueRef::Integer(v) => LiteValue::Integer(v),
            ValueRef::Real(v) => LiteValue::Real(v),
            ValueRef::Text(t) => LiteValue::Text(t.as_bytes()),
            ValueRef::Blob(b) => LiteValue::Blob(b),
        }))
    }
}

/// `params` as SQLite binds them.
pub(super) fn binds<P: Params>(params: &P) -> Result<rusqlite::ParamsFromIter<Vec<Bind<'_>>>> {
    let values = params
        .values()
        .enumerate()
        .map(|(index, p)| p.to_sql().map(Bind).map_err(|why| Error::Parameter { index: index + 1, why }))
        .collect::<Result<Vec<_>>>()?;
    Ok(rusqlite::params_from_iter(values))
}
