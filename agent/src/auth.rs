//! The agent's side of message authentication (the scheme is in
//! [`tunefleet_common::auth`]): its key pair, the pinned coordinator key,
//! the coordinator status it trusts, the Hello/Welcome handshake, and the
//! session that seals what it sends and opens what it receives.
//!
//! The agent runs, cancels and forgets nothing that did not come sealed in
//! its current session with the pinned coordinator.

use std::path::{Path, PathBuf};

use tunefleet_common::auth::{
    self, AuthError, Digest, Identity, KeyFileError, PendingHello, PublicKey, Sealed, Session, Signed,
};
use tunefleet_common::message::{AgentInfo, AgentMessage, CoordinatorMessage, CoordinatorStatus};
use tunefleet_common::topic::AgentTopic;
use tunefleet_common::{encode, CodecError};

/// The agent's key, in its state directory.
pub const KEY_FILE: &str = "agent.key";
/// The coordinator key pinned on first use, in the state directory.
pub const COORDINATOR_KEY_FILE: &str = "coordinator.pub";

/// Where the coordinator's key is pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pin {
    /// Given on the command line (`--coordinator-key`): never changes.
    Given(PublicKey),
    /// Pinned on first use and kept in this file (`None`: memory only).
    FirstUse(Option<PathBuf>),
}

/// Why the agent ignored a coordinator status.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatusRefusal {
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error(
        "coordinator key {got} is not the pinned {pinned}; if the coordinator really changed its key, remove {file} \
         (or give --coordinator-key)"
    )]
    OtherKey { got: String, pinned: String, file: String },
    #[error("an older coordinator status (started {got} ms, newest seen {newest} ms): a replay")]
    Stale { got: u64, newest: u64 },
}

/// Authentication state of one agent process.
pub struct AgentAuth {
    name: String,
    identity: Identity,
    pin: Pin,
    pinned: Option<PublicKey>,
    /// The newest verified coordinator status.
    coordinator: Option<CoordinatorStatus>,
    pending: Option<PendingHello>,
    session: Option<Session>,
    hello_seq: u64,
    /// Hash of the current connection's Last Will secret.
    will_hash: Digest,
}

impl std::fmt::Debug for AgentAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentAuth").field("name", &self.name).field("session", &self.session).finish()
    }
}

/// Loads the agent's key from `state_dir` (created when missing), or makes
/// one for this process only when there is no state directory.
pub fn load_identity(state_dir: Option<&Path>) -> Result<Identity, KeyFileError> {
    match state_dir {
        Some(dir) => {
            let path = dir.join(KEY_FILE);
            let (identity, created) = Identity::load_or_create(&path)?;
            if created {
                tracing::warn!(path = %path.display(), key = %auth::hex(&identity.public()), "created this agent's key");
            }
            Ok(identity)
        }
        None => {
            tracing::warn!(
                "no state directory: this agent's key lives in memory only, and a coordinator that pinned it will \
                 refuse the next start (tunefleet agents forget NAME)"
            );
            Identity::generate().map(|(i, _)| i).map_err(|_| KeyFileError::Random)
        }
    }
}

impl AgentAuth {
    pub fn new(name: &str, identity: Identity, pin: Pin) -> Result<Self, KeyFileError> {
        let pinned = match &pin {
            Pin::Given(k) => Some(*k),
            Pin::FirstUse(Some(path)) => auth::read_public_key(path)?,
            Pin::FirstUse(None) => None,
        };
        Ok(AgentAuth {
            name: name.to_string(),
            identity,
            pin,
            pinned,
            coordinator: None,
            pending: None,
            session: None,
            hello_seq: 0,
            will_hash: [0; 32],
        })
    }

    pub fn public_key(&self) -> PublicKey {
        self.identity.public()
    }

    /// A new connection with a new Last Will: any session is over.
    pub fn on_connected(&mut self, will_hash: Digest) {
        self.session = None;
        self.pending = None;
        self.will_hash = will_hash;
    }

    /// Checks a signed coordinator status: the pinned key (pinning it on
    /// first use), and no older than the newest seen. Returns it when it is
    /// to be acted on.
    pub fn coordinator_status(&mut self, signed: &Signed) -> Result<CoordinatorStatus, StatusRefusal> {
        let status = auth::open_status(signed)?;
        match self.pinned {
            Some(k) if k != status.key => {
                let file = match &self.pin {
                    Pin::FirstUse(Some(p)) => p.display().to_string(),
                    _ => "the pin".into(),
                };
                return Err(StatusRefusal::OtherKey { got: auth::hex(&status.key), pinned: auth::hex(&k), file });
            }
            Some(_) => {}
            None => {
                self.pinned = Some(status.key);
                match &self.pin {
                    Pin::FirstUse(Some(path)) => {
                        if let Err(e) = auth::write_public_key(path, &status.key) {
                            tracing::error!(error = %e, "cannot keep the coordinator's key: pinned for this process only");
                        }
                        tracing::warn!(
                            key = %auth::hex(&status.key),
                            file = %path.display(),
                            "PINNED the coordinator's key on first use: from now on this agent obeys only this coordinator"
                        );
                    }
                    _ => tracing::warn!(key = %auth::hex(&status.key), "pinned the coordinator's key for this process"),
                }
            }
        }
        if let Some(newest) = &self.coordinator {
            if status.started_unix_ms < newest.started_unix_ms {
                return Err(StatusRefusal::Stale { got: status.started_unix_ms, newest: newest.started_unix_ms });
            }
        }
        self.coordinator = Some(status.clone());
        Ok(status)
    }

    /// A signed Hello for the coordinator instance last seen online; `None`
    /// while none is.
    pub fn hello(&mut self, info: &AgentInfo) -> Result<Option<Vec<u8>>, AuthError> {
        let Some(instance) = self.coordinator.as_ref().filter(|c| c.online).map(|c| c.instance) else {
            return Ok(None);
        };
        self.hello_seq += 1;
        let (signed, pending) = auth::hello(&self.identity, info.clone(), instance, self.hello_seq, self.will_hash)?;
        self.pending = Some(pending);
        self.session = None;
        Ok(Some(encode(&auth::UpFrame::Hello(signed))?))
    }

    /// A Welcome: opens the session if it answers our Hello and is signed by
    /// the pinned coordinator.
    pub fn welcome(&mut self, signed: &Signed) -> Result<(), AuthError> {
        let key = self.pinned.ok_or(AuthError::Signature)?;
        let pending = self.pending.take().ok_or(AuthError::OtherHello)?;
        if !pending.answers(signed) {
            // A Welcome for an earlier Hello (we asked again meanwhile): wait for the next.
            self.pending = Some(pending);
            return Err(AuthError::OtherHello);
        }
        self.session = Some(pending.finish(&self.name, &key, signed)?);
        Ok(())
    }

    pub fn welcomed(&self) -> bool {
        self.session.is_some()
    }

    /// Opens a sealed frame that came on a `kind` topic.
    pub fn open(&mut self, kind: AgentTopic, sealed: &Sealed) -> Result<CoordinatorMessage, AuthError> {
        self.session.as_mut().ok_or(AuthError::NoSession)?.open_coordinator(kind, sealed)
    }

    /// Seals `msg`; `None` without a session.
    pub fn seal(&mut self, msg: &AgentMessage) -> Option<Result<(AgentTopic, Vec<u8>), AuthError>> {
        self.session.as_mut().map(|s| s.seal_agent(msg))
    }
}

/// The Last Will of a new connection, encoded, and the hash a Hello commits to.
pub fn will_payload(instance: u64) -> Result<(Vec<u8>, Digest), CodecError> {
    let (will, hash) = auth::new_will(instance).map_err(|e| CodecError::Encode(e.to_string()))?;
    Ok((encode(&auth::UpFrame::Will(will))?, hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::auth::DownFrame;
    use tunefleet_common::decode;

    fn info() -> AgentInfo {
        AgentInfo::minimal("a1", 5)
    }

    fn status(id: &Identity, online: bool, instance: u64, started: u64) -> Signed {
        let s = CoordinatorStatus { online, instance, started_unix_ms: started, key: id.public() };
        auth::sign_status(id, &s).expect("sign")
    }

    #[test]
    fn pins_on_first_use_and_refuses_another_coordinator_and_old_statuses() {
        let dir = tempfile::tempdir().expect("dir");
        let pin_file = dir.path().join(COORDINATOR_KEY_FILE);
        let (coord, _) = Identity::generate().expect("key");
        let (mallory, _) = Identity::generate().expect("key");
        let mut a = AgentAuth::new("a1", Identity::generate().expect("key").0, Pin::FirstUse(Some(pin_file.clone())))
            .expect("auth");
        assert_eq!(a.hello(&info()), Ok(None), "no coordinator seen yet");
        a.coordinator_status(&status(&coord, true, 1, 100)).expect("first use");
        assert_eq!(auth::read_public_key(&pin_file).expect("read"), Some(coord.public()));
        assert!(matches!(a.coordinator_status(&status(&mallory, true, 2, 200)), Err(StatusRefusal::OtherKey { .. })));
        assert!(matches!(a.coordinator_status(&status(&coord, true, 0, 50)), Err(StatusRefusal::Stale { .. })));
        // A restarted agent process reads the pin back.
        let mut b =
            AgentAuth::new("a1", Identity::generate().expect("key").0, Pin::FirstUse(Some(pin_file))).expect("auth");
        assert!(matches!(b.coordinator_status(&status(&mallory, true, 2, 200)), Err(StatusRefusal::OtherKey { .. })));
        let mut given =
            AgentAuth::new("a1", Identity::generate().expect("key").0, Pin::Given(mallory.public())).expect("auth");
        assert!(matches!(given.coordinator_status(&status(&coord, true, 2, 200)), Err(StatusRefusal::OtherKey { .. })));
    }

    #[test]
    fn a_welcome_opens_the_session_only_for_our_hello_and_pinned_key() {
        let (coord, _) = Identity::generate().expect("key");
        let (mallory, _) = Identity::generate().expect("key");
        let mut a = AgentAuth::new("a1", Identity::generate().expect("key").0, Pin::FirstUse(None)).expect("auth");
        a.coordinator_status(&status(&coord, true, 9, 1)).expect("status");
        let hello = a.hello(&info()).expect("hello").expect("online");
        let Ok(auth::UpFrame::Hello(signed)) = decode::<auth::UpFrame>(&hello) else { panic!("not a hello") };
        let (h, digest) = auth::open_hello(&signed).expect("verifies");
        assert_eq!(h.coordinator_instance, 9);
        let (forged, _) = auth::welcome(&mallory, "a1", &h, digest, 1).expect("welcome");
        assert_eq!(a.welcome(&forged), Err(AuthError::Signature));
        // The forged one consumed nothing we cannot redo: ask again and take the real answer.
        let hello = a.hello(&info()).expect("hello").expect("online");
        let Ok(auth::UpFrame::Hello(signed)) = decode::<auth::UpFrame>(&hello) else { panic!("not a hello") };
        let (h2, d2) = auth::open_hello(&signed).expect("verifies");
        let (old_answer, _) = auth::welcome(&coord, "a1", &h, digest, 1).expect("welcome");
        assert_eq!(a.welcome(&old_answer), Err(AuthError::OtherHello));
        let (w, mut coord_side) = auth::welcome(&coord, "a1", &h2, d2, 2).expect("welcome");
        a.welcome(&w).expect("session");
        assert!(a.welcomed());
        let msg = CoordinatorMessage::Sync(3);
        let (kind, payload) = coord_side.seal_coordinator(&msg).expect("seal");
        let Ok(DownFrame::Sealed(sealed)) = decode::<DownFrame>(&payload) else { panic!("not sealed") };
        assert_eq!(a.open(kind, &sealed), Ok(msg));
        a.on_connected([1; 32]);
        assert!(!a.welcomed(), "a new connection ends the session");
        assert_eq!(a.open(kind, &sealed), Err(AuthError::NoSession));
    }
}
