//! What an external meter prints: one value, in watts (power now) or in
//! joules (a cumulative counter). [`parse_value`] is a pure function:
//!
//! * a plain number, in the unit the operator configured (`--energy-unit`):
//!   `12.5`;
//! * a number and a unit, separated by optional blanks: `12.5 W`, `1.2kW`,
//!   `250 mW`, `3600 J`, `4.2 kJ`, `1.5 Wh`, `0.25 kWh`, or the words
//!   `watts` / `joules`; the unit given wins over the configured one.
//!   Prefixes are case-sensitive (`mW` is milliwatts; `MW` is refused, not
//!   read as milliwatts);
//! * a small JSON object with exactly one of `"watts"` or `"joules"` as a
//!   number: `{"watts": 12.5}`; other keys are ignored.
//!
//! Surrounding blanks and line ends are ignored; anything else (a second
//! line, trailing text, a comma as decimal mark) is refused: a value that
//! cannot be read unambiguously is not guessed at. Refused too: NaN and
//! infinities, negative values, power above [`MAX_WATTS`] and counters
//! above [`MAX_JOULES`].

use std::fmt;

/// The most power a meter may report: 1 MW, far above a rack.
pub const MAX_WATTS: f64 = 1e6;
/// The largest counter value accepted, in joules: above 1e15 J (about 278
/// GWh) an `f64` no longer resolves a joule, so differences would be noise.
pub const MAX_JOULES: f64 = 1e15;
/// Longest output looked at, in bytes.
pub const MAX_OUTPUT: usize = 4096;

/// What a bare number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    /// Power now, integrated over time between readings.
    #[default]
    Watts,
    /// A cumulative energy counter: the energy is the difference between readings.
    Joules,
}

impl Unit {
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Watts => "watts",
            Unit::Joules => "joules",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Unit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "watts" | "w" | "W" => Ok(Unit::Watts),
            "joules" | "j" | "J" => Ok(Unit::Joules),
            other => Err(format!("{other:?}: expected watts or joules")),
        }
    }
}

/// One reading of a meter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Watts(f64),
    Joules(f64),
}

impl Value {
    pub fn unit(self) -> Unit {
        match self {
            Value::Watts(_) => Unit::Watts,
            Value::Joules(_) => Unit::Joules,
        }
    }
}

/// Why a meter's output was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValueError {
    #[error("empty output")]
    Empty,
    #[error("output longer than {MAX_OUTPUT} bytes")]
    TooLong,
    #[error(
        "{0:?} is not a number with an optional unit (W, kW, J, kJ, Wh...) nor {{\"watts\": N}} / {{\"joules\": N}}"
    )]
    Garbage(String),
    #[error("{0:?}: unknown unit (expected W, kW, mW, J, kJ, Wh, kWh, watts or joules)")]
    UnknownUnit(String),
    #[error("{0} is not a finite number")]
    NotFinite(String),
    #[error("negative value {0}")]
    Negative(f64),
    #[error("{0} W is above the {MAX_WATTS} W a meter may report")]
    TooMuchPower(f64),
    #[error("{0} J is above {MAX_JOULES} J, where a counter no longer resolves a joule")]
    TooMuchEnergy(f64),
}

/// A unit suffix: the unit and the factor to watts or joules.
fn suffix(text: &str) -> Option<(Unit, f64)> {
    Some(match text {
        "W" | "w" => (Unit::Watts, 1.0),
        "mW" => (Unit::Watts, 1e-3),
        "kW" => (Unit::Watts, 1e3),
        "J" | "j" => (Unit::Joules, 1.0),
        "mJ" => (Unit::Joules, 1e-3),
        "kJ" => (Unit::Joules, 1e3),
        "Wh" => (Unit::Joules, 3600.0),
        "kWh" => (Unit::Joules, 3.6e6),
        w if w.eq_ignore_ascii_case("watts") || w.eq_ignore_ascii_case("watt") => (Unit::Watts, 1.0),
        w if w.eq_ignore_ascii_case("joules") || w.eq_ignore_ascii_case("joule") => (Unit::Joules, 1.0),
        _ => return None,
    })
}

/// Reads a meter's output; `unit` is what a bare number means.
pub fn parse_value(output: &str, unit: Unit) -> Result<Value, ValueError> {
    if output.len() > MAX_OUTPUT {
        return Err(ValueError::TooLong);
    }
    let text = output.trim();
    if text.is_empty() {
        return Err(ValueError::Empty);
    }
    let lower = text.to_ascii_lowercase();
    let unsigned = lower.trim_start_matches(['+', '-']);
    if unsigned.starts_with("nan") || unsigned.starts_with("inf") {
        return Err(ValueError::NotFinite(excerpt(text)));
    }
    let (number, unit, factor) = if text.starts_with('{') {
        json_value(text)?
    } else {
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'e' | 'E')))
            .unwrap_or(text.len());
        let (num, rest) = text.split_at(split);
        let number = num.parse::<f64>().map_err(|_| ValueError::Garbage(excerpt(text)))?;
        let rest = rest.trim_start();
        let (unit, factor) = if rest.is_empty() {
            (unit, 1.0)
        } else if rest.chars().all(|c| c.is_ascii_alphabetic()) {
            suffix(rest).ok_or_else(|| ValueError::UnknownUnit(rest.to_string()))?
        } else {
            return Err(ValueError::Garbage(excerpt(text)));
        };
        (number, unit, factor)
    };
    checked(number * factor, unit, text)
}

/// `{"watts": N}` or `{"joules": N}`.
fn json_value(text: &str) -> Result<(f64, Unit, f64), ValueError> {
    let garbage = || ValueError::Garbage(excerpt(text));
    let json: serde_json::Value = serde_json::from_str(text).map_err(|_| garbage())?;
    let object = json.as_object().ok_or_else(garbage)?;
    let found: Vec<(Unit, &serde_json::Value)> = [("watts", Unit::Watts), ("joules", Unit::Joules)]
        .into_iter()
        .filter_map(|(key, unit)| object.get(key).map(|v| (unit, v)))
        .collect();
    match found[..] {
        [(unit, v)] => v.as_f64().map(|n| (n, unit, 1.0)).ok_or_else(garbage),
        _ => Err(garbage()),
    }
}

fn checked(value: f64, unit: Unit, text: &str) -> Result<Value, ValueError> {
    if !value.is_finite() {
        return Err(ValueError::NotFinite(excerpt(text)));
    }
    if value < 0.0 {
        return Err(ValueError::Negative(value));
    }
    match unit {
        Unit::Watts if value > MAX_WATTS => Err(ValueError::TooMuchPower(value)),
        Unit::Joules if value > MAX_JOULES => Err(ValueError::TooMuchEnergy(value)),
        Unit::Watts => Ok(Value::Watts(value)),
        Unit::Joules => Ok(Value::Joules(value)),
    }
}

/// The start of `text`, for messages.
fn excerpt(text: &str) -> String {
    const MAX: usize = 60;
    match text.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(text: &str) -> Result<Value, ValueError> {
        parse_value(text, Unit::Watts)
    }

    #[test]
    fn plain_numbers_take_the_configured_unit() {
        assert_eq!(w("12.5"), Ok(Value::Watts(12.5)));
        assert_eq!(w("  42\n"), Ok(Value::Watts(42.0)));
        assert_eq!(w("0"), Ok(Value::Watts(0.0)));
        assert_eq!(w("1e3"), Ok(Value::Watts(1000.0)));
        assert_eq!(parse_value("3600\n", Unit::Joules), Ok(Value::Joules(3600.0)));
    }

    #[test]
    fn a_unit_suffix_wins_over_the_configured_unit() {
        assert_eq!(w("12.5 W"), Ok(Value::Watts(12.5)));
        assert_eq!(w("12.5W"), Ok(Value::Watts(12.5)));
        assert_eq!(w("1.2 kW"), Ok(Value::Watts(1200.0)));
        assert_eq!(w("250 mW"), Ok(Value::Watts(0.25)));
        assert_eq!(w("7 watts"), Ok(Value::Watts(7.0)));
        assert_eq!(w("3600 J"), Ok(Value::Joules(3600.0)));
        assert_eq!(w("4.5 kJ"), Ok(Value::Joules(4500.0)));
        assert_eq!(w("1.5 Wh"), Ok(Value::Joules(5400.0)));
        assert_eq!(w("0.25 kWh\n"), Ok(Value::Joules(900_000.0)));
        assert_eq!(parse_value("5 W", Unit::Joules), Ok(Value::Watts(5.0)));
    }

    #[test]
    fn the_small_json_form() {
        assert_eq!(w(r#"{"watts": 12.5}"#), Ok(Value::Watts(12.5)));
        assert_eq!(w("{\"joules\": 1234, \"meter\": \"pdu-3\"}\n"), Ok(Value::Joules(1234.0)));
        for bad in [r#"{"watts": "12"}"#, r#"{"watts": 1, "joules": 2}"#, r#"{"power": 3}"#, "[12]", "{"] {
            assert!(matches!(w(bad), Err(ValueError::Garbage(_))), "{bad}: {:?}", w(bad));
        }
        assert!(matches!(w(r#"{"watts": -3}"#), Err(ValueError::Negative(_))));
    }

    #[test]
    fn empty_and_garbage_are_refused() {
        assert_eq!(w(""), Err(ValueError::Empty));
        assert_eq!(w(" \n\t"), Err(ValueError::Empty));
        for bad in ["abc", "twelve W", "12,5", "12.5.1", "-", ".", "W", "e5", "1e", "0x10"] {
            assert!(w(bad).is_err(), "{bad}: {:?}", w(bad));
        }
        assert!(matches!(w("12 MW"), Err(ValueError::UnknownUnit(_))), "no megawatts read as milliwatts");
        assert!(matches!(w("12 V"), Err(ValueError::UnknownUnit(_))));
    }

    #[test]
    fn trailing_text_and_second_lines_are_refused() {
        for bad in ["12.5 W (stale)", "12.5 W\n13 W", "Power: 12.5 W", "12.5 W;", "12.5 # watts", "12 W 3"] {
            assert!(matches!(w(bad), Err(ValueError::Garbage(_))), "{bad}: {:?}", w(bad));
        }
    }

    #[test]
    fn nan_infinity_negative_and_huge_are_refused() {
        for bad in ["NaN", "nan W", "inf", "-inf", "infinity", "1e400"] {
            assert!(w(bad).is_err(), "{bad}: {:?}", w(bad));
        }
        assert!(matches!(w("NaN"), Err(ValueError::NotFinite(_))));
        assert!(matches!(w("1e400"), Err(ValueError::NotFinite(_))));
        assert_eq!(w("-3"), Err(ValueError::Negative(-3.0)));
        assert_eq!(w("-0.5 J"), Err(ValueError::Negative(-0.5)));
        assert_eq!(w("2e6 W"), Err(ValueError::TooMuchPower(2e6)));
        assert_eq!(w("1000 kW"), Ok(Value::Watts(1e6)), "the bound itself is accepted");
        assert_eq!(parse_value("2e15", Unit::Joules), Err(ValueError::TooMuchEnergy(2e15)));
        assert_eq!(w("1e15 J"), Ok(Value::Joules(1e15)));
        assert_eq!(w(&"9".repeat(MAX_OUTPUT + 1)), Err(ValueError::TooLong));
    }

    #[test]
    fn units_from_the_command_line() {
        assert_eq!("watts".parse::<Unit>(), Ok(Unit::Watts));
        assert_eq!("joules".parse::<Unit>(), Ok(Unit::Joules));
        assert!("kwh".parse::<Unit>().is_err());
    }
}
