//! What this agent is and can measure, announced in its Hello.

use std::collections::BTreeMap;

use tunefleet_common::message::{AgentInfo, EnergySourceInfo};

/// Total memory in bytes, from sysinfo; 0 (and a warning) when unknown.
pub fn total_memory_bytes() -> u64 {
    match sysinfo::System::new() {
        Ok(mut sys) => {
            sys.refresh_memory();
            sys.total_memory()
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the memory size");
            0
        }
    }
}

/// The running kernel's release string.
pub fn kernel_release() -> String {
    rustix::system::uname().release().to_string_lossy().into_owned()
}

/// Everything the Hello says about this agent.
#[derive(Debug, Clone)]
pub struct CapsInput {
    pub agent: String,
    pub instance: u64,
    pub slots: u32,
    /// Trials held ready behind the slots (at most 4 per slot).
    pub lookahead: u32,
    pub cpus: Vec<u32>,
    pub energy: Vec<EnergySourceInfo>,
    pub tags: BTreeMap<String, String>,
    /// GPUs it gives trials ([`crate::energy::gpu::GpuReport::devices`]).
    pub gpus: Vec<tunefleet_common::message::GpuDevice>,
}

/// Probes the machine (kernel, memory, counters that open) and builds the Hello.
pub fn agent_info(input: CapsInput) -> AgentInfo {
    AgentInfo {
        agent: input.agent,
        instance: input.instance,
        version: env!("CARGO_PKG_VERSION").to_string(),
        arch: std::env::consts::ARCH.to_string(),
        os: std::env::consts::OS.to_string(),
        kernel: kernel_release(),
        cores: u32::try_from(input.cpus.len()).unwrap_or(u32::MAX),
        memory_bytes: total_memory_bytes(),
        slots: input.slots,
        lookahead: input.lookahead.min(input.slots.saturating_mul(tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT)),
        energy: input.energy,
        counters: crate::counters::probe(),
        tags: input.tags,
        gpus: input.gpus,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_this_machine() {
        let info = agent_info(CapsInput {
            agent: "n1".into(),
            instance: 7,
            slots: 2,
            lookahead: 1,
            cpus: vec![0, 1],
            energy: vec![],
            tags: BTreeMap::from([("rack".into(), "a".into())]),
            gpus: vec![],
        });
        assert_eq!(info.arch, std::env::consts::ARCH);
        assert_eq!(info.cores, 2);
        assert!(info.memory_bytes > 0);
        assert!(!info.kernel.is_empty());
        assert_eq!(info.tags.get("rack").map(String::as_str), Some("a"));
    }
}
