//! `[[constraint]]`: a bound on a figure of each trial, a reported metric
//! (`accuracy`, `latency_ms`) or a measured one (`energy`, `wall_time`,
//! `cpu_time`, `max_rss_mib`). A trial is feasible when every bound holds;
//! its violation is how far it misses them, summed (Optuna's rule: 0 when
//! feasible). The one ranking rule ([`crate::domain::rank`]) puts feasible
//! configurations first by the objective, the others by their violation.

use serde::{Deserialize, Serialize};
use tunefleet_common::measurement::Measurement;

/// Which side of its bound a figure must stay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    AtMost(f64),
    AtLeast(f64),
}

/// One `[[constraint]]` entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Constraint {
    /// A metric the workload reports, or a measured figure ([`figure`]).
    pub metric: String,
    pub bound: Bound,
}

/// A trial's value of `name`: a measured figure (energy in J, times in s,
/// peak memory in MiB) or the metric its workload reported last.
pub fn figure(m: &Measurement, name: &str) -> Option<f64> {
    match name {
        "energy_j" => m.objective_value("energy"),
        "max_rss_mib" => Some(m.max_rss_kib as f64 / 1024.0),
        other => m.objective_value(other),
    }
}

impl Constraint {
    /// How far `value` misses the bound (0: it holds). A missing or
    /// non-finite value misses it without end.
    pub fn violation(&self, value: Option<f64>) -> f64 {
        let Some(v) = value.filter(|v| v.is_finite()) else { return f64::INFINITY };
        match self.bound {
            Bound::AtMost(b) => (v - b).max(0.0),
            Bound::AtLeast(b) => (b - v).max(0.0),
        }
    }

    /// `value`'s signed distance to the bound: at most 0 where it holds (how
    /// far inside), above 0 how far it misses; a missing or non-finite
    /// value misses without end. What the search models each constraint by.
    pub fn margin(&self, value: Option<f64>) -> f64 {
        let Some(v) = value.filter(|v| v.is_finite()) else { return f64::INFINITY };
        match self.bound {
            Bound::AtMost(b) => v - b,
            Bound::AtLeast(b) => b - v,
        }
    }

    /// `accuracy >= 0.97`.
    pub fn describe(&self) -> String {
        match self.bound {
            Bound::AtMost(b) => format!("{} <= {b}", self.metric),
            Bound::AtLeast(b) => format!("{} >= {b}", self.metric),
        }
    }
}

/// A successful measurement's total violation of `constraints` (`None`
/// when there are none: every trial is feasible).
pub fn violation(constraints: &[Constraint], m: &Measurement) -> Option<f64> {
    (!constraints.is_empty()).then(|| constraints.iter().map(|c| c.violation(figure(m, &c.metric))).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome};

    fn measured(accuracy: Option<f64>, wall_us: u64, rss_kib: u64) -> Measurement {
        let mut m =
            Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""));
        if let Some(a) = accuracy {
            m.final_metrics.insert("accuracy".into(), a);
        }
        m.wall_us = wall_us;
        m.max_rss_kib = rss_kib;
        m
    }

    #[test]
    fn violations_sum_how_far_each_bound_is_missed_and_a_missing_figure_misses_without_end() {
        let cs = vec![
            Constraint { metric: "accuracy".into(), bound: Bound::AtLeast(0.97) },
            Constraint { metric: "wall_time".into(), bound: Bound::AtMost(2.0) },
            Constraint { metric: "max_rss_mib".into(), bound: Bound::AtMost(100.0) },
        ];
        assert_eq!(violation(&cs, &measured(Some(0.98), 1_500_000, 1024)), Some(0.0), "feasible");
        let v = violation(&cs, &measured(Some(0.95), 3_000_000, 200 * 1024)).expect("a violation");
        assert!((v - (0.02 + 1.0 + 100.0)).abs() < 1e-9, "{v}");
        assert_eq!(violation(&cs, &measured(None, 0, 0)), Some(f64::INFINITY));
        assert_eq!(violation(&[], &measured(None, 0, 0)), None, "no constraint: no violation");
        assert_eq!(cs[0].describe(), "accuracy >= 0.97");
    }
}
