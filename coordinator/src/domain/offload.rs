//! Overload decisions, after RoleML's decider but within seconds: plain
//! values in, decisions out (no sockets, no clocks: time is `now_ms`).
//!
//! [`LoadHistory`] keeps each agent's recent samples (what agents publish
//! every `--telemetry-interval`); [`decide`] looks at the last `window` of
//! them every `interval`:
//!
//! * an agent is **overloaded** when, averaged over the window, the load from
//!   outside its own trials reaches `cpu_ratio` of its CPUs, or its memory
//!   use reaches `memory_ratio` of its memory. A trial's own load never
//!   counts: an agent whose trials use every core is busy, not overloaded
//!   (RoleML compares total load with 95 % of capacity, which a tuner's own
//!   benchmark would trip at once);
//! * it is **well again** once the same averages fall below `recover` times
//!   the thresholds (hysteresis, so a load at the edge does not flap).
//!
//! A window needs at least two samples spanning half of it before it
//! decides anything, so one spike is never enough.

use std::collections::{HashMap, VecDeque};

/// When agents count as overloaded, and how quickly that is decided.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffloadPolicy {
    /// Load from outside the agent's trials, as a share of its CPUs.
    pub cpu_ratio: f64,
    /// Memory in use, as a share of the agent's memory.
    pub memory_ratio: f64,
    /// Averages are taken over this many milliseconds of samples.
    pub window_ms: u64,
    /// How often decisions are taken.
    pub interval_ms: u64,
    /// Well again below this share of each threshold.
    pub recover: f64,
}

impl Default for OffloadPolicy {
    /// Outside load at half the agent's CPUs or memory at 95 %, over 3 s,
    /// decided every second, well again below 80 % of that.
    fn default() -> Self {
        OffloadPolicy { cpu_ratio: 0.5, memory_ratio: 0.95, window_ms: 3_000, interval_ms: 1_000, recover: 0.8 }
    }
}

/// One telemetry sample, reduced to what the decider reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// When the coordinator received it.
    pub at_ms: u64,
    /// Load from outside the agent's trials, 0 to 1; `None`: not told apart.
    pub foreign_cpu: Option<f64>,
    /// Memory in use, 0 to 1.
    pub memory: f64,
}

impl Sample {
    /// The decider's view of an agent's telemetry message.
    pub fn of(t: &tunefleet_common::measurement::Telemetry, at_ms: u64) -> Self {
        let memory =
            if t.memory_total_bytes > 0 { t.memory_used_bytes as f64 / t.memory_total_bytes as f64 } else { 0.0 };
        Sample { at_ms, foreign_cpu: t.foreign_cpu.filter(|v| v.is_finite()), memory }
    }
}

/// Each agent's recent samples.
#[derive(Debug, Default)]
pub struct LoadHistory {
    agents: HashMap<String, VecDeque<Sample>>,
}

/// Most samples kept per agent (a window of 1 s samples needs a handful).
const MAX_SAMPLES: usize = 64;

impl LoadHistory {
    pub fn observe(&mut self, agent: &str, sample: Sample) {
        let q = self.agents.entry(agent.to_string()).or_default();
        q.push_back(sample);
        while q.len() > MAX_SAMPLES {
            q.pop_front();
        }
    }

    /// An agent that went away: its samples say nothing of its next process.
    pub fn forget(&mut self, agent: &str) {
        self.agents.remove(agent);
    }

    /// The averages of `agent` over the window ending at `now_ms`.
    pub fn averages(&self, agent: &str, window_ms: u64, now_ms: u64) -> Option<Averages> {
        let q = self.agents.get(agent)?;
        let from = now_ms.saturating_sub(window_ms);
        let recent: Vec<&Sample> = q.iter().filter(|s| s.at_ms >= from && s.at_ms <= now_ms).collect();
        let span = recent.last()?.at_ms.saturating_sub(recent.first()?.at_ms);
        if recent.len() < 2 || span * 2 < window_ms {
            return None;
        }
        let foreign: Vec<f64> = recent.iter().filter_map(|s| s.foreign_cpu).collect();
        let foreign_cpu = (!foreign.is_empty()).then(|| foreign.iter().sum::<f64>() / foreign.len() as f64);
        let memory = recent.iter().map(|s| s.memory).sum::<f64>() / recent.len() as f64;
        Some(Averages { foreign_cpu, memory, samples: recent.len() })
    }

    /// Agents with samples.
    pub fn agents(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }
}

/// An agent's load over the window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Averages {
    pub foreign_cpu: Option<f64>,
    pub memory: f64,
    pub samples: usize,
}

/// What the decider concluded about one agent.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadChange {
    /// Give it nothing and move its trials; `why` quotes the telemetry.
    Overloaded {
        agent: String,
        why: String,
    },
    Recovered {
        agent: String,
    },
}

/// Decisions for every agent with telemetry, given which are overloaded now.
pub fn decide(
    policy: &OffloadPolicy,
    telemetry: &LoadHistory,
    overloaded: impl Fn(&str) -> bool,
    now_ms: u64,
) -> Vec<LoadChange> {
    let mut out = Vec::new();
    let mut agents: Vec<&str> = telemetry.agents().collect();
    agents.sort_unstable();
    for agent in agents {
        let Some(avg) = telemetry.averages(agent, policy.window_ms, now_ms) else { continue };
        let cpu = avg.foreign_cpu.unwrap_or(0.0);
        let over = cpu >= policy.cpu_ratio || avg.memory >= policy.memory_ratio;
        let well = cpu < policy.cpu_ratio * policy.recover && avg.memory < policy.memory_ratio * policy.recover;
        let window_s = policy.window_ms as f64 / 1000.0;
        match (overloaded(agent), over, well) {
            (false, true, _) => {
                let why = if cpu >= policy.cpu_ratio {
                    format!(
                        "load from outside its trials {:.0} % of its CPUs over the last {window_s:.0} s ({} samples; threshold {:.0} %)",
                        cpu * 100.0,
                        avg.samples,
                        policy.cpu_ratio * 100.0
                    )
                } else {
                    format!(
                        "memory {:.0} % in use over the last {window_s:.0} s ({} samples; threshold {:.0} %)",
                        avg.memory * 100.0,
                        avg.samples,
                        policy.memory_ratio * 100.0
                    )
                };
                out.push(LoadChange::Overloaded { agent: agent.to_string(), why });
            }
            (true, _, true) => out.push(LoadChange::Recovered { agent: agent.to_string() }),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(t: &mut LoadHistory, agent: &str, from_ms: u64, values: &[(f64, f64)]) {
        for (i, &(cpu, mem)) in values.iter().enumerate() {
            t.observe(agent, Sample { at_ms: from_ms + 1000 * i as u64, foreign_cpu: Some(cpu), memory: mem });
        }
    }

    #[test]
    fn outside_load_over_the_window_overloads_and_a_spike_does_not() {
        let p = OffloadPolicy::default();
        let mut t = LoadHistory::default();
        feed(&mut t, "busy", 0, &[(0.9, 0.3), (0.95, 0.3), (0.9, 0.3)]);
        feed(&mut t, "spike", 0, &[(0.0, 0.3), (0.0, 0.3), (1.0, 0.3)]);
        feed(&mut t, "own", 0, &[(0.05, 0.3), (0.02, 0.3), (0.04, 0.3)]);
        let d = decide(&p, &t, |_| false, 2_000);
        assert_eq!(d.len(), 1, "{d:?}");
        let LoadChange::Overloaded { agent, why } = &d[0] else { panic!("{d:?}") };
        assert_eq!(agent, "busy");
        assert!(why.contains("92 %") && why.contains("threshold 50 %"), "{why}");
    }

    #[test]
    fn memory_overloads_too_and_recovery_needs_margin() {
        let p = OffloadPolicy::default();
        let mut t = LoadHistory::default();
        feed(&mut t, "a", 0, &[(0.0, 0.97), (0.0, 0.98), (0.0, 0.97)]);
        assert!(
            matches!(&decide(&p, &t, |_| false, 2_000)[..], [LoadChange::Overloaded { why, .. }] if why.contains("memory"))
        );
        // Already overloaded: nothing new while it stays loaded, or sits just under the threshold.
        assert!(decide(&p, &t, |_| true, 2_000).is_empty());
        feed(&mut t, "a", 4_000, &[(0.45, 0.5), (0.45, 0.5), (0.45, 0.5)]);
        assert!(decide(&p, &t, |_| true, 6_000).is_empty(), "0.45 is under 0.5 but not under 0.4");
        feed(&mut t, "a", 8_000, &[(0.1, 0.5), (0.1, 0.5), (0.1, 0.5)]);
        assert_eq!(decide(&p, &t, |_| true, 10_000), vec![LoadChange::Recovered { agent: "a".into() }]);
    }

    #[test]
    fn too_few_samples_or_none_told_apart_decide_nothing() {
        let p = OffloadPolicy::default();
        let mut t = LoadHistory::default();
        feed(&mut t, "a", 0, &[(1.0, 0.1)]);
        assert!(decide(&p, &t, |_| false, 500).is_empty(), "one sample is no window");
        t.observe("b", Sample { at_ms: 0, foreign_cpu: None, memory: 0.1 });
        t.observe("b", Sample { at_ms: 2_000, foreign_cpu: None, memory: 0.1 });
        assert!(decide(&p, &t, |_| false, 2_000).is_empty(), "no outside load known: not overloaded");
        t.forget("a");
        assert_eq!(t.agents().count(), 1);
    }
}
