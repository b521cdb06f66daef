//! Typed protocol messages. [`AgentMessage`] travels from agents to the
//! coordinator, [`CoordinatorMessage`] the other way. Each variant has its own
//! topic kind (see [`crate::topic`]); a receiver checks that the two agree.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::measurement::{EnergyReading, EnergySourceKind, Measurement, Metrics, Telemetry};
// Kept while the coordinator still names it here; new code
// imports it from `crate::params`.
pub use crate::params::SystemParams;

/// Identifies one attempt of one trial of one study.
///
/// `study_id` is the random id the coordinator's store drew for the study
/// when it created it: two studies of the same name (two stores, or one
/// name reused) have different ids, so a coordinator never takes another
/// study's result for its own. The agent echoes the reference it was
/// assigned and never makes one up.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TrialRef {
    pub study: String,
    pub study_id: u64,
    pub trial: u64,
    pub attempt: u32,
}

impl std::fmt::Display for TrialRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}#{}", self.study, self.trial, self.attempt)
    }
}

/// An energy source an agent found, and whether it can read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnergySourceInfo {
    pub kind: EnergySourceKind,
    /// Domains offered (package-0, dram, BAT0...).
    pub domains: Vec<String>,
    pub readable: bool,
    /// Why it is not readable, or how to make it so.
    pub note: Option<String>,
}

/// What an agent is and what it can measure; sent on every (re)connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub agent: String,
    /// Random per process start: tells a restarted agent from a reconnected one.
    pub instance: u64,
    pub version: String,
    pub arch: String,
    pub os: String,
    pub kernel: String,
    pub cores: u32,
    pub memory_bytes: u64,
    pub slots: u32,
    /// Trials it holds ready behind its slots (at most
    /// [`MAX_LOOKAHEAD_PER_SLOT`] x `slots`): assigned ahead, started the
    /// moment a slot frees. Still leased to it until they end; a study with
    /// `lookahead = 0` never gets one of these.
    pub lookahead: u32,
    pub energy: Vec<EnergySourceInfo>,
    /// Counter events this agent can open (hardware and software).
    pub counters: Vec<String>,
    pub tags: BTreeMap<String, String>,
    /// GPUs it can give trials (NVML's list, read only); each trial of a
    /// study with `gpus = N` gets N of its own, never one another trial has.
    pub gpus: Vec<GpuDevice>,
}

/// Most GPUs an agent offers, and a trial is given.
pub const MAX_GPUS: u32 = 64;

/// One GPU an agent offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// NVML's index (PCI bus order).
    pub index: u32,
    /// `GPU-...`: what `CUDA_VISIBLE_DEVICES` is given, whatever the order.
    pub uuid: String,
    pub name: String,
}

/// Most trials an agent holds ahead per slot ([`AgentInfo::lookahead`]):
/// one keeps a slot busy while the next trial's assignment takes a round
/// trip; more, when its trials are as short as that round trip.
pub const MAX_LOOKAHEAD_PER_SLOT: u32 = 4;

impl AgentInfo {
    /// The trials it may hold ahead: its `lookahead`, at most
    /// [`MAX_LOOKAHEAD_PER_SLOT`] per slot.
    pub fn ahead_places(&self) -> u32 {
        self.lookahead.min(self.slots.saturating_mul(MAX_LOOKAHEAD_PER_SLOT))
    }

    /// An agent that says nothing about itself but its name and process
    /// instance (one slot, no energy source, no counters): for simulators
    /// and tests, which change the fields they care about.
    pub fn minimal(agent: &str, instance: u64) -> Self {
        AgentInfo {
            agent: agent.to_string(),
            instance,
            version: String::new(),
            arch: std::env::consts::ARCH.to_string(),
            os: std::env::consts::OS.to_string(),
            kernel: String::new(),
            cores: 1,
            memory_bytes: 0,
            slots: 1,
            lookahead: 0,
            energy: Vec::new(),
            counters: Vec::new(),
            tags: BTreeMap::new(),
            gpus: Vec::new(),
        }
    }

    /// Its device class: what makes its measurements comparable with
    /// another agent's (`x86_64, 2 cores, rapl`).
    pub fn device_class(&self) -> String {
        let energy = self.energy.iter().find(|e| e.readable).map_or("no energy", |e| e.kind.as_str());
        let mut class = format!("{}, {} cores, {energy}", self.arch, self.cores);
        // GPUs of another model make another class (an H200 node's
        // training times say nothing of a T4 node's).
        let mut models: BTreeMap<&str, usize> = BTreeMap::new();
        for g in &self.gpus {
            *models.entry(g.name.as_str()).or_default() += 1;
        }
        for (name, n) in models {
            class.push_str(&format!(", {n}x {name}"));
        }
        class
    }
}

/// Retained per agent, sealed in the agent's session. A connection lost
/// without a goodbye ends with the agent's Last Will instead
/// ([`crate::auth::Will`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub online: bool,
    pub instance: u64,
}

/// The session token the coordinator gave an agent in its
/// [`crate::auth::Welcome`]. Every sealed frame carries it (see
/// [`crate::auth::Sealed`]); the coordinator refuses frames with a token it
/// did not issue to that agent, or one that has expired.
pub type SessionToken = u64;

/// "I have `free` slots, and room for `ahead` trials held ready behind
/// them". Sent once welcomed and whenever a slot frees up (or a held trial
/// starts). `seq` grows with every request, so a stale request is
/// recognisable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkRequest {
    pub seq: u64,
    pub free: u32,
    /// Free places for trials held ahead ([`AgentInfo::lookahead`]).
    pub ahead: u32,
    /// Trials the agent is running right now.
    pub running: Vec<TrialRef>,
    /// Trials it holds ready to start, not started yet: the coordinator
    /// cancels any it no longer leases to this agent.
    pub held: Vec<TrialRef>,
}

impl WorkRequest {
    /// Whether the agent runs or holds `trial`.
    pub fn lists(&self, trial: &TrialRef) -> bool {
        self.running.contains(trial) || self.held.contains(trial)
    }
}

/// Metrics of one finished epoch, sent while the trial runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub trial: TrialRef,
    pub epoch: u32,
    pub elapsed_us: u64,
    pub metrics: Metrics,
    /// The checkpoint the workload saved after this epoch, if it said.
    pub checkpoint: Option<String>,
    /// The profile of a pipelined trial's first window, sent with the first
    /// epoch that ended once the window had: the coordinator may answer with
    /// a configuration known good for jobs like it
    /// ([`ReconfigureReason::Reuse`]), and the trial stops probing.
    pub profile: Option<crate::measurement::WindowProfile>,
}

/// The final measurement of one attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialResult {
    pub trial: TrialRef,
    pub measurement: Measurement,
}

/// An assignment the agent will not run (more than its free slots, or it is draining).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub trial: TrialRef,
    pub reason: String,
}

/// Agent to coordinator.
// A result (with its series and profile) is the largest variant by far; the
// messages are short-lived, so boxing it would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentMessage {
    Status(AgentStatus),
    Request(WorkRequest),
    Progress(Progress),
    Result(TrialResult),
    Refuse(Refusal),
    /// The agent's CPU, memory and power, at `--telemetry-interval`.
    Telemetry(Telemetry),
    /// Answers [`CoordinatorMessage::Sync`] with its number: everything the
    /// coordinator sent before it has arrived.
    Synced(u64),
    /// What this machine used over the window of a trial another agent ran
    /// ([`CoordinatorMessage::CoMeasure`]). Since protocol version 10.
    CoMeasured(CoMeasured),
    /// Several messages in one frame, in the order sent (typically a result
    /// and the work request that follows it), each encoded on its own
    /// ([`AgentMessage::bundle`]). 2 to [`MAX_BUNDLE`] of them, none a
    /// bundle or a status (retained on a topic of its own); travels on the
    /// `result` topic. Since protocol version 11.
    Bundle(#[serde(deserialize_with = "bounded_items")] Vec<Encoded>),
}

impl AgentMessage {
    /// Whether this message may travel in a bundle: not a status (retained)
    /// nor a bundle.
    pub fn bundleable(&self) -> bool {
        !matches!(self, AgentMessage::Status(_) | AgentMessage::Bundle(_))
    }

    /// A bundle of `msgs` (none of them a bundle or a status).
    pub fn bundle(msgs: &[AgentMessage]) -> Result<Self, crate::CodecError> {
        encode_items(msgs).map(AgentMessage::Bundle)
    }

    /// The messages of a bundle, in order; any other message alone. A
    /// bundle that is not well formed is an error, saying why.
    pub fn unbundle(self) -> Result<Vec<AgentMessage>, String> {
        match self {
            AgentMessage::Bundle(items) => decode_items(&items, AgentMessage::bundleable),
            other => Ok(vec![other]),
        }
    }
}

/// Measure this machine over a trial another agent runs: a study's
/// `[measure] nodes` (a Spark or MPI job spans machines; the agent that
/// starts it measures only its own). Since protocol version 10.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoMeasure {
    /// The attempt measured (it runs on another agent).
    pub trial: TrialRef,
    pub step: CoMeasureStep,
}

/// What a [`CoMeasure`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CoMeasureStep {
    /// Start sampling this machine's energy and CPU time now (the attempt
    /// was just assigned: it starts after this). Not told its window
    /// within `within_ms` (the attempt's lease), the agent forgets it.
    Start { within_ms: u64 },
    /// The attempt ran from `from_unix_ms` to `to_unix_ms` by its agent's
    /// marks: answer with [`CoMeasured`] for that window (again, when
    /// asked again: the answer may have been lost).
    Window { from_unix_ms: u64, to_unix_ms: u64 },
    /// The attempt ended without a result: stop and forget it.
    Abandon,
}

/// What one machine used over a trial's window ([`CoMeasureStep::Window`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoMeasured {
    pub trial: TrialRef,
    /// The window asked for, echoed.
    pub from_unix_ms: u64,
    pub to_unix_ms: u64,
    /// Energy of the whole machine (or, for the estimate, of the agent's
    /// CPUs) over the window; no power series.
    pub energy: EnergyReading,
    /// Busy CPU time of the agent's CPUs over the window (every process,
    /// not only the trial's), and how many CPUs that is.
    pub cpu_us: u64,
    pub cpus: u32,
    /// How much of the window the samples covered (the rest is
    /// extrapolated from the covered part; the reading is invalid below
    /// nine tenths).
    pub covered_ms: u64,
    /// Every GPU of the machine over the window.
    pub gpus: Vec<crate::measurement::GpuEnergy>,
}

impl CoMeasured {
    /// What the machine used over the window: its CPU reading and its
    /// GPUs', valid only when each is.
    pub fn energy_figure(&self) -> crate::measurement::EnergyFigure {
        self.energy.figure().with_parts(self.gpus.iter().map(crate::measurement::GpuEnergy::figure))
    }
}

/// What to run: the command with parameters already substituted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// What the trial starts under (the first probe configuration of a
    /// pipelined trial).
    pub system: SystemParams,
    pub timeout_ms: u64,
    /// Pipelined mode: the system configurations to probe inside the trial.
    pub probe: Option<ProbePlan>,
    /// GPUs the trial needs (`gpus = N` in its study), each its own: the
    /// agent gives it that many it is not giving another trial, names them
    /// in `CUDA_VISIBLE_DEVICES` and measures their energy.
    pub gpus: u32,
}

/// How a pipelined trial probes system configurations inside itself,
/// window by window, without a round trip per window: the agent runs
/// `warmup` units and then one window of `window` units under each
/// configuration in order (the first is [`TrialSpec::system`]), keeps the
/// best by `select` for the rest of the trial, and reports one
/// [`crate::measurement::Segment`] per window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbePlan {
    pub configs: Vec<SystemParams>,
    /// Units per probe window (at least 1).
    pub window: u32,
    /// Units before the first window, run under the first configuration
    /// and not measured as a probe (start-up, caches, data loading).
    pub warmup: u32,
    /// What a window counts.
    pub unit: WindowUnit,
    pub select: Select,
    /// The workload speaks the control channel (`TUNEFLEET_CONTROL=stdin`,
    /// docs/PROTOCOL.md), so thread counts can change live.
    pub control: bool,
    /// `configs` are the first and, after it, each a change of some
    /// parameters from it (one at a time): each change is probed on top of
    /// the best configuration measured so far, not of the first, so
    /// parameters that interact are still found together (a change that
    /// leads to a configuration already measured is skipped). Since
    /// protocol version 9.
    pub from_best: bool,
}

/// Rounds in which a pipelined trial measures its two best configurations
/// again when the noise of their windows cannot tell them apart (two
/// windows each round), at most.
pub const MAX_REPROBES: u32 = 2;

impl ProbePlan {
    /// The most units the probing can take (see [`probe_units_at_most`]).
    pub fn units_at_most(&self) -> u64 {
        probe_units_at_most(self.configs.len() as u64, self.window, self.warmup)
    }
}

/// The most units probing `configs` configurations can take: the warm-up,
/// one window per configuration and every round of windows measured again.
pub fn probe_units_at_most(configs: u64, window: u32, warmup: u32) -> u64 {
    let windows = configs.saturating_add(2 * u64::from(MAX_REPROBES));
    u64::from(warmup).saturating_add(u64::from(window).saturating_mul(windows))
}

/// What probe windows count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowUnit {
    /// Epoch lines.
    Epochs,
    /// Step lines (Zeus's granularity, inside an epoch); the agent asks the
    /// workload for them with `TUNEFLEET_STEPS=1`. A window an epoch end
    /// cuts short is measured again.
    Steps,
}

/// Which probed configuration wins (Zeus's rules, per epoch of each window).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Select {
    /// Shortest time per epoch.
    Time,
    /// Least energy per epoch.
    Energy,
    /// Least energy x time per epoch.
    Edp,
    /// Least `eta * energy + (1 - eta) * max_power * time`, eta in thousandths.
    Cost { eta_permille: u16 },
    /// Least energy among those at most this much slower than the fastest, in thousandths.
    MaxSlowdown { permille: u32 },
}

/// A new system configuration for a running trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconfigure {
    pub trial: TrialRef,
    pub system: SystemParams,
    pub reason: ReconfigureReason,
}

/// Why a running trial's configuration changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReconfigureReason {
    /// Asked for (an operator, a test).
    Requested,
    /// The job's first window profiled like a cluster of jobs whose best
    /// configuration is known: the trial skips the rest of its probing and
    /// runs under it (a `Reused` segment).
    Reuse,
}

/// A trial handed to an agent, answering its request `request_seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub trial: TrialRef,
    pub request_seq: u64,
    pub spec: TrialSpec,
}

/// Stop running this attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    pub trial: TrialRef,
    pub reason: String,
}

/// What the coordinator did with a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckOutcome {
    /// Stored now: the agent may forget it.
    Stored,
    /// The coordinator had it already (or the trial is done): forget it.
    Duplicate,
    /// The coordinator cannot place it (a study it does not run, an attempt
    /// it never gave) or cannot store it (a field out of bounds, or a store
    /// error while handling it: docs/PROTOCOL.md, "Bounds"). The agent
    /// moves it aside (`tunefleet-agent spool`), never re-sends it on its
    /// own, and never deletes it.
    Refused(String),
}

/// The coordinator's answer to a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultAck {
    pub trial: TrialRef,
    pub outcome: AckOutcome,
}

/// Coordinator to agent (sealed in the session; the session itself starts
/// with [`crate::auth::Welcome`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CoordinatorMessage {
    Assign(Assignment),
    Cancel(Cancel),
    Ack(ResultAck),
    /// Answer with [`AgentMessage::Synced`]: sent before the coordinator
    /// exits, so it knows every acknowledgement before it has arrived.
    Sync(u64),
    /// Apply this system configuration to a running trial from now on
    /// (it ends the trial's current segment).
    Reconfigure(Reconfigure),
    /// Measure this machine over another agent's trial. Since protocol
    /// version 10.
    CoMeasure(CoMeasure),
    /// Something the agent's operator should hear (another machine tried
    /// to join under this agent's name): the agent logs it. At most
    /// [`MAX_NOTICE_BYTES`]. Since protocol version 12.
    Notice(String),
    /// Several messages to one agent in one frame, in the order sent (what
    /// one turn of the coordinator has for it: typically an acknowledgement
    /// and the next assignment), each encoded on its own
    /// ([`CoordinatorMessage::bundle`]). 2 to [`MAX_BUNDLE`] of them, none a
    /// bundle; travels on the `ack` topic. Since protocol version 11.
    Bundle(#[serde(deserialize_with = "bounded_items")] Vec<Encoded>),
}

/// One message of a bundle, encoded on its own (postcard, no version byte):
/// a bundle holds bytes, not messages, so decoding one never recurses
/// however it was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encoded(#[serde(with = "serde_bytes")] pub Vec<u8>);

/// Longest [`CoordinatorMessage::Notice`] an agent logs (a longer one is cut).
pub const MAX_NOTICE_BYTES: usize = 1024;

/// Most messages in one [`AgentMessage::Bundle`] or [`CoordinatorMessage::Bundle`].
pub const MAX_BUNDLE: usize = 64;

/// A bundle's items as decoded: more than [`MAX_BUNDLE`] fail at the one
/// past it, so a frame claiming a million items allocates no more than that.
fn bounded_items<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Encoded>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<Encoded>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "at most {MAX_BUNDLE} messages")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element::<Encoded>()? {
                if items.len() == MAX_BUNDLE {
                    return Err(serde::de::Error::invalid_length(MAX_BUNDLE + 1, &self));
                }
                items.push(item);
            }
            Ok(items)
        }
    }
    d.deserialize_seq(Bounded)
}

/// `msgs` encoded one by one, for a bundle.
fn encode_items<T: Serialize>(msgs: &[T]) -> Result<Vec<Encoded>, crate::CodecError> {
    msgs.iter()
        .map(|m| postcard::to_allocvec(m).map(Encoded).map_err(|e| crate::CodecError::Encode(e.to_string())))
        .collect()
}

/// The messages of a bundle's `items`, each of which must decode whole and
/// be `bundleable`; 2 to [`MAX_BUNDLE`] of them.
fn decode_items<T: serde::de::DeserializeOwned>(
    items: &[Encoded],
    bundleable: fn(&T) -> bool,
) -> Result<Vec<T>, String> {
    if items.len() < 2 || items.len() > MAX_BUNDLE {
        return Err(format!("a bundle of {} messages (2 to {MAX_BUNDLE})", items.len()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match postcard::take_from_bytes::<T>(&item.0) {
            Ok((msg, [])) if bundleable(&msg) => Ok(msg),
            Ok((_, [])) => Err(format!("message {i} of a bundle cannot be bundled (a bundle or a status)")),
            Ok(_) => Err(format!("message {i} of a bundle has trailing bytes")),
            Err(e) => Err(format!("message {i} of a bundle does not decode: {e}")),
        })
        .collect()
}

/// `msgs` to one peer, in order, as the frames to send them in: each run of
/// bundleable messages in groups of up to [`MAX_BUNDLE`] (a group of two or
/// more goes as a bundle), every other message alone.
pub fn frames<T>(msgs: Vec<T>, bundleable: fn(&T) -> bool) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    for msg in msgs {
        match out.last_mut() {
            Some(group) if bundleable(&msg) && group.len() < MAX_BUNDLE && group.first().is_some_and(bundleable) => {
                group.push(msg)
            }
            _ => out.push(vec![msg]),
        }
    }
    out
}

impl CoordinatorMessage {
    /// Whether this message may travel in a bundle: anything but a bundle.
    pub fn bundleable(&self) -> bool {
        !matches!(self, CoordinatorMessage::Bundle(_))
    }

    /// A bundle of `msgs` (none of them a bundle).
    pub fn bundle(msgs: &[CoordinatorMessage]) -> Result<Self, crate::CodecError> {
        encode_items(msgs).map(CoordinatorMessage::Bundle)
    }

    /// The messages of a bundle, in order; any other message alone. A
    /// bundle that is not well formed is an error, saying why.
    pub fn unbundle(self) -> Result<Vec<CoordinatorMessage>, String> {
        match self {
            CoordinatorMessage::Bundle(items) => decode_items(&items, CoordinatorMessage::bundleable),
            other => Ok(vec![other]),
        }
    }
}

/// Retained on the coordinator topic, signed with the coordinator's key
/// (the Last Will carries the signed `online: false`). Agents pin `key`,
/// ignore statuses older than the newest they have seen, and announce
/// themselves again when a new `instance` comes online.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStatus {
    pub online: bool,
    pub instance: u64,
    /// When this coordinator instance started (Unix ms): newer wins.
    pub started_unix_ms: u64,
    /// The coordinator's Ed25519 public key.
    pub key: [u8; 32],
}

#[cfg(test)]
mod bundle_tests {
    use super::*;

    #[test]
    fn frames_bundle_runs_of_bundleable_messages_in_order_and_leave_the_rest_alone() {
        let even = |n: &u32| n % 2 == 0;
        assert_eq!(
            frames(vec![2, 4, 1, 6, 3, 3, 8, 10, 12], even),
            vec![vec![2, 4], vec![1], vec![6], vec![3], vec![3], vec![8, 10, 12]]
        );
        assert!(frames(Vec::<u32>::new(), even).is_empty());
        let long = frames((0..(2 * MAX_BUNDLE as u32 + 1)).map(|n| n * 2).collect(), even);
        assert_eq!(long.iter().map(Vec::len).collect::<Vec<_>>(), vec![MAX_BUNDLE, MAX_BUNDLE, 1]);
        assert_eq!(long.concat(), (0..(2 * MAX_BUNDLE as u32 + 1)).map(|n| n * 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_bundle_unbundles_in_order_and_a_malformed_one_is_refused() {
        let sync = CoordinatorMessage::Sync;
        let bundle = |msgs: &[CoordinatorMessage]| CoordinatorMessage::bundle(msgs).expect("encodes");
        let two = bundle(&[sync(1), sync(2)]);
        assert_eq!(two.clone().unbundle(), Ok(vec![sync(1), sync(2)]));
        assert_eq!(sync(1).unbundle(), Ok(vec![sync(1)]));
        assert!(bundle(&[sync(1)]).unbundle().is_err(), "one message is no bundle");
        assert!(bundle(&[sync(1), two.clone()]).unbundle().is_err(), "nested");
        assert!(bundle(&vec![sync(1); MAX_BUNDLE + 1]).unbundle().is_err(), "too many");
        let CoordinatorMessage::Bundle(mut items) = two else { panic!("a bundle") };
        items[1].0.push(0);
        assert!(CoordinatorMessage::Bundle(items.clone()).unbundle().is_err(), "trailing bytes");
        items[1].0 = vec![0xff; 3];
        assert!(CoordinatorMessage::Bundle(items).unbundle().is_err(), "garbage");
        let status = AgentMessage::Status(AgentStatus { online: true, instance: 1 });
        assert!(!status.bundleable());
        let agent = |msgs: &[AgentMessage]| AgentMessage::bundle(msgs).expect("encodes");
        assert!(agent(&[AgentMessage::Synced(1), status]).unbundle().is_err(), "a status is retained alone");
        assert_eq!(
            agent(&[AgentMessage::Synced(1), AgentMessage::Synced(2)]).unbundle(),
            Ok(vec![AgentMessage::Synced(1), AgentMessage::Synced(2)])
        );
    }

    #[test]
    fn a_bundle_of_too_many_items_does_not_decode() {
        let item = Encoded(Vec::new());
        let fits = crate::encode(&AgentMessage::Bundle(vec![item.clone(); MAX_BUNDLE])).expect("encodes");
        assert!(crate::decode::<AgentMessage>(&fits).is_ok());
        for n in [MAX_BUNDLE + 1, 500_000] {
            let many = crate::encode(&AgentMessage::Bundle(vec![item.clone(); n])).expect("encodes");
            assert!(crate::decode::<AgentMessage>(&many).is_err(), "{n} items");
            let many = crate::encode(&CoordinatorMessage::Bundle(vec![item.clone(); n])).expect("encodes");
            assert!(crate::decode::<CoordinatorMessage>(&many).is_err(), "{n} items");
        }
    }

    #[test]
    fn a_bundle_nested_deep_decodes_flat_without_recursing() {
        // However deep a forged bundle nests, each level is bytes: decoding
        // the outer one reads one level, and the nested one is refused.
        let mut msg = CoordinatorMessage::Sync(0);
        for _ in 0..10_000 {
            msg = CoordinatorMessage::bundle(&[msg, CoordinatorMessage::Sync(1)]).expect("encodes");
        }
        let bytes = crate::encode(&msg).expect("encodes");
        let decoded: CoordinatorMessage = crate::decode(&bytes).expect("decodes");
        assert!(decoded.unbundle().is_err(), "a bundle in a bundle is refused");
    }
}
