//! The told values as the Gaussian-process model sees them: warped,
//! standardised, thinned to the points it is fitted and conditioned on,
//! and scalarised with random weights when there are several objectives.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// At most `max` of the points: all when there are no more, else the best
/// half (lowest `y`) and an even spread of the rest, in their order.
pub(super) fn subset(x: Vec<Vec<f64>>, y: Vec<f64>, max: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
    if x.len() <= max {
        return (x, y);
    }
    let mut order: Vec<usize> = (0..y.len()).collect();
    order.sort_by(|&a, &b| y[a].total_cmp(&y[b]).then(a.cmp(&b)));
    let best = max / 2;
    let mut keep: Vec<usize> = order[..best].to_vec();
    let mut rest: Vec<usize> = order[best..].to_vec();
    rest.sort_unstable();
    let spread = max - best;
    keep.extend((0..spread).map(|k| rest[k * rest.len() / spread]));
    keep.sort_unstable();
    (keep.iter().map(|&i| x[i].clone()).collect(), keep.iter().map(|&i| y[i]).collect())
}

/// The points the model is conditioned on: all while there are at most
/// `max`; beyond, a [`subset`] of the first points chosen at a schedule
/// point `n0` (`max`, then every `max / 10` more), then every point after
/// `n0`, in their order. Between two schedule points an ask's points are
/// the last ask's and the ones told since, at the end: the model's factor
/// is continued, a row a new point, instead of computed again as a subset
/// of all would have it (its best half and even spread shift at every
/// point). At most `max` points: the subset at `n0` keeps `max - step`.
pub(super) fn stable_subset(mut x: Vec<Vec<f64>>, mut y: Vec<f64>, max: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
    let n = x.len();
    if n <= max {
        return (x, y);
    }
    let step = (max / 10).max(1);
    let n0 = max + (n - max) / step * step;
    let kept = max.saturating_sub(step).max(1);
    let (since_x, since_y) = (x.split_off(n0), y.split_off(n0));
    let (mut xs, mut ys) = subset(x, y, kept);
    xs.extend(since_x);
    ys.extend(since_y);
    (xs, ys)
}

/// Weights drawn uniformly on the simplex (normalised exponentials).
pub(super) fn simplex_weights(k: usize, rng: &mut ChaCha8Rng) -> Vec<f64> {
    let draws: Vec<f64> = (0..k).map(|_| -(1.0 - rng.random::<f64>()).ln()).collect();
    let total: f64 = draws.iter().sum();
    draws.iter().map(|d| if total > 0.0 { d / total } else { 1.0 / k as f64 }).collect()
}

/// Values above the median compressed logarithmically beyond their
/// interquartile range (monotone: the order of the values is kept).
pub(super) fn warp(y: &[f64]) -> Vec<f64> {
    let mut sorted = y.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let (median, iqr) = (at(0.5), at(0.75) - at(0.25));
    if iqr.is_nan() || iqr <= 0.0 {
        return y.to_vec();
    }
    y.iter().map(|&v| if v > median { median + iqr * ((v - median) / iqr).ln_1p() } else { v }).collect()
}

/// Mean 0, deviation 1 (a constant set becomes zeros).
pub(super) fn standardise(y: &[f64]) -> Vec<f64> {
    let n = y.len() as f64;
    let mean = y.iter().sum::<f64>() / n;
    let sd = (y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    let sd = if sd > 0.0 { sd } else { 1.0 };
    y.iter().map(|v| (v - mean) / sd).collect()
}
