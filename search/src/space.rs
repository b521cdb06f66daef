//! A search space: the domain of each parameter ([`ParamSpec`]) and which
//! way an objective goes ([`Direction`]).

use std::fmt;

use serde::{Deserialize, Serialize};
use tunefleet_common::params::ParamValue;

/// Whether the objective is to be made small or large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Minimize,
    Maximize,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Minimize => "minimize",
            Direction::Maximize => "maximize",
        }
    }

    /// Parses `minimize` or `maximize`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "minimize" => Some(Direction::Minimize),
            "maximize" => Some(Direction::Maximize),
            _ => None,
        }
    }

    /// True when `a` is a better objective value than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Direction::Minimize => a < b,
            Direction::Maximize => a > b,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The domain of one parameter.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ParamSpec {
    /// One of these values (non-empty, no duplicates).
    Categorical { values: Vec<ParamValue> },
    /// `low, low + step, ...` up to and including `high` when on the lattice.
    Int { low: i64, high: i64, step: i64 },
    /// Uniform between `low` and `high`; `grid` points for the grid strategy.
    Float { low: f64, high: f64, grid: u32 },
    /// Log-uniform between `low > 0` and `high`; `grid` geometric points.
    LogFloat { low: f64, high: f64, grid: u32 },
}

impl ParamSpec {
    /// Whether it holds `v`: one of a categorical's values, an int on its
    /// lattice, a float within its bounds.
    pub fn holds(&self, v: &tunefleet_common::params::ParamValue) -> bool {
        use tunefleet_common::params::ParamValue;
        match (self, v) {
            (ParamSpec::Categorical { values }, v) => values.contains(v),
            (ParamSpec::Int { low, high, step }, ParamValue::Int(i)) => {
                (low..=high).contains(&i) && (i - low) % (*step).max(1) == 0
            }
            (ParamSpec::Float { low, high, .. } | ParamSpec::LogFloat { low, high, .. }, v) => {
                v.as_f64().is_some_and(|x| x.is_finite() && (*low..=*high).contains(&x))
            }
            _ => false,
        }
    }

    /// Points of the parameter's grid: every value of a categorical or an
    /// int, `grid` points of a float.
    pub fn grid_len(&self) -> u64 {
        match self {
            ParamSpec::Categorical { values } => values.len() as u64,
            ParamSpec::Int { low, high, step } => {
                // i128: no overflow for any i64 bounds; at least 1 when low <= high.
                let points = (i128::from(*high) - i128::from(*low)).max(-1) / i128::from((*step).max(1)) + 1;
                u64::try_from(points).unwrap_or(u64::MAX)
            }
            ParamSpec::Float { grid, .. } | ParamSpec::LogFloat { grid, .. } => u64::from((*grid).max(2)),
        }
    }
}

/// The `i`-th grid value of one parameter (`i < spec.grid_len()`): ints
/// stepped from `low`, floats linear and log_floats geometric between `low`
/// and `high` (both included), categorical values in file order.
pub fn grid_value(spec: &ParamSpec, i: u64) -> ParamValue {
    match spec {
        ParamSpec::Categorical { values } => {
            values[usize::try_from(i).unwrap_or(usize::MAX).min(values.len().saturating_sub(1))].clone()
        }
        ParamSpec::Int { low, high, step } => {
            let v = i128::from(*low) + i128::from(i) * i128::from((*step).max(1));
            // Clamped to high, so the value fits in i64.
            ParamValue::Int(v.min(i128::from(*high)) as i64)
        }
        ParamSpec::Float { low, high, grid } => {
            let n = u64::from((*grid).max(2));
            ParamValue::Float(if i + 1 >= n { *high } else { low + (high - low) * i as f64 / (n - 1) as f64 })
        }
        ParamSpec::LogFloat { low, high, grid } => {
            let n = u64::from((*grid).max(2));
            let (a, b) = (low.ln(), high.ln());
            ParamValue::Float(match i {
                0 => *low,
                i if i + 1 >= n => *high,
                i => (a + (b - a) * i as f64 / (n - 1) as f64).exp(),
            })
        }
    }
}

/// Every grid value of one parameter, in order (see [`grid_value`]).
pub fn grid_values(spec: &ParamSpec) -> Vec<ParamValue> {
    (0..spec.grid_len()).map(|i| grid_value(spec, i)).collect()
}
