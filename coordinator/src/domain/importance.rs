//! Which parameters mattered: each parameter's share of the objective's
//! variance that it explains alone (its main effect), over the ranked
//! trials of a study. A first-order functional ANOVA on the trials as they
//! fell, without a surrogate model (Optuna's default fits a random forest
//! first): for each parameter the trials are grouped by its value
//! (categorical and integer values with few levels) or by quantile bins (up
//! to [`MAX_BINS`]), and the variance of the group means, weighted by group
//! size, is divided by the objective's total variance. Shares are
//! normalised to sum to 1, as Optuna's importances do; interactions are not
//! attributed. Pure.

use std::collections::BTreeMap;

use tunefleet_common::params::{ParamValue, Params};

/// Most groups a numeric parameter is cut into.
pub const MAX_BINS: usize = 8;
/// Fewest trials worth an answer.
pub const MIN_TRIALS: usize = 4;

/// The group of each trial for one parameter (`None`: the trial lacks it).
fn groups(values: &[Option<&ParamValue>]) -> Vec<Option<usize>> {
    let numeric: Vec<Option<f64>> = values.iter().map(|v| v.and_then(ParamValue::as_f64)).collect();
    let mut distinct: Vec<String> = values.iter().flatten().map(|v| v.to_string()).collect();
    distinct.sort();
    distinct.dedup();
    let all_numeric = values.iter().flatten().all(|v| v.as_f64().is_some());
    if !all_numeric || distinct.len() <= MAX_BINS {
        // Each value its own group.
        return values.iter().map(|v| v.and_then(|v| distinct.binary_search(&v.to_string()).ok())).collect();
    }
    // Quantile bins of the numeric values.
    let mut sorted: Vec<f64> = numeric.iter().flatten().copied().collect();
    sorted.sort_by(f64::total_cmp);
    let edges: Vec<f64> = (1..MAX_BINS).map(|k| sorted[k * sorted.len() / MAX_BINS]).collect();
    numeric.iter().map(|v| v.map(|x| edges.iter().filter(|e| x >= **e).count())).collect()
}

/// Each parameter of `trials` (configuration, objective) with its share of
/// the explained variance, largest first; empty with fewer than
/// [`MIN_TRIALS`] finite objectives or when the objective does not vary.
pub fn importance(trials: &[(Params, f64)]) -> Vec<(String, f64)> {
    let trials: Vec<&(Params, f64)> = trials.iter().filter(|(_, y)| y.is_finite()).collect();
    if trials.len() < MIN_TRIALS {
        return Vec::new();
    }
    let n = trials.len() as f64;
    let mean = trials.iter().map(|(_, y)| y).sum::<f64>() / n;
    let total = trials.iter().map(|(_, y)| (y - mean).powi(2)).sum::<f64>() / n;
    if total <= f64::EPSILON * mean.abs().max(1.0) {
        return Vec::new();
    }
    let names: std::collections::BTreeSet<&String> = trials.iter().flat_map(|(p, _)| p.keys()).collect();
    let mut shares: Vec<(String, f64)> = Vec::new();
    for name in names {
        let values: Vec<Option<&ParamValue>> = trials.iter().map(|(p, _)| p.get(name)).collect();
        let mut by: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
        for (g, (_, y)) in groups(&values).into_iter().zip(&trials) {
            if let Some(g) = g {
                let e = by.entry(g).or_insert((0.0, 0.0));
                e.0 += y;
                e.1 += 1.0;
            }
        }
        if by.len() < 2 {
            continue;
        }
        let explained = by.values().map(|(sum, count)| count * (sum / count - mean).powi(2)).sum::<f64>() / n;
        shares.push((name.clone(), explained / total));
    }
    let sum: f64 = shares.iter().map(|(_, s)| s).sum();
    if sum <= 0.0 {
        return Vec::new();
    }
    for s in &mut shares {
        s.1 /= sum;
    }
    shares.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(x: f64, k: &str, n: i64) -> Params {
        [
            ("x".to_string(), ParamValue::Float(x)),
            ("k".to_string(), ParamValue::Text(k.into())),
            ("n".to_string(), ParamValue::Int(n)),
        ]
        .into()
    }

    #[test]
    fn the_parameter_the_objective_follows_takes_nearly_all_the_importance() {
        // y = x^2 over 64 trials; k and n vary independently of y.
        let trials: Vec<(Params, f64)> = (0..64)
            .map(|i| {
                let x = -1.0 + 2.0 * ((i * 37) % 64) as f64 / 63.0;
                (params(x, ["a", "b"][i % 2], (i % 3) as i64), x * x)
            })
            .collect();
        let imp = importance(&trials);
        assert_eq!(imp[0].0, "x", "{imp:?}");
        assert!(imp[0].1 > 0.9, "{imp:?}");
        assert!((imp.iter().map(|(_, s)| s).sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_categorical_parameter_counts_by_its_values() {
        let trials: Vec<(Params, f64)> =
            (0..12).map(|i| (params(i as f64, ["a", "b", "c"][i % 3], 0), [1.0, 5.0, 9.0][i % 3])).collect();
        let imp = importance(&trials);
        assert_eq!(imp[0].0, "k", "{imp:?}");
    }

    #[test]
    fn too_few_trials_or_a_constant_objective_say_nothing() {
        let few: Vec<(Params, f64)> = (0..3).map(|i| (params(i as f64, "a", 0), i as f64)).collect();
        assert!(importance(&few).is_empty());
        let flat: Vec<(Params, f64)> = (0..10).map(|i| (params(i as f64, "a", 0), 2.0)).collect();
        assert!(importance(&flat).is_empty());
    }
}
