//! What crosses the seam: values bound in ([`ToSql`]) and read out
//! ([`FromSql`]) as the databases hold them ([`ValueRef`]), a statement's
//! parameters ([`Params`]), and what goes wrong ([`Error`]).

use std::fmt;

/// What went wrong talking to the database.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Sqlite(Box<rusqlite::Error>),
    #[error("{}", postgres_text(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// The connection cannot be used (it broke, or never opened).
    #[error("{0}")]
    Closed(String),
    /// The thread that owns the connection has ended: a fault of this
    /// program, not a database out of reach, so nothing waits for it.
    #[error("the PostgreSQL client thread ended")]
    Gone,
    #[error("Query returned no rows")]
    NoRows,
    #[error("column {column}: {why}")]
    Conversion { column: usize, why: String },
    #[error("no column named {0:?}")]
    NoColumn(String),
    #[error("parameter {index}: {why}")]
    Parameter { index: usize, why: String },
    /// A write refused: another coordinator holds the lease now.
    #[error(
        "this coordinator's lease (epoch {mine}) was taken over ({}): it steps down and writes nothing more",
        now.map_or("no lease is held".to_string(), |e| format!("epoch {e} now"))
    )]
    Fenced { mine: i64, now: Option<i64> },
    /// A statement's answer refused what was asked ([`super::Check`]): a
    /// trial that ended given again.
    #[error("{0}")]
    Refused(String),
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::Sqlite(Box::new(e))
    }
}

impl Error {
    /// Whether the database could not be reached (the connection closed,
    /// the server shut down), rather than refusing what was asked.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Closed(_) => true,
            Error::Postgres(e) => match e.code() {
                // Class 08, connection exceptions; 57P0x, the server shutting down.
                Some(code) => code.code().starts_with("08") || code.code().starts_with("57P0"),
                None => e.is_closed() || connection_failed(e),
            },
            _ => false,
        }
    }

    /// Column `column` holds what its reader cannot take: `why`.
    pub fn conversion(column: usize, why: impl fmt::Display) -> Self {
        Error::Conversion { column, why: why.to_string() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the driver says, without a server's SQLSTATE, when the connection
/// failed: it could not be made, broke, timed out, or no longer follows
/// the protocol. Making it again may mend each. The driver's other errors
/// of its own (a value it cannot bind or read, a statement with the wrong
/// number of parameters, a message too large to send, a setting it cannot
/// use) are faults of this program or its configuration that a connection
/// made again would meet again. A connection closed the driver names by
/// its kind ([`tokio_postgres::Error::is_closed`]).
const CONNECTION_FAILED: [&str; 6] = [
    "error communicating with the server",
    "error connecting to server",
    "timeout waiting for server",
    "error performing TLS handshake",
    "unexpected message from server",
    "error parsing response from server",
];

/// Whether `e`, an error of the driver's own, says the connection failed
/// ([`CONNECTION_FAILED`]). The driver names its kinds only in words (this
/// version without their cause; matched by prefix should another add it).
fn connection_failed(e: &tokio_postgres::Error) -> bool {
    let text = e.to_string();
    CONNECTION_FAILED.iter().any(|kind| text.starts_with(kind))
}

/// What the server said, with its detail and hint, or the client's error.
fn postgres_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut text = format!("{}: {}", db.severity(), db.message());
            for extra in [db.detail(), db.hint()].into_iter().flatten() {
                text.push_str(&format!(" ({extra})"));
            }
            text
        }
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// A value as the database holds it, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Integer(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl ValueRef<'_> {
    fn kind(&self) -> &'static str {
        match self {
            ValueRef::Null => "NULL",
            ValueRef::Integer(_) => "an integer",
            ValueRef::Real(_) => "a real",
            ValueRef::Text(_) => "text",
            ValueRef::Blob(_) => "a blob",
        }
    }
}

/// A value as the database holds it, owned (to carry across threads or
/// from one store to another).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl Value {
    pub fn of(v: ValueRef<'_>) -> Value {
        match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(x) => Value::Real(x),
            ValueRef::Text(t) => Value::Text(t.to_string()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        }
    }

    pub fn as_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(x) => ValueRef::Real(*x),
            Value::Text(t) => ValueRef::Text(t),
            Value::Blob(b) => ValueRef::Blob(b),
        }
    }
}

impl ToSql for Value {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(self.as_ref())
    }
}

/// A value bound to a statement's parameter.
pub trait ToSql {
    fn to_sql(&self) -> Result<ValueRef<'_>, String>;
}

/// A value read from a row's column.
pub trait FromSql: Sized {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String>;
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        (**self).to_sql()
    }
}

impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        self.as_ref().map_or(Ok(ValueRef::Null), ToSql::to_sql)
    }
}

impl ToSql for str {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Text(self))
    }
}

impl ToSql for String {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Text(self))
    }
}

impl ToSql for [u8] {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for Vec<u8> {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Blob(self))
    }
}

impl ToSql for f64 {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Real(*self))
    }
}

impl ToSql for bool {
    fn to_sql(&self) -> Result<ValueRef<'_>, String> {
        Ok(ValueRef::Integer(i64::from(*self)))
    }
}

macro_rules! integer_to_sql {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_sql(&self) -> Result<ValueRef<'_>, String> {
                i64::try_from(*self).map(ValueRef::Integer).map_err(|_| format!("{self} is out of range"))
            }
        }
        impl FromSql for $t {
            fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
                match value {
                    ValueRef::Integer(i) => <$t>::try_from(i).map_err(|_| format!("{i} is out of range")),
                    other => Err(format!("{} where an integer belongs", other.kind())),
                }
            }
        }
    )*};
}

integer_to_sql!(i64, i32, u64, u32, u16, u8, usize);

impl FromSql for f64 {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Real(x) => Ok(x),
            ValueRef::Integer(i) => Ok(i as f64),
            other => Err(format!("{} where a real belongs", other.kind())),
        }
    }
}

impl FromSql for bool {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Integer(i) => Ok(i != 0),
            other => Err(format!("{} where a boolean belongs", other.kind())),
        }
    }
}

impl FromSql for String {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Text(t) => Ok(t.to_string()),
            other => Err(format!("{} where text belongs", other.kind())),
        }
    }
}

impl FromSql for Vec<u8> {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Blob(b) => Ok(b.to_vec()),
            other => Err(format!("{} where a blob belongs", other.kind())),
        }
    }
}

impl<T: FromSql> FromSql for Option<T> {
    fn from_sql(value: ValueRef<'_>) -> Result<Self, String> {
        match value {
            ValueRef::Null => Ok(None),
            v => T::from_sql(v).map(Some),
        }
    }
}

/// A statement's parameters, in order.
pub trait Params {
    fn values(&self) -> impl Iterator<Item = &dyn ToSql> + '_;
}

impl Params for () {
    fn values(&self) -> impl Iterator<Item = &dyn ToSql> + '_ {
        std::iter::empty()
    }
}

impl<T: ToSql> Params for &[T] {
    fn values(&self) -> impl Iterator<Item = &dyn ToSql> + '_ {
        self.iter().map(|v| v as &dyn ToSql)
    }
}

impl<T: ToSql, const N: usize> Params for [T; N] {
    fn values(&self) -> impl Iterator<Item = &dyn ToSql> + '_ {
        self.iter().map(|v| v as &dyn ToSql)
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// A port nothing listens on, on loopback: one bound and let go.
    fn closed_port() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    }

    #[tokio::test]
    async fn a_server_out_of_reach_is_unreachable_and_a_fault_of_ours_is_not() {
        let refused = format!("host=127.0.0.1 port={} user=nobody connect_timeout=5", closed_port());
        let e = tokio_postgres::connect(&refused, tokio_postgres::NoTls).await.err().expect("refused");
        assert!(Error::Postgres(e).is_unreachable(), "a refused connection is a database out of reach");
        let e = tokio_postgres::Error::__private_api_timeout();
        assert!(Error::Postgres(e).is_unreachable(), "a timeout is a database out of reach");

        // The driver's own errors that a connection made again meets again.
        let e = "host=127.0.0.1 port=notanumber".parse::<tokio_postgres::Config>().expect_err("not a port");
        assert!(e.code().is_none() && e.as_db_error().is_none(), "{e}");
        assert!(!Error::Postgres(e).is_unreachable(), "a setting the driver cannot use is not");
        assert!(!Error::Parameter { index: 1, why: "too large".into() }.is_unreachable());
        assert!(Error::Closed("broke".into()).is_unreachable());
    }
}
