//! The coordinator's side of message authentication (the scheme is in
//! [`tunefleet_common::auth`]): its key pair and signed status, the checks a
//! Hello must pass, one session per agent, and sealing and opening of
//! session frames.
//!
//! A Hello passes, in this order, from cheapest to dearest, so that junk
//! never spends a budget real agents need: its size and shape, the name on
//! its topic, the coordinator instance it answers ([`Sessions::peek_hello`]);
//! then, with what the store knows of the name (its pinned key, its last
//! process instance and Hello number, a join token), the replay check and
//! admission ([`Sessions::admit`]): a name whose key is pinned spends the
//! budget of known agents, a new key the smaller budget of new pins, and a
//! new key is admitted only with a valid join token, or with open enrolment;
//! last, the signatures ([`Sessions::verify`]). Reading and writing the
//! store is the engine's part, between these steps.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use tunefleet_common::auth::{self, AuthError, Digest, Hello, Identity, RefusalKind, Sealed, Session, Signed, Will};
use tunefleet_common::message::{AgentMessage, CoordinatorMessage, CoordinatorStatus, SessionToken};
use tunefleet_common::topic::AgentTopic;

pub use crate::store::{Known, TokenState};
use tunefleet_common::{encode, CodecError};

/// Default bound on the agents a coordinator pins keys for.
pub const DEFAULT_MAX_AGENTS: u64 = 10_000;
/// Default bound on the slots any one agent is given, whatever it announces.
pub const DEFAULT_MAX_SLOTS: u32 = 64;
/// Most GPUs one agent is given unless `--max-gpus-per-agent` says otherwise
/// (a machine of eight, the largest common one).
pub const DEFAULT_MAX_GPUS: u32 = 8;
/// Hellos of agents whose key is pinned, accepted in one burst (a whole
/// fleet reconnecting after a coordinator restart comes in at the burst);
/// sustained, at the rate [`HelloPace`] measures the engine can spare.
pub const HELLO_BURST: f64 = 10_000.0;
/// New keys pinned in one burst (a fleet enrolling at once); sustained, at
/// the rate [`HelloPace`] measures.
pub const NEW_PIN_BURST: f64 = 2_000.0;
/// Stale-session notices signed per second, sustained, and in one burst.
const STALE_RATE: f64 = 100.0;
const STALE_BURST: f64 = 1_000.0;
/// At most one stale-session notice per agent in this long.
const STALE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

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
    #[error("more Hellos a second than the budget of {0}: dropped (the agent asks again)")]
    RateLimited(&'static str),
    #[error(
        "agent {agent:?} presents a key this coordinator does not know ({key}) and no join token: give it one \
         (tunefleet token create, then tunefleet-agent --join), or register its key (tunefleet agents trust {agent} \
         {key})"
    )]
    NotEnrolled { agent: String, key: String },
    #[error("a Hello out of bounds: {0}")]
    Invalid(String),
    #[error("agent {agent:?}: join token {token} {why}")]
    BadToken { agent: String, token: String, why: String, kind: RefusalKind },
    #[error("{0}")]
    Auth(#[from] AuthError),
    #[error("agent {claimed:?} announced itself on the topic of {topic:?}")]
    Name { claimed: String, topic: String },
    #[error("for coordinator instance {got:#x}, this is {this:#x} (a replay, or a status it missed)")]
    Instance { got: u64, this: u64 },
    #[error("replayed Hello (instance {instance}, seq {seq}; the last accepted was instance {last_instance}, seq {last_seq})")]
    Replay { instance: u64, seq: u64, last_instance: u64, last_seq: u64 },
    #[error(
        "agent {agent:?} presented key {got}, but {pinned} is pinned for that name: another machine may use the \
         name (give each agent its own --name), or the agent was re-installed (then accept its new key with: \
         tunefleet agents trust {agent} {got}, and this coordinator's --store)"
    )]
    KeyChanged { agent: String, got: String, pinned: String },
    #[error(
        "agent {agent:?} is online with its pinned key; another machine (key {got}) tried to join under its \
         name: give each agent its own --name"
    )]
    NameInUse { agent: String, got: String },
    #[error("the coordinator already pins {max} agents (--max-agents): new agent {agent:?} refused")]
    TooManyAgents { agent: String, max: u64 },
}

impl HelloRefusal {
    /// What the agent is told of this refusal; `None` for those it is not
    /// told: a budget (it asks again), and Hellos that are not its own
    /// (another name, another coordinator instance, a replay, a bad
    /// signature).
    pub fn kind(&self) -> Option<RefusalKind> {
        match self {
            HelloRefusal::NotEnrolled { .. } => Some(RefusalKind::NotEnrolled),
            HelloRefusal::BadToken { kind, .. } => Some(*kind),
            HelloRefusal::KeyChanged { .. } | HelloRefusal::NameInUse { .. } => Some(RefusalKind::NameTaken),
            HelloRefusal::TooManyAgents { .. } => Some(RefusalKind::FleetFull),
            HelloRefusal::Invalid(_) => Some(RefusalKind::Invalid),
            HelloRefusal::RateLimited(_)
            | HelloRefusal::Auth(_)
            | HelloRefusal::Name { .. }
            | HelloRefusal::Instance { .. }
            | HelloRefusal::Replay { .. } => None,
        }
    }
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
    /// When the store was last told this agent was heard (unix ms).
    seen_written: u64,
}

/// How often an agent's `last seen` is written while it keeps talking.
pub const SEEN_EVERY_MS: u64 = 5_000;

/// Whether `hello`, a new key under `agent`'s pinned name, may replace the
/// pinned key: it carries the launch token that enrolled the name (made for
/// that name alone by `--launcher`), not revoked or expired. A container
/// restarted with empty state (Kubernetes' `restartPolicy`, AWS Batch's
/// retries) comes back so with the same token and a new key; a token that
/// did not enrol the name, or one made for any name, re-keys nothing.
fn rekeys(agent: &str, hello: &Hello, known: &Known, token: Option<&TokenState>, now_ms: u64) -> bool {
    let (Some(e), Some(t)) = (&hello.enrol, token) else { return false };
    let enrolled_by = known.via.as_deref() == Some(&format!("token {}", crate::store::token_id(&e.token)));
    enrolled_by && t.names.iter().any(|n| n == agent) && !t.revoked && t.expires_ms.is_none_or(|x| now_ms < x)
}

/// A token bucket.
#[derive(Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, now: Instant, rate: f64, burst: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.level = (self.level + elapsed * rate).min(burst);
        if self.level >= 1.0 {
            self.level -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Half of the engine's time may go to Hellos while a fleet joins; the
/// other half stays with the trials of agents already working.
const HELLO_SHARE: f64 = 0.5;

/// The sustained rate of a kind of Hello, paced by what one costs the
/// engine (measured, a moving average) rather than by a fixed figure: a
/// fast machine welcomes a fleet quickly, a slow or busy one at what it can
/// spare, and a flood of Hellos never takes more than [`HELLO_SHARE`].
#[derive(Debug, Clone)]
pub struct HelloPace {
    cost_s: f64,
    floor: f64,
    ceiling: f64,
}

impl HelloPace {
    /// Known agents: until measured, 250 µs a Hello (2,000 a second).
    fn known() -> Self {
        HelloPace { cost_s: 250e-6, floor: 200.0, ceiling: 50_000.0 }
    }

    /// New keys (two signatures and a pin): until measured, 2.5 ms (200 a second).
    fn fresh() -> Self {
        HelloPace { cost_s: 2.5e-3, floor: 50.0, ceiling: 20_000.0 }
    }

    fn record(&mut self, took: std::time::Duration) {
        let took = took.as_secs_f64().clamp(1e-6, 1.0);
        self.cost_s = 0.9 * self.cost_s + 0.1 * took;
    }

    /// Hellos a second the engine can spare.
    pub fn rate(&self) -> f64 {
        (HELLO_SHARE / self.cost_s).clamp(self.floor, self.ceiling)
    }
}

/// Every agent's session.
pub struct Sessions {
    identity: Identity,
    instance: u64,
    started_unix_ms: u64,
    live: HashMap<String, Live>,
    /// Budget of Hellos from agents whose key is pinned, and what one costs.
    known: Bucket,
    known_pace: HelloPace,
    /// Budget of new pins, and what one costs.
    fresh: Bucket,
    fresh_pace: HelloPace,
    /// When each agent was last told its session is stale.
    stale_sent: HashMap<String, Instant>,
    /// When each name and key was last told why its Hello was refused:
    /// another key's Hellos under a name never use up its holder's.
    refused_sent: HashMap<(String, auth::PublicKey), Instant>,
    /// When each live agent was last told that another machine tried its
    /// name: at most one a minute, apart from every other notice's budget.
    holder_told: HashMap<String, Instant>,
    /// Budget of stale-session notices (each costs a signature).
    stale_budget: Bucket,
    /// Bound on pinned agents.
    pub max_agents: u64,
    /// Bound on the slots any one agent is given.
    pub max_slots: u32,
    /// Bound on the GPUs any one agent is given.
    pub max_gpus: u32,
    /// Pin any new key without a join token (a lab; logged loudly).
    pub open_enrolment: bool,
}

/// How a Hello was admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Its key is the one pinned for its name.
    Known,
    /// A new key, admitted by the join token with this public half.
    Token(auth::PublicKey),
    /// A new key, admitted by open enrolment.
    Open,
    /// A new key for a name whose key is pinned, admitted by the launch
    /// token that enrolled the name (a launched container restarted with
    /// empty state): the old key is replaced.
    Rekey(auth::PublicKey),
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
            known: Bucket { level: HELLO_BURST, at: Instant::now() },
            known_pace: HelloPace::known(),
            fresh: Bucket { level: NEW_PIN_BURST, at: Instant::now() },
            fresh_pace: HelloPace::fresh(),
            stale_sent: HashMap::new(),
            refused_sent: HashMap::new(),
            holder_told: HashMap::new(),
            stale_budget: Bucket { level: STALE_BURST, at: Instant::now() },
            max_agents: DEFAULT_MAX_AGENTS,
            max_slots: DEFAULT_MAX_SLOTS,
            max_gpus: DEFAULT_MAX_GPUS,
            open_enrolment: false,
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

    /// Every check of a Hello that needs neither the store nor a signature:
    /// its size, its signature's length, that it decodes, the name on its
    /// topic, and the coordinator instance it answers.
    pub fn peek_hello(&self, agent: &str, signed: &Signed) -> Result<Hello, HelloRefusal> {
        let hello = auth::peek_hello(signed)?;
        if hello.info.agent != agent {
            return Err(HelloRefusal::Name { claimed: hello.info.agent, topic: agent.to_string() });
        }
        if hello.coordinator_instance != self.instance {
            return Err(HelloRefusal::Instance { got: hello.coordinator_instance, this: self.instance });
        }
        if i64::try_from(hello.info.instance).is_err() || i64::try_from(hello.seq).is_err() {
            return Err(HelloRefusal::Invalid(format!(
                "instance {} or seq {} past the store's range",
                hello.info.instance, hello.seq
            )));
        }
        Ok(hello)
    }

    /// With what the store knows of the name (`known`) and of the join
    /// token the Hello names (`token`): the replay check (a Hello must come
    /// from a later process instance than the last accepted, or the same one
    /// with a higher number), admission, and the budget it spends.
    pub fn admit(
        &mut self,
        agent: &str,
        hello: &Hello,
        known: &Known,
        token: Option<&TokenState>,
        now: Instant,
        now_ms: u64,
    ) -> Result<Admission, HelloRefusal> {
        // Replays are of the pinned key's Hellos; a new key starts its own count.
        let same_key = known.pin.is_none_or(|k| k == hello.key);
        if let Some((last_instance, last_seq)) = known.last.filter(|_| same_key) {
            let (instance, seq) = (hello.info.instance, hello.seq);
            if instance < last_instance || (instance == last_instance && seq <= last_seq) {
                return Err(HelloRefusal::Replay { instance, seq, last_instance, last_seq });
            }
        }
        let admission = match known.pin {
            Some(k) if k == hello.key => Admission::Known,
            Some(_) if rekeys(agent, hello, known, token, now_ms) => {
                Admission::Rekey(hello.enrol.as_ref().map_or([0; 32], |e| e.token))
            }
            // Its holder is online: this is another machine, not the agent re-installed.
            Some(_) if self.live.contains_key(agent) => {
                return Err(HelloRefusal::NameInUse { agent: agent.to_string(), got: auth::hex(&hello.key) })
            }
            Some(k) => {
                return Err(HelloRefusal::KeyChanged {
                    agent: agent.to_string(),
                    got: auth::hex(&hello.key),
                    pinned: auth::hex(&k),
                })
            }
            None if known.pinned >= self.max_agents => {
                return Err(HelloRefusal::TooManyAgents { agent: agent.to_string(), max: self.max_agents })
            }
            None => match (&hello.enrol, token) {
                (Some(e), Some(t)) => {
                    let why = if t.revoked {
                        Some(("was revoked", RefusalKind::TokenRevoked))
                    } else if t.expires_ms.is_some_and(|x| now_ms >= x) {
                        Some(("has expired", RefusalKind::TokenExpired))
                    } else if t.uses_left == Some(0) {
                        Some(("has no uses left", RefusalKind::TokenUsedUp))
                    } else if !t.names.is_empty() && !t.names.iter().any(|n| n == agent) {
                        Some(("admits only the agents it was made for (a launcher's)", RefusalKind::TokenUnknown))
                    } else {
                        None
                    };
                    if let Some((why, kind)) = why {
                        return Err(HelloRefusal::BadToken {
                            agent: agent.to_string(),
                            token: t.id.clone(),
                            why: format!("{why}: ask the operator for a new one (tunefleet token create)"),
                            kind,
                        });
                    }
                    Admission::Token(e.token)
                }
                (Some(e), None) if !self.open_enrolment => {
                    return Err(HelloRefusal::BadToken {
                        agent: agent.to_string(),
                        token: auth::hex(&e.token[..4]),
                        why: "is not one of this coordinator's (tunefleet token list): the token is for another \
                              coordinator or another store"
                            .into(),
                        kind: RefusalKind::TokenUnknown,
                    })
                }
                _ if self.open_enrolment => Admission::Open,
                _ => return Err(HelloRefusal::NotEnrolled { agent: agent.to_string(), key: auth::hex(&hello.key) }),
            },
        };
        // A known key spends its budget before its signature is checked (the
        // budget bounds what a flood of them costs); a new key only once its
        // signatures are checked ([`Sessions::spend`]), so forged proofs
        // never spend the budget new agents need.
        if admission == Admission::Known {
            self.spend(&admission, now)?;
        }
        Ok(admission)
    }

    /// Takes one Hello of `admission`'s kind from its budget.
    pub fn spend(&mut self, admission: &Admission, now: Instant) -> Result<(), HelloRefusal> {
        let (bucket, rate, burst, what) = match admission {
            Admission::Known => (&mut self.known, self.known_pace.rate(), HELLO_BURST, "known agents"),
            _ => (&mut self.fresh, self.fresh_pace.rate(), NEW_PIN_BURST, "new agents"),
        };
        if !bucket.take(now, rate, burst) {
            return Err(HelloRefusal::RateLimited(what));
        }
        Ok(())
    }

    /// What an admitted Hello of `admission`'s kind cost the engine (its
    /// checks, signatures and store statements): the sustained rate of its
    /// budget follows.
    pub fn measured(&mut self, admission: &Admission, took: std::time::Duration) {
        match admission {
            Admission::Known => self.known_pace.record(took),
            _ => self.fresh_pace.record(took),
        }
    }

    /// The sustained Hello rates now (known agents, new keys), per second.
    pub fn hello_rates(&self) -> (f64, f64) {
        (self.known_pace.rate(), self.fresh_pace.rate())
    }

    /// The signatures: the Hello's, by the key it carries, and for a new key
    /// admitted by a join token, the token's proof.
    pub fn verify(&self, hello: &Hello, signed: &Signed, admission: &Admission) -> Result<Digest, HelloRefusal> {
        auth::verify_hello(hello, signed)?;
        if let (Admission::Token(_) | Admission::Rekey(_), Some(e)) = (admission, &hello.enrol) {
            auth::verify_enrolment(e, &hello.key, &hello.info.agent, &self.identity.public())?;
        }
        Ok(auth::sha256(&[&signed.body]))
    }

    /// Opens a session for a checked Hello: the Welcome payload to send.
    pub fn accept(&mut self, agent: &str, hello: &Hello, digest: Digest) -> Result<(SessionToken, Vec<u8>), AuthError> {
        let token = u64::from_le_bytes(auth::random_bytes::<8>()?);
        let (signed, session) = auth::welcome(&self.identity, agent, hello, digest, token)?;
        let payload = encode(&tunefleet_common::auth::DownFrame::Welcome(signed))?;
        let instance = hello.info.instance;
        self.live.insert(agent.to_string(), Live { session, will_hash: hello.will_hash, instance, seen_written: 0 });
        Ok((token, payload))
    }

    /// The payload telling `agent` (a name whose key is pinned) that its
    /// session with `token` is not held here, so it says Hello again: at
    /// most one per agent every 2 s, within a budget; `None` otherwise, or
    /// while it has a live session with another token being set up.
    pub fn stale_notice(&mut self, agent: &str, token: SessionToken, now: Instant) -> Option<Vec<u8>> {
        if self.stale_sent.get(agent).is_some_and(|at| now.saturating_duration_since(*at) < STALE_EVERY) {
            return None;
        }
        if !self.stale_budget.take(now, STALE_RATE, STALE_BURST) {
            return None;
        }
        if self.stale_sent.len() >= 100_000 {
            self.stale_sent.retain(|_, at| now.saturating_duration_since(*at) < STALE_EVERY);
        }
        self.stale_sent.insert(agent.to_string(), now);
        let stale = auth::StaleSession { agent: agent.to_string(), token };
        let signed = auth::sign_stale(&self.identity, &stale).ok()?;
        encode(&tunefleet_common::auth::DownFrame::Stale(signed)).ok()
    }

    /// The payload telling the agent that sent `signed` (a Hello, already
    /// decoded as `hello`) why it was refused, when the refusal is one it
    /// should hear ([`HelloRefusal::kind`]): signed, naming that Hello and
    /// its key. Only for a Hello whose own signature holds (a notice to a
    /// forger would be ignored anyway), at most one per name every 2 s,
    /// within a budget (each costs a verification and a signature); `None`
    /// otherwise.
    pub fn refusal_notice(
        &mut self,
        hello: &Hello,
        signed: &Signed,
        refusal: &HelloRefusal,
        now: Instant,
    ) -> Option<Vec<u8>> {
        let kind = refusal.kind()?;
        let agent = hello.info.agent.as_str();
        let told = (agent.to_string(), hello.key);
        if self.refused_sent.get(&told).is_some_and(|at| now.saturating_duration_since(*at) < STALE_EVERY) {
            return None;
        }
        if !self.stale_budget.take(now, STALE_RATE, STALE_BURST) {
            return None;
        }
        auth::verify_hello(hello, signed).ok()?;
        if self.refused_sent.len() >= 100_000 {
            self.refused_sent.retain(|_, at| now.saturating_duration_since(*at) < STALE_EVERY);
        }
        self.refused_sent.insert(told, now);
        let notice = auth::HelloRefused {
            agent: agent.to_string(),
            hello: auth::sha256(&[&signed.body]),
            key: hello.key,
            kind,
            message: refusal.to_string(),
        };
        let signed = auth::sign_refused(&self.identity, &notice).ok()?;
        encode(&tunefleet_common::auth::DownFrame::Refused(signed)).ok()
    }

    /// Whether `agent`, live, may be told now that another machine tried its
    /// name (one a minute each; a bounded table).
    pub fn tell_holder(&mut self, agent: &str, now: Instant) -> bool {
        const EVERY: std::time::Duration = std::time::Duration::from_secs(60);
        if !self.live.contains_key(agent)
            || self.holder_told.get(agent).is_some_and(|at| now.saturating_duration_since(*at) < EVERY)
        {
            return false;
        }
        if self.holder_told.len() >= 100_000 {
            self.holder_told.retain(|_, at| now.saturating_duration_since(*at) < EVERY);
        }
        self.holder_told.insert(agent.to_string(), now);
        true
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

    /// `agent`'s session was heard from at `now_ms`: whether to write it
    /// down as its `last seen` (at most once per [`SEEN_EVERY_MS`]).
    pub fn heard(&mut self, agent: &str, now_ms: u64) -> bool {
        match self.live.get_mut(agent) {
            Some(live) if now_ms.saturating_sub(live.seen_written) >= SEEN_EVERY_MS => {
                live.seen_written = now_ms;
                true
            }
            _ => false,
        }
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
    use tunefleet_common::auth::{DownFrame, JoinToken, UpFrame};
    use tunefleet_common::decode;
    use tunefleet_common::message::{AgentInfo, WorkRequest};

    fn info(agent: &str, instance: u64) -> AgentInfo {
        AgentInfo::minimal(agent, instance)
    }

    fn sessions() -> Sessions {
        Sessions::new(Identity::generate().expect("key").0, 77, 1)
    }

    fn valid(id: &str) -> TokenState {
        TokenState { id: id.into(), expires_ms: Some(1_000), uses_left: Some(1), revoked: false, names: vec![] }
    }

    /// A Hello of `agent` (process `instance`, number `seq`), with a join
    /// token's proof when `token` is given.
    fn hello_of(id: &Identity, agent: &str, instance: u64, seq: u64, token: Option<&JoinToken>) -> Signed {
        let enrol = token.map(|t| t.prove(&id.public(), agent).expect("proof"));
        auth::hello(id, info(agent, instance), 77, seq, [0; 32], enrol).expect("hello").0
    }

    fn admit(
        s: &mut Sessions,
        signed: &Signed,
        known: &Known,
        token: Option<&TokenState>,
    ) -> Result<Admission, HelloRefusal> {
        let hello = s.peek_hello(&auth::peek_hello(signed).expect("peek").info.agent, signed)?;
        let agent = hello.info.agent.clone();
        let a = s.admit(&agent, &hello, known, token, Instant::now(), 10)?;
        s.verify(&hello, signed, &a)?;
        Ok(a)
    }

    #[test]
    fn a_new_key_needs_a_valid_join_token_for_this_coordinator_and_name() {
        let mut s = sessions();
        let agent = Identity::generate().expect("key").0;
        let token = JoinToken::generate(&s.public_key()).expect("token");
        let new = Known::default();
        // No token: refused, with the two ways in.
        let bare = hello_of(&agent, "a", 1, 1, None);
        let Err(e) = admit(&mut s, &bare, &new, None) else { panic!("admitted without a token") };
        assert!(matches!(e, HelloRefusal::NotEnrolled { .. }), "{e}");
        assert!(e.to_string().contains("tunefleet token create") && e.to_string().contains("agents trust a"), "{e}");
        // A valid token: admitted by it.
        let good = hello_of(&agent, "a", 1, 1, Some(&token));
        assert_eq!(admit(&mut s, &good, &new, Some(&valid("t"))), Ok(Admission::Token(token.public().expect("pub"))));
        // The same token, but revoked, expired, used up, or unknown to the store.
        for (state, why) in [
            (TokenState { revoked: true, ..valid("t") }, "revoked"),
            (TokenState { expires_ms: Some(10), ..valid("t") }, "expired"),
            (TokenState { uses_left: Some(0), ..valid("t") }, "no uses left"),
            (TokenState { names: vec!["launched-1".into()], ..valid("t") }, "made for"),
        ] {
            let Err(e) = admit(&mut s, &good, &new, Some(&state)) else { panic!("admitted: {why}") };
            assert!(e.to_string().contains(why), "{e}");
        }
        assert!(matches!(admit(&mut s, &good, &new, None), Err(HelloRefusal::BadToken { .. })));
        // A proof copied into a Hello of another key or name does not verify.
        let mallory = Identity::generate().expect("key").0;
        let stolen = token.prove(&agent.public(), "a").expect("proof");
        let copied = auth::hello(&mallory, info("a", 1), 77, 1, [0; 32], Some(stolen.clone())).expect("hello").0;
        assert!(matches!(
            admit(&mut s, &copied, &new, Some(&valid("t"))),
            Err(HelloRefusal::Auth(AuthError::Signature))
        ));
        let renamed = auth::hello(&agent, info("b", 1), 77, 1, [0; 32], Some(stolen)).expect("hello").0;
        assert!(matches!(
            admit(&mut s, &renamed, &new, Some(&valid("t"))),
            Err(HelloRefusal::Auth(AuthError::Signature))
        ));
        // A token made for another coordinator does not verify here.
        let other = JoinToken::generate(&Identity::generate().expect("key").0.public()).expect("token");
        let elsewhere = hello_of(&agent, "a", 1, 1, Some(&other));
        assert!(matches!(
            admit(&mut s, &elsewhere, &new, Some(&valid("o"))),
            Err(HelloRefusal::Auth(AuthError::Signature))
        ));
        // The pinned key needs no token; another key under a pinned name is refused.
        let pinned = Known { pin: Some(agent.public()), ..Known::default() };
        assert_eq!(admit(&mut s, &bare, &pinned, None), Ok(Admission::Known));
        let other_key = Known { pin: Some([9; 32]), ..Known::default() };
        assert!(matches!(admit(&mut s, &good, &other_key, Some(&valid("t"))), Err(HelloRefusal::KeyChanged { .. })));
        // The bound on agents holds for token holders too.
        s.max_agents = 1;
        let full = Known { pinned: 1, ..Known::default() };
        assert!(matches!(admit(&mut s, &good, &full, Some(&valid("t"))), Err(HelloRefusal::TooManyAgents { .. })));
        // Open enrolment admits a bare new key.
        s.max_agents = 10;
        s.open_enrolment = true;
        assert_eq!(admit(&mut s, &bare, &new, None), Ok(Admission::Open));
    }

    #[test]
    fn regression_an_old_hello_is_a_replay_however_many_restarts_ago() {
        let mut s = sessions();
        let agent = Identity::generate().expect("key").0;
        let first = hello_of(&agent, "a", 100, 1, None);
        let known =
            |instance, seq| Known { pin: Some(agent.public()), last: Some((instance, seq)), ..Known::default() };
        assert_eq!(admit(&mut s, &first, &known(99, 7), None), Ok(Admission::Known));
        // 40 restarts later (the store keeps only the last instance and seq),
        // the first process's Hello is still a replay.
        assert!(matches!(admit(&mut s, &first, &known(140, 1), None), Err(HelloRefusal::Replay { .. })));
        // The same process: a higher number passes, the same or a lower one does not.
        assert!(matches!(admit(&mut s, &first, &known(100, 1), None), Err(HelloRefusal::Replay { .. })));
        let second = hello_of(&agent, "a", 100, 2, None);
        assert_eq!(admit(&mut s, &second, &known(100, 1), None), Ok(Admission::Known));
    }

    #[test]
    fn junk_never_spends_a_budget_and_new_keys_never_spend_the_known_agents_one() {
        let mut s = sessions();
        let known_agent = Identity::generate().expect("key").0;
        let pinned = Known { pin: Some(known_agent.public()), ..Known::default() };
        let now = Instant::now();
        // Oversized, short signatures, other names and other instances fail before any budget.
        let good = hello_of(&known_agent, "k", 1, 1, None);
        let big = Signed { body: vec![0; auth::MAX_HELLO_BYTES + 1], signature: good.signature.clone() };
        assert!(matches!(s.peek_hello("k", &big), Err(HelloRefusal::Auth(AuthError::Codec(_)))));
        let short = Signed { signature: vec![0; 4], ..good.clone() };
        assert_eq!(s.peek_hello("k", &short).map(|_| ()), Err(HelloRefusal::Auth(AuthError::Signature)));
        assert!(matches!(s.peek_hello("other", &good), Err(HelloRefusal::Name { .. })));
        let junk = Signed { body: vec![7, 1, 2, 3], signature: vec![0; 64] };
        assert!(s.peek_hello("k", &junk).is_err());
        // New keys drain their own budget...
        s.open_enrolment = true;
        let stranger = Identity::generate().expect("key").0;
        let fresh_hello = auth::peek_hello(&hello_of(&stranger, "n", 1, 1, None)).expect("peek");
        // (a new key's admission spends nothing until its signatures hold:
        // the engine then spends, so forged proofs never drain it).
        let drained = (0..NEW_PIN_BURST as usize + 5)
            .filter(|_| {
                let a = s.admit("n", &fresh_hello, &Known::default(), None, now, 0);
                assert_eq!(a, Ok(Admission::Open), "admission itself spends nothing for a new key");
                s.spend(&Admission::Open, now) == Err(HelloRefusal::RateLimited("new agents"))
            })
            .count();
        assert_eq!(drained, 5, "the burst passes, the rest is dropped");
        // ... while a known agent still gets in, and new keys wait for the refill.
        let hello = s.peek_hello("k", &good).expect("peek");
        assert_eq!(s.admit("k", &hello, &pinned, None, now, 0), Ok(Admission::Known));
        let later = now + std::time::Duration::from_secs(1);
        assert_eq!(s.spend(&Admission::Open, later), Ok(()));
    }

    #[test]
    fn the_hello_rate_follows_what_a_hello_costs() {
        let (mut cheap, mut dear) = (HelloPace::fresh(), HelloPace::fresh());
        for _ in 0..100 {
            cheap.record(std::time::Duration::from_micros(100));
            dear.record(std::time::Duration::from_millis(20));
        }
        // Half the engine's time: 5,000 a second at 100 µs, 25 at 20 ms (held at the floor).
        assert!((cheap.rate() - 5_000.0).abs() < 50.0, "{}", cheap.rate());
        assert_eq!(dear.rate(), 50.0);
        // Spent through a session's budget: after the burst, time refills what the pace says.
        let (identity, _) = Identity::generate().expect("key");
        let mut s = Sessions::new(identity, 1, 0);
        let now = Instant::now();
        while s.spend(&Admission::Open, now).is_ok() {}
        for _ in 0..100 {
            s.measured(&Admission::Open, std::time::Duration::from_micros(100));
        }
        // (0.3 s: under the burst, which caps any refill.)
        let later = now + std::time::Duration::from_millis(300);
        let refilled = std::iter::from_fn(|| s.spend(&Admission::Open, later).ok()).take(10_000).count();
        assert!((1_450..=1_500).contains(&refilled), "{refilled} new pins in 0.3 s after measuring 100 µs each");
        assert!(s.hello_rates().1 > 4_900.0);
    }

    #[test]
    fn a_refused_agent_is_told_why_signed_for_its_own_hello_only() {
        let mut s = sessions();
        let agent = Identity::generate().expect("key").0;
        let signed = hello_of(&agent, "a", 1, 1, None);
        let hello = s.peek_hello("a", &signed).expect("peek");
        let now = Instant::now();
        let refusal = s.admit("a", &hello, &Known::default(), None, now, 0).expect_err("not enrolled");
        let notice = s.refusal_notice(&hello, &signed, &refusal, now).expect("a notice");
        let Ok(tunefleet_common::auth::DownFrame::Refused(n)) = decode(&notice) else { panic!("not a refusal") };
        let told = auth::open_refused(&s.public_key(), &n).expect("signed by the coordinator");
        assert_eq!((told.agent.as_str(), told.kind, told.key), ("a", RefusalKind::NotEnrolled, agent.public()));
        assert_eq!(told.hello, auth::sha256(&[&signed.body]), "it names the Hello it answers");
        assert!(told.message.contains("tunefleet token create"), "{}", told.message);
        assert_eq!(s.refusal_notice(&hello, &signed, &refusal, now), None, "one per name and key every 2 s");
        // Another key's Hellos under the name are told apart: they use up nothing of the first's.
        let other = Identity::generate().expect("key").0;
        let signed2 = hello_of(&other, "a", 1, 1, None);
        let hello2 = s.peek_hello("a", &signed2).expect("peek");
        let r2 = s.admit("a", &hello2, &Known::default(), None, now, 0).expect_err("not enrolled");
        assert!(s.refusal_notice(&hello2, &signed2, &r2, now).is_some(), "another key under the name");
        // A Hello whose signature does not hold is told nothing.
        let forged = Signed { signature: vec![0; 64], ..hello_of(&agent, "b", 1, 1, None) };
        let fh = s.peek_hello("b", &forged).expect("peek");
        let r = s.admit("b", &fh, &Known::default(), None, now, 0).expect_err("refused");
        assert_eq!(s.refusal_notice(&fh, &forged, &r, now), None);
        // A budget is not a refusal the agent is told of.
        assert_eq!(s.refusal_notice(&hello, &signed, &HelloRefusal::RateLimited("x"), now + STALE_EVERY), None);
    }

    #[test]
    fn a_session_opens_and_seals_both_ways_and_only_the_live_will_counts() {
        let mut s = sessions();
        let agent = Identity::generate().expect("key").0;
        let (will, hash) = auth::new_will(1).expect("will");
        let (signed, pending) = auth::hello(&agent, info("a", 1), 77, 1, hash, None).expect("hello");
        let (hello, digest) = auth::open_hello(&signed).expect("ok");
        assert_eq!(s.will("a", &will), WillCheck::NoSession);
        let (_, payload) = s.accept("a", &hello, digest).expect("accept");
        let Ok(DownFrame::Welcome(w)) = decode::<DownFrame>(&payload) else { panic!("not a welcome") };
        let mut agent_side = pending.finish("a", &s.public_key(), &w).expect("agent opens the session");
        let (kind, up) = agent_side
            .seal_agent(&AgentMessage::Request(WorkRequest {
                seq: 1,
                free: 1,
                ahead: 0,
                running: vec![],
                held: vec![],
            }))
            .expect("seal");
        let Ok(UpFrame::Sealed(sealed)) = decode::<UpFrame>(&up) else { panic!("not sealed") };
        assert!(s.open("a", kind, &sealed).is_ok());
        assert_eq!(s.open("b", kind, &sealed), Err(AuthError::NoSession));
        let (forged, _) = auth::new_will(1).expect("will");
        assert_eq!(s.will("a", &forged), WillCheck::Forged);
        assert_eq!(s.will("a", &Will { instance: 2, ..will.clone() }), WillCheck::Forged);
        assert_eq!(s.will("a", &will), WillCheck::Live);
        assert_eq!(s.will("a", &will), WillCheck::NoSession, "used once");
    }

    #[test]
    fn stale_session_notices_are_signed_and_bounded_per_agent() {
        let mut s = sessions();
        let now = Instant::now();
        let notice = s.stale_notice("a", 42, now).expect("a notice");
        let Ok(DownFrame::Stale(signed)) = decode::<DownFrame>(&notice) else { panic!("not a notice") };
        let stale = auth::open_stale(&s.public_key(), &signed).expect("signed by the coordinator");
        assert_eq!((stale.agent.as_str(), stale.token), ("a", 42));
        assert_eq!(s.stale_notice("a", 43, now), None, "one per agent every 2 s");
        assert!(s.stale_notice("b", 1, now).is_some(), "another agent has its own");
        assert!(s.stale_notice("a", 43, now + STALE_EVERY).is_some());
        let sent = (0..5_000).filter(|i| s.stale_notice(&format!("n{i}"), 1, now).is_some()).count();
        assert!(sent < 1_100, "a flood under new names is bounded by the budget: {sent}");
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
