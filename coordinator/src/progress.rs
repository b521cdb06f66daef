//! The progress display: trials done of total, trials running, live agents
//! and the best result so far. Drawn on stderr only when it is a terminal.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar, or nothing when disabled or not on a terminal.
#[derive(Debug, Default)]
pub struct Progress {
    bar: Option<ProgressBar>,
    enabled: bool,
}

impl Progress {
    pub fn new(enabled: bool) -> Self {
        Progress { bar: None, enabled }
    }

    /// Starts the bar for a study of `total` trials of which `done` are finished.
    pub fn start(&mut self, study: &str, total: u64, done: u64) {
        if !self.enabled {
            return;
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(4));
        if let Ok(style) =
            ProgressStyle::with_template("{prefix} [{bar:30.cyan/blue}] {pos}/{len} trials {elapsed} {msg}")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(study.to_string());
        bar.set_position(done);
        bar.enable_steady_tick(Duration::from_millis(250));
        self.bar = Some(bar);
    }

    /// Updates counts; `best` is `(metric, value, trial)`.
    pub fn update(&self, finished: u64, running: u64, live_agents: usize, best: Option<(&str, f64, u64)>) {
        let Some(bar) = &self.bar else { return };
        bar.set_position(finished);
        let best = best.map(|(m, v, t)| format!(" | best {m}={v:.4} (trial {t})")).unwrap_or_default();
        bar.set_message(format!("| {running} running | {live_agents} agents{best}"));
    }

    /// A line for the log of the run (a campaign's workload finished):
    /// above the bar on a terminal, a plain line on stdout otherwise (scripts read it).
    pub fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
    }
}
