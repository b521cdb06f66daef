//! One row of a query's answer, on either backend, and how a column of
//! it is named.

use super::sqlite;
use super::value::{Error, FromSql, Result, Value, ValueRef};

/// Which column of a row: its position or its name.
pub trait ColumnIndex: Copy {
    fn index(self, row: &Row<'_>) -> Result<usize>;
}

impl ColumnIndex for usize {
    fn index(self, _row: &Row<'_>) -> Result<usize> {
        Ok(self)
    }
}

impl ColumnIndex for &str {
    fn index(self, row: &Row<'_>) -> Result<usize> {
        row.column_index(self)
    }
}

/// What a checked write's answer must say ([`super::Stmt::write_grouped`]),
/// judged on each row it answers: [`Error::Refused`] with why when not.
pub type Check = fn(&Row<'_>) -> Result<()>;

/// One row of a query's answer.
pub struct Row<'a>(pub(super) RowInner<'a>);

pub(super) enum RowInner<'a> {
    Sqlite(&'a rusqlite::Row<'a>),
    Pg { values: &'a [Value], columns: &'a [String] },
}

impl Row<'_> {
    /// Column `idx` read as a `T`.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, idx: I) -> Result<T> {
        let i = idx.index(self)?;
        let value = match &self.0 {
            RowInner::Sqlite(row) => sqlite::value(row, i)?,
            RowInner::Pg { values, .. } => {
                values.get(i).map(Value::as_ref).ok_or_else(|| Error::conversion(i, "no such column"))?
            }
        };
        T::from_sql(value).map_err(|why| Error::conversion(i, why))
    }

    /// Column `i` as the database holds it.
    pub fn value(&self, i: usize) -> Result<ValueRef<'_>> {
        match &self.0 {
            RowInner::Sqlite(row) => sqlite::value(row, i),
            RowInner::Pg { values, .. } => {
                values.get(i).map(Value::as_ref).ok_or_else(|| Error::conversion(i, "no such column"))
            }
        }
    }

    /// Where the column named `name` is.
    pub fn column_index(&self, name: &str) -> Result<usize> {
        match &self.0 {
            RowInner::Sqlite(row) => row.as_ref().column_index(name).map_err(|_| Error::NoColumn(name.to_string())),
            RowInner::Pg { columns, .. } => {
                columns.iter().position(|c| c == name).ok_or_else(|| Error::NoColumn(name.to_string()))
            }
        }
    }
}
