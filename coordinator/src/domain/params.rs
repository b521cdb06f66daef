//! A trial's configuration as text: its parameters as the plain JSON object
//! the store keeps and the engine and reuse key runs by, and a system
//! configuration in a few words for logs, `tunefleet profiles` and the
//! report. Pure; below the store, reuse and the report, which all write them.

use tunefleet_common::message::SystemParams;
use tunefleet_common::params::{ParamValue, Params};

/// Parameters as a plain JSON object (`{"lr": 0.1, "opt": "sgd"}`).
pub fn params_json(params: &Params) -> String {
    let map: serde_json::Map<String, serde_json::Value> =
        params.iter().map(|(k, v)| (k.clone(), param_value_json(v))).collect();
    serde_json::Value::Object(map).to_string()
}

pub(crate) fn param_value_json(v: &ParamValue) -> serde_json::Value {
    match v {
        ParamValue::Int(i) => serde_json::Value::from(*i),
        ParamValue::Float(f) => serde_json::Number::from_f64(*f).map_or(serde_json::Value::Null, Into::into),
        ParamValue::Text(s) => serde_json::Value::from(s.clone()),
    }
}

/// Parameters for reading (`best`, the summary, the report): floats with 6
/// significant digits (`lr=0.261507`, not `lr=0.2615066378554959`); the
/// store, `--json` and `export` keep them exact.
pub fn params_text(params: &Params) -> String {
    params.iter().map(|(k, v)| format!("{k}={}", value_text(v))).collect::<Vec<_>>().join(" ")
}

/// One value for reading: see [`params_text`].
pub fn value_text(v: &ParamValue) -> String {
    match v {
        ParamValue::Float(f) if f.is_finite() && *f != 0.0 => {
            let magnitude = f.abs().log10().floor() as i32;
            if !(-4..6).contains(&magnitude) {
                return format!("{f:.5e}");
            }
            let decimals = (5 - magnitude).clamp(0, 10) as usize;
            let text = format!("{f:.decimals$}");
            if text.contains('.') {
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            } else {
                text
            }
        }
        other => other.to_string(),
    }
}

/// Parses what [`params_json`] wrote.
pub fn params_from_json(text: &str) -> Result<Params, serde_json::Error> {
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)?;
    let mut out = Params::new();
    for (k, v) in map {
        let value = match v {
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(i) => ParamValue::Int(i),
                None => ParamValue::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => ParamValue::Text(s),
            other => ParamValue::Text(other.to_string()),
        };
        out.insert(k, value);
    }
    Ok(out)
}

/// A system configuration in a few words: what is set, in order
/// (`cores=2 threads=1 memory=512 MiB`), `default` when nothing is.
pub fn system_text(s: &SystemParams) -> String {
    let mut words = Vec::new();
    if let Some(c) = s.cores {
        words.push(format!("cores={c}"));
    }
    if let Some(t) = s.threads {
        words.push(format!("threads={t}"));
    }
    if let Some(m) = s.memory_mib {
        words.push(format!("memory={m} MiB"));
    }
    if words.is_empty() {
        "default".to_string()
    } else {
        words.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_with_six_significant_digits() {
        let p: Params = [
            ("a".to_string(), ParamValue::Float(0.2615066378554959)),
            ("b".to_string(), ParamValue::Float(2.0)),
            ("c".to_string(), ParamValue::Float(1.2345678e-7)),
            ("d".to_string(), ParamValue::Int(32)),
            ("e".to_string(), ParamValue::Text("adam".into())),
            ("f".to_string(), ParamValue::Float(123456.789)),
        ]
        .into();
        assert_eq!(params_text(&p), "a=0.261507 b=2 c=1.23457e-7 d=32 e=adam f=123457");
    }

    #[test]
    fn params_json_round_trips_plain_values() {
        let mut p = Params::new();
        p.insert("lr".into(), ParamValue::Float(0.05));
        p.insert("whole".into(), ParamValue::Float(2.0));
        p.insert("batch".into(), ParamValue::Int(32));
        p.insert("opt".into(), ParamValue::Text("sgd".into()));
        let text = params_json(&p);
        assert_eq!(text, r#"{"batch":32,"lr":0.05,"opt":"sgd","whole":2.0}"#);
        assert_eq!(params_from_json(&text).expect("parses"), p);
    }

    #[test]
    fn system_text_names_what_is_set() {
        assert_eq!(system_text(&SystemParams::default()), "default");
        let s = SystemParams { cores: Some(2), threads: Some(4), memory_mib: Some(512) };
        assert_eq!(system_text(&s), "cores=2 threads=4 memory=512 MiB");
    }
}
