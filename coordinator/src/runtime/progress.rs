//! The progress display: per study, trials finished of total, running,
//! live agents, the best result so far, the pace and the time left.
//!
//! On a terminal, one bar per study on stderr (indicatif). Elsewhere (CI,
//! systemd's journal) plain lines on stderr instead: one per study when it
//! starts, then at most one every [`PLAIN_EVERY`] while something changed.
//! The pace is trials finished per minute since the study started in this
//! process; the time left is what remains at that pace.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a plain progress line may be printed per study.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// The bars on screen, if any: log lines are printed above them
/// ([`LogWriter`]) instead of between two redraws.
static BARS: std::sync::Mutex<Option<MultiProgress>> = std::sync::Mutex::new(None);

fn bars() -> Option<MultiProgress> {
    BARS.lock().map_or(None, |b| b.clone())
}

/// Where log lines go: stderr, with the progress bars (when drawn)
/// cleared first and redrawn after, so a log line never leaves a stale
/// copy of a bar on screen. For `tracing_subscriber`'s `with_writer`.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match bars() {
            Some(multi) => multi.suspend(|| std::io::stderr().write_all(buf)).map(|()| buf.len()),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

#[derive(Debug)]
struct Shown {
    bar: Option<ProgressBar>,
    total: u64,
    /// Finished when this process started it, and when.
    done_at_start: u64,
    started: Instant,
    last_line: Option<(Instant, String)>,
}

/// What one update says about a study.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update<'a> {
    pub finished: u64,
    pub running: u64,
    /// Every trial the study will ever have, once no more will come (its
    /// search is exhausted, or it was cancelled): the bar's length then, with
    /// no time left shown once they are all finished.
    pub closed_at: Option<u64>,
    pub live_agents: usize,
    /// `(metric, value, trial)`.
    pub best: Option<(&'a str, f64, u64)>,
}

/// The progress display: bars, plain lines, or nothing when disabled.
#[derive(Debug, Default)]
pub struct ProgressDisplay {
    enabled: bool,
    terminal: bool,
    multi: Option<MultiProgress>,
    studies: BTreeMap<String, Shown>,
}

/// `(trials per minute, seconds left)` for `finished` of `total`, of which
/// `done_at_start` were finished `elapsed` ago.
pub fn pace(total: u64, finished: u64, done_at_start: u64, elapsed: Duration) -> (Option<f64>, Option<f64>) {
    let secs = elapsed.as_secs_f64();
    let new = finished.saturating_sub(done_at_start);
    if secs < 1.0 || new == 0 {
        return (None, None);
    }
    let per_minute = new as f64 / secs * 60.0;
    let left = total.saturating_sub(finished);
    (Some(per_minute), Some(left as f64 / per_minute * 60.0))
}

/// The message after the counts: running, agents, best, pace, time left.
pub fn message(u: &Update<'_>, per_minute: Option<f64>, eta_s: Option<f64>) -> String {
    let best = u.best.map(|(m, v, t)| format!(" | best {m}={v:.4} (trial {t})")).unwrap_or_default();
    let pace = match (per_minute, eta_s) {
        (Some(p), Some(e)) if e > 0.0 => format!(" | {p:.1}/min, ~{}", human(e)),
        (Some(p), _) => format!(" | {p:.1}/min"),
        _ => String::new(),
    };
    format!("| {} running | {} agents{best}{pace}", u.running, u.live_agents)
}

/// `42s`, `3m10s`, `2h05m`.
fn human(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=59 => format!("{s}s left"),
        60..=3599 => format!("{}m{:02}s left", s / 60, s % 60),
        _ => format!("{}h{:02}m left", s / 3600, (s % 3600) / 60),
    }
}

impl ProgressDisplay {
    pub fn new(enabled: bool) -> Self {
        let terminal = std::io::stderr().is_terminal();
        ProgressDisplay { enabled, terminal, multi: None, studies: BTreeMap::new() }
    }

    /// Starts showing `study` of `total` trials of which `done` are finished.
    pub fn start(&mut self, study: &str, total: u64, done: u64) {
        if !self.enabled {
            return;
        }
        let bar = self.terminal.then(|| {
            let multi = self.multi.get_or_insert_with(|| {
                let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(4));
                if let Ok(mut shown) = BARS.lock() {
                    *shown = Some(multi.clone());
                }
                multi
            });
            let bar = multi.add(ProgressBar::new(total));
            if let Ok(style) =
                ProgressStyle::with_template("{prefix} [{bar:30.cyan/blue}] {pos}/{len} trials {elapsed} {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(study.to_string());
            bar.set_position(done);
            bar.enable_steady_tick(Duration::from_millis(250));
            bar
        });
        if !self.terminal {
            eprintln!("progress: {study}: {done}/{total} trials finished");
        }
        self.studies.insert(
            study.to_string(),
            Shown { bar, total, done_at_start: done, started: Instant::now(), last_line: None },
        );
    }

    /// The latest counts of `study`.
    pub fn update(&mut self, study: &str, u: Update<'_>) {
        let Some(s) = self.studies.get_mut(study) else { return };
        // A search may plan more trials than first said, or fewer (a
        // cancelled study has only those it made).
        s.total = match u.closed_at {
            Some(all) => all,
            None => s.total.max(u.finished + u.running),
        };
        let (per_minute, eta) = pace(s.total, u.finished, s.done_at_start, s.started.elapsed());
        let eta = eta.filter(|_| u.finished < s.total);
        let msg = message(&u, per_minute, eta);
        match &s.bar {
            Some(bar) => {
                bar.set_length(s.total);
                bar.set_position(u.finished);
                bar.set_message(msg);
            }
            None => {
                let line = format!("progress: {study}: {}/{} trials finished {msg}", u.finished, s.total);
                let due = s.last_line.as_ref().is_none_or(|(at, last)| at.elapsed() >= PLAIN_EVERY && *last != line);
                if due {
                    eprintln!("{line}");
                    s.last_line = Some((Instant::now(), line));
                }
            }
        }
    }

    /// A line for the log of the run (a campaign's workload finished):
    /// above the bars on a terminal, a plain line on stdout otherwise (scripts read it).
    pub fn note(&self, line: &str) {
        match &self.multi {
            Some(m) => {
                let _ = m.println(line);
            }
            None => println!("{line}"),
        }
    }

    /// Leaves each bar where its study stands (an interrupted study's bar
    /// stays at the trials it finished, never jumps to full).
    pub fn finish(&mut self) {
        for s in self.studies.values() {
            if let Some(bar) = &s.bar {
                bar.abandon();
            }
        }
        self.studies.clear();
        if let Ok(mut shown) = BARS.lock() {
            *shown = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pace_and_time_left() {
        assert_eq!(pace(100, 10, 0, Duration::from_millis(500)), (None, None), "too early to tell");
        assert_eq!(pace(100, 5, 5, Duration::from_secs(60)), (None, None), "nothing finished here yet");
        let (p, eta) = pace(100, 30, 10, Duration::from_secs(60));
        assert_eq!(p, Some(20.0));
        assert_eq!(eta, Some(210.0), "70 left at 20 a minute");
        let u = Update { finished: 30, running: 2, closed_at: None, live_agents: 3, best: Some(("loss", 0.25, 7)) };
        assert_eq!(message(&u, p, eta), "| 2 running | 3 agents | best loss=0.2500 (trial 7) | 20.0/min, ~3m30s left");
        assert_eq!(message(&u, None, None), "| 2 running | 3 agents | best loss=0.2500 (trial 7)");
        assert_eq!(human(7_500.0), "2h05m left");
    }

    #[test]
    fn a_disabled_display_shows_nothing_and_takes_any_update() {
        let mut p = ProgressDisplay::new(false);
        p.start("s", 10, 0);
        p.update("s", Update { finished: 1, running: 0, closed_at: None, live_agents: 0, best: None });
        assert!(p.studies.is_empty());
        p.finish();
    }
}
