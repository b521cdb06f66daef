//! PostgreSQL, the shared backend: `postgres://USER@HOST:PORT/DB`, the
//! password from the environment or a file, never the command line; a
//! schema per fleet (`?schema=NAME`, default `tunefleet`), so independent
//! fleets share one server.
//!
//! The client runs on a thread of its own with its own runtime (the
//! store's callers are synchronous): each call is a request to that thread
//! and waits for its answer. Inside a write transaction a write whose
//! count is not needed is not sent alone: it waits for the next statement
//! that needs an answer and goes with it, every statement of the round
//! trip sent before any answer is awaited (the extended protocol's
//! pipelining). Statements are translated once from the store's SQL
//! ([`translate`]) and kept prepared.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::mpsc;
use std::sync::Arc;

use tokio_postgres::types::{FromSql as PgFromSql, IsNull, ToSql as PgToSql, Type};

use super::row::Check;
use super::value::{Error, Params, Result, Value};

mod connect;
mod flight;
mod thread;
pub use connect::{Plans, CREATING};
pub(super) use flight::Flight;
use thread::{Envelope, Group, Op, Prepared, Request};

/// The most rows a grouped write sends in one statement
/// ([`PgConn::write_grouped`]).
const GROUP_ROWS: usize = 256;

/// The schema a store's tables live in when the URL names none.
pub const DEFAULT_SCHEMA: &str = "tunefleet";

/// Where a PostgreSQL store is, as its URL says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    /// The URL without the store's own options, for the client.
    pub url: String,
    /// The schema of the store's tables.
    pub schema: String,
    /// With `sslmode=require`, `verify-ca` or `verify-full`: the CA file
    /// (`sslrootcert`) the server's certificate and name are verified
    /// against, always (Tunefleet never takes an unverified certificate).
    pub ca: Option<std::path::PathBuf>,
    /// How the server plans this connection's statements.
    pub plans: Plans,
}

/// What this process's connections call themselves on the server.
static APPLICATION_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names this process's connections opened from now on `name` (at most
/// 63 bytes: the server's limit), so that another coordinator can end
/// them when this one stalled past its lease. Once per process.
pub fn set_application_name(name: &str) {
    let _ = APPLICATION_NAME.set(name.chars().take(63).collect());
}

/// This process's connections' name: `tunefleet` unless set.
pub fn application_name() -> &'static str {
    APPLICATION_NAME.get().map_or("tunefleet", String::as_str)
}

/// Whether `location` names a PostgreSQL store.
pub fn is_postgres(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// `location` as it may be shown: a password in it replaced by `***`.
pub fn redacted(location: &str) -> String {
    match url::Url::parse(location) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        Ok(_) => location.to_string(),
        Err(_) => "a store URL that does not parse".to_string(),
    }
}

/// Parses a store URL: refuses a password in it (it would show in `ps`
/// and shell history) and a schema name that is not a plain identifier.
pub fn parse_target(location: &str) -> std::result::Result<PgTarget, String> {
    let url = url::Url::parse(location).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    if url.password().is_some() {
        return Err("the store URL holds a password: give it in TUNEFLEET_STORE_PASSWORD or a file named by \
                    TUNEFLEET_STORE_PASSWORD_FILE, never on the command line"
            .into());
    }
    let mut schema = DEFAULT_SCHEMA.to_string();
    let (mut mode, mut ca) = (None, None);
    let mut kept = url.clone();
    kept.query_pairs_mut().clear();
    let mut any = false;
    for (key, value) in url.query_pairs() {
        match &*key {
            "schema" => schema = value.into_owned(),
            "sslmode" => mode = Some(value.into_owned()),
            "sslrootcert" => ca = Some(std::path::PathBuf::from(&*value)),
            _ => {
                kept.query_pairs_mut().append_pair(&key, &value);
                any = true;
            }
        }
    }
    let ca = match (mode.as_deref(), ca) {
        (None | Some("disable" | "allow" | "prefer"), None) => None,
        (Some("require" | "verify-ca" | "verify-full"), Some(ca)) => Some(ca),
        (Some("require" | "verify-ca" | "verify-full"), None) => {
            return Err("sslmode: give the CA that signed the server's certificate as sslrootcert=FILE (the \
                        certificate and the server's name are always verified)"
                .into())
        }
        (Some(m), _) if !matches!(m, "disable" | "allow" | "prefer") => {
            return Err(format!("sslmode={m}: disable, require, verify-ca or verify-full"))
        }
        _ => return Err("sslrootcert without sslmode=verify-full (or require)".into()),
    };
    if !any {
        kept.set_query(None);
    }
    let plain = !schema.is_empty()
        && schema.len() <= 63
        && schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !schema.starts_with(|c: char| c.is_ascii_digit());
    if !plain {
        return Err(format!("schema {schema:?}: lower-case letters, digits and '_', at most 63, not a digit first"));
    }
    Ok(PgTarget { url: kept.to_string(), schema, ca, plans: Plans::default() })
}

/// The store's password: `TUNEFLEET_STORE_PASSWORD`, else the first line
/// of the file `TUNEFLEET_STORE_PASSWORD_FILE` names, else none (the
/// server may trust the connection, or `PGPASSFILE`'s rules apply).
fn password() -> std::result::Result<Option<String>, String> {
    if let Ok(p) = std::env::var("TUNEFLEET_STORE_PASSWORD") {
        return Ok(Some(p));
    }
    let Ok(file) = std::env::var("TUNEFLEET_STORE_PASSWORD_FILE") else { return Ok(None) };
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{file}: cannot read the store's password: {e}"))?;
    Ok(Some(text.lines().next().unwrap_or_default().to_string()))
}

type BoxError = Box<dyn StdError + Sync + Send>;

/// Text the server takes for a parameter of a text type.
fn is_text(ty: &Type) -> bool {
    matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN)
}

impl PgToSql for Value {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> std::result::Result<IsNull, BoxError> {
        match self {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i)?.to_sql(ty, out),
                Type::FLOAT8 => (*i as f64).to_sql(ty, out),
                Type::FLOAT4 => (*i as f32).to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                _ if is_text(ty) => i.to_string().as_str().to_sql(ty, out),
                _ => Err(format!("an integer for a parameter of type {ty}").into()),
            },
            Value::Real(x) => match *ty {
                Type::FLOAT8 => x.to_sql(ty, out),
                Type::FLOAT4 => (*x as f32).to_sql(ty, out),
                _ if is_text(ty) => x.to_string().as_str().to_sql(ty, out),
                _ => Err(format!("a real for a parameter of type {ty}").into()),
            },
            Value::Text(t) => match *ty {
                _ if is_text(ty) => t.as_str().to_sql(ty, out),
                Type::BYTEA => t.as_bytes().to_sql(ty, out),
                _ => Err(format!("text for a parameter of type {ty}").into()),
            },
            Value::Blob(b) => b.as_slice().to_sql(ty, out),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

impl<'a> PgFromSql<'a> for Value {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<Self, BoxError> {
        Ok(match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i64::from(i32::from_sql(ty, raw)?)),
            Type::INT2 => Value::Integer(i64::from(i16::from_sql(ty, raw)?)),
            Type::OID => Value::Integer(i64::from(u32::from_sql(ty, raw)?)),
            Type::BOOL => Value::Integer(i64::from(bool::from_sql(ty, raw)?)),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f64::from(f32::from_sql(ty, raw)?)),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Value::Blob(raw.to_vec()),
            _ if is_text(ty) => Value::Text(String::from_sql(ty, raw)?),
            _ => return Err(format!("a column of type {ty}, which the store does not read").into()),
        })
    }

    fn from_sql_null(_ty: &Type) -> std::result::Result<Self, BoxError> {
        Ok(Value::Null)
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }
}

/// A NUMERIC in PostgreSQL's binary form (what `SUM` of integers gives):
/// an integer when it has no fraction and fits, else a real.
fn numeric(raw: &[u8]) -> std::result::Result<Value, BoxError> {
    let word = |i: usize| -> std::result::Result<u16, BoxError> {
        raw.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]])).ok_or_else(|| "a short NUMERIC".into())
    };
    let (ndigits, weight, sign, scale) = (word(0)?, word(2)? as i16, word(4)?, word(6)?);
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut int: i128 = 0;
    let mut real = 0.0f64;
    let mut whole = true;
    for d in 0..ndigits {
        let digit = word(8 + 2 * d as usize)?;
        let power = i32::from(weight) - i32::from(d as i16);
        real += f64::from(digit) * 10_000f64.powi(power);
        if power >= 0 && whole {
            int = int.checked_mul(10_000).and_then(|v| v.checked_add(i128::from(digit))).unwrap_or(i128::MAX);
        } else if digit != 0 {
            whole = false;
        }
    }
    // Trailing zero groups the binary form leaves out.
    let last = i32::from(weight) - i32::from(ndigits as i16) + 1;
    for _ in 0..last.max(0) {
        int = int.checked_mul(10_000).unwrap_or(i128::MAX);
    }
    let negative = sign == 0x4000;
    match (whole && scale == 0, i64::try_from(int)) {
        (true, Ok(v)) => Ok(Value::Integer(if negative { -v } else { v })),
        _ => Ok(Value::Real(if negative { -real } else { real })),
    }
}

/// A connection: the channel to the thread that owns the client.
pub(super) struct PgConn {
    requests: mpsc::Sender<Envelope>,
    pub(super) target: PgTarget,
    /// What the client thread answered to each text prepared before: a
    /// statement asked again costs no round trip.
    prepared: std::cell::RefCell<HashMap<String, Prepared>>,
    /// The lease epoch every write transaction checks first, once set
    /// ([`super::Conn::set_fence`]).
    pub(super) fence: std::cell::Cell<Option<i64>>,
    /// Inside a write transaction: writes are deferred ([`PgConn::write`]).
    deferring: std::cell::Cell<bool>,
    /// The deferred statements, in order, not sent yet.
    pending: std::cell::RefCell<Vec<Op>>,
    /// The commits sent without waiting.
    pub(super) flight: Arc<Flight>,
}

impl std::fmt::Debug for PgConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConn").field("schema", &self.target.schema).finish_non_exhaustive()
    }
}

/// What the driver connects to `target` with: its URL, the password (never
/// in the URL), this process's name and [`network_defaults`].
fn client_config(target: &PgTarget) -> Result<tokio_postgres::Config> {
    let mut config: tokio_postgres::Config = target.url.parse()?;
    if let Some(p) = password().map_err(Error::Closed)? {
        config.password(p);
    }
    config.application_name(application_name());
    network_defaults(&mut config);
    Ok(config)
}

/// How long a connection waits on a network that answers nothing before
/// it is taken for lost, and how long an idle one goes unprobed: the
/// defaults of [`network_defaults`].
const NETWORK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
const IDLE_PROBED_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// A network lost without a word (every packet dropped, no end heard) is
/// found within seconds rather than the system's minutes: the kernel
/// retransmits unacknowledged data for about 15 minutes, and probes an idle
/// connection first after 2 hours, while a coordinator waits on its store.
/// Connecting, data sent and not acknowledged (`tcp_user_timeout`) and an
/// idle connection (keepalive probes) each give up within
/// [`NETWORK_PATIENCE`], where the store's URL does not set its own
/// (`connect_timeout`, `tcp_user_timeout`, `keepalives_idle`, as libpq
/// names them, each in seconds: libpq's `tcp_user_timeout` is in
/// milliseconds, the driver's in seconds). The connection is then lost,
/// and the coordinator pauses.
fn network_defaults(config: &mut tokio_postgres::Config) {
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(NETWORK_PATIENCE);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(NETWORK_PATIENCE);
    }
    // The driver's own default: the system's two hours.
    if config.get_keepalives_idle() == std::time::Duration::from_secs(2 * 3600) {
        config.keepalives_idle(IDLE_PROBED_AFTER);
    }
    if config.get_keepalives_interval().is_none() {
        config.keepalives_interval(std::time::Duration::from_secs(2));
    }
    if config.get_keepalives_retries().is_none() {
        config.keepalives_retries(2);
    }
}

/// The client thread has ended ([`Error::Gone`]).
pub(super) fn gone() -> Error {
    Error::Gone
}

impl PgConn {
    /// Connects to `target`, creating its schema when missing and
    /// working in it.
    pub(super) fn connect(target: &PgTarget) -> Result<PgConn> {
        let mut config = client_config(target)?;
        let tls = match &target.ca {
            Some(ca) => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                let files = tunefleet_common::security::TlsFiles { ca: ca.clone(), identity: None };
                let client = tunefleet_common::security::client_config(&files)
                    .map_err(|e| Error::Closed(format!("sslrootcert: {e}")))?;
                Some(tokio_postgres_rustls::MakeRustlsConnect::new((*client).clone()))
            }
            None => None,
        };
        let flight = Arc::new(Flight::default());
        let requests = thread::spawn(config, target.schema.clone(), target.plans, tls, flight.clone())?;
        Ok(PgConn {
            requests,
            flight,
            target: target.clone(),
            prepared: Default::default(),
            fence: Default::default(),
            deferring: Default::default(),
            pending: Default::default(),
        })
    }

    /// Sends `request` after the deferred statements, in one round trip,
    /// and waits for its answer (a deferred statement's error first).
    fn ask<T>(&self, make: impl FnOnce(mpsc::Sender<Result<T>>) -> Request) -> Result<T> {
        let (reply, answer) = mpsc::channel();
        let before = std::mem::take(&mut *self.pending.borrow_mut());
        self.requests.send(Envelope { before, request: make(reply) }).map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }

    /// `sql` translated and prepared (once per text): its id and columns.
    pub(super) fn prepare(&self, sql: &str) -> Result<Prepared> {
        if let Some(known) = self.prepared.borrow().get(sql) {
            return Ok(known.clone());
        }
        let known = self.ask(|reply| Request::Prepare { sql: sql.to_string(), reply })?;
        self.prepared.borrow_mut().insert(sql.to_string(), known.clone());
        Ok(known)
    }

    pub(super) fn query<P: Params>(&self, id: usize, params: &P) -> Result<Vec<Vec<Value>>> {
        let params = owned(params)?;
        self.ask(|reply| Request::Query { id, params, reply })
    }

    pub(super) fn execute<P: Params>(&self, id: usize, params: &P) -> Result<usize> {
        let params = owned(params)?;
        let n = self.ask(|reply| Request::Execute { id, params, reply })?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Runs statement `id` without waiting for its answer inside a write
    /// transaction: it is sent with the next statement that needs one (or
    /// [`PgConn::settle`]), and its error, if any, is that statement's.
    /// Outside one it runs at once.
    pub(super) fn write<P: Params>(&self, id: usize, params: &P) -> Result<()> {
        if !self.deferring.get() {
            return self.execute(id, params).map(drop);
        }
        let params = owned(params)?;
        self.pending.borrow_mut().push(Op::Write { id, params });
        Ok(())
    }

    /// A row of statement `id`, whose every parameter is an array (a
    /// column of rows) whose answer `check` judges
    /// ([`super::Stmt::write_grouped`]): each row the statement answers is
    /// one it did not take, and `check` says why.
    /// Inside a write transaction the row joins a group of `id` among the
    /// grouped writes deferred last (no other statement after them), unless
    /// one of those has its `key`: it goes ahead of nothing but other
    /// groups' rows of other keys. Rows of different keys are written as
    /// if at once, rows of one key in their order. Outside a transaction it
    /// runs at once, alone.
    pub(super) fn write_grouped<P: Params>(
        &self,
        id: usize,
        params: &P,
        key: String,
        columns: &Arc<Vec<String>>,
        check: Check,
    ) -> Result<()> {
        let row = owned(params)?;
        let alone = |key, row: Vec<Value>| {
            let mut group = Group::new(id, row.len(), columns.clone(), check);
            group.push(key, row).map(|()| Op::Group(group))
        };
        if !self.deferring.get() {
            self.pending.borrow_mut().push(alone(key, row)?);
            return self.settle();
        }
        let mut pending = self.pending.borrow_mut();
        // The last run of groups: a row may join one of its statement's
        // there when no row of that run has its key.
        let run = pending.iter().rev().take_while(|op| matches!(op, Op::Group(_))).count();
        let start = pending.len() - run;
        let free = pending[start..].iter().all(|op| !matches!(op, Op::Group(g) if g.keys.contains(&key)));
        let joins = pending[start..].iter_mut().rev().find_map(|op| match op {
            Op::Group(g) if free && g.id == id && g.len() < GROUP_ROWS => Some(g),
            _ => None,
        });
        match joins {
            Some(g) => g.push(key, row),
            None => {
                pending.push(alone(key, row)?);
                Ok(())
            }
        }
    }

    /// Whether a checked write (or the lease's check) is deferred, its
    /// answer not judged yet.
    pub(super) fn checks_pending(&self) -> bool {
        self.pending.borrow().iter().any(Op::checked)
    }

    /// The lease's check `fence` (a statement answering the epoch) sent
    /// with the next statement that needs an answer, judged there: the
    /// epoch not `mine` fails that answer ([`Error::Fenced`]), and the
    /// transaction's `COMMIT` is sent only once it is judged.
    pub(super) fn defer_fence(&self, fence: &'static str, mine: i64) {
        self.pending.borrow_mut().push(Op::Fence { sql: fence, mine });
    }

    /// The owner has seen every commit that failed: once everything sent
    /// before is answered (refused, when it was built on a failed commit),
    /// what it sends from now on runs.
    pub(super) fn failed_commit_seen(&self) {
        // Nothing deferred is kept: it was built on what failed. A thread
        // that has gone runs nothing at all.
        self.pending.borrow_mut().clear();
        let _ = self.ask(|reply| Request::StartOver { reply });
    }

    /// Whether a commit sent without waiting has not ended yet.
    pub(super) fn in_flight(&self) -> bool {
        self.flight.in_flight()
    }

    /// Sends the deferred statements and the transaction's `COMMIT`
    /// without waiting: the client thread sends the `COMMIT` once every
    /// check among them is judged (else it rolls back), and answers on
    /// the receiver. Its number among the commits sent.
    pub(super) fn commit(&self) -> Result<(u64, tokio::sync::oneshot::Receiver<Result<()>>)> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let before = std::mem::take(&mut *self.pending.borrow_mut());
        let seq = self.flight.send();
        if self.requests.send(Envelope { before, request: Request::Commit { seq, reply } }).is_err() {
            self.flight.end(seq, false);
            return Err(gone());
        }
        Ok((seq, answer))
    }

    /// `sql` (no parameters) sent with the next statement that needs an
    /// answer.
    pub(super) fn defer(&self, sql: &str) {
        self.pending.borrow_mut().push(Op::Batch(sql.to_string()));
    }

    /// Sends what was deferred and waits for it: the first error of it.
    pub(super) fn settle(&self) -> Result<()> {
        if self.pending.borrow().is_empty() {
            return Ok(());
        }
        self.ask(|reply| Request::Settle { reply })
    }

    /// Writes are deferred from now (a write transaction began) or not
    /// (it ended); what was deferred and not sent is dropped when not.
    pub(super) fn set_deferring(&self, on: bool) {
        self.deferring.set(on);
        if !on {
            self.pending.borrow_mut().clear();
        }
    }

    pub(super) fn batch(&self, sql: &str) -> Result<()> {
        self.ask(|reply| Request::Batch { sql: sql.to_string(), forgive: false, reply })
    }

    /// [`PgConn::batch`], answering for `sql` alone: an error of a
    /// deferred statement before it is forgiven.
    pub(super) fn batch_forgiving(&self, sql: &str) -> Result<()> {
        self.ask(|reply| Request::Batch { sql: sql.to_string(), forgive: true, reply })
    }
}

/// `params` as values to send. A text holding a NUL character is refused
/// here, at once: the server cannot keep one, and its refusal would come
/// late (with the next answer), for another statement to be blamed.
fn owned<P: Params>(params: &P) -> Result<Vec<Value>> {
    params
        .values()
        .enumerate()
        .map(|(index, p)| {
            let value = p.to_sql().map(Value::of).map_err(|why| Error::Parameter { index: index + 1, why })?;
            match &value {
                Value::Text(t) if t.contains('\0') => Err(Error::Parameter {
                    index: index + 1,
                    why: "text with a NUL character, which PostgreSQL cannot keep".into(),
                }),
                _ => Ok(value),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_url_keeps_its_schema_and_never_a_password() {
        let url = "postgres://fleet@db.example:5433/tune?schema=lab_a&sslmode=disable&connect_timeout=5";
        let t = parse_target(url).expect("url");
        assert_eq!(t.schema, "lab_a");
        assert_eq!(t.url, "postgres://fleet@db.example:5433/tune?connect_timeout=5");
        assert_eq!(parse_target("postgres://fleet@h/db").expect("url").schema, DEFAULT_SCHEMA);
        let err = parse_target("postgres://fleet:secret@h/db").expect_err("a password");
        assert!(err.contains("TUNEFLEET_STORE_PASSWORD"), "{err}");
        assert!(parse_target("postgres://f@h/db?schema=Drop;Table").is_err(), "a schema is an identifier");
        assert!(is_postgres("postgresql://h/db") && !is_postgres("/var/lib/tunefleet/store.db"));
    }

    /// A network lost without a word is found within seconds, unless the
    /// store's URL says otherwise.
    #[test]
    fn a_silent_network_is_given_up_on_within_seconds_unless_the_url_says() {
        let config = |url: &str| client_config(&parse_target(url).expect("url")).expect("config");
        let c = config("postgres://f@h/db");
        assert_eq!(c.get_connect_timeout(), Some(&NETWORK_PATIENCE));
        assert_eq!(c.get_tcp_user_timeout(), Some(&NETWORK_PATIENCE));
        assert!(c.get_keepalives() && c.get_keepalives_idle() == IDLE_PROBED_AFTER);
        let c = config("postgres://f@h/db?connect_timeout=30&tcp_user_timeout=60&keepalives_idle=120");
        assert_eq!(c.get_connect_timeout(), Some(&std::time::Duration::from_secs(30)));
        assert_eq!(c.get_tcp_user_timeout(), Some(&std::time::Duration::from_secs(60)));
        assert_eq!(c.get_keepalives_idle(), std::time::Duration::from_secs(120));
    }

    #[test]
    fn tls_to_the_server_always_verifies_against_a_given_ca() {
        let t = parse_target("postgres://f@h/db?sslmode=verify-full&sslrootcert=/etc/ca.pem").expect("url");
        assert_eq!((t.url.as_str(), t.ca.as_deref()), ("postgres://f@h/db", Some(std::path::Path::new("/etc/ca.pem"))));
        assert!(parse_target("postgres://f@h/db?sslmode=require").expect_err("no CA").contains("sslrootcert"));
        assert!(parse_target("postgres://f@h/db?sslmode=sometimes").is_err());
        assert!(parse_target("postgres://f@h/db?sslrootcert=/ca.pem").is_err(), "a CA without TLS");
        assert_eq!(parse_target("postgres://f@h/db?sslmode=disable").expect("url").ca, None);
    }

    /// NUMERIC's binary form: 4 words of header, then base-10000 digits.
    fn numeric_bytes(ndigits: u16, weight: i16, sign: u16, scale: u16, digits: &[u16]) -> Vec<u8> {
        let mut out = Vec::new();
        for w in [ndigits, weight as u16, sign, scale] {
            out.extend(w.to_be_bytes());
        }
        for d in digits {
            out.extend(d.to_be_bytes());
        }
        out
    }

    #[test]
    fn numerics_read_as_integers_when_whole_and_reals_otherwise() {
        // 123456789 = 1 2345 6789 (weight 2).
        assert_eq!(numeric(&numeric_bytes(3, 2, 0, 0, &[1, 2345, 6789])).expect("n"), Value::Integer(123_456_789));
        // 20000 = 2 with weight 1, the trailing group left out.
        assert_eq!(numeric(&numeric_bytes(1, 1, 0, 0, &[2])).expect("n"), Value::Integer(20_000));
        assert_eq!(numeric(&numeric_bytes(1, 0, 0x4000, 0, &[7])).expect("n"), Value::Integer(-7));
        assert_eq!(numeric(&numeric_bytes(0, 0, 0, 0, &[])).expect("n"), Value::Integer(0));
        // 1.5 = 1 . 5000 (weight 0), scale 1.
        assert_eq!(numeric(&numeric_bytes(2, 0, 0, 1, &[1, 5000])).expect("n"), Value::Real(1.5));
        assert!(numeric(&[0, 1]).is_err(), "a short one is refused");
    }
}
