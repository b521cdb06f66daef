//! Requests to the active coordinator through a server's store, for
//! `submit` and `cancel` on a machine where no service listens: a row
//! written by the command, taken and answered by whichever coordinator
//! holds the lease (`store/lease.rs`), the answer read back by the
//! command. Whoever can write to the store's schema owns the fleet's
//! store already; the row gives them nothing more.

use std::path::Path;

use super::sql::{self, params, Conn, Optional, REQUESTS_TABLE};
use super::StoreError;

/// The requests table of a server's store, on a connection of its own.
#[derive(Debug)]
pub struct Requests {
    conn: Conn,
}

fn sql_err(context: &str) -> impl FnOnce(sql::Error) -> StoreError + '_ {
    move |cause| StoreError::Sql { context: format!("requests to the active coordinator: {context}"), cause }
}

impl Requests {
    /// A connection to the server `store` names, and the table there.
    pub fn connect(store: &Path) -> Result<Requests, StoreError> {
        let (conn, _) = Conn::open_server(store).map_err(sql_err("connecting"))?;
        let columns = "id BIGSERIAL PRIMARY KEY, ask TEXT NOT NULL, answer TEXT";
        conn.create_table_once(REQUESTS_TABLE, columns).map_err(sql_err("creating its table"))?;
        Ok(Requests { conn })
    }

    /// Writes a request (`ask`, JSON); its id.
    pub fn send(&self, ask: &str) -> Result<i64, StoreError> {
        let sql = format!("INSERT INTO {REQUESTS_TABLE} (ask) VALUES (?1) RETURNING id");
        self.conn.query_row(&sql, [ask], |r| r.get(0)).map_err(sql_err("writing"))
    }

    /// The answer to request `id`, once given.
    pub fn answer_of(&self, id: i64) -> Result<Option<String>, StoreError> {
        let sql = format!("SELECT answer FROM {REQUESTS_TABLE} WHERE id = ?1");
        let answer: Option<Option<String>> =
            self.conn.query_row(&sql, [id], |r| r.get(0)).optional().map_err(sql_err("reading"))?;
        Ok(answer.flatten())
    }

    /// Requests not answered yet, oldest first (at most `most`).
    pub fn unanswered(&self, most: i64) -> Result<Vec<(i64, String)>, StoreError> {
        let sql = format!("SELECT id, ask FROM {REQUESTS_TABLE} WHERE answer IS NULL ORDER BY id LIMIT ?1");
        let mut stmt = self.conn.prepare_cached(&sql).map_err(sql_err("reading"))?;
        let rows = stmt.query_map([most], |r| Ok((r.get(0)?, r.get(1)?))).map_err(sql_err("reading"))?;
        rows.collect::<sql::Result<Vec<_>>>().map_err(sql_err("reading"))
    }

    /// Answers request `id` with `answer` (JSON).
    pub fn answer(&self, id: i64, answer: &str) -> Result<(), StoreError> {
        let sql = format!("UPDATE {REQUESTS_TABLE} SET answer = ?1 WHERE id = ?2");
        self.conn.execute(&sql, params![answer, id]).map(|_| ()).map_err(sql_err("answering"))
    }
}
