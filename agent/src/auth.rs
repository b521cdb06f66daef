//! The agent's side of message authentication (the scheme is in
//! [`tunefleet_common::auth`]): its key pair, the pinned coordinator key,
//! the coordinator status it trusts, the Hello/Welcome handshake, and the
//! session that seals what it sends and opens what it receives.
//!
//! The agent runs, cancels and forgets nothing that did not come sealed in
//! its current session with the pinned coordinator.

use std::path::{Path, PathBuf};

use tunefleet_common::auth::{
    self, AuthError, Digest, Enrolment, Identity, JoinToken, KeyFileError, PendingHello, PublicKey, Sealed, Session,
    Signed,
};
use tunefleet_common::message::{AgentInfo, AgentMessage, CoordinatorMessage, CoordinatorStatus};
use tunefleet_common::topic::AgentTopic;
use tunefleet_common::{encode, CodecError};

/// The agent's key, in its state directory.
pub const KEY_FILE: &str = "agent.key";
/// The coordinator key, once pinned (from a join token, or on first use in
/// a lab), in the state directory.
pub const COORDINATOR_KEY_FILE: &str = "coordinator.pub";
/// The last process instance, in the state directory (see `next_instance`).
pub const INSTANCE_FILE: &str = "instance";
/// The file in a state directory that keeps the name its key was made under.
pub const NAME_FILE: &str = "name";

/// How this agent comes to trust a coordinator key. Never from a broker
/// topic alone, unless the operator opts in for a lab (`first_use`).
#[derive(Debug, Clone, Default)]
pub struct Trust {
    /// Given on the command line (`--coordinator-key`): never changes.
    pub given: Option<PublicKey>,
    /// A join token (`--join`): the coordinator whose key matches its
    /// fingerprint is pinned, and the agent proves the token in its Hello.
    pub token: Option<JoinToken>,
    /// `--trust-first-coordinator`: pin whichever signed status comes first
    /// (trust on first use; any broker user can be that coordinator).
    pub first_use: bool,
    /// Where a pinned key is kept across restarts (`None`: memory only).
    pub file: Option<PathBuf>,
}

/// Why the agent cannot start with the trust it was given.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "this agent trusts no coordinator yet: give --join TOKEN (made by `tunefleet token create` on the \
         coordinator's machine), or --coordinator-key HEX (from `tunefleet key`); --trust-first-coordinator pins \
         whichever coordinator answers first, for a lab where every broker user is trusted"
    )]
    Nothing,
    #[error(
        "the join token is for coordinator {token}..., but {pinned} is pinned in {file}: remove that file if this \
         agent now belongs to another coordinator"
    )]
    Conflict { token: String, pinned: String, file: String },
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    #[error(transparent)]
    Auth(#[from] AuthError),
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
    #[error(
        "a coordinator status signed by key {got}, which neither this agent's join token nor its pin names: ignored"
    )]
    Unknown { got: String },
    #[error("an older coordinator status (instance {got}, newest seen {newest}): a replay")]
    Stale { got: u64, newest: u64 },
}

/// Authentication state of one agent process.
pub struct AgentAuth {
    name: String,
    /// Shared with the transport, which proves it at each broker login.
    identity: std::sync::Arc<Identity>,
    trust: Trust,
    pinned: Option<PublicKey>,
    /// The join token's proof, sent in every Hello (the coordinator reads it
    /// only while it does not know this agent's key).
    enrol: Option<Enrolment>,
    /// The newest verified coordinator status.
    coordinator: Option<CoordinatorStatus>,
    pending: Option<PendingHello>,
    session: Option<Session>,
    hello_seq: u64,
    /// Hash of the current connection's Last Will secret.
    will_hash: Digest,
    /// A coordinator welcomed this process at least once.
    welcomed: bool,
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
                tracing::warn!(path = %path.display(), key = %auth::short_key(&identity.public()), "created this agent's key");
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
    pub fn new(name: &str, identity: Identity, trust: Trust) -> Result<Self, TrustError> {
        let from_file = match &trust.file {
            Some(path) => auth::read_public_key(path)?,
            None => None,
        };
        let pinned = match (&trust.given, &trust.token, from_file) {
            (Some(k), _, _) => Some(*k),
            (None, Some(token), Some(k)) if !token.admits_coordinator(&k) => {
                return Err(TrustError::Conflict {
                    token: auth::hex(&token.fingerprint[..8]),
                    pinned: auth::hex(&k),
                    file: trust.file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                })
            }
            (None, _, Some(k)) => Some(k),
            (None, None, None) if !trust.first_use => return Err(TrustError::Nothing),
            (None, _, None) => None,
        };
        let enrol = trust.token.as_ref().map(|t| t.prove(&identity.public(), name)).transpose()?;
        Ok(AgentAuth {
            name: name.to_string(),
            identity: std::sync::Arc::new(identity),
            trust,
            pinned,
            enrol,
            coordinator: None,
            pending: None,
            session: None,
            hello_seq: 0,
            will_hash: [0; 32],
            welcomed: false,
        })
    }

    pub fn public_key(&self) -> PublicKey {
        self.identity.public()
    }

    /// Whether a coordinator welcomed this process at least once.
    pub fn ever_welcomed(&self) -> bool {
        self.welcomed
    }

    /// This agent's key, for the transport's logins by identity.
    pub fn identity(&self) -> std::sync::Arc<Identity> {
        self.identity.clone()
    }

    /// A new connection with a new Last Will: any session is over.
    pub fn on_connected(&mut self, will_hash: Digest) {
        self.session = None;
        self.pending = None;
        self.will_hash = will_hash;
    }

    /// Checks a signed coordinator status: the pinned key (pinning it when
    /// the join token names it, or on first use where the operator allowed
    /// that), and no older than the newest seen (by the coordinator's
    /// instance, a counter that grows with every start, never its clock).
    /// Returns it when it is to be acted on.
    pub fn coordinator_status(&mut self, signed: &Signed) -> Result<CoordinatorStatus, StatusRefusal> {
        let status = auth::open_status(signed)?;
        match self.pinned {
            Some(k) if k != status.key => {
                let file = match &self.trust.file {
                    Some(p) if self.trust.given.is_none() => p.display().to_string(),
                    _ => "the pin".into(),
                };
                return Err(StatusRefusal::OtherKey { got: auth::hex(&status.key), pinned: auth::hex(&k), file });
            }
            Some(_) => {}
            None => {
                let by_token = self.trust.token.as_ref().is_some_and(|t| t.admits_coordinator(&status.key));
                if !by_token && !self.trust.first_use {
                    return Err(StatusRefusal::Unknown { got: auth::hex(&status.key) });
                }
                self.pinned = Some(status.key);
                let how = if by_token { "its join token" } else { "first use (--trust-first-coordinator)" };
                match &self.trust.file {
                    Some(path) => {
                        if let Err(e) = auth::write_public_key(path, &status.key) {
                            tracing::error!(error = %e, "cannot keep the coordinator's key: pinned for this process only");
                        }
                        tracing::warn!(
                            key = %auth::short_key(&status.key),
                            file = %path.display(),
                            "pinned the coordinator's key from {how}: from now on this agent obeys only this coordinator"
                        );
                    }
                    None => {
                        tracing::warn!(key = %auth::short_key(&status.key), "pinned the coordinator's key from {how} for this process")
                    }
                }
            }
        }
        if let Some(newest) = &self.coordinator {
            if status.instance < newest.instance {
                return Err(StatusRefusal::Stale { got: status.instance, newest: newest.instance });
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
        let (signed, pending) =
            auth::hello(&self.identity, info.clone(), instance, self.hello_seq, self.will_hash, self.enrol.clone())?;
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
        self.welcomed = true;
        Ok(())
    }

    /// A signed notice that the coordinator holds no session with our
    /// token: true when it names this agent and the current session (which
    /// is then over; the agent says Hello again).
    pub fn stale(&mut self, signed: &Signed) -> Result<bool, AuthError> {
        let key = self.pinned.ok_or(AuthError::Signature)?;
        let stale = auth::open_stale(&key, signed)?;
        let current = self.session.as_ref().map(Session::token);
        if stale.agent != self.name || current != Some(stale.token) {
            return Ok(false);
        }
        self.session = None;
        Ok(true)
    }

    /// A signed notice that the coordinator refused a Hello: returned when
    /// it answers the Hello this agent sent last, with this agent's name and
    /// key (a replayed notice answers an older Hello, a forger's carries
    /// another key); that Hello is then over.
    pub fn refused(&mut self, signed: &Signed) -> Result<Option<auth::HelloRefused>, AuthError> {
        let key = self.pinned.ok_or(AuthError::Signature)?;
        let notice = auth::open_refused(&key, signed)?;
        let ours = self.pending.as_ref().is_some_and(|p| p.digest() == notice.hello)
            && notice.agent == self.name
            && notice.key == self.identity.public();
        if !ours {
            return Ok(None);
        }
        self.pending = None;
        Ok(Some(notice))
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

    fn trust(token: Option<&JoinToken>, file: Option<PathBuf>) -> Trust {
        Trust { token: token.cloned(), file, ..Trust::default() }
    }

    #[test]
    fn regression_a_fleet_member_cannot_capture_a_new_agent_the_token_names_its_coordinator() {
        let dir = tempfile::tempdir().expect("dir");
        let pin_file = dir.path().join(COORDINATOR_KEY_FILE);
        let (coord, _) = Identity::generate().expect("key");
        let (mallory, _) = Identity::generate().expect("key");
        let token = JoinToken::generate(&coord.public()).expect("token");
        let mut a =
            AgentAuth::new("a1", Identity::generate().expect("key").0, trust(Some(&token), Some(pin_file.clone())))
                .expect("auth");
        assert_eq!(a.hello(&info()), Ok(None), "no coordinator seen yet");
        // A member's own coordinator, signed and online, reaches the new agent first: not pinned.
        assert!(matches!(a.coordinator_status(&status(&mallory, true, 1, 100)), Err(StatusRefusal::Unknown { .. })));
        assert_eq!(a.hello(&info()), Ok(None), "no Hello for a coordinator the token does not name");
        assert_eq!(auth::read_public_key(&pin_file).expect("read"), None);
        // The real one is pinned from the token, and kept.
        a.coordinator_status(&status(&coord, true, 5, 100)).expect("the token's coordinator");
        assert_eq!(auth::read_public_key(&pin_file).expect("read"), Some(coord.public()));
        assert!(matches!(a.coordinator_status(&status(&mallory, true, 9, 200)), Err(StatusRefusal::OtherKey { .. })));
        // Staleness is by instance, not by the coordinator's clock: an older
        // instance is a replay, a newer one with an earlier clock is not.
        assert!(matches!(a.coordinator_status(&status(&coord, true, 4, 500)), Err(StatusRefusal::Stale { .. })));
        a.coordinator_status(&status(&coord, true, 6, 1)).expect("restarted with an earlier clock");
        // The Hello carries the token's proof for this agent's key and name.
        let hello = a.hello(&info()).expect("hello").expect("online");
        let Ok(auth::UpFrame::Hello(signed)) = decode::<auth::UpFrame>(&hello) else { panic!("not a hello") };
        let (h, _) = auth::open_hello(&signed).expect("verifies");
        let proof = h.enrol.expect("a proof");
        assert_eq!(auth::verify_enrolment(&proof, &h.key, "a1", &coord.public()), Ok(()));
        // A restarted agent reads the pin back, token or not.
        let mut b = AgentAuth::new("a1", Identity::generate().expect("key").0, trust(None, Some(pin_file.clone())))
            .expect("auth");
        assert!(matches!(b.coordinator_status(&status(&mallory, true, 2, 200)), Err(StatusRefusal::OtherKey { .. })));
        // A token for another coordinator than the pinned one is refused at start.
        let other = JoinToken::generate(&mallory.public()).expect("token");
        assert!(matches!(
            AgentAuth::new("a1", Identity::generate().expect("key").0, trust(Some(&other), Some(pin_file))),
            Err(TrustError::Conflict { .. })
        ));
        let given = Trust { given: Some(mallory.public()), ..Trust::default() };
        let mut given = AgentAuth::new("a1", Identity::generate().expect("key").0, given).expect("auth");
        assert!(matches!(given.coordinator_status(&status(&coord, true, 2, 200)), Err(StatusRefusal::OtherKey { .. })));
    }

    #[test]
    fn nothing_is_pinned_from_a_topic_unless_the_operator_opts_in() {
        let none = AgentAuth::new("a1", Identity::generate().expect("key").0, Trust::default());
        assert!(matches!(none, Err(TrustError::Nothing)));
        let lab = Trust { first_use: true, ..Trust::default() };
        let mut a = AgentAuth::new("a1", Identity::generate().expect("key").0, lab).expect("auth");
        let (coord, _) = Identity::generate().expect("key");
        a.coordinator_status(&status(&coord, true, 1, 1)).expect("first use, opted in");
    }

    #[test]
    fn instances_grow_across_restarts_even_when_the_clock_goes_back() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join(INSTANCE_FILE);
        let first = auth::next_instance(Some(&file)).expect("first");
        std::fs::write(&file, format!("{}\n", u64::MAX / 2)).expect("a clock far ahead once");
        let second = auth::next_instance(Some(&file)).expect("second");
        assert_eq!(second, u64::MAX / 2 + 1);
        assert!(second > first);
        assert!(auth::next_instance(Some(&file)).expect("third") > second);
    }

    #[test]
    fn a_welcome_opens_the_session_only_for_our_hello_and_pinned_key() {
        let (coord, _) = Identity::generate().expect("key");
        let (mallory, _) = Identity::generate().expect("key");
        let lab = Trust { first_use: true, ..Trust::default() };
        let mut a = AgentAuth::new("a1", Identity::generate().expect("key").0, lab).expect("auth");
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
        // A signed notice that the coordinator lost this session ends it; one
        // for another token, another agent, or signed by another key does not.
        let stale = |id: &Identity, agent: &str, token| {
            auth::sign_stale(id, &auth::StaleSession { agent: agent.into(), token }).expect("sign")
        };
        assert_eq!(a.stale(&stale(&coord, "a1", 1)), Ok(false), "another session's token");
        assert_eq!(a.stale(&stale(&coord, "a2", 2)), Ok(false), "another agent");
        assert_eq!(a.stale(&stale(&mallory, "a1", 2)), Err(AuthError::Signature));
        assert!(a.welcomed());
        assert_eq!(a.stale(&stale(&coord, "a1", 2)), Ok(true));
        assert!(!a.welcomed(), "the session is over: the agent says Hello again");
        a.on_connected([1; 32]);
        assert!(!a.welcomed(), "a new connection ends the session");
        assert_eq!(a.open(kind, &sealed), Err(AuthError::NoSession));
    }
}
