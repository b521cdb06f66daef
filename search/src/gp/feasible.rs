//! Feasibility in a study with constraints (`[[constraint]]`, told as each
//! trial's total violation, 0 when it meets them: Optuna's rule): a second
//! Gaussian process over the told violations, and an ask that maximises
//! the expected improvement over the best *feasible* trial times the
//! probability that the violation there is below a threshold (Gelbart et
//! al.'s constrained expected improvement, the product Optuna's
//! `GPSampler` maximises with `constraints_func`), or the probability
//! alone while no told trial is feasible.
//!
//! Told each constraint's signed value (`Sampler::tell_margins`: at most 0
//! where it holds, how far inside; above 0 how far it misses), as Optuna's
//! `constraints_func` returns them, there is a process per constraint and
//! the probability of feasibility is the product of each one's probability
//! of a value at most 0 (the constraints taken as independent, as Optuna
//! takes them). Told only the total violation (a study resumed from a
//! store that kept no more), one process models it: zero on the whole
//! feasible region, it sees how far outside a point is, not how far inside;
//! its values are compressed as `ln(1 + v / s)` (`s` the median positive
//! violation, so a few huge ones do not flatten the boundary) and a point
//! counts as feasible where the posterior is below half the smallest
//! positive value told.

use super::batch::log_normal_cdf;
use super::cube::Cube;
use super::model::Model;

/// A model of each constraint (or of the total violation) and the
/// threshold under which it holds, standardised.
pub(super) struct Feasibility {
    models: Vec<(Model, f64)>,
}

/// `values` standardised, and where `at` falls on the same scale.
fn standardised(values: &[f64], at: f64) -> (Vec<f64>, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    let sd = if sd > 0.0 { sd } else { 1.0 };
    (values.iter().map(|v| (v - mean) / sd).collect(), (at - mean) / sd)
}

impl Feasibility {
    /// The model of `violations` at `x` (unit coordinates); `None` when no
    /// told trial misses the constraints (nothing to learn: every point is
    /// as likely feasible) or the process cannot be fitted.
    pub(super) fn fit(cube: &Cube, x: Vec<Vec<f64>>, violations: &[f64]) -> Option<Feasibility> {
        let mut positive: Vec<f64> = violations.iter().copied().filter(|v| *v > 0.0 && v.is_finite()).collect();
        let missing = violations.iter().any(|v| !v.is_finite());
        if (positive.is_empty() && !missing) || x.len() < 2 {
            return None;
        }
        positive.sort_by(f64::total_cmp);
        let scale = positive.get(positive.len() / 2).copied().unwrap_or(1.0).max(f64::MIN_POSITIVE);
        let g = |v: f64| (1.0 + v.max(0.0) / scale).ln();
        let finite_top = positive.last().map_or(1.0, |v| g(*v));
        // A figure never measured misses without end: past the worst told.
        let values: Vec<f64> =
            violations.iter().map(|v| if v.is_finite() { g(*v) } else { finite_top + 1.0 }).collect();
        let smallest = positive.first().map_or(finite_top + 1.0, |v| g(*v));
        let (y, threshold) = standardised(&values, 0.5 * smallest);
        let theta = cube.fit(&x, &y);
        let model = cube.model(x, &y, &theta, None)?;
        Some(Feasibility { models: vec![(model, threshold)] })
    }

    /// A process per constraint over its signed values `margins` (one row
    /// per point of `x`, one column per constraint); `None` when a process
    /// cannot be fitted. A value never measured (infinite) counts as the
    /// worst told, and one more.
    pub(super) fn fit_margins(cube: &Cube, x: &[Vec<f64>], margins: &[Vec<f64>]) -> Option<Feasibility> {
        let k = margins.first()?.len();
        if x.len() < 2 || k == 0 {
            return None;
        }
        let mut models = Vec::with_capacity(k);
        for c in 0..k {
            let column: Vec<f64> = margins.iter().map(|m| m[c]).collect();
            let top = column.iter().copied().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, f64::max);
            let top = if top.is_finite() { top } else { 1.0 };
            let values: Vec<f64> =
                column.iter().map(|v| if v.is_finite() { *v } else { top + top.abs().max(1.0) }).collect();
            let (y, threshold) = standardised(&values, 0.0);
            let theta = cube.fit(x, &y);
            models.push((cube.model(x.to_vec(), &y, &theta, None)?, threshold));
        }
        Some(Feasibility { models })
    }

    /// `ln P(feasible)` at each of `us`: the sum over the models.
    pub(super) fn log_probability(&self, cube: &Cube, us: &[Vec<f64>]) -> Vec<f64> {
        let mut total = vec![0.0; us.len()];
        for (model, threshold) in &self.models {
            for (t, (mu, var)) in total.iter_mut().zip(model.predict_many(cube, us)) {
                *t += log_normal_cdf((threshold - mu) / var.sqrt());
            }
        }
        total
    }
}
