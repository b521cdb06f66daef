//! The long-running coordinator's control socket (`tunefleet serve`):
//! `submit` and `cancel` from another shell.
//!
//! A Unix socket in a directory next to the store
//! (`tunefleet.control/control.sock` for `tunefleet.db`), created with mode
//! 0600 in a directory only the user can open: the service creates it with
//! mode 0700, or checks the one it is given (this user's, a directory and
//! not a link, mode 0700 or narrower) and refuses to start otherwise, so no
//! other local user can pre-create the path, swap the socket or reach it
//! before its mode is set. Whoever can write to it is the user who runs the
//! service, so no other authentication is needed (an MQTT message would need the coordinator's key on the client,
//! and reach every broker user's eyes). One JSON request per connection, one
//! JSON answer. `status` and `agents` need no socket: they read the store,
//! which the service commits every turn (SQLite WAL lets readers in while it
//! writes).

use std::path::{Path, PathBuf};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

pub use crate::runtime::engine::types::{Answer, Ask};

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
    #[error(
        "control socket directory {dir} {why}: remove it and let the service create it, or give --control a path in \
         a directory only you can open (mode 0700)"
    )]
    UnsafeDir { dir: PathBuf, why: String },
}

/// The control socket's default path: `control.sock` in a directory beside
/// the store, named after it with `.control` (`fleet.control/control.sock`
/// for `fleet.db`).
pub fn default_path(store: &Path) -> PathBuf {
    store.with_extension("control").join("control.sock")
}

/// What is known of the socket's directory, for [`refusal`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirFacts {
    pub symlink: bool,
    pub dir: bool,
    pub owner: u32,
    pub mode: u32,
}

/// Why a directory may not hold the control socket of user `me`, if it may not.
pub fn refusal(facts: DirFacts, me: u32) -> Option<String> {
    if facts.symlink {
        Some("is a symbolic link".into())
    } else if !facts.dir {
        Some("is not a directory".into())
    } else if facts.owner != me {
        Some(format!("belongs to user {}, not to this one ({me})", facts.owner))
    } else if facts.mode & 0o077 != 0 {
        Some(format!("has mode {:04o}: other users may open it", facts.mode & 0o7777))
    } else {
        None
    }
}

/// Creates the directory of the socket `path` with mode 0700, or checks
/// the one there (see [`refusal`]).
fn private_dir(path: &Path) -> Result<(), ControlError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let io = |source| ControlError::Io { path: dir.to_path_buf(), source };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(io(e)),
        _ => {}
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io)?;
    let facts =
        DirFacts { symlink: meta.file_type().is_symlink(), dir: meta.is_dir(), owner: meta.uid(), mode: meta.mode() };
    match refusal(facts, rustix::process::geteuid().as_raw()) {
        Some(why) => Err(ControlError::UnsafeDir { dir: dir.to_path_buf(), why }),
        None => Ok(()),
    }
}

/// Refuses `path` when a service answers on it, or when its directory is
/// not private (checked before a new service starts its broker and opens
/// the store).
pub async fn ensure_free(path: &Path) -> Result<(), ControlError> {
    private_dir(path)?;
    if path.exists() && UnixStream::connect(path).await.is_ok() {
        return Err(ControlError::InUse { path: path.to_path_buf() });
    }
    Ok(())
}

/// Binds `path` (replacing a stale socket file no service answers on),
/// mode 0600, in a directory only this user can open (created, or checked:
/// [`refusal`]), and forwards each request to `requests`.
pub async fn listen(path: &Path, requests: mpsc::Sender<Request>) -> Result<tokio::task::JoinHandle<()>, ControlError> {
    private_dir(path)?;
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

/// How often the active coordinator looks for requests in a server's
/// store, and a command for its answer.
const RELAYED_EVERY: std::time::Duration = std::time::Duration::from_millis(250);
/// How long a command waits for the active coordinator's answer.
const RELAYED_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// On a server's store: the requests written there (by `submit` and
/// `cancel` on a machine where no service listens) taken to the engine as
/// the socket's are, and answered there, until aborted.
pub fn relay(store: &Path, requests: mpsc::Sender<Request>) -> tokio::task::JoinHandle<()> {
    let store = store.to_path_buf();
    tokio::spawn(async move {
        let mut table = None;
        loop {
            tokio::time::sleep(RELAYED_EVERY).await;
            if table.is_none() {
                table = crate::store::Requests::connect(&store)
                    .map_err(|e| tracing::warn!(error = %e, "requests through the store: not read now"))
                    .ok();
            }
            let pending = match table.as_ref().map(|t| t.unanswered(16)) {
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "requests through the store: not read now");
                    table = None;
                    continue;
                }
                None => continue,
            };
            for (id, text) in pending {
                let answer = match serde_json::from_str::<Ask>(&text) {
                    Ok(ask) => relayed(ask, &requests).await,
                    Err(e) => Answer::Error { message: format!("an unreadable request: {e}") },
                };
                let json = serde_json::to_string(&answer).unwrap_or_default();
                if let Some(Err(e)) = table.as_ref().map(|t| t.answer(id, &json)) {
                    tracing::warn!(error = %e, request = id, "a request through the store was not answered");
                }
            }
        }
    })
}

async fn relayed(ask: Ask, requests: &mpsc::Sender<Request>) -> Answer {
    let (reply, answer) = oneshot::channel();
    if requests.send(Request { ask, reply }).await.is_err() {
        return Answer::Error { message: "the service is stopping".into() };
    }
    answer.await.unwrap_or(Answer::Error { message: "the service stopped before it answered".into() })
}

/// `ask` to the service on `control`; where none answers there and the
/// store is a server's (PostgreSQL), through the store to whichever
/// coordinator is active ([`ask_through_store`]). What `submit`, `cancel`
/// and `enqueue` and the page's API send.
pub async fn ask_active(control: &Path, store: &Path, ask: &Ask) -> Result<Answer, ControlError> {
    match self::ask(control, ask).await {
        Err(ControlError::NotRunning { .. }) if crate::store::is_remote(store) => ask_through_store(store, ask).await,
        r => r,
    }
}

/// `ask` of the active coordinator of the server's `store`, through the
/// store: written there, its answer read back (within a minute).
pub async fn ask_through_store(store: &Path, ask: &Ask) -> Result<Answer, ControlError> {
    let failed = |what: String| ControlError::Protocol { path: store.to_path_buf(), what };
    let text = serde_json::to_string(ask).map_err(|e| failed(e.to_string()))?;
    let table = crate::store::Requests::connect(store).map_err(|e| failed(e.to_string()))?;
    let id = table.send(&text).map_err(|e| failed(e.to_string()))?;
    let deadline = tokio::time::Instant::now() + RELAYED_WAIT;
    loop {
        if let Some(answer) = table.answer_of(id).map_err(|e| failed(e.to_string()))? {
            return serde_json::from_str(&answer).map_err(|e| failed(format!("unreadable answer {answer:?}: {e}")));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(failed(format!(
                "no coordinator answered request {id} within {} s: is one active on this store?",
                RELAYED_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(RELAYED_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_reaches_the_engine_and_its_answer_the_client() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("private");
        let path = dir.join("t.sock");
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
        let stale = dir.join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let (tx3, _rx3) = mpsc::channel(1);
        assert!(listen(&stale, tx3).await.is_ok(), "nobody answers on a stale socket");
        let nobody = dir.join("nobody.sock");
        let e = ask(&nobody, &Ask::Cancel { study: "s".into() }).await.expect_err("no service");
        assert!(matches!(e, ControlError::NotRunning { .. }), "{e}");
        assert!(e.to_string().contains("tunefleet serve"), "{e}");
    }

    #[test]
    fn only_a_private_directory_of_this_user_may_hold_the_socket() {
        let ok = DirFacts { symlink: false, dir: true, owner: 1000, mode: 0o040700 };
        assert_eq!(refusal(ok, 1000), None);
        assert_eq!(refusal(DirFacts { mode: 0o040500, ..ok }, 1000), None, "narrower is fine");
        assert!(refusal(DirFacts { mode: 0o041777, ..ok }, 1000).is_some_and(|w| w.contains("1777")));
        assert!(refusal(DirFacts { mode: 0o040750, ..ok }, 1000).is_some(), "its group may not enter");
        assert!(refusal(DirFacts { mode: 0o040701, ..ok }, 1000).is_some());
        assert!(refusal(ok, 1001).is_some_and(|w| w.contains("belongs to user 1000")));
        assert!(refusal(DirFacts { symlink: true, dir: false, ..ok }, 1000).is_some());
        assert!(refusal(DirFacts { dir: false, ..ok }, 1000).is_some());
    }

    #[tokio::test]
    async fn regression_a_precreated_open_directory_is_refused_and_a_missing_one_created_0700() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        // Another local user made the directory first, open to all.
        let hostile = dir.path().join("fleet.control");
        std::fs::create_dir(&hostile).expect("mkdir");
        std::fs::set_permissions(&hostile, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let path = hostile.join("control.sock");
        let (tx, _rx) = mpsc::channel(1);
        let e = listen(&path, tx).await.expect_err("an open directory is refused");
        assert!(matches!(e, ControlError::UnsafeDir { .. }), "{e}");
        assert!(e.to_string().contains("0777") && e.to_string().contains("--control"), "{e}");
        assert!(!path.exists(), "nothing bound there");
        // A link to a private directory is refused too.
        let private = dir.path().join("private");
        std::fs::create_dir(&private).expect("mkdir");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let link = dir.path().join("link.control");
        std::os::unix::fs::symlink(&private, &link).expect("symlink");
        let (tx, _rx) = mpsc::channel(1);
        let e = listen(&link.join("control.sock"), tx).await.expect_err("a link is refused");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // Owned by someone else (only root can make one here).
        if rustix::process::geteuid().is_root() {
            let theirs = dir.path().join("theirs.control");
            std::fs::create_dir(&theirs).expect("mkdir");
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).expect("chmod");
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
            let (tx, _rx) = mpsc::channel(1);
            let e = listen(&theirs.join("control.sock"), tx).await.expect_err("another user's directory is refused");
            assert!(e.to_string().contains("belongs to user 65534"), "{e}");
        }
        // The default: the service creates the directory, 0700.
        let path = default_path(&dir.path().join("fleet.db"));
        assert_eq!(path, dir.path().join("fleet.control").join("control.sock"));
        std::fs::remove_dir(&hostile).expect("rmdir");
        let (tx, _rx) = mpsc::channel(1);
        let _server = listen(&path, tx).await.expect("listen");
        let mode = std::fs::metadata(&hostile).expect("created").permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[tokio::test]
    async fn garbage_gets_an_error_answer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("private").join("g.sock");
        let (tx, _rx) = mpsc::channel(1);
        let _server = listen(&path, tx).await.expect("listen");
        let mut s = UnixStream::connect(&path).await.expect("connect");
        s.write_all(b"{\"launch\": 1}\n").await.expect("write");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).await.expect("read");
        assert!(line.contains("not a request"), "{line}");
    }
}
