//! Objectives made of measured figures beyond one reading:
//! * `energy_time`: Zeus's trade-off of energy against time,
//!   `eta * energy + (1 - eta) * max_power * wall_time` (joules; `eta = 1`
//!   is energy alone, `eta = 0` time at full power), with the machine's
//!   maximum power declared in the study;
//! * `to_target`: a measured objective (`energy`, `wall_time`,
//!   `energy_time`) counted only up to the first epoch whose metric reached
//!   the target (energy to accuracy); a trial that never reached it misses
//!   the target as a constraint does, so it ranks after those that did.

use serde::{Deserialize, Serialize};
use tunefleet_common::measurement::Measurement;

use super::constraint::Constraint;

/// `[objective] metric = "energy_time"`'s knob and the power it weighs time at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EnergyTime {
    /// Weight of energy, 0 to 1 (Zeus's `eta_knob`).
    pub eta: f64,
    /// The machine's maximum power (W): what a second of time costs at `eta = 0`.
    pub max_power_w: f64,
}

impl EnergyTime {
    /// The cost of `joules` spent over `secs`.
    pub fn cost(&self, joules: f64, secs: f64) -> f64 {
        self.eta * joules + (1.0 - self.eta) * self.max_power_w * secs
    }
}

/// Where a measured objective stops counting: the first epoch whose
/// `metric` meets `bound`.
pub type Target = Constraint;

/// The measured figures `energy`, `wall_time` and `energy_time` of `m`,
/// counted up to `until_ms` since the workload started (`None`: the whole
/// trial). Energy up to a time is the power series' share of it where the
/// agent sampled one, else the share of the wall time.
pub fn measured(m: &Measurement, metric: &str, energy_time: Option<EnergyTime>, until_ms: Option<u64>) -> Option<f64> {
    let wall_s = m.wall_us as f64 / 1e6;
    let secs = until_ms.map_or(wall_s, |t| (t as f64 / 1000.0).min(wall_s));
    let energy = || -> Option<f64> {
        let total = m.energy_figure().counted()?;
        Some(total * until_ms.map_or(1.0, |t| energy_share(m, t)))
    };
    match metric {
        "energy" => energy(),
        "wall_time" => Some(secs),
        "energy_time" => Some(energy_time?.cost(energy()?, secs)),
        other => m.objective_value(other),
    }
}

/// The share of `m`'s energy spent in its first `until_ms`.
fn energy_share(m: &Measurement, until_ms: u64) -> f64 {
    let series = &m.energy.series;
    let mut before = 0u64;
    let (mut upto, mut total) = (0.0, 0.0);
    for s in series {
        let span = s.elapsed_ms.saturating_sub(before) as f64;
        total += s.watts * span;
        upto += s.watts * (until_ms.min(s.elapsed_ms).saturating_sub(before.min(until_ms))) as f64;
        before = s.elapsed_ms;
    }
    if total > 0.0 {
        return (upto / total).clamp(0.0, 1.0);
    }
    let wall_ms = m.wall_us as f64 / 1000.0;
    if wall_ms > 0.0 {
        (until_ms as f64 / wall_ms).clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// The best value of `target`'s metric the trial reported (an epoch or its
/// final line): the highest for a lower bound, the lowest for an upper one.
pub fn best_reported(m: &Measurement, target: &Target) -> Option<f64> {
    let values = m
        .epochs
        .iter()
        .filter_map(|e| e.metrics.get(&target.metric).copied())
        .chain(m.final_metrics.get(&target.metric).copied())
        .filter(|v| v.is_finite());
    match target.bound {
        super::constraint::Bound::AtLeast(_) => values.reduce(f64::max),
        super::constraint::Bound::AtMost(_) => values.reduce(f64::min),
    }
}

/// When `target` was first met (ms since the workload started), and how
/// far the trial missed it when never: its best epoch's miss (a metric
/// never reported misses without end).
pub fn reached(m: &Measurement, target: &Target) -> Result<u64, f64> {
    let mut miss = f64::INFINITY;
    for e in &m.epochs {
        let v = e.metrics.get(&target.metric).copied();
        let this = target.violation(v);
        if this == 0.0 {
            return Ok(e.elapsed_us / 1000);
        }
        miss = miss.min(this);
    }
    // The final line counts as the last report.
    let last = target.violation(m.final_metrics.get(&target.metric).copied());
    if last == 0.0 {
        return Ok(m.wall_us / 1000);
    }
    Err(miss.min(last))
}

#[cfg(test)]
mod tests {
    use super::super::constraint::Bound;
    use super::*;
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, EpochMetrics, ExitOutcome, PowerSample};

    fn run(accuracies: &[f64], joules: f64, series: Vec<PowerSample>) -> Measurement {
        let mut reading = EnergyReading::none(EnergySourceKind::Rapl, "");
        reading.joules = joules;
        reading.valid = true;
        reading.series = series;
        let mut m = Measurement::unmeasured(ExitOutcome::Exited(0), reading);
        m.wall_us = accuracies.len() as u64 * 1_000_000;
        m.epochs = accuracies
            .iter()
            .enumerate()
            .map(|(i, a)| EpochMetrics {
                epoch: i as u32 + 1,
                elapsed_us: (i as u64 + 1) * 1_000_000,
                metrics: [("accuracy".to_string(), *a)].into(),
                checkpoint: None,
            })
            .collect();
        m
    }

    #[test]
    fn energy_time_weighs_energy_against_time_at_full_power() {
        let et = EnergyTime { eta: 0.5, max_power_w: 300.0 };
        let m = run(&[0.5, 0.6], 400.0, Vec::new());
        // 0.5 * 400 J + 0.5 * 300 W * 2 s.
        assert_eq!(measured(&m, "energy_time", Some(et), None), Some(500.0));
        assert_eq!(measured(&m, "energy_time", Some(EnergyTime { eta: 1.0, ..et }), None), Some(400.0));
        assert_eq!(measured(&m, "energy_time", Some(EnergyTime { eta: 0.0, ..et }), None), Some(600.0));
    }

    #[test]
    fn energy_to_target_counts_up_to_the_first_epoch_that_reached_it() {
        let target = Constraint { metric: "accuracy".into(), bound: Bound::AtLeast(0.97) };
        // Reached at the third of four epochs (3 s of 4 s).
        let m = run(&[0.9, 0.95, 0.971, 0.99], 400.0, Vec::new());
        assert_eq!(reached(&m, &target), Ok(3_000));
        assert_eq!(measured(&m, "wall_time", None, Some(3_000)), Some(3.0));
        assert_eq!(measured(&m, "energy", None, Some(3_000)), Some(300.0), "the time's share without a series");
        // A power series of 100 W for 2 s, then 300 W: 200 + 300 J of 800 J by 3 s.
        let series = [(1_000, 100.0), (2_000, 100.0), (3_000, 300.0), (4_000, 300.0)]
            .map(|(elapsed_ms, watts)| PowerSample { elapsed_ms, watts })
            .to_vec();
        let m = run(&[0.9, 0.95, 0.971, 0.99], 800.0, series);
        assert_eq!(measured(&m, "energy", None, Some(3_000)), Some(500.0), "the series' share");
        // Never reached: missed by its best epoch's gap.
        let short = run(&[0.9, 0.95], 100.0, Vec::new());
        let miss = reached(&short, &target).expect_err("never reached");
        assert!((miss - 0.02).abs() < 1e-12, "{miss}");
    }
}
