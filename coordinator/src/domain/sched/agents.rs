//! The scheduler's side of agents: their Hellos, statuses and work
//! requests, refusals, the overloaded flag, and the fleet's indexes kept
//! after every change to an agent ([`Scheduler::sync_agent`]).

use std::collections::BTreeSet;
use std::sync::Arc;

use tunefleet_common::message::{AgentInfo, AgentStatus, TrialRef, WorkRequest};

use super::fleet::{credit, FleetAgent};
use super::lease::{trial_ref, State, MAX_PROGRESS_BYTES, MAX_PROGRESS_ROWS};
use super::{Effect, Scheduler};

impl Scheduler {
    /// Brings the fleet's indexes (`ready`, `live`, the studies'
    /// `ready_credit`) up to date with what `agent` is now; called after
    /// every change to an agent.
    pub(super) fn sync_agent(&mut self, agent: &str) {
        let Some(a) = self.agents.get_mut(agent) else { return };
        let live = a.online && a.info.is_some();
        if live != a.live {
            a.live = live;
            if live {
                self.live += 1;
            } else {
                self.live -= 1;
            }
        }
        let ready = live && a.credit > 0;
        a.recount(&mut self.studies, if ready { a.credit } else { 0 });
        if ready != a.ready {
            a.ready = ready;
            if ready {
                self.ready.insert(a.name.clone());
            } else {
                self.ready.remove(agent);
            }
        }
    }

    /// An agent announced itself (its session is authenticated by
    /// [`crate::runtime::auth`]). A new `instance` means the agent process
    /// restarted: whatever it was running is gone.
    pub fn hello(&mut self, info: AgentInfo) -> Vec<Effect> {
        let name = info.agent.clone();
        let instance = info.instance;
        let agent = self.agents.entry(name.clone()).or_insert_with(|| FleetAgent {
            name: Arc::from(name.as_str()),
            info: None,
            online: true,
            instance,
            credit: 0,
            withheld: 0,
            last_seq: None,
            overloaded: None,
            live: false,
            ready: false,
            counted: 0,
            window: u32::MAX,
            lost_held: 0,
            granted: Default::default(),
            holder: None,
        });
        // What it matches may change with what it says it is.
        agent.recount(&mut self.studies, 0);
        let restarted = agent.instance != instance;
        agent.instance = instance;
        agent.online = true;
        agent.info = Some(info);
        if restarted {
            agent.credit = 0;
            agent.withheld = 0;
            agent.last_seq = None;
        }
        self.sync_agent(&name);
        if restarted {
            self.release_leases(&name, "agent restarted")
        } else {
            Vec::new()
        }
    }

    /// An agent's retained status, or its Last Will.
    pub fn status(&mut self, agent: &str, status: &AgentStatus) -> Vec<Effect> {
        let Some(state) = self.agents.get_mut(agent) else {
            // Not seen by this process: only leases restored from the store can be affected.
            return if status.online { Vec::new() } else { self.release_leases(agent, "agent is offline") };
        };
        if status.instance != state.instance {
            // A stale status of an earlier process (the retained one, or a late will).
            return Vec::new();
        }
        state.online = status.online;
        if !status.online {
            state.credit = 0;
            state.withheld = 0;
        }
        self.sync_agent(agent);
        if status.online {
            return Vec::new();
        }
        self.release_leases(agent, "agent went offline")
    }

    /// `agent` lost `n` trials it held before they started: the places it
    /// may hold at once are halved (at least one), and grow back by one
    /// with each result it delivers ([`Scheduler::delivered`]). An honest
    /// agent on a bad link loses little; one that takes trials and drops
    /// them is soon given one at a time.
    pub(super) fn lost_unstarted(&mut self, agent: &str, n: u32) -> Vec<Effect> {
        if n == 0 {
            return Vec::new();
        }
        let Some(a) = self.agents.get_mut(agent) else {
            return vec![Effect::LostHeld { agent: agent.to_string(), trials: n, places: 0 }];
        };
        let full = a.info.as_ref().map_or(1, FleetAgent::places);
        a.window = (a.window.min(full) / 2).max(1);
        a.lost_held = a.lost_held.saturating_add(u64::from(n));
        let places = a.window;
        a.credit = a.credit.min(places);
        self.sync_agent(agent);
        vec![Effect::LostHeld { agent: agent.to_string(), trials: n, places }]
    }

    /// `agent` delivered a result: one more place, up to all it may hold.
    pub(super) fn delivered(&mut self, agent: &str) {
        if let Some(a) = self.agents.get_mut(agent) {
            a.window = a.window.saturating_add(1);
        }
    }

    /// `agent` says it runs `trial` (its request lists it as running, or it
    /// sent progress): the attempt has started. [`Effect::Started`] for one
    /// that was held ahead and had not started.
    pub fn started(&mut self, agent: &str, trial: &TrialRef) -> Option<Effect> {
        let study = self.studies.iter_mut().find(|s| s.owns(trial))?;
        let slot = study.trials.get_mut(usize::try_from(trial.trial).unwrap_or(usize::MAX))?;
        let State::Running(l) = &mut slot.state else { return None };
        if l.agent != agent || l.attempt != trial.attempt || l.started {
            return None;
        }
        l.started = true;
        l.ahead.then(|| Effect::Started { agent: agent.to_string(), trial: trial.clone() })
    }

    /// Counts a progress message of `bytes` for `agent`'s live attempt
    /// `trial`: whether it may be kept (at most [`MAX_PROGRESS_ROWS`] rows
    /// and [`MAX_PROGRESS_BYTES`] of them an attempt, so a member cannot
    /// fill the store with in-bounds epochs).
    pub fn take_progress(&mut self, agent: &str, trial: &TrialRef, bytes: u64) -> Result<(), &'static str> {
        let Some(study) = self.studies.iter_mut().find(|s| s.owns(trial)) else { return Err("not a live attempt") };
        if study.past_share(agent, self.agents.get(agent).and_then(|a| a.holder.as_ref())) {
            return Err("the agent has used its share of the study's store");
        }
        let slot = study.trials.get_mut(usize::try_from(trial.trial).unwrap_or(usize::MAX));
        let Some(State::Running(l)) = slot.map(|s| &mut s.state) else { return Err("not a live attempt") };
        if l.agent != agent || l.attempt != trial.attempt {
            return Err("not a live attempt");
        }
        let (rows, total) = l.progress;
        if rows >= MAX_PROGRESS_ROWS {
            return Err("the attempt has sent as many epochs as are kept");
        }
        if total.saturating_add(bytes) > MAX_PROGRESS_BYTES {
            return Err("the attempt has sent as many bytes of progress as are kept");
        }
        l.progress = (rows + 1, total + bytes);
        Ok(())
    }

    /// Counts `bytes` of `trial`'s study's store as `agent`'s; returns the
    /// share when this passed it (once: from then on its results and
    /// progress are refused and it is given none of the study's trials).
    pub fn count_written(&mut self, agent: &str, trial: &TrialRef, bytes: u64) -> Option<u64> {
        let study = self.studies.iter_mut().find(|s| s.owns(trial))?;
        let holder = self.agents.get(agent).and_then(|a| a.holder.as_ref());
        let was = study.past_share(agent, holder);
        if let Some((h, _)) = holder {
            study.attribute(agent, h);
            *study.written_by_holder.entry(h.clone()).or_default() += bytes;
        }
        *study.written.entry(agent.to_string()).or_default() += bytes;
        let share = holder.map_or(study.policy.store_share, |(_, cap)| study.policy.store_share.min(*cap));
        (!was && study.past_share(agent, holder)).then_some(share)
    }

    /// `agent` is a name of join token `holder`, whose names may take
    /// `share` bytes of each study's store together; what it wrote before
    /// counts in the token's total.
    pub fn set_holder(&mut self, agent: &str, holder: &str, share: u64) {
        let Some(a) = self.agents.get_mut(agent) else { return };
        let h: Arc<str> = Arc::from(holder);
        for s in &mut self.studies {
            s.attribute(agent, &h);
        }
        a.holder = Some((h, share));
    }

    /// What each agent wrote to `study`'s store before (a restarted
    /// coordinator's count goes on from the store's).
    pub fn set_written(&mut self, study: &str, written: Vec<(String, u64)>) {
        if let Some(s) = self.studies.iter_mut().find(|s| s.policy.name == study) {
            s.written = written.into_iter().collect();
        }
    }

    /// How many trials `agent` lost before they started, and how many it
    /// may hold at once now (for `tunefleet agents` and the log).
    pub fn reliability(&self, agent: &str) -> Option<(u64, u32)> {
        let a = self.agents.get(agent)?;
        let full = a.info.as_ref().map_or(0, FleetAgent::places);
        Some((a.lost_held, a.window.min(full)))
    }

    /// An agent's request for work: its credit becomes `free` (and `ahead`).
    /// Trials that a previous coordinator handed to this agent and that it no
    /// longer lists as running or held are lost (their results, had there
    /// been any, came first). A trial it holds (not started) whose lease is
    /// no longer its (it went offline meanwhile, and the trial went back to
    /// the queue) is cancelled there: it would only run twice.
    pub fn request(&mut self, agent: &str, req: &WorkRequest) -> Vec<Effect> {
        let Some(state) = self.agents.get_mut(agent) else { return Vec::new() };
        if state.last_seq.is_some_and(|seq| req.seq <= seq) {
            return Vec::new();
        }
        state.last_seq = Some(req.seq);
        state.online = true;
        let mut effects = Vec::new();
        for t in &req.running {
            effects.extend(self.started(agent, t));
        }
        for t in &req.held {
            let Some(study) = self.studies.iter().find(|s| s.owns(t)) else { continue };
            let leased_here = matches!(
                study.trials.get(usize::try_from(t.trial).unwrap_or(usize::MAX)).map(|s| &s.state),
                Some(State::Running(l)) if l.agent == agent && l.attempt == t.attempt
            );
            if !leased_here {
                let reason = "no longer leased to this agent".to_string();
                effects.push(Effect::Cancel { agent: agent.to_string(), trial: t.clone(), reason });
            }
        }
        for study in &mut self.studies {
            let Some(restored) = study.restored.remove(agent) else { continue };
            for i in restored {
                let attempt = match study.trials.get(i as usize).map(|t| &t.state) {
                    Some(State::Running(l)) if l.restored && l.agent == agent => l.attempt,
                    _ => continue,
                };
                let tr = trial_ref(&study.policy, i, attempt);
                if req.lists(&tr) {
                    continue;
                }
                effects.extend(study.end_attempt(i, tr, "the agent no longer runs it".into()));
            }
        }
        // Attempts given to the agent that it had not seen when it asked are
        // on their way: its free slots are fewer than it says. Only those
        // answering its previous request: an older one it does not list was
        // lost (a broker restart) and waits for its lease to run out; it is
        // not taken off what the agent asks for, but it still holds one of
        // the agent's announced slots (below) until then.
        let in_flight: usize = self
            .studies
            .iter()
            .map(|study| {
                let held = study.held.get(agent).map_or(0, |trials| {
                    trials
                        .iter()
                        .filter(|&&i| match study.trials.get(i as usize).map(|t| &t.state) {
                            Some(State::Running(l)) => {
                                l.seq.saturating_add(1) >= req.seq
                                    && !req.lists(&trial_ref(&study.policy, i, l.attempt))
                            }
                            _ => false,
                        })
                        .count()
                });
                held
            })
            .sum();
        // Never more than the slots it announced, less the leases it holds:
        // a `free` past that would let one agent take every pending trial.
        let held: usize = self.studies.iter().map(|s| s.held.get(agent).map_or(0, BTreeSet::len)).sum();
        if let Some(state) = self.agents.get_mut(agent) {
            let places = state.places_now();
            let asked = req.free.saturating_add(req.ahead);
            state.credit = credit(asked, places, in_flight, held);
            // Leases it holds but no longer runs (a result on its way) end
            // soon: the slots they free are its, up to what it asked for.
            state.withheld = credit(asked, places, in_flight, 0).saturating_sub(state.credit);
            // Leases that ended before this request are counted in it already.
            for study in &mut self.studies {
                study.released.retain(|a| a != agent);
            }
        }
        self.sync_agent(agent);
        effects
    }

    /// The agent will not run this attempt: queue it again without counting a failure.
    pub fn refuse(&mut self, agent: &str, trial: &TrialRef, reason: &str) -> Vec<Effect> {
        let Some(study) = self.studies.iter_mut().find(|s| s.owns(trial)) else { return Vec::new() };
        let Some(slot) = study.trials.get(trial.trial as usize) else { return Vec::new() };
        match &slot.state {
            State::Running(l) if l.agent == agent && l.attempt == trial.attempt => {
                study.unlease(trial.trial);
                study.queue.push_front(trial.trial);
                vec![Effect::Requeued { trial: trial.clone(), reason: format!("refused by {agent}: {reason}") }]
            }
            _ => Vec::new(),
        }
    }

    /// The decider found `agent` overloaded (`Some(why)`) or well again
    /// (`None`). An overloaded agent gets no trials, and the attempts it runs
    /// are moved: cancelled there and queued again without counting a
    /// failure, kept off it for `AVOID_MS`.
    pub fn set_overloaded(&mut self, agent: &str, why: Option<String>, now_ms: u64) -> Vec<Effect> {
        let Some(state) = self.agents.get_mut(agent) else { return Vec::new() };
        let class = state.info.as_ref().map(AgentInfo::device_class);
        let newly = why.is_some() && state.overloaded.is_none();
        state.overloaded = why.clone();
        let Some(why) = why.filter(|_| newly) else { return Vec::new() };
        let mut effects = Vec::new();
        for study in &mut self.studies {
            for i in study.held_by(agent) {
                let Some(l) = study.move_off(i, agent, class.clone(), now_ms) else { continue };
                let tr = trial_ref(&study.policy, i, l.attempt);
                let reason = format!("agent overloaded: {why}");
                effects.push(Effect::Cancel { agent: agent.to_string(), trial: tr.clone(), reason: reason.clone() });
                effects.push(Effect::Moved { trial: tr, from: agent.to_string(), reason });
            }
        }
        effects
    }

    /// Whether `agent` is overloaded now (and why).
    pub fn overloaded(&self, agent: &str) -> Option<&str> {
        self.agents.get(agent).and_then(|a| a.overloaded.as_deref())
    }

    /// Each lease that ended since the last turn gives its agent back one
    /// slot of the credit its last request was denied for want of slots.
    pub(super) fn give_back(&mut self) {
        let ended: Vec<String> = self.studies.iter_mut().flat_map(|s| std::mem::take(&mut s.released)).collect();
        for agent in ended {
            let Some(a) = self.agents.get_mut(&agent) else { continue };
            if a.withheld > 0 && a.online {
                a.withheld -= 1;
                a.credit += 1;
                self.sync_agent(&agent);
            }
        }
    }
}
