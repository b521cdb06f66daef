//! The embedded broker's routing tables, pure: who is subscribed to what,
//! and what is retained, each as a tree of topic levels.
//!
//! Both are walked level by level, so routing a message costs what its
//! topic's depth and the wildcards on its way cost, not the number of
//! subscriptions or retained topics: 10,000 agents each subscribed to their
//! own `root/v2/down/{id}/+` and each retaining `root/v2/up/{id}/status` add
//! one branch each, and a publish to one agent, or a new agent's
//! subscription, looks only at that agent's branch. (A broker that matches
//! every new topic against every filter, or every new filter against every
//! topic it has seen, does N x N work as a fleet joins.)

use std::collections::HashMap;

/// A connection, as the broker numbers them.
pub type ConnId = u64;

/// Levels a topic or filter may have. The trees are walked level by level
/// (recursively): a bound keeps a hostile topic of a million `/` from
/// overflowing the stack. Tunefleet's own topics have 5.
pub const MAX_LEVELS: usize = 32;
/// Bytes a topic or filter may have.
pub const MAX_TOPIC_BYTES: usize = 1024;

/// Why a topic or filter is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("empty topic")]
    Empty,
    #[error("wildcards (+, #) are not allowed in a topic name")]
    WildcardInTopic,
    #[error("'#' must be a whole level and the last one")]
    BadMultiLevel,
    #[error("'+' must be a whole level")]
    BadSingleLevel,
    #[error("a NUL character in a topic")]
    Nul,
    #[error("more than {MAX_LEVELS} levels or {MAX_TOPIC_BYTES} bytes")]
    TooLong,
}

/// What topics and filters share: not empty, no NUL, within the bounds.
fn check_common(topic: &str) -> Result<(), TopicError> {
    if topic.is_empty() {
        return Err(TopicError::Empty);
    }
    if topic.contains('\0') {
        return Err(TopicError::Nul);
    }
    if topic.len() > MAX_TOPIC_BYTES || topic.bytes().filter(|b| *b == b'/').count() >= MAX_LEVELS {
        return Err(TopicError::TooLong);
    }
    Ok(())
}

/// Checks a topic a client publishes to.
pub fn check_topic(topic: &str) -> Result<(), TopicError> {
    check_common(topic)?;
    if topic.contains(['+', '#']) {
        return Err(TopicError::WildcardInTopic);
    }
    Ok(())
}

/// Checks a subscription filter.
pub fn check_filter(filter: &str) -> Result<(), TopicError> {
    check_common(filter)?;
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Err(TopicError::BadMultiLevel);
        }
        if level.contains('+') && *level != "+" {
            return Err(TopicError::BadSingleLevel);
        }
    }
    Ok(())
}

/// One level of the subscription tree.
#[derive(Debug, Default)]
struct SubNode {
    literal: HashMap<Box<str>, SubNode>,
    plus: Option<Box<SubNode>>,
    /// Subscribers whose filter ends here with `#` (matching this level and everything below).
    hash: HashMap<ConnId, u8>,
    /// Subscribers whose filter ends exactly here.
    here: HashMap<ConnId, u8>,
}

impl SubNode {
    fn is_empty(&self) -> bool {
        self.literal.is_empty() && self.plus.is_none() && self.hash.is_empty() && self.here.is_empty()
    }
}

/// Subscriptions: filter -> connections and the QoS each asked for.
#[derive(Debug, Default)]
pub struct Subscriptions {
    root: SubNode,
    count: usize,
}

impl Subscriptions {
    /// Adds (or updates the QoS of) `conn`'s subscription to a checked `filter`.
    pub fn add(&mut self, filter: &str, conn: ConnId, qos: u8) {
        let mut node = &mut self.root;
        let mut levels = filter.split('/').peekable();
        while let Some(level) = levels.next() {
            if level == "#" && levels.peek().is_none() {
                if node.hash.insert(conn, qos).is_none() {
                    self.count += 1;
                }
                return;
            }
            node = if level == "+" {
                node.plus.get_or_insert_with(Box::default)
            } else {
                node.literal.entry(level.into()).or_default()
            };
        }
        if node.here.insert(conn, qos).is_none() {
            self.count += 1;
        }
    }

    /// Removes `conn`'s subscription to `filter`; true when there was one.
    pub fn remove(&mut self, filter: &str, conn: ConnId) -> bool {
        let levels: Vec<&str> = filter.split('/').collect();
        let removed = remove_at(&mut self.root, &levels, conn);
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// How many (filter, connection) pairs there are.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Every connection subscribed to `topic`, once each, with the highest
    /// QoS among its matching filters.
    pub fn matching(&self, topic: &str) -> Vec<(ConnId, u8)> {
        let levels: Vec<&str> = topic.split('/').collect();
        let mut found: Vec<(ConnId, u8)> = Vec::new();
        // Wildcards at the first level do not match topics starting with '$'.
        let system = topic.starts_with('$');
        collect(&self.root, &levels, system, &mut found);
        found.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        found.dedup_by_key(|(c, _)| *c);
        found
    }
}

fn remove_at(node: &mut SubNode, levels: &[&str], conn: ConnId) -> bool {
    match levels {
        [] => node.here.remove(&conn).is_some(),
        ["#"] => node.hash.remove(&conn).is_some(),
        [first, rest @ ..] => {
            let removed;
            if *first == "+" {
                let Some(child) = node.plus.as_mut() else { return false };
                removed = remove_at(child, rest, conn);
                if child.is_empty() {
                    node.plus = None;
                }
            } else {
                let Some(child) = node.literal.get_mut(*first) else { return false };
                removed = remove_at(child, rest, conn);
                if child.is_empty() {
                    node.literal.remove(*first);
                }
            }
            removed
        }
    }
}

fn collect(node: &SubNode, levels: &[&str], system: bool, out: &mut Vec<(ConnId, u8)>) {
    if !system {
        out.extend(node.hash.iter().map(|(c, q)| (*c, *q)));
    }
    match levels {
        [] => out.extend(node.here.iter().map(|(c, q)| (*c, *q))),
        [first, rest @ ..] => {
            if let Some(child) = node.literal.get(*first) {
                collect(child, rest, false, out);
            }
            if let (Some(child), false) = (node.plus.as_deref(), system) {
                collect(child, rest, false, out);
            }
        }
    }
}

/// One level of the retained-message tree.
#[derive(Debug)]
struct RetainedNode<T> {
    children: HashMap<Box<str>, RetainedNode<T>>,
    value: Option<T>,
}

impl<T> Default for RetainedNode<T> {
    fn default() -> Self {
        RetainedNode { children: HashMap::new(), value: None }
    }
}

/// Retained messages by topic.
#[derive(Debug)]
pub struct Retained<T> {
    root: RetainedNode<T>,
    count: usize,
    bytes: usize,
}

impl<T> Default for Retained<T> {
    fn default() -> Self {
        Retained { root: RetainedNode::default(), count: 0, bytes: 0 }
    }
}

impl<T> Retained<T> {
    /// Keeps `value` (of `size` bytes) for `topic`, or forgets the topic's
    /// message when `value` is `None` (an empty retained publish).
    pub fn set(&mut self, topic: &str, value: Option<(T, usize)>, size_of: impl Fn(&T) -> usize) {
        match value {
            Some((v, size)) => {
                let mut node = &mut self.root;
                for level in topic.split('/') {
                    node = node.children.entry(level.into()).or_default();
                }
                if let Some(old) = node.value.replace(v) {
                    self.bytes -= size_of(&old);
                } else {
                    self.count += 1;
                }
                self.bytes += size;
            }
            None => {
                let levels: Vec<&str> = topic.split('/').collect();
                if let Some(old) = take_at(&mut self.root, &levels) {
                    self.count -= 1;
                    self.bytes -= size_of(&old);
                }
            }
        }
    }

    /// The message kept for exactly `topic`.
    pub fn get(&self, topic: &str) -> Option<&T> {
        let mut node = &self.root;
        for level in topic.split('/') {
            node = node.children.get(level)?;
        }
        node.value.as_ref()
    }

    /// Retained messages kept.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of payload (as the caller counted them) kept.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The retained messages whose topics match a checked `filter`, at
    /// most `limit` of them: the walk stops there, so its cost is bounded
    /// by the limit, not by what is retained.
    pub fn matching(&self, filter: &str, limit: usize) -> Vec<&T> {
        let levels: Vec<&str> = filter.split('/').collect();
        let mut out = Found { items: Vec::new(), limit };
        retained_collect(&self.root, &levels, true, &mut out);
        out.items
    }
}

fn take_at<T>(node: &mut RetainedNode<T>, levels: &[&str]) -> Option<T> {
    match levels {
        [] => node.value.take(),
        [first, rest @ ..] => {
            let child = node.children.get_mut(*first)?;
            let taken = take_at(child, rest);
            if child.value.is_none() && child.children.is_empty() {
                node.children.remove(*first);
            }
            taken
        }
    }
}

/// What a walk of the retained tree has found, up to its limit.
struct Found<'a, T> {
    items: Vec<&'a T>,
    limit: usize,
}

impl<'a, T> Found<'a, T> {
    fn full(&self) -> bool {
        self.items.len() >= self.limit
    }

    fn extend(&mut self, value: Option<&'a T>) {
        if !self.full() {
            self.items.extend(value);
        }
    }
}

fn retained_collect<'a, T>(node: &'a RetainedNode<T>, levels: &[&str], top: bool, out: &mut Found<'a, T>) {
    if out.full() {
        return;
    }
    match levels {
        [] => out.extend(node.value.as_ref()),
        ["#"] => {
            // `a/#` matches `a` itself and everything below it.
            out.extend(node.value.as_ref());
            for (name, child) in &node.children {
                if out.full() {
                    return;
                }
                if !(top && name.starts_with('$')) {
                    subtree(child, out);
                }
            }
        }
        ["+", rest @ ..] => {
            for (name, child) in &node.children {
                if out.full() {
                    return;
                }
                if !(top && name.starts_with('$')) {
                    retained_collect(child, rest, false, out);
                }
            }
        }
        [first, rest @ ..] => {
            if let Some(child) = node.children.get(*first) {
                retained_collect(child, rest, false, out);
            }
        }
    }
}

fn subtree<'a, T>(node: &'a RetainedNode<T>, out: &mut Found<'a, T>) {
    out.extend(node.value.as_ref());
    for child in node.children.values() {
        if out.full() {
            return;
        }
        subtree(child, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: Vec<(ConnId, u8)>) -> Vec<ConnId> {
        v.into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn filters_match_as_mqtt_says() {
        let mut s = Subscriptions::default();
        s.add("a/b/c", 1, 1);
        s.add("a/+/c", 2, 1);
        s.add("a/#", 3, 0);
        s.add("#", 4, 0);
        s.add("+/+", 5, 0);
        s.add("a/b/+", 6, 1);
        assert_eq!(ids(s.matching("a/b/c")), vec![1, 2, 3, 4, 6]);
        assert_eq!(ids(s.matching("a")), vec![3, 4], "a/# matches its parent level");
        assert_eq!(ids(s.matching("a/x")), vec![3, 4, 5]);
        assert_eq!(ids(s.matching("a/x/c/d")), vec![3, 4]);
        assert_eq!(ids(s.matching("$SYS/x")), Vec::<ConnId>::new(), "wildcards skip $ topics at the top");
        assert_eq!(s.len(), 6);
    }

    #[test]
    fn a_connection_gets_one_copy_at_its_highest_qos() {
        let mut s = Subscriptions::default();
        s.add("a/+", 7, 0);
        s.add("a/b", 7, 1);
        s.add("#", 7, 0);
        assert_eq!(s.matching("a/b"), vec![(7, 1)]);
        s.add("a/b", 7, 0);
        assert_eq!(s.matching("a/b"), vec![(7, 0)], "a second subscription to a filter replaces its QoS");
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn removing_prunes_and_leaves_others() {
        let mut s = Subscriptions::default();
        s.add("r/v2/down/a1/+", 1, 1);
        s.add("r/v2/down/a2/+", 2, 1);
        s.add("r/#", 3, 1);
        assert!(s.remove("r/v2/down/a1/+", 1));
        assert!(!s.remove("r/v2/down/a1/+", 1), "already gone");
        assert!(!s.remove("r/v2/down/a2/+", 1), "another connection's");
        assert_eq!(ids(s.matching("r/v2/down/a1/assign")), vec![3]);
        assert_eq!(ids(s.matching("r/v2/down/a2/assign")), vec![2, 3]);
        assert!(s.remove("r/#", 3));
        assert!(s.remove("r/v2/down/a2/+", 2));
        assert!(s.root.is_empty(), "every branch pruned: {:?}", s.root);
        assert!(s.is_empty());
    }

    #[test]
    fn retained_by_filter() {
        let mut r: Retained<&str> = Retained::default();
        let size = |v: &&str| v.len();
        r.set("r/v2/up/a1/status", Some(("one", 3)), size);
        r.set("r/v2/up/a2/status", Some(("two", 3)), size);
        r.set("r/v2/coordinator/status", Some(("c", 1)), size);
        r.set("$SYS/x", Some(("sys", 3)), size);
        let mut all = r.matching("r/v2/up/+/status", usize::MAX);
        all.sort();
        assert_eq!(all, vec![&"one", &"two"]);
        assert_eq!(r.matching("r/v2/coordinator/status", usize::MAX), vec![&"c"]);
        assert_eq!(r.matching("r/#", usize::MAX).len(), 3);
        assert_eq!(r.matching("r/#", 2).len(), 2, "the walk stops at its limit");
        assert_eq!(r.matching("r/v2/up/+/status", 1).len(), 1);
        assert_eq!(r.matching("#", usize::MAX).len(), 3, "# does not reach $ topics");
        assert_eq!(r.matching("$SYS/#", usize::MAX).len(), 1);
        r.set("r/v2/up/a1/status", Some(("uno!", 4)), size);
        assert_eq!((r.len(), r.bytes()), (4, 4 + 3 + 1 + 3));
        r.set("r/v2/up/a1/status", None, size);
        r.set("r/v2/up/a9/status", None, size);
        assert_eq!(r.matching("r/v2/up/+/status", usize::MAX), vec![&"two"]);
        assert_eq!((r.len(), r.bytes()), (3, 3 + 1 + 3));
    }

    #[test]
    fn topics_and_filters_are_checked() {
        assert!(check_topic("a/b").is_ok());
        assert_eq!(check_topic("a/+"), Err(TopicError::WildcardInTopic));
        assert_eq!(check_topic(""), Err(TopicError::Empty));
        assert!(check_filter("a/+/#").is_ok());
        assert_eq!(check_filter("a/#/b"), Err(TopicError::BadMultiLevel));
        assert_eq!(check_filter("a/b#"), Err(TopicError::BadMultiLevel));
        assert_eq!(check_filter("a/b+"), Err(TopicError::BadSingleLevel));
        let deep = "a/".repeat(MAX_LEVELS - 1) + "a";
        assert!(check_topic(&deep).is_ok() && check_filter(&deep).is_ok(), "{MAX_LEVELS} levels pass");
        let deeper = format!("{deep}/a");
        assert_eq!(check_topic(&deeper), Err(TopicError::TooLong));
        assert_eq!(check_filter(&deeper), Err(TopicError::TooLong));
        assert_eq!(check_topic(&"x".repeat(MAX_TOPIC_BYTES + 1)), Err(TopicError::TooLong));
    }
}
