//! Metric lines: how a workload reports epochs and final metrics on its
//! standard output or standard error. Every other line is log.
//!
//! Two forms are understood, one per line:
//!
//! * a JSON object with `"event": "epoch"` and an integer `"epoch"` field, or
//!   with `"event": "final"`. Every other field whose value is a JSON number
//!   is a metric; strings, booleans, arrays and objects are ignored:
//!
//!   ```text
//!   {"event":"epoch","epoch":3,"loss":0.42,"accuracy":0.91}
//!   {"event":"final","accuracy":0.93}
//!   ```
//!
//! * a plain line starting with the word `TUNEFLEET`, then either `epoch=N`
//!   or `final`, then `name=value` pairs separated by spaces:
//!
//!   ```text
//!   TUNEFLEET epoch=3 loss=0.42 accuracy=0.91
//!   TUNEFLEET final accuracy=0.93
//!   ```
//!
//! An epoch line may name where the workload saved its state after that
//! epoch: a string field `"checkpoint"` (JSON) or a word
//! `checkpoint=PATH` (plain; no spaces): a trial moved to another agent
//! resumes from it when its study has a `resume` template.
//!
//! A workload asked for steps (`TUNEFLEET_STEPS=1`, set for pipelined
//! trials whose probe windows count steps) also prints one line per
//! training step: `{"event":"step","step":N}` or `TUNEFLEET step=N`.
//!
//! Rules common to both forms: the epoch is an integer from 0 to 2^32-1;
//! a metric name is 1 to 64 characters without spaces, `=` or control
//! characters; a value that is not a finite number (`NaN`, `inf`, `abc`) is
//! dropped, the other metrics of the line are kept; at most 64 metrics are
//! kept per line. A line that does not follow a form (no `event`, an epoch
//! line without a valid `epoch`, JSON that does not parse) is a log line.
//!
//! The trial's final metrics are those of its `final` line, or else those of
//! its last epoch line.

use tunefleet_common::measurement::Metrics;

/// Longest metric name kept.
pub const MAX_METRIC_NAME: usize = 64;
/// Most metrics kept from one line.
pub const MAX_METRICS_PER_LINE: usize = 64;
/// Word that starts a plain metric line.
pub const PLAIN_PREFIX: &str = "TUNEFLEET";

/// What one line of workload output means.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricLine {
    Epoch {
        epoch: u32,
        metrics: Metrics,
        checkpoint: Option<String>,
    },
    /// A training step ended (the windows of a pipelined trial that probes
    /// within epochs); its metrics are not kept.
    Step {
        step: u64,
    },
    Final {
        metrics: Metrics,
    },
    Log,
}

/// Classifies one line of workload output (without its line terminator).
pub fn parse_metric_line(line: &str) -> MetricLine {
    let trimmed = line.trim();
    if trimmed.starts_with('{') {
        parse_json(trimmed)
    } else if let Some(rest) = trimmed.strip_prefix(PLAIN_PREFIX) {
        if rest.starts_with(char::is_whitespace) {
            parse_plain(rest)
        } else {
            MetricLine::Log
        }
    } else {
        MetricLine::Log
    }
}

/// Longest checkpoint reference kept (a path or a URL).
pub const MAX_CHECKPOINT_LEN: usize = 1024;

/// A checkpoint reference as the workload gave it, when it is usable: not
/// empty, not too long, no control characters, and not starting with `-`
/// (it is passed on a command line; the coordinator refuses it too, and a
/// result carrying it would be refused whole).
fn checkpoint(text: &str) -> Option<String> {
    (!text.is_empty()
        && text.len() <= MAX_CHECKPOINT_LEN
        && !text.starts_with('-')
        && !text.chars().any(char::is_control))
    .then(|| text.to_string())
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_METRIC_NAME
        && !name.chars().any(|c| c.is_whitespace() || c.is_control() || c == '=')
}

fn insert_metric(metrics: &mut Metrics, name: &str, value: f64) {
    if value.is_finite() && valid_name(name) && metrics.len() < MAX_METRICS_PER_LINE {
        metrics.insert(name.to_string(), value);
    }
}

fn parse_json(line: &str) -> MetricLine {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(line) else {
        return MetricLine::Log;
    };
    let event = map.get("event").and_then(serde_json::Value::as_str);
    let mut metrics = Metrics::new();
    for (name, value) in &map {
        if name == "event" || name == "epoch" {
            continue;
        }
        if let Some(v) = value.as_f64() {
            insert_metric(&mut metrics, name, v);
        }
    }
    match event {
        Some("epoch") => match map.get("epoch").and_then(serde_json::Value::as_u64).map(u32::try_from) {
            Some(Ok(epoch)) => MetricLine::Epoch {
                epoch,
                metrics,
                checkpoint: map.get("checkpoint").and_then(serde_json::Value::as_str).and_then(checkpoint),
            },
            _ => MetricLine::Log,
        },
        Some("final") => MetricLine::Final { metrics },
        Some("step") => match map.get("step").and_then(serde_json::Value::as_u64) {
            Some(step) => MetricLine::Step { step },
            None => MetricLine::Log,
        },
        _ => MetricLine::Log,
    }
}

fn parse_plain(rest: &str) -> MetricLine {
    let mut words = rest.split_whitespace();
    let kind = words.next();
    let mut metrics = Metrics::new();
    let mut pairs = |words: std::str::SplitWhitespace<'_>| {
        for word in words {
            if let Some((name, value)) = word.split_once('=') {
                if let Ok(v) = value.parse::<f64>() {
                    insert_metric(&mut metrics, name, v);
                }
            }
        }
    };
    match kind {
        Some("final") => {
            pairs(words);
            MetricLine::Final { metrics }
        }
        Some(first) => {
            if let Some(step) = first.strip_prefix("step=").and_then(|v| v.parse::<u64>().ok()) {
                return MetricLine::Step { step };
            }
            match first.strip_prefix("epoch=").map(str::parse::<u32>) {
                Some(Ok(epoch)) => {
                    let words: Vec<&str> = words.collect();
                    let saved = words.iter().find_map(|w| w.strip_prefix("checkpoint=")).and_then(checkpoint);
                    pairs(words.join(" ").split_whitespace());
                    MetricLine::Epoch { epoch, metrics, checkpoint: saved }
                }
                _ => MetricLine::Log,
            }
        }
        None => MetricLine::Log,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> Metrics {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn epoch_lines_may_name_their_checkpoint() {
        let json = parse_metric_line(r#"{"event":"epoch","epoch":2,"loss":0.5,"checkpoint":"/ckpt/epoch-2"}"#);
        assert_eq!(
            json,
            MetricLine::Epoch { epoch: 2, metrics: m(&[("loss", 0.5)]), checkpoint: Some("/ckpt/epoch-2".into()) }
        );
        let plain = parse_metric_line("TUNEFLEET epoch=3 checkpoint=s3://b/k loss=0.4");
        assert_eq!(
            plain,
            MetricLine::Epoch { epoch: 3, metrics: m(&[("loss", 0.4)]), checkpoint: Some("s3://b/k".into()) }
        );
        let bad = parse_metric_line(&format!(r#"{{"event":"epoch","epoch":1,"checkpoint":"{}"}}"#, "x".repeat(5000)));
        assert!(matches!(bad, MetricLine::Epoch { checkpoint: None, .. }), "too long: dropped, the epoch kept");
        // The coordinator refuses a leading dash; the agent drops it
        // rather than have every result of the trial refused and parked.
        let dash = parse_metric_line(r#"{"event":"epoch","epoch":1,"checkpoint":"-rf"}"#);
        assert!(matches!(dash, MetricLine::Epoch { checkpoint: None, .. }), "{dash:?}");
    }

    #[test]
    fn step_lines_in_both_forms() {
        assert_eq!(parse_metric_line(r#"{"event":"step","step":42,"loss":0.1}"#), MetricLine::Step { step: 42 });
        assert_eq!(parse_metric_line("TUNEFLEET step=7"), MetricLine::Step { step: 7 });
        assert_eq!(parse_metric_line(r#"{"event":"step","step":-1}"#), MetricLine::Log);
        assert_eq!(parse_metric_line("TUNEFLEET step=x"), MetricLine::Log);
    }

    #[test]
    fn plain_epoch_and_final() {
        assert_eq!(
            parse_metric_line("TUNEFLEET epoch=3 loss=0.42 accuracy=0.91"),
            MetricLine::Epoch { epoch: 3, metrics: m(&[("loss", 0.42), ("accuracy", 0.91)]), checkpoint: None }
        );
        assert_eq!(
            parse_metric_line("  TUNEFLEET final accuracy=0.93\r"),
            MetricLine::Final { metrics: m(&[("accuracy", 0.93)]) }
        );
        assert_eq!(parse_metric_line("TUNEFLEET final"), MetricLine::Final { metrics: Metrics::new() });
    }

    #[test]
    fn json_epoch_and_final() {
        assert_eq!(
            parse_metric_line(r#"{"event":"epoch","epoch":1,"loss":2,"note":"x","ok":true,"v":[1]}"#),
            MetricLine::Epoch { epoch: 1, metrics: m(&[("loss", 2.0)]), checkpoint: None }
        );
        assert_eq!(
            parse_metric_line(r#"{"event":"final","accuracy":0.5,"epoch":9}"#),
            MetricLine::Final { metrics: m(&[("accuracy", 0.5)]) }
        );
    }

    #[test]
    fn garbage_is_log() {
        for line in [
            "",
            "hello world",
            "TUNEFLEET",
            "TUNEFLEETepoch=1 a=1",
            "TUNEFLEET epoch=x loss=1",
            "TUNEFLEET epoch=-1 loss=1",
            "TUNEFLEET epoch=99999999999 loss=1",
            "TUNEFLEET stepx=1 loss=1",
            "tunefleet epoch=1 loss=1",
            "{not json",
            r#"{"epoch":1,"loss":1}"#,
            r#"{"event":"epoch","loss":1}"#,
            r#"{"event":"epoch","epoch":1.5,"loss":1}"#,
            r#"{"event":"epoch","epoch":"1","loss":1}"#,
            r#"{"event":"other","loss":1}"#,
            r#"[1,2,3]"#,
        ] {
            assert_eq!(parse_metric_line(line), MetricLine::Log, "{line:?}");
        }
    }

    #[test]
    fn non_finite_and_bad_pairs_are_dropped() {
        assert_eq!(
            parse_metric_line("TUNEFLEET epoch=2 loss=NaN acc=inf x=abc y= =3 noeq z=1e3"),
            MetricLine::Epoch { epoch: 2, metrics: m(&[("z", 1000.0)]), checkpoint: None }
        );
        // JSON has no NaN: such a line does not parse and is log.
        assert_eq!(parse_metric_line(r#"{"event":"final","loss":NaN}"#), MetricLine::Log);
    }

    #[test]
    fn huge_lines_stay_bounded() {
        let mut line = String::from("TUNEFLEET epoch=1");
        for i in 0..10_000 {
            line.push_str(&format!(" m{i}=1"));
        }
        line.push_str(&format!(" {}=1", "n".repeat(10_000)));
        match parse_metric_line(&line) {
            MetricLine::Epoch { epoch: 1, metrics, .. } => assert_eq!(metrics.len(), MAX_METRICS_PER_LINE),
            other => panic!("unexpected {other:?}"),
        }
        let long_name = format!("TUNEFLEET final {}=1", "n".repeat(MAX_METRIC_NAME + 1));
        assert_eq!(parse_metric_line(&long_name), MetricLine::Final { metrics: Metrics::new() });
    }
}
