//! The thread that owns a PostgreSQL store's client ([`super::PgConn`]
//! sends it requests): its own runtime, the connection made again when the
//! server closed it, statements prepared once per text, and each request
//! sent in one round trip with the writes deferred before it, every
//! statement sent before any answer is awaited.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;

use tokio_postgres::types::ToSql as PgToSql;

use super::super::dialect::translate;
use super::super::row::{Check, Row, RowInner};
use super::super::value::{Error, Result, Value};
use super::connect::{end_lost, open_client, Backend, Plans, Tls};
use super::flight::Flight;

/// A prepared statement as callers name it: its id on the client thread
/// and its columns.
pub(super) type Prepared = (usize, Arc<Vec<String>>);

/// A statement whose answer nobody waits for ([`PgConn::write`],
/// [`PgConn::defer`]): sent with the next request that needs one, in the
/// same round trip.
pub(super) enum Op {
    Write {
        id: usize,
        params: Vec<Value>,
    },
    /// Rows of one statement whose parameters are arrays, a column each
    /// ([`super::PgConn::write_grouped`]): one statement for them all,
    /// answering the rows it did not take, each judged by `check`.
    Group(Group),
    /// The lease's check: `sql` answers the lease's epoch, which must be
    /// `mine` ([`super::PgConn::defer_fence`]). Prepared here, where the
    /// owner's prepare would wait behind a commit under way.
    Fence {
        sql: &'static str,
        mine: i64,
    },
    Batch(String),
}

/// The rows of a grouped write gathered so far, column by column.
pub(super) struct Group {
    pub(super) id: usize,
    pub(super) columns_in: Vec<Vec<Value>>,
    /// Each row's key: rows of one key keep their order, so a group never
    /// holds two.
    pub(super) keys: std::collections::HashSet<String>,
    pub(super) columns: Arc<Vec<String>>,
    pub(super) check: Check,
}

impl Group {
    /// A group of statement `id` holding no row yet.
    pub(super) fn new(id: usize, width: usize, columns: Arc<Vec<String>>, check: Check) -> Group {
        Group { id, columns_in: vec![Vec::new(); width], keys: Default::default(), columns, check }
    }

    /// Adds `row` (one value a column) under `key`.
    pub(super) fn push(&mut self, key: String, row: Vec<Value>) -> Result<()> {
        if row.len() != self.columns_in.len() {
            return Err(Error::Closed(format!(
                "a grouped row of {} values where its statement takes {}",
                row.len(),
                self.columns_in.len()
            )));
        }
        for (column, value) in self.columns_in.iter_mut().zip(row) {
            column.push(value);
        }
        self.keys.insert(key);
        Ok(())
    }

    /// How many rows it holds.
    pub(super) fn len(&self) -> usize {
        self.keys.len()
    }
}

/// A request to the client thread, after the deferred statements `before`.
pub(super) struct Envelope {
    pub(super) before: Vec<Op>,
    pub(super) request: Request,
}

/// What the client thread is asked to do.
pub(super) enum Request {
    Prepare {
        sql: String,
        reply: mpsc::Sender<Result<Prepared>>,
    },
    Query {
        id: usize,
        params: Vec<Value>,
        reply: mpsc::Sender<Result<Vec<Vec<Value>>>>,
    },
    Execute {
        id: usize,
        params: Vec<Value>,
        reply: mpsc::Sender<Result<u64>>,
    },
    /// `forgive`: the answer is `sql`'s alone, whatever the deferred
    /// statements before it answered.
    Batch {
        sql: String,
        forgive: bool,
        reply: mpsc::Sender<Result<()>>,
    },
    /// Only the deferred statements: whether they all succeeded.
    Settle {
        reply: mpsc::Sender<Result<()>>,
    },
    /// Its owner has seen every commit that failed, and has no
    /// transaction open: what was refused before is over, and what it
    /// sends after this runs ([`super::PgConn::failed_commit_seen`]).
    StartOver {
        reply: mpsc::Sender<Result<()>>,
    },
    /// The deferred statements of a write transaction, then its `COMMIT`
    /// once every check among them is judged, else its `ROLLBACK`; the
    /// answer goes to a waiter that need not block ([`super::PgConn::commit`]).
    /// `seq`: its number among the commits sent so.
    Commit {
        seq: u64,
        reply: tokio::sync::oneshot::Sender<Result<()>>,
    },
}

impl Op {
    /// Whether its answer is judged (a grouped write's, the lease's check):
    /// a `COMMIT` waits for it.
    pub(super) fn checked(&self) -> bool {
        matches!(self, Op::Group(_) | Op::Fence { .. })
    }
}

impl Request {
    /// A commit's number among those sent without waiting.
    fn commit_seq(&self) -> Option<u64> {
        match self {
            Request::Commit { seq, .. } => Some(*seq),
            _ => None,
        }
    }
}

/// Starts the client thread connected to `config`'s server and working
/// in `schema`; where to send it requests.
pub(super) fn spawn(
    config: tokio_postgres::Config,
    schema: String,
    plans: Plans,
    tls: Option<Tls>,
    flight: Arc<Flight>,
) -> Result<mpsc::Sender<Envelope>> {
    let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
    let (requests, rx) = mpsc::channel::<Envelope>();
    std::thread::Builder::new()
        .name("tunefleet-pg".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(Error::Closed(format!("cannot start the PostgreSQL client: {e}"))));
                    return;
                }
            };
            match open_client(&rt, &config, &schema, plans, tls.as_ref()) {
                Ok((client, backend)) => {
                    let _ = ready_tx.send(Ok(()));
                    Server {
                        rt,
                        client,
                        backend,
                        config,
                        tls,
                        schema,
                        plans,
                        prepared: Vec::new(),
                        by_text: HashMap::new(),
                        in_transaction: false,
                        ended: None,
                        flight,
                    }
                    .serve(rx);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| Error::Closed(format!("cannot start the PostgreSQL client thread: {e}")))?;
    ready_rx.recv().map_err(|_| Error::Closed("the PostgreSQL client thread ended".into()))??;
    Ok(requests)
}

/// One statement of a round trip, resolved on the client thread.
enum Work<'a> {
    Execute(tokio_postgres::Statement, &'a [Value]),
    Query(tokio_postgres::Statement, &'a [Value]),
    /// A statement whose every parameter is an array (a column of values).
    Columns(tokio_postgres::Statement, &'a [Vec<Value>]),
    Batch(String),
}

/// What a statement of a round trip answered.
enum Done {
    Unit,
    Count(u64),
    Rows(Vec<Vec<Value>>),
}

type Pending<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Done>> + 'a>>;

/// The client thread's state: its client, how to connect it again, and
/// the statements prepared on it (by id; prepared again after a
/// reconnect, when first used).
struct Server {
    /// This thread's runtime: the client's requests and its connection's task.
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
    /// The client's session on the server: one lost with its connection
    /// is ended before the next is used ([`end_lost`]).
    backend: Backend,
    config: tokio_postgres::Config,
    /// TLS to the server, when the URL asks for it.
    tls: Option<Tls>,
    schema: String,
    plans: Plans,
    prepared: Vec<(String, Option<tokio_postgres::Statement>)>,
    by_text: HashMap<String, Prepared>,
    /// A write transaction is open (`BEGIN` seen, no `COMMIT` or
    /// `ROLLBACK` yet).
    in_transaction: bool,
    /// The transaction under way ended on the server before its owner
    /// ended it (its connection lost, or its lease's check failed, which
    /// rolled it back): everything but its `ROLLBACK` (or a new `BEGIN`) is
    /// refused, so no statement of it runs outside a transaction.
    ended: Option<Ended>,
    /// The commits sent without waiting, as the connection's owner and
    /// this thread see them.
    flight: Arc<Flight>,
}

/// Why a transaction ended on the server before its owner ended it.
#[derive(Debug, Clone, Copy)]
enum Ended {
    /// Its connection was lost.
    Lost,
    /// The lease's check found another epoch: rolled back at once.
    Fenced { mine: i64, now: Option<i64> },
    /// Something of it was refused after a commit failed: the rest of it
    /// would run without it.
    Refused,
}

impl Ended {
    /// What a statement of the transaction sent after that is answered.
    fn error(self) -> Error {
        match self {
            Ended::Lost => Error::Closed("the connection was lost inside this transaction".into()),
            Ended::Fenced { mine, now } => Error::Fenced { mine, now },
            Ended::Refused => {
                Error::Closed("an earlier commit of this connection failed; nothing sent after it runs".into())
            }
        }
    }
}

/// Whether `sql` begins a transaction.
fn begins(sql: &str) -> bool {
    sql.trim_start().starts_with("BEGIN")
}

impl Server {
    /// Answers requests in order until the connection's owner goes.
    fn serve(mut self, requests: mpsc::Receiver<Envelope>) {
        for Envelope { before, request } in requests {
            // In order: everything sent before it was answered (refused,
            // if built on a failed commit); nothing of a transaction is
            // open on the owner's side.
            if let Request::StartOver { reply } = request {
                drop(before);
                self.flight.failures_seen();
                self.end_transaction();
                let _ = reply.send(Ok(()));
                continue;
            }
            // What was sent after a commit that failed, until its owner
            // says it starts over, was built on what that commit did: none
            // of it runs.
            if self.flight.failure_unseen() {
                // A transaction begun here is refused to its end, even once
                // the failure is seen.
                let begun = matches!(before.first(), Some(Op::Batch(sql)) if begins(sql))
                    || matches!(&request, Request::Batch { sql, .. } if before.is_empty() && begins(sql));
                if begun || self.in_transaction {
                    self.ended = Some(Ended::Refused);
                }
                self.refuse(request, &Ended::Refused.error());
                continue;
            }
            // A connection the server closed (it restarted, or the network
            // broke) is made again before the next request: a write
            // transaction it held is gone, and the store says so.
            if self.client.is_closed() {
                match open_client(&self.rt, &self.config, &self.schema, self.plans, self.tls.as_ref()) {
                    Ok((c, backend)) => {
                        tracing::warn!(lost_transaction = self.in_transaction, "connected to PostgreSQL again");
                        self.client = c;
                        let lost = std::mem::replace(&mut self.backend, backend);
                        match end_lost(&self.rt, &self.client, &lost) {
                            Ok(None) => {}
                            Ok(Some(true)) => {
                                tracing::warn!(session = ?lost, "the lost connection's session was still on the server: ended")
                            }
                            Ok(Some(false)) => {
                                tracing::warn!(session = ?lost, "the lost connection's session was told to end and is still on the server")
                            }
                            Err(e) => {
                                tracing::warn!(session = ?lost, error = %e, "cannot end the lost connection's session on the server")
                            }
                        }
                        for (_, stmt) in &mut self.prepared {
                            *stmt = None;
                        }
                        if self.in_transaction {
                            self.ended = Some(Ended::Lost);
                        }
                    }
                    Err(e) => {
                        self.refuse(request, &Error::Closed(format!("the database is unreachable: {e}")));
                        continue;
                    }
                }
            }
            if let Some(ended) = self.ended {
                let first_begins = matches!(before.first(), Some(Op::Batch(sql)) if begins(sql));
                match request {
                    _ if first_begins => {
                        self.ended = None;
                        self.in_transaction = false;
                    }
                    Request::Batch { ref sql, .. } if before.is_empty() && sql.trim() == "ROLLBACK" => {
                        self.ended = None;
                        self.in_transaction = false;
                        match (ended, request) {
                            // Rolled back already (or never begun), as asked.
                            (Ended::Fenced { .. } | Ended::Refused, Request::Batch { reply, .. }) => {
                                drop(reply.send(Ok(())))
                            }
                            (_, request) => {
                                refuse(request, &Error::Closed("the transaction was lost with its connection".into()))
                            }
                        }
                        continue;
                    }
                    Request::Batch { ref sql, .. } if before.is_empty() && begins(sql) => {
                        self.ended = None;
                        self.in_transaction = false;
                    }
                    request => {
                        self.refuse(request, &ended.error());
                        continue;
                    }
                }
            }
            self.answer(before, request);
        }
    }

    /// Answers `request` with `error`, running nothing. A commit refused
    /// so is one that failed, and its transaction is over (rolled back if
    /// the server holds it open).
    fn refuse(&mut self, request: Request, error: &Error) {
        if let Some(seq) = request.commit_seq() {
            self.end_transaction();
            self.end_commit(seq, false);
        }
        refuse(request, error);
    }

    /// The owner's transaction is over (its commit answered): rolled back
    /// on the server if it is still open there.
    fn end_transaction(&mut self) {
        if self.in_transaction && !self.client.is_closed() {
            let _ = self.run(vec![Work::Batch("ROLLBACK".into())]);
        }
        self.in_transaction = false;
        self.ended = None;
    }

    /// Commit `seq` ended (`ok`: committed), before its answer is sent.
    fn end_commit(&self, seq: u64, ok: bool) {
        self.flight.end(seq, ok);
    }

    /// The deferred statements `before` of a write transaction, then its
    /// `COMMIT`: in the same round trip when none of them is checked (an
    /// error among them makes the server roll back instead), else once
    /// their answers are judged, and a refusal rolls back.
    /// A failure leaves the transaction to [`Server::end_transaction`].
    fn commit(&mut self, mut before: Vec<Op>) -> Result<()> {
        if before.iter().any(Op::checked) {
            self.round_trip(&before, None).0?;
            before.clear();
        }
        before.push(Op::Batch("COMMIT".into()));
        self.round_trip(&before, None).0
    }

    fn answer(&mut self, before: Vec<Op>, request: Request) {
        if let Request::Commit { seq, reply } = request {
            let ended = self.commit(before);
            self.end_transaction();
            self.end_commit(seq, ended.is_ok());
            let _ = reply.send(ended);
            return;
        }
        if let Request::Prepare { sql, reply } = request {
            // Prepared after what was deferred: those are sent first.
            let settled = self.round_trip(&before, None).0;
            let _ = reply.send(settled.and_then(|()| self.prepare(sql)));
            return;
        }
        let (last, reply) = match request {
            Request::Query { id, params, reply } => (Some((Last::Query, id, params)), Reply::Rows(reply)),
            Request::Execute { id, params, reply } => (Some((Last::Execute, id, params)), Reply::Count(reply)),
            Request::Batch { sql, forgive, reply } => {
                let mut before = before;
                before.push(Op::Batch(sql));
                let answer = match forgive {
                    false => self.round_trip(&before, None).0,
                    // A check's refusal is never forgiven: what it refused
                    // was believed done, wherever its savepoint was.
                    true => match self.works(&before) {
                        Ok(work) => {
                            let mut answers = self.run(work);
                            let last = answers.pop().map_or(Ok(()), |a| a.map(drop));
                            let refused = self
                                .judge(&before, answers)
                                .into_iter()
                                .find(|a| matches!(a, Err(Error::Refused(_) | Error::Fenced { .. })))
                                .map_or(Ok(()), |a| a.map(drop));
                            refused.and(last)
                        }
                        Err(e) => Err(e),
                    },
                };
                let _ = reply.send(answer);
                return;
            }
            Request::Settle { reply } => (None, Reply::Unit(reply)),
            // Answered above; a start over in `serve`.
            Request::Prepare { .. } | Request::Commit { .. } | Request::StartOver { .. } => return,
        };
        let (settled, done) =
            self.round_trip(&before, last.as_ref().map(|(kind, id, params)| (*kind, *id, params.as_slice())));
        match reply {
            Reply::Unit(r) => drop(r.send(settled)),
            Reply::Count(r) => drop(r.send(settled.and_then(|()| match done {
                Some(Ok(Done::Count(n))) => Ok(n),
                Some(Err(e)) => Err(e),
                _ => Err(Error::Closed("an execute without a count".into())),
            }))),
            Reply::Rows(r) => drop(r.send(settled.and_then(|()| match done {
                Some(Ok(Done::Rows(rows))) => Ok(rows),
                Some(Err(e)) => Err(e),
                _ => Err(Error::Closed("a query without rows".into())),
            }))),
        }
    }

    fn prepare(&mut self, sql: String) -> Result<Prepared> {
        if let Some(known) = self.by_text.get(&sql) {
            return Ok(known.clone());
        }
        let stmt = self.rt.block_on(self.client.prepare(&translate(&sql)))?;
        let columns: Arc<Vec<String>> = Arc::new(stmt.columns().iter().map(|c| c.name().to_string()).collect());
        self.prepared.push((sql.clone(), Some(stmt)));
        let known = (self.prepared.len() - 1, columns);
        self.by_text.insert(sql, known.clone());
        Ok(known)
    }

    /// Sends `before` and then `last` in one round trip (every statement
    /// sent before any answer is awaited) and waits for them all: the
    /// first error of `before`, and `last`'s answer.
    fn round_trip(
        &mut self,
        before: &[Op],
        last: Option<(Last, usize, &[Value])>,
    ) -> (Result<()>, Option<Result<Done>>) {
        let mut work = match self.works(before) {
            Ok(work) => work,
            Err(e) => return (Err(e), None),
        };
        if let Some((kind, id, params)) = last {
            match self.statement(id) {
                Ok(stmt) => work.push(match kind {
                    Last::Query => Work::Query(stmt, params),
                    Last::Execute => Work::Execute(stmt, params),
                }),
                Err(e) => {
                    let answers = self.run(work);
                    return (first_error(self.judge(before, answers)), Some(Err(e)));
                }
            }
        }
        let n_before = before.len();
        let mut answers = self.run(work);
        let last_answer = if answers.len() > n_before { answers.pop() } else { None };
        (first_error(self.judge(before, answers)), last_answer)
    }

    /// `answers` of `ops` judged ([`checked`]). A lease's check that failed
    /// rolls the transaction back at once: nothing sent after it in the
    /// transaction runs, its `COMMIT` least of all, whoever reads the error.
    fn judge(&mut self, ops: &[Op], answers: Vec<Result<Done>>) -> Vec<Result<Done>> {
        let judged = checked(ops, answers);
        let fenced = judged.iter().find_map(|a| match a {
            Err(Error::Fenced { mine, now }) => Some(Ended::Fenced { mine: *mine, now: *now }),
            _ => None,
        });
        if let Some(fenced) = fenced {
            if self.in_transaction {
                let _ = self.run(vec![Work::Batch("ROLLBACK".into())]);
            }
            self.ended = Some(fenced);
        }
        judged
    }

    /// The deferred statements `ops` ready to send.
    fn works<'a>(&mut self, ops: &'a [Op]) -> Result<Vec<Work<'a>>> {
        let mut work = Vec::with_capacity(ops.len() + 1);
        for op in ops {
            work.push(match op {
                Op::Write { id, params } => Work::Execute(self.statement(*id)?, params.as_slice()),
                Op::Group(g) => Work::Columns(self.statement(g.id)?, g.columns_in.as_slice()),
                Op::Fence { sql, .. } => {
                    let (id, _) = self.prepare((*sql).to_string())?;
                    Work::Query(self.statement(id)?, &[])
                }
                Op::Batch(sql) => Work::Batch(translate(sql)),
            });
        }
        Ok(work)
    }

    /// Runs `work` pipelined: every answer, in order.
    fn run(&mut self, work: Vec<Work<'_>>) -> Vec<Result<Done>> {
        let (client, work_ref) = (&self.client, &work);
        let answers: Vec<Result<Done>> = self.rt.block_on(async move {
            let mut futures: Vec<Pending<'_>> = work_ref.iter().map(|w| send(client, w)).collect();
            let mut answers: Vec<Option<Result<Done>>> = (0..futures.len()).map(|_| None).collect();
            // Each future sends its statement when first polled: all are
            // polled once, in order, before any answer is awaited.
            for (future, answer) in futures.iter_mut().zip(answers.iter_mut()) {
                let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await;
                if let std::task::Poll::Ready(done) = polled {
                    *answer = Some(done);
                }
            }
            let mut out = Vec::with_capacity(futures.len());
            for (future, answer) in futures.into_iter().zip(answers) {
                out.push(match answer {
                    Some(done) => done,
                    None => future.await,
                });
            }
            out
        });
        for (w, answer) in work.iter().zip(&answers) {
            if let Work::Batch(sql) = w {
                match sql.trim() {
                    s if begins(s) => self.in_transaction = answer.is_ok(),
                    "COMMIT" | "ROLLBACK" => self.in_transaction = false,
                    _ => {}
                }
            }
        }
        answers
    }

    /// Statement `id`, prepared on the current connection.
    fn statement(&mut self, id: usize) -> Result<tokio_postgres::Statement> {
        let (sql, stmt) =
            self.prepared.get_mut(id).ok_or_else(|| Error::Closed(format!("no prepared statement {id}")))?;
        if let Some(s) = stmt {
            return Ok(s.clone());
        }
        let fresh = self.rt.block_on(self.client.prepare(&translate(sql)))?;
        *stmt = Some(fresh.clone());
        Ok(fresh)
    }
}
/// A grouped write's answer `rows`: the rows it did not take, each
/// judged by `check` (the first refusal is the answer). No row: all taken.
fn untaken(rows: &[Vec<Value>], columns: &[String], check: Check) -> Result<()> {
    rows.iter().try_for_each(|values| check(&Row(RowInner::Pg { values, columns })))
}

/// `answers` of the deferred statements `ops`, each checked write's
/// judged by its check.
fn checked(ops: &[Op], answers: Vec<Result<Done>>) -> Vec<Result<Done>> {
    ops.iter()
        .zip(answers)
        .map(|(op, answer)| match (op, answer) {
            (Op::Group(g), Ok(Done::Rows(rows))) => untaken(&rows, &g.columns, g.check).map(|()| Done::Unit),
            (Op::Fence { mine, .. }, Ok(Done::Rows(rows))) => {
                let now = rows.first().and_then(|r| r.first()).and_then(|v| match v {
                    Value::Integer(epoch) => Some(*epoch),
                    _ => None,
                });
                match now == Some(*mine) {
                    true => Ok(Done::Unit),
                    false => Err(Error::Fenced { mine: *mine, now }),
                }
            }
            (_, answer) => answer,
        })
        .collect()
}

/// The first error among `answers`: the one that tells (what follows it in
/// a transaction fails only because the transaction was aborted).
fn first_error(answers: Vec<Result<Done>>) -> Result<()> {
    answers.into_iter().find(Result::is_err).map_or(Ok(()), |a| a.map(drop))
}

/// The kind of a round trip's last statement, whose answer is waited for.
#[derive(Debug, Clone, Copy)]
enum Last {
    Query,
    Execute,
}

/// Where a request's answer goes.
enum Reply {
    Unit(mpsc::Sender<Result<()>>),
    Count(mpsc::Sender<Result<u64>>),
    Rows(mpsc::Sender<Result<Vec<Vec<Value>>>>),
}

/// `work`'s statement as a future that sends it when first polled.
fn send<'a>(client: &'a tokio_postgres::Client, work: &'a Work<'a>) -> Pending<'a> {
    fn refs(params: &[Value]) -> Vec<&(dyn PgToSql + Sync)> {
        params.iter().map(|p| p as &(dyn PgToSql + Sync)).collect()
    }
    match work {
        Work::Execute(stmt, params) => Box::pin(async move {
            let refs = refs(params);
            Ok(Done::Count(client.execute(stmt, &refs).await?))
        }),
        Work::Query(stmt, params) => Box::pin(async move { rows(client, stmt, &refs(params)).await }),
        Work::Columns(stmt, columns) => Box::pin(async move {
            let refs: Vec<&(dyn PgToSql + Sync)> = columns.iter().map(|c| c as &(dyn PgToSql + Sync)).collect();
            rows(client, stmt, &refs).await
        }),
        Work::Batch(sql) => Box::pin(async move {
            client.batch_execute(sql).await?;
            Ok(Done::Unit)
        }),
    }
}

/// `stmt`'s answer to `params`: its rows.
async fn rows(
    client: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    params: &[&(dyn PgToSql + Sync)],
) -> Result<Done> {
    let rows = client.query(stmt, params).await?;
    let rows = rows
        .iter()
        .map(|row| (0..row.len()).map(|i| row.try_get::<_, Value>(i).map_err(Error::from)).collect())
        .collect::<Result<Vec<Vec<Value>>>>()?;
    Ok(Done::Rows(rows))
}

/// Answers `request` with `error` (a lease's check failed as itself,
/// anything else as a connection that cannot serve it).
fn refuse(request: Request, error: &Error) {
    let e = || match error {
        Error::Fenced { mine, now } => Error::Fenced { mine: *mine, now: *now },
        other => Error::Closed(other.to_string()),
    };
    match request {
        Request::Prepare { reply, .. } => drop(reply.send(Err(e()))),
        Request::Query { reply, .. } => drop(reply.send(Err(e()))),
        Request::Execute { reply, .. } => drop(reply.send(Err(e()))),
        Request::Batch { reply, .. } | Request::Settle { reply } | Request::StartOver { reply } => {
            drop(reply.send(Err(e())))
        }
        Request::Commit { reply, .. } => drop(reply.send(Err(e()))),
    }
}
