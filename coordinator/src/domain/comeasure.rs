//! Co-measurement: the agents that measure their own machines over a trial
//! another agent runs (a study's `[measure] nodes`: a Spark or MPI job
//! spans machines, and the agent that starts it measures only its own).
//!
//! Pure bookkeeping, no I/O: [`CoMeasures::start`] when an attempt is
//! assigned (each node starts sampling before the attempt can start),
//! [`CoMeasures::window`] when its result arrives (the starting agent's
//! start and end marks, bounded by what the coordinator itself saw),
//! [`CoMeasures::answer`] for each node's [`CoMeasured`], and
//! [`CoMeasures::tick`] to ask again those that did not answer and, past
//! [`GIVE_UP_MS`], to record them as missing with why. An attempt that ends
//! without a result is abandoned ([`CoMeasures::abandon`]).
//!
//! An answer is taken only from a node that was asked, once, for the very
//! attempt and window asked: a member of the fleet with a valid key cannot
//! add a node to a trial, answer for another, or answer twice.

use std::collections::{BTreeMap, HashMap};

use tunefleet_common::message::{CoMeasure, CoMeasureStep, CoMeasured, TrialRef};

/// How long a node has to answer a window before it is asked again.
pub const ASK_AGAIN_MS: u64 = 5_000;
/// How long after the window was first asked a node that has not answered
/// is recorded as missing.
pub const GIVE_UP_MS: u64 = 30_000;
/// How far the starting agent's marks may lie outside what the coordinator
/// saw (assigned, result received): clocks of two machines differ.
pub const SKEW_MS: u64 = 60_000;
/// Most nodes measuring one trial (the first by name are asked).
pub const MAX_NODES: usize = 64;
/// Most a GPU draws (the largest accelerators sold draw about 1 kW).
pub const MAX_GPU_WATTS: f64 = 1_500.0;
/// The power a node may report (W) besides its cores': a board, memory,
/// disks, fans and a few accelerators. A figure above [`node_watts`] over
/// its window is refused as out of range.
pub const NODE_BASE_WATTS: f64 = 3_000.0;
/// The power each core a node announced may add (W): more than any server
/// CPU draws a core at full load.
pub const WATTS_PER_CORE: f64 = 100.0;
/// Honest rounding over a bound (energy counters read at the window's
/// edges, clock ticks of CPU time): 2 %.
pub const TOLERANCE: f64 = 0.02;
/// CPU time over a window's bound that is honest rounding besides
/// [`TOLERANCE`]: the clock ticks at either edge.
pub const CPU_SLACK_US: u64 = 50_000;

/// The most power a node of `cores` cores may report (W).
pub fn node_watts(cores: u32) -> f64 {
    NODE_BASE_WATTS + WATTS_PER_CORE * f64::from(cores.max(1))
}

/// What one node gave for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeOutcome {
    Measured(CoMeasured),
    /// No answer (the node went away, or its answers were lost), and why.
    Missing(String),
}

/// A node's entry for an attempt, to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub trial: TrialRef,
    pub agent: String,
    pub outcome: NodeOutcome,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no co-measurement of this attempt is open")]
    NotOpen,
    #[error("this agent was not asked to measure this attempt, or answered already")]
    NotAsked,
    #[error("the attempt's window was not asked yet")]
    NoWindow,
    #[error("the answer is for another window ({got_from}..{got_to}, asked {from}..{to})")]
    OtherWindow { got_from: u64, got_to: u64, from: u64, to: u64 },
    #[error("{0}")]
    OutOfRange(String),
}

#[derive(Debug, Clone, Copy)]
struct Window {
    from: u64,
    to: u64,
    /// Engine ms when it was first asked, and last asked.
    first_ms: u64,
    last_ms: u64,
}

#[derive(Debug)]
struct Open {
    /// The agent the attempt was assigned to.
    starter: String,
    assigned_unix_ms: u64,
    /// Engine ms past which, still without a window, it is abandoned
    /// whatever the scheduler says (its lease and [`GIVE_UP_MS`] more).
    until_ms: u64,
    /// Nodes asked, and whether each has answered.
    nodes: BTreeMap<String, bool>,
    window: Option<Window>,
}

/// Every open co-measurement.
#[derive(Debug, Default)]
pub struct CoMeasures {
    open: HashMap<TrialRef, Open>,
}

fn ask(nodes: &BTreeMap<String, bool>, trial: &TrialRef, step: CoMeasureStep) -> Vec<(String, CoMeasure)> {
    nodes
        .iter()
        .filter(|(_, answered)| !**answered)
        .map(|(node, _)| (node.clone(), CoMeasure { trial: trial.clone(), step }))
        .collect()
}

impl CoMeasures {
    /// Attempts with a co-measurement open.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Trials of `starter` whose nodes measure now (started, not ended).
    pub fn measuring_for(&self, starter: &str) -> usize {
        self.open.values().filter(|o| o.starter == starter && o.window.is_none()).count()
    }

    /// Attempts that ended whose nodes have not all answered yet (a
    /// finishing coordinator waits for them, at most [`GIVE_UP_MS`]).
    pub fn awaiting(&self) -> usize {
        self.open.values().filter(|o| o.window.is_some()).count()
    }

    /// `trial` was just assigned to `starter` (at `unix_ms`, engine clock
    /// `engine_ms`, leased for `lease_ms`): `nodes` (but the starter, at
    /// most [`MAX_NODES`]) start measuring. Nothing when none is left.
    pub fn start(
        &mut self,
        trial: &TrialRef,
        starter: &str,
        nodes: impl IntoIterator<Item = String>,
        (unix_ms, engine_ms): (u64, u64),
        lease_ms: u64,
    ) -> Vec<(String, CoMeasure)> {
        let nodes: BTreeMap<String, bool> =
            nodes.into_iter().filter(|n| n != starter).take(MAX_NODES).map(|n| (n, false)).collect();
        if nodes.is_empty() {
            return Vec::new();
        }
        let sends = ask(&nodes, trial, CoMeasureStep::Start { within_ms: lease_ms });
        let until_ms = engine_ms.saturating_add(lease_ms).saturating_add(GIVE_UP_MS);
        let open = Open { starter: starter.to_string(), assigned_unix_ms: unix_ms, until_ms, nodes, window: None };
        self.open.insert(trial.clone(), open);
        sends
    }

    /// The result of `trial` arrived with its agent's marks: the window,
    /// kept within [`SKEW_MS`] of when the coordinator assigned it and now,
    /// is asked of every node. The window actually asked is returned too.
    pub fn window(
        &mut self,
        trial: &TrialRef,
        from_unix_ms: u64,
        to_unix_ms: u64,
        unix_ms: u64,
        engine_ms: u64,
    ) -> Vec<(String, CoMeasure)> {
        let Some(open) = self.open.get_mut(trial) else { return Vec::new() };
        if open.window.is_some() {
            return Vec::new();
        }
        // Never `clamp`: a wall clock stepped back between the assignment
        // and now makes the bounds cross.
        let (lo, hi) = (open.assigned_unix_ms.saturating_sub(SKEW_MS), unix_ms.saturating_add(SKEW_MS));
        let hi = hi.max(lo);
        let from = from_unix_ms.max(lo).min(hi);
        let to = to_unix_ms.max(from).min(hi);
        open.window = Some(Window { from, to, first_ms: engine_ms, last_ms: engine_ms });
        ask(&open.nodes, trial, CoMeasureStep::Window { from_unix_ms: from, to_unix_ms: to })
    }

    /// `trial` ended without a result: its nodes stop and forget it.
    pub fn abandon(&mut self, trial: &TrialRef) -> Vec<(String, CoMeasure)> {
        match self.open.remove(trial) {
            Some(open) => ask(&open.nodes, trial, CoMeasureStep::Abandon),
            None => Vec::new(),
        }
    }

    /// Whether `agent`'s answer is to be taken: it was asked for this very
    /// window and has not answered yet, with figures in range. Changes
    /// nothing: [`CoMeasures::taken`] once the answer is stored.
    /// An answer of `agent` (a node of `cores` cores): asked of it, for the
    /// window asked, and within physical bounds (its power at most
    /// [`NODE_BASE_WATTS`] plus [`WATTS_PER_CORE`] a core, its CPU time at
    /// most its CPUs over the window), each with [`TOLERANCE`] for honest
    /// rounding.
    pub fn check(&self, agent: &str, m: &CoMeasured, cores: u32, gpus: usize) -> Result<(), Refusal> {
        let open = self.open.get(&m.trial).ok_or(Refusal::NotOpen)?;
        if open.nodes.get(agent) != Some(&false) {
            return Err(Refusal::NotAsked);
        }
        let w = open.window.ok_or(Refusal::NoWindow)?;
        if (m.from_unix_ms, m.to_unix_ms) != (w.from, w.to) {
            return Err(Refusal::OtherWindow {
                got_from: m.from_unix_ms,
                got_to: m.to_unix_ms,
                from: w.from,
                to: w.to,
            });
        }
        let window_ms = w.to - w.from;
        if m.energy.joules < 0.0 || m.energy.domains.iter().any(|d| d.joules < 0.0) {
            return Err(Refusal::OutOfRange(format!("negative energy ({} J)", m.energy.joules)));
        }
        // Over a window of 0 ms, still a second's worth.
        let watts = node_watts(cores);
        let most = watts * (window_ms.max(1_000) as f64 / 1000.0) * (1.0 + TOLERANCE);
        if m.energy.joules > most {
            return Err(Refusal::OutOfRange(format!(
                "{} J over {window_ms} ms is above {watts} W (a node of {cores} cores)",
                m.energy.joules
            )));
        }
        // Its GPUs: no more than it announced, each at most MAX_GPU_WATTS.
        if m.gpus.len() > gpus {
            return Err(Refusal::OutOfRange(format!("{} GPU readings from a node of {gpus} GPUs", m.gpus.len())));
        }
        let gpu_most = MAX_GPU_WATTS * (window_ms.max(1_000) as f64 / 1000.0) * (1.0 + TOLERANCE);
        if let Some(g) = m.gpus.iter().find(|g| g.joules < 0.0 || g.joules > gpu_most) {
            return Err(Refusal::OutOfRange(format!(
                "GPU {}: {} J over {window_ms} ms is not within 0 to {MAX_GPU_WATTS} W",
                g.index, g.joules
            )));
        }
        if m.covered_ms > window_ms {
            return Err(Refusal::OutOfRange(format!("covers {} ms of a window of {window_ms} ms", m.covered_ms)));
        }
        let cpu_most = window_ms.saturating_mul(1000).saturating_mul(u64::from(m.cpus.max(1)));
        // Clock ticks and the window's edges: a little over is honest rounding.
        let cpu_most = (cpu_most as f64 * (1.0 + TOLERANCE)) as u64 + CPU_SLACK_US;
        if m.cpu_us > cpu_most.max(1_000_000) {
            return Err(Refusal::OutOfRange(format!("{} µs of CPU over {window_ms} ms on {} CPUs", m.cpu_us, m.cpus)));
        }
        Ok(())
    }

    /// `agent`'s answer for `trial` is stored: it is not asked again, and
    /// the attempt closes once every node answered.
    pub fn taken(&mut self, agent: &str, trial: &TrialRef) {
        let Some(open) = self.open.get_mut(trial) else { return };
        if let Some(answered) = open.nodes.get_mut(agent) {
            *answered = true;
        }
        if open.nodes.values().all(|answered| *answered) {
            self.open.remove(trial);
        }
    }

    /// [`CoMeasures::check`], then [`CoMeasures::taken`] (the engine stores
    /// the answer between the two).
    #[cfg(test)]
    pub fn answer(&mut self, agent: &str, m: &CoMeasured) -> Result<(), Refusal> {
        self.check(agent, m, 4, 2)?;
        self.taken(agent, &m.trial);
        Ok(())
    }

    /// Every open attempt abandoned on its nodes (the coordinator stops).
    pub fn abandon_all(&mut self) -> Vec<(String, CoMeasure)> {
        let trials: Vec<TrialRef> = self.open.keys().cloned().collect();
        trials.iter().flat_map(|t| self.abandon(t)).collect()
    }

    /// Asks again the nodes that have not answered a window for
    /// [`ASK_AGAIN_MS`]; records as missing those that have not for
    /// [`GIVE_UP_MS`], and closes their attempts.
    /// An attempt without a window of which no result is awaited any more
    /// (`awaited(starter, trial)` false: moved, requeued, its agent gone),
    /// or still without one past its lease and [`GIVE_UP_MS`] (a stopped
    /// trial whose result never came), is abandoned on its nodes.
    pub fn tick(
        &mut self,
        engine_ms: u64,
        awaited: impl Fn(&str, &TrialRef) -> bool,
    ) -> (Vec<(String, CoMeasure)>, Vec<NodeRecord>) {
        let mut sends = Vec::new();
        let mut missing = Vec::new();
        self.open.retain(|trial, open| {
            let Some(w) = open.window.as_mut() else {
                if engine_ms < open.until_ms && awaited(&open.starter, trial) {
                    return true;
                }
                sends.extend(ask(&open.nodes, trial, CoMeasureStep::Abandon));
                return false;
            };
            if engine_ms >= w.first_ms.saturating_add(GIVE_UP_MS) {
                for (node, _) in open.nodes.iter().filter(|(_, answered)| !**answered) {
                    missing.push(NodeRecord {
                        trial: trial.clone(),
                        agent: node.clone(),
                        outcome: NodeOutcome::Missing(format!(
                            "no answer within {} s of the trial's end (the agent went away, or its answers were lost)",
                            GIVE_UP_MS / 1000
                        )),
                    });
                }
                return false;
            }
            if engine_ms >= w.last_ms.saturating_add(ASK_AGAIN_MS) {
                w.last_ms = engine_ms;
                let step = CoMeasureStep::Window { from_unix_ms: w.from, to_unix_ms: w.to };
                sends.extend(ask(&open.nodes, trial, step));
            }
            true
        });
        (sends, missing)
    }
}

#[cfg(test)]
mod tests {
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind};

    use super::*;

    fn tref(trial: u64) -> TrialRef {
        TrialRef { study: "s".into(), study_id: 7, trial, attempt: 1 }
    }

    fn answer(trial: u64, from: u64, to: u64, joules: f64) -> CoMeasured {
        let mut energy = EnergyReading::none(EnergySourceKind::Estimated, "test");
        energy.joules = joules;
        energy.valid = true;
        CoMeasured {
            trial: tref(trial),
            from_unix_ms: from,
            to_unix_ms: to,
            energy,
            cpu_us: 5,
            cpus: 1,
            covered_ms: to - from,
            gpus: vec![],
        }
    }

    fn names(sends: &[(String, CoMeasure)]) -> Vec<&str> {
        sends.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn nodes_start_at_assignment_and_answer_the_window_of_the_result_once() {
        let mut co = CoMeasures::default();
        let sends = co.start(&tref(1), "a", ["a".to_string(), "w2".into(), "w1".into()], (1_000, 0), 90_000);
        assert_eq!(names(&sends), ["w1", "w2"], "the starter is not a node of its own trial");
        assert!(sends.iter().all(|(_, m)| m.step == CoMeasureStep::Start { within_ms: 90_000 }));
        assert_eq!(co.answer("w1", &answer(1, 2_000, 3_000, 1.0)), Err(Refusal::NoWindow));
        let sends = co.window(&tref(1), 2_000, 3_000, 3_100, 10);
        assert_eq!(
            sends[0].1.step,
            CoMeasureStep::Window { from_unix_ms: 2_000, to_unix_ms: 3_000 },
            "marks within what the coordinator saw are asked as they are"
        );
        assert!(matches!(co.answer("w1", &answer(1, 2_000, 2_900, 1.0)), Err(Refusal::OtherWindow { .. })));
        assert_eq!(co.answer("a", &answer(1, 2_000, 3_000, 1.0)), Err(Refusal::NotAsked), "the starter was not asked");
        assert_eq!(co.answer("w1", &answer(1, 2_000, 3_000, 1.0)), Ok(()));
        assert_eq!(co.answer("w1", &answer(1, 2_000, 3_000, 1.0)), Err(Refusal::NotAsked), "only once");
        assert!(matches!(co.answer("w2", &answer(1, 2_000, 3_000, -1.0)), Err(Refusal::OutOfRange(_))));
        let more_than_a_plant = answer(1, 2_000, 3_000, 2.0 * node_watts(4));
        assert!(matches!(co.answer("w2", &more_than_a_plant), Err(Refusal::OutOfRange(_))));
        let busier_than_its_cpus = CoMeasured { cpu_us: 10_000_000, ..answer(1, 2_000, 3_000, 1.0) };
        assert!(matches!(co.answer("w2", &busier_than_its_cpus), Err(Refusal::OutOfRange(_))));
        // A 99 kW answer of a small node is out of range; an
        // honest answer a hair over its CPU bound is rounding, not a lie.
        let plant = answer(1, 2_000, 3_000, 99_000.0);
        assert!(matches!(co.check("w2", &plant, 4, 0), Err(Refusal::OutOfRange(_))));
        let rounding = CoMeasured { cpu_us: 1_000_200, cpus: 1, ..answer(1, 2_000, 3_000, 1.0) };
        assert_eq!(co.check("w2", &rounding, 4, 0), Ok(()), "0.02 % over its CPUs' time");
        assert_eq!(co.check("w2", &answer(1, 2_000, 3_000, 0.9 * node_watts(4)), 4, 0), Ok(()));
        // Its GPUs, no more than it announced, each within a GPU's power.
        let gpu = |joules| tunefleet_common::measurement::GpuEnergy {
            index: 0,
            uuid: "GPU-a".into(),
            joules,
            method: tunefleet_common::measurement::GpuMethod::Counter,
            valid: true,
            note: None,
        };
        let with_gpu = |joules| CoMeasured { gpus: vec![gpu(joules)], ..answer(1, 2_000, 3_000, 1.0) };
        assert_eq!(co.check("w2", &with_gpu(700.0), 4, 1), Ok(()), "700 W over a second");
        assert!(matches!(co.check("w2", &with_gpu(700.0), 4, 0), Err(Refusal::OutOfRange(_))), "it has no GPU");
        assert!(matches!(co.check("w2", &with_gpu(50_000.0), 4, 1), Err(Refusal::OutOfRange(_))), "50 kW");
        assert!(matches!(co.check("w2", &with_gpu(-1.0), 4, 1), Err(Refusal::OutOfRange(_))));
        assert_eq!(co.answer("w2", &answer(2, 2_000, 3_000, 1.0)), Err(Refusal::NotOpen));
        assert_eq!(co.len(), 1);
        assert_eq!(co.answer("w2", &answer(1, 2_000, 3_000, 1.0)), Ok(()));
        assert!(co.is_empty(), "closed once every node answered");
    }

    #[test]
    fn marks_far_outside_what_the_coordinator_saw_are_bounded() {
        let mut co = CoMeasures::default();
        co.start(&tref(1), "a", ["w".to_string()], (1_000_000, 0), 1);
        let sends = co.window(&tref(1), 0, u64::MAX, 1_005_000, 0);
        assert_eq!(
            sends[0].1.step,
            CoMeasureStep::Window { from_unix_ms: 1_000_000 - SKEW_MS, to_unix_ms: 1_005_000 + SKEW_MS }
        );
        assert!(co.window(&tref(1), 1, 2, 1_005_000, 0).is_empty(), "a window is asked once");
        // The wall clock stepped back 10 minutes since the assignment: no panic, a window of 0.
        co.start(&tref(2), "a", ["w".to_string()], (1_000_000, 0), 1);
        let sends = co.window(&tref(2), 999_000, 1_001_000, 400_000, 0);
        assert_eq!(sends[0].1.step, CoMeasureStep::Window { from_unix_ms: 940_000, to_unix_ms: 940_000 });
    }

    #[test]
    fn silent_nodes_are_asked_again_then_recorded_missing() {
        let mut co = CoMeasures::default();
        co.start(&tref(1), "a", ["w1".to_string(), "w2".into()], (0, 0), 100_000);
        let live = |_: &str, _: &TrialRef| true;
        assert_eq!(co.tick(60_000, live), (Vec::new(), Vec::new()), "no deadline while its result is awaited");
        assert_eq!(co.awaiting(), 0, "a running trial is not awaited");
        co.window(&tref(1), 10, 20, 100, 100_000);
        assert_eq!(co.awaiting(), 1);
        co.answer("w1", &answer(1, 10, 20, 1.0)).expect("w1");
        assert!(co.tick(100_000 + ASK_AGAIN_MS - 1, live).0.is_empty());
        let (again, missing) = co.tick(100_000 + ASK_AGAIN_MS, live);
        assert_eq!(names(&again), ["w2"], "only the silent node is asked again");
        assert!(missing.is_empty());
        let (_, missing) = co.tick(100_000 + GIVE_UP_MS, live);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].agent, "w2");
        assert!(matches!(&missing[0].outcome, NodeOutcome::Missing(why) if why.contains("no answer")));
        assert!(co.is_empty());
        assert_eq!(co.answer("w2", &answer(1, 10, 20, 1.0)), Err(Refusal::NotOpen), "too late");
    }

    #[test]
    fn an_attempt_without_a_result_is_abandoned_on_its_nodes() {
        let mut co = CoMeasures::default();
        assert!(
            co.start(&tref(1), "a", ["a".to_string()], (0, 0), 1).is_empty(),
            "no node but the starter: nothing open"
        );
        assert!(co.is_empty());
        co.start(&tref(1), "a", ["w".to_string()], (0, 0), 1);
        let sends = co.abandon(&tref(1));
        assert_eq!(sends, vec![("w".to_string(), CoMeasure { trial: tref(1), step: CoMeasureStep::Abandon })]);
        assert!(co.is_empty());
        assert!(co.abandon(&tref(1)).is_empty());
        // An attempt of which no result is awaited any more (moved, the
        // agent gone) before any result: abandoned at the next tick.
        co.start(&tref(2), "a", ["w".to_string()], (0, 0), 1);
        co.start(&tref(3), "a", ["w".to_string()], (0, 0), 1_000);
        let (sends, missing) = co.tick(0, |_, t| t.trial == 3);
        assert_eq!(sends, vec![("w".to_string(), CoMeasure { trial: tref(2), step: CoMeasureStep::Abandon })]);
        assert!(missing.is_empty());
        assert_eq!(co.len(), 1);
        // Still awaited (a trial stopped early whose result never comes),
        // but past its lease and the grace: abandoned all the same.
        assert!(co.tick(1_000 + GIVE_UP_MS - 1, |_, _| true).0.is_empty());
        let (sends, _) = co.tick(1_000 + GIVE_UP_MS, |_, _| true);
        assert_eq!(sends, vec![("w".to_string(), CoMeasure { trial: tref(3), step: CoMeasureStep::Abandon })]);
        co.start(&tref(4), "a", ["w".to_string()], (0, 0), 1);
        let all = co.abandon_all();
        assert_eq!(all, vec![("w".to_string(), CoMeasure { trial: tref(4), step: CoMeasureStep::Abandon })]);
        assert!(co.is_empty());
    }
}
