//! Broker logins by identity: an agent logs in to the embedded broker as
//! its name, with a password that proves it holds the key enrolled under
//! that name. Nothing in it can be copied from a file: the proof is an
//! Ed25519 signature over the name and the time of the attempt, and the
//! broker takes each name's times only increasing, so one captured on the
//! wire does not log in again.
//!
//! The password: `tf-key1.{ms}.{key}.{signature}` and, when the agent was
//! also given a broker login (`--username` with a password), `.{user}:{secret}`:
//! a broker that requires logins of strangers checks it before the name's
//! key is enrolled.

use super::{hex, verify, AuthError, Identity, PublicKey};

const DOMAIN_LOGIN: &[u8] = b"tunefleet v1 broker login\0";
/// What every identity password starts with.
pub const LOGIN_PREFIX: &str = "tf-key1.";

/// A parsed identity password, not yet verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginProof {
    /// When the agent made it (ms since the epoch, by its clock).
    pub at_ms: u64,
    pub key: PublicKey,
    signature: Vec<u8>,
    /// The broker login the agent was also given, if any.
    pub secret: Option<(String, String)>,
}

fn body(name: &str, at_ms: u64) -> Vec<u8> {
    format!("{name}\0{at_ms}").into_bytes()
}

/// The password proving `identity` logs in as `name` at `at_ms`.
pub fn login_password(identity: &Identity, name: &str, at_ms: u64, secret: Option<(&str, &str)>) -> String {
    let signature = identity.sign(DOMAIN_LOGIN, &body(name, at_ms));
    let mut out = format!("{LOGIN_PREFIX}{at_ms}.{}.{}", hex(&identity.public()), hex(&signature));
    if let Some((user, pass)) = secret {
        out.push_str(&format!(".{user}:{pass}"));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Reads an identity password; `None` when `password` is not one.
pub fn parse_login(password: &str) -> Option<LoginProof> {
    let rest = password.strip_prefix(LOGIN_PREFIX)?;
    let mut parts = rest.splitn(4, '.');
    let at_ms = parts.next()?.parse().ok()?;
    let key = <PublicKey>::try_from(unhex(parts.next()?)?.as_slice()).ok()?;
    let signature = unhex(parts.next()?)?;
    let secret = match parts.next() {
        None => None,
        Some(s) => {
            let (user, pass) = s.split_once(':')?;
            Some((user.to_string(), pass.to_string()))
        }
    };
    Some(LoginProof { at_ms, key, signature, secret })
}

impl LoginProof {
    /// Checks the signature: the holder of `self.key` made it for `name`.
    pub fn verify(&self, name: &str) -> Result<(), AuthError> {
        verify(&self.key, DOMAIN_LOGIN, &body(name, self.at_ms), &self.signature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_verifies_for_its_name_and_time_only() {
        let (id, _) = Identity::generate().expect("key");
        let pw = login_password(&id, "edge-1", 1_700_000_000_123, None);
        assert!(pw.starts_with(LOGIN_PREFIX), "{pw}");
        let proof = parse_login(&pw).expect("parses");
        assert_eq!(proof.key, id.public());
        assert_eq!(proof.at_ms, 1_700_000_000_123);
        assert_eq!(proof.secret, None);
        assert!(proof.verify("edge-1").is_ok());
        assert_eq!(proof.verify("edge-2"), Err(AuthError::Signature), "another name");
        let mut later = proof.clone();
        later.at_ms += 1;
        assert_eq!(later.verify("edge-1"), Err(AuthError::Signature), "another time");
        let (other, _) = Identity::generate().expect("key");
        let mut stolen = proof;
        stolen.key = other.public();
        assert_eq!(stolen.verify("edge-1"), Err(AuthError::Signature), "another key");
    }

    #[test]
    fn a_broker_secret_rides_along_and_junk_is_no_proof() {
        let (id, _) = Identity::generate().expect("key");
        let pw = login_password(&id, "n", 5, Some(("laptop", "s3:c.ret")));
        let proof = parse_login(&pw).expect("parses");
        assert_eq!(proof.secret, Some(("laptop".to_string(), "s3:c.ret".to_string())));
        assert!(proof.verify("n").is_ok());
        for junk in ["", "secret", "tf-key1.", "tf-key1.x.00.00", "tf-key1.5.zz.00", "tf-key1.5.0011.00.nosecret"] {
            assert_eq!(parse_login(junk), None, "{junk}");
        }
    }
}
