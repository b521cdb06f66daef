//! Why a trial failed, in one line a user can act on: how the workload
//! ended (its exit status, the signal that killed it, the timeout) and the
//! last line it wrote (a Python traceback ends with the exception), e.g.
//! ``exit 1, `ModuleNotFoundError: No module named 'torch'` ``. The store
//! keeps this line as the failed trial's reason; the summary, `best`,
//! `status` and the report group trials by it.
//!
//! Also here: what a successful trial without the objective is missing
//! (the metric expected, the metrics it did report).

use std::collections::BTreeSet;

use tunefleet_common::measurement::ExitOutcome;

/// Most characters of the workload's last line kept in a cause.
pub const MAX_LINE_CHARS: usize = 160;

/// The name of a signal, for the common ones.
fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        _ => return None,
    })
}

/// How the workload ended, in words: "exit 1", "killed by SIGKILL (signal
/// 9)", "timed out", "cancelled", "could not start: …".
pub fn ending(exit: &ExitOutcome) -> String {
    match exit {
        ExitOutcome::Exited(code) => format!("exit {code}"),
        ExitOutcome::Signaled(sig) => match signal_name(*sig) {
            Some(name) => format!("killed by {name} (signal {sig})"),
            None => format!("killed by signal {sig}"),
        },
        ExitOutcome::TimedOut => "timed out".to_string(),
        ExitOutcome::Cancelled => "cancelled".to_string(),
        ExitOutcome::SpawnFailed(why) => format!("could not start: {}", clean(why)),
    }
}

/// `text` on one line: control characters dropped, whitespace runs made
/// one space, at most [`MAX_LINE_CHARS`] characters (an ellipsis marks a cut).
fn clean(text: &str) -> String {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c.is_control() || tunefleet_common::is_invisible_format(c))
        .filter(|w| !w.is_empty())
        .collect();
    let one = words.join(" ");
    if one.chars().count() <= MAX_LINE_CHARS {
        return one;
    }
    let mut cut: String = one.chars().take(MAX_LINE_CHARS).collect();
    cut.push('…');
    cut
}

/// Words that mark a line as the one saying what went wrong: a Python
/// exception (`ModuleNotFoundError: …`), a Rust panic, a C++ `terminate
/// called …`, a shell's `not found`.
const TELLING: [&str; 8] =
    ["error", "exception", "panicked", "fatal", "terminate called", "not found", "denied", "killed"];

/// The line of `log_tail` that best says why the workload failed, cleaned:
/// the last one with a word of [`TELLING`] in it, else the last line with
/// something in it; `None` when the workload wrote nothing. The last line
/// alone is not enough: a workload's standard output is often buffered and
/// flushed at exit, after the error it wrote on standard error. Notes the
/// agent adds (`[tunefleet: …]`) are skipped: they say what the agent did.
pub fn last_line(log_tail: &str) -> Option<String> {
    let lines: Vec<String> =
        log_tail.lines().map(clean).filter(|l| !l.is_empty() && !l.starts_with("[tunefleet:")).collect();
    let telling = |l: &&String| {
        let lower = l.to_lowercase();
        TELLING.iter().any(|w| lower.contains(w))
    };
    lines.iter().rev().find(telling).or(lines.last()).cloned()
}

/// Why a trial failed: how it ended and, when it wrote anything, its last
/// line in backquotes: ``exit 1, `ModuleNotFoundError: No module named 'torch'` ``.
pub fn cause(exit: &ExitOutcome, log_tail: &str) -> String {
    let ending = ending(exit);
    match last_line(log_tail) {
        Some(line) if !matches!(exit, ExitOutcome::SpawnFailed(_)) => format!("{ending}, `{}`", line.replace('`', "'")),
        _ => ending,
    }
}

/// Failed trials grouped by cause, most frequent first (then by cause), as
/// `(cause, trials)`; `None` causes (failed without a result, e.g. every
/// attempt lost) are counted as "no result".
pub fn group(causes: impl IntoIterator<Item = (Option<String>, u64)>) -> Vec<(String, u64)> {
    let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for (cause, n) in causes {
        *by.entry(cause.unwrap_or_else(|| "no result".to_string())).or_default() += n;
    }
    let mut out: Vec<(String, u64)> = by.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// One line for `failed` trials grouped as `groups`: "3 failed: exit 1,
/// `ModuleNotFoundError: …`", several causes separated by "; " with their
/// counts, at most `shown` of them (then "and N more causes").
pub fn summary(failed: u64, groups: &[(String, u64)], shown: usize) -> String {
    let plural = if failed == 1 { "trial" } else { "trials" };
    if groups.is_empty() {
        return format!("{failed} {plural} failed");
    }
    let parts: Vec<String> = if groups.len() == 1 {
        vec![groups[0].0.clone()]
    } else {
        groups.iter().take(shown).map(|(c, n)| format!("{n} × {c}")).collect()
    };
    let more = groups.len().saturating_sub(shown);
    let more = if groups.len() > 1 && more > 0 { format!("; and {more} more causes") } else { String::new() };
    format!("{failed} {plural} failed: {}{more}", parts.join("; "))
}

/// What successful trials without the objective lacked: the metric
/// expected and the metrics they did report (sorted, at most 12 named).
pub fn missing_objective(metric: &str, seen: &BTreeSet<String>) -> String {
    if seen.is_empty() {
        return format!(
            "the objective `{metric}` was expected, and they reported no metric at all (print a line such as \
             {{\"event\":\"final\",\"{metric}\":0.9}} or `TUNEFLEET final {metric}=0.9`)"
        );
    }
    let named: Vec<&str> = seen.iter().take(12).map(String::as_str).collect();
    let more = if seen.len() > 12 { format!(" and {} more", seen.len() - 12) } else { String::new() };
    format!("the objective `{metric}` was expected; they reported {}{more}", named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceback_is_told_by_its_last_line() {
        let tail = "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\n    import torch\n\
                    ModuleNotFoundError: No module named 'torch'\n";
        assert_eq!(cause(&ExitOutcome::Exited(1), tail), "exit 1, `ModuleNotFoundError: No module named 'torch'`");
        assert_eq!(cause(&ExitOutcome::Exited(2), ""), "exit 2");
        assert_eq!(cause(&ExitOutcome::Signaled(9), "x\n\n  \n"), "killed by SIGKILL (signal 9), `x`");
        assert_eq!(cause(&ExitOutcome::Signaled(64), ""), "killed by signal 64");
        assert_eq!(
            cause(&ExitOutcome::SpawnFailed("No such\nfile".into()), "ignored"),
            "could not start: No such file"
        );
    }

    #[test]
    fn the_error_line_wins_over_output_flushed_after_it() {
        // Python's stdout, buffered when piped, arrives after its traceback.
        let tail = "Traceback (most recent call last):\nValueError: bad lr\nloading 2\nepoch 1\n";
        assert_eq!(last_line(tail).as_deref(), Some("ValueError: bad lr"));
        let rust = "thread 'main' panicked at src/main.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(last_line(rust).as_deref(), Some("thread 'main' panicked at src/main.rs:3:5:"));
        assert_eq!(last_line("a\nb\n").as_deref(), Some("b"));
        // A bidirectional override survived into logs, summary, status and report.
        assert_eq!(last_line("error: evil\u{202E}txt.exe\n").as_deref(), Some("error: evil txt.exe"));
    }

    #[test]
    fn the_agents_own_lines_and_control_characters_are_not_the_cause() {
        let tail = "boom\x1b[31m!\n[tunefleet: 3 epoch lines beyond the first 10000 not kept]\n";
        assert_eq!(last_line(tail).as_deref(), Some("boom [31m!"));
        let long = "y".repeat(500);
        let line = last_line(&long).expect("a line");
        assert_eq!(line.chars().count(), MAX_LINE_CHARS + 1);
        assert!(line.ends_with('…'));
        assert_eq!(cause(&ExitOutcome::Exited(1), "a `b` c"), "exit 1, `a 'b' c`");
    }

    #[test]
    fn failures_are_grouped_most_frequent_first() {
        let g = group([(Some("exit 1, `a`".to_string()), 1), (Some("exit 2".to_string()), 2), (None, 1)]);
        assert_eq!(g, vec![("exit 2".to_string(), 2), ("exit 1, `a`".to_string(), 1), ("no result".to_string(), 1)]);
        assert_eq!(summary(3, &g[..1], 3), "3 trials failed: exit 2");
        assert_eq!(summary(4, &g, 2), "4 trials failed: 2 × exit 2; 1 × exit 1, `a`; and 1 more causes");
        assert_eq!(summary(1, &[], 3), "1 trial failed");
    }

    #[test]
    fn a_missing_objective_names_what_was_expected_and_seen() {
        let seen: BTreeSet<String> = ["acc".to_string()].into();
        assert_eq!(missing_objective("score", &seen), "the objective `score` was expected; they reported acc");
        assert!(missing_objective("score", &BTreeSet::new()).contains("no metric at all"));
    }
}
