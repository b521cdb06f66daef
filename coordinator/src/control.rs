//! The long-running coordinator's control socket (`tunefleet serve`):
//! `submit` and `cancel` from another shell.
//!
//! A Unix socket next to the store (`tunefleet.sock` for `tunefleet.db`),
//! created with mode 0600 in a directory the user owns: whoever can write
//! to it is the user who runs the service, so no other authentication is
//! needed (an MQTT message would need the coordinator's key on the client,
//! and reach every broker user's eyes). One JSON request per connection, one
//! JSON answer. `status` and `agents` need no socket: they read the store,
//! which the service commits every turn (SQLite WAL lets readers in while it
//! writes).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

/// What a client asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    /// Run this study file (its text) on the fleet, beside the others;
    /// resumed if the store has it.
    Submit { study: String, origin: String },
    /// Stop this study: no more trials, running attempts cancelled on their agents.
    Cancel { study: String },
}

/// The service's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    Ok { message: String },
    Error { message: String },
}

/// A request on its way to the engine, with where the answer goes.
#[derive(Debug)]
pub struct Request {
    pub ask: Ask,
    pub reply: oneshot::Sender<Answer>,
}

/// Why the control socket failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control socket {path}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "no service listens on {path}: start one with `tunefleet serve` (with the same --store), or give its --control"
    )]
    NotRunning { path: PathBuf },
    #[error("control socket {path}: {what}")]
    Protocol { path: PathBuf, what: String },
    #[error("control socket {path} is in use by a running service (stop it first, or give another --control)")]
    InUse { path: PathBuf },
}

/// The control socket's default path: the store's, with `.sock`.
pub fn default_path(store: &Path) -> PathBuf {
    store.with_extension("sock")
}

/// Refuses `path` when a service answers on it (checked before a new
/// service starts its broker and opens the store).
pub async fn ensure_free(path: &Path) -> Result<(), ControlError> {
    if path.exists() && UnixStream::connect(path).await.is_ok() {
        return Err(ControlError::InUse { path: path.to_path_buf() });
    }
    Ok(())
}

/// Binds `path` (replacing a stale socket file no service answers on),
/// mode 0600, and forwards each request to `requests`.
pub async fn listen(path: &Path, requests: mpsc::Sender<Request>) -> Result<tokio::task::JoinHandle<()>, ControlError> {
    let io = |source| ControlError::Io { path: path.to_path_buf(), source };
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(ControlError::InUse { path: path.to_path_buf() });
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let requests = requests.clone();
            tokio::spawn(async move {
                if let Err(e) = serve_one(stream, requests).await {
                    tracing::warn!(error = %e, "control connection");
                }
            });
        }
    }))
}

/// Largest request line (a study file).
const MAX_REQUEST: u64 = 1 << 20;

async fn serve_one(stream: UnixStream, requests: mpsc::Sender<Request>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(tokio::io::AsyncReadExt::take(read, MAX_REQUEST)).read_line(&mut line).await?;
    let answer = match serde_json::from_str::<Ask>(&line) {
        Err(e) => Answer::Error { message: format!("not a request: {e}") },
        Ok(ask) => {
            let (reply, answer) = oneshot::channel();
            if requests.send(Request { ask, reply }).await.is_err() {
                Answer::Error { message: "the service is shutting down".into() }
            } else {
                answer.await.unwrap_or(Answer::Error { message: "the service is shutting down".into() })
            }
        }
    };
    let mut text = serde_json::to_string(&answer).unwrap_or_default();
    text.push('\n');
    write.write_all(text.as_bytes()).await
}

/// Sends `ask` to the service listening on `path` and returns its answer.
pub async fn ask(path: &Path, ask: &Ask) -> Result<Answer, ControlError> {
    let io = |source| ControlError::Io { path: path.to_path_buf(), source };
    let stream = UnixStream::connect(path).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ControlError::NotRunning { path: path.to_path_buf() }
        }
        _ => io(e),
    })?;
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_string(ask)
        .map_err(|e| ControlError::Protocol { path: path.to_path_buf(), what: e.to_string() })?;
    text.push('\n');
    write.write_all(text.as_bytes()).await.map_err(io)?;
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await.map_err(io)?;
    serde_json::from_str(&line).map_err(|e| ControlError::Protocol {
        path: path.to_path_buf(),
        what: format!("unreadable answer {line:?}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_reaches_the_engine_and_its_answer_the_client() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t.sock");
        let (tx, mut rx) = mpsc::channel(4);
        let _server = listen(&path, tx).await.expect("listen");
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).expect("socket").permissions());
        assert_eq!(mode & 0o777, 0o600, "only its owner may talk to the service");
        let engine = tokio::spawn(async move {
            let r = rx.recv().await.expect("a request");
            assert_eq!(r.ask, Ask::Cancel { study: "s".into() });
            let _ = r.reply.send(Answer::Ok { message: "cancelled".into() });
        });
        let answer = ask(&path, &Ask::Cancel { study: "s".into() }).await.expect("answer");
        assert_eq!(answer, Answer::Ok { message: "cancelled".into() });
        engine.await.expect("engine");
        // A second service on the same socket is refused; a stale file is replaced.
        let (tx2, _rx2) = mpsc::channel(1);
        assert!(matches!(listen(&path, tx2).await, Err(ControlError::InUse { .. })));
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let (tx3, _rx3) = mpsc::channel(1);
        assert!(listen(&stale, tx3).await.is_ok(), "nobody answers on a stale socket");
        let nobody = dir.path().join("nobody.sock");
        let e = ask(&nobody, &Ask::Cancel { study: "s".into() }).await.expect_err("no service");
        assert!(matches!(e, ControlError::NotRunning { .. }), "{e}");
        assert!(e.to_string().contains("tunefleet serve"), "{e}");
    }

    #[tokio::test]
    async fn garbage_gets_an_error_answer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("g.sock");
        let (tx, _rx) = mpsc::channel(1);
        let _server = listen(&path, tx).await.expect("listen");
        let mut s = UnixStream::connect(&path).await.expect("connect");
        s.write_all(b"{\"launch\": 1}\n").await.expect("write");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).await.expect("read");
        assert!(line.contains("not a request"), "{line}");
    }
}
