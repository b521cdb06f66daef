//! Drawing one value of a parameter at random, shared by the random search
//! ([`super::Random`]) and TPE's start-up and fallback draws.

use rand::Rng;
use tunefleet_common::params::ParamValue;

use crate::space::ParamSpec;

/// One value of `spec` drawn from `rng`.
pub fn sample(spec: &ParamSpec, rng: &mut impl Rng) -> ParamValue {
    match spec {
        ParamSpec::Categorical { values } => values[rng.random_range(0..values.len())].clone(),
        ParamSpec::Int { low, high, step } => {
            let step = (*step).max(1);
            // Points on the lattice low, low + step, ... <= high (computed in i128: no overflow).
            let points = (i128::from(*high) - i128::from(*low)) / i128::from(step) + 1;
            let k = rng.random_range(0..points);
            // In range by construction: low + k * step <= high.
            ParamValue::Int((i128::from(*low) + k * i128::from(step)) as i64)
        }
        ParamSpec::Float { low, high, .. } => {
            let u: f64 = rng.random();
            ParamValue::Float((low + (high - low) * u).clamp(*low, *high))
        }
        ParamSpec::LogFloat { low, high, .. } => {
            let u: f64 = rng.random();
            let (a, b) = (low.ln(), high.ln());
            ParamValue::Float((a + (b - a) * u).exp().clamp(*low, *high))
        }
    }
}
