//! Co-measurement: this machine measured over a trial another agent runs
//! (a study's `[measure] nodes`; [`CoMeasure`] from the coordinator), its
//! GPUs included (each read over the window like the CPU's energy).
//!
//! On [`CoMeasureStep::Start`] a window opens: a meter of the agent's energy
//! source starts and the busy time of the agent's CPUs is read from
//! `/proc/stat`; both are sampled at an interval into a cumulative series
//! stamped with the wall clock. On [`CoMeasureStep::Window`] (the starting
//! agent's marks, sent once its result arrived) the series is read at the
//! two marks by linear interpolation: the energy and CPU time between them,
//! system-wide (every process of the machine, on the agent's CPUs for the
//! estimate), not only the trial's. A part of the window outside the
//! samples is extrapolated at the covered part's rate and said so; below
//! nine tenths covered the reading is invalid. Answers are kept a while,
//! so a window asked again (its answer lost) gets the same answer.
//!
//! Points are stamped with the wall clock at the start plus the monotonic
//! time since, so a clock step during a window cannot disorder them.
//!
//! Bounded: at most [`MAX_OPEN`] windows at once (a Start past that is
//! refused with a warning), each closed when not told its window within
//! the time the Start gave (the attempt's lease) and [`LATE`] more, and at
//! most [`MAX_SAMPLES`] samples each (thinned, the ends kept).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tunefleet_common::measurement::EnergyReading;
use tunefleet_common::message::{CoMeasure, CoMeasureStep, CoMeasured, GpuDevice, TrialRef};

use crate::energy::gpu::TrialGpus;
use crate::energy::{EnergyMeter, Registry, Usage};
use crate::telemetry::{cpus_between, parse_proc_stat, CpuTimes};

/// Most windows open at once (every attempt leased in the fleet, held
/// ones included, may have one here).
pub const MAX_OPEN: usize = 256;
/// How long past the time its Start gave a window waits for its marks.
pub const LATE: Duration = Duration::from_secs(60);
/// Most samples kept per window.
pub const MAX_SAMPLES: usize = 1024;
/// Answers kept to answer a window asked again.
const MAX_ANSWERS: usize = 256;

/// One point of a window's cumulative series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub unix_ms: u64,
    /// Joules since the window opened.
    pub joules: f64,
    /// Busy CPU time of the agent's CPUs since the window opened.
    pub busy_us: u64,
}

/// The series read over `[from, to]`: joules, busy microseconds, and how
/// many milliseconds of the window the series covered (the rest is
/// extrapolated at the covered part's rate).
pub fn over(series: &[Point], from: u64, to: u64) -> (f64, u64, u64) {
    let (Some(first), Some(last)) = (series.first(), series.last()) else { return (0.0, 0, 0) };
    let (lo, hi) = (from.max(first.unix_ms), to.min(last.unix_ms));
    if hi <= lo || to <= from {
        return (0.0, 0, 0);
    }
    let (j0, b0) = at(series, lo);
    let (j1, b1) = at(series, hi);
    let covered = hi - lo;
    let scale = (to - from) as f64 / covered as f64;
    ((j1 - j0).max(0.0) * scale, ((b1 - b0).max(0.0) * scale) as u64, covered)
}

/// The series at `t` (within its span), linearly between samples.
fn at(series: &[Point], t: u64) -> (f64, f64) {
    let i = series.partition_point(|p| p.unix_ms <= t);
    match (i.checked_sub(1).and_then(|k| series.get(k)), series.get(i)) {
        (Some(a), Some(b)) if b.unix_ms > a.unix_ms => {
            let f = (t - a.unix_ms) as f64 / (b.unix_ms - a.unix_ms) as f64;
            (a.joules + f * (b.joules - a.joules), a.busy_us as f64 + f * (b.busy_us as f64 - a.busy_us as f64))
        }
        (Some(a), _) => (a.joules, a.busy_us as f64),
        (None, Some(b)) => (b.joules, b.busy_us as f64),
        (None, None) => (0.0, 0.0),
    }
}

/// Halves a full series, keeping its first and last points.
fn thin(series: &mut Vec<Point>) {
    let last = series.last().copied();
    let mut i = 0;
    series.retain(|_| {
        i += 1;
        i % 2 == 1
    });
    if let (Some(last), Some(kept)) = (last, series.last()) {
        if kept.unix_ms != last.unix_ms {
            series.push(last);
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

struct Open {
    meter: Box<dyn EnergyMeter>,
    started: Instant,
    /// The wall clock at `started`: points are stamped from it.
    started_unix_ms: u64,
    /// Closed, untold, after this.
    until: Instant,
    busy_at_start: u64,
    series: Vec<Point>,
    /// The machine's GPUs over the window, and each one's cumulative
    /// series (its joules in `joules`), stamped as `series`.
    gpus: Option<TrialGpus>,
    gpu_series: Vec<Vec<Point>>,
}

/// The co-measurements of this agent.
pub struct CoMeter {
    /// The sources a window is measured with.
    energy: Registry,
    proc_root: PathBuf,
    cpus: Vec<u32>,
    interval: Duration,
    open: HashMap<TrialRef, Open>,
    answers: VecDeque<CoMeasured>,
    /// The machine's GPUs, measured over every window.
    gpus: Vec<GpuDevice>,
    /// Starts refused because [`MAX_OPEN`] windows were open.
    pub refused: u64,
}

impl std::fmt::Debug for CoMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoMeter").field("open", &self.open.len()).field("refused", &self.refused).finish()
    }
}

impl CoMeter {
    /// Co-measures with `energy` on `cpus`, reading `/proc/stat` under
    /// `proc_root`, sampling every `interval`.
    pub fn new(energy: Registry, proc_root: PathBuf, cpus: Vec<u32>, interval: Duration) -> Self {
        CoMeter {
            energy,
            proc_root,
            cpus,
            interval,
            open: HashMap::new(),
            answers: VecDeque::new(),
            gpus: Vec::new(),
            refused: 0,
        }
    }

    /// Measures `gpus` too over every window (through the registry's NVML).
    pub fn with_gpus(mut self, gpus: Vec<GpuDevice>) -> Self {
        self.gpus = gpus;
        self
    }

    /// Whether any window is open (the sampling tick runs only then).
    pub fn is_idle(&self) -> bool {
        self.open.is_empty()
    }

    /// Busy time of the agent's CPUs since boot, in microseconds.
    fn busy_us(&self) -> u64 {
        let Ok(text) = std::fs::read_to_string(self.proc_root.join("stat")) else { return 0 };
        let (_, per_cpu) = parse_proc_stat(&text);
        let zero: Vec<(u32, CpuTimes)> = per_cpu.iter().map(|(c, _)| (*c, CpuTimes::default())).collect();
        let (sum, _) = cpus_between(&zero, &per_cpu, &self.cpus);
        crate::procfs::ticks_to_us(sum.busy, rustix::param::clock_ticks_per_second())
    }

    fn cores(&self) -> u32 {
        u32::try_from(self.cpus.len()).unwrap_or(u32::MAX).max(1)
    }

    fn point(&self, open: &mut Open, busy_now: u64) -> Point {
        let elapsed = open.started.elapsed();
        open.meter.sample(elapsed);
        let busy_us = busy_now.saturating_sub(open.busy_at_start);
        let usage = Usage { wall: elapsed, cpu: Duration::from_micros(busy_us), cores: self.cores() };
        let unix_ms = open.started_unix_ms.saturating_add(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
        if let Some(g) = &mut open.gpus {
            g.sample(elapsed);
            for (series, joules) in open.gpu_series.iter_mut().zip(g.so_far()) {
                if series.len() >= MAX_SAMPLES {
                    thin(series);
                }
                series.push(Point { unix_ms, joules, busy_us: 0 });
            }
        }
        Point { unix_ms, joules: open.meter.so_far(&usage).unwrap_or(0.0), busy_us }
    }

    /// Takes a sample of every open window; closes those open too long.
    pub fn sample(&mut self) {
        let busy = self.busy_us();
        let mut open = std::mem::take(&mut self.open);
        open.retain(|trial, o| {
            if Instant::now() > o.until {
                tracing::warn!(trial = %trial, "co-measurement never told its window: closed");
                return false;
            }
            let p = self.point(o, busy);
            if o.series.len() >= MAX_SAMPLES {
                thin(&mut o.series);
            }
            o.series.push(p);
            true
        });
        self.open = open;
    }

    /// Carries out `c`; returns the answer to publish, if any.
    pub fn on(&mut self, c: CoMeasure) -> Option<CoMeasured> {
        match c.step {
            CoMeasureStep::Start { within_ms } => {
                if self.open.contains_key(&c.trial) || self.answers.iter().any(|a| a.trial == c.trial) {
                    return None;
                }
                // The open ones are measuring trials leased now: a new one waits its turn.
                if self.open.len() >= MAX_OPEN {
                    self.refused += 1;
                    tracing::warn!(trial = %c.trial, open = MAX_OPEN, refused = self.refused, "co-measurement refused: too many open");
                    return None;
                }
                let meter = self.energy.start_machine();
                let busy = self.busy_us();
                let started = Instant::now();
                let until = started + Duration::from_millis(within_ms) + LATE;
                let gpus = self.energy.start_gpus(&self.gpus);
                let mut open = Open {
                    meter,
                    started,
                    started_unix_ms: unix_ms(),
                    until,
                    busy_at_start: busy,
                    series: Vec::new(),
                    gpu_series: vec![Vec::new(); if gpus.is_some() { self.gpus.len() } else { 0 }],
                    gpus,
                };
                let first = self.point(&mut open, busy);
                open.series.push(first);
                tracing::debug!(trial = %c.trial, "co-measuring");
                self.open.insert(c.trial, open);
                None
            }
            CoMeasureStep::Abandon => {
                self.open.remove(&c.trial);
                None
            }
            CoMeasureStep::Window { from_unix_ms, to_unix_ms } => {
                if let Some(a) = self
                    .answers
                    .iter()
                    .find(|a| a.trial == c.trial && (a.from_unix_ms, a.to_unix_ms) == (from_unix_ms, to_unix_ms))
                {
                    return Some(a.clone());
                }
                let answer = match self.open.remove(&c.trial) {
                    Some(open) => self.close(c.trial, open, from_unix_ms, to_unix_ms),
                    None => CoMeasured {
                        trial: c.trial,
                        from_unix_ms,
                        to_unix_ms,
                        energy: EnergyReading::none(
                            self.energy.kind(),
                            "this agent was not measuring this attempt (it restarted, the start was lost, or it was refused: too many windows open)",
                        ),
                        cpu_us: 0,
                        cpus: self.cores(),
                        covered_ms: 0,
                        gpus: vec![],
                    },
                };
                if self.answers.len() >= MAX_ANSWERS {
                    self.answers.pop_front();
                }
                self.answers.push_back(answer.clone());
                Some(answer)
            }
        }
    }

    fn close(&self, trial: TrialRef, mut open: Open, from: u64, to: u64) -> CoMeasured {
        let last = self.point(&mut open, self.busy_us());
        open.series.push(last);
        let elapsed = open.started.elapsed();
        let usage = Usage { wall: elapsed, cpu: Duration::from_micros(last.busy_us), cores: self.cores() };
        let whole = open.meter.stop(elapsed, &usage);
        let (joules, cpu_us, covered_ms) = over(&open.series, from, to);
        let window_ms = to.saturating_sub(from);
        // A window of no length (an attempt stopped before it started) measures nothing.
        let enough = window_ms > 0 && covered_ms.saturating_mul(10) >= window_ms.saturating_mul(9);
        // Each GPU over the window, read from its series like the CPU's.
        let gpus = match open.gpus.take() {
            Some(g) => g
                .stop(elapsed)
                .into_iter()
                .zip(&open.gpu_series)
                .map(|(mut reading, series)| {
                    reading.joules = over(series, from, to).0;
                    reading.valid &= enough;
                    reading
                })
                .collect(),
            None => Vec::new(),
        };
        let mut note = format!(
            "co-measured: the whole machine{} over {covered_ms} of the window's {window_ms} ms{}",
            if whole.source == tunefleet_common::measurement::EnergySourceKind::Estimated {
                format!(" (its {} CPUs)", self.cores())
            } else {
                String::new()
            },
            if covered_ms < window_ms { " (the rest extrapolated at the same rate)" } else { "" }
        );
        if let Some(n) = &whole.note {
            note = format!("{note}; {n}");
        }
        CoMeasured {
            trial,
            from_unix_ms: from,
            to_unix_ms: to,
            energy: EnergyReading {
                source: whole.source,
                joules,
                domains: Vec::new(),
                interval_ms: u32::try_from(self.interval.as_millis()).unwrap_or(u32::MAX),
                valid: whole.valid && enough,
                note: Some(note),
                series: Vec::new(),
            },
            cpu_us,
            cpus: self.cores(),
            covered_ms,
            gpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(unix_ms: u64, joules: f64, busy_us: u64) -> Point {
        Point { unix_ms, joules, busy_us }
    }

    #[test]
    fn a_window_inside_the_series_is_read_between_samples() {
        // 10 W and half a CPU from 1,000 ms to 3,000 ms.
        let series = [p(1_000, 0.0, 0), p(2_000, 10.0, 500_000), p(3_000, 20.0, 1_000_000)];
        let (j, busy, covered) = over(&series, 1_500, 2_500);
        assert!((j - 10.0).abs() < 1e-9, "{j}");
        assert_eq!(busy, 500_000);
        assert_eq!(covered, 1_000);
    }

    #[test]
    fn a_window_partly_outside_is_extrapolated_and_says_how_much_was_covered() {
        let series = [p(1_000, 0.0, 0), p(2_000, 10.0, 0)];
        let (j, _, covered) = over(&series, 500, 2_000);
        assert_eq!(covered, 1_000);
        assert!((j - 15.0).abs() < 1e-9, "the uncovered half second at the covered rate: {j}");
        assert_eq!(over(&series, 3_000, 4_000), (0.0, 0, 0), "nothing covered: nothing made up");
        assert_eq!(over(&[], 0, 10), (0.0, 0, 0));
    }

    #[test]
    fn thinning_keeps_both_ends() {
        let mut series: Vec<Point> = (0..10).map(|i| p(i, i as f64, 0)).collect();
        thin(&mut series);
        assert_eq!(series.first().map(|x| x.unix_ms), Some(0));
        assert_eq!(series.last().map(|x| x.unix_ms), Some(9));
        assert!(series.len() <= 6);
    }

    fn tref(n: u64) -> TrialRef {
        TrialRef { study: "s".into(), study_id: 1, trial: n, attempt: 1 }
    }

    #[test]
    fn a_window_is_answered_once_measured_and_again_the_same() {
        let mut co = CoMeter::new(Registry::default(), "/proc".into(), vec![0], Duration::from_millis(10));
        assert!(co.on(CoMeasure { trial: tref(1), step: CoMeasureStep::Start { within_ms: 60_000 } }).is_none());
        assert!(!co.is_idle());
        let from = unix_ms();
        std::thread::sleep(Duration::from_millis(30));
        co.sample();
        std::thread::sleep(Duration::from_millis(30));
        let to = unix_ms();
        let window = CoMeasure { trial: tref(1), step: CoMeasureStep::Window { from_unix_ms: from, to_unix_ms: to } };
        let a = co.on(window.clone()).expect("answered");
        assert!(co.is_idle());
        assert_eq!((a.from_unix_ms, a.to_unix_ms), (from, to));
        assert!(a.energy.valid, "{:?}", a.energy.note);
        // At least the model's idle watts for the window's length.
        let idle = crate::energy::EstimateModel::default().idle_watts_per_core * (to - from) as f64 / 1000.0;
        assert!(a.energy.joules >= idle * 0.9, "{} J for {} ms", a.energy.joules, to - from);
        assert_eq!(co.on(window).as_ref(), Some(&a), "asked again: the same answer");
        let unknown =
            co.on(CoMeasure { trial: tref(2), step: CoMeasureStep::Window { from_unix_ms: 1, to_unix_ms: 2 } });
        let unknown = unknown.expect("answered");
        assert!(!unknown.energy.valid);
        assert!(unknown.energy.note.as_deref().is_some_and(|n| n.contains("not measuring")));
    }

    #[test]
    fn abandoned_windows_are_forgotten() {
        let mut co = CoMeter::new(Registry::default(), "/proc".into(), vec![0], Duration::from_millis(10));
        co.on(CoMeasure { trial: tref(1), step: CoMeasureStep::Start { within_ms: 60_000 } });
        co.on(CoMeasure { trial: tref(1), step: CoMeasureStep::Abandon });
        assert!(co.is_idle());
    }
}
