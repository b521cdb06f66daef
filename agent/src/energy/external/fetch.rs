//! How an external meter is read, once, within a time bound: a command run
//! by `sh -c` (the `sh` on the `PATH`: `/bin/sh`, or Android's
//! `/system/bin/sh`; its standard output is the value), or an HTTP GET of a
//! plain `http://` URL (the response body is the value).
//!
//! The command runs in a process group of its own: when it outlives the
//! bound the whole group is killed (a `sh -c 'curl ...'` leaves no `curl`
//! behind holding the pipe), and the reading fails with the reason. A
//! non-zero exit fails it too, with the first line of standard error.
//!
//! The HTTP GET is a dozen lines of HTTP/1.0 over [`std::net::TcpStream`]:
//! the agent has no HTTP client in its dependency tree (only the
//! coordinator's InfluxDB sink pulls `reqwest`, with tokio and TLS), a
//! meter on a lab network speaks plain HTTP, and one request with
//! `Connection: close` and a body read to the end needs nothing more.
//! HTTP/1.0 also keeps servers from answering with chunked encoding.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::value::MAX_OUTPUT;

/// Why one reading of a meter failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("cannot start the command: {0}")]
    Spawn(String),
    #[error("no answer within {} ms (the command was killed)", .0.as_millis())]
    CommandTimeout(Duration),
    #[error("the command exited with {status}{}", stderr_note(.stderr))]
    CommandFailed { status: String, stderr: String },
    #[error("no answer within {} ms", .0.as_millis())]
    HttpTimeout(Duration),
    #[error("cannot reach {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("HTTP exchange failed: {0}")]
    Io(String),
    #[error("HTTP status {0}")]
    Status(String),
    #[error("not an HTTP response")]
    NotHttp,
    #[error("chunked transfer encoding is not supported (the request is HTTP/1.0)")]
    Chunked,
    #[error("more than {MAX_OUTPUT} bytes of output")]
    TooLong,
}

fn stderr_note(stderr: &str) -> String {
    match stderr.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) => format!(": {}", line.chars().take(200).collect::<String>()),
        None => String::new(),
    }
}

/// A plain `http://HOST[:PORT]/PATH` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    /// The path and query, starting with `/`.
    pub path: String,
}

impl std::fmt::Display for HttpUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}:{}{}", self.host, self.port, self.path)
    }
}

impl std::str::FromStr for HttpUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let rest = text.strip_prefix("http://").ok_or_else(|| {
            format!("{text:?}: only plain http:// URLs are supported (for https, use --energy-command with curl)")
        })?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err(format!("{text:?}: credentials in the URL are not supported"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
                let port = p.parse::<u16>().map_err(|_| format!("{text:?}: bad port {p:?}"))?;
                (h, port)
            }
            _ => (authority, 80),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{text:?}: no host"));
        }
        if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{text:?}: the path has blanks (encode them as %20)"));
        }
        Ok(HttpUrl { host: host.to_string(), port, path })
    }
}

/// Runs `command` with `sh -c` and returns its standard output, or
/// why not, within `timeout`.
pub fn run_command(command: &str, timeout: Duration) -> Result<String, FetchError> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| FetchError::Spawn(e.to_string()))?;
    let pid = child.id();
    let deadline = Instant::now() + timeout;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let (tx, rx) = mpsc::channel();
    // Reads until both pipes close (the whole group exited or was killed),
    // a bounded amount: output past the limit is not read, and the command
    // is killed at once.
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut err = Vec::new();
        if let Some(s) = stdout {
            let _ = s.take(MAX_OUTPUT as u64 + 1).read_to_end(&mut out);
        }
        if out.len() <= MAX_OUTPUT {
            if let Some(s) = stderr {
                let _ = s.take(1024).read_to_end(&mut err);
            }
        }
        let _ = tx.send((out, err));
    });
    let outcome = rx.recv_timeout(timeout);
    let too_long = outcome.as_ref().is_ok_and(|(out, _)| out.len() > MAX_OUTPUT);
    if outcome.is_err() || too_long {
        kill_group(pid);
    }
    let status = wait_until(&mut child, pid, deadline);
    let (out, err) = outcome.map_err(|_| FetchError::CommandTimeout(timeout))?;
    if too_long {
        return Err(FetchError::TooLong);
    }
    match status {
        Ok(s) if s.success() => Ok(String::from_utf8_lossy(&out).into_owned()),
        Ok(s) => Err(FetchError::CommandFailed {
            status: match (s.code(), s.signal()) {
                (Some(code), _) => format!("status {code}"),
                (None, Some(signal)) => format!("signal {signal}"),
                (None, None) => s.to_string(),
            },
            stderr: String::from_utf8_lossy(&err).into_owned(),
        }),
        Err(e) => Err(FetchError::CommandFailed { status: e.to_string(), stderr: String::new() }),
    }
}

/// Reaps the shell; one that closed its output but lives on past the
/// deadline is killed with its group.
fn wait_until(child: &mut std::process::Child, pid: u32, deadline: Instant) -> std::io::Result<ExitStatus> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            kill_group(pid);
            return child.wait();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn kill_group(pid: u32) {
    let pgid = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw);
    if let Some(pgid) = pgid {
        // The group may be gone already: nothing to do then.
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

/// GETs `url` and returns the body of a 2xx answer, within `timeout`
/// (name resolution aside: it has no bound of its own, see [`super`]).
pub fn http_get(url: &HttpUrl, timeout: Duration) -> Result<String, FetchError> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
    let addrs: Vec<_> = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .map_err(|e| FetchError::Connect { addr: url.host.clone(), reason: e.to_string() })?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        let Some(remaining) = left() else { return Err(FetchError::HttpTimeout(timeout)) };
        match TcpStream::connect_timeout(&addr, remaining) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(FetchError::Connect { addr: addr.to_string(), reason: e.to_string() }),
        }
    }
    let mut stream = stream.ok_or_else(|| {
        last.unwrap_or_else(|| FetchError::Connect { addr: url.host.clone(), reason: "no address".into() })
    })?;
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => FetchError::HttpTimeout(timeout),
        _ => FetchError::Io(e.to_string()),
    };
    let host = if url.host.contains(':') { format!("[{}]", url.host) } else { url.host.clone() };
    let request = format!(
        "GET {} HTTP/1.0\r\nHost: {host}:{}\r\nUser-Agent: tunefleet-agent\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        url.path, url.port
    );
    stream.set_write_timeout(left()).map_err(io)?;
    stream.write_all(request.as_bytes()).map_err(io)?;
    // Headers are small; the body is at most MAX_OUTPUT.
    let limit = MAX_OUTPUT + 8192;
    let mut response = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        let Some(remaining) = left() else { return Err(FetchError::HttpTimeout(timeout)) };
        stream.set_read_timeout(Some(remaining)).map_err(io)?;
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        }
        if response.len() > limit {
            return Err(FetchError::TooLong);
        }
    }
    body_of(&response)
}

/// The body of a complete HTTP/1.x response, if its status is 2xx.
pub fn body_of(response: &[u8]) -> Result<String, FetchError> {
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").map(|i| (i, i + 4));
    let split = split.or_else(|| response.windows(2).position(|w| w == b"\n\n").map(|i| (i, i + 2)));
    let (head_end, body_start) = split.ok_or(FetchError::NotHttp)?;
    let head = String::from_utf8_lossy(&response[..head_end]);
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(FetchError::NotHttp);
    }
    let code = parts.next().unwrap_or_default();
    if !(code.len() == 3 && code.starts_with('2')) {
        return Err(FetchError::Status(status_line.split_once(' ').map_or("", |(_, s)| s).trim().to_string()));
    }
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
        })
    });
    if chunked {
        return Err(FetchError::Chunked);
    }
    let body = &response[body_start..];
    if body.len() > MAX_OUTPUT {
        return Err(FetchError::TooLong);
    }
    Ok(String::from_utf8_lossy(body).into_owned())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::TcpListener;

    const SHORT: Duration = Duration::from_millis(300);

    #[test]
    fn urls() {
        let u: HttpUrl = "http://pdu-3.lab:8080/outlet/7?fmt=w".parse().expect("valid");
        assert_eq!((u.host.as_str(), u.port, u.path.as_str()), ("pdu-3.lab", 8080, "/outlet/7?fmt=w"));
        let u: HttpUrl = "http://10.0.0.5".parse().expect("valid");
        assert_eq!((u.port, u.path.as_str()), (80, "/"));
        let u: HttpUrl = "http://[::1]:9000/p".parse().expect("valid");
        assert_eq!((u.host.as_str(), u.port), ("::1", 9000));
        let u: HttpUrl = "http://h?x=1".parse().expect("valid");
        assert_eq!(u.path, "/?x=1");
        for bad in ["https://h/x", "h/x", "http://", "http://h:99999/", "http://u:p@h/", "http://h/a b"] {
            assert!(bad.parse::<HttpUrl>().is_err(), "{bad}");
        }
    }

    #[test]
    fn response_bodies() {
        assert_eq!(body_of(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n12.5 W\n"), Ok("12.5 W\n".into()));
        assert_eq!(body_of(b"HTTP/1.0 204 No Content\r\n\r\n"), Ok(String::new()));
        assert_eq!(body_of(b"HTTP/1.1 404 Not Found\r\n\r\nnope"), Err(FetchError::Status("404 Not Found".into())));
        assert_eq!(
            body_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n12.5\r\n0\r\n\r\n"),
            Err(FetchError::Chunked)
        );
        assert_eq!(body_of(b"SSH-2.0-OpenSSH\r\n"), Err(FetchError::NotHttp));
        assert_eq!(body_of(b"12.5 W\n\n"), Err(FetchError::NotHttp));
    }

    /// A server on a port the OS chose (the test owns the listener): answers
    /// each request with `respond(request line)`, until a GET of `/stop`;
    /// returns the request heads it saw.
    pub(crate) fn serve(respond: fn(&str) -> &'static [u8]) -> (HttpUrl, std::thread::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = std::thread::spawn(move || {
            let mut seen = Vec::new();
            for conn in listener.incoming() {
                let mut conn = conn.expect("accept");
                let mut request = Vec::new();
                let mut buf = [0u8; 512];
                while !request.ends_with(b"\r\n\r\n") {
                    let n = conn.read(&mut buf).expect("read");
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                let request = String::from_utf8_lossy(&request).into_owned();
                if request.starts_with("GET /stop ") {
                    break;
                }
                conn.write_all(respond(request.lines().next().unwrap_or_default())).expect("write");
                seen.push(request);
            }
            seen
        });
        (HttpUrl { host: "127.0.0.1".into(), port, path: "/power?outlet=3".into() }, server)
    }

    /// Ends a [`serve`] server and returns what it saw.
    pub(crate) fn stop(url: &HttpUrl, server: std::thread::JoinHandle<Vec<String>>) -> Vec<String> {
        let stop = HttpUrl { path: "/stop".into(), ..url.clone() };
        // The server closes without answering.
        let _ = http_get(&stop, Duration::from_secs(5));
        server.join().expect("server")
    }

    #[test]
    fn http_get_from_a_local_server() {
        let (url, server) = serve(|_| b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"watts\": 42.5}");
        assert_eq!(http_get(&url, Duration::from_secs(5)), Ok("{\"watts\": 42.5}".into()));
        let requests = stop(&url, server);
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert!(request.starts_with("GET /power?outlet=3 HTTP/1.0\r\n"), "{request}");
        assert!(request.contains(&format!("Host: 127.0.0.1:{}\r\n", url.port)), "{request}");
    }

    #[test]
    fn http_errors_are_reasons() {
        let (url, server) = serve(|_| b"HTTP/1.1 503 Service Unavailable\r\n\r\nbusy");
        assert_eq!(http_get(&url, Duration::from_secs(5)), Err(FetchError::Status("503 Service Unavailable".into())));
        stop(&url, server);
        // A listener that never answers: the bound holds.
        let silent = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url =
            HttpUrl { host: "127.0.0.1".into(), port: silent.local_addr().expect("addr").port(), path: "/".into() };
        let started = Instant::now();
        assert_eq!(http_get(&url, SHORT), Err(FetchError::HttpTimeout(SHORT)));
        assert!(started.elapsed() < SHORT * 5, "{:?}", started.elapsed());
    }

    #[test]
    fn commands() {
        assert_eq!(run_command("echo 5 W", SHORT * 10), Ok("5 W\n".into()));
        match run_command("echo broken >&2; exit 3", SHORT * 10) {
            Err(FetchError::CommandFailed { status, stderr }) => {
                assert_eq!(status, "status 3");
                assert_eq!(stderr.trim(), "broken");
            }
            other => panic!("{other:?}"),
        }
        let e = run_command("exit 1", SHORT * 10).expect_err("fails");
        assert_eq!(e.to_string(), "the command exited with status 1");
        let e = run_command("echo no route to pdu-3 >&2; kill -9 $$", SHORT * 10).expect_err("fails");
        assert_eq!(e.to_string(), "the command exited with signal 9: no route to pdu-3");
    }

    #[test]
    fn a_hanging_command_is_killed_with_its_children() {
        let started = Instant::now();
        // The shell waits for a child: killing the shell alone would leave
        // `sleep` holding the pipe for 30 s.
        assert_eq!(run_command("sleep 30; echo 1", SHORT), Err(FetchError::CommandTimeout(SHORT)));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(run_command("yes", SHORT * 10), Err(FetchError::TooLong));
    }
}
