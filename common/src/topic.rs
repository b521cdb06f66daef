//! The topic scheme. Every topic lives under `{root}/v2/`, where `root`
//! defaults to `tunefleet` and can be changed so several fleets (or tests)
//! share one broker:
//!
//! | topic | direction | payload |
//! |---|---|---|
//! | `{root}/v2/up/{id}/hello` | agent → coordinator | `UpFrame::Hello` (signed) |
//! | `{root}/v2/up/{id}/status` | agent → all, retained | `AgentMessage::Status`, or the Last Will `UpFrame::Will` |
//! | `{root}/v2/up/{id}/request` | agent → coordinator | `AgentMessage::Request` |
//! | `{root}/v2/up/{id}/progress` | agent → coordinator | `AgentMessage::Progress` |
//! | `{root}/v2/up/{id}/result` | agent → coordinator | `AgentMessage::Result`, `AgentMessage::Bundle` |
//! | `{root}/v2/up/{id}/refuse` | agent → coordinator | `AgentMessage::Refuse` |
//! | `{root}/v2/up/{id}/telemetry` | agent → coordinator | `AgentMessage::Telemetry` |
//! | `{root}/v2/up/{id}/synced` | agent → coordinator | `AgentMessage::Synced` |
//! | `{root}/v2/down/{id}/welcome` | coordinator → agent | `DownFrame::Welcome` (signed) |
//! | `{root}/v2/down/{id}/assign` | coordinator → agent | `CoordinatorMessage::Assign` |
//! | `{root}/v2/down/{id}/cancel` | coordinator → agent | `CoordinatorMessage::Cancel` |
//! | `{root}/v2/down/{id}/ack` | coordinator → agent | `CoordinatorMessage::Ack`, `CoordinatorMessage::Bundle` |
//! | `{root}/v2/down/{id}/sync` | coordinator → agent | `CoordinatorMessage::Sync` |
//! | `{root}/v2/coordinator/status` | coordinator → all, retained, Last Will | signed `CoordinatorStatus` |
//!
//! Every `AgentMessage` and `CoordinatorMessage` travels sealed in its
//! session ([`crate::auth`]).
//!
//! Each side subscribes with ONE wildcard filter ([`Topics::from_agents`],
//! [`Topics::to_agent`]): brokers such as rumqttd keep a log per filter, so
//! only a single filter keeps one publisher's messages in the order sent
//! (a result before the work request that follows it).

use crate::message::{AgentMessage, CoordinatorMessage};

/// Protocol segment of every topic.
pub const VERSION_SEGMENT: &str = "v2";
/// Default root of the topic tree.
pub const DEFAULT_ROOT: &str = "tunefleet";
/// Longest agent id accepted.
pub const MAX_AGENT_ID: usize = 64;

/// The last segment of an agent topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AgentTopic {
    Hello,
    Status,
    Request,
    Progress,
    Result,
    Refuse,
    Telemetry,
    Synced,
    Welcome,
    Assign,
    Cancel,
    Ack,
    Sync,
    /// Live changes to a running trial ([`CoordinatorMessage::Reconfigure`]).
    Control,
}

impl AgentTopic {
    pub const ALL: [AgentTopic; 14] = [
        AgentTopic::Hello,
        AgentTopic::Status,
        AgentTopic::Request,
        AgentTopic::Progress,
        AgentTopic::Result,
        AgentTopic::Refuse,
        AgentTopic::Telemetry,
        AgentTopic::Synced,
        AgentTopic::Welcome,
        AgentTopic::Assign,
        AgentTopic::Cancel,
        AgentTopic::Ack,
        AgentTopic::Sync,
        AgentTopic::Control,
    ];
    /// Kinds an agent publishes (the coordinator subscribes to these).
    pub const FROM_AGENT: [AgentTopic; 8] = [
        AgentTopic::Hello,
        AgentTopic::Status,
        AgentTopic::Request,
        AgentTopic::Progress,
        AgentTopic::Result,
        AgentTopic::Refuse,
        AgentTopic::Telemetry,
        AgentTopic::Synced,
    ];
    /// Kinds the coordinator publishes (an agent subscribes to its own).
    pub const TO_AGENT: [AgentTopic; 6] = [
        AgentTopic::Welcome,
        AgentTopic::Assign,
        AgentTopic::Cancel,
        AgentTopic::Ack,
        AgentTopic::Sync,
        AgentTopic::Control,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AgentTopic::Hello => "hello",
            AgentTopic::Status => "status",
            AgentTopic::Request => "request",
            AgentTopic::Progress => "progress",
            AgentTopic::Result => "result",
            AgentTopic::Refuse => "refuse",
            AgentTopic::Telemetry => "telemetry",
            AgentTopic::Synced => "synced",
            AgentTopic::Welcome => "welcome",
            AgentTopic::Assign => "assign",
            AgentTopic::Cancel => "cancel",
            AgentTopic::Ack => "ack",
            AgentTopic::Sync => "sync",
            AgentTopic::Control => "control",
        }
    }

    /// `up` for what agents send, `down` for what the coordinator sends.
    pub fn direction(self) -> &'static str {
        if Self::TO_AGENT.contains(&self) {
            "down"
        } else {
            "up"
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The topic kind a message must travel on.
    pub fn of_agent_message(msg: &AgentMessage) -> Self {
        match msg {
            AgentMessage::Status(_) => AgentTopic::Status,
            AgentMessage::Request(_) => AgentTopic::Request,
            AgentMessage::Progress(_) => AgentTopic::Progress,
            AgentMessage::Result(_) => AgentTopic::Result,
            AgentMessage::Refuse(_) => AgentTopic::Refuse,
            AgentMessage::Telemetry(_) => AgentTopic::Telemetry,
            AgentMessage::Synced(_) => AgentTopic::Synced,
            // What the agent measured of its machine, like its telemetry.
            AgentMessage::CoMeasured(_) => AgentTopic::Telemetry,
            // A result, typically, and the request after it.
            AgentMessage::Bundle(_) => AgentTopic::Result,
        }
    }

    /// The topic kind a message must travel on.
    pub fn of_coordinator_message(msg: &CoordinatorMessage) -> Self {
        match msg {
            CoordinatorMessage::Assign(_) => AgentTopic::Assign,
            CoordinatorMessage::Cancel(_) => AgentTopic::Cancel,
            CoordinatorMessage::Ack(_) => AgentTopic::Ack,
            CoordinatorMessage::Sync(_) => AgentTopic::Sync,
            CoordinatorMessage::Reconfigure(_) | CoordinatorMessage::CoMeasure(_) | CoordinatorMessage::Notice(_) => {
                AgentTopic::Control
            }
            // An acknowledgement, typically, and the next assignment.
            CoordinatorMessage::Bundle(_) => AgentTopic::Ack,
        }
    }
}

/// A parsed Tunefleet topic.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topic {
    Agent { agent: String, kind: AgentTopic },
    CoordinatorStatus,
}

/// Why a string is not a Tunefleet topic or name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic {0:?} is not under this fleet's root")]
    ForeignRoot(String),
    #[error("topic {0:?} is not a Tunefleet v1 topic")]
    Unknown(String),
    #[error("invalid agent id {0:?}: use 1 to 64 characters of A-Z a-z 0-9 . _ -")]
    AgentId(String),
    #[error("invalid topic root {0:?}: no wildcards, no empty levels")]
    Root(String),
}

/// Checks an agent id: 1 to 64 characters of `[A-Za-z0-9._-]`.
pub fn validate_agent_id(id: &str) -> Result<(), TopicError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_AGENT_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(TopicError::AgentId(id.to_string()))
    }
}

/// Builds and parses topics under one root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    /// `{root}/v2/`, with the trailing slash.
    prefix: String,
}

impl Default for Topics {
    fn default() -> Self {
        Topics { prefix: format!("{DEFAULT_ROOT}/{VERSION_SEGMENT}/") }
    }
}

impl Topics {
    /// Topics under `root`, which may itself contain `/` levels.
    pub fn new(root: &str) -> Result<Self, TopicError> {
        let bad = root.is_empty() || root.contains(['+', '#', '\0']) || root.split('/').any(str::is_empty);
        if bad {
            return Err(TopicError::Root(root.to_string()));
        }
        Ok(Topics { prefix: format!("{root}/{VERSION_SEGMENT}/") })
    }

    /// The root this was built with.
    pub fn root(&self) -> &str {
        &self.prefix[..self.prefix.len() - VERSION_SEGMENT.len() - 2]
    }

    pub fn agent(&self, agent: &str, kind: AgentTopic) -> String {
        format!("{}{}/{agent}/{}", self.prefix, kind.direction(), kind.as_str())
    }

    pub fn coordinator_status(&self) -> String {
        format!("{}coordinator/status", self.prefix)
    }

    /// The one filter the coordinator subscribes to: everything agents send.
    pub fn from_agents(&self) -> String {
        format!("{}up/+/+", self.prefix)
    }

    /// Everything one agent sends.
    pub fn from_agent(&self, agent: &str) -> String {
        format!("{}up/{agent}/+", self.prefix)
    }

    /// The one filter an agent subscribes to: everything sent to it.
    pub fn to_agent(&self, agent: &str) -> String {
        format!("{}down/{agent}/+", self.prefix)
    }

    pub fn build(&self, topic: &Topic) -> String {
        match topic {
            Topic::Agent { agent, kind } => self.agent(agent, *kind),
            Topic::CoordinatorStatus => self.coordinator_status(),
        }
    }

    pub fn parse(&self, topic: &str) -> Result<Topic, TopicError> {
        let rest = topic.strip_prefix(&self.prefix).ok_or_else(|| TopicError::ForeignRoot(topic.to_string()))?;
        if rest == "coordinator/status" {
            return Ok(Topic::CoordinatorStatus);
        }
        let unknown = || TopicError::Unknown(topic.to_string());
        let (direction, rest) = rest.split_once('/').ok_or_else(unknown)?;
        let (agent, kind) = rest.split_once('/').ok_or_else(unknown)?;
        validate_agent_id(agent)?;
        let kind = AgentTopic::parse(kind).filter(|k| k.direction() == direction).ok_or_else(unknown)?;
        Ok(Topic::Agent { agent: agent.to_string(), kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_known_and_rejects_others() {
        let t = Topics::new("fleet/a").expect("root");
        assert_eq!(t.root(), "fleet/a");
        assert_eq!(t.agent("n1", AgentTopic::Result), "fleet/a/v2/up/n1/result");
        assert_eq!(t.agent("n1", AgentTopic::Assign), "fleet/a/v2/down/n1/assign");
        assert_eq!(t.from_agents(), "fleet/a/v2/up/+/+");
        assert_eq!(t.to_agent("n1"), "fleet/a/v2/down/n1/+");
        assert!(matches!(t.parse("fleet/a/v2/down/n1/result"), Err(TopicError::Unknown(_))));
        assert_eq!(t.parse("fleet/a/v2/coordinator/status"), Ok(Topic::CoordinatorStatus));
        assert!(matches!(t.parse("tunefleet/v2/up/x/hello"), Err(TopicError::ForeignRoot(_))));
        assert!(matches!(t.parse("fleet/a/v2/up/x/bogus"), Err(TopicError::Unknown(_))));
        assert!(matches!(t.parse("fleet/a/v2/up/x+/hello"), Err(TopicError::AgentId(_))));
        assert!(matches!(t.parse("fleet/a/v2/up/x/y/hello"), Err(TopicError::Unknown(_))));
        assert!(Topics::new("a/+/b").is_err());
        assert!(Topics::new("a//b").is_err());
        assert!(Topics::new("").is_err());
    }

    proptest! {
        #[test]
        fn agent_topics_round_trip(root in "[a-z]{1,8}(/[a-z0-9]{1,6}){0,2}", agent in "[A-Za-z0-9._-]{1,64}", k in 0usize..AgentTopic::ALL.len()) {
            let topics = Topics::new(&root).expect("valid root");
            let topic = Topic::Agent { agent, kind: AgentTopic::ALL[k] };
            prop_assert_eq!(topics.parse(&topics.build(&topic)), Ok(topic));
        }

        #[test]
        fn parse_never_panics(s in ".{0,80}") {
            let _ = Topics::default().parse(&s);
        }
    }
}
