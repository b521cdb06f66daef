//! The InfluxDB sink: delivers the points the engine queued in the store's
//! outbox, in batches, through the influxdb2 client.
//!
//! The engine writes a result's points (see [`points`]) into the
//! `influx_outbox` table in the same transaction as the result, so a point
//! exists exactly when its result is stored. A background task (the
//! [`Flusher`]) reads the oldest points, writes them with one
//! `/api/v2/write` request, and deletes them once the server answered 204.
//!
//! Delivery guarantee: nothing is lost (a point leaves the store only after
//! the server took it; while the server is down the flusher retries with
//! backoff and points wait in the store, across restarts of the
//! coordinator), and nothing is duplicated: a crash between a write and its
//! delete sends the same points again, and InfluxDB keeps one value per
//! measurement, tag set, field and timestamp, so the second write overwrites
//! the first. (VictoriaMetrics keeps both unless started with
//! `-dedup.minScrapeInterval=1ms`.)
//!
//! A batch the server refuses as malformed (400, 422) is halved until the
//! offending point is alone; that point is parked in the outbox with the
//! server's reason and the rest flow on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use influxdb2::api::write::TimestampPrecision;
use influxdb2::RequestError;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::store::{OutboxCounts, OutboxRow, Store, StoreError};

/// What a stored result becomes in InfluxDB (the engine queues the points
/// in the result's transaction).
pub use crate::runtime::engine::points::{self, trial_points};

/// Where and how to write.
#[derive(Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// Base URL of the server (`http://HOST:8086`), checked by [`InfluxUrl::parse`].
    pub url: InfluxUrl,
    pub org: String,
    pub bucket: String,
    /// API token; `None` sends no `Authorization` header.
    pub token: Option<String>,
    /// Most points in one write request.
    pub batch: usize,
    /// How often an empty outbox is looked at again.
    pub poll: Duration,
    /// Longest wait for one write request.
    pub request_timeout: Duration,
    /// Retry delays after a failed write: doubling from `min` up to `max`.
    pub backoff: Backoff,
}

impl std::fmt::Debug for SinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkConfig")
            .field("url", &self.url)
            .field("org", &self.org)
            .field("bucket", &self.bucket)
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .field("batch", &self.batch)
            .field("poll", &self.poll)
            .field("request_timeout", &self.request_timeout)
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl SinkConfig {
    /// Defaults for everything but where to write.
    pub fn new(url: InfluxUrl, org: &str, bucket: &str, token: Option<String>) -> Self {
        SinkConfig {
            url,
            org: org.to_string(),
            bucket: bucket.to_string(),
            token,
            batch: 5000,
            poll: Duration::from_millis(500),
            request_timeout: Duration::from_secs(10),
            backoff: Backoff { min: Duration::from_millis(250), max: Duration::from_secs(30) },
        }
    }
}

/// Retry delays: `min`, `2 min`, `4 min`... capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay after `failures` consecutive failed writes (1: the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.saturating_sub(1)).unwrap_or(u32::MAX);
        self.min.saturating_mul(factor).min(self.max).max(self.min)
    }
}

/// An InfluxDB base URL: `http` or `https`, a host, no path (the client
/// replaces any path with `/api/v2/write`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfluxUrl(String);

impl InfluxUrl {
    pub fn parse(text: &str) -> Result<Self, SinkError> {
        let bad = |why: &str| SinkError::BadUrl { url: text.to_string(), why: why.to_string() };
        let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("the scheme must be http or https"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(bad("no host"));
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() {
            return Err(bad("give the server's base URL only (no path or query)"));
        }
        Ok(InfluxUrl(text.trim_end_matches('/').to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for InfluxUrl {
    type Err = SinkError;
    fn from_str(s: &str) -> Result<Self, SinkError> {
        InfluxUrl::parse(s)
    }
}

impl std::fmt::Display for InfluxUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What went wrong in the sink.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("InfluxDB URL {url:?}: {why}")]
    BadUrl { url: String, why: String },
    #[error("the InfluxDB sink needs a store file (an in-memory store cannot be shared)")]
    InMemoryStore,
    #[error("InfluxDB outbox in {path}: {source}")]
    Store { path: PathBuf, source: StoreError },
    #[error("building the InfluxDB client: {0}")]
    Client(String),
    #[error("the InfluxDB outbox task ended: {0}")]
    Task(String),
}

/// What the sink did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SinkStats {
    /// Points the server took (and that left the outbox).
    pub delivered: u64,
    /// Write requests that failed and will be retried.
    pub failed_writes: u64,
    /// Points the server refused for good, parked in the outbox.
    pub parked: u64,
    /// Points waiting in the outbox when last looked at.
    pub waiting: u64,
    /// The last failure, while writes are failing; `None` after a success.
    pub last_error: Option<String>,
}

/// How the server answered a write that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Try again later: the server is down, slow, overloaded, or refuses our
    /// credentials, org or bucket (a setting the user can fix while points wait).
    Retry(String),
    /// The data itself was refused; sending it again cannot help.
    Rejected(String),
}

/// Sorts a failed write by HTTP status (`None`: no answer at all).
pub fn classify(status: Option<u16>, text: &str) -> Failure {
    match status {
        Some(400 | 422) => Failure::Rejected(format!("HTTP {}: {text}", status.unwrap_or_default())),
        Some(s) => Failure::Retry(format!("HTTP {s}: {text}")),
        None => Failure::Retry(text.to_string()),
    }
}

fn failure(e: &RequestError) -> Failure {
    match e {
        RequestError::Http { status, text } => classify(Some(status.as_u16()), text.trim()),
        other => classify(None, &other.to_string()),
    }
}

/// The running sink; see [`Flusher::spawn`].
pub struct Flusher {
    task: JoinHandle<()>,
    drain: watch::Sender<bool>,
    stats: watch::Receiver<SinkStats>,
    store: Arc<Mutex<Store>>,
    path: PathBuf,
}

impl std::fmt::Debug for Flusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flusher").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Flusher {
    /// Opens its own connection to the store at `store_path` and starts
    /// delivering in the background (on the current tokio runtime). Points
    /// left in the outbox by an earlier run go first.
    pub fn spawn(config: SinkConfig, store_path: &Path) -> Result<Flusher, SinkError> {
        if store_path.as_os_str().is_empty() || store_path == Path::new(":memory:") {
            return Err(SinkError::InMemoryStore);
        }
        let path = store_path.to_path_buf();
        let store = Store::open(&path).map_err(|source| SinkError::Store { path: path.clone(), source })?;
        let store = Arc::new(Mutex::new(store));
        let client =
            influxdb2::ClientBuilder::new(config.url.as_str(), &config.org, config.token.clone().unwrap_or_default())
                .build()
                .map_err(|e| SinkError::Client(e.to_string()))?;
        let (drain_tx, drain_rx) = watch::channel(false);
        let (stats_tx, stats_rx) = watch::channel(SinkStats::default());
        tracing::info!(url = %config.url, org = %config.org, bucket = %config.bucket, "InfluxDB sink on");
        let run = Run { config, client, store: store.clone(), path: path.clone(), stats: stats_tx, drain: drain_rx };
        let task = tokio::spawn(run.run());
        Ok(Flusher { task, drain: drain_tx, stats: stats_rx, store, path })
    }

    /// What the sink did so far.
    pub fn stats(&self) -> SinkStats {
        self.stats.borrow().clone()
    }

    /// A receiver of the stats, updated after every write.
    pub fn watch(&self) -> watch::Receiver<SinkStats> {
        self.stats.clone()
    }

    /// Delivers what is waiting, for at most `grace`, then stops. Points not
    /// delivered stay in the store for the next run. Returns the final stats
    /// with `waiting` read from the store.
    pub async fn drain(self, grace: Duration) -> Result<SinkStats, SinkError> {
        // The task may have ended already; then there is nothing to tell it.
        let _ = self.drain.send(true);
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            task.abort();
            let _ = task.await;
        }
        let mut stats = self.stats.borrow().clone();
        let counts = with_store(&self.store, &self.path, |s| s.outbox_counts()).await?;
        stats.waiting = counts.waiting;
        Ok(stats)
    }
}

/// Runs `f` on the store on the blocking pool.
async fn with_store<T: Send + 'static>(
    store: &Arc<Mutex<Store>>,
    path: &Path,
    f: impl FnOnce(&mut Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, SinkError> {
    let store = store.clone();
    let joined = tokio::task::spawn_blocking(move || {
        // A panic while holding the lock leaves the connection itself usable.
        let mut guard = store.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    })
    .await;
    let result = joined.map_err(|e| SinkError::Task(e.to_string()))?;
    result.map_err(|source| SinkError::Store { path: path.to_path_buf(), source })
}

struct Run {
    config: SinkConfig,
    client: influxdb2::Client,
    store: Arc<Mutex<Store>>,
    path: PathBuf,
    stats: watch::Sender<SinkStats>,
    drain: watch::Receiver<bool>,
}

impl Run {
    async fn run(mut self) {
        let mut batch = self.config.batch.max(1);
        let mut failures: u32 = 0;
        loop {
            let draining = *self.drain.borrow();
            let rows = match with_store(&self.store, &self.path, move |s| s.outbox_next(batch)).await {
                Ok(rows) => rows,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    tracing::error!(error = %e, "cannot read the InfluxDB outbox");
                    self.pause(self.config.backoff.delay(failures)).await;
                    continue;
                }
            };
            if rows.is_empty() {
                self.stats.send_modify(|s| s.waiting = 0);
                if draining {
                    return;
                }
                self.pause(self.config.poll).await;
                continue;
            }
            match self.write(&rows).await {
                Ok(()) => {
                    failures = 0;
                    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
                    let n = ids.len() as u64;
                    if let Err(e) = with_store(&self.store, &self.path, move |s| s.outbox_delete(&ids)).await {
                        // Sent again next time; the server overwrites identical points.
                        tracing::error!(error = %e, "delivered points could not be removed from the outbox");
                    }
                    let counts = with_store(&self.store, &self.path, |s| s.outbox_counts()).await.unwrap_or_default();
                    self.stats.send_modify(|s| {
                        s.delivered += n;
                        s.waiting = counts.waiting;
                        s.last_error = None;
                    });
                    tracing::debug!(points = n, waiting = counts.waiting, "points delivered to InfluxDB");
                    batch = self.config.batch.max(1);
                }
                Err(Failure::Rejected(why)) if rows.len() > 1 => {
                    tracing::warn!(points = rows.len(), reason = %why, "InfluxDB refused a batch; splitting it");
                    batch = rows.len() / 2;
                }
                Err(Failure::Rejected(why)) => {
                    let id = rows[0].id;
                    tracing::error!(point = %rows[0].line, reason = %why, "InfluxDB refused a point; parked in the outbox");
                    let reason = why.clone();
                    if let Err(e) = with_store(&self.store, &self.path, move |s| s.outbox_park(id, &reason)).await {
                        tracing::error!(error = %e, "cannot park a refused point");
                    }
                    self.stats.send_modify(|s| s.parked += 1);
                    batch = self.config.batch.max(1);
                }
                Err(Failure::Retry(why)) => {
                    failures = failures.saturating_add(1);
                    let delay = self.config.backoff.delay(failures);
                    let counts = with_store(&self.store, &self.path, |s| s.outbox_counts()).await.unwrap_or_default();
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::warn!(
                            error = %why, failures, waiting = counts.waiting, retry_in = ?delay,
                            "cannot write to InfluxDB; points wait in the store"
                        );
                    }
                    self.stats.send_modify(|s| {
                        s.failed_writes += 1;
                        s.waiting = counts.waiting;
                        s.last_error = Some(why);
                    });
                    self.pause(delay).await;
                }
            }
        }
    }

    /// One write request for `rows`.
    async fn write(&self, rows: &[OutboxRow]) -> Result<(), Failure> {
        let mut body = String::with_capacity(rows.iter().map(|r| r.line.len() + 1).sum());
        for r in rows {
            body.push_str(&r.line);
            body.push('\n');
        }
        let write = self.client.write_line_protocol_with_precision(
            &self.config.org,
            &self.config.bucket,
            body,
            TimestampPrecision::Milliseconds,
        );
        match tokio::time::timeout(self.config.request_timeout, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(failure(&e)),
            Err(_) => Err(Failure::Retry(format!("no answer within {:?}", self.config.request_timeout))),
        }
    }

    /// Waits `delay`, or less once a drain starts (a drain does not wait
    /// for the poll interval; its own grace period bounds the retries).
    async fn pause(&mut self, delay: Duration) {
        if *self.drain.borrow() {
            tokio::time::sleep(delay.min(self.config.poll)).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = self.drain.changed() => {}
        }
    }
}

/// Counts of the outbox of the store at `path` (for a summary line).
pub fn outbox_counts(path: &Path) -> Result<OutboxCounts, SinkError> {
    let store = Store::open(path).map_err(|source| SinkError::Store { path: path.to_path_buf(), source })?;
    store.outbox_counts().map_err(|source| SinkError::Store { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let b = Backoff { min: Duration::from_millis(250), max: Duration::from_secs(2) };
        let delays: Vec<u64> = (1..=6).map(|n| b.delay(n).as_millis() as u64).collect();
        assert_eq!(delays, [250, 500, 1000, 2000, 2000, 2000]);
        assert_eq!(b.delay(0), b.min);
        assert_eq!(b.delay(u32::MAX), b.max);
    }

    #[test]
    fn malformed_data_is_rejected_everything_else_retried() {
        assert!(
            matches!(classify(Some(400), "unable to parse"), Failure::Rejected(m) if m.contains("unable to parse"))
        );
        assert!(matches!(classify(Some(422), "x"), Failure::Rejected(_)));
        for s in [401, 403, 404, 413, 429, 500, 503] {
            assert!(matches!(classify(Some(s), "x"), Failure::Retry(_)), "{s}");
        }
        assert!(matches!(classify(None, "connection refused"), Failure::Retry(m) if m == "connection refused"));
    }

    #[test]
    fn urls_are_checked_before_the_client_sees_them() {
        assert_eq!(InfluxUrl::parse("http://127.0.0.1:8086/").expect("ok").as_str(), "http://127.0.0.1:8086");
        assert!(InfluxUrl::parse("https://influx.example:8086").is_ok());
        for (bad, why) in [
            ("localhost:8086", "scheme"),
            ("ftp://h", "scheme"),
            ("http://", "host"),
            ("http://h:8086/influx", "base URL"),
            ("http://h:8086/?db=x", "base URL"),
            ("not a url", "relative URL"),
        ] {
            let e = InfluxUrl::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
    }

    #[test]
    fn the_token_is_not_printed() {
        let c = SinkConfig::new(InfluxUrl::parse("http://h:1").expect("url"), "o", "b", Some("s3cret".into()));
        assert!(!format!("{c:?}").contains("s3cret"));
    }
}
