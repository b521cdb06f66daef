//! One connection of a fresh broker driven by a fuzzer's bytes: the packet
//! handling, the logins and the grants, through the same code as a socket.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::super::access::{Gatekeeper, Grants, LoginKind, Refusal};
use super::{connection, Admission, Shared};

/// Runs one connection of a fresh, open broker with `bytes` as everything
/// its client sends, reading what it answers, until the connection ends:
/// the packet handling as a fuzz target drives it (`fuzz/`).
pub fn fuzz_connection(bytes: &[u8]) {
    use tokio::io::AsyncReadExt;
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_time().build() else { return };
    runtime.block_on(async {
        let shared = Shared::new(super::super::settings::MAX_PAYLOAD, false, STALL_FOR_FUZZING, 16);
        // Every other input meets a gatekeeper: its logins are strangers
        // (or refused), upgraded on their second refused publish.
        let gate: Option<Arc<dyn Gatekeeper>> = (bytes.len() % 2 == 0).then(|| Arc::new(FuzzGate::default()) as _);
        let admit = Arc::new(Admission { users: None, internal: None, gate });
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let conn = tokio::spawn(connection(shared, server, addr, admit));
        let (mut read, mut write) = tokio::io::split(&mut client);
        let talk = async {
            let _ = write.write_all(bytes).await;
            let _ = write.shutdown().await;
        };
        let listen = async {
            let mut sink = Vec::new();
            let _ = read.read_to_end(&mut sink).await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), async { tokio::join!(talk, listen) }).await;
        let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
    });
}

/// The fuzz target's gatekeeper: a login with a user name is a stranger
/// reaching `a/+` (retained `a/s`), none is refused; every second regrant
/// makes it an agent of `a/#`.
#[derive(Debug, Default)]
struct FuzzGate {
    asked: std::sync::atomic::AtomicU64,
}

impl Gatekeeper for FuzzGate {
    fn login(&self, _client_id: &str, login: Option<(&str, &str)>) -> Result<Grants, Refusal> {
        let (user, _) = login.ok_or(Refusal::NotAuthorized)?;
        let filters = |f: &str| vec![f.to_string()];
        Ok(Grants {
            kind: LoginKind::Stranger,
            identity: format!("stranger:{user}"),
            publish: filters("a/+"),
            read: filters("a/+"),
            retain: filters("a/s"),
        })
    }

    fn regrant(&self, current: &Grants) -> Option<Grants> {
        (self.asked.fetch_add(1, Ordering::Relaxed) % 2 == 1).then(|| Grants {
            kind: LoginKind::Agent,
            publish: vec!["a/#".into()],
            read: vec!["a/#".into()],
            ..current.clone()
        })
    }
}

/// A subscriber's stall while fuzzing: short, so no input waits long.
const STALL_FOR_FUZZING: Duration = Duration::from_millis(200);
