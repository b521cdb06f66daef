//! The coordinator's side of message authentication (the scheme is in
//! [`tunefleet_common::auth`]): its key pair and signed status, the checks a
//! Hello must pass (rate, signature, name, coordinator instance, replay),
//! one session per agent, and sealing and opening of session frames.
//!
//! Pinning agent keys needs the store, so the engine does that step between
//! [`Sessions::check_hello`] and [`Sessions::accept`].

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Instant;

use tunefleet_common::auth::{self, AuthError, Digest, Hello, Identity, Sealed, Session, Signed, Will};
use tunefleet_common::message::{AgentMessage, CoordinatorMessage, CoordinatorStatus, SessionToken};
use tunefleet_common::topic::AgentTopic;
use tunefleet_common::{encode, CodecError};

/// Default bound on the agents a coordinator pins keys for.
pub const DEFAULT_MAX_AGENTS: u64 = 10_000;
/// Hellos accepted per second, sustained (a whole fleet reconnecting after a
/// coordinator restart comes in at the burst).
pub const HELLO_RATE: f64 = 200.0;
/// Hellos accepted in one burst.
pub const HELLO_BURST: f64 = 2_000.0;
/// Earlier process instances remembered per agent (their Hellos are replays).
const RETIRED_INSTANCES: usize = 16;

/// Where the coordinator keeps its key when `--key` is not given:
/// `$STATE_DIRECTORY`, else `$XDG_STATE_HOME/tunefleet`, else
/// `~/.local/state/tunefleet`, else beside the store.
pub fn default_key_path(
    store: &Path,
    state_directory: Option<PathBuf>,
    xdg_state: Option<PathBuf>,
    home: Option<PathBuf>,
) -> PathBuf {
    let file = "coordinator.key";
    if let Some(d) = state_directory {
        return d.join(file);
    }
    if let Some(d) = xdg_state {
        return d.join("tunefleet").join(file);
    }
    if let Some(h) = home {
        return h.join(".local/state/tunefleet").join(file);
    }
    store.parent().unwrap_or(Path::new(".")).join(file)
}

/// Why a Hello was not answered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HelloRefusal {
    #[error("more than {HELLO_RATE} Hellos a second: dropped (the agent asks again)")]
    RateLimited,
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error("agent {claimed:?} announced itself on the topic of {topic:?}")]
    Name { claimed: String, topic: String },
    #[error("for coordinator instance {got:#x}, this is {this:#x} (a replay, or a status it missed)")]
    Instance { got: u64, this: u64 },
    #[error("replayed Hello (instance {instance:#x}, seq {seq})")]
    Replay { instance: u64, seq: u64 },
    #[error(
        "agent {agent:?} presented key {got}, but {pinned} is pinned for that name. If the agent was re-installed, \
         accept its new key with: tunefleet agents trust {agent} {got} (and this coordinator's --store)"
    )]
    KeyChanged { agent: String, got: String, pinned: String },
    #[error("the coordinator already pins {max} agents (--max-agents): new agent {agent:?} refused")]
    TooManyAgents { agent: String, max: u64 },
}

/// What a Last Will turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WillCheck {
    /// The will of the agent's live session: it is offline; the session ended.
    Live,
    /// No live session here; check the store (a coordinator that restarted).
    NoSession,
    /// A will that does not match the live session: forged or replayed.
    Forged,
}

struct Live {
    session: Session,
    will_hash: Digest,
    instance: u64,
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// Every agent's session.
pub struct Sessions {
    identity: Identity,
    instance: u64,
    started_unix_ms: u64,
    live: HashMap<String, Live>,
    /// The last accepted Hello's (agent instance, seq), and earlier instances.
    hellos: HashMap<String, (u64, u64, VecDeque<u64>)>,
    bucket: Bucket,
    /// Bound on pinned agents.
    pub max_agents: u64,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("instance", &self.instance).field("live", &self.live.len()).finish()
    }
}

impl Sessions {
    pub fn new(identity: Identity, instance: u64, started_unix_ms: u64) -> Self {
        Sessions {
            identity,
            instance,
            started_unix_ms,
            live: HashMap::new(),
            hellos: HashMap::new(),
            bucket: Bucket { level: HELLO_BURST, at: Instant::now() },
            max_agents: DEFAULT_MAX_AGENTS,
        }
    }

    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The coordinator's public key.
    pub fn public_key(&self) -> auth::PublicKey {
        self.identity.public()
    }

    /// The signed status payload (retained on the coordinator topic).
    pub fn status_payload(&self, online: bool) -> Result<Vec<u8>, CodecError> {
        let status = CoordinatorStatus {
            online,
            instance: self.instance,
            started_unix_ms: self.started_unix_ms,
            key: self.identity.public(),
        };
        let signed = auth::sign_status(&self.identity, &status).map_err(|e| CodecError::Encode(e.to_string()))?;
        encode(&signed)
    }

    fn take_token(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.bucket.at).as_secs_f64();
        self.bucket.at = now;
        self.bucket.level = (self.bucket.level + elapsed * HELLO_RATE).min(HELLO_BURST);
        if self.bucket.level >= 1.0 {
            self.bucket.level -= 1.0;
            true
        } else {
            false
        }
    }

    /// Every check of a Hello that needs no store; the key pin is the caller's.
    pub fn check_hello(&mut self, agent: &str, signed: &Signed, now: Instant) -> Result<(Hello, Digest), HelloRefusal> {
        if !self.take_token(now) {
            return Err(HelloRefusal::RateLimited);
        }
        let (hello, digest) = auth::open_hello(signed)?;
        if hello.info.agent != agent {
            return Err(HelloRefusal::Name { claimed: hello.info.agent, topic: agent.to_string() });
        }
        if hello.coordinator_instance != self.instance {
            return Err(HelloRefusal::Instance { got: hello.coordinator_instance, this: self.instance });
        }
        let (instance, seq) = (hello.info.instance, hello.seq);
        if let Some((last_instance, last_seq, retired)) = self.hellos.get(agent) {
            let replay = if instance == *last_instance { seq <= *last_seq } else { retired.contains(&instance) };
            if replay {
                return Err(HelloRefusal::Replay { instance, seq });
            }
        }
        Ok((hello, digest))
    }

    /// Checks `hello`'s key against the pin (`None`: none yet) and the bound
    /// on agents (`pinned`: how many are pinned). `Ok(true)`: pin it now.
    pub fn check_pin(
        &self,
        agent: &str,
        hello: &Hello,
        pin: Option<auth::PublicKey>,
        pinned: u64,
    ) -> Result<bool, HelloRefusal> {
        match pin {
            Some(k) if k == hello.key => Ok(false),
            Some(k) => Err(HelloRefusal::KeyChanged {
                agent: agent.to_string(),
                got: auth::hex(&hello.key),
                pinned: auth::hex(&k),
            }),
            None if pinned >= self.max_agents => {
                Err(HelloRefusal::TooManyAgents { agent: agent.to_string(), max: self.max_agents })
            }
            None => Ok(true),
        }
    }

    /// Opens a session for a checked Hello: the Welcome payload to send.
    pub fn accept(&mut self, agent: &str, hello: &Hello, digest: Digest) -> Result<(SessionToken, Vec<u8>), AuthError> {
        let token = u64::from_le_bytes(auth::random_bytes::<8>()?);
        let (signed, session) = auth::welcome(&self.identity, agent, hello, digest, token)?;
        let payload = encode(&tunefleet_common::auth::DownFrame::Welcome(signed))?;
        let (instance, seq) = (hello.info.instance, hello.seq);
        let entry = self.hellos.entry(agent.to_string()).or_insert((instance, 0, VecDeque::new()));
        if entry.0 != instance {
            entry.2.push_back(entry.0);
            if entry.2.len() > RETIRED_INSTANCES {
                entry.2.pop_front();
            }
        }
        entry.0 = instance;
        entry.1 = seq;
        self.live.insert(agent.to_string(), Live { session, will_hash: hello.will_hash, instance });
        Ok((token, payload))
    }

    /// Opens a sealed frame from `agent` that came on a `kind` topic.
    pub fn open(&mut self, agent: &str, kind: AgentTopic, sealed: &Sealed) -> Result<AgentMessage, AuthError> {
        let live = self.live.get_mut(agent).ok_or(AuthError::NoSession)?;
        live.session.open_agent(kind, sealed)
    }

    /// Seals `msg` for `agent`; `None` without a live session.
    pub fn seal(&mut self, agent: &str, msg: &CoordinatorMessage) -> Option<Result<(AgentTopic, Vec<u8>), AuthError>> {
        self.live.get_mut(agent).map(|l| l.session.seal_coordinator(msg))
    }

    /// A Last Will from `agent`.
    pub fn will(&mut self, agent: &str, will: &Will) -> WillCheck {
        match self.live.get(agent) {
            None => WillCheck::NoSession,
            Some(l) if l.instance == will.instance && auth::will_matches(will, &l.will_hash) => {
                self.live.remove(agent);
                WillCheck::Live
            }
            Some(_) => WillCheck::Forged,
        }
    }

    /// Ends `agent`'s session (it said goodbye).
    pub fn end(&mut self, agent: &str) {
        self.live.remove(agent);
    }

    /// Whether `agent` has a live session.
    pub fn is_live(&self, agent: &str) -> bool {
        self.live.contains_key(agent)
    }

    /// Agents with a live session.
    pub fn live_agents(&self) -> impl Iterator<Item = &str> {
        self.live.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::auth::{DownFrame, UpFrame};
    use tunefleet_common::decode;
    use tunefleet_common::message::{AgentInfo, WorkRequest};

    fn info(agent: &str, instance: u64) -> AgentInfo {
        AgentInfo::minimal(agent, instance)
    }

    fn sessions() -> Sessions {
        Sessions::new(Identity::generate().expect("key").0, 77, 1)
    }

    #[test]
    fn hellos_are_checked_and_replays_refused() {
        let mut s = sessions();
        let (agent, _) = Identity::generate().expect("key");
        let now = Instant::now();
        let (signed, pending) = auth::hello(&agent, info("a", 1), 77, 1, [0; 32]).expect("hello");
        let (hello, digest) = s.check_hello("a", &signed, now).expect("good hello");
        assert_eq!(s.check_pin("a", &hello, None, 0), Ok(true));
        assert_eq!(s.check_pin("a", &hello, Some(hello.key), 1), Ok(false));
        assert!(matches!(s.check_pin("a", &hello, Some([9; 32]), 1), Err(HelloRefusal::KeyChanged { .. })));
        s.max_agents = 1;
        assert!(matches!(s.check_pin("a", &hello, None, 1), Err(HelloRefusal::TooManyAgents { .. })));
        let (_, payload) = s.accept("a", &hello, digest).expect("accept");
        let Ok(DownFrame::Welcome(w)) = decode::<DownFrame>(&payload) else { panic!("not a welcome") };
        let mut agent_side = pending.finish("a", &s.public_key(), &w).expect("agent opens the session");
        // The same Hello again is a replay; so is one of the same process with a lower seq.
        assert!(matches!(s.check_hello("a", &signed, now), Err(HelloRefusal::Replay { .. })));
        // On another agent's topic, or for another coordinator instance.
        assert!(matches!(s.check_hello("b", &signed, now), Err(HelloRefusal::Name { .. })));
        let (old, _) = auth::hello(&agent, info("a", 1), 76, 2, [0; 32]).expect("hello");
        assert!(matches!(s.check_hello("a", &old, now), Err(HelloRefusal::Instance { .. })));
        // Sealed traffic both ways.
        let (kind, up) = agent_side
            .seal_agent(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, running: vec![] }))
            .expect("seal");
        let Ok(UpFrame::Sealed(sealed)) = decode::<UpFrame>(&up) else { panic!("not sealed") };
        assert!(s.open("a", kind, &sealed).is_ok());
        assert_eq!(s.open("b", kind, &sealed), Err(AuthError::NoSession));
        // A restarted agent process is a new instance; the old one's Hellos are replays then.
        let (again, _) = auth::hello(&agent, info("a", 2), 77, 1, [0; 32]).expect("hello");
        let (h2, d2) = s.check_hello("a", &again, now).expect("new instance");
        s.accept("a", &h2, d2).expect("accept");
        let (stale, _) = auth::hello(&agent, info("a", 1), 77, 9, [0; 32]).expect("hello");
        assert!(matches!(s.check_hello("a", &stale, now), Err(HelloRefusal::Replay { .. })));
    }

    #[test]
    fn hellos_are_rate_limited() {
        let mut s = sessions();
        let (agent, _) = Identity::generate().expect("key");
        let (signed, _) = auth::hello(&agent, info("a", 1), 77, 1, [0; 32]).expect("hello");
        let now = Instant::now();
        let refused = (0..HELLO_BURST as usize + 10)
            .filter(|_| s.check_hello("a", &signed, now) == Err(HelloRefusal::RateLimited))
            .count();
        assert_eq!(refused, 10, "the burst passes the limiter, the rest is dropped");
        let later = now + std::time::Duration::from_secs(1);
        assert_ne!(s.check_hello("a", &signed, later), Err(HelloRefusal::RateLimited), "the bucket refills");
    }

    #[test]
    fn only_the_live_sessions_will_counts() {
        let mut s = sessions();
        let (agent, _) = Identity::generate().expect("key");
        let (will, hash) = auth::new_will(1).expect("will");
        let (signed, _) = auth::hello(&agent, info("a", 1), 77, 1, hash).expect("hello");
        let (hello, digest) = s.check_hello("a", &signed, Instant::now()).expect("ok");
        assert_eq!(s.will("a", &will), WillCheck::NoSession);
        s.accept("a", &hello, digest).expect("accept");
        let (forged, _) = auth::new_will(1).expect("will");
        assert_eq!(s.will("a", &forged), WillCheck::Forged);
        assert_eq!(s.will("a", &Will { instance: 2, ..will.clone() }), WillCheck::Forged);
        assert_eq!(s.will("a", &will), WillCheck::Live);
        assert_eq!(s.will("a", &will), WillCheck::NoSession, "used once");
    }

    #[test]
    fn key_path_prefers_systemd_then_xdg_then_home_then_the_store() {
        let p = |s: &str| Some(PathBuf::from(s));
        let store = Path::new("/data/fleet.db");
        assert_eq!(
            default_key_path(store, p("/var/lib/tf"), p("/x"), p("/h")),
            PathBuf::from("/var/lib/tf/coordinator.key")
        );
        assert_eq!(default_key_path(store, None, p("/x"), p("/h")), PathBuf::from("/x/tunefleet/coordinator.key"));
        assert_eq!(
            default_key_path(store, None, None, p("/h")),
            PathBuf::from("/h/.local/state/tunefleet/coordinator.key")
        );
        assert_eq!(default_key_path(store, None, None, None), PathBuf::from("/data/coordinator.key"));
    }
}
