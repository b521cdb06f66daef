//! Enrolment: join tokens (stored by their public half only: the secret
//! never reaches the store, and cannot be derived from what is kept) and,
//! per agent name, how its key was admitted, the tags its token granted,
//! and the process instance and number of its last accepted Hello (so a
//! Hello of an earlier process is a replay however many restarts ago it
//! was, and across coordinator restarts).

use std::collections::BTreeMap;

use super::sql::{self, params, Conn, Optional};
use serde::Serialize;
use tunefleet_common::auth::{self, PublicKey};

use super::{get_u64, to_i64, Batch, Result, SqlContext, Store};

/// What the store knows of the name a Hello comes under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// Its pinned key.
    pub pin: Option<auth::PublicKey>,
    /// The last accepted Hello's process instance and number.
    pub last: Option<(u64, u64)>,
    /// How many names are pinned (for the bound), when `pin` is `None`.
    pub pinned: u64,
    /// How its key was enrolled (`token ID`, `open enrolment`), when it is known.
    pub via: Option<String>,
}

/// A join token as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenState {
    /// Its short id (the first hex digits of its public half).
    pub id: String,
    pub expires_ms: Option<u64>,
    pub uses_left: Option<u64>,
    pub revoked: bool,
    /// The names it admits (a launcher's token); empty: any name.
    pub names: Vec<String>,
}

/// Created on open, like the agent keys: older programs ignore it.
pub(super) const ENROL_SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS join_tokens (
    public     BLOB PRIMARY KEY NOT NULL CHECK (length(public) = 32),
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER,
    uses_left  INTEGER,
    used       INTEGER NOT NULL DEFAULT 0,
    tags       TEXT NOT NULL DEFAULT '{}',
    revoked    INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS agent_enrolment (
    name          TEXT PRIMARY KEY NOT NULL,
    via           TEXT,
    tags          TEXT NOT NULL DEFAULT '{}',
    last_instance INTEGER,
    last_seq      INTEGER
);
"#;

/// Columns added since the enrolment tables were first made (a store of
/// an older program gets them on open): the capacity a token grants, the
/// capacity an agent was granted, and the trials it lost before they started.
const ENROL_COLUMNS: [(&str, &str, &str); 10] = [
    ("join_tokens", "slots", "INTEGER"),
    ("join_tokens", "gpus", "INTEGER"),
    ("agent_enrolment", "gpus", "INTEGER"),
    ("join_tokens", "names", "TEXT"),
    ("join_tokens", "lookahead", "INTEGER"),
    ("agent_enrolment", "slots", "INTEGER"),
    ("agent_enrolment", "lookahead", "INTEGER"),
    ("agent_enrolment", "lost_held", "INTEGER NOT NULL DEFAULT 0"),
    ("join_tokens", "total_slots", "INTEGER"),
    ("join_tokens", "total_store_mib", "INTEGER"),
];

/// Adds the [`ENROL_COLUMNS`] a store lacks.
pub(super) fn add_columns(tx: &Conn) -> sql::Result<()> {
    for (table, column, kind) in ENROL_COLUMNS {
        if !tx.has_column(table, column)? {
            tx.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {kind};"))?;
        }
    }
    Ok(())
}

/// The capacity the operator granted an agent (its join token's, or what
/// `tunefleet agents trust --slots --lookahead --gpus` set): the most
/// slots, trials held ahead and GPUs it is given, whatever it announces.
/// `None`: the coordinator's cap per agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Grant {
    pub slots: Option<u32>,
    pub lookahead: Option<u32>,
    pub gpus: Option<u32>,
    /// A token's: the slots all the names it admitted may hold at once.
    pub total_slots: Option<u32>,
    /// A token's: the MiB of each study's store all its names may take.
    pub total_store_mib: Option<u64>,
}

/// What the names of one join token share: its id, its bounds, its other names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenShare {
    pub id: String,
    pub total_slots: Option<u32>,
    pub total_store_mib: Option<u64>,
    pub siblings: Vec<String>,
}

impl Grant {
    fn of(slots: Option<i64>, lookahead: Option<i64>, gpus: Option<i64>) -> Self {
        let u = |v: Option<i64>| v.map(|v| u32::try_from(v.max(0)).unwrap_or(u32::MAX));
        Grant { slots: u(slots), lookahead: u(lookahead), gpus: u(gpus), total_slots: None, total_store_mib: None }
    }
}

/// A join token as `tunefleet token list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TokenRow {
    /// The first 8 bytes of its public half, in hex.
    pub id: String,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub uses_left: Option<u64>,
    pub used: u64,
    pub tags: BTreeMap<String, String>,
    pub revoked: bool,
    /// The capacity it grants the agents it admits.
    pub grant: Grant,
}

/// A token's short id.
pub fn token_id(public: &PublicKey) -> String {
    auth::hex(&public[..8])
}

fn tags_json(tags: &BTreeMap<String, String>) -> String {
    serde_json::to_string(tags).unwrap_or_else(|_| "{}".into())
}

fn tags_of(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_default()
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(|v| u64::try_from(v).unwrap_or(0))
}

impl Batch<'_> {
    /// What the store knows of `agent`: its pinned key, its last Hello, and
    /// (when none is pinned) how many names are.
    pub fn known(&mut self, agent: &str) -> Result<Known> {
        let pin = self.agent_key(agent)?;
        let context = || format!("reading the enrolment of {agent}");
        let row: Option<(Option<i64>, Option<i64>, Option<String>)> = self
            .tx
            .prepare_cached("SELECT last_instance, last_seq, via FROM agent_enrolment WHERE name = ?1")
            .ctx(context)?
            .query_row([agent], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()
            .ctx(context)?;
        let (last, via) = match row {
            Some((Some(i), Some(s), via)) => {
                (Some((u64::try_from(i).unwrap_or(0), u64::try_from(s).unwrap_or(0))), via)
            }
            Some((_, _, via)) => (None, via),
            None => (None, None),
        };
        let pinned = if pin.is_none() { self.pinned_agents()? } else { 0 };
        Ok(Known { pin, last, pinned, via })
    }

    /// The join token whose public half is `public`, if this store has it.
    pub fn token(&mut self, public: &PublicKey) -> Result<Option<TokenState>> {
        let context = || "reading a join token".to_string();
        self.tx
            .prepare_cached("SELECT expires_ms, uses_left, revoked, names FROM join_tokens WHERE public = ?1")
            .ctx(context)?
            .query_row([public.as_slice()], |r| {
                Ok(TokenState {
                    id: token_id(public),
                    expires_ms: opt_u64(r.get(0)?),
                    uses_left: opt_u64(r.get(1)?),
                    revoked: r.get(2)?,
                    names: r
                        .get::<_, Option<String>>(3)?
                        .and_then(|n| serde_json::from_str(&n).ok())
                        .unwrap_or_default(),
                })
            })
            .optional()
            .ctx(context)
    }

    /// Pins `key` for the new agent `agent`, admitted by `token` (one use
    /// of it, and the tags it grants) or by open enrolment (`None`).
    pub fn enrol(&mut self, agent: &str, key: &PublicKey, token: Option<&PublicKey>, at_ms: u64) -> Result<()> {
        self.pin_agent_key(agent, key, at_ms)?;
        let context = || format!("enrolling {agent}");
        let (via, tags, grant) = match token {
            Some(public) => {
                self.tx
                    .prepare_cached(
                        "UPDATE join_tokens SET used = used + 1,
                         uses_left = CASE WHEN uses_left IS NULL THEN NULL ELSE max(uses_left - 1, 0) END
                         WHERE public = ?1",
                    )
                    .ctx(context)?
                    .write([public.as_slice()])
                    .ctx(context)?;
                let granted: Option<(String, Grant)> = self
                    .tx
                    .prepare_cached("SELECT tags, slots, lookahead, gpus FROM join_tokens WHERE public = ?1")
                    .ctx(context)?
                    .query_row([public.as_slice()], |r| Ok((r.get(0)?, Grant::of(r.get(1)?, r.get(2)?, r.get(3)?))))
                    .optional()
                    .ctx(context)?;
                let (tags, grant) = granted.unwrap_or_else(|| ("{}".into(), Grant::default()));
                (format!("token {}", token_id(public)), tags, grant)
            }
            None => ("open enrolment".to_string(), "{}".to_string(), Grant::default()),
        };
        self.tx
            .prepare_cached(
                "INSERT INTO agent_enrolment (name, via, tags, slots, lookahead, gpus) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (name) DO UPDATE SET via = excluded.via, tags = excluded.tags,
                     slots = excluded.slots, lookahead = excluded.lookahead, gpus = excluded.gpus",
            )
            .ctx(context)?
            .write(params![agent, via, tags, grant.slots, grant.lookahead, grant.gpus])
            .ctx(context)?;
        Ok(())
    }

    /// Records `agent`'s accepted Hello: a later one must come from a later
    /// process, or from this one with a higher number.
    pub fn record_hello(&mut self, agent: &str, instance: u64, seq: u64) -> Result<()> {
        let context = || format!("recording the Hello of {agent}");
        self.tx
            .prepare_cached(
                "INSERT INTO agent_enrolment (name, last_instance, last_seq) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET last_instance = excluded.last_instance, last_seq = excluded.last_seq",
            )
            .ctx(context)?
            .write(params![agent, to_i64("instance", instance)?, to_i64("hello seq", seq)?])
            .ctx(context)?;
        Ok(())
    }

    /// Counts `n` more trials that `agent` lost before they started.
    pub fn add_lost_held(&mut self, agent: &str, n: u32) -> Result<()> {
        let context = || format!("counting the trials {agent} lost");
        self.tx
            .prepare_cached(
                "INSERT INTO agent_enrolment (name, lost_held) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET lost_held = lost_held + excluded.lost_held",
            )
            .ctx(context)?
            .write(params![agent, n])
            .ctx(context)?;
        Ok(())
    }

    /// What the operator granted `agent`: the tags of its join token (they
    /// override what it claims) and the capacity of its token or of
    /// `agents trust`. One read, at every Hello.
    /// What the names of the join token that enrolled `agent` share, when
    /// that token bounds them together (`--total-slots`, `--total-store-mib`).
    pub fn token_share(&mut self, agent: &str) -> Result<Option<TokenShare>> {
        let context = || format!("reading the token share of {agent}");
        // The agent's token, matched by the id its enrolment records
        // (`token` and the first 8 bytes of the token's public half, in hex).
        let bounded: Option<(String, Option<i64>, Option<i64>)> = self
            .tx
            .prepare_cached(
                "SELECT e.via, t.total_slots, t.total_store_mib FROM agent_enrolment e
                 JOIN join_tokens t ON e.via = 'token ' || lower(hex(substr(t.public, 1, 8)))
                 WHERE e.name = ?1 AND (t.total_slots IS NOT NULL OR t.total_store_mib IS NOT NULL)",
            )
            .ctx(context)?
            .query_row([agent], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .optional()
            .ctx(context)?;
        let Some((via, slots, store)) = bounded else { return Ok(None) };
        let id = via.trim_start_matches("token ").to_string();
        let siblings: Vec<String> = self
            .tx
            .prepare_cached("SELECT name FROM agent_enrolment WHERE via = ?1 AND name != ?2")
            .ctx(context)?
            .query_map(params![via, agent], |r| r.get(0))
            .ctx(context)?
            .collect::<sql::Result<_>>()
            .ctx(context)?;
        Ok(Some(TokenShare {
            id,
            total_slots: opt_u64(slots).map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
            total_store_mib: opt_u64(store),
            siblings,
        }))
    }

    pub fn granted(&mut self, agent: &str) -> Result<(BTreeMap<String, String>, Grant)> {
        let context = || format!("reading what was granted to {agent}");
        let row: Option<(String, Grant)> = self
            .tx
            .prepare_cached("SELECT tags, slots, lookahead, gpus FROM agent_enrolment WHERE name = ?1")
            .ctx(context)?
            .query_row([agent], |r| Ok((r.get(0)?, Grant::of(r.get(1)?, r.get(2)?, r.get(3)?))))
            .optional()
            .ctx(context)?;
        Ok(row.map(|(tags, grant)| (tags_of(&tags), grant)).unwrap_or_default())
    }
}

impl Store {
    /// Keeps a new join token's public half.
    pub fn create_token(
        &mut self,
        public: &PublicKey,
        expires_ms: Option<u64>,
        uses: Option<u64>,
        tags: &BTreeMap<String, String>,
        grant: Grant,
        at_ms: u64,
    ) -> Result<()> {
        let batch = self.batch()?;
        let context = || "creating a join token".to_string();
        batch
            .tx
            .prepare_cached(
                "INSERT INTO join_tokens (public, created_ms, expires_ms, uses_left, tags, slots, lookahead, gpus,
                     total_slots, total_store_mib)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .ctx(context)?
            .write(params![
                public.as_slice(),
                to_i64("time", at_ms)?,
                expires_ms.map(|e| to_i64("expiry", e)).transpose()?,
                uses.map(|u| to_i64("uses", u)).transpose()?,
                tags_json(tags),
                grant.slots,
                grant.lookahead,
                grant.gpus,
                grant.total_slots,
                grant.total_store_mib.map(|m| to_i64("MiB", m)).transpose()?
            ])
            .ctx(context)?;
        batch.commit()
    }

    /// Grants `agent` at most `grant` (its name need not be enrolled yet:
    /// `agents trust` ahead of its first Hello).
    pub fn grant_capacity(&mut self, agent: &str, grant: Grant) -> Result<()> {
        let batch = self.batch()?;
        let context = || format!("granting capacity to {agent}");
        batch
            .tx
            .prepare_cached(
                "INSERT INTO agent_enrolment (name, slots, lookahead, gpus) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO UPDATE SET slots = excluded.slots, lookahead = excluded.lookahead,
                     gpus = excluded.gpus",
            )
            .ctx(context)?
            .write(params![agent, grant.slots, grant.lookahead, grant.gpus])
            .ctx(context)?;
        batch.commit()
    }

    /// Keeps a launcher's join token: one use for each of `names`, and only
    /// for them (a launched agent's name cannot be taken first by another
    /// member), valid until `expires_ms`.
    pub fn create_launch_token(
        &mut self,
        public: &PublicKey,
        names: &[String],
        expires_ms: u64,
        at_ms: u64,
    ) -> Result<()> {
        let batch = self.batch()?;
        let context = || "creating a launcher's join token".to_string();
        let names_json = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
        batch
            .tx
            .prepare_cached(
                "INSERT INTO join_tokens (public, created_ms, expires_ms, uses_left, names) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .ctx(context)?
            .write(params![
                public.as_slice(),
                to_i64("time", at_ms)?,
                to_i64("expiry", expires_ms)?,
                to_i64("uses", names.len() as u64)?,
                names_json
            ])
            .ctx(context)?;
        batch.commit()
    }

    /// Every join token, newest first.
    pub fn tokens(&self) -> Result<Vec<TokenRow>> {
        let context = || "listing join tokens".to_string();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT public, created_ms, expires_ms, uses_left, used, tags, revoked, slots, lookahead, gpus,
                        total_slots, total_store_mib
                 FROM join_tokens
                 ORDER BY created_ms DESC, public",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map((), |r| {
                let public: Vec<u8> = r.get("public")?;
                Ok(TokenRow {
                    id: auth::hex(public.get(..8).unwrap_or_default()),
                    created_ms: get_u64(r, "created_ms")?,
                    expires_ms: opt_u64(r.get("expires_ms")?),
                    uses_left: opt_u64(r.get("uses_left")?),
                    used: get_u64(r, "used")?,
                    tags: tags_of(&r.get::<_, String>("tags")?),
                    revoked: r.get("revoked")?,
                    grant: Grant {
                        total_slots: opt_u64(r.get("total_slots")?).map(|t| u32::try_from(t).unwrap_or(u32::MAX)),
                        total_store_mib: opt_u64(r.get("total_store_mib")?),
                        ..Grant::of(r.get("slots")?, r.get("lookahead")?, r.get("gpus")?)
                    },
                })
            })
            .ctx(context)?
            .collect::<sql::Result<Vec<_>>>()
            .ctx(context)?;
        Ok(rows)
    }

    /// Revokes the tokens whose id starts with `id` (at least 4 hex
    /// digits); returns how many.
    pub fn revoke_token(&mut self, id: &str) -> Result<usize> {
        let ids: Vec<String> = self.tokens()?.into_iter().map(|t| t.id).filter(|t| t.starts_with(id)).collect();
        if id.len() < 4 || ids.is_empty() {
            return Ok(0);
        }
        let batch = self.batch()?;
        let context = || "revoking a join token".to_string();
        let n = batch
            .tx
            .prepare_cached("UPDATE join_tokens SET revoked = 1 WHERE lower(hex(substr(public, 1, 8))) LIKE ?1 || '%'")
            .ctx(context)?
            .execute([id.to_ascii_lowercase()])
            .ctx(context)?;
        batch.commit()?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_kept_used_and_revoked_and_hellos_remembered() {
        let mut store = Store::open_in_memory().expect("store");
        let tags: BTreeMap<String, String> = [("pool".to_string(), "arm".to_string())].into();
        let public = [7u8; 32];
        let grant =
            Grant { slots: Some(2), lookahead: Some(3), gpus: Some(1), total_slots: None, total_store_mib: None };
        store.create_token(&public, Some(1_000), Some(2), &tags, grant, 5).expect("create");
        let mut b = store.batch().expect("batch");
        let t = b.token(&public).expect("read").expect("kept");
        assert_eq!((t.expires_ms, t.uses_left, t.revoked), (Some(1_000), Some(2), false));
        assert_eq!(b.token(&[8; 32]).expect("read"), None);
        assert_eq!(b.known("a").expect("known"), Known { pin: None, last: None, pinned: 0, via: None });
        b.enrol("a", &[1; 32], Some(&public), 6).expect("enrol");
        b.record_hello("a", 10, 3).expect("hello");
        let via = Some(format!("token {}", token_id(&public)));
        assert_eq!(b.known("a").expect("known"), Known { pin: Some([1; 32]), last: Some((10, 3)), pinned: 0, via });
        assert_eq!(b.granted("a").expect("granted"), (tags, grant), "the token's tags and grant are the agent's");
        assert_eq!(b.granted("z").expect("granted"), (BTreeMap::new(), Grant::default()));
        b.add_lost_held("a", 3).expect("lost");
        b.add_lost_held("a", 2).expect("lost");
        assert_eq!(b.token(&public).expect("read").expect("kept").uses_left, Some(1));
        b.commit().expect("commit");
        let rows = store.tokens().expect("list");
        assert_eq!((rows.len(), rows[0].used, rows[0].id.as_str()), (1, 1, "0707070707070707"));
        assert_eq!(store.revoke_token("07").expect("too short"), 0);
        assert_eq!(store.revoke_token("0707").expect("revoke"), 1);
        assert!(store.tokens().expect("list")[0].revoked);
    }
}
