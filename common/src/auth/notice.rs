//! Notices the coordinator signs for one agent outside a session: its
//! session is stale ([`StaleSession`]), or its Hello was refused and why
//! ([`HelloRefused`]).

use serde::{Deserialize, Serialize};

use super::{verify, Digest, Identity, PublicKey, Signed, DOMAIN_REFUSED, DOMAIN_STALE};
use crate::codec::{decode, encode};
use crate::message::SessionToken;

use super::AuthError;

/// `notice` encoded and signed under `domain`.
fn sign_notice<T: Serialize>(identity: &Identity, domain: &[u8], notice: &T) -> Result<Signed, AuthError> {
    let body = encode(notice)?;
    let signature = identity.sign(domain, &body);
    Ok(Signed { body, signature })
}

/// A notice signed by `coordinator` under `domain`, decoded.
fn open_notice<T: serde::de::DeserializeOwned>(
    coordinator: &PublicKey,
    domain: &[u8],
    signed: &Signed,
) -> Result<T, AuthError> {
    verify(coordinator, domain, &signed.body, &signed.signature)?;
    Ok(decode(&signed.body)?)
}

/// The coordinator refused a sealed frame of this agent's because it holds
/// no session with that token (it lost it, or another Hello replaced it):
/// the agent says Hello again. Signed by the coordinator; it names the
/// refused token, so it ends no other session, and a replay of it ends
/// nothing the coordinator still holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleSession {
    pub agent: String,
    pub token: SessionToken,
}

/// Signs a [`StaleSession`].
pub fn sign_stale(identity: &Identity, stale: &StaleSession) -> Result<Signed, AuthError> {
    sign_notice(identity, DOMAIN_STALE, stale)
}

/// Checks a signed [`StaleSession`] against the coordinator's key.
pub fn open_stale(coordinator: &PublicKey, signed: &Signed) -> Result<StaleSession, AuthError> {
    open_notice(coordinator, DOMAIN_STALE, signed)
}

/// Why a Hello was refused, as the agent is told ([`HelloRefused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RefusalKind {
    /// Its join token has expired.
    TokenExpired,
    /// Its join token was revoked.
    TokenRevoked,
    /// Its join token has admitted as many agents as it may.
    TokenUsedUp,
    /// Its join token is not one of this coordinator's.
    TokenUnknown,
    /// Its key is unknown and it has no join token.
    NotEnrolled,
    /// Another key is pinned for its name (another machine of that name, or
    /// this one re-installed).
    NameTaken,
    /// The coordinator pins as many agents as it may.
    FleetFull,
    /// The Hello itself is out of bounds (what the agent says of itself).
    Invalid,
}

impl RefusalKind {
    /// Whether saying Hello again cannot help: the token it brings is dead
    /// for good, or its own Hello is out of bounds. An unknown key, a name
    /// pinned to another key and a full fleet can change while it asks
    /// (`tunefleet agents trust`, `forget`): the agent goes on asking.
    pub fn fatal(self) -> bool {
        matches!(
            self,
            RefusalKind::TokenExpired
                | RefusalKind::TokenRevoked
                | RefusalKind::TokenUsedUp
                | RefusalKind::TokenUnknown
                | RefusalKind::Invalid
        )
    }
}

/// The coordinator refused this Hello. Signed by the coordinator, and
/// naming the Hello it answers (its digest, so the agent acts only on the
/// answer to the Hello it sent last: a replayed notice answers no later
/// Hello, and a Hello forged in its name is signed by another key, which
/// the notice names too).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloRefused {
    pub agent: String,
    /// SHA-256 of the refused Hello's body.
    pub hello: Digest,
    /// The key that Hello carried.
    pub key: PublicKey,
    pub kind: RefusalKind,
    /// Why, and what to do, in words.
    pub message: String,
}

/// Signs a [`HelloRefused`].
pub fn sign_refused(identity: &Identity, refused: &HelloRefused) -> Result<Signed, AuthError> {
    sign_notice(identity, DOMAIN_REFUSED, refused)
}

/// Checks a signed [`HelloRefused`] against the coordinator's key.
pub fn open_refused(coordinator: &PublicKey, signed: &Signed) -> Result<HelloRefused, AuthError> {
    open_notice(coordinator, DOMAIN_REFUSED, signed)
}
