//! `tunefleet store copy FROM TO`: every row of one store into another,
//! across backends (a SQLite file to a PostgreSQL server and back), with
//! a count and a digest per table on both sides to show nothing was lost.

use serde::Serialize;

use super::sql::{Conn, Value, ValueRef};
use super::{fnv, Result, SqlContext, Store, StoreError, FNV_START};

/// One table as copied: its rows, and the digest of its rows on each
/// side (equal when the copy holds what the original did).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableCopy {
    pub table: String,
    pub rows: u64,
    pub digest_from: String,
    pub digest_to: String,
}

/// A table's rows and their digest: each row's values, typed, hashed and
/// summed, so the order rows come back in does not matter.
fn digest(conn: &Conn, table: &str, columns: &[String]) -> Result<(u64, String)> {
    let context = || format!("reading table {table}");
    let list = columns.join(", ");
    let mut stmt = conn.prepare_cached(&format!("SELECT {list} FROM {table}")).ctx(context)?;
    let hashes = stmt.query_map((), |r| (0..columns.len()).try_fold(FNV_START, |h, i| Ok(hash_value(h, r.value(i)?))));
    let mut sum = Sum::default();
    for h in hashes.ctx(context)? {
        sum.add(h.ctx(context)?);
    }
    Ok((sum.rows, sum.text()))
}

/// The row hashes of a table, summed, and how many.
#[derive(Default)]
struct Sum {
    rows: u64,
    total: u64,
}

impl Sum {
    fn add(&mut self, h: u64) {
        self.total = self.total.wrapping_add(h);
        self.rows += 1;
    }

    fn text(&self) -> String {
        format!("{:016x}", self.total)
    }
}

/// `h` followed by one value, with its type, in the row's hash.
fn hash_value(h: u64, v: ValueRef<'_>) -> u64 {
    match v {
        ValueRef::Null => fnv(b"n;", h),
        ValueRef::Integer(v) => fnv(format!("i{v};").as_bytes(), h),
        ValueRef::Real(v) => fnv(format!("r{:x};", v.to_bits()).as_bytes(), h),
        ValueRef::Text(t) => fnv(format!("t{}:{t};", t.len()).as_bytes(), h),
        ValueRef::Blob(b) => fnv(&[b"b".as_slice(), b, b";"].concat(), h),
    }
}

/// Copies every row of every table of `from` into `to`, in one
/// transaction; refused when `to` already holds rows (a copy does not
/// merge). The tables and columns are `from`'s, which `to` has too (both
/// are at this program's schema version).
pub fn copy(from: &Store, to: &mut Store) -> Result<Vec<TableCopy>> {
    let tables = from.conn.tables().ctx(|| format!("{}: listing tables", from.path))?;
    for table in &tables {
        let n: i64 = to
            .conn
            .query_row(&format!("SELECT COUNT(*) FROM {table}"), (), |r| r.get(0))
            .ctx(|| format!("{}: counting table {table}", to.path))?;
        if n > 0 {
            return Err(StoreError::NotEmpty { path: to.path.clone(), table: table.clone(), rows: n });
        }
    }
    let mut copies = Vec::new();
    let batch = to.batch()?;
    for table in &tables {
        let context = || format!("copying table {table}");
        let mut read = from.conn.prepare_cached(&format!("SELECT * FROM {table}")).ctx(context)?;
        let columns = read.column_names();
        let marks: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
        let insert = format!("INSERT INTO {table} ({}) VALUES ({})", columns.join(", "), marks.join(", "));
        let rows =
            read.query_map((), |r| (0..columns.len()).map(|i| r.value(i).map(Value::of)).collect()).ctx(context)?;
        let mut write = batch.tx.prepare_cached(&insert).ctx(context)?;
        // The original's digest from the rows as they are copied, read once.
        let mut from_sum = Sum::default();
        for row in rows {
            let row: Vec<Value> = row.ctx(context)?;
            from_sum.add(row.iter().map(Value::as_ref).fold(FNV_START, hash_value));
            write.write(row.as_slice()).ctx(context)?;
        }
        drop(write);
        batch.tx.ids_follow(table).ctx(context)?;
        let (rows, digest_to) = digest(&batch.tx, table, &columns)?;
        copies.push(TableCopy { table: table.clone(), rows, digest_from: from_sum.text(), digest_to });
    }
    batch.commit()?;
    Ok(copies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_holds_every_row_and_refuses_a_store_with_rows() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut from = Store::open(&dir.path().join("a.db")).expect("open");
        let text = "name = \"s\"\ncommand = [\"true\"]\n[objective]\nmetric = \"v\"\ndirection = \"maximize\"\n\
                    [budget]\ntrials = 2\n[strategy]\nkind = \"grid\"\n[hyper.x]\nkind = \"int\"\nlow = 1\nhigh = 2\n";
        let study = crate::domain::study::parse(text, "s.toml").expect("study");
        let mut batch = from.batch().expect("batch");
        batch
            .open_study(&study, &crate::domain::search::plan(&study), &crate::domain::study::Opening::Create)
            .expect("create");
        batch.commit().expect("commit");
        let mut to = Store::open(&dir.path().join("b.db")).expect("open");
        let copies = copy(&from, &mut to).expect("copy");
        let trials = copies.iter().find(|c| c.table == "trials").expect("the trials table");
        assert_eq!(trials.rows, 2);
        assert!(copies.iter().all(|c| c.digest_from == c.digest_to), "{copies:?}");
        assert_eq!(to.trials("s").expect("trials"), from.trials("s").expect("trials"), "the same trials");
        let err = copy(&from, &mut to).expect_err("a store with rows");
        assert!(err.to_string().contains("already holds"), "{err}");
    }
}
