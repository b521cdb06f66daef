//! `tunefleet serve`'s live page over HTTP, read only: `/` the fleet and
//! its studies ([`crate::report::live`]), `/main` the part that updates,
//! `/status.json` the same figures as JSON, `/report/STUDY` a study's
//! report, `/study/STUDY` its views ([`crate::report::views`]) and
//! `/study/STUDY/trial/N` one trial's detail. On loopback by default; beyond it only with a token
//! (`--page-token-file`), given once as `?token=` (then kept in an
//! `HttpOnly` cookie, never in a link) or as `Authorization: Bearer`, and
//! compared in constant time. `/metrics` is the embedded broker's counters
//! as Prometheus text.
//! Requests are small and bounded (8 KiB, 5 s); each reads the store read
//! only, as `tunefleet status` does, never the engine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::error::{CliError, Result};
use super::http::{bearer, header};
use crate::report::live::{main_html, page_html, LiveData};
use crate::store::Store;

/// Where the page listens unless `--page` says otherwise.
pub const DEFAULT_PAGE: &str = "127.0.0.1:8765";
/// The most a request's head may take.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The page's settings from `serve`'s flags.
#[derive(Debug, Clone)]
pub struct PageConfig {
    /// `None`: no page (`--page off`).
    pub addr: Option<String>,
    /// Whether `addr` was given (a default that is taken is skipped, not an error).
    pub explicit: bool,
    pub token_file: Option<PathBuf>,
    /// The service's control socket: the API's writes go to it, and its
    /// address and token are written beside it (`api.json`).
    pub control: PathBuf,
}

/// Starts the page for `store`; prints `page: URL` once it listens.
pub async fn start(config: &PageConfig, store: &Path) -> Result<Option<tokio::task::JoinHandle<()>>> {
    let Some(addr) = config.addr.as_deref() else { return Ok(None) };
    let addr: SocketAddr =
        addr.parse().map_err(|_| CliError::refused(format!("--page {addr}: not an address (HOST:PORT, or off)")))?;
    let token = match &config.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(CliError::file("reading", path))?;
            let token = text.trim().to_string();
            if token.len() < 16 {
                return Err(CliError::refused(format!("{}: a page token of at least 16 characters", path.display())));
            }
            Some(token)
        }
        None if !addr.ip().is_loopback() => {
            return Err(CliError::refused(format!(
                "--page {addr} listens beyond loopback: give --page-token-file FILE (the page shows the fleet)"
            )))
        }
        None => None,
    };
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) if !config.explicit => {
            tracing::warn!(%addr, error = %e, "no live page: its default address is taken (give --page ADDR)");
            return Ok(None);
        }
        Err(e) => return Err(CliError::refused(format!("--page {addr}: {e}"))),
    };
    let local = listener.local_addr().map_err(|e| CliError::refused(format!("--page {addr}: {e}")))?;
    let url = format!("http://{local}/");
    let write_token: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    let access = super::api::write_access(&config.control, &url, &write_token).map_err(|e| {
        CliError::refused(format!("writing the API's access file beside {}: {e}", config.control.display()))
    })?;
    // Scripts and tests read these lines.
    println!("page: {url}");
    println!("api: {url}api/v1/ (token in {})", access.display());
    let api = std::sync::Arc::new(super::api::ApiContext {
        store: store.to_path_buf(),
        control: config.control.clone(),
        write_token,
        page_token: token.clone(),
    });
    let store = store.to_path_buf();
    Ok(Some(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (store, token, api) = (store.clone(), token.clone(), api.clone());
            tokio::spawn(async move {
                if let Err(e) = answer(stream, &store, token.as_deref(), &api).await {
                    tracing::debug!(error = %e, "live page request");
                }
            });
        }
    })))
}

/// The body's length a request's head declares (0 without one).
fn content_length(head: &str) -> Option<usize> {
    match header(head, "content-length") {
        None => Some(0),
        Some(v) => v.parse().ok(),
    }
}

/// Reads one request (its head, and the body an API write declares) and answers it.
async fn answer(
    mut stream: TcpStream,
    store: &Path,
    token: Option<&str>,
    api: &super::api::ApiContext,
) -> std::io::Result<()> {
    let mut data = Vec::with_capacity(1024);
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        let mut buf = [0u8; 4096];
        let end = loop {
            if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            if data.len() >= MAX_REQUEST {
                return Ok(Err(413));
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break data.len();
            }
            data.extend_from_slice(&buf[..n]);
        };
        let head = String::from_utf8_lossy(&data[..end]).into_owned();
        let Some(length) = content_length(&head) else { return Ok(Err(400)) };
        if length > super::api::MAX_BODY {
            return Ok(Err(413));
        }
        while data.len() < end + length {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            data.extend_from_slice(&buf[..n]);
        }
        data.truncate(end + length);
        Ok::<_, std::io::Error>(Ok((head, end)))
    })
    .await;
    let (status, kind, body, cookie) = match read {
        Ok(Ok(Ok((head, end)))) => route(&head, &data[end..], store, token, api).await,
        Ok(Ok(Err(413))) => (413, "text/plain", "the request is too large\n".to_string(), None),
        Ok(Ok(Err(_))) => (400, "text/plain", "a bad Content-Length\n".to_string(), None),
        _ => (408, "text/plain", "request timed out\n".to_string(), None),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    // A token given once as `?token=` is kept in a cookie the page's
    // scripts cannot read, so links never carry it.
    let cookie =
        cookie.map(|t| format!("Set-Cookie: {COOKIE}={t}; HttpOnly; SameSite=Strict; Path=/\r\n")).unwrap_or_default();
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}; charset=utf-8\r\nContent-Length: {}\r\n\
         {cookie}Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Whether the request's `Host` is a loopback name (no `Host`: an HTTP/1.0 client on this machine).
fn loopback_host(head: &str) -> bool {
    let Some(host) = header(head, "host") else { return true };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The cookie that carries the page's token after a first `?token=`.
const COOKIE: &str = "tunefleet_page";

/// The token a request carries: `?token=`, `Authorization: Bearer`, or the page's cookie.
fn given_token<'a>(head: &'a str, query: &'a str) -> (Option<&'a str>, bool) {
    if let Some(t) = query.split('&').find_map(|kv| kv.strip_prefix("token=")) {
        return (Some(t), true);
    }
    if let Some(t) = bearer(head) {
        return (Some(t), false);
    }
    let cookie = header(head, "cookie").and_then(|v| {
        v.split(';').find_map(|kv| kv.trim().strip_prefix(COOKIE).and_then(|rest| rest.strip_prefix('=')))
    });
    (cookie, false)
}

/// The answer to a request's head: status, content type, body, and the
/// token to keep in a cookie.
async fn route(
    head: &str,
    body: &[u8],
    store: &Path,
    token: Option<&str>,
    api: &super::api::ApiContext,
) -> (u16, &'static str, String, Option<String>) {
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if path.starts_with("/api/") && method == "POST" {
        // Writes check their own token, in a header only.
        let (status, json) = super::api::route(method, path, head, body, api).await;
        return (status, "application/json", json, None);
    }
    if method != "GET" {
        return (405, "text/plain", "read only: GET (the API's writes: POST /api/v1/...)\n".to_string(), None);
    }
    if token.is_none() && !loopback_host(head) {
        // Open on loopback only to loopback names: a page elsewhere that
        // points its own name at 127.0.0.1 (DNS rebinding) reads nothing.
        return (
            401,
            "text/plain",
            "open on loopback only to a loopback Host (127.0.0.1, localhost, [::1])\n".into(),
            None,
        );
    }
    let (given, in_query) = given_token(head, query);
    let cookie = match token {
        Some(t) if !given.is_some_and(|g| tunefleet_broker::same_secret(g.as_bytes(), t.as_bytes())) => {
            return (401, "text/plain", "a token is needed (?token= once, then a cookie)\n".into(), None);
        }
        Some(t) if in_query => Some(t.to_string()),
        _ => None,
    };
    if path == "/metrics" {
        return (200, "text/plain", super::metrics::prometheus(), cookie);
    }
    if path.starts_with("/api/") {
        let (status, json) = super::api::route(method, path, head, body, api).await;
        return (status, "application/json", json, cookie);
    }
    let path = path.to_string();
    let store = store.to_path_buf();
    let answered = tokio::task::spawn_blocking(move || read(&store, &path)).await;
    let (status, kind, body) = answered.unwrap_or_else(|_| (500, "text/plain", "the page failed\n".to_string()));
    (status, kind, body, cookie)
}

/// What `path` shows, read from the store now.
fn read(store: &Path, path: &str) -> (u16, &'static str, String) {
    let failed = |e: &dyn std::fmt::Display| (500, "text/plain", format!("cannot read the store: {e}\n"));
    let db = match Store::open_read_only(store) {
        Ok(db) => db,
        Err(e) => return failed(&e),
    };
    if let Some(study) = path.strip_prefix("/report/") {
        return match crate::report::load(&db, study, crate::report::Options::default()) {
            Ok(data) => (200, "text/html", crate::report::render(&data)),
            Err(e) => (404, "text/plain", format!("{e}\n")),
        };
    }
    let at_ms = super::output::unix_now_ms();
    if let Some(rest) = path.strip_prefix("/study/") {
        return study(&db, rest, at_ms);
    }
    let data = match crate::query::status::snapshot(&db, None, at_ms).and_then(|studies| {
        let agents = db.agents()?;
        let refusals = db.refusals()?;
        let histories = histories(&db, &studies)?;
        Ok(LiveData { studies, agents, refusals, at_ms, histories })
    }) {
        Ok(d) => d,
        Err(e) => return failed(&e),
    };
    match path {
        // Links carry no token: the cookie does.
        "/" => (200, "text/html", page_html(&data, "")),
        "/main" => (200, "text/html", main_html(&data, "")),
        "/status.json" => match serde_json::to_string_pretty(&data) {
            Ok(json) => (200, "application/json", json),
            Err(e) => failed(&e),
        },
        _ => (404, "text/plain", "not found\n".to_string()),
    }
}

/// A study's pages: `NAME` its views, `NAME/main` the part that updates,
/// `NAME/trial/N` one trial's detail.
fn study(db: &Store, rest: &str, at_ms: u64) -> (u16, &'static str, String) {
    let not_found = || (404, "text/plain", "not found\n".to_string());
    let (name, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if !crate::domain::study::valid_study_name(name) {
        return not_found();
    }
    let mut view = match crate::report::views::load(db, name, at_ms) {
        Ok(Some(v)) => v,
        Ok(None) => return (404, "text/plain", format!("no study {name:?}\n")),
        Err(e) => return (500, "text/plain", format!("cannot read the store: {e}\n")),
    };
    match tail.strip_prefix("trial/").map(str::parse::<u64>) {
        _ if tail.is_empty() => (200, "text/html", crate::report::views::page_html(&view, "")),
        _ if tail == "main" => (200, "text/html", crate::report::views::main_html(&view, "")),
        Some(Ok(trial)) => {
            let attempts = match view.measure(db, trial).and_then(|()| db.attempts(name, trial)) {
                Ok(a) => a,
                Err(e) => return (500, "text/plain", format!("cannot read the store: {e}\n")),
            };
            match crate::report::views::trial_page(&view, trial, &attempts, "") {
                Some(page) => (200, "text/html", page),
                None => not_found(),
            }
        }
        _ => not_found(),
    }
}

/// The trials whose learning curves the page draws, the last ones.
const CURVES: u64 = 50;

/// Each study's objective by trial, for the page's history charts.
fn histories(
    db: &Store,
    studies: &[crate::query::status::StudyStatus],
) -> Result<Vec<crate::report::live::History>, crate::store::StoreError> {
    let mut out = Vec::with_capacity(studies.len());
    for s in studies {
        let Some(row) = db.study(&s.study)? else { continue };
        out.push(crate::report::live::History {
            study: s.study.clone(),
            metric: s.metric.clone(),
            direction: row.direction,
            points: db.objective_points(&s.study)?,
            curves: db.learning_curves(&s.study, &s.metric, CURVES)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_open_the_page_without_a_token() {
        let head = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        for ok in ["127.0.0.1:8765", "localhost:8765", "LOCALHOST", "[::1]:8765", "127.3.2.1"] {
            assert!(loopback_host(&head(ok)), "{ok}");
        }
        for refused in
            ["evil.example:8765", "evil.example", "10.0.0.1:8765", "[2001:db8::1]:80", "127.0.0.1.evil.example"]
        {
            assert!(!loopback_host(&head(refused)), "{refused}");
        }
        assert!(loopback_host("GET / HTTP/1.0\r\n\r\n"), "no Host: a client on this machine");
    }
}
