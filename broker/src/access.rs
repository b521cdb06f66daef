//! Who may do what: each login's grants, decided at CONNECT by the
//! gatekeeper the broker was started with (the coordinator's: it knows the
//! topic scheme and the enrolled keys), and checked on every PUBLISH,
//! SUBSCRIBE and will. Without a gatekeeper every login may do everything
//! (the broker then serves a fleet that authenticates each message itself,
//! as on an external broker).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::counters::BrokerCounters;

/// What kind of login a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoginKind {
    /// The coordinator itself: everything.
    Coordinator,
    /// An agent that proved the key enrolled under its name: its own topics.
    Agent,
    /// An operator's tool from the users file: reads what its line grants.
    Operator,
    /// Anyone else the gatekeeper lets in: enrolment only, rate-limited.
    Stranger,
    /// A broker without a gatekeeper: everything.
    #[default]
    Open,
}

impl LoginKind {
    pub const ALL: [LoginKind; 5] =
        [LoginKind::Coordinator, LoginKind::Agent, LoginKind::Operator, LoginKind::Stranger, LoginKind::Open];

    fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        super::counters::KINDS[self.index()]
    }
}

/// What one login may do, as MQTT topic filters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    pub kind: LoginKind,
    /// Who it is, for logs and take-overs (a client id is taken over only by the same identity).
    pub identity: String,
    /// Topics it may publish on.
    pub publish: Vec<String>,
    /// Topics it may receive: a subscription must lie within one of them.
    pub read: Vec<String>,
    /// Topics it may keep a retained message or a will on.
    pub retain: Vec<String>,
}

impl Grants {
    /// Everything (the coordinator, or a broker without a gatekeeper).
    pub fn all(kind: LoginKind, identity: &str) -> Grants {
        let every = vec!["#".to_string()];
        Grants { kind, identity: identity.to_string(), publish: every.clone(), read: every.clone(), retain: every }
    }

    pub fn may_publish(&self, topic: &str, retain: bool) -> bool {
        self.publish.iter().any(|f| matches(f, topic)) && (!retain || self.retain.iter().any(|f| matches(f, topic)))
    }

    /// A will: published and retained as the client asked, on its own topics only.
    pub fn may_will(&self, topic: &str, retain: bool) -> bool {
        self.may_publish(topic, retain)
    }

    pub fn may_subscribe(&self, filter: &str) -> bool {
        self.read.iter().any(|g| covers(g, filter))
    }
}

/// Decides logins for the broker.
pub trait Gatekeeper: Send + Sync + std::fmt::Debug {
    /// The grants of a CONNECT that is not the coordinator's, or the refusal
    /// it gets: `login` is the user name and password as sent.
    fn login(&self, client_id: &str, login: Option<(&str, &str)>) -> Result<Grants, Refusal>;

    /// Grants anew for a login one of whose publishes was refused: a
    /// stranger whose name was enrolled with the key it proved since it
    /// connected is now that agent. `None`: unchanged.
    fn regrant(&self, current: &Grants) -> Option<Grants>;
}

/// Why a login was refused (the CONNACK's return code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A login the gatekeeper does not know, or a proof that does not verify.
    BadLogin,
    /// No login where one is required, or a login that may not connect.
    NotAuthorized,
    /// Too many of its kind now (strangers): try later.
    Unavailable,
}

/// Whether `topic` matches the MQTT filter `filter`.
pub fn matches(filter: &str, topic: &str) -> bool {
    let mut t = topic.split('/');
    for f in filter.split('/') {
        match f {
            "#" => return true,
            "+" => {
                if t.next().is_none() {
                    return false;
                }
            }
            level => {
                if t.next() != Some(level) {
                    return false;
                }
            }
        }
    }
    t.next().is_none()
}

/// Whether every topic `filter` matches is matched by `grant`.
pub fn covers(grant: &str, filter: &str) -> bool {
    let mut f = filter.split('/');
    for g in grant.split('/') {
        match (g, f.next()) {
            ("#", _) => return true,
            (_, None) => return false,
            (_, Some("#")) => return false,
            ("+", Some(_)) => {}
            (level, Some(other)) => {
                if level != other {
                    return false;
                }
            }
        }
    }
    f.next().is_none()
}

/// One connection counted among its kind of login while it lives.
#[derive(Debug)]
pub(crate) struct KindCount {
    counters: Arc<BrokerCounters>,
    kind: LoginKind,
}

impl KindCount {
    /// Counts a connection of `kind`, or `None` when strangers hold their
    /// share of the sockets already (a quarter of `max_sockets`, at least 16).
    pub fn take(counters: &Arc<BrokerCounters>, kind: LoginKind, max_sockets: u64) -> Option<KindCount> {
        let n = &counters.by_kind[kind.index()];
        let before = n.fetch_add(1, Ordering::Relaxed);
        if kind == LoginKind::Stranger && before >= (max_sockets / 4).max(16) {
            n.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(KindCount { counters: counters.clone(), kind })
    }

    /// Counts it as `kind` from now on.
    pub fn moved(&mut self, kind: LoginKind) {
        self.counters.by_kind[self.kind.index()].fetch_sub(1, Ordering::Relaxed);
        self.counters.by_kind[kind.index()].fetch_add(1, Ordering::Relaxed);
        self.kind = kind;
    }
}

impl Drop for KindCount {
    fn drop(&mut self) {
        self.counters.by_kind[self.kind.index()].fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stranger's publishes: a burst, then one per interval.
#[derive(Debug)]
pub(crate) struct Rate {
    tokens: f64,
    at: Instant,
}

/// A stranger's largest packet (a signed Hello is at most 16 KiB): a
/// larger one closes its connection as malformed.
pub const STRANGER_MAX_PACKET: usize = 64 * 1024;

/// A stranger may publish this many at once, then one per second.
const STRANGER_BURST: f64 = 5.0;

impl Rate {
    pub fn new() -> Rate {
        Rate { tokens: STRANGER_BURST, at: Instant::now() }
    }

    /// Takes one publish's worth, or says it is over its rate.
    pub fn take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64()).min(STRANGER_BURST);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_match_filters_level_by_level() {
        assert!(matches("a/+/c", "a/b/c"));
        assert!(!matches("a/+/c", "a/b/d"));
        assert!(!matches("a/+", "a/b/c"));
        assert!(matches("a/#", "a/b/c"));
        assert!(matches("a/#", "a"), "# matches its parent too");
        assert!(matches("#", "x/y"));
        assert!(!matches("a/b", "a"));
        assert!(!matches("a/+", "a"));
    }

    #[test]
    fn a_grant_covers_only_filters_within_it() {
        assert!(covers("t/v2/down/a1/+", "t/v2/down/a1/+"));
        assert!(covers("t/v2/down/a1/+", "t/v2/down/a1/assign"));
        assert!(!covers("t/v2/down/a1/+", "t/v2/down/+/assign"), "another agent's");
        assert!(!covers("t/v2/down/a1/+", "t/v2/down/a1/#"), "deeper levels");
        assert!(!covers("t/v2/down/a1/+", "#"));
        assert!(!covers("t/v2/down/a1/+", "t/v2/down/a1"));
        assert!(covers("t/#", "t/v2/+/x/#"));
        assert!(covers("#", "#"));
        assert!(!covers("t/v2/coordinator/status", "t/v2/coordinator/+"));
    }

    #[test]
    fn grants_check_publish_retain_and_subscribe() {
        let g = Grants {
            kind: LoginKind::Agent,
            identity: "agent:a1".into(),
            publish: vec!["t/v2/up/a1/+".into()],
            read: vec!["t/v2/down/a1/+".into(), "t/v2/coordinator/status".into()],
            retain: vec!["t/v2/up/a1/status".into()],
        };
        assert!(g.may_publish("t/v2/up/a1/result", false));
        assert!(!g.may_publish("t/v2/up/a2/result", false), "another agent's topic");
        assert!(!g.may_publish("t/v2/down/a1/assign", false), "the coordinator's direction");
        assert!(g.may_publish("t/v2/up/a1/status", true));
        assert!(!g.may_publish("t/v2/up/a1/result", true), "retained only on its status");
        assert!(!g.may_will("t/v2/up/a2/status", true));
        assert!(g.may_subscribe("t/v2/down/a1/+"));
        assert!(g.may_subscribe("t/v2/coordinator/status"));
        assert!(!g.may_subscribe("t/#"));
        assert!(!g.may_subscribe("#"));
        let all = Grants::all(LoginKind::Open, "x");
        assert!(all.may_publish("any/thing", true) && all.may_subscribe("#"));
    }

    #[test]
    fn a_stranger_has_a_burst_then_one_per_second() {
        let mut r = Rate::new();
        let taken = (0..20).filter(|_| r.take()).count();
        assert_eq!(taken, 5, "the burst, and nothing more at once");
    }
}
