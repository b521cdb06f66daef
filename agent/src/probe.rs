//! `tunefleet-agent probe`: what this machine offers for measurement, as a
//! table or as JSON: architecture, kernel, cores, memory, every energy
//! source found (readable or not, and how to make it so), the source that
//! would be used, and which perf counters open (hardware and software).

use serde::Serialize;
use tunefleet_common::measurement::{CounterKind, EnergySourceKind, MissingCounter};
use tunefleet_common::message::EnergySourceInfo;

use crate::counters::{self, CounterSet};
use crate::energy::{self, EnergyRoots, EstimateModel};

/// Everything `probe` reports.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub arch: String,
    pub os: String,
    pub kernel: String,
    pub cores: u32,
    pub memory_bytes: u64,
    /// Every energy source looked at, in the order they are tried.
    pub energy: Vec<EnergySourceInfo>,
    /// The source measurements would use.
    pub energy_selected: EnergySourceKind,
    /// Sources present but skipped, with the reason.
    pub energy_skipped: Vec<String>,
    pub counters: Vec<String>,
    pub counters_missing: Vec<MissingCounter>,
    /// True when at least one hardware event opens.
    pub hardware_counters: bool,
    /// GPUs, through NVML (read only).
    pub gpus: energy::gpu::GpuReport,
}

/// Probes this machine.
pub fn probe(roots: &EnergyRoots, model: EstimateModel) -> ProbeReport {
    let selection = energy::select(roots, model);
    let set = CounterSet::open_for_self();
    let counters = set.open_events();
    let counters_missing = set.missing().to_vec();
    let hardware_counters = counters.iter().any(|e| counters::kind_of(e) == CounterKind::Hardware);
    ProbeReport {
        arch: std::env::consts::ARCH.to_string(),
        os: std::env::consts::OS.to_string(),
        kernel: crate::caps::kernel_release(),
        cores: u32::try_from(crate::cpus::allowed_cpus().len()).unwrap_or(u32::MAX),
        memory_bytes: crate::caps::total_memory_bytes(),
        energy: selection.found,
        energy_selected: selection.source.kind(),
        energy_skipped: selection.skipped,
        counters,
        counters_missing,
        hardware_counters,
        gpus: energy::gpu::probe(roots.nvml_lib.as_deref()),
    }
}

impl ProbeReport {
    /// The report as a human-readable table.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let mib = self.memory_bytes / (1 << 20);
        out.push_str(&format!(
            "machine   {} {} (kernel {}), {} cores, {mib} MiB\n",
            self.arch, self.os, self.kernel, self.cores
        ));
        out.push_str("\nenergy sources (tried in this order)\n");
        out.push_str(&format!("  {:<10} {:<9} {:<40} note\n", "source", "readable", "domains"));
        for e in &self.energy {
            let domains = if e.domains.is_empty() { "-".to_string() } else { e.domains.join(",") };
            out.push_str(&format!(
                "  {:<10} {:<9} {:<40} {}\n",
                e.kind.as_str(),
                if e.readable { "yes" } else { "NO" },
                domains,
                e.note.as_deref().unwrap_or("")
            ));
        }
        out.push_str(&format!("  selected: {}\n", self.energy_selected));
        for s in &self.energy_skipped {
            out.push_str(&format!("  skipped: {s}\n"));
        }
        out.push_str(&format!(
            "\nperf counters: {} open, hardware events {}\n",
            self.counters.len(),
            if self.hardware_counters { "supported" } else { "NOT supported (software events only)" }
        ));
        for c in &self.counters {
            let kind = match counters::kind_of(c) {
                CounterKind::Hardware => "hardware",
                CounterKind::Software => "software",
            };
            out.push_str(&format!("  {c:<26} {kind}\n"));
        }
        for m in &self.counters_missing {
            out.push_str(&format!("  {:<26} missing: {}\n", m.event, m.reason));
        }
        out.push_str(&self.gpus.render());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_of_an_empty_tree_selects_the_estimate_and_renders() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = probe(&EnergyRoots::under(dir.path()), EstimateModel::default());
        assert_eq!(report.energy_selected, EnergySourceKind::Estimated);
        assert_eq!(report.energy.len(), 1);
        assert!(report.cores >= 1);
        let table = report.render_table();
        assert!(table.contains("selected: estimated"), "{table}");
        assert!(table.contains("perf counters:"), "{table}");
        assert_eq!(report.counters.len() + report.counters_missing.len(), 16);
        // The fixture tree's NVML is absent: said so, never the machine's.
        assert!(matches!(report.gpus, energy::gpu::GpuReport::Unavailable { .. } | energy::gpu::GpuReport::NotBuilt));
        assert!(table.contains("gpus (NVML, read only)"), "{table}");
    }
}
