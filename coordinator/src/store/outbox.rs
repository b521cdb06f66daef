//! The InfluxDB outbox: points queued in the same batch as what they
//! describe, read, delivered and parked by the sink.

use super::sql::{self, params};
use serde::Serialize;

use super::{get_u64, to_i64, Batch, Result, SqlContext, Store};

/// Points waiting for InfluxDB, one line-protocol line each, in queue order.
/// Added to stores of schema version 1 without a version change: older
/// programs simply ignore the table. `parked` holds why the server refused a
/// point for good (such points stay here for inspection and are not retried).
pub(super) const OUTBOX_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS influx_outbox (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    line      TEXT NOT NULL,
    queued_ms INTEGER NOT NULL,
    parked    TEXT
);
"#;

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

impl Store {
    /// The first `limit` points waiting for InfluxDB, oldest first (parked
    /// points are skipped).
    pub fn outbox_next(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        let context = || "reading the InfluxDB outbox".to_string();
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, line FROM influx_outbox WHERE parked IS NULL ORDER BY id LIMIT ?1")
            .ctx(context)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows =
            stmt.query_map([limit], |row| Ok(OutboxRow { id: row.get("id")?, line: row.get("line")? })).ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// Removes delivered points; returns how many rows went.
    pub fn outbox_delete(&mut self, ids: &[i64]) -> Result<u64> {
        let context = || format!("removing {} delivered points from the InfluxDB outbox", ids.len());
        let tx = self.conn.begin().ctx(context)?;
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
            .query_row((), |r| Ok(OutboxCounts { waiting: get_u64(r, 0)?, parked: get_u64(r, 1)? }))
            .ctx(context)
    }
}

impl Batch<'_> {
    /// Queues points for InfluxDB (line protocol, one point per line). They
    /// are committed with the rest of the batch, so a point exists exactly
    /// when what it describes was stored.
    pub fn enqueue_points(&mut self, lines: &[String], at_ms: u64) -> Result<()> {
        let context = || format!("queueing {} points for InfluxDB", lines.len());
        let at = to_i64("time", at_ms)?;
        let mut stmt =
            self.tx.prepare_cached("INSERT INTO influx_outbox (line, queued_ms) VALUES (?1, ?2)").ctx(context)?;
        for line in lines {
            stmt.write(params![line, at]).ctx(context)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::*;

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
