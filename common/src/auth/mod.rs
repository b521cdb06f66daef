//! Message authentication between agents and their coordinator.
//!
//! No broker is trusted to tell who sent what (an external one may have no
//! ACLs): every message proves its origin on its own:
//!
//! * **Identities.** The coordinator and every agent keep an Ed25519 key
//!   pair in their state directories ([`Identity`]). An agent pins the
//!   coordinator's public key (given, or the first one seen); the
//!   coordinator pins each agent's key per agent name in its store.
//! * **Coordinator status** (retained): [`CoordinatorStatus`] signed with
//!   the coordinator's key, carrying its instance and start time.
//! * **Session** (once per connection): the agent's [`Hello`] is signed with
//!   its key and carries a fresh X25519 public key, the coordinator instance
//!   it answers, a per-process sequence number, and the hash of its Last
//!   Will's secret. The coordinator's [`Welcome`] is signed with its key and
//!   carries its own fresh X25519 key, the hash of the Hello it answers and
//!   the session token. Both sides derive two ChaCha20-Poly1305 keys (one
//!   per direction) from the X25519 agreement with HKDF over that transcript.
//! * **Every other message** is [`Sealed`]: session token, sequence number,
//!   and the body encrypted and authenticated (ChaCha20-Poly1305) with the
//!   direction's key, the agent name, topic kind, token and sequence number
//!   as associated data and the sequence number as the nonce. No one but
//!   the two ends reads a trial's argv, env, results or energy: not another
//!   member, not a stranger on an open broker, not the operator of an
//!   external broker. A receiver takes only strictly increasing sequence
//!   numbers, so a replay within a session is refused, and a replay from
//!   another session fails to open.
//! * **Last Will**: fixed at connect time, before any session exists. It
//!   carries a random secret drawn for that connection whose hash the Hello
//!   committed to, so a forger cannot fire it and a captured one matches no
//!   later session.
//!
//! Why this design: an Ed25519 verification costs tens of microseconds and a
//! trial takes four messages; sealing one with ChaCha20-Poly1305 costs about
//! one microsecond. Signatures are used once per session (Hello, Welcome),
//! per broker login ([`login`]) and per coordinator start (status). All
//! primitives come from `ring`, which the TLS stack already brings in.

use std::path::{Path, PathBuf};

use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use ring::{aead, agreement, digest, hkdf};
use serde::{Deserialize, Serialize};

use crate::message::{AgentInfo, AgentMessage, CoordinatorMessage, CoordinatorStatus, SessionToken};
use crate::topic::AgentTopic;
use crate::{decode, encode, CodecError};

/// An Ed25519 public key.
pub type PublicKey = [u8; 32];
/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// Why a message or a key was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("bad signature")]
    Signature,
    #[error("does not open: not sealed by this session's key, or changed on the way")]
    Mac,
    #[error("no session with this agent (or it ended)")]
    NoSession,
    #[error("session token {got:#x} is not the current session's")]
    Token { got: SessionToken },
    #[error("sequence number {got} replayed or out of order (last {last})")]
    Replay { got: u64, last: u64 },
    #[error("key agreement failed")]
    Agreement,
    #[error("the Welcome answers another Hello")]
    OtherHello,
    #[error("signed by key {got}, but {expected} is pinned")]
    KeyChanged { got: String, expected: String },
    #[error("{0}")]
    Codec(#[from] CodecError),
    #[error("a {got} message on the {topic} topic")]
    WrongTopic { got: &'static str, topic: &'static str },
    #[error("random number generator failed")]
    Random,
}

/// Key-file failures.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{action} {path}: {source}")]
    Io { action: &'static str, path: PathBuf, source: std::io::Error },
    #[error("{path}: not an Ed25519 key in PKCS#8 form")]
    Parse { path: PathBuf },
    #[error("{path}: not a public key (64 hex digits)")]
    PublicKey { path: PathBuf },
    #[error("random number generator failed")]
    Random,
}

/// Hex form of a key, for logs and files.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key shortened for logs: its first 8 bytes in hex and an ellipsis, so
/// a log line never wraps on a 64-digit key (`tunefleet key` and
/// `tunefleet-agent key` print keys whole).
pub fn short_key(key: &[u8]) -> String {
    let shown = key.get(..8).unwrap_or(key);
    format!("{}…", hex(shown))
}

/// Parses 64 hex digits.
pub fn parse_public_key(text: &str) -> Option<PublicKey> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// SHA-256 of `parts`, in order.
pub fn sha256(parts: &[&[u8]]) -> Digest {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// Fresh random bytes from the operating system.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], AuthError> {
    let mut out = [0u8; N];
    SystemRandom::new().fill(&mut out).map_err(|_| AuthError::Random)?;
    Ok(out)
}

/// A long-term Ed25519 key pair.
pub struct Identity {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({})", hex(&self.public()))
    }
}

impl Identity {
    /// A new key pair and its PKCS#8 encoding (what [`Identity::load_or_create`] stores).
    pub fn generate() -> Result<(Identity, Vec<u8>), AuthError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| AuthError::Random)?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| AuthError::Random)?;
        Ok((Identity { pair }, doc.as_ref().to_vec()))
    }

    /// Loads the key at `path`, or creates it there (mode 0600, fsynced,
    /// directory created) when there is none. Returns whether it was created.
    pub fn load_or_create(path: &Path) -> Result<(Identity, bool), KeyFileError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let pair =
                    Ed25519KeyPair::from_pkcs8(&bytes).map_err(|_| KeyFileError::Parse { path: path.to_path_buf() })?;
                Ok((Identity { pair }, false))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (identity, pkcs8) = Identity::generate().map_err(|_| KeyFileError::Random)?;
                if write_private(path, &pkcs8, false)? {
                    Ok((identity, true))
                } else {
                    // Another process created it meanwhile: use theirs.
                    Identity::load_or_create(path)
                }
            }
            Err(source) => Err(KeyFileError::Io { action: "read", path: path.to_path_buf(), source }),
        }
    }

    pub fn public(&self) -> PublicKey {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.pair.public_key().as_ref());
        out
    }

    fn sign(&self, domain: &[u8], body: &[u8]) -> Vec<u8> {
        let mut msg = Vec::with_capacity(domain.len() + body.len());
        msg.extend_from_slice(domain);
        msg.extend_from_slice(body);
        self.pair.sign(&msg).as_ref().to_vec()
    }
}

/// Writes a secret file: a temporary file of its own (0600), fsync,
/// then a rename (`replace`) or a hard link that fails when the file exists
/// (not `replace`: two processes creating the same key agree on one), and
/// an fsync of the directory. Returns false when the file existed.
fn write_private(path: &Path, bytes: &[u8], replace: bool) -> Result<bool, KeyFileError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io = |action, source| KeyFileError::Io { action, path: path.to_path_buf(), source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.exists() {
        // A directory made for a secret is its owner's alone.
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io("create the directory of", e))?;
    }
    let unique = random_bytes::<8>().map_err(|_| KeyFileError::Random)?;
    let tmp = path.with_extension(format!("tmp-{}", hex(&unique)));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("create", e))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(|e| io("write", e))?;
    let created = if replace {
        std::fs::rename(&tmp, path).map_err(|e| io("rename", e))?;
        true
    } else {
        let linked = std::fs::hard_link(&tmp, path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(io("create", e)),
        }
    };
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("sync the directory of", e))?;
    Ok(created)
}

/// The instance of a new agent (or coordinator) process: above every
/// earlier one this state file has seen and, so that an instance is never
/// reused even when the file is lost, no lower than the wall clock in
/// microseconds. Written durably before use. Without a file, the clock alone.
pub fn next_instance(file: Option<&Path>) -> Result<u64, KeyFileError> {
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    let Some(path) = file else { return Ok(clock) };
    let last = match std::fs::read_to_string(path) {
        Ok(text) => text.trim().parse::<u64>().unwrap_or(0),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(source) => return Err(KeyFileError::Io { action: "read", path: path.to_path_buf(), source }),
    };
    let next = clock.max(last.saturating_add(1));
    write_counter(path, next)?;
    Ok(next)
}

/// Writes a secret (a join token), mode 0600, durably, replacing the file.
pub fn write_secret(path: &Path, text: &str) -> Result<(), KeyFileError> {
    write_private(path, format!("{text}\n").as_bytes(), true).map(|_| ())
}

/// Writes a counter file (decimal and a newline), durably.
pub fn write_counter(path: &Path, value: u64) -> Result<(), KeyFileError> {
    write_private(path, format!("{value}\n").as_bytes(), true).map(|_| ())
}

/// Reads a pinned public key file (64 hex digits); `None` when there is none.
pub fn read_public_key(path: &Path) -> Result<Option<PublicKey>, KeyFileError> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            parse_public_key(&text).map(Some).ok_or_else(|| KeyFileError::PublicKey { path: path.to_path_buf() })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KeyFileError::Io { action: "read", path: path.to_path_buf(), source }),
    }
}

/// Writes a public key file (64 hex digits and a newline), durably.
pub fn write_public_key(path: &Path, key: &PublicKey) -> Result<(), KeyFileError> {
    write_private(path, format!("{}\n", hex(key)).as_bytes(), true).map(|_| ())
}

fn verify(key: &PublicKey, domain: &[u8], body: &[u8], signature: &[u8]) -> Result<(), AuthError> {
    let mut msg = Vec::with_capacity(domain.len() + body.len());
    msg.extend_from_slice(domain);
    msg.extend_from_slice(body);
    UnparsedPublicKey::new(&ED25519, key).verify(&msg, signature).map_err(|_| AuthError::Signature)
}

const DOMAIN_HELLO: &[u8] = b"tunefleet v3 hello\0";
const DOMAIN_WELCOME: &[u8] = b"tunefleet v3 welcome\0";
const DOMAIN_STATUS: &[u8] = b"tunefleet v3 coordinator status\0";
const DOMAIN_ENROL: &[u8] = b"tunefleet v4 enrolment\0";
pub(crate) const DOMAIN_STALE: &[u8] = b"tunefleet v4 stale session\0";
pub(crate) const DOMAIN_REFUSED: &[u8] = b"tunefleet v5 hello refused\0";

/// Largest signed Hello body the coordinator opens; checked before the body
/// is decoded or its signature verified.
pub const MAX_HELLO_BYTES: usize = 16 * 1024;
/// Length of an Ed25519 signature.
pub const SIGNATURE_BYTES: usize = 64;

/// SHA-256 of a coordinator's public key: what a join token carries, so an
/// agent pins the coordinator from the token, never from a broker topic.
pub fn fingerprint(key: &PublicKey) -> Digest {
    sha256(&[b"tunefleet coordinator key\0", key])
}

/// Why a join token does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "not a join token: expected {JOIN_PREFIX}<64 hex digits>.<64 hex digits>, as `tunefleet token create` prints it"
)]
pub struct BadJoinToken;

/// How a join token starts.
pub const JOIN_PREFIX: &str = "tfjoin1.";

/// A join token (`tunefleet token create`): the fingerprint of the
/// coordinator's key and a secret, the seed of an Ed25519 key whose public
/// half the coordinator keeps. The agent pins the coordinator whose key
/// matches the fingerprint, and proves it holds the secret by signing its
/// own key and name with it ([`Enrolment`]); the proof travels on a shared
/// topic but is worthless for any other key or name.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    pub fingerprint: Digest,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JoinToken(coordinator {}, secret hidden)", hex(&self.fingerprint[..8]))
    }
}

impl std::fmt::Display for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{JOIN_PREFIX}{}.{}", hex(&self.fingerprint), hex(&self.secret))
    }
}

impl std::str::FromStr for JoinToken {
    type Err = BadJoinToken;
    fn from_str(text: &str) -> Result<Self, BadJoinToken> {
        let rest = text.trim().strip_prefix(JOIN_PREFIX).ok_or(BadJoinToken)?;
        let (fp, secret) = rest.split_once('.').ok_or(BadJoinToken)?;
        Ok(JoinToken {
            fingerprint: parse_public_key(fp).ok_or(BadJoinToken)?,
            secret: parse_public_key(secret).ok_or(BadJoinToken)?,
        })
    }
}

impl JoinToken {
    /// A new token for the coordinator holding `coordinator`.
    pub fn generate(coordinator: &PublicKey) -> Result<JoinToken, AuthError> {
        Ok(JoinToken { fingerprint: fingerprint(coordinator), secret: random_bytes::<32>()? })
    }

    fn pair(&self) -> Result<Ed25519KeyPair, AuthError> {
        Ed25519KeyPair::from_seed_unchecked(&self.secret).map_err(|_| AuthError::Random)
    }

    /// The token's public half: what the coordinator stores (the secret
    /// itself is never stored, nor can it be derived from this).
    pub fn public(&self) -> Result<PublicKey, AuthError> {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.pair()?.public_key().as_ref());
        Ok(out)
    }

    /// Whether `key` is the coordinator this token is for.
    pub fn admits_coordinator(&self, key: &PublicKey) -> bool {
        same(&fingerprint(key), &self.fingerprint)
    }

    /// Proof, for a Hello, that the agent holding `agent_key` under `name`
    /// was given this token.
    pub fn prove(&self, agent_key: &PublicKey, name: &str) -> Result<Enrolment, AuthError> {
        let pair = self.pair()?;
        let msg = enrolment_message(agent_key, name, &self.fingerprint);
        let mut token = [0u8; 32];
        token.copy_from_slice(pair.public_key().as_ref());
        Ok(Enrolment { token, signature: pair.sign(&msg).as_ref().to_vec() })
    }
}

fn enrolment_message(agent_key: &PublicKey, name: &str, coordinator: &Digest) -> Vec<u8> {
    let mut msg = Vec::with_capacity(DOMAIN_ENROL.len() + 64 + name.len() + 1);
    msg.extend_from_slice(DOMAIN_ENROL);
    msg.extend_from_slice(coordinator);
    msg.extend_from_slice(agent_key);
    msg.extend_from_slice(name.as_bytes());
    msg
}

/// A Hello's proof that its agent holds a join token: the token's public
/// half and its signature over the coordinator's fingerprint, the agent's
/// key and its name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrolment {
    pub token: PublicKey,
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
}

/// Checks `enrolment` for the agent holding `agent_key` under `name`, at the
/// coordinator holding `coordinator` (the caller looks the token up).
pub fn verify_enrolment(
    enrolment: &Enrolment,
    agent_key: &PublicKey,
    name: &str,
    coordinator: &PublicKey,
) -> Result<(), AuthError> {
    let msg = enrolment_message(agent_key, name, &fingerprint(coordinator));
    UnparsedPublicKey::new(&ED25519, enrolment.token)
        .verify(&msg, &enrolment.signature)
        .map_err(|_| AuthError::Signature)
}

/// A signed body: the encoded message and the Ed25519 signature over it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
}

/// An agent asks for a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub info: AgentInfo,
    /// The agent's long-term Ed25519 key (pinned by the coordinator).
    pub key: PublicKey,
    /// A fresh X25519 public key for this session.
    pub exchange: [u8; 32],
    /// The coordinator instance this Hello is for (from its signed status).
    pub coordinator_instance: u64,
    /// Grows with every Hello of this agent process (`info.instance`).
    pub seq: u64,
    /// SHA-256 of the secret in this connection's Last Will.
    pub will_hash: Digest,
    /// Proof of a join token, for a coordinator that does not know this
    /// agent's key yet.
    pub enrol: Option<Enrolment>,
}

/// The coordinator opens a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The agent process the session belongs to.
    pub agent_instance: u64,
    /// SHA-256 of the Hello's body this answers.
    pub hello: Digest,
    pub token: SessionToken,
    /// The coordinator's fresh X25519 public key.
    pub exchange: [u8; 32],
}

/// An agent's Last Will, published by the broker when the connection drops.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Will {
    pub instance: u64,
    /// Random per connection; its hash was in the Hello.
    pub secret: [u8; 32],
}

/// A message inside a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub token: SessionToken,
    pub seq: u64,
    /// The encoded message, encrypted, and its 16-byte tag.
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

/// Everything an agent publishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpFrame {
    /// A signed [`Hello`].
    Hello(Signed),
    Will(Will),
    Sealed(Sealed),
}

/// Everything the coordinator publishes to one agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownFrame {
    /// A signed [`Welcome`].
    Welcome(Signed),
    Sealed(Sealed),
    /// A signed [`StaleSession`]: on the Welcome topic.
    Stale(Signed),
    /// A signed [`HelloRefused`]: on the Welcome topic. Since protocol 12.
    Refused(Signed),
}

mod login;
mod notice;
pub use login::{login_password, parse_login, LoginProof, LOGIN_PREFIX};
pub use notice::{open_refused, open_stale, sign_refused, sign_stale, HelloRefused, RefusalKind, StaleSession};

/// Signs the coordinator's status.
pub fn sign_status(identity: &Identity, status: &CoordinatorStatus) -> Result<Signed, AuthError> {
    let body = encode(status)?;
    let signature = identity.sign(DOMAIN_STATUS, &body);
    Ok(Signed { body, signature })
}

/// Checks a signed coordinator status against the key it names (the caller
/// checks that key against its pin).
pub fn open_status(signed: &Signed) -> Result<CoordinatorStatus, AuthError> {
    let status: CoordinatorStatus = decode(&signed.body)?;
    verify(&status.key, DOMAIN_STATUS, &signed.body, &signed.signature)?;
    Ok(status)
}

/// The Last Will of one connection and the hash its Hello commits to.
pub fn new_will(instance: u64) -> Result<(Will, Digest), AuthError> {
    let secret = random_bytes::<32>()?;
    Ok((Will { instance, secret }, sha256(&[&secret])))
}

/// Whether `will` is the one whose hash a session committed to.
pub fn will_matches(will: &Will, hash: &Digest) -> bool {
    same(&sha256(&[&will.secret]), hash)
}

/// Compares two byte strings in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An agent's half-open handshake: what it needs to read the Welcome.
pub struct PendingHello {
    private: agreement::EphemeralPrivateKey,
    digest: Digest,
    instance: u64,
}

impl std::fmt::Debug for PendingHello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingHello({})", hex(&self.digest[..8]))
    }
}

/// Builds an agent's signed Hello.
pub fn hello(
    identity: &Identity,
    info: AgentInfo,
    coordinator_instance: u64,
    seq: u64,
    will_hash: Digest,
    enrol: Option<Enrolment>,
) -> Result<(Signed, PendingHello), AuthError> {
    let rng = SystemRandom::new();
    let private = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rng).map_err(|_| AuthError::Random)?;
    let public = private.compute_public_key().map_err(|_| AuthError::Agreement)?;
    let mut exchange = [0u8; 32];
    exchange.copy_from_slice(public.as_ref());
    let instance = info.instance;
    let body = encode(&Hello { info, key: identity.public(), exchange, coordinator_instance, seq, will_hash, enrol })?;
    let signature = identity.sign(DOMAIN_HELLO, &body);
    let digest = sha256(&[&body]);
    Ok((Signed { body, signature }, PendingHello { private, digest, instance }))
}

/// Checks a Hello's signature against the key it carries (the caller checks
/// that key against its pin); returns it with the digest of its body.
pub fn open_hello(signed: &Signed) -> Result<(Hello, Digest), AuthError> {
    let hello = peek_hello(signed)?;
    verify_hello(&hello, signed)?;
    Ok((hello, sha256(&[&signed.body])))
}

/// The cheap half of [`open_hello`]: bounds the sizes and decodes the
/// Hello, without verifying its signature (an Ed25519 verification costs
/// tens of microseconds; a flood of junk must not buy them).
pub fn peek_hello(signed: &Signed) -> Result<Hello, AuthError> {
    if signed.body.len() > MAX_HELLO_BYTES {
        return Err(AuthError::Codec(CodecError::TooLarge { size: signed.body.len(), max: MAX_HELLO_BYTES }));
    }
    if signed.signature.len() != SIGNATURE_BYTES {
        return Err(AuthError::Signature);
    }
    Ok(decode(&signed.body)?)
}

/// The expensive half of [`open_hello`]: the signature, by the key the Hello carries.
pub fn verify_hello(hello: &Hello, signed: &Signed) -> Result<(), AuthError> {
    verify(&hello.key, DOMAIN_HELLO, &signed.body, &signed.signature)
}

fn derive(shared: &[u8], transcript: &Digest) -> Keys {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, transcript).extract(shared);
    let key = |info: &'static [u8]| -> Option<aead::LessSafeKey> {
        // Expanding 32 bytes of SHA-256 output never exceeds HKDF's limit.
        let info = [info];
        let okm = prk.expand(&info, &aead::CHACHA20_POLY1305).ok()?;
        Some(aead::LessSafeKey::new(aead::UnboundKey::from(okm)))
    };
    Keys { up: key(b"tunefleet v14 up"), down: key(b"tunefleet v14 down") }
}

fn transcript(hello: &Digest, exchange: &[u8; 32], token: SessionToken) -> Digest {
    sha256(&[b"tunefleet v3 session\0", hello, exchange, &token.to_le_bytes()])
}

/// The coordinator's answer to a verified Hello: the signed Welcome and the session.
pub fn welcome(
    identity: &Identity,
    agent: &str,
    hello: &Hello,
    hello_digest: Digest,
    token: SessionToken,
) -> Result<(Signed, Session), AuthError> {
    let rng = SystemRandom::new();
    let private = agreement::EphemeralPrivateKey::generate(&agreement::X25519, &rng).map_err(|_| AuthError::Random)?;
    let public = private.compute_public_key().map_err(|_| AuthError::Agreement)?;
    let mut exchange = [0u8; 32];
    exchange.copy_from_slice(public.as_ref());
    let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, hello.exchange);
    let t = transcript(&hello_digest, &exchange, token);
    let keys =
        agreement::agree_ephemeral(private, &peer, |shared| derive(shared, &t)).map_err(|_| AuthError::Agreement)?;
    let body = encode(&Welcome { agent_instance: hello.info.instance, hello: hello_digest, token, exchange })?;
    let signature = identity.sign(DOMAIN_WELCOME, &body);
    Ok((Signed { body, signature }, Session::new(Side::Coordinator, agent, token, keys)))
}

impl PendingHello {
    /// Checks the Welcome against the pinned coordinator key and this Hello,
    /// and opens the session.
    pub fn finish(self, agent: &str, coordinator: &PublicKey, signed: &Signed) -> Result<Session, AuthError> {
        verify(coordinator, DOMAIN_WELCOME, &signed.body, &signed.signature)?;
        let welcome: Welcome = decode(&signed.body)?;
        if welcome.hello != self.digest || welcome.agent_instance != self.instance {
            return Err(AuthError::OtherHello);
        }
        let peer = agreement::UnparsedPublicKey::new(&agreement::X25519, welcome.exchange);
        let t = transcript(&self.digest, &welcome.exchange, welcome.token);
        let keys = agreement::agree_ephemeral(self.private, &peer, |shared| derive(shared, &t))
            .map_err(|_| AuthError::Agreement)?;
        Ok(Session::new(Side::Agent, agent, welcome.token, keys))
    }

    /// Whether `signed` (a Welcome) answers this Hello; cheap, no signature check.
    pub fn answers(&self, signed: &Signed) -> bool {
        decode::<Welcome>(&signed.body).is_ok_and(|w| w.hello == self.digest)
    }

    /// SHA-256 of this Hello's body (what a Welcome or a refusal names).
    pub fn digest(&self) -> Digest {
        self.digest
    }
}

/// A session's two keys; `None` only if HKDF failed, and then nothing seals or opens.
struct Keys {
    up: Option<aead::LessSafeKey>,
    down: Option<aead::LessSafeKey>,
}

/// Which end of a session this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Agent,
    Coordinator,
}

/// One side of an open session: seals what it sends, opens what it receives.
pub struct Session {
    side: Side,
    agent: String,
    token: SessionToken,
    keys: Keys,
    sent: u64,
    received: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("side", &self.side)
            .field("agent", &self.agent)
            .field("token", &self.token)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish()
    }
}

/// What a sealed frame binds besides its body: the agent, the topic kind,
/// the session token and the sequence number.
fn associated(agent: &str, kind: AgentTopic, token: SessionToken, seq: u64) -> Vec<u8> {
    let mut ad = Vec::with_capacity(agent.len() + 32);
    ad.extend_from_slice(agent.as_bytes());
    ad.push(0);
    ad.extend_from_slice(kind.as_str().as_bytes());
    ad.push(0);
    ad.extend_from_slice(&token.to_le_bytes());
    ad.extend_from_slice(&seq.to_le_bytes());
    ad
}

/// The nonce of a frame: its sequence number, unique per key (each
/// direction of each session has its own key, and a sender's numbers only grow).
fn nonce(seq: u64) -> aead::Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

impl Session {
    fn new(side: Side, agent: &str, token: SessionToken, keys: Keys) -> Self {
        Session { side, agent: agent.to_string(), token, keys, sent: 0, received: 0 }
    }

    pub fn token(&self) -> SessionToken {
        self.token
    }

    fn keys(&self, sending: bool) -> Option<&aead::LessSafeKey> {
        // Agents send up and receive down; the coordinator the other way round.
        match (self.side, sending) {
            (Side::Agent, true) | (Side::Coordinator, false) => self.keys.up.as_ref(),
            _ => self.keys.down.as_ref(),
        }
    }

    /// Seals an encoded message for the topic kind it travels on.
    pub fn seal(&mut self, kind: AgentTopic, mut body: Vec<u8>) -> Result<Sealed, AuthError> {
        self.sent += 1;
        let ad = associated(&self.agent, kind, self.token, self.sent);
        let key = self.keys(true).ok_or(AuthError::Agreement)?;
        key.seal_in_place_append_tag(nonce(self.sent), aead::Aad::from(ad), &mut body)
            .map_err(|_| AuthError::Agreement)?;
        Ok(Sealed { token: self.token, seq: self.sent, body })
    }

    /// Opens a sealed frame that arrived on a `kind` topic; returns its body.
    pub fn open(&mut self, kind: AgentTopic, sealed: &Sealed) -> Result<Vec<u8>, AuthError> {
        if sealed.token != self.token {
            return Err(AuthError::Token { got: sealed.token });
        }
        let ad = associated(&self.agent, kind, sealed.token, sealed.seq);
        let key = self.keys(false).ok_or(AuthError::Mac)?;
        let mut body = sealed.body.clone();
        let len =
            key.open_in_place(nonce(sealed.seq), aead::Aad::from(ad), &mut body).map_err(|_| AuthError::Mac)?.len();
        body.truncate(len);
        if sealed.seq <= self.received {
            return Err(AuthError::Replay { got: sealed.seq, last: self.received });
        }
        self.received = sealed.seq;
        Ok(body)
    }

    /// Seals an agent's message (agent side): its topic kind and payload.
    pub fn seal_agent(&mut self, msg: &AgentMessage) -> Result<(AgentTopic, Vec<u8>), AuthError> {
        let kind = AgentTopic::of_agent_message(msg);
        let sealed = self.seal(kind, encode(msg)?)?;
        Ok((kind, encode(&UpFrame::Sealed(sealed))?))
    }

    /// Opens an agent's message (coordinator side) that came on a `kind` topic.
    pub fn open_agent(&mut self, kind: AgentTopic, sealed: &Sealed) -> Result<AgentMessage, AuthError> {
        self.open_as(kind, sealed, AgentTopic::of_agent_message)
    }

    /// Seals a coordinator message (coordinator side): its topic kind and payload.
    pub fn seal_coordinator(&mut self, msg: &CoordinatorMessage) -> Result<(AgentTopic, Vec<u8>), AuthError> {
        let kind = AgentTopic::of_coordinator_message(msg);
        let sealed = self.seal(kind, encode(msg)?)?;
        Ok((kind, encode(&DownFrame::Sealed(sealed))?))
    }

    /// Opens a coordinator message (agent side) that came on a `kind` topic.
    pub fn open_coordinator(&mut self, kind: AgentTopic, sealed: &Sealed) -> Result<CoordinatorMessage, AuthError> {
        self.open_as(kind, sealed, AgentTopic::of_coordinator_message)
    }

    /// Opens a sealed frame and decodes its message, which must be of the
    /// kind its topic says (`kind_of`).
    fn open_as<T: serde::de::DeserializeOwned>(
        &mut self,
        kind: AgentTopic,
        sealed: &Sealed,
        kind_of: fn(&T) -> AgentTopic,
    ) -> Result<T, AuthError> {
        let msg: T = decode(&self.open(kind, sealed)?)?;
        let got = kind_of(&msg);
        if got != kind {
            return Err(AuthError::WrongTopic { got: got.as_str(), topic: kind.as_str() });
        }
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{AgentStatus, Cancel, TrialRef, WorkRequest};

    fn info(instance: u64) -> AgentInfo {
        AgentInfo::minimal("a1", instance)
    }

    fn handshake() -> (Session, Session, Identity) {
        let (agent_id, _) = Identity::generate().expect("agent key");
        let (coord_id, _) = Identity::generate().expect("coordinator key");
        let (_, will_hash) = new_will(7).expect("will");
        let (signed, pending) = hello(&agent_id, info(7), 99, 1, will_hash, None).expect("hello");
        let (h, digest) = open_hello(&signed).expect("verifies");
        assert_eq!(h.key, agent_id.public());
        let (w, coord) = welcome(&coord_id, "a1", &h, digest, 0xfeed).expect("welcome");
        assert!(pending.answers(&w));
        let agent = pending.finish("a1", &coord_id.public(), &w).expect("agent side");
        (agent, coord, coord_id)
    }

    #[test]
    fn a_session_carries_messages_both_ways_once_each() {
        let (mut agent, mut coord, _) = handshake();
        assert_eq!((agent.token(), coord.token()), (0xfeed, 0xfeed));
        let msg = AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] });
        let (kind, payload) = agent.seal_agent(&msg).expect("seal");
        let Ok(UpFrame::Sealed(sealed)) = decode::<UpFrame>(&payload) else { panic!("not sealed") };
        assert_eq!(coord.open_agent(kind, &sealed), Ok(msg));
        assert!(matches!(coord.open_agent(kind, &sealed), Err(AuthError::Replay { got: 1, last: 1 })));
        let down = CoordinatorMessage::Cancel(Cancel {
            trial: TrialRef { study: "s".into(), study_id: 7, trial: 1, attempt: 1 },
            reason: "r".into(),
        });
        let (kind, payload) = coord.seal_coordinator(&down).expect("seal");
        let Ok(DownFrame::Sealed(sealed)) = decode::<DownFrame>(&payload) else { panic!("not sealed") };
        assert_eq!(agent.open_coordinator(kind, &sealed), Ok(down));
    }

    #[test]
    fn tampering_is_refused() {
        let (mut agent, mut coord, _) = handshake();
        let msg = AgentMessage::Status(AgentStatus { online: false, instance: 7 });
        let plain = encode(&msg).expect("enc");
        let sealed = agent.seal(AgentTopic::Status, plain.clone()).expect("seal");
        // Encrypted: the encoded message is nowhere in what travels.
        assert!(!sealed.body.windows(plain.len() - 1).any(|w| w == &plain[1..]), "the body travels in clear");
        assert_eq!(sealed.body.len(), plain.len() + 16, "the body and its tag");
        // Another topic kind, another token, another body, another tag.
        assert_eq!(coord.open(AgentTopic::Request, &sealed), Err(AuthError::Mac));
        let other_token = Sealed { token: 1, ..sealed.clone() };
        assert_eq!(coord.open(AgentTopic::Status, &other_token), Err(AuthError::Token { got: 1 }));
        let mut body = sealed.clone();
        body.body.push(0);
        assert_eq!(coord.open(AgentTopic::Status, &body), Err(AuthError::Mac));
        let mut flipped = sealed.clone();
        flipped.body[0] ^= 1;
        assert_eq!(coord.open(AgentTopic::Status, &flipped), Err(AuthError::Mac));
        let other_seq = Sealed { seq: 2, ..sealed.clone() };
        assert_eq!(coord.open(AgentTopic::Status, &other_seq), Err(AuthError::Mac), "the number is bound too");
        // The agent's own direction key cannot be reflected back at it.
        assert_eq!(agent.open(AgentTopic::Status, &sealed), Err(AuthError::Mac));
        assert_eq!(coord.open(AgentTopic::Status, &sealed), Ok(plain.clone()));
        // A frame from another session (same token, other keys) does not open.
        let (mut agent2, _, _) = handshake();
        let other = agent2.seal(AgentTopic::Status, plain).expect("seal");
        let other = Sealed { seq: 5, ..other };
        assert_eq!(coord.open(AgentTopic::Status, &other), Err(AuthError::Mac));
    }

    #[test]
    fn welcomes_and_hellos_are_bound_to_their_keys() {
        let (agent_id, _) = Identity::generate().expect("key");
        let (coord_id, _) = Identity::generate().expect("key");
        let (mallory, _) = Identity::generate().expect("key");
        let (signed, pending) = hello(&agent_id, info(7), 99, 1, [0; 32], None).expect("hello");
        let mut forged = signed.clone();
        forged.body[3] ^= 1;
        assert!(open_hello(&forged).is_err());
        let (h, digest) = open_hello(&signed).expect("ok");
        // A Welcome signed by another key is refused.
        let (w, _) = welcome(&mallory, "a1", &h, digest, 1).expect("welcome");
        let Err(e) = pending.finish("a1", &coord_id.public(), &w) else { panic!("accepted a forged welcome") };
        assert_eq!(e, AuthError::Signature);
        // A Welcome for another Hello is refused.
        let (signed2, pending2) = hello(&agent_id, info(7), 99, 2, [0; 32], None).expect("hello");
        let _ = signed2;
        let (w, _) = welcome(&coord_id, "a1", &h, digest, 1).expect("welcome");
        assert!(!pending2.answers(&w));
        assert!(matches!(pending2.finish("a1", &coord_id.public(), &w), Err(AuthError::OtherHello)));
    }

    #[test]
    fn byte_strings_keep_the_wire_format_of_a_plain_sequence() {
        #[derive(Serialize)]
        struct Plain {
            token: u64,
            seq: u64,
            body: Vec<u8>,
        }
        let sealed = Sealed { token: 7, seq: 300, body: (0..=255).collect() };
        let plain = Plain { token: 7, seq: 300, body: sealed.body.clone() };
        assert_eq!(encode(&sealed).expect("enc"), encode(&plain).expect("enc"));
    }

    #[test]
    fn statuses_and_wills() {
        let (coord_id, _) = Identity::generate().expect("key");
        let status = CoordinatorStatus { online: true, instance: 3, started_unix_ms: 10, key: coord_id.public() };
        let signed = sign_status(&coord_id, &status).expect("sign");
        assert_eq!(open_status(&signed), Ok(status.clone()));
        let (mallory, _) = Identity::generate().expect("key");
        let mut forged = sign_status(&mallory, &status).expect("sign");
        assert_eq!(open_status(&forged), Err(AuthError::Signature));
        forged.signature.truncate(3);
        assert_eq!(open_status(&forged), Err(AuthError::Signature));
        let (will, hash) = new_will(3).expect("will");
        assert!(will_matches(&will, &hash));
        let (other, _) = new_will(3).expect("will");
        assert!(!will_matches(&other, &hash));
    }

    #[test]
    fn key_files_round_trip_and_refuse_garbage() {
        let dir = tempfile_dir();
        let path = dir.join("sub").join("id.key");
        let (a, created) = Identity::load_or_create(&path).expect("create");
        assert!(created);
        let (b, created) = Identity::load_or_create(&path).expect("load");
        assert!(!created);
        assert_eq!(a.public(), b.public());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777, 0o600);
        // Processes racing to create one key agree on one.
        let racing = dir.join("race.key");
        let keys: Vec<PublicKey> = std::thread::scope(|s| {
            let handles: Vec<_> =
                (0..8).map(|_| s.spawn(|| Identity::load_or_create(&racing).expect("create").0.public())).collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(keys.iter().all(|k| *k == keys[0]), "one key for all");
        std::fs::write(&path, b"junk").expect("write");
        assert!(matches!(Identity::load_or_create(&path), Err(KeyFileError::Parse { .. })));
        let pubfile = dir.join("c.pub");
        assert_eq!(read_public_key(&pubfile).expect("none"), None);
        write_public_key(&pubfile, &a.public()).expect("write");
        assert_eq!(read_public_key(&pubfile).expect("some"), Some(a.public()));
        assert_eq!(parse_public_key(&hex(&a.public())), Some(a.public()));
        assert_eq!(parse_public_key("zz"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tf-auth-{}-{}",
            std::process::id(),
            hex(&random_bytes::<4>().expect("rng"))
        ));
        std::fs::create_dir_all(&d).expect("dir");
        d
    }
}
