//! Who may log in to the embedded broker, and what each login may do: the
//! broker's gatekeeper, decided from the store's enrolled keys, the users
//! file and the topic scheme.
//!
//! * The coordinator logs in with the credential made up at start (the
//!   broker itself checks that one).
//! * An **agent** logs in as its name with a proof of the key enrolled
//!   under it ([`tunefleet_common::auth::login_password`]): it publishes on
//!   its own `up` topics, keeps a retained status and a will only on its
//!   own status topic, and reads its own `down` topics and the
//!   coordinator's status.
//! * A **stranger** proves a key not (yet) enrolled under the name it gives:
//!   it may publish its Hello (at a stranger's rate) and read its own `down`
//!   topics, and, when no key holds the name, keep its status and will. Once
//!   the coordinator enrols that key under that name, the same connection
//!   is an agent. With a users file, a stranger must also carry a line's
//!   password.
//! * An **operator's tool** logs in with a users-file line that names the
//!   topics it may read (`user:password:FILTER,FILTER`); a line without
//!   filters is a password agents carry, never a login of its own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use tunefleet_common::auth::{hex, parse_login, short_key, PublicKey};
use tunefleet_common::topic::{validate_agent_id, AgentTopic, Topics};

use super::broker::{same_secret, Gatekeeper, Grants, LoginKind, Refusal};
use crate::store::Store;

/// How far an agent's clock may be from the coordinator's.
pub const CLOCK_WINDOW_MS: u64 = 15 * 60 * 1000;

/// One line of the users file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserLine {
    pub password: String,
    /// Topics an operator's tool may read; empty: a password agents carry.
    pub read: Vec<String>,
}

/// Reads a users file: `user:password` (a password agents carry) or
/// `user:password:FILTER,FILTER` (an operator's tool reading those topics).
pub fn read_user_lines(path: &std::path::Path) -> Result<HashMap<String, UserLine>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut users = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("{}:{}: expected user:password or user:password:FILTER,FILTER", path.display(), i + 1);
        let mut parts = line.splitn(3, ':');
        let (user, password) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if user.is_empty() || password.is_empty() {
            return Err(bad());
        }
        let read: Vec<String> = parts.next().map_or_else(Vec::new, |f| {
            f.split(',').map(str::trim).filter(|f| !f.is_empty()).map(str::to_string).collect()
        });
        if read.iter().any(|f| super::broker::routes::check_filter(f).is_err()) {
            return Err(bad());
        }
        users.insert(user.to_string(), UserLine { password: password.to_string(), read });
    }
    if users.is_empty() {
        return Err(format!("{}: no user:password line", path.display()));
    }
    Ok(users)
}

/// The coordinator's gatekeeper for its embedded broker.
pub struct Logins {
    topics: Topics,
    store_path: PathBuf,
    /// Opened on first use (the coordinator creates the store after the broker starts).
    store: Mutex<Option<Store>>,
    users: Option<HashMap<String, UserLine>>,
    /// The latest proof time taken per name: a proof is taken once.
    last: Mutex<HashMap<String, u64>>,
    /// Strangers' logins: tokens left and when last counted.
    strangers: Mutex<(f64, std::time::Instant)>,
    /// Logins refused so far (their warnings are bounded).
    refused: std::sync::atomic::AtomicU64,
}

/// Strangers' logins checked per second, sustained, and at once.
/// (A signature check costs about 50 µs: at this rate about 5 % of a core;
/// a fleet of 5,000 new agents joins at once.)
const STRANGER_LOGINS_PER_S: f64 = 1_000.0;
const STRANGER_LOGIN_BURST: f64 = 5_000.0;

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logins").field("root", &self.topics.root()).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Logins {
    pub fn new(topics: Topics, store_path: PathBuf, users: Option<HashMap<String, UserLine>>) -> Logins {
        Logins {
            topics,
            store_path,
            store: Mutex::new(None),
            users,
            last: Mutex::default(),
            strangers: Mutex::new((STRANGER_LOGIN_BURST, std::time::Instant::now())),
            refused: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Takes one stranger's login from its budget, or says it is spent.
    fn stranger_budget(&self) -> bool {
        let mut b = lock(&self.strangers);
        let now = std::time::Instant::now();
        let refill = now.saturating_duration_since(b.1).as_secs_f64() * STRANGER_LOGINS_PER_S;
        *b = ((b.0 + refill).min(STRANGER_LOGIN_BURST), now);
        if b.0 >= 1.0 {
            b.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Whether a refused login is worth a warning: the first ten, then at powers of two.
    fn loud(&self) -> bool {
        let n = self.refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        n <= 10 || n.is_power_of_two()
    }

    /// The key enrolled under `name`; `Err` when the store cannot say.
    fn enrolled(&self, name: &str) -> Result<Option<PublicKey>, ()> {
        let mut store = lock(&self.store);
        if store.is_none() {
            *store = Some(Store::open_read_only(&self.store_path).map_err(|e| {
                tracing::warn!(error = %e, "broker logins: cannot read the store's keys yet");
            })?);
        }
        let found = store.as_ref().map(|s| s.pinned_key(name)).transpose().map_err(|e| {
            tracing::warn!(error = %e, "broker logins: cannot read a key");
        })?;
        Ok(found.flatten())
    }

    fn agent(&self, name: &str) -> Grants {
        Grants {
            kind: LoginKind::Agent,
            identity: format!("agent:{name}"),
            publish: vec![self.topics.from_agent(name)],
            read: vec![self.topics.to_agent(name), self.topics.coordinator_status()],
            retain: vec![self.topics.agent(name, AgentTopic::Status)],
        }
    }

    fn stranger(&self, name: &str, key: &PublicKey, name_is_free: bool) -> Grants {
        let status = self.topics.agent(name, AgentTopic::Status);
        let mut publish = vec![self.topics.agent(name, AgentTopic::Hello)];
        let mut retain = Vec::new();
        if name_is_free {
            publish.push(status.clone());
            retain.push(status);
        }
        Grants {
            kind: LoginKind::Stranger,
            identity: format!("stranger:{name}:{}", hex(key)),
            publish,
            read: vec![self.topics.to_agent(name), self.topics.coordinator_status()],
            retain,
        }
    }

    /// A login by key: the agent, or a stranger.
    fn by_key(&self, name: &str, password: &str) -> Result<Grants, Refusal> {
        let proof = parse_login(password).ok_or(Refusal::BadLogin)?;
        if validate_agent_id(name).is_err() {
            return Err(Refusal::BadLogin);
        }
        let enrolled = self.enrolled(name).map_err(|()| Refusal::Unavailable)?;
        let agent = enrolled == Some(proof.key);
        // A stranger's signature is checked within a budget of its own: a
        // flood of made-up logins cannot take the broker's CPU, nor the
        // enrolled agents' logins.
        if !agent && !self.stranger_budget() {
            return Err(Refusal::Unavailable);
        }
        if proof.verify(name).is_err() {
            if self.loud() {
                tracing::warn!(agent = %name, "broker: a login whose key proof does not verify, refused");
            }
            return Err(Refusal::BadLogin);
        }
        let now = now_ms();
        if proof.at_ms.abs_diff(now) > CLOCK_WINDOW_MS {
            if self.loud() {
                tracing::warn!(
                    agent = %name,
                    skew_s = (proof.at_ms as i64 - now as i64) / 1000,
                    "broker: a login from a clock more than 15 min off the coordinator's, refused (set the agent's clock)"
                );
            }
            return Err(Refusal::BadLogin);
        }
        if agent {
            let mut last = lock(&self.last);
            let seen = last.entry(name.to_string()).or_insert(0);
            if proof.at_ms <= *seen {
                tracing::warn!(agent = %name, "broker: a login proof used before, refused (replayed?)");
                return Err(Refusal::BadLogin);
            }
            *seen = proof.at_ms;
            return Ok(self.agent(name));
        }
        if let Some(users) = &self.users {
            let carried = proof.secret.as_ref().is_some_and(|(user, pass)| {
                users.get(user).is_some_and(|line| same_secret(line.password.as_bytes(), pass.as_bytes()))
            });
            if !carried {
                if self.loud() {
                    tracing::warn!(agent = %name, key = %short_key(&proof.key), "broker: a stranger without a users-file password, refused");
                }
                return Err(Refusal::NotAuthorized);
            }
        }
        Ok(self.stranger(name, &proof.key, enrolled.is_none()))
    }
}

impl Gatekeeper for Logins {
    fn login(&self, _client_id: &str, login: Option<(&str, &str)>) -> Result<Grants, Refusal> {
        let Some((user, password)) = login else {
            return Err(Refusal::NotAuthorized);
        };
        if password.starts_with(tunefleet_common::auth::LOGIN_PREFIX) {
            return self.by_key(user, password);
        }
        let line = self.users.as_ref().and_then(|u| u.get(user));
        match line {
            Some(l) if same_secret(l.password.as_bytes(), password.as_bytes()) && !l.read.is_empty() => Ok(Grants {
                kind: LoginKind::Operator,
                identity: format!("operator:{user}"),
                publish: Vec::new(),
                read: l.read.clone(),
                retain: Vec::new(),
            }),
            // A password agents carry is no login of its own.
            Some(l) if same_secret(l.password.as_bytes(), password.as_bytes()) => Err(Refusal::NotAuthorized),
            _ => Err(Refusal::BadLogin),
        }
    }

    fn regrant(&self, current: &Grants) -> Option<Grants> {
        if current.kind != LoginKind::Stranger {
            return None;
        }
        let mut parts = current.identity.splitn(3, ':');
        let (_, name, key) = (parts.next()?, parts.next()?, parts.next()?);
        let enrolled = self.enrolled(name).ok()??;
        (hex(&enrolled) == key).then(|| self.agent(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::auth::{login_password, Identity};

    fn logins(dir: &std::path::Path, users: Option<HashMap<String, UserLine>>) -> Logins {
        let path = dir.join("s.db");
        Store::open(&path).expect("store");
        Logins::new(Topics::new("t").expect("root"), path, users)
    }

    fn pin(dir: &std::path::Path, name: &str, id: &Identity) {
        let mut store = Store::open(&dir.join("s.db")).expect("store");
        store.trust_agent(name, &id.public(), 1).expect("pin");
    }

    fn proof(id: &Identity, name: &str, at: u64) -> String {
        login_password(id, name, at, None)
    }

    #[test]
    fn an_enrolled_key_logs_in_as_its_agent_once_per_proof() {
        let dir = tempfile::tempdir().expect("tmp");
        let g = logins(dir.path(), None);
        let (id, _) = Identity::generate().expect("key");
        pin(dir.path(), "a1", &id);
        let now = now_ms();
        let grants = g.login("c", Some(("a1", &proof(&id, "a1", now)))).expect("admitted");
        assert_eq!(grants.kind, LoginKind::Agent);
        assert!(grants.may_publish("t/v2/up/a1/result", false));
        assert!(!grants.may_publish("t/v2/up/a2/result", false));
        assert!(grants.may_subscribe("t/v2/down/a1/+") && !grants.may_subscribe("t/#"));
        assert_eq!(g.login("c", Some(("a1", &proof(&id, "a1", now)))), Err(Refusal::BadLogin), "replayed");
        assert!(g.login("c", Some(("a1", &proof(&id, "a1", now + 1)))).is_ok(), "a later proof");
        let old = now - CLOCK_WINDOW_MS - 1_000;
        assert_eq!(g.login("c", Some(("a1", &proof(&id, "a1", old)))), Err(Refusal::BadLogin), "a clock far off");
        assert_eq!(
            g.login("c", Some(("a2", &proof(&id, "a1", now + 2)))),
            Err(Refusal::BadLogin),
            "made for another name"
        );
        assert_eq!(g.login("c", None), Err(Refusal::NotAuthorized), "no login");
        assert_eq!(g.login("c", Some(("a1", "guess"))), Err(Refusal::BadLogin), "a password");
    }

    #[test]
    fn a_stranger_may_only_say_hello_until_its_key_is_enrolled() {
        let dir = tempfile::tempdir().expect("tmp");
        let g = logins(dir.path(), None);
        let (holder, _) = Identity::generate().expect("key");
        let (other, _) = Identity::generate().expect("key");
        pin(dir.path(), "a1", &holder);
        // Another key under a held name: its Hello, no status, no will.
        let s = g.login("c", Some(("a1", &proof(&other, "a1", now_ms())))).expect("a stranger");
        assert_eq!(s.kind, LoginKind::Stranger);
        assert!(s.may_publish("t/v2/up/a1/hello", false));
        assert!(!s.may_publish("t/v2/up/a1/result", false));
        assert!(!s.may_will("t/v2/up/a1/status", true), "no will over the holder's status");
        assert_eq!(g.regrant(&s), None, "the name stays the holder's");
        // A new name: its own status and will too; enrolled, it is the agent.
        let (new, _) = Identity::generate().expect("key");
        let s = g.login("c", Some(("n1", &proof(&new, "n1", now_ms())))).expect("a stranger");
        assert!(s.may_will("t/v2/up/n1/status", true));
        // A flood of strangers' logins is checked within its budget; the
        // enrolled agent's login is not part of it.
        // The proofs are made first: what is timed is the checking alone,
        // and what must hold is said by the time it took (the budget refills
        // as the clock goes, however busy the machine is).
        let proofs: Vec<String> =
            (0..7_000u64).map(|i| proof(&Identity::generate().expect("key").0, "x", now_ms() + i)).collect();
        let started = std::time::Instant::now();
        let refused = proofs.iter().filter(|p| g.login("c", Some(("x", p))) == Err(Refusal::Unavailable)).count();
        let refilled = started.elapsed().as_secs_f64() * STRANGER_LOGINS_PER_S;
        let least = 7_000.0 - STRANGER_LOGIN_BURST - refilled - 1.0;
        assert!(refused as f64 >= least, "past the burst, strangers wait: {refused} refused, {least} at least");
        // A budget spent a second deep refuses the next stranger whatever the load.
        *lock(&g.strangers) = (-STRANGER_LOGINS_PER_S, std::time::Instant::now());
        let late = proof(&Identity::generate().expect("key").0, "y", now_ms());
        assert_eq!(g.login("c", Some(("y", &late))), Err(Refusal::Unavailable));
        assert_eq!(
            g.login("c", Some(("a1", &proof(&holder, "a1", now_ms() + 5_000)))).map(|g| g.kind),
            Ok(LoginKind::Agent)
        );
        assert_eq!(g.regrant(&s), None, "not enrolled yet");
        pin(dir.path(), "n1", &new);
        assert_eq!(g.regrant(&s).map(|g| g.kind), Some(LoginKind::Agent));
    }

    #[test]
    fn a_users_file_keeps_strangers_out_and_grants_operators_their_reads() {
        let dir = tempfile::tempdir().expect("tmp");
        let file = dir.path().join("users");
        std::fs::write(&file, "# logins\nfleet:s3cret\nwatch:pw:t/v2/coordinator/status, t/v2/up/+/status\n")
            .expect("users");
        let users = read_user_lines(&file).expect("parses");
        assert_eq!(users["watch"].read, ["t/v2/coordinator/status", "t/v2/up/+/status"]);
        let g = logins(dir.path(), Some(users));
        let (id, _) = Identity::generate().expect("key");
        let bare = proof(&id, "n1", now_ms());
        assert_eq!(g.login("c", Some(("n1", &bare))), Err(Refusal::NotAuthorized), "a stranger without the password");
        let carried = login_password(&id, "n1", now_ms() + 1, Some(("fleet", "s3cret")));
        assert_eq!(g.login("c", Some(("n1", &carried))).map(|g| g.kind), Ok(LoginKind::Stranger));
        let wrong = login_password(&id, "n1", now_ms() + 2, Some(("fleet", "nope")));
        assert_eq!(g.login("c", Some(("n1", &wrong))), Err(Refusal::NotAuthorized));
        let op = g.login("c", Some(("watch", "pw"))).expect("an operator");
        assert_eq!(op.kind, LoginKind::Operator);
        assert!(op.may_subscribe("t/v2/up/+/status") && !op.may_subscribe("t/#"));
        assert!(!op.may_publish("t/v2/up/a1/status", false), "reads only");
        assert_eq!(g.login("c", Some(("fleet", "s3cret"))), Err(Refusal::NotAuthorized), "an agents' password alone");
        assert_eq!(g.login("c", Some(("watch", "other"))), Err(Refusal::BadLogin));
        std::fs::write(&file, "x:y:bad#filter/x\n").expect("users");
        assert!(read_user_lines(&file).is_err(), "a bad filter");
    }
}
