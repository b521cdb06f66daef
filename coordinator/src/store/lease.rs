//! Which of the coordinators serving one store on a PostgreSQL server is
//! active: the one holding the server's advisory lock for the schema and
//! the lease row beside it (`coordinator_lease`: holder, epoch, instance,
//! expiry by the server's clock). The others wait as standbys.
//!
//! - **Taking over**: a standby that gets the lock (the active's
//!   connections ended: it died, its machine went away) raises the epoch
//!   and the instance in one transaction and is active. The instance is
//!   above every one the store has seen, so agents take it for a new
//!   coordinator (they say Hello again and send what they kept).
//! - **Renewing**: the active pushes its expiry on every
//!   [`Lease::renew`]. One that stalls (stopped, swapped out, a paused
//!   VM) still holds the lock, so a standby that finds the expiry past
//!   ends the holder's connections on the server (they are named after it,
//!   [`name_this_process`]), which drops the lock and rolls back whatever it had
//!   begun, and takes over on its next try.
//! - **Fencing**: every write transaction of the active first holds the
//!   lease row as it is and goes on only while the epoch is its own
//!   (`sql::Conn::set_fence`), so nothing a stepped-down coordinator
//!   writes after a takeover lands, and a takeover waits for a
//!   transaction it let begin.
//!
//! A store in a file has no lease: one machine, and its running lock.

use std::path::Path;

use super::sql::{self, params, Conn, LEASE_TABLE};
use super::{Store, StoreError, FNV_START};

impl Store {
    /// Every write transaction from now on goes on only while the lease is
    /// at `epoch` (a store on a server), else fails with
    /// [`StoreError::SteppedDown`].
    pub fn fence(&self, epoch: i64) {
        self.conn.set_fence(epoch);
    }
}

/// Names this process (host, process id, a random part) and every
/// connection it opens to a server from now on after it: what a standby
/// ends when this coordinator stalled past its lease. Call it before the
/// first connection.
pub fn name_this_process() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = format!("tunefleet {}:{}:{:08x}", host.trim(), std::process::id(), rand::random::<u32>());
    sql::set_application_name(&name);
    sql::application_name().to_string()
}

/// This process held the lease and holds it no more, or can no longer
/// tell that it does.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Lost {
    #[error("the lease was taken over by {holder} (epoch {epoch}): this coordinator steps down")]
    TakenOver { holder: String, epoch: i64 },
    /// No renewal landed for a whole lease (the server out of reach, or
    /// not answering): a standby may have taken over since.
    #[error(
        "the lease (epoch {epoch}) was not renewed for {unrenewed_ms} ms, its whole term: another coordinator may hold \
         it now, so this coordinator steps down"
    )]
    Unrenewed { epoch: i64, unrenewed_ms: u64 },
}

/// What a try for the lease found.
#[derive(Debug)]
pub enum Try {
    /// This coordinator is active now.
    Active(Lease),
    /// Another is: its name, and how long its lease still runs (negative:
    /// it expired, and its connections were ended); `again` tries anew.
    Standby { holder: String, left_ms: i64, again: Candidate },
}

/// A coordinator that wants the lease, on a connection of its own.
#[derive(Debug)]
pub struct Candidate {
    conn: Conn,
    key: i64,
}

/// The lease this coordinator holds, on a connection of its own.
#[derive(Debug)]
pub struct Lease {
    conn: Conn,
    key: i64,
    holder: String,
    /// Raised by every takeover; the active's writes carry it.
    pub epoch: i64,
    /// The coordinator instance this start announces.
    pub instance: u64,
    /// When the statement that took it was sent: it runs at least
    /// `lease_ms` from then, on the server's clock.
    pub taken: std::time::Instant,
    lease_ms: i64,
    /// The lock is to be taken again before the next renewal: a failed
    /// statement may mean a new connection, which holds no lock (taken
    /// only then: each take of a held lock counts once more).
    relock: std::cell::Cell<bool>,
}

/// The server's clock, in Unix milliseconds.
const NOW_MS: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";

/// The advisory lock of `schema`'s active coordinator (not the running
/// lock's key: every coordinator holds that one, shared).
fn active_key(schema: &str) -> i64 {
    let h = super::fnv(format!("tunefleet active {schema}").as_bytes(), FNV_START);
    i64::from_ne_bytes(h.to_ne_bytes())
}

fn sql_err(context: &str) -> impl FnOnce(sql::Error) -> StoreError + '_ {
    move |cause| StoreError::Sql { context: format!("the coordinators' lease: {context}"), cause }
}

impl Candidate {
    /// A connection of its own to the server `store` names, and the
    /// lease's table there.
    pub fn connect(store: &Path) -> Result<Candidate, StoreError> {
        let (conn, key) = connect(store)?;
        Ok(Candidate { conn, key })
    }

    /// One try for the lease as `holder` ([`name_this_process`]), for
    /// `lease_ms`, announcing an instance of at least `min_instance`.
    pub fn try_acquire(self, holder: &str, lease_ms: i64, min_instance: u64) -> Result<Try, StoreError> {
        try_acquire(self.conn, self.key, holder, lease_ms, min_instance)
    }
}

fn connect(store: &Path) -> Result<(Conn, i64), StoreError> {
    let (conn, target) = Conn::open_server(store).map_err(sql_err("connecting"))?;
    let columns = "id BIGINT PRIMARY KEY, holder TEXT NOT NULL, epoch BIGINT NOT NULL, instance BIGINT NOT NULL, \
                   expires_ms BIGINT NOT NULL";
    conn.create_table_once(LEASE_TABLE, columns).map_err(sql_err("creating its table"))?;
    Ok((conn, active_key(&target.schema)))
}

fn try_acquire(conn: Conn, key: i64, holder: &str, lease_ms: i64, min_instance: u64) -> Result<Try, StoreError> {
    let got: bool =
        conn.query_row("SELECT pg_try_advisory_lock(?1)", [key], |r| r.get(0)).map_err(sql_err("locking"))?;
    if !got {
        let sql = format!("SELECT holder, expires_ms - {NOW_MS} FROM {LEASE_TABLE} WHERE id = 1");
        let (other, left_ms) = match conn.query_row(&sql, (), |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))) {
            Ok(row) => row,
            // Taken, the row not written yet: the other is taking over now.
            Err(sql::Error::NoRows) => {
                let again = Candidate { conn, key };
                return Ok(Try::Standby { holder: "another coordinator".into(), left_ms: 0, again });
            }
            Err(e) => return Err(sql_err("reading")(e)),
        };
        if left_ms < 0 {
            let ended: i64 = conn
                .query_row(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = ?1 AND \
                     pid <> pg_backend_pid()",
                    [other.as_str()],
                    |r| r.get(0),
                )
                .map_err(sql_err("ending a stalled holder's connections"))?;
            tracing::warn!(holder = %other, expired_ms = -left_ms, connections = ended, "the active coordinator's lease expired: its connections on the server were ended, so that it writes nothing more; taking over");
        }
        return Ok(Try::Standby { holder: other, left_ms, again: Candidate { conn, key } });
    }
    let sql = format!(
        "INSERT INTO {LEASE_TABLE} (id, holder, epoch, instance, expires_ms) VALUES (1, ?1, 1, ?2, {NOW_MS} + ?3) ON \
         CONFLICT (id) DO UPDATE SET holder = excluded.holder, epoch = {LEASE_TABLE}.epoch + 1, instance = \
         GREATEST({LEASE_TABLE}.instance + 1, excluded.instance), expires_ms = excluded.expires_ms RETURNING epoch, \
         instance"
    );
    let min_instance = i64::try_from(min_instance).unwrap_or(i64::MAX);
    let taken = std::time::Instant::now();
    let (epoch, instance) = conn
        .query_row(&sql, params![holder, min_instance, lease_ms], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .map_err(sql_err("taking over"))?;
    let instance = u64::try_from(instance).unwrap_or(0);
    let relock = std::cell::Cell::new(false);
    Ok(Try::Active(Lease { conn, key, holder: holder.to_string(), epoch, instance, taken, lease_ms, relock }))
}

impl Lease {
    /// Pushes the expiry `lease_ms` on. `Err(Lost)` when another took the
    /// lease; `Ok(false)` when the server cannot be reached now (a
    /// server's restart drops the lock: it is taken again here while the
    /// row is still this coordinator's).
    pub fn renew(&self) -> Result<bool, Lost> {
        let lost = |(holder, epoch)| Lost::TakenOver { holder, epoch };
        let row = || {
            let sql = format!("SELECT holder, epoch FROM {LEASE_TABLE} WHERE id = 1");
            self.conn.query_row(&sql, (), |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        };
        let unreachable = || {
            self.relock.set(true);
            Ok(false)
        };
        if self.relock.get() {
            match self.conn.query_row("SELECT pg_try_advisory_lock(?1)", [self.key], |r| r.get::<_, bool>(0)) {
                Ok(true) => self.relock.set(false),
                Ok(false) => {
                    return Err(lost(row().unwrap_or_else(|_| ("another coordinator".into(), self.epoch + 1))))
                }
                Err(_) => return unreachable(),
            }
        }
        let sql =
            format!("UPDATE {LEASE_TABLE} SET expires_ms = {NOW_MS} + ?1 WHERE id = 1 AND holder = ?2 AND epoch = ?3");
        match self.conn.execute(&sql, params![self.lease_ms, self.holder, self.epoch]) {
            Ok(1) => Ok(true),
            Ok(_) => Err(lost(row().unwrap_or_else(|_| ("another coordinator".into(), self.epoch + 1)))),
            Err(_) => unreachable(),
        }
    }
}
