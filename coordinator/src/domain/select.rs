//! Which agents may run a study's trials: a [`Selector`] (the study's
//! `[selector]`, or a group's) matched against what an agent says it is in
//! its Hello. A scheduling rule, beside [`crate::domain::sched`]; the study file
//! only says what is asked for ([`crate::domain::study`]).

use tunefleet_common::message::AgentInfo;

use crate::domain::study::Selector;

impl Selector {
    /// True when `agent` may run trials of the study.
    pub fn matches(&self, agent: &AgentInfo) -> bool {
        (self.arch.is_empty() || self.arch.contains(&agent.arch))
            && self.tags.iter().all(|(k, v)| agent.tags.get(k) == Some(v))
            && (self.energy.is_empty() || agent.energy.iter().any(|e| e.readable && self.energy.contains(&e.kind)))
            && self.min_cores.is_none_or(|n| agent.cores >= n)
            && self.min_memory_mib.is_none_or(|m| agent.memory_bytes >= m.saturating_mul(1 << 20))
    }

    /// What `agent` lacks of this selector and of `gpus` GPUs a trial, each
    /// with what it offers (`arch aarch64 (it is x86_64)`); empty when it
    /// may run the study's trials.
    pub fn unmet(&self, agent: &AgentInfo, gpus: u32) -> Vec<String> {
        let mut out = Vec::new();
        if !self.arch.is_empty() && !self.arch.contains(&agent.arch) {
            out.push(format!("arch {} (it is {})", self.arch.join(" or "), agent.arch));
        }
        for (k, v) in &self.tags {
            if agent.tags.get(k) != Some(v) {
                let has = agent.tags.get(k).map_or_else(|| "none".to_string(), |h| format!("{k}={h}"));
                out.push(format!("tag {k}={v} (it has {has})"));
            }
        }
        if !self.energy.is_empty() && !agent.energy.iter().any(|e| e.readable && self.energy.contains(&e.kind)) {
            let names: Vec<&str> = self.energy.iter().map(|k| k.as_str()).collect();
            let readable: Vec<&str> = agent.energy.iter().filter(|e| e.readable).map(|e| e.kind.as_str()).collect();
            out.push(format!("energy {} (it reads {})", names.join(" or "), readable.join(", ")));
        }
        if let Some(n) = self.min_cores.filter(|n| agent.cores < *n) {
            out.push(format!("{n} cores (it has {})", agent.cores));
        }
        if let Some(m) = self.min_memory_mib.filter(|m| agent.memory_bytes < m.saturating_mul(1 << 20)) {
            out.push(format!("{m} MiB of memory (it has {})", agent.memory_bytes >> 20));
        }
        if agent.gpus.len() < gpus as usize {
            out.push(format!("{gpus} GPU(s) a trial (it was granted {})", agent.gpus.len()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tunefleet_common::measurement::EnergySourceKind;
    use tunefleet_common::message::EnergySourceInfo;

    use super::*;

    /// The selector of a study that runs on the `demo` pool's x86 and ARM agents.
    fn demo() -> Selector {
        Selector {
            arch: vec!["x86_64".into(), "aarch64".into()],
            tags: BTreeMap::from([("pool".to_string(), "demo".to_string())]),
            ..Selector::default()
        }
    }

    #[test]
    fn selectors_match_energy_sources_cores_and_memory() {
        let s = Selector {
            energy: vec![EnergySourceKind::Rapl, EnergySourceKind::Hwmon],
            min_cores: Some(4),
            min_memory_mib: Some(2048),
            ..demo()
        };
        let mut agent = AgentInfo::minimal("a", 1);
        agent.arch = "aarch64".into();
        agent.tags.insert("pool".into(), "demo".into());
        agent.cores = 8;
        agent.memory_bytes = 4 << 30;
        let source = |kind, readable| EnergySourceInfo { kind, domains: vec![], readable, note: None };
        agent.energy = vec![source(EnergySourceKind::Rapl, false), source(EnergySourceKind::Estimated, true)];
        assert!(!s.matches(&agent), "RAPL present but not readable");
        agent.energy.push(source(EnergySourceKind::Hwmon, true));
        assert!(s.matches(&agent));
        agent.cores = 2;
        assert!(!s.matches(&agent), "too few cores");
        agent.cores = 4;
        agent.memory_bytes = 1 << 30;
        assert!(!s.matches(&agent), "too little memory");
    }

    #[test]
    fn selector_matches_arch_and_tags() {
        let s = demo();
        let mut agent = AgentInfo::minimal("a", 1);
        agent.arch = "aarch64".into();
        agent.tags.insert("pool".into(), "demo".into());
        assert!(s.matches(&agent));
        agent.arch = "riscv64".into();
        assert!(!s.matches(&agent));
        agent.arch = "x86_64".into();
        agent.tags.clear();
        assert!(!s.matches(&agent));
        assert!(Selector::default().matches(&agent));
    }
}
