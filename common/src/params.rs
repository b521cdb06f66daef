//! Parameter values of a trial, as chosen by a search strategy, and the
//! system parameters ([`SystemParams`]) the agent applies for real.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// One parameter value. Floats print in the shortest form that round-trips.
/// Its JSON is the plain value (`3`, `0.1`, `"adam"`), as users' scripts
/// read it from `--json` and `export`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
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

/// System parameters of a trial, applied by the agent for real. Its JSON
/// form (the coordinator's store) and its wire form are its serde fields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SystemParams {
    /// Pin the process tree to this many CPUs.
    pub cores: Option<u32>,
    /// Set OMP_NUM_THREADS and friends to this.
    pub threads: Option<u32>,
    /// Limit memory to this many MiB.
    pub memory_mib: Option<u64>,
}

/// `cores=2 threads=4 memory=512 MiB`, the parameters set in that order;
/// `default` when none is.
impl fmt::Display for SystemParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words = Vec::new();
        if let Some(c) = self.cores {
            words.push(format!("cores={c}"));
        }
        if let Some(t) = self.threads {
            words.push(format!("threads={t}"));
        }
        if let Some(m) = self.memory_mib {
            words.push(format!("memory={m} MiB"));
        }
        if words.is_empty() {
            f.write_str("default")
        } else {
            f.write_str(&words.join(" "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_params_display_lists_what_is_set_in_order() {
        let all = SystemParams { cores: Some(2), threads: Some(4), memory_mib: Some(512) };
        assert_eq!(all.to_string(), "cores=2 threads=4 memory=512 MiB");
        let threads = SystemParams { threads: Some(8), ..SystemParams::default() };
        assert_eq!(threads.to_string(), "threads=8");
        assert_eq!(SystemParams::default().to_string(), "default");
    }

    #[test]
    fn parameters_are_plain_json_values_and_read_back_as_they_were() {
        let p: Params = [
            ("k".to_string(), ParamValue::Text("adam".into())),
            ("n".to_string(), ParamValue::Int(3)),
            ("x".to_string(), ParamValue::Float(1.61)),
            ("y".to_string(), ParamValue::Float(2.0)),
        ]
        .into();
        let json = serde_json::to_string(&p).expect("serialises");
        assert_eq!(json, r#"{"k":"adam","n":3,"x":1.61,"y":2.0}"#);
        assert_eq!(serde_json::from_str::<Params>(&json).expect("reads back"), p);
    }
}
