//! A PostgreSQL store's connection made ([`open_client`]): TLS, the
//! store's schema created when missing and worked in, and how the server
//! plans its statements ([`Plans`]).

use super::super::value::Result;

/// How the server plans a connection's statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Plans {
    /// Each run planned for its parameters: a reader's queries, whose
    /// best plan may depend on them (a report's ranges and joins).
    #[default]
    EachRun,
    /// Each statement planned once, for every parameter: a writer's, whose
    /// statements reach rows by their keys. Planning each run of them took
    /// 236 of the server's 765 µs a trial on the whole path; planned once,
    /// the server's CPU a trial fell to 415 µs. No secondary index starts
    /// with a primary key's first column, so a plan made while the tables
    /// are still empty finds the primary key: `results_by_objective` did
    /// (study, success, objective), and the lookup of a result by its key
    /// planned on it scanned the study's results, 2 ms a trial at 20,000.
    Once,
}

impl Plans {
    /// The statement that sets `plan_cache_mode` so, for a connection
    /// working in `schema`. Planned once, a statement is planned with the
    /// tables' statistics as they are: where the server analysed the
    /// tables while small (a short study run first), lookups are planned
    /// as scans of the whole table and kept so as it grows, where a plan
    /// made each run follows its size. Such a store's statements are
    /// planned each run (measured, a study of 3,000 trials after an
    /// analysed one of 40: 6.0 to 6.3 s, against 6.7 to 6.9 s planned
    /// once and about 4 s on a fresh store; the statistics stay stale until
    /// the server analyses the tables again). Tables never analysed
    /// (`reltuples` -1, PostgreSQL 14 and later) are planned by their keys.
    fn setting(self, schema: &str) -> String {
        match self {
            Plans::EachRun => "SET plan_cache_mode TO force_custom_plan".into(),
            Plans::Once => format!(
                "SELECT set_config('plan_cache_mode', CASE WHEN EXISTS (SELECT 1 FROM pg_class \
                 WHERE relnamespace = to_regnamespace('{schema}') AND relname IN ('trials', 'results', 'attempts') \
                 AND reltuples >= 0 AND reltuples < {SMALL}) THEN 'force_custom_plan' ELSE 'force_generic_plan' END, \
                 false)"
            ),
        }
    }
}

/// Fewer rows than this in a table the server analysed: its statistics
/// may make a plan made once scan it whole ([`Plans::setting`]).
const SMALL: u32 = 1000;

/// TLS to the server with rustls, the server's certificate verified.
pub(super) type Tls = tokio_postgres_rustls::MakeRustlsConnect;

/// The advisory lock held while a schema or a table of the store's own is
/// created (`CREATE ... IF NOT EXISTS` races with itself).
pub const CREATING: i64 = 0x7475_6e65_666c_6565;

/// The server's session of a connection: its process, and when it began
/// (a process id alone may name a later session).
#[derive(Debug, Clone)]
pub(super) struct Backend {
    pid: i32,
    began: String,
}

/// How long the session of a lost connection is waited for once told to
/// end ([`end_lost`]).
const LOST_SESSION_WAIT_MS: i64 = 10_000;

/// Ends `lost`'s session on the server if it is still there (its backend
/// waiting on a lock, or yet to see that its client went, a `COMMIT`
/// perhaps among what it read) and waits for its end, so that what the
/// store holds is settled before anything is read or written again.
/// `None`: it was gone already; else whether it ended in time.
pub(super) fn end_lost(
    rt: &tokio::runtime::Runtime,
    client: &tokio_postgres::Client,
    lost: &Backend,
) -> Result<Option<bool>> {
    let sql = "SELECT pg_terminate_backend(pid, $3) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2";
    let rows = rt.block_on(client.query(sql, &[&lost.pid, &lost.began, &LOST_SESSION_WAIT_MS]))?;
    Ok(match rows.first() {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

/// A client connected and working in `schema`, created when missing, and
/// its session on the server.
pub(super) fn open_client(
    rt: &tokio::runtime::Runtime,
    config: &tokio_postgres::Config,
    schema: &str,
    plans: Plans,
    tls: Option<&Tls>,
) -> Result<(tokio_postgres::Client, Backend)> {
    rt.block_on(async {
        // The connection's own task (on this thread's runtime) reads and
        // writes the socket while a request is awaited.
        let client = match tls {
            Some(tls) => {
                let (client, connection) = config.connect(tls.clone()).await?;
                tokio::spawn(drive(connection));
                client
            }
            None => {
                let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
                tokio::spawn(drive(connection));
                client
            }
        };
        // Two coordinators starting at once would both create it: the server
        // refuses the second (a duplicate key), so one waits for the other.
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({CREATING}); CREATE SCHEMA IF NOT EXISTS {schema}; COMMIT; SET \
                 search_path TO {schema}; {}",
                plans.setting(schema)
            ))
            .await?;
        let me = "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()";
        let row = client.query_one(me, &[]).await?;
        let backend = Backend { pid: row.try_get(0)?, began: row.try_get(1)? };
        Ok((client, backend))
    })
}

/// Runs a connection until it ends; its end is seen by the client
/// (`is_closed`) and said there.
async fn drive<F: std::future::Future<Output = std::result::Result<(), tokio_postgres::Error>>>(connection: F) {
    if let Err(e) = connection.await {
        tracing::debug!(error = %e, "the PostgreSQL connection ended");
    }
}
