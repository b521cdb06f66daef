//! Feasibility in a study with constraints (`[[constraint]]`, told as each
//! trial's total violation, 0 when it meets them: Optuna's rule): a second
//! Gaussian process over the told violations, and an ask that maximises
//! the expected improvement over the best *feasible* trial times the
//! probability that the violation there is below a threshold (Gelbart et
//! al.'s constrained expected improvement, the product Optuna's
//! `GPSampler` maximises with `constraints_func`), or the probability
//! alone while no told trial is feasible.
//!
//! The total violation is zero on the whole feasible region, so unlike
//! Optuna (which models each constraint's signed value) the model sees how
//! far outside a point is, not how far inside: its values are compressed as
//! `ln(1 + v / s)` (`s` the median positive violation, so a few huge ones
//! do not flatten the boundary) and a point counts as feasible where the
//! posterior is below half the smallest positive value told.

use super::batch::log_normal_cdf;
use super::cube::Cube;
use super::model::Model;

/// The violation model and its threshold, standardised.
pub(super) struct Feasibility {
    model: Model,
    threshold: f64,
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
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let sd = (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        let sd = if sd > 0.0 { sd } else { 1.0 };
        let y: Vec<f64> = values.iter().map(|v| (v - mean) / sd).collect();
        let theta = cube.fit(&x, &y);
        let model = cube.model(x, &y, &theta, None)?;
        Some(Feasibility { model, threshold: (0.5 * smallest - mean) / sd })
    }

    /// `ln P(feasible)` at each of `us`.
    pub(super) fn log_probability(&self, cube: &Cube, us: &[Vec<f64>]) -> Vec<f64> {
        self.model
            .predict_many(cube, us)
            .into_iter()
            .map(|(mu, var)| log_normal_cdf((self.threshold - mu) / var.sqrt()))
            .collect()
    }
}
