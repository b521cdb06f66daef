//! The workload control channel: how the agent changes a workload's settings
//! between epochs (see "Control channel" in `docs/PROTOCOL.md`).
//!
//! Opt-in: only when `TUNEFLEET_CONTROL=stdin` does a workload read its
//! standard input, one line after each epoch line but the last, before the
//! next epoch starts. A line is zero or more `key=value` settings separated
//! by whitespace, applied from the next epoch on; the only key today is
//! `threads=N` (1..=[`MAX_THREADS`]). An unknown key is ignored and reported
//! once on stderr; a malformed setting is reported and ignored; an empty line
//! changes nothing; end of file (or a read error) means nobody steers any more:
//! the current settings stay and the input is never read again.
//!
//! [`parse_line`] is pure; [`Channel`] reads lines from any [`BufRead`] and
//! reports on any [`Write`], so both are tested without a process.

use std::collections::BTreeSet;
use std::io::{self, BufRead, Read, Write};

use crate::threads::MAX_THREADS;

/// The variable that turns the channel on.
pub const CONTROL_VAR: &str = "TUNEFLEET_CONTROL";

/// The one value of [`CONTROL_VAR`] understood: control lines on stdin.
pub const CONTROL_STDIN: &str = "stdin";

/// The longest control line read, in bytes without its newline; a longer
/// line is reported and ignored as a whole.
pub const MAX_LINE_BYTES: usize = 4096;

/// What an epoch runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Worker threads, 1..=[`MAX_THREADS`].
    pub threads: usize,
}

/// The settings one control line asks for; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Update {
    pub threads: Option<usize>,
}

impl Settings {
    /// These settings with `update`'s changes.
    pub fn apply(self, update: &Update) -> Settings {
        Settings { threads: update.threads.unwrap_or(self.threads) }
    }
}

/// A part of a control line that was ignored, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ignored {
    #[error("unknown key {0:?} ignored")]
    UnknownKey(String),
    #[error("{key}={value:?} ignored: {expected}")]
    BadValue { key: &'static str, value: String, expected: String },
    #[error("{0:?} ignored: not a key=value setting")]
    NotASetting(String),
}

/// One control line, understood.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    pub update: Update,
    /// What was ignored, in line order.
    pub ignored: Vec<Ignored>,
}

/// Parses one control line (with or without its line terminator). Settings
/// are separated by whitespace; when a key is given twice, the last valid
/// value wins.
pub fn parse_line(line: &str) -> Parsed {
    let mut parsed = Parsed::default();
    for word in line.split_whitespace() {
        let Some((key, value)) = word.split_once('=').filter(|(key, _)| !key.is_empty()) else {
            parsed.ignored.push(Ignored::NotASetting(word.to_string()));
            continue;
        };
        match key {
            "threads" => match parse_threads(value) {
                Some(n) => parsed.update.threads = Some(n),
                None => parsed.ignored.push(Ignored::BadValue {
                    key: "threads",
                    value: value.to_string(),
                    expected: format!("not a thread count in 1..={MAX_THREADS}"),
                }),
            },
            _ => parsed.ignored.push(Ignored::UnknownKey(key.to_string())),
        }
    }
    parsed
}

/// A decimal thread count in 1..=MAX_THREADS (digits only: no sign, no spaces).
fn parse_threads(value: &str) -> Option<usize> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok().filter(|n| (1..=MAX_THREADS).contains(n))
}

/// True when the environment, seen through `lookup`, turns the channel on:
/// [`CONTROL_VAR`] is exactly [`CONTROL_STDIN`]. Any other value, or none,
/// means no channel.
pub fn enabled(lookup: impl Fn(&str) -> Option<String>) -> bool {
    lookup(CONTROL_VAR).as_deref() == Some(CONTROL_STDIN)
}

/// Where the settings of the next epoch come from. A workload calls
/// [`Steer::between_epochs`] after it has written and flushed each epoch line
/// but the last, and runs the next epoch with the update applied.
pub trait Steer {
    fn between_epochs(&mut self) -> Update;
}

/// No channel: every epoch runs with the starting settings and nothing is read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unsteered;

impl Steer for Unsteered {
    fn between_epochs(&mut self) -> Update {
        Update::default()
    }
}

/// A closure is a steer (for tests and embedding).
impl<F: FnMut() -> Update> Steer for F {
    fn between_epochs(&mut self) -> Update {
        self()
    }
}

/// The channel over a line source: one line per [`Steer::between_epochs`]
/// until end of file, problems reported on `log` as `{program}: control: ...`.
pub struct Channel<R, W> {
    /// `None` once end of file or a read error was seen: never read again.
    input: Option<R>,
    log: W,
    program: String,
    /// Unknown keys already reported.
    reported: BTreeSet<String>,
}

impl<R: BufRead, W: Write> Channel<R, W> {
    pub fn new(input: R, log: W, program: &str) -> Self {
        Channel { input: Some(input), log, program: program.to_string(), reported: BTreeSet::new() }
    }

    /// False once the input ended: the settings will not change any more.
    pub fn is_open(&self) -> bool {
        self.input.is_some()
    }

    /// Reporting is best effort: a workload whose stderr is gone keeps running.
    fn report(&mut self, what: impl std::fmt::Display) {
        let _ = writeln!(self.log, "{}: control: {what}", self.program);
    }

    fn close(&mut self, why: impl std::fmt::Display) {
        self.input = None;
        self.report(format_args!("{why}; keeping the current settings until the end"));
    }

    /// The next line (lossily decoded, without its newline), or `None` when
    /// the input is closed or ends now. A last line without a newline counts,
    /// and closes the input. A line over [`MAX_LINE_BYTES`] reads as empty.
    fn next_line(&mut self) -> Option<String> {
        let input = self.input.as_mut()?;
        let mut buf = Vec::new();
        let read = Read::take(&mut *input, MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut buf);
        match read {
            Ok(0) => {
                self.close("end of input");
                None
            }
            Ok(_) if buf.last() == Some(&b'\n') => Some(String::from_utf8_lossy(&buf).into_owned()),
            Ok(_) if buf.len() > MAX_LINE_BYTES => {
                let skipped = input.skip_until(b'\n');
                self.report(format_args!("a line longer than {MAX_LINE_BYTES} bytes ignored"));
                if let Err(e) = skipped {
                    self.close(format_args!("cannot read: {e}"));
                }
                Some(String::new())
            }
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf).into_owned();
                self.close("end of input");
                Some(line)
            }
            Err(e) => {
                self.close(format_args!("cannot read: {e}"));
                None
            }
        }
    }
}

impl<R: BufRead, W: Write> Steer for Channel<R, W> {
    fn between_epochs(&mut self) -> Update {
        let Some(line) = self.next_line() else { return Update::default() };
        let parsed = parse_line(&line);
        for problem in &parsed.ignored {
            if let Ignored::UnknownKey(key) = problem {
                if !self.reported.insert(key.clone()) {
                    continue;
                }
            }
            self.report(problem);
        }
        parsed.update
    }
}

/// The steer of a workload binary: a [`Channel`] on stdin (reports on stderr)
/// when [`enabled`] by the process environment, else [`Unsteered`].
pub fn from_env(program: &str) -> Box<dyn Steer> {
    if enabled(|var| std::env::var(var).ok()) {
        Box::new(Channel::new(io::stdin().lock(), io::stderr(), program))
    } else {
        Box::new(Unsteered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::io::{BufReader, Cursor};

    fn threads(n: usize) -> Update {
        Update { threads: Some(n) }
    }

    #[test]
    fn settings_are_parsed_and_the_last_one_wins() {
        assert_eq!(parse_line("threads=4\n"), Parsed { update: threads(4), ignored: vec![] });
        assert_eq!(parse_line("  threads=2 \t threads=3\r\n").update, threads(3));
        assert_eq!(parse_line(&format!("threads={MAX_THREADS}")).update, threads(MAX_THREADS));
        assert_eq!(Settings { threads: 1 }.apply(&threads(5)), Settings { threads: 5 });
    }

    #[test]
    fn an_empty_line_changes_nothing() {
        for line in ["", "\n", "   \r\n"] {
            assert_eq!(parse_line(line), Parsed::default(), "{line:?}");
        }
        assert_eq!(Settings { threads: 3 }.apply(&Update::default()), Settings { threads: 3 });
    }

    #[test]
    fn unknown_keys_are_ignored_and_named() {
        let parsed = parse_line("colour=blue threads=2 future=");
        assert_eq!(parsed.update, threads(2));
        assert_eq!(parsed.ignored, [Ignored::UnknownKey("colour".into()), Ignored::UnknownKey("future".into())]);
    }

    #[test]
    fn bad_values_and_words_are_ignored_and_keep_the_valid_setting() {
        for bad in ["0", "-1", "+2", "1025", "2.5", "", "two", "99999999999999999999999"] {
            let parsed = parse_line(&format!("threads=3 threads={bad}"));
            assert_eq!(parsed.update, threads(3), "{bad:?}");
            assert!(matches!(&parsed.ignored[..], [Ignored::BadValue { key: "threads", value, .. }] if value == bad));
        }
        let parsed = parse_line("threads =2 =3");
        assert_eq!(parsed.update, Update::default());
        assert_eq!(
            parsed.ignored,
            [
                Ignored::NotASetting("threads".into()),
                Ignored::NotASetting("=2".into()),
                Ignored::NotASetting("=3".into())
            ]
        );
        let message = parse_line("threads=0").ignored[0].to_string();
        assert!(message.contains("threads=\"0\"") && message.contains("1..=1024"), "{message}");
    }

    #[test]
    fn only_the_exact_value_stdin_turns_the_channel_on() {
        let with = |value: &'static str| move |var: &str| (var == CONTROL_VAR).then(|| value.to_string());
        assert!(enabled(with("stdin")));
        for other in ["", "STDIN", " stdin", "fd:3", "1"] {
            assert!(!enabled(with(other)), "{other:?}");
        }
        assert!(!enabled(|_| None));
    }

    /// A reader that hands out its chunks one per read, then end of file,
    /// and fails the test when read again after that.
    struct Script {
        chunks: VecDeque<io::Result<Vec<u8>>>,
    }

    impl Read for Script {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.chunks.pop_front() {
                Some(Ok(chunk)) => {
                    assert!(chunk.len() <= buf.len(), "chunk larger than the read buffer");
                    buf[..chunk.len()].copy_from_slice(&chunk);
                    Ok(chunk.len())
                }
                Some(Err(e)) => Err(e),
                None => {
                    // End of file is handed out once: an empty marker follows it.
                    self.chunks.push_back(Err(io::Error::other("read again after end of file")));
                    Ok(0)
                }
            }
        }
    }

    fn channel(chunks: Vec<io::Result<Vec<u8>>>) -> Channel<BufReader<Script>, Vec<u8>> {
        Channel::new(BufReader::new(Script { chunks: chunks.into() }), Vec::new(), "test")
    }

    fn log(c: &Channel<BufReader<Script>, Vec<u8>>) -> String {
        String::from_utf8_lossy(&c.log).into_owned()
    }

    #[test]
    fn one_line_per_epoch_then_eof_keeps_the_settings_and_never_reads_again() {
        // Two lines arrive in one chunk: they are still used one per epoch.
        let mut c = channel(vec![Ok(b"threads=2\n\nthreads=3\n".to_vec()), Ok(b"threads=4\n".to_vec())]);
        assert_eq!(c.between_epochs(), threads(2));
        assert_eq!(c.between_epochs(), Update::default());
        assert_eq!(c.between_epochs(), threads(3));
        assert_eq!(c.between_epochs(), threads(4));
        assert!(c.is_open());
        assert_eq!(c.between_epochs(), Update::default());
        assert!(!c.is_open());
        // Script would hand out an error if read again; no more messages means no read.
        assert_eq!(c.between_epochs(), Update::default());
        assert_eq!(log(&c), "test: control: end of input; keeping the current settings until the end\n");
    }

    #[test]
    fn a_last_line_without_newline_counts_and_closes() {
        let mut c = channel(vec![Ok(b"threads=7".to_vec())]);
        assert_eq!(c.between_epochs(), threads(7));
        assert!(!c.is_open());
        assert_eq!(c.between_epochs(), Update::default());
    }

    #[test]
    fn unknown_keys_are_reported_once_and_bad_values_every_time() {
        let mut c = channel(vec![Ok(b"colour=red threads=x\ncolour=blue threads=x threads=2\n".to_vec())]);
        assert_eq!(c.between_epochs(), Update::default());
        assert_eq!(c.between_epochs(), threads(2));
        let log = log(&c);
        assert_eq!(log.matches("unknown key \"colour\"").count(), 1, "{log}");
        assert_eq!(log.matches("threads=\"x\" ignored").count(), 2, "{log}");
        assert!(c.is_open());
    }

    #[test]
    fn a_read_error_closes_the_channel_and_invalid_utf8_is_just_a_bad_line() {
        let mut c = channel(vec![Ok(b"threads=\xff\n".to_vec()), Err(io::Error::other("pipe broke"))]);
        assert_eq!(c.between_epochs(), Update::default());
        assert!(c.is_open());
        assert_eq!(c.between_epochs(), Update::default());
        assert!(!c.is_open());
        assert_eq!(c.between_epochs(), Update::default());
        let log = log(&c);
        assert!(log.contains("threads=\"\u{fffd}\" ignored"), "{log}");
        assert!(log.contains("cannot read: pipe broke; keeping the current settings"), "{log}");
    }

    #[test]
    fn an_overlong_line_is_ignored_as_a_whole() {
        let long = format!("threads=2 {}\nthreads=3\n", "x".repeat(MAX_LINE_BYTES));
        let mut c = Channel::new(Cursor::new(long.into_bytes()), Vec::new(), "test");
        assert_eq!(c.between_epochs(), Update::default());
        assert_eq!(c.between_epochs(), threads(3));
        let log = String::from_utf8_lossy(&c.log).into_owned();
        assert_eq!(log, format!("test: control: a line longer than {MAX_LINE_BYTES} bytes ignored\n"));
        // A line of exactly the limit is read.
        let exact = format!("threads=5 {}\n", "y".repeat(MAX_LINE_BYTES - 10));
        let mut c = Channel::new(Cursor::new(exact.into_bytes()), Vec::new(), "test");
        assert_eq!(c.between_epochs(), threads(5));
    }

    #[test]
    fn closures_and_unsteered_are_steers() {
        let mut n = 0;
        let mut counting = || {
            n += 1;
            threads(n)
        };
        assert_eq!(counting.between_epochs(), threads(1));
        assert_eq!(Unsteered.between_epochs(), Update::default());
    }
}
