//! What differs between two study files, value by value: what the store
//! says when a changed file is refused, and records when one continues a
//! study (`timeout: 60 -> 120`, `hyper.lr.high: 0.3 -> 0.5`).

use toml::{Table, Value};

use super::Study;

/// Keys a study may change and go on from where it stopped: they decide how
/// trials are run and given out, not what a trial computes or which
/// configurations are searched. (`[budget]` too, when it only grows.)
/// (`[[enqueue]]`: configurations to try first; those already tried are not
/// tried again.)
pub const CONTINUES: [&str; 5] = ["timeout", "max_attempts", "lookahead", "[selector]", "[[enqueue]]"];

/// Whether `old` may go on under `newer`'s file: every key that differs
/// ([`Study::differences`]) is one of [`CONTINUES`], or a larger budget.
pub fn continues(old: &Study, newer: &Study) -> bool {
    old.differences(newer)
        .iter()
        .all(|key| CONTINUES.contains(key) || (*key == "[budget]" && newer.budget > old.budget))
}

/// At most this many differences are listed; the rest are counted.
const SHOWN: usize = 12;

/// The values that differ between the files `old_text` and `new_text`
/// under the top-level keys `keys` (as [`Study::differences`] names them:
/// `timeout`, `[hyper]`, `[[group]]`...), one `path: old -> new` each, in
/// order; a key with no value that differs (a default written out) is
/// named alone. Texts that do not parse as TOML give the keys alone.
pub fn value_differences(old_text: &str, new_text: &str, keys: &[&str]) -> Vec<String> {
    let (Ok(old), Ok(new)) = (old_text.parse::<Table>(), new_text.parse::<Table>()) else {
        return keys.iter().map(|k| (*k).to_string()).collect();
    };
    let mut out = Vec::new();
    for key in keys {
        let top = key.trim_start_matches('[').trim_end_matches(']');
        let before = out.len();
        walk(top, old.get(top), new.get(top), &mut out);
        if out.len() == before {
            out.push(format!("{key} (the same values, written differently)"));
        }
    }
    if out.len() > SHOWN {
        let more = out.len() - SHOWN;
        out.truncate(SHOWN);
        out.push(format!("and {more} more"));
    }
    out
}

fn walk(path: &str, old: Option<&Value>, new: Option<&Value>, out: &mut Vec<String>) {
    match (old, new) {
        (Some(Value::Table(a)), Some(Value::Table(b))) => {
            let mut keys: Vec<&String> = a.keys().collect();
            keys.extend(b.keys().filter(|k| !a.contains_key(*k)));
            for k in keys {
                walk(&format!("{path}.{k}"), a.get(k), b.get(k), out);
            }
        }
        (a, b) if a != b => out.push(format!("{path}: {} -> {}", shown(a), shown(b))),
        _ => {}
    }
}

fn shown(v: Option<&Value>) -> String {
    let Some(v) = v else { return "(not set)".to_string() };
    let text = v.to_string();
    match text.chars().count() {
        0..=80 => text,
        _ => format!("{}...", text.chars().take(77).collect::<String>()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = r#"name = "s"
command = ["python3", "train.py", "{lr}"]
timeout = 60
[objective]
metric = "loss"
direction = "minimize"
[budget]
trials = 10
[strategy]
kind = "random"
[hyper.lr]
kind = "float"
low = 0.1
high = 0.3
"#;

    #[test]
    fn each_value_that_differs_is_named_with_both_values() {
        let new = OLD.replace("train.py", "train2.py").replace("high = 0.3", "high = 0.5\nlog = true");
        let got = value_differences(OLD, &new, &["command", "[hyper]"]);
        assert_eq!(
            got,
            vec![
                r#"command: ["python3", "train.py", "{lr}"] -> ["python3", "train2.py", "{lr}"]"#.to_string(),
                "hyper.lr.high: 0.3 -> 0.5".to_string(),
                "hyper.lr.log: (not set) -> true".to_string(),
            ]
        );
    }

    #[test]
    fn a_default_written_out_is_named_alone() {
        let new = OLD.replace("timeout = 60\n", "timeout = 60\nrepeats = 1\n");
        assert_eq!(value_differences(OLD, &new, &["repeats"]), vec!["repeats: (not set) -> 1".to_string()]);
        assert_eq!(
            value_differences(OLD, OLD, &["[strategy]"]),
            vec!["[strategy] (the same values, written differently)".to_string()]
        );
    }

    #[test]
    fn a_longer_timeout_or_a_larger_budget_continues_a_command_change_does_not() {
        let parse = |text: &str| super::super::parse(text, "s.toml").expect("study");
        let old = parse(OLD);
        assert!(continues(&old, &parse(&OLD.replace("timeout = 60", "timeout = 120"))));
        assert!(continues(&old, &parse(&OLD.replace("trials = 10", "trials = 20"))));
        assert!(!continues(&old, &parse(&OLD.replace("trials = 10", "trials = 5"))));
        assert!(!continues(&old, &parse(&OLD.replace("train.py", "train2.py"))));
    }
}
