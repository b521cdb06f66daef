//! Parameter values of a trial, as chosen by a search strategy.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One parameter value. Floats print in the shortest form that round-trips.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Text(String),
}

impl ParamValue {
    /// The value as a float, for numeric parameters.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            ParamValue::Int(i) => Some(*i as f64),
            ParamValue::Float(f) => Some(*f),
            ParamValue::Text(_) => None,
        }
    }

    /// The value as a non-negative integer, for counts such as cores.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            ParamValue::Int(i) => u64::try_from(*i).ok(),
            ParamValue::Float(f) if f.fract() == 0.0 && *f >= 0.0 => Some(*f as u64),
            ParamValue::Float(_) => None,
            ParamValue::Text(s) => s.parse().ok(),
        }
    }
}

impl fmt::Display for ParamValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamValue::Int(i) => write!(f, "{i}"),
            ParamValue::Float(x) => write!(f, "{x}"),
            ParamValue::Text(s) => f.write_str(s),
        }
    }
}

/// A full assignment of parameter name to value, ordered by name.
pub type Params = BTreeMap<String, ParamValue>;
