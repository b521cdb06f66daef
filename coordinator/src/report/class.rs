//! Device classes of a study's results in figures: the report's summary of
//! each group of [`crate::query::best::by_class`] (ranked results grouped by the
//! class of the agent that ran them). Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::store::Ranked;

/// One device class in figures.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSummary<'a> {
    pub class: String,
    /// Distinct agents among its results.
    pub agents: usize,
    /// Ranked results.
    pub ranked: usize,
    /// Its best result.
    pub best: &'a Ranked,
    pub median_objective: f64,
    pub mean_wall_s: f64,
    /// Mean energy of its valid readings (`None`: no valid reading).
    pub mean_energy_j: Option<f64>,
    /// Energy sources of its results (`none` for a result without one).
    pub sources: Vec<String>,
}

/// The summary of each group of [`crate::query::best::by_class`], by class name.
pub fn summaries<'a>(groups: &BTreeMap<String, Vec<&'a Ranked>>) -> Vec<ClassSummary<'a>> {
    groups
        .iter()
        .filter_map(|(class, rows)| {
            let best = *rows.first()?;
            let mut objectives: Vec<f64> = rows.iter().map(|r| r.objective()).collect();
            objectives.sort_by(f64::total_cmp);
            let mid = objectives.len() / 2;
            let median_objective =
                if objectives.len() % 2 == 1 { objectives[mid] } else { (objectives[mid - 1] + objectives[mid]) / 2.0 };
            let energies: Vec<f64> = rows.iter().filter_map(|r| r.energy().counted()).collect();
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let walls: Vec<f64> = rows.iter().map(|r| r.result.wall_us as f64 / 1e6).collect();
            Some(ClassSummary {
                class: class.clone(),
                agents: rows.iter().map(|r| r.result.agent.as_str()).collect::<BTreeSet<_>>().len(),
                ranked: rows.len(),
                best,
                median_objective,
                mean_wall_s: mean(&walls),
                mean_energy_j: (!energies.is_empty()).then(|| mean(&energies)),
                sources: rows
                    .iter()
                    .map(|r| r.result.energy.source_name().map(str::to_string).unwrap_or_else(|| "none".to_string()))
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::search::TrialPlan;
    use crate::query::best::{by_class, UNKNOWN_AGENT};
    use crate::store::{AgentRow, Outcome, StoredEnergy};
    use tunefleet_common::measurement::EnergySourceKind;
    use tunefleet_common::message::{AgentInfo, EnergySourceInfo};

    fn agent(name: &str, arch: &str, energy: Option<EnergySourceKind>) -> AgentRow {
        let mut info = AgentInfo::minimal(name, 1);
        info.arch = arch.into();
        info.cores = 4;
        info.energy = energy
            .map(|kind| EnergySourceInfo { kind, domains: Vec::new(), readable: true, note: None })
            .into_iter()
            .collect();
        AgentRow {
            name: name.into(),
            info,
            first_seen_ms: 0,
            last_seen_ms: 0,
            online: false,
            telemetry: None,
            running: Vec::new(),
            held: Vec::new(),
            lost_held: 0,
        }
    }

    fn row(trial: u64, agent: &str, objective: f64, energy: Option<f64>, valid: bool) -> Ranked {
        let source = energy.map(|_| EnergySourceKind::Rapl);
        let energy = StoredEnergy { joules: energy, source, valid };
        Ranked {
            plan: TrialPlan { trial, params: Default::default(), repeat: 0 },
            result: Outcome::for_test(agent, Some(objective), 2_000_000, energy),
            runs: 1,
            mean: objective,
            mean_violation: 0.0,
        }
    }

    #[test]
    fn results_group_by_their_agents_class_and_summarise() {
        let agents = [
            agent("x1", "x86_64", Some(EnergySourceKind::Rapl)),
            agent("x2", "x86_64", Some(EnergySourceKind::Rapl)),
            agent("phone", "aarch64", None),
        ];
        let rows = [
            row(3, "x1", 1.0, Some(10.0), true),
            row(1, "phone", 2.0, None, false),
            row(4, "x2", 3.0, Some(30.0), true),
            row(5, "x1", 5.0, Some(99.0), false),
            row(9, "gone", 6.0, None, false),
        ];
        let groups = by_class(&rows, &agents);
        let names: Vec<&str> = groups.keys().map(String::as_str).collect();
        assert_eq!(names, ["aarch64, 4 cores, no energy", UNKNOWN_AGENT, "x86_64, 4 cores, rapl"]);
        let x86: Vec<u64> = groups["x86_64, 4 cores, rapl"].iter().map(|r| r.plan.trial).collect();
        assert_eq!(x86, [3, 4, 5], "the order of the rows is kept");

        let s = summaries(&groups);
        let x86 = &s[2];
        assert_eq!((x86.agents, x86.ranked, x86.best.plan.trial), (2, 3, 3));
        assert_eq!(x86.median_objective, 3.0);
        assert_eq!(x86.mean_energy_j, Some(20.0), "the invalid reading is left out");
        assert_eq!(x86.mean_wall_s, 2.0);
        assert_eq!(x86.sources, ["rapl"]);
        assert_eq!(s[0].mean_energy_j, None);
        assert_eq!(s[0].sources, ["none"]);
        assert!(summaries(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn an_even_group_has_the_middle_mean_as_median() {
        let rows = [row(0, "a", 1.0, None, false), row(1, "a", 4.0, None, false)];
        let s = summaries(&by_class(&rows, &[]));
        assert_eq!(s[0].median_objective, 2.5);
    }
}
