//! Hellos the coordinator refused and told their agents why: one row per
//! name (the latest reason, when, how many times), at most [`MAX_ROWS`]
//! (the oldest go first: names are the sender's choice), for the live page
//! and `status --json`.

use super::sql::{self, params};
use serde::Serialize;

use super::{get_u64, to_i64, Batch, Result, SqlContext, Store};

/// Created on open, like the InfluxDB outbox: older programs ignore it.
pub(super) const REFUSALS_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS hello_refusals (
    name   TEXT PRIMARY KEY NOT NULL,
    reason TEXT NOT NULL,
    at_ms  INTEGER NOT NULL,
    count  INTEGER NOT NULL
);
";

/// The most names kept.
pub const MAX_ROWS: u64 = 1000;

/// A name whose Hello was refused.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RefusalRow {
    pub name: String,
    /// Why, as the agent was told.
    pub reason: String,
    /// When last (Unix ms).
    pub at_ms: u64,
    /// How many times.
    pub count: u64,
}

impl Batch<'_> {
    /// Records that `name`'s Hello was refused for `reason` at `at_ms`.
    pub fn record_refusal(&mut self, name: &str, reason: &str, at_ms: u64) -> Result<()> {
        let context = || format!("recording the refusal of {name}");
        let reason: String = reason.chars().take(300).collect();
        self.tx
            .prepare_cached(
                "INSERT INTO hello_refusals (name, reason, at_ms, count) VALUES (?1, ?2, ?3, 1)
                 ON CONFLICT (name) DO UPDATE SET reason = excluded.reason, at_ms = excluded.at_ms, count = count + 1",
            )
            .ctx(context)?
            .write(params![name, reason, to_i64("time", at_ms)?])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "DELETE FROM hello_refusals WHERE name IN
                   (SELECT name FROM hello_refusals ORDER BY at_ms DESC, name LIMIT -1 OFFSET ?1)",
            )
            .ctx(context)?
            .write(params![to_i64("rows", MAX_ROWS)?])
            .ctx(context)?;
        Ok(())
    }

    /// Forgets `name`'s refusals (it was admitted since).
    pub fn clear_refusal(&mut self, name: &str) -> Result<()> {
        let context = || format!("clearing the refusals of {name}");
        self.tx
            .prepare_cached("DELETE FROM hello_refusals WHERE name = ?1")
            .ctx(context)?
            .write(params![name])
            .ctx(context)?;
        Ok(())
    }
}

impl Store {
    /// The names refused, the latest first.
    pub fn refusals(&self) -> Result<Vec<RefusalRow>> {
        let context = || "listing refused Hellos".to_string();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, reason, at_ms, count FROM hello_refusals ORDER BY at_ms DESC, name")
            .ctx(context)?;
        let rows = stmt
            .query_map((), |r| {
                Ok(RefusalRow {
                    name: r.get("name")?,
                    reason: r.get("reason")?,
                    at_ms: get_u64(r, "at_ms")?,
                    count: get_u64(r, "count")?,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_per_name_and_bounded() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut store = Store::open(&dir.path().join("s.db")).expect("store");
        let mut b = store.batch().expect("batch");
        b.record_refusal("a", "unknown key", 1).expect("a");
        b.record_refusal("a", "token revoked", 2).expect("a again");
        for i in 0..MAX_ROWS + 5 {
            b.record_refusal(&format!("junk-{i}"), "x", 10 + i).expect("junk");
        }
        b.commit().expect("commit");
        let rows = store.refusals().expect("rows");
        assert_eq!(rows.len() as u64, MAX_ROWS, "bounded");
        assert!(rows.iter().all(|r| r.name != "a"), "the oldest went first");
        let mut b = store.batch().expect("batch");
        b.record_refusal("a", "token revoked", 5000).expect("a");
        b.record_refusal("a", "token revoked", 5001).expect("a");
        b.commit().expect("commit");
        let a = store.refusals().expect("rows").into_iter().find(|r| r.name == "a").expect("a kept");
        assert_eq!((a.reason.as_str(), a.count, a.at_ms), ("token revoked", 2, 5001));
        let mut b = store.batch().expect("batch");
        b.clear_refusal("a").expect("clear");
        b.commit().expect("commit");
        assert!(store.refusals().expect("rows").iter().all(|r| r.name != "a"));
    }
}
