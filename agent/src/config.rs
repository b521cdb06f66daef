//! What the agent runs with: [`AgentConfig`], and its documented defaults.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use tunefleet_common::topic::Topics;
use tunefleet_common::BrokerUrl;

use crate::energy::{EnergyRoots, EstimateModel};
use crate::{cgroup, conditions, counters, foreign};

/// Everything the agent needs to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub broker: BrokerUrl,
    /// Brokers tried in turn after `broker` when it cannot be reached
    /// (coordinators that fail over, each with its embedded broker: only
    /// the active one's listens).
    pub more_brokers: Vec<BrokerUrl>,
    /// Agent id, valid per `tunefleet_common::topic::validate_agent_id`.
    pub name: String,
    pub tags: BTreeMap<String, String>,
    pub slots: u32,
    /// Trials held ready behind the slots (`--lookahead`, at most 4 per
    /// slot); `None`: automatic, one per slot and more for trials short
    /// beside a round trip to the coordinator ([`crate::protocol::AgentState::with_auto_lookahead`]).
    pub lookahead: Option<u32>,
    pub topics: Topics,
    pub keepalive: Duration,
    /// Where unacknowledged results survive a restart; none: memory only.
    pub state_dir: Option<PathBuf>,
    /// Stop after this many trials finished (and their results acked).
    pub max_trials: Option<u64>,
    /// Stop after no trial ran for this long.
    pub exit_when_idle: Option<Duration>,
    /// Bound of the shutdown drain.
    pub grace: Duration,
    pub cgroup_root: PathBuf,
    pub energy_model: EstimateModel,
    /// Where the metered energy sources are looked for.
    pub energy_roots: EnergyRoots,
    /// Interval between energy and counter samples while a trial runs.
    pub sample_interval: Duration,
    /// Interval between telemetry messages. Load from outside a trial is
    /// judged per interval, in the samples taken while the trial runs.
    pub telemetry_interval: Duration,
    /// The CPUs the agent is confined to (`--cpus`); none: every CPU it
    /// may use. Confining the process itself is the caller's part
    /// ([`crate::cpus::pin_self`], as `main` does before the runtime starts).
    pub cpus: Option<Vec<u32>>,
    /// A trial's measurement is flagged when load from outside it exceeded
    /// this fraction of the agent's CPUs in a telemetry sample taken while
    /// it ran.
    pub interference_threshold: f64,
    /// Where the device's conditions are read, and the battery threshold.
    pub conditions: conditions::ConditionsConfig,
    /// Executable re-run as the exec wrapper; none: this executable.
    pub wrapper: Option<PathBuf>,
    /// Broker login and TLS.
    pub security: tunefleet_common::security::ClientSecurity,
    /// The coordinator's public key; none: pinned from the join token.
    pub coordinator_key: Option<tunefleet_common::auth::PublicKey>,
    /// The join token: names the coordinator, and admits this agent's key.
    pub join: Option<tunefleet_common::auth::JoinToken>,
    /// Pin the first coordinator seen (a lab where every broker user is trusted).
    pub trust_first_coordinator: bool,
    /// Programs the agent may run (glob patterns on the program, `argv[0]`);
    /// empty: any.
    pub allow: crate::allow::Allow,
}

impl AgentConfig {
    /// A configuration with the documented defaults.
    pub fn new(broker: BrokerUrl, name: String, topics: Topics) -> Self {
        AgentConfig {
            broker,
            more_brokers: Vec::new(),
            name,
            tags: BTreeMap::new(),
            slots: 1,
            lookahead: None,
            topics,
            keepalive: Duration::from_secs(5),
            state_dir: None,
            max_trials: None,
            exit_when_idle: None,
            grace: Duration::from_secs(10),
            cgroup_root: PathBuf::from(cgroup::DEFAULT_ROOT),
            energy_model: EstimateModel::default(),
            energy_roots: EnergyRoots::default(),
            sample_interval: counters::DEFAULT_SAMPLE_INTERVAL,
            telemetry_interval: Duration::from_secs(1),
            cpus: None,
            interference_threshold: foreign::DEFAULT_THRESHOLD,
            conditions: conditions::ConditionsConfig::default(),
            wrapper: None,
            security: Default::default(),
            coordinator_key: None,
            join: None,
            trust_first_coordinator: false,
            allow: crate::allow::Allow::default(),
        }
    }
}
