//! The agent's side of the protocol as a pure state machine: it takes
//! typed events (connected, a coordinator message, a trial finished...) and
//! returns [`Action`]s (publish this, start that, cancel this). No sockets,
//! no clocks, no processes: `lib.rs` carries the actions out.
//!
//! Rules it enforces:
//! * never two running trials on one GPU: a trial of a study with
//!   `gpus = N` starts on N GPUs no other running trial holds, waits for
//!   them held ahead like for a slot, or is refused (as one needing more
//!   GPUs than the agent has);
//! * never more trials running than slots; an assignment that finds every
//!   slot busy is held ready (at most `lookahead` of them, in order) and
//!   started the moment a slot frees, before the coordinator hears of it:
//!   no round trip between trials. One without room, while draining, after
//!   `max_trials`, or for a trial already running is refused (an already
//!   finished trial awaiting its ack is refused and its result published
//!   again); a held trial is given back (refused) when the agent drains or
//!   its conditions turn bad, and dropped when it is cancelled;
//! * on every (re)connect the session ends; a Hello goes out when the
//!   coordinator's (verified) status says it is online: the retained one
//!   delivered on subscription, or a live one for a new instance. Once the
//!   coordinator welcomes us: the online status, a Request and every result
//!   not yet acknowledged, all sealed in that session (by `lib.rs`);
//! * a result is kept until the coordinator acknowledges it (stored or a
//!   duplicate: forget it) or refuses it (park it: kept aside on disk,
//!   never re-sent on its own, never deleted);
//! * a Sync is answered at once, so the coordinator knows everything it sent
//!   before has arrived;
//! * while the device's conditions are bad for measuring ([`AgentState::on_conditions`]:
//!   charging, low battery, throttled) no slot is free, and every trial
//!   running through them has the reasons in its measurement's `interference`.

use std::collections::{BTreeMap, VecDeque};

use tunefleet_common::measurement::{ExitOutcome, Measurement};
use tunefleet_common::message::{
    AckOutcome, AgentInfo, AgentMessage, AgentStatus, Assignment, Cancel, CoordinatorStatus, GpuDevice, Progress,
    Refusal, ResultAck, TrialRef, TrialResult, TrialSpec, WorkRequest,
};

use crate::cpus;

/// A trial to start now.
#[derive(Debug, Clone, PartialEq)]
pub struct StartTrial {
    pub trial: TrialRef,
    pub spec: TrialSpec,
    pub cpus: Vec<u32>,
    /// Its own GPUs (`spec.gpus` of them), given to no other running trial.
    pub gpus: Vec<GpuDevice>,
}

/// What the agent must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Ask for a session: a signed Hello with this information (built by `lib.rs`).
    Hello(Box<AgentInfo>),
    Publish(AgentMessage),
    Start(StartTrial),
    Cancel(TrialRef),
    /// Apply this system configuration to a running trial.
    Reconfigure(TrialRef, tunefleet_common::params::SystemParams, tunefleet_common::message::ReconfigureReason),
    /// Keep this result on disk until it is acknowledged.
    Keep(TrialResult),
    /// The result of this trial was acknowledged and may be forgotten.
    Forget(TrialRef),
    /// The coordinator refused this result: keep it aside, with the reason.
    Park(TrialRef, String),
    /// Measure this machine over another agent's trial ([`crate::comeasure`]).
    CoMeasure(tunefleet_common::message::CoMeasure),
}

/// The agent's protocol state.
#[derive(Debug, Clone)]
pub struct AgentState {
    info: AgentInfo,
    allowed_cpus: Vec<u32>,
    seq: u64,
    running: BTreeMap<TrialRef, Vec<u32>>,
    /// The GPUs (their NVML indexes) each running trial was given.
    gpus: BTreeMap<TrialRef, Vec<u32>>,
    /// Running trials whose workload exited, their result not yet in: no
    /// longer in a slot ([`AgentState::on_exited`]).
    exited: std::collections::BTreeSet<TrialRef>,
    /// Trials assigned while every slot was busy, started in this order as
    /// slots free (at most `info.lookahead`).
    held: VecDeque<Assignment>,
    unacked: BTreeMap<TrialRef, TrialResult>,
    draining: bool,
    coordinator: Option<CoordinatorStatus>,
    /// Whether the current connection has a session.
    welcomed: bool,
    /// Running trials the coordinator told us to cancel (or the drain did).
    cancelling: std::collections::BTreeSet<TrialRef>,
    /// A Sync answered once `cancelling` is empty.
    sync_waiting: Option<u64>,
    max_trials: Option<u64>,
    started: u64,
    finished: u64,
    /// Why the device's conditions are bad for measuring; empty: good.
    conditions: Vec<String>,
    /// Why results cannot be made durable in the state directory (full,
    /// failing); `None`: they can. No trial is taken meanwhile.
    spool: Option<String>,
    /// With an automatic lookahead: the places held ahead for trials longer
    /// than a round trip (`info.lookahead` for shorter ones).
    auto_ahead: Option<u32>,
    /// The caller's clock (µs), set before each event ([`AgentState::set_clock`]).
    now_us: u64,
    /// The latest requests sent with a result: their `seq` and when they went out.
    sent: VecDeque<(u64, u64)>,
    /// The latest round trips, request to assignment (µs).
    round_trips: VecDeque<u64>,
    /// The wall times of the latest trials (µs).
    walls: VecDeque<u64>,
}

/// Requests, round trips and trial times remembered for the automatic lookahead.
const RECENT: usize = 8;

/// Pushes `v`, keeping the latest [`RECENT`].
fn remember<T>(q: &mut VecDeque<T>, v: T) {
    if q.len() == RECENT {
        q.pop_front();
    }
    q.push_back(v);
}

/// The median of `q` (the upper one of an even count); `None` when empty.
fn median(q: &VecDeque<u64>) -> Option<u64> {
    let mut v: Vec<u64> = q.iter().copied().collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

impl AgentState {
    pub fn new(info: AgentInfo, allowed_cpus: Vec<u32>, max_trials: Option<u64>) -> Self {
        AgentState {
            info,
            allowed_cpus,
            seq: 0,
            running: BTreeMap::new(),
            gpus: BTreeMap::new(),
            exited: Default::default(),
            held: VecDeque::new(),
            unacked: BTreeMap::new(),
            draining: false,
            coordinator: None,
            welcomed: false,
            cancelling: Default::default(),
            sync_waiting: None,
            max_trials,
            started: 0,
            finished: 0,
            conditions: Vec::new(),
            spool: None,
            auto_ahead: None,
            now_us: 0,
            sent: VecDeque::new(),
            round_trips: VecDeque::new(),
            walls: VecDeque::new(),
        }
    }

    /// An automatic lookahead (the agent's default): `base` places held
    /// ahead (one per slot), and more while the latest trials are short
    /// beside a round trip to the coordinator (medians of the latest 8 of
    /// each, at least 4 trials and 2 round trips seen): as many per slot as
    /// the slot finishes in two round trips, up to `info.lookahead`. A held
    /// trial starts as one ends and its replacement is asked for then; it
    /// arrives a round trip later, so a slot whose held trials all end
    /// sooner waits (twice the round trip: they vary). Trials longer than
    /// two round trips keep `base`, so that a trial does not wait behind a
    /// long one while another agent frees up.
    pub fn with_auto_lookahead(mut self, base: u32) -> Self {
        self.auto_ahead = Some(base);
        self
    }

    /// The caller's monotonic clock, in µs, before it hands over an event:
    /// what round trips are measured with.
    pub fn set_clock(&mut self, now_us: u64) {
        self.now_us = now_us;
    }

    /// Trials a slot finishes in two round trips (at least 1), from the
    /// latest trials and round trips; `None` before enough are seen.
    fn trials_per_two_round_trips(&self) -> Option<u64> {
        if self.walls.len() < 4 || self.round_trips.len() < 2 {
            return None;
        }
        let (wall, rtt) = (median(&self.walls)?.max(1), median(&self.round_trips)?);
        Some(rtt.saturating_mul(2).div_ceil(wall).max(1))
    }

    /// Places to hold trials ahead now.
    fn ahead_places(&self) -> u32 {
        let most = self.info.ahead_places();
        match self.auto_ahead {
            Some(base) => {
                let per_slot = self.trials_per_two_round_trips().unwrap_or(1);
                base.saturating_mul(u32::try_from(per_slot).unwrap_or(u32::MAX)).min(most)
            }
            None => most,
        }
    }

    pub fn instance(&self) -> u64 {
        self.info.instance
    }

    /// Slots free for new work (0 while draining, after `max_trials`, or
    /// while conditions are bad).
    pub fn free(&self) -> u32 {
        self.room().0
    }

    /// Slots running nothing (0 while draining or while conditions are bad).
    fn idle_slots(&self) -> u32 {
        if self.draining || !self.conditions.is_empty() || self.spool.is_some() {
            return 0;
        }
        let busy = self.running.len().saturating_sub(self.exited.len());
        self.info.slots.saturating_sub(u32::try_from(busy).unwrap_or(u32::MAX))
    }

    /// Free slots and free places to hold a trial ahead, in that order;
    /// both 0 while draining or while conditions are bad, and together at
    /// most what `max_trials` leaves.
    fn room(&self) -> (u32, u32) {
        self.room_of(self.ahead_places())
    }

    /// [`AgentState::room`] with `places` to hold trials ahead.
    fn room_of(&self, places: u32) -> (u32, u32) {
        if self.draining || !self.conditions.is_empty() || self.spool.is_some() {
            return (0, 0);
        }
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let mut free = self.idle_slots();
        let mut ahead = places.saturating_sub(count(self.held.len()));
        if let Some(max) = self.max_trials {
            let left = u32::try_from(max.saturating_sub(self.started)).unwrap_or(u32::MAX);
            free = free.min(left);
            ahead = ahead.min(left - free);
        }
        (free, ahead)
    }

    /// Trials held ready to start.
    pub fn held_count(&self) -> usize {
        self.held.len()
    }

    pub fn running(&self) -> impl Iterator<Item = &TrialRef> {
        self.running.keys()
    }

    pub fn unacked_count(&self) -> usize {
        self.unacked.len()
    }

    /// Nothing running, held or waiting for an ack.
    pub fn is_quiet(&self) -> bool {
        self.running.is_empty() && self.held.is_empty() && self.unacked.is_empty()
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// All of `max_trials` have finished.
    pub fn max_trials_done(&self) -> bool {
        self.max_trials.is_some_and(|max| self.finished >= max)
    }

    /// Restores a result kept from an earlier run (state dir) as unacked.
    pub fn restore_unacked(&mut self, result: TrialResult) {
        self.unacked.insert(result.trial.clone(), result);
    }

    /// Whether the coordinator has welcomed this connection.
    pub fn welcomed(&self) -> bool {
        self.welcomed
    }

    /// Whether a Hello is due: not welcomed while the coordinator is online
    /// (`lib.rs` asks again when a Welcome does not come).
    pub fn wants_session(&self) -> bool {
        !self.welcomed && self.coordinator.as_ref().is_some_and(|c| c.online)
    }

    /// A work request, once welcomed (nothing can be asked for before).
    fn request(&mut self) -> Option<Action> {
        if !self.welcomed {
            return None;
        }
        self.seq += 1;
        let (free, ahead) = self.room();
        Some(Action::Publish(AgentMessage::Request(WorkRequest {
            seq: self.seq,
            free,
            ahead,
            running: self.running.keys().cloned().collect(),
            held: self.held.iter().map(|a| a.trial.clone()).collect(),
        })))
    }

    /// A result, if welcomed.
    fn publish_result(&self, result: &TrialResult) -> Option<Action> {
        self.welcomed.then(|| Action::Publish(AgentMessage::Result(result.clone())))
    }

    fn announce(&mut self) -> Vec<Action> {
        // A new Hello starts a new session.
        self.welcomed = false;
        vec![Action::Hello(Box::new(self.info.clone()))]
    }

    /// The coordinator holds no session with us any more (it said so, signed):
    /// a new Hello while it is online.
    pub fn on_session_lost(&mut self) -> Vec<Action> {
        self.welcomed = false;
        self.hello_again()
    }

    /// The request again, while welcomed with free slots: unanswered
    /// requests may mean the coordinator holds no session with us any more
    /// (it then says so, signed, and we say Hello again).
    pub fn request_again(&mut self) -> Vec<Action> {
        if self.room() == (0, 0) {
            return Vec::new();
        }
        self.request().into_iter().collect()
    }

    /// A Hello again, when one is due (no Welcome came for the last one).
    pub fn hello_again(&mut self) -> Vec<Action> {
        if self.wants_session() {
            self.announce()
        } else {
            Vec::new()
        }
    }

    /// Refuses an assignment this agent will not run (see `--allow-command`).
    pub fn refuse_assignment(&self, trial: TrialRef, reason: String) -> Vec<Action> {
        vec![self.refuse(trial, reason)]
    }

    /// The coordinator opened a session: say we are online, ask for work,
    /// deliver what is owed.
    pub fn on_welcome(&mut self) -> Vec<Action> {
        self.welcomed = true;
        let mut out = vec![Action::Publish(self.status(true))];
        out.extend(self.request());
        out.extend(self.unacked.values().filter_map(|r| self.publish_result(r)));
        out
    }

    /// The retained status published on connect (and on shutdown, offline).
    pub fn status(&self, online: bool) -> AgentMessage {
        AgentMessage::Status(AgentStatus { online, instance: self.info.instance })
    }

    /// Connected (first time or again), subscriptions already requested:
    /// the session is over; the coordinator's retained status, delivered on
    /// subscription, brings the Hello.
    pub fn on_connected(&mut self) -> Vec<Action> {
        self.welcomed = false;
        Vec::new()
    }

    /// The coordinator's (verified) status: announce when it is online and
    /// we have no session, or when it is a new instance or back online.
    pub fn on_coordinator_status(&mut self, status: CoordinatorStatus) -> Vec<Action> {
        let changed = match &self.coordinator {
            None => true,
            Some(prev) => !prev.online || prev.instance != status.instance,
        };
        let online = status.online;
        self.coordinator = Some(status);
        if online && (changed || !self.welcomed) {
            self.announce()
        } else {
            Vec::new()
        }
    }

    fn refuse(&self, trial: TrialRef, reason: impl Into<String>) -> Action {
        Action::Publish(AgentMessage::Refuse(Refusal { trial, reason: reason.into() }))
    }

    pub fn on_assign(&mut self, assignment: Assignment) -> Vec<Action> {
        // The first assignment answering a request times its round trip.
        if let Some(i) = self.sent.iter().position(|(seq, _)| *seq == assignment.request_seq) {
            let (_, at) = self.sent[i];
            self.sent.remove(i);
            remember(&mut self.round_trips, self.now_us.saturating_sub(at));
        }
        let trial = assignment.trial.clone();
        if self.running.contains_key(&trial) {
            return vec![self.refuse(trial, "already running")];
        }
        if self.held.iter().any(|a| a.trial == trial) {
            // The same assignment again (a redelivery): it is held already.
            return Vec::new();
        }
        if let Some(result) = self.unacked.get(&trial) {
            let again = self.publish_result(result);
            let mut out = vec![self.refuse(trial, "already finished; result awaiting ack")];
            out.extend(again);
            return out;
        }
        let need = assignment.spec.gpus;
        if need as usize > self.info.gpus.len() {
            let reason = format!("the trial needs {need} GPUs; this agent has {}", self.info.gpus.len());
            return vec![self.refuse(trial, reason)];
        }
        // Up to every place announced: an automatic lookahead that shrank
        // since its last request still takes what that request asked for.
        let (mut free, ahead) = self.room_of(self.info.ahead_places());
        if free > 0 && self.idle_gpus().len() < need as usize {
            // A slot, but its GPUs are another trial's: it waits for them
            // like for a slot (held), or is refused.
            if ahead == 0 {
                let reason = format!("the trial needs {need} GPUs; every GPU of this agent is given to another trial");
                return vec![self.refuse(trial, reason)];
            }
            free = 0;
        }
        if free == 0 && ahead > 0 {
            self.started += 1;
            self.held.push_back(assignment);
            return Vec::new();
        }
        if free == 0 {
            let reason = if self.draining {
                "agent is shutting down".to_string()
            } else if !self.conditions.is_empty() {
                format!("device conditions bad for measuring: {}", self.conditions.join("; "))
            } else if self.max_trials.is_some_and(|max| self.started >= max) {
                "agent reached its --max-trials".to_string()
            } else {
                "no free slot".to_string()
            };
            return vec![self.refuse(trial, reason)];
        }
        self.started += 1;
        vec![self.start(assignment)]
    }

    /// The GPUs no running trial holds (a trial whose workload exited
    /// holds none), in index order.
    fn idle_gpus(&self) -> Vec<&GpuDevice> {
        let held: Vec<u32> =
            self.gpus.iter().filter(|(t, _)| !self.exited.contains(*t)).flat_map(|(_, g)| g).copied().collect();
        self.info.gpus.iter().filter(|g| !held.contains(&g.index)).collect()
    }

    /// Starts an accepted assignment in a free slot, on GPUs of its own
    /// (the caller checked that enough are idle).
    fn start(&mut self, assignment: Assignment) -> Action {
        let in_use: Vec<u32> =
            self.running.iter().filter(|(t, _)| !self.exited.contains(*t)).flat_map(|(_, c)| c).copied().collect();
        let cpus = cpus::cpus_for_trial(assignment.spec.system.cores, &self.allowed_cpus, &in_use);
        let gpus: Vec<GpuDevice> = self.idle_gpus().into_iter().take(assignment.spec.gpus as usize).cloned().collect();
        self.running.insert(assignment.trial.clone(), cpus.clone());
        if !gpus.is_empty() {
            self.gpus.insert(assignment.trial.clone(), gpus.iter().map(|g| g.index).collect());
        }
        Action::Start(StartTrial { trial: assignment.trial, spec: assignment.spec, cpus, gpus })
    }

    /// Gives every held trial back to the coordinator (refused with
    /// `reason`: it queues them again, counting no failure).
    fn give_back_held(&mut self, reason: &str) -> Vec<Action> {
        let held: Vec<Assignment> = self.held.drain(..).collect();
        self.started = self.started.saturating_sub(held.len() as u64);
        held.into_iter().map(|a| self.refuse(a.trial, reason)).collect()
    }

    pub fn on_cancel(&mut self, cancel: Cancel) -> Vec<Action> {
        if let Some(at) = self.held.iter().position(|a| a.trial == cancel.trial) {
            // Never started: nothing to stop, nothing to report.
            self.held.remove(at);
            self.started = self.started.saturating_sub(1);
            return Vec::new();
        }
        if self.running.contains_key(&cancel.trial) {
            self.cancelling.insert(cancel.trial.clone());
            vec![Action::Cancel(cancel.trial)]
        } else {
            Vec::new()
        }
    }

    /// A new system configuration for a running trial; ignored for a trial
    /// not running here (it ended, or never ran).
    pub fn on_reconfigure(&mut self, r: tunefleet_common::message::Reconfigure) -> Vec<Action> {
        if self.running.contains_key(&r.trial) && !self.cancelling.contains(&r.trial) {
            vec![Action::Reconfigure(r.trial, r.system, r.reason)]
        } else {
            Vec::new()
        }
    }

    pub fn on_ack(&mut self, ack: ResultAck) -> Vec<Action> {
        if self.unacked.remove(&ack.trial).is_none() {
            return Vec::new();
        }
        match ack.outcome {
            AckOutcome::Stored | AckOutcome::Duplicate => vec![Action::Forget(ack.trial)],
            AckOutcome::Refused(reason) => vec![Action::Park(ack.trial, reason)],
        }
    }

    /// Everything the coordinator sent before its Sync `n` has arrived. The
    /// answer waits until no trial we were told to cancel still runs, so
    /// their results go out (and get acknowledged) before it.
    pub fn on_sync(&mut self, n: u64) -> Vec<Action> {
        if !self.welcomed {
            return Vec::new();
        }
        if self.cancelling.is_empty() {
            vec![Action::Publish(AgentMessage::Synced(n))]
        } else {
            self.sync_waiting = Some(n);
            Vec::new()
        }
    }

    /// Progress of a running trial (dropped while not welcomed: it is advisory).
    pub fn progress(&self, trial: TrialRef, report: crate::runner::EpochReport) -> Option<Action> {
        if !self.welcomed {
            return None;
        }
        let crate::runner::EpochReport { metrics: epoch, profile } = report;
        Some(Action::Publish(AgentMessage::Progress(Progress {
            trial,
            epoch: epoch.epoch,
            elapsed_us: epoch.elapsed_us,
            metrics: epoch.metrics,
            checkpoint: epoch.checkpoint,
            profile,
        })))
    }

    /// The device's conditions changed (see [`crate::conditions::Gate`]):
    /// `reasons` why they are bad for measuring, empty when good (the
    /// running trials' measurements are flagged by their runners); when
    /// the agent stops or resumes taking trials, a Request says how many
    /// slots it now offers.
    pub fn on_conditions(&mut self, reasons: Vec<String>) -> Vec<Action> {
        let changed = self.conditions.is_empty() != reasons.is_empty();
        let mut out = Vec::new();
        if !reasons.is_empty() && !self.held.is_empty() {
            let why = format!("device conditions bad for measuring: {}", reasons.join("; "));
            out.extend(self.give_back_held(&why));
        }
        self.conditions = reasons;
        if changed && !self.draining {
            out.extend(self.request());
        }
        out
    }

    /// Results can no longer be made durable (`Some(why)`: the state
    /// directory is full or failing) or can again (`None`). Meanwhile the
    /// agent takes no trials (a result it could not keep would be lost with
    /// the link or a crash): trials held ahead go back, and a Request says
    /// how many slots it offers when that changes. Running trials go on.
    pub fn on_spool(&mut self, problem: Option<String>) -> Vec<Action> {
        let changed = self.spool.is_some() != problem.is_some();
        let mut out = Vec::new();
        if let Some(why) = problem.as_ref().filter(|_| !self.held.is_empty()) {
            out.extend(self.give_back_held(&format!("the agent cannot store results: {why}")));
        }
        self.spool = problem;
        if changed && !self.draining {
            out.extend(self.request());
        }
        out
    }

    /// A running trial's workload exited; its measurement is still being
    /// put together. Its slot is free: a trial held ahead starts now, not
    /// once the result is ready. It stays listed as running (its result is
    /// to come) until [`AgentState::on_finished`].
    pub fn on_exited(&mut self, trial: TrialRef) -> Vec<Action> {
        if !self.running.contains_key(&trial) || !self.exited.insert(trial) {
            return Vec::new();
        }
        self.start_held()
    }

    /// Starts held trials, in order, in the idle slots. Held trials were
    /// counted against `max_trials` when accepted: only the slots decide.
    fn start_held(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        while self.idle_slots() > 0 {
            // The first in order whose GPUs are idle (one waiting for GPUs
            // does not keep a slot from a trial that needs none).
            let idle = self.idle_gpus().len();
            let Some(at) = self.held.iter().position(|a| a.spec.gpus as usize <= idle) else { break };
            let Some(next) = self.held.remove(at) else { break };
            out.push(self.start(next));
        }
        out
    }

    /// A trial ended: publish its result, keep it until acked, ask for more.
    pub fn on_finished(&mut self, trial: TrialRef, measurement: Measurement) -> Vec<Action> {
        self.exited.remove(&trial);
        self.gpus.remove(&trial);
        if self.running.remove(&trial).is_some() {
            self.finished += 1;
            if !matches!(measurement.exit, ExitOutcome::SpawnFailed(_)) {
                remember(&mut self.walls, measurement.wall_us);
            }
        }
        self.cancelling.remove(&trial);
        let result = TrialResult { trial: trial.clone(), measurement };
        // The next one starts before anything is said about this one; this
        // one is kept on disk first, whether or not it can be published now.
        let mut out = self.start_held();
        out.push(Action::Keep(result.clone()));
        out.extend(self.publish_result(&result));
        self.unacked.insert(trial, result);
        if self.room() != (0, 0) {
            if let Some(request) = self.request() {
                out.push(request);
                // Timed: a request sent as work flows (not one repeated
                // while idle, whose answer waits for work, not the link).
                remember(&mut self.sent, (self.seq, self.now_us));
            }
        }
        if self.cancelling.is_empty() && self.welcomed {
            if let Some(n) = self.sync_waiting.take() {
                out.push(Action::Publish(AgentMessage::Synced(n)));
            }
        }
        out
    }

    /// Stops taking work and cancels everything running.
    pub fn begin_drain(&mut self) -> Vec<Action> {
        if self.draining {
            return Vec::new();
        }
        self.draining = true;
        let mut out = self.give_back_held("agent is shutting down");
        self.cancelling.extend(self.running.keys().cloned());
        out.extend(self.running.keys().cloned().map(Action::Cancel));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome};
    use tunefleet_common::params::SystemParams;

    fn info(slots: u32) -> AgentInfo {
        AgentInfo {
            agent: "a1".into(),
            instance: 42,
            version: "0".into(),
            arch: "x".into(),
            os: "linux".into(),
            kernel: "6".into(),
            cores: 4,
            memory_bytes: 1,
            slots,
            lookahead: 0,
            energy: vec![],
            counters: vec![],
            tags: Default::default(),
            gpus: vec![],
        }
    }

    fn tref(n: u64) -> TrialRef {
        TrialRef { study: "s".into(), study_id: 7, trial: n, attempt: 0 }
    }

    fn assign(n: u64, cores: Option<u32>) -> Assignment {
        Assignment {
            trial: tref(n),
            request_seq: 1,
            spec: TrialSpec {
                argv: vec!["true".into()],
                env: vec![],
                system: SystemParams { cores, ..SystemParams::default() },
                timeout_ms: 1000,
                probe: None,
                gpus: 0,
            },
        }
    }

    fn assign_gpus(n: u64, gpus: u32) -> Assignment {
        let mut a = assign(n, None);
        a.spec.gpus = gpus;
        a
    }

    fn gpu_agent(slots: u32, gpus: u32, lookahead: u32) -> AgentState {
        let gpus = (0..gpus).map(|i| GpuDevice { index: i, uuid: format!("GPU-{i}"), name: "H200".into() }).collect();
        let mut st = AgentState::new(AgentInfo { lookahead, gpus, ..info(slots) }, vec![0, 1, 2, 3], None);
        st.on_coordinator_status(status(true, 1));
        welcome(&mut st);
        st
    }

    /// The GPUs of each trial started by `actions`.
    fn started_gpus(actions: &[Action]) -> Vec<(u64, Vec<u32>)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Start(s) => Some((s.trial.trial, s.gpus.iter().map(|g| g.index).collect())),
                _ => None,
            })
            .collect()
    }

    fn refusal(actions: &[Action]) -> Option<String> {
        actions.iter().find_map(|a| match a {
            Action::Publish(AgentMessage::Refuse(r)) => Some(r.reason.clone()),
            _ => None,
        })
    }

    #[test]
    fn each_trial_gets_gpus_of_its_own_and_one_waits_for_them_like_for_a_slot() {
        let mut st = gpu_agent(3, 2, 1);
        assert_eq!(started_gpus(&st.on_assign(assign_gpus(1, 1))), [(1, vec![0])]);
        assert_eq!(started_gpus(&st.on_assign(assign_gpus(2, 1))), [(2, vec![1])]);
        // A slot is free, its GPUs are not: held, not started on a taken GPU.
        let third = st.on_assign(assign_gpus(3, 1));
        assert!(started_gpus(&third).is_empty() && refusal(&third).is_none(), "{third:?}");
        assert_eq!(st.held_count(), 1);
        // A trial needing no GPU takes the free slot past the waiting one.
        assert_eq!(started_gpus(&st.on_assign(assign_gpus(4, 0))), [(4, vec![])]);
        // Trial 1's workload exits: its GPU goes to the held trial.
        assert_eq!(started_gpus(&st.on_exited(tref(1))), [(3, vec![0])]);
        assert_eq!(started_gpus(&st.on_finished(tref(1), measurement())), []);
        // More GPUs than the agent has: refused at once, saying why.
        let big = st.on_assign(assign_gpus(5, 3));
        assert_eq!(refusal(&big).as_deref(), Some("the trial needs 3 GPUs; this agent has 2"));
        // Trial 2 ends: GPU 1 is free for the next.
        st.on_finished(tref(2), measurement());
        assert_eq!(started_gpus(&st.on_assign(assign_gpus(6, 1))), [(6, vec![1])]);
    }

    #[test]
    fn a_trial_whose_gpus_are_taken_and_no_place_to_wait_is_refused() {
        let mut st = gpu_agent(2, 1, 0);
        assert_eq!(started_gpus(&st.on_assign(assign_gpus(1, 1))), [(1, vec![0])]);
        let second = st.on_assign(assign_gpus(2, 1));
        assert!(started_gpus(&second).is_empty());
        let why = refusal(&second).expect("refused");
        assert!(why.contains("every GPU of this agent is given to another trial"), "{why}");
        assert_eq!(started_gpus(&st.on_assign(assign_gpus(3, 0))), [(3, vec![])], "the slot is still free");
    }

    fn measurement() -> Measurement {
        Measurement {
            wall_us: 1,
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, "test"))
        }
    }

    fn kinds(actions: &[Action]) -> Vec<&'static str> {
        actions
            .iter()
            .map(|a| match a {
                Action::Hello(_) => "hello",
                Action::Publish(AgentMessage::Status(s)) if s.online => "online",
                Action::Publish(AgentMessage::Status(_)) => "offline",
                Action::Publish(AgentMessage::Request(_)) => "request",
                Action::Publish(AgentMessage::Progress(_)) => "progress",
                Action::Publish(AgentMessage::Result(_)) => "result",
                Action::Publish(AgentMessage::Refuse(_)) => "refuse",
                Action::Publish(AgentMessage::Telemetry(_)) => "telemetry",
                Action::Publish(AgentMessage::Synced(_)) => "synced",
                Action::Publish(AgentMessage::CoMeasured(_)) => "comeasured",
                Action::Publish(AgentMessage::Bundle(_)) => "bundle",
                Action::CoMeasure(_) => "comeasure",
                Action::Start(_) => "start",
                Action::Cancel(_) => "cancel",
                Action::Reconfigure(..) => "reconfigure",
                Action::Keep(_) => "keep",
                Action::Forget(_) => "forget",
                Action::Park(..) => "park",
            })
            .collect()
    }

    fn welcome(st: &mut AgentState) -> Vec<Action> {
        st.on_welcome()
    }

    fn status(online: bool, instance: u64) -> CoordinatorStatus {
        CoordinatorStatus { online, instance, started_unix_ms: 1, key: [0; 32] }
    }

    fn ack(n: u64, outcome: AckOutcome) -> ResultAck {
        ResultAck { trial: tref(n), outcome }
    }

    fn request_of(actions: &[Action]) -> Option<WorkRequest> {
        actions.iter().find_map(|a| match a {
            Action::Publish(AgentMessage::Request(r)) => Some(r.clone()),
            _ => None,
        })
    }

    #[test]
    fn connect_announces_when_the_coordinator_is_online_then_asks_with_growing_seq() {
        let mut st = AgentState::new(info(2), vec![0, 1, 2, 3], None);
        assert!(st.on_connected().is_empty(), "nothing before the coordinator's status");
        assert!(st.on_coordinator_status(status(false, 1)).is_empty(), "coordinator offline: wait");
        assert!(!st.wants_session());
        assert_eq!(kinds(&st.on_coordinator_status(status(true, 1))), ["hello"]);
        assert!(st.wants_session());
        assert_eq!(kinds(&st.hello_again()), ["hello"], "asked again when no Welcome came");
        let first = welcome(&mut st);
        assert_eq!(kinds(&first), ["online", "request"]);
        assert!(st.hello_again().is_empty() && !st.wants_session());
        assert!(st.on_connected().is_empty());
        assert!(!st.welcomed(), "a new connection ends the session");
        // The retained status delivered on subscription brings the Hello.
        assert_eq!(kinds(&st.on_coordinator_status(status(true, 1))), ["hello"]);
        let again = welcome(&mut st);
        let (r1, r2) = (request_of(&first).expect("req"), request_of(&again).expect("req"));
        assert!(r2.seq > r1.seq);
        assert_eq!(r2.free, 2);
        assert_eq!(kinds(&st.on_sync(5)), ["synced"]);
    }

    #[test]
    fn an_unanswered_request_is_asked_again_and_a_lost_session_brings_a_hello() {
        let mut st = AgentState::new(info(1), vec![0], None);
        assert!(st.request_again().is_empty(), "nothing to ask before a session");
        st.on_coordinator_status(status(true, 1));
        welcome(&mut st);
        assert_eq!(kinds(&st.request_again()), ["request"], "free and unanswered: asked again");
        st.on_assign(assign(1, None));
        assert!(st.request_again().is_empty(), "no free slot: nothing to ask");
        // The coordinator said it holds no session with us: a Hello.
        assert_eq!(kinds(&st.on_session_lost()), ["hello"]);
        assert!(st.request_again().is_empty(), "no requests outside a session");
    }

    #[test]
    fn sync_waits_for_the_results_of_cancelled_trials() {
        let mut st = AgentState::new(info(1), vec![0], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        assert_eq!(kinds(&st.on_cancel(Cancel { trial: tref(1), reason: "superseded".into() })), ["cancel"]);
        assert!(st.on_sync(7).is_empty(), "not before the cancelled trial's result");
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep", "result", "request", "synced"]);
        assert_eq!(kinds(&st.on_sync(8)), ["synced"]);
    }

    #[test]
    fn never_more_than_slots_and_no_duplicates() {
        let mut st = AgentState::new(info(2), vec![0, 1, 2, 3], None);
        welcome(&mut st);
        assert_eq!(kinds(&st.on_assign(assign(1, Some(2)))), ["start"]);
        assert_eq!(kinds(&st.on_assign(assign(1, Some(2)))), ["refuse"]);
        let second = st.on_assign(assign(2, Some(2)));
        match &second[..] {
            [Action::Start(s)] => assert_eq!(s.cpus, vec![2, 3], "distinct CPUs for concurrent trials"),
            other => panic!("{other:?}"),
        }
        assert_eq!(st.free(), 0);
        assert_eq!(kinds(&st.on_assign(assign(3, None))), ["refuse"]);
        let done = st.on_finished(tref(1), measurement());
        assert_eq!(kinds(&done), ["keep", "result", "request"]);
        assert_eq!(request_of(&done).map(|r| (r.free, r.running)), Some((1, vec![tref(2)])));
    }

    #[test]
    fn a_trial_held_ahead_starts_the_moment_its_slot_frees_and_is_listed_meanwhile() {
        let mut st = AgentState::new(AgentInfo { lookahead: 1, ..info(1) }, vec![0], None);
        let first = welcome(&mut st);
        assert_eq!(request_of(&first).map(|r| (r.free, r.ahead)), Some((1, 1)));
        assert_eq!(kinds(&st.on_assign(assign(1, None))), ["start"]);
        assert!(st.on_assign(assign(2, None)).is_empty(), "held, not started, not refused");
        assert!(st.on_assign(assign(2, None)).is_empty(), "a redelivery of a held trial changes nothing");
        assert_eq!(kinds(&st.on_assign(assign(3, None))), ["refuse"], "no room past the lookahead");
        assert_eq!(request_of(&st.request_again()), None, "nothing free: nothing to ask");
        let done = st.on_finished(tref(1), measurement());
        assert_eq!(kinds(&done), ["start", "keep", "result", "request"], "the next starts first");
        match &done[0] {
            Action::Start(s) => assert_eq!(s.trial, tref(2)),
            other => panic!("{other:?}"),
        }
        assert_eq!(request_of(&done).map(|r| (r.free, r.ahead, r.running)), Some((0, 1, vec![tref(2)])));
        // Held: listed apart, so the coordinator keeps its lease (or cancels it).
        st.on_assign(assign(3, None));
        assert_eq!(request_of(&st.on_welcome()).map(|r| (r.running, r.held)), Some((vec![tref(2)], vec![tref(3)])));
        // Cancelled while held: dropped, nothing to stop or report.
        assert!(st.on_cancel(Cancel { trial: tref(3), reason: "stopped".into() }).is_empty());
        assert_eq!(st.held_count(), 0);
        // Given back when the agent drains (refused: queued again elsewhere).
        st.on_assign(assign(4, None));
        let drained = st.begin_drain();
        assert_eq!(kinds(&drained), ["refuse", "cancel"]);
        assert!(matches!(&drained[0], Action::Publish(AgentMessage::Refuse(r)) if r.trial == tref(4)));
    }

    #[test]
    fn a_deeper_lookahead_holds_several_in_order_and_no_more_than_four_per_slot() {
        let mut st = AgentState::new(AgentInfo { lookahead: 2, ..info(1) }, vec![0], None);
        let first = welcome(&mut st);
        assert_eq!(request_of(&first).map(|r| (r.free, r.ahead)), Some((1, 2)));
        assert_eq!(kinds(&st.on_assign(assign(1, None))), ["start"]);
        assert!(st.on_assign(assign(2, None)).is_empty());
        assert!(st.on_assign(assign(3, None)).is_empty(), "two held behind one slot");
        assert_eq!(kinds(&st.on_assign(assign(4, None))), ["refuse"], "no room past the lookahead");
        let done = st.on_finished(tref(1), measurement());
        assert!(matches!(&done[0], Action::Start(s) if s.trial == tref(2)), "held ones start in the order assigned");
        assert_eq!(request_of(&done).map(|r| (r.free, r.ahead, r.held)), Some((0, 1, vec![tref(3)])));
        // An info claiming more than four per slot is held to four.
        let st = AgentState::new(AgentInfo { lookahead: 9, ..info(1) }, vec![0], None);
        assert_eq!(st.info.ahead_places(), tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT);
    }

    #[test]
    fn a_held_trial_starts_when_the_one_before_exits_not_when_its_result_is_ready() {
        let mut st = AgentState::new(AgentInfo { lookahead: 1, ..info(1) }, vec![0], None);
        welcome(&mut st);
        assert_eq!(kinds(&st.on_assign(assign(1, Some(1)))), ["start"]);
        assert!(st.on_assign(assign(2, Some(1))).is_empty(), "held");
        let exited = st.on_exited(tref(1));
        assert!(
            matches!(exited.as_slice(), [Action::Start(s)] if s.trial == tref(2) && s.cpus == vec![0]),
            "the held trial starts on the CPU the exited one freed: {:?}",
            kinds(&exited)
        );
        assert!(st.on_exited(tref(1)).is_empty(), "told twice: nothing more");
        // Its result is still to come: it is listed as running.
        let again = st.request_again();
        let listed = request_of(&again).map(|r| r.running);
        assert_eq!(listed, Some(vec![tref(1), tref(2)]));
        assert_eq!(st.running().count(), 2);
        let done = st.on_finished(tref(1), measurement());
        assert_eq!(kinds(&done), ["keep", "result", "request"], "nothing more to start");
        assert_eq!(request_of(&done).map(|r| (r.free, r.ahead, r.running)), Some((0, 1, vec![tref(2)])));
        assert!(st.on_exited(tref(1)).is_empty(), "an exit told after the result: nothing");
        // Without a notice of the exit, the result frees the slot as before.
        st.on_assign(assign(3, Some(1)));
        let done = st.on_finished(tref(2), measurement());
        assert!(matches!(&done[0], Action::Start(s) if s.trial == tref(3)));
    }

    /// Runs trials `from..to` of `wall_us` each on a one-slot agent whose
    /// coordinator answers every request with one trial after `rtt_us`;
    /// then the agent's room (free slots, places to hold ahead).
    fn run_trials(st: &mut AgentState, from: u64, to: u64, wall_us: u64, rtt_us: u64) -> (u32, u32) {
        for n in from..to {
            st.set_clock(st.now_us + wall_us);
            let running = st.running().next().cloned().expect("a trial runs");
            let done = st.on_finished(running, Measurement { wall_us, ..measurement() });
            assert!(matches!(&done[0], Action::Start(_)), "a held trial starts as one ends");
            if let Some(req) = request_of(&done) {
                st.set_clock(st.now_us + rtt_us);
                let mut next = assign(1000 + n, None);
                next.request_seq = req.seq;
                assert!(st.on_assign(next).is_empty(), "held");
            }
        }
        st.room()
    }

    #[test]
    fn an_automatic_lookahead_holds_what_a_slot_finishes_in_two_round_trips() {
        let mut st = AgentState::new(AgentInfo { lookahead: 4, ..info(1) }, vec![0], None).with_auto_lookahead(1);
        let first = welcome(&mut st);
        assert_eq!(request_of(&first).map(|r| (r.free, r.ahead)), Some((1, 1)), "one per slot to begin with");
        assert_eq!(kinds(&st.on_assign(assign(0, None))), ["start"]);
        assert!(st.on_assign(assign(1, None)).is_empty());
        // Trials of 5 ms, round trips of 1 ms: one held is enough.
        assert_eq!(run_trials(&mut st, 0, 8, 5_000, 1_000), (0, 0), "one held per slot, and it is");
        // Trials of 0.8 ms, round trips of 1 ms: 2.5 trials in two round trips, three held.
        assert_eq!(run_trials(&mut st, 8, 20, 800, 1_000), (0, 2), "room for two more held trials");
        // Trials of 0.3 ms: all four places the agent announced.
        assert_eq!(run_trials(&mut st, 20, 32, 300, 1_000), (0, 3), "room for three more");
        for n in 0..3 {
            st.set_clock(st.now_us + 10);
            assert!(st.on_assign(assign(100 + n, None)).is_empty(), "held");
        }
        assert_eq!(st.held_count(), 4);
        assert_eq!(st.room(), (0, 0), "never more than announced");
        // Long trials again: back to one per slot once the latest are long
        // (the trials held meanwhile run first).
        assert_eq!(run_trials(&mut st, 32, 52, 50_000, 1_000), (0, 0));
        assert_eq!(st.held_count(), 1, "one held per slot again");
        // A fixed lookahead ignores the times.
        let mut fixed = AgentState::new(AgentInfo { lookahead: 1, ..info(1) }, vec![0], None);
        welcome(&mut fixed);
        fixed.on_assign(assign(0, None));
        fixed.on_assign(assign(1, None));
        assert_eq!(run_trials(&mut fixed, 0, 12, 300, 1_000), (0, 0));
    }

    #[test]
    fn a_held_trial_outlives_its_coordinators_restart_like_a_running_one() {
        let mut st = AgentState::new(AgentInfo { lookahead: 1, ..info(1) }, vec![0], None);
        st.on_coordinator_status(status(true, 1));
        welcome(&mut st);
        st.on_assign(assign(1, None));
        st.on_assign(assign(2, None));
        assert!(st.on_coordinator_status(status(false, 1)).is_empty());
        assert_eq!(st.held_count(), 1, "kept: the restarted coordinator restores its lease");
        assert_eq!(kinds(&st.on_coordinator_status(status(true, 2))), ["hello"]);
        let again = welcome(&mut st);
        assert_eq!(request_of(&again).map(|r| (r.running, r.held)), Some((vec![tref(1)], vec![tref(2)])));
        assert_eq!(kinds(&st.on_finished(tref(1), measurement()))[0], "start", "and it starts when its slot frees");
    }

    #[test]
    fn held_trials_are_given_back_when_conditions_turn_bad_and_count_against_max_trials() {
        let mut st = AgentState::new(AgentInfo { lookahead: 2, ..info(2) }, vec![0, 1], Some(3));
        let first = welcome(&mut st);
        assert_eq!(request_of(&first).map(|r| (r.free, r.ahead)), Some((2, 1)), "3 trials at most in all");
        st.on_assign(assign(1, None));
        st.on_assign(assign(2, None));
        assert!(st.on_assign(assign(3, None)).is_empty(), "held");
        assert_eq!(kinds(&st.on_assign(assign(4, None))), ["refuse"], "past --max-trials");
        let bad = st.on_conditions(vec!["charging".into()]);
        assert_eq!(kinds(&bad), ["refuse", "request"]);
        assert_eq!(request_of(&bad).map(|r| (r.free, r.ahead, r.running.len())), Some((0, 0, 2)));
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep", "result"], "nothing held to start");
    }

    #[test]
    fn an_agent_that_cannot_store_results_takes_no_trials_until_it_can() {
        let mut st = AgentState::new(AgentInfo { lookahead: 1, ..info(2) }, vec![0, 1], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        st.on_assign(assign(2, None));
        assert!(st.on_assign(assign(3, None)).is_empty(), "held");
        let full = st.on_spool(Some("No space left on device".into()));
        assert_eq!(kinds(&full), ["refuse", "request"], "the held trial goes back");
        assert_eq!(request_of(&full).map(|r| (r.free, r.ahead)), Some((0, 0)));
        // A slot frees: nothing is asked for while results cannot be kept.
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep", "result"]);
        assert!(st.on_spool(Some("still full".into())).is_empty(), "no change, nothing to say");
        let back = st.on_spool(None);
        assert_eq!(request_of(&back).map(|r| (r.free, r.ahead)), Some((1, 1)), "space returned: the slot is offered");
    }

    #[test]
    fn regression_a_trial_held_as_the_last_of_max_trials_still_starts() {
        let mut st = AgentState::new(AgentInfo { lookahead: 1, ..info(1) }, vec![0], Some(3));
        welcome(&mut st);
        st.on_assign(assign(1, None));
        st.on_assign(assign(2, None));
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["start", "keep", "result", "request"]);
        assert!(st.on_assign(assign(3, None)).is_empty(), "the third of --max-trials 3, held");
        // Its slot frees: it starts, though --max-trials counts it already.
        let done = st.on_finished(tref(2), measurement());
        assert_eq!(kinds(&done), ["start", "keep", "result"], "the held third starts; nothing more to ask");
        assert_eq!(kinds(&st.on_finished(tref(3), measurement())), ["keep", "result"]);
        assert!(st.max_trials_done());
    }

    #[test]
    fn results_stay_until_acked_and_are_republished_in_the_next_session() {
        let mut st = AgentState::new(info(1), vec![0], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        st.on_connected();
        // Finished while not welcomed: kept, not published.
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep"]);
        let again = st.on_welcome();
        assert_eq!(kinds(&again), ["online", "request", "result"]);
        assert_eq!(kinds(&st.on_assign(assign(1, None))), ["refuse", "result"]);
        assert_eq!(kinds(&st.on_ack(ack(1, AckOutcome::Stored))), ["forget"]);
        assert!(st.on_ack(ack(1, AckOutcome::Stored)).is_empty());
        st.on_connected();
        assert_eq!(kinds(&welcome(&mut st)), ["online", "request"]);
        assert!(st.is_quiet());
    }

    #[test]
    fn duplicates_are_forgotten_and_refused_results_parked() {
        let mut st = AgentState::new(info(2), vec![0, 1], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        st.on_assign(assign(2, None));
        st.on_finished(tref(1), measurement());
        st.on_finished(tref(2), measurement());
        assert_eq!(kinds(&st.on_ack(ack(1, AckOutcome::Duplicate))), ["forget"]);
        let parked = st.on_ack(ack(2, AckOutcome::Refused("no such study".into())));
        assert_eq!(parked, vec![Action::Park(tref(2), "no such study".into())]);
        assert!(st.is_quiet(), "a parked result is no longer sent");
        st.on_connected();
        assert_eq!(kinds(&welcome(&mut st)), ["online", "request"]);
    }

    #[test]
    fn coordinator_restart_triggers_announce() {
        let mut st = AgentState::new(info(1), vec![0], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        st.on_finished(tref(1), measurement());
        assert_eq!(kinds(&st.on_coordinator_status(status(true, 1))), ["hello"], "first status seen");
        welcome(&mut st);
        assert!(st.on_coordinator_status(status(true, 1)).is_empty(), "same instance, session open");
        assert!(st.on_coordinator_status(status(false, 1)).is_empty(), "offline");
        assert_eq!(kinds(&st.on_coordinator_status(status(true, 1))), ["hello"]);
        welcome(&mut st);
        assert_eq!(kinds(&st.on_coordinator_status(status(true, 2))), ["hello"]);
        assert_eq!(kinds(&welcome(&mut st)), ["online", "request", "result"]);
    }

    #[test]
    fn cancel_and_drain() {
        let mut st = AgentState::new(info(2), vec![0, 1], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        assert!(st.on_cancel(Cancel { trial: tref(9), reason: "x".into() }).is_empty());
        assert_eq!(st.on_cancel(Cancel { trial: tref(1), reason: "x".into() }), vec![Action::Cancel(tref(1))]);
        assert_eq!(st.begin_drain(), vec![Action::Cancel(tref(1))]);
        assert_eq!(st.free(), 0);
        match &st.on_assign(assign(2, None))[..] {
            [Action::Publish(AgentMessage::Refuse(r))] => assert!(r.reason.contains("shutting down")),
            other => panic!("{other:?}"),
        }
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep", "result"], "no request while draining");
    }

    #[test]
    fn no_slots_while_conditions_are_bad() {
        let mut st = AgentState::new(info(2), vec![0, 1], None);
        welcome(&mut st);
        st.on_assign(assign(1, None));
        assert_eq!(st.free(), 1);
        let bad = st.on_conditions(vec!["device charging".into()]);
        assert_eq!(request_of(&bad).map(|r| r.free), Some(0), "the coordinator hears at once");
        assert_eq!(st.free(), 0);
        match &st.on_assign(assign(2, None))[..] {
            [Action::Publish(AgentMessage::Refuse(r))] => {
                assert_eq!(r.reason, "device conditions bad for measuring: device charging")
            }
            other => panic!("{other:?}"),
        }
        // Worse, still bad: no new request.
        let worse = vec!["device charging".to_string(), "CPU throttled".to_string()];
        assert!(st.on_conditions(worse).is_empty());
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep", "result"], "no request while bad");
        // Good again: slots offered, and trials taken.
        let good = st.on_conditions(Vec::new());
        assert_eq!(request_of(&good).map(|r| r.free), Some(2));
        assert_eq!(kinds(&st.on_assign(assign(3, None))), ["start"]);
        let done = st.on_finished(tref(3), measurement());
        assert_eq!(request_of(&done).map(|r| r.free), Some(2));
    }

    #[test]
    fn max_trials_limits_requests() {
        let mut st = AgentState::new(info(2), vec![0, 1], Some(1));
        st.on_connected();
        assert_eq!(request_of(&welcome(&mut st)).map(|r| r.free), Some(1));
        st.on_assign(assign(1, None));
        assert_eq!(kinds(&st.on_assign(assign(2, None))), ["refuse"]);
        assert!(!st.max_trials_done());
        assert_eq!(kinds(&st.on_finished(tref(1), measurement())), ["keep", "result"]);
        assert!(st.max_trials_done());
    }
}
