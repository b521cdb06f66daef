//! Pinned agent keys: the Ed25519 public key each agent name first came
//! with (trust on first use, or registered with `tunefleet agents trust`),
//! and the hash of the Last Will secret of the agent's latest session, so a
//! coordinator that restarted can still tell the agent's real will from a
//! forged or replayed one.

use super::sql::{self, params, Conn, Optional};
use tunefleet_common::auth::{Digest, PublicKey};

use super::{to_i64, Batch, Result, SqlContext, Store};

/// Created on open, like the InfluxDB outbox: older programs ignore it.
pub(super) const KEYS_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS agent_keys (
    name      TEXT PRIMARY KEY NOT NULL,
    key       BLOB NOT NULL CHECK (length(key) = 32),
    pinned_ms INTEGER NOT NULL,
    will_hash BLOB
);
"#;

fn blob32(v: Option<Vec<u8>>) -> Option<[u8; 32]> {
    v.and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
}

/// The key pinned for `agent` in `conn`, if any.
fn key_of(conn: &Conn, agent: &str) -> Result<Option<PublicKey>> {
    let context = || format!("reading the pinned key of {agent}");
    let key: Option<Vec<u8>> = conn
        .prepare_cached("SELECT key FROM agent_keys WHERE name = ?1")
        .ctx(context)?
        .query_row([agent], |r| r.get(0))
        .optional()
        .ctx(context)?;
    Ok(blob32(key))
}

impl Batch<'_> {
    /// The key pinned for `agent`, if any.
    pub fn agent_key(&mut self, agent: &str) -> Result<Option<PublicKey>> {
        key_of(&self.tx, agent)
    }

    /// How many agent names have a pinned key.
    pub fn pinned_agents(&mut self) -> Result<u64> {
        let n: i64 = self
            .tx
            .prepare_cached("SELECT COUNT(*) FROM agent_keys")
            .ctx(|| "counting pinned agents".into())?
            .query_row((), |r| r.get(0))
            .ctx(|| "counting pinned agents".into())?;
        Ok(n.max(0) as u64)
    }

    /// Pins `key` for `agent` (replacing nothing: the caller checked there was none).
    pub fn pin_agent_key(&mut self, agent: &str, key: &PublicKey, at_ms: u64) -> Result<()> {
        let context = || format!("pinning the key of {agent}");
        self.tx
            .prepare_cached("INSERT OR IGNORE INTO agent_keys (name, key, pinned_ms) VALUES (?1, ?2, ?3)")
            .ctx(context)?
            .write(params![agent, key.as_slice(), to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(())
    }

    /// Records (or clears, once used) the will hash of `agent`'s session.
    pub fn set_will_hash(&mut self, agent: &str, hash: Option<&Digest>) -> Result<()> {
        let context = || format!("recording the will of {agent}");
        self.tx
            .prepare_cached("UPDATE agent_keys SET will_hash = ?2 WHERE name = ?1")
            .ctx(context)?
            .write(params![agent, hash.map(|h| h.as_slice())])
            .ctx(context)?;
        Ok(())
    }

    /// The will hash of `agent`'s latest session, if not used yet.
    pub fn will_hash(&mut self, agent: &str) -> Result<Option<Digest>> {
        let context = || format!("reading the will of {agent}");
        let hash: Option<Option<Vec<u8>>> = self
            .tx
            .prepare_cached("SELECT will_hash FROM agent_keys WHERE name = ?1")
            .ctx(context)?
            .query_row([agent], |r| r.get(0))
            .optional()
            .ctx(context)?;
        Ok(blob32(hash.flatten()))
    }
}

impl Batch<'_> {
    /// Pins `key` for `agent`, replacing any earlier key. Returns the old key.
    pub fn replace_agent_key(&mut self, agent: &str, key: &PublicKey, at_ms: u64) -> Result<Option<PublicKey>> {
        let old = self.agent_key(agent)?;
        let context = || format!("pinning the key of {agent}");
        self.tx
            .prepare_cached(
                "INSERT INTO agent_keys (name, key, pinned_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET key = excluded.key, pinned_ms = excluded.pinned_ms, will_hash = NULL",
            )
            .ctx(context)?
            .write(params![agent, key.as_slice(), to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(old)
    }
}

impl Store {
    /// Pins `key` for `agent`, replacing any earlier key (a re-installed
    /// agent, or a fleet registered ahead of time). Returns the old key.
    pub fn trust_agent(&mut self, agent: &str, key: &PublicKey, at_ms: u64) -> Result<Option<PublicKey>> {
        let mut batch = self.batch()?;
        let old = batch.replace_agent_key(agent, key, at_ms)?;
        batch.commit()?;
        Ok(old)
    }

    /// Forgets the key of `agent`: its next Hello pins a new one. Returns
    /// whether there was one.
    pub fn forget_agent_key(&mut self, agent: &str) -> Result<bool> {
        let batch = self.batch()?;
        let n = batch
            .tx
            .prepare_cached("DELETE FROM agent_keys WHERE name = ?1")
            .ctx(|| format!("forgetting the key of {agent}"))?
            .execute([agent])
            .ctx(|| format!("forgetting the key of {agent}"))?;
        batch.commit()?;
        Ok(n > 0)
    }

    /// The key pinned for `agent`, if any (what the broker's logins check).
    pub fn pinned_key(&self, agent: &str) -> Result<Option<PublicKey>> {
        key_of(&self.conn, agent)
    }

    /// Every pinned key, by agent name.
    pub fn agent_keys(&self) -> Result<Vec<(String, PublicKey)>> {
        let context = || "listing pinned keys".to_string();
        let mut stmt = self.conn.prepare_cached("SELECT name, key FROM agent_keys ORDER BY name").ctx(context)?;
        let rows = stmt
            .query_map((), |r| Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?)))
            .ctx(context)?
            .collect::<sql::Result<Vec<_>>>()
            .ctx(context)?;
        Ok(rows.into_iter().filter_map(|(n, k)| blob32(Some(k)).map(|k| (n, k))).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_once_and_keeps_the_will_until_used() {
        let mut store = Store::open_in_memory().expect("store");
        let mut b = store.batch().expect("batch");
        assert_eq!(b.agent_key("a").expect("q"), None);
        b.pin_agent_key("a", &[1; 32], 5).expect("pin");
        b.pin_agent_key("a", &[2; 32], 6).expect("pin again is ignored");
        assert_eq!(b.agent_key("a").expect("q"), Some([1; 32]));
        assert_eq!(b.pinned_agents().expect("n"), 1);
        b.set_will_hash("a", Some(&[9; 32])).expect("will");
        assert_eq!(b.will_hash("a").expect("q"), Some([9; 32]));
        b.set_will_hash("a", None).expect("used");
        assert_eq!(b.will_hash("a").expect("q"), None);
        b.commit().expect("commit");
        assert_eq!(store.trust_agent("a", &[3; 32], 7).expect("trust"), Some([1; 32]));
        assert_eq!(store.agent_keys().expect("list"), vec![("a".to_string(), [3; 32])]);
        assert!(store.forget_agent_key("a").expect("forget"));
        assert!(!store.forget_agent_key("a").expect("forget again"));
    }
}
