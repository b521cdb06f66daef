//! `[stability]`'s statistic: how far a configuration's repeats spread.

/// The coefficient of variation of `values` (sample standard deviation
/// over the absolute mean; the standard deviation itself when the mean is
/// 0); `None` for fewer than two values.
pub fn spread(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = (values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0)).sqrt();
    Some(if mean == 0.0 { sd } else { sd / mean.abs() })
}
