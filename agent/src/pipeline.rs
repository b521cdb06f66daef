//! Pipelined trials: the probe windows inside one trial, the rule that picks
//! the configuration to keep, and the segments the measurement reports.
//!
//! Pure: the runner feeds it one [`Boundary`] per epoch line (when it ended,
//! the energy and CPU time counted so far) and applies the [`Step`] it
//! returns to the live process tree before the workload goes on. The plan
//! ([`ProbePlan`]) comes with the trial, so no window waits for the
//! coordinator:
//!
//! 1. `warmup` under the first configuration (a `Warmup` segment, not
//!    a probe: start-up and cold caches would make it look slow);
//! 2. one window of `window` under each configuration, in order
//!    (`Probe` segments), every epoch real work; with
//!    [`ProbePlan::from_best`] each configuration after the first is a
//!    change applied to the best measured so far when its window opens
//!    (one that lands on a configuration already measured is skipped);
//! 3. when the two best configurations are closer than the noise of their
//!    windows can tell apart (their units' times vary; a window of at least
//!    [`Segment::MIN_UNITS_FOR_NOISE`] units measures how much), one more
//!    window of each, at most [`MAX_REPROBES`] times, their windows pooled;
//! 4. the best probe by the plan's [`Select`] rule for the rest of the trial
//!    (a `Selected` segment, with the [`Segment::margin`] the choice had).
//!
//! Probes are compared per unit by the median unit's time where a window
//! has enough units (an outlying epoch or step does not decide), else the
//! mean; windows cut short by the end of the trial still count. Energy rules fall back to time when a probe has no
//! energy figure, and say so in the log. A configuration sent by the
//! coordinator while the trial runs ends the current segment and starts a
//! `Reconfigured` one (probing stops there).

use std::collections::VecDeque;

use tunefleet_common::measurement::{Segment, SegmentRole};
use tunefleet_common::message::{ProbePlan, Select, WindowUnit};
use tunefleet_common::params::SystemParams;

/// What was counted when an epoch ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Boundary {
    /// Microseconds since the workload started.
    pub at_us: u64,
    /// The last epoch that ended (0 before the first).
    pub epoch: u32,
    /// Energy counted since the start, when the meter can say.
    pub joules: Option<f64>,
    /// CPU time of the trial since the start, when counted.
    pub cpu_us: Option<u64>,
}

impl Boundary {
    /// The start of the trial.
    pub fn start() -> Self {
        Boundary { at_us: 0, epoch: 0, joules: Some(0.0), cpu_us: Some(0) }
    }
}

/// Rounds of windows again for the two closest configurations, at most.
pub use tunefleet_common::message::MAX_REPROBES;
/// Standard errors apart that the kept configuration and the runner-up
/// must be for the choice to stand without another round.
pub const CONFIDENT_MARGIN: f64 = 2.0;

/// What the runner must do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Go on under the current configuration.
    Stay,
    /// Switch the live trial to this configuration.
    Apply(SystemParams),
}

#[derive(Debug, Clone)]
struct Open {
    role: SegmentRole,
    system: SystemParams,
    cpus: Vec<u32>,
    start: Boundary,
    epochs: u32,
    steps: u32,
    /// Index into the plan's configurations of a probe window.
    probe: Option<usize>,
    /// When the last unit ended (µs since the start), and each unit's time.
    last_at: u64,
    unit_us: Vec<u64>,
    /// For a `Selected` segment: the margin its choice had.
    margin: Option<f64>,
}

impl Open {
    fn new(role: SegmentRole, system: SystemParams, cpus: Vec<u32>, start: Boundary, probe: Option<usize>) -> Self {
        Open {
            role,
            system,
            cpus,
            start,
            epochs: 0,
            steps: 0,
            probe,
            last_at: start.at_us,
            unit_us: Vec::new(),
            margin: None,
        }
    }

    /// A unit (epoch or step, whichever the windows count) ended at `b`.
    fn unit_ended(&mut self, b: &Boundary) {
        self.unit_us.push(b.at_us.saturating_sub(self.last_at));
        self.last_at = b.at_us;
    }
}

/// The state of one trial's segments.
#[derive(Debug, Clone)]
pub struct Pipeline {
    plan: Option<ProbePlan>,
    open: Open,
    segments: Vec<Segment>,
    /// Probe windows closed, by configuration index, with their units' times.
    probes: Vec<(usize, Segment)>,
    units: Vec<(usize, Vec<u64>)>,
    /// Configurations whose windows are still to come, in order.
    queue: VecDeque<usize>,
    /// Rounds of windows again done so far.
    reprobes: u32,
    selected: Option<SystemParams>,
    reconfigured: bool,
    /// Started with a probe plan (its first window is profiled).
    pipelined: bool,
    /// Steps since the last epoch line (windows of steps).
    steps_in_epoch: u32,
    /// A window of steps shrunk to a whole epoch's steps: an epoch shorter
    /// than the plan's window would cut every window, and probing would
    /// never end.
    adapted_window: Option<u32>,
    /// A reused configuration that arrived during the first probe window:
    /// applied when that window ends.
    deferred: Option<SystemParams>,
}

impl Pipeline {
    /// A trial that starts under `system` on `cpus`; `plan` when pipelined.
    pub fn new(plan: Option<ProbePlan>, system: SystemParams, cpus: Vec<u32>) -> Self {
        let plan = plan.filter(|p| !p.configs.is_empty());
        let (role, probe) = match &plan {
            Some(p) if p.warmup > 0 => (SegmentRole::Warmup, None),
            Some(_) => (SegmentRole::Probe, Some(0)),
            None => (SegmentRole::Initial, None),
        };
        let open = Open::new(role, system, cpus, Boundary::start(), probe);
        let pipelined = plan.is_some();
        let queue = plan.as_ref().map_or_else(VecDeque::new, |p| (1..p.configs.len()).collect());
        Pipeline {
            plan,
            open,
            segments: Vec::new(),
            probes: Vec::new(),
            units: Vec::new(),
            queue,
            reprobes: 0,
            selected: None,
            reconfigured: false,
            pipelined,
            steps_in_epoch: 0,
            adapted_window: None,
            deferred: None,
        }
    }

    /// Units per probe window: the plan's, or a whole epoch's steps once an
    /// epoch turned out shorter than that ([`Pipeline::adapted_window`]).
    fn window(&self, plan: &ProbePlan) -> u32 {
        self.adapted_window.unwrap_or(plan.window).max(1)
    }

    /// The window of steps probing uses now, when an epoch too short for the
    /// plan's made it shrink.
    pub fn adapted_window(&self) -> Option<u32> {
        self.adapted_window
    }

    /// The configuration the trial runs under now.
    pub fn current(&self) -> &SystemParams {
        &self.open.system
    }

    /// The CPUs the live trial was actually pinned to for the open segment.
    pub fn set_cpus(&mut self, cpus: Vec<u32>) {
        self.open.cpus = cpus;
    }

    /// The first probe window of a pipelined trial, once it has closed:
    /// what the job's profile is taken over (after the warm-up, so the
    /// start-up is not in it).
    pub fn first_window(&self) -> Option<&Segment> {
        self.segments.iter().find(|s| s.role == SegmentRole::Probe).filter(|_| self.pipelined)
    }

    /// The first probe window is open after a warm-up (the start-up is
    /// behind: what the first window's profile counts from).
    pub fn first_window_open_after_warmup(&self) -> bool {
        self.open.role == SegmentRole::Probe
            && self.open.probe == Some(0)
            && self.segments.iter().any(|s| s.role == SegmentRole::Warmup)
            && !self.segments.iter().any(|s| s.role == SegmentRole::Probe)
    }

    /// Still probing: more windows to come.
    pub fn probing(&self) -> bool {
        matches!(self.open.role, SegmentRole::Warmup | SegmentRole::Probe)
    }

    /// What the plan's windows count, when there is a plan.
    pub fn unit(&self) -> Option<WindowUnit> {
        self.plan.as_ref().map(|p| p.unit)
    }

    /// An epoch ended at `b`.
    pub fn on_epoch(&mut self, b: Boundary) -> Step {
        self.open.epochs += 1;
        let whole = std::mem::take(&mut self.steps_in_epoch);
        match self.unit() {
            Some(WindowUnit::Epochs) => {
                self.open.unit_ended(&b);
                self.advance(b, self.open.epochs)
            }
            Some(WindowUnit::Steps) => {
                // An epoch end (evaluation, checkpoints) inside a probe
                // window of steps spoils it: measure that configuration again.
                if self.open.role == SegmentRole::Probe && self.open.steps > 0 {
                    // Every window would be cut when a whole epoch has fewer
                    // steps than a window: windows become an epoch's steps,
                    // and the next one fits between two epoch lines.
                    if let Some(plan) = &self.plan {
                        if whole > 0 && whole < self.window(plan) {
                            self.adapted_window = Some(whole);
                        }
                    }
                    self.open.role = SegmentRole::Cut;
                    let (system, probe) = (self.open.system.clone(), self.open.probe);
                    self.close_and_open(b, SegmentRole::Probe, system, probe);
                }
                Step::Stay
            }
            None => Step::Stay,
        }
    }

    /// A step ended at `b` (counted only when the windows count steps).
    pub fn on_step(&mut self, b: Boundary) -> Step {
        if self.unit() != Some(WindowUnit::Steps) {
            return Step::Stay;
        }
        self.open.steps += 1;
        self.steps_in_epoch += 1;
        self.open.unit_ended(&b);
        self.advance(b, self.open.steps)
    }

    /// The open segment has `count` units: close its window when it is full.
    fn advance(&mut self, b: Boundary, count: u32) -> Step {
        let Some(plan) = self.plan.clone() else { return Step::Stay };
        match (self.open.role, self.open.probe) {
            (SegmentRole::Warmup, _) if count >= plan.warmup => {
                let system = self.open.system.clone();
                self.close_and_open(b, SegmentRole::Probe, system, Some(0));
                Step::Stay
            }
            (SegmentRole::Probe, Some(0)) if count >= self.window(&plan) && self.deferred.is_some() => {
                let system = self.deferred.take().unwrap_or_default();
                self.switch(b, system, SegmentRole::Reused)
            }
            (SegmentRole::Probe, Some(k)) if count >= self.window(&plan) => {
                let plan = self.next_from_best(&b, k).unwrap_or(plan);
                let mut margin = None;
                let mut best = k;
                if self.queue.is_empty() {
                    // Every window measured: choose, or measure the two
                    // closest again when noise could have decided.
                    let (mut probes, mut units) = (self.probes.clone(), self.units.clone());
                    if let Some(s) = segment(&self.open, &b) {
                        probes.push((k, s));
                        units.push((k, self.open.unit_us.clone()));
                    }
                    let pooled = pool(&probes, &units);
                    best = select(&pooled, plan.select);
                    let close = compare(&pooled, best, plan.select);
                    match close {
                        Some((runner, z)) if z < CONFIDENT_MARGIN && self.reprobes < MAX_REPROBES => {
                            self.reprobes += 1;
                            // The one running now first: no switch for it.
                            let (a, c) = if runner == k { (runner, best) } else { (best, runner) };
                            self.queue.extend([a, c]);
                        }
                        _ => margin = close.map(|(_, z)| z),
                    }
                }
                if let Some(next) = self.queue.pop_front() {
                    let config = plan.configs.get(next).cloned().unwrap_or_default();
                    self.close_and_open(b, SegmentRole::Probe, config.clone(), Some(next));
                    return if plan.configs.get(k) == Some(&config) { Step::Stay } else { Step::Apply(config) };
                }
                self.close_and_open(b, SegmentRole::Selected, SystemParams::default(), None);
                let chosen = plan.configs.get(best).cloned().unwrap_or_default();
                self.selected = Some(chosen.clone());
                self.open.system = chosen.clone();
                self.open.margin = margin;
                if Some(&chosen) == plan.configs.get(k) {
                    Step::Stay
                } else {
                    Step::Apply(chosen)
                }
            }
            _ => Step::Stay,
        }
    }

    /// With a plan of changes probed from the best so far: the window of
    /// configuration `k` closed at `b`, so the next configuration not yet
    /// probed becomes its change applied to the best measured so far
    /// (changes that lead to a configuration already measured are dropped
    /// from the queue). Returns the plan as it now is.
    fn next_from_best(&mut self, b: &Boundary, k: usize) -> Option<ProbePlan> {
        let plan = self.plan.as_mut().filter(|p| p.from_best)?;
        let mut probes = self.probes.clone();
        let mut units = self.units.clone();
        if let Some(s) = segment(&self.open, b) {
            probes.push((k, s));
            units.push((k, self.open.unit_us.clone()));
        }
        let measured = |j: usize| probes.iter().any(|(i, _)| *i == j);
        // As `select` chooses, without its warning at every window.
        let best_so_far = argmin_of(scores(&pool(&probes, &units), plan.select).into_iter()).unwrap_or(0);
        let best = plan.configs.get(best_so_far).cloned().unwrap_or_default();
        while let Some(&next) = self.queue.front() {
            if measured(next) {
                break; // measured again (a round of re-probing): as it was
            }
            let Some(change) = plan.configs.get(next).cloned() else { break };
            let first = plan.configs.first().cloned().unwrap_or_default();
            let config = SystemParams {
                cores: changed(change.cores, first.cores, best.cores),
                threads: changed(change.threads, first.threads, best.threads),
                memory_mib: changed(change.memory_mib, first.memory_mib, best.memory_mib),
            };
            if probes.iter().any(|(i, _)| plan.configs.get(*i) == Some(&config)) {
                self.queue.pop_front();
                continue;
            }
            if let Some(c) = plan.configs.get_mut(next) {
                *c = config;
            }
            break;
        }
        Some(plan.clone())
    }

    /// The coordinator sent `system` for this trial at `b`: probing (if
    /// any) ends, and a segment of `role` (`Reconfigured`, or `Reused` for a
    /// configuration reused from similar jobs) starts. A reuse that comes
    /// during the first probe window waits for its end: that window (the
    /// plan's first configuration, after the warm-up) is the one every job
    /// of its cluster ran, which its verification is normalised by.
    pub fn reconfigure(&mut self, b: Boundary, system: SystemParams, role: SegmentRole) -> Step {
        if role == SegmentRole::Reused
            && self.plan.is_some()
            && matches!((self.open.role, self.open.probe), (SegmentRole::Probe, Some(0)) | (SegmentRole::Warmup, _))
        {
            self.deferred = Some(system);
            return Step::Stay;
        }
        self.switch(b, system, role)
    }

    /// Probing (if any) ends at `b` and a segment of `role` under `system` starts.
    fn switch(&mut self, b: Boundary, system: SystemParams, role: SegmentRole) -> Step {
        if system == self.open.system && self.reconfigured {
            return Step::Stay;
        }
        self.reconfigured = true;
        self.plan = None;
        self.close_and_open(b, role, system.clone(), None);
        Step::Apply(system)
    }

    fn close_and_open(&mut self, b: Boundary, role: SegmentRole, system: SystemParams, probe: Option<usize>) {
        let cpus = self.open.cpus.clone();
        let next = Open::new(role, system, cpus, b, probe);
        let closed = std::mem::replace(&mut self.open, next);
        if let Some(segment) = segment(&closed, &b) {
            if let (SegmentRole::Probe, Some(k)) = (closed.role, closed.probe) {
                self.probes.push((k, segment.clone()));
                self.units.push((k, closed.unit_us.clone()));
            }
            self.segments.push(segment);
        }
    }

    /// The segments and the selected configuration, with the open segment
    /// closed at `end` (the trial's last epoch, or its exit). A trial that
    /// was neither pipelined nor reconfigured has no segments.
    pub fn finish(mut self, end: Boundary) -> (Vec<Segment>, Option<SystemParams>) {
        if self.plan.is_none() && !self.reconfigured {
            return (Vec::new(), None);
        }
        let open = self.open.clone();
        if let Some(s) = segment(&open, &end) {
            self.segments.push(s);
        }
        (self.segments, self.selected)
    }
}

/// A parameter of a change from `first`: the change's value where it
/// differs, else the best configuration's.
fn changed<T: PartialEq>(change: Option<T>, first: Option<T>, best: Option<T>) -> Option<T> {
    if change != first {
        change
    } else {
        best
    }
}

/// The segment of `open` ended at `end`; `None` when no epoch and no
/// step ended in it.
fn segment(open: &Open, end: &Boundary) -> Option<Segment> {
    if open.epochs == 0 && open.steps == 0 {
        return None;
    }
    let energy_j = match (open.start.joules, end.joules) {
        (Some(a), Some(b)) if b >= a => Some(b - a),
        _ => None,
    };
    let cpu_us = match (open.start.cpu_us, end.cpu_us) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let first_epoch = open.start.epoch.saturating_add(1);
    let (unit_median_us, unit_spread) = noise(&open.unit_us).unzip();
    Some(Segment {
        role: open.role,
        system: open.system.clone(),
        cpus: open.cpus.clone(),
        first_epoch,
        last_epoch: end.epoch.max(first_epoch),
        steps: open.steps,
        start_us: open.start.at_us,
        wall_us: end.at_us.saturating_sub(open.start.at_us),
        energy_j,
        cpu_us,
        unit_median_us,
        unit_spread,
        margin: open.margin,
    })
}

/// The median of `units` (µs) and their spread relative to it (median
/// absolute deviation / median), when there are enough of them.
fn noise(units: &[u64]) -> Option<(u64, f64)> {
    if units.len() < Segment::MIN_UNITS_FOR_NOISE {
        return None;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let mut times: Vec<f64> = units.iter().map(|&u| u as f64).collect();
    let m = median(&mut times);
    let mut deviations: Vec<f64> = times.iter().map(|t| (t - m).abs()).collect();
    let mad = median(&mut deviations);
    let spread = if m > 0.0 { mad / m } else { 0.0 };
    Some((m.round() as u64, spread))
}

/// One segment per configuration probed: its windows pooled (time, energy
/// and CPU summed, units counted together, the median and spread over all
/// their units), in the order configurations were first probed.
fn pool(probes: &[(usize, Segment)], units: &[(usize, Vec<u64>)]) -> Vec<(usize, Segment)> {
    let mut pooled: Vec<(usize, Segment)> = Vec::new();
    for (k, s) in probes {
        let mut one = s.clone();
        one.steps = s.units();
        match pooled.iter_mut().find(|(j, _)| j == k) {
            Some((_, p)) => {
                p.steps = p.steps.saturating_add(one.steps);
                p.wall_us = p.wall_us.saturating_add(one.wall_us);
                p.last_epoch = p.last_epoch.max(one.last_epoch);
                p.energy_j = p.energy_j.zip(one.energy_j).map(|(a, b)| a + b);
                p.cpu_us = p.cpu_us.zip(one.cpu_us).map(|(a, b)| a.saturating_add(b));
            }
            None => pooled.push((*k, one)),
        }
    }
    for (k, p) in &mut pooled {
        let all: Vec<u64> = units.iter().filter(|(j, _)| j == k).flat_map(|(_, u)| u.iter().copied()).collect();
        (p.unit_median_us, p.unit_spread) = noise(&all).unzip();
    }
    pooled
}

/// The runner-up to `best` among `pooled` by `rule`, and how many standard
/// errors of the difference apart their scores are, taking each score's
/// relative error as its units' time's (the standard error of a median is
/// about 1.25 standard deviations over the root of the count, and a
/// standard deviation about 1.48 median absolute deviations). `None` when
/// there is no runner-up or either's noise is not measured.
fn compare(pooled: &[(usize, Segment)], best: usize, rule: Select) -> Option<(usize, f64)> {
    let scored = scores(pooled, rule);
    let score_of = |k: usize| scored.iter().find(|(j, _)| *j == k).map(|&(_, v)| v);
    let runner = argmin_of(scored.iter().copied().filter(|(k, _)| *k != best))?;
    let (a, b) = (score_of(best)?, score_of(runner)?);
    let relative_error = |k: usize| {
        let s = &pooled.iter().find(|(j, _)| *j == k)?.1;
        let n = s.units() as f64;
        s.unit_spread.map(|spread| 1.2533 * 1.4826 * spread / n.sqrt())
    };
    let (ea, eb) = (relative_error(best)?, relative_error(runner)?);
    let error = (ea * ea + eb * eb).sqrt() * a.abs().min(b.abs());
    if error.is_nan() || error <= 0.0 {
        return None;
    }
    Some((runner, ((a - b).abs() / error).min(1_000.0)))
}

/// The index (into the plan's configurations) of the best probe by `rule`,
/// per unit (epoch or step); ties go to the earlier configuration. Rules that need energy
/// use time when any probe has no energy figure.
pub fn select(probes: &[(usize, Segment)], rule: Select) -> usize {
    if rule != Select::Time && probes.iter().any(|(_, s)| s.energy_j.is_none()) {
        tracing::warn!(?rule, "a probe window has no energy figure: selecting by time");
    }
    argmin_of(scores(probes, rule).into_iter()).unwrap_or(0)
}

/// Each probe's score by `rule` (lower is better), per unit; probes a rule
/// leaves out (past `MaxSlowdown`'s bound) are not listed.
fn scores(probes: &[(usize, Segment)], rule: Select) -> Vec<(usize, f64)> {
    let time = |s: &Segment| s.typical_us_per_unit() / 1e6;
    let energy: Option<Vec<f64>> = probes.iter().map(|(_, s)| s.joules_per_unit()).collect();
    let Some(energy) = energy.filter(|_| rule != Select::Time) else {
        return probes.iter().map(|(k, s)| (*k, time(s))).collect();
    };
    let fastest = probes.iter().map(|(_, s)| time(s)).fold(f64::INFINITY, f64::min);
    let max_power =
        probes.iter().zip(&energy).map(|((_, s), e)| if time(s) > 0.0 { e / time(s) } else { 0.0 }).fold(0.0, f64::max);
    let scored = probes.iter().zip(&energy).filter_map(|((k, s), &e)| {
        let t = time(s);
        let score = match rule {
            Select::Time => t,
            Select::Energy => e,
            Select::Edp => e * t,
            Select::Cost { eta_permille } => {
                let eta = f64::from(eta_permille.min(1000)) / 1000.0;
                eta * e + (1.0 - eta) * max_power * t
            }
            Select::MaxSlowdown { permille } => {
                if t > fastest * (1.0 + f64::from(permille) / 1000.0) {
                    return None;
                }
                e
            }
        };
        Some((*k, score))
    });
    scored.collect()
}

/// The index with the least finite score; ties go to the earlier index.
fn argmin_of(scored: impl Iterator<Item = (usize, f64)>) -> Option<usize> {
    let mut best: Option<(usize, f64)> = None;
    for (k, v) in scored {
        if v.is_finite() && best.is_none_or(|(bk, bv)| v < bv || (v == bv && k < bk)) {
            best = Some((k, v));
        }
    }
    best.map(|(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sys(cores: u32, threads: u32) -> SystemParams {
        SystemParams { cores: Some(cores), threads: Some(threads), memory_mib: None }
    }

    fn plan(configs: Vec<SystemParams>, warmup: u32, window: u32, select: Select) -> ProbePlan {
        ProbePlan { configs, window, warmup, unit: WindowUnit::Epochs, select, control: false, from_best: false }
    }

    /// Epoch `e` ends at `t` seconds, with `j` joules counted so far.
    fn at(e: u32, t: f64, j: f64) -> Boundary {
        Boundary { at_us: (t * 1e6) as u64, epoch: e, joules: Some(j), cpu_us: Some((t * 1e6) as u64) }
    }

    #[test]
    fn probes_each_configuration_for_a_window_then_keeps_the_fastest() {
        let configs = vec![sys(2, 2), sys(1, 2), sys(2, 1), sys(1, 1)];
        let mut p = Pipeline::new(Some(plan(configs.clone(), 1, 2, Select::Time)), configs[0].clone(), vec![0, 1]);
        // Warm-up epoch 1, then windows of two epochs: 2-3, 4-5, 6-7, 8-9.
        assert_eq!(p.on_epoch(at(1, 5.0, 0.0)), Step::Stay, "warm-up ends; the first window keeps its config");
        assert_eq!(p.on_epoch(at(2, 6.0, 0.0)), Step::Stay);
        assert_eq!(p.on_epoch(at(3, 7.0, 0.0)), Step::Apply(configs[1].clone()), "1 s per epoch under (2,2)");
        assert_eq!(p.on_epoch(at(4, 7.5, 0.0)), Step::Stay);
        assert_eq!(p.on_epoch(at(5, 8.0, 0.0)), Step::Apply(configs[2].clone()), "0.5 s per epoch under (1,2)");
        p.on_epoch(at(6, 9.5, 0.0));
        assert_eq!(p.on_epoch(at(7, 11.0, 0.0)), Step::Apply(configs[3].clone()), "1.5 s under (2,1)");
        assert!(p.probing());
        p.on_epoch(at(8, 11.6, 0.0));
        assert_eq!(p.on_epoch(at(9, 12.2, 0.0)), Step::Apply(configs[1].clone()), "0.6 s under (1,1): (1,2) wins");
        assert!(!p.probing());
        p.on_epoch(at(10, 12.7, 0.0));
        let (segments, selected) = p.finish(at(10, 12.7, 0.0));
        assert_eq!(selected, Some(configs[1].clone()));
        let roles: Vec<_> = segments.iter().map(|s| (s.role, s.first_epoch, s.last_epoch)).collect();
        assert_eq!(
            roles,
            vec![
                (SegmentRole::Warmup, 1, 1),
                (SegmentRole::Probe, 2, 3),
                (SegmentRole::Probe, 4, 5),
                (SegmentRole::Probe, 6, 7),
                (SegmentRole::Probe, 8, 9),
                (SegmentRole::Selected, 10, 10)
            ]
        );
        assert_eq!(segments[2].system, configs[1]);
        assert_eq!(segments[2].wall_us, 1_000_000);
        assert_eq!(segments[5].system, configs[1]);
    }

    #[test]
    fn one_at_a_time_changes_are_probed_from_the_best_so_far() {
        // The default (2,2), then "cores 1" and "threads 1" as changes.
        let configs = vec![sys(2, 2), sys(1, 2), sys(2, 1)];
        let from_best = ProbePlan { from_best: true, ..plan(configs.clone(), 1, 1, Select::Time) };
        let mut p = Pipeline::new(Some(from_best), configs[0].clone(), vec![0, 1]);
        assert_eq!(p.on_epoch(at(1, 1.0, 0.0)), Step::Stay, "warm-up");
        assert_eq!(p.on_epoch(at(2, 2.0, 0.0)), Step::Apply(sys(1, 2)), "1 s under (2,2)");
        // (1,2) at 0.4 s is the best so far: "threads 1" is tried on it.
        assert_eq!(p.on_epoch(at(3, 2.4, 0.0)), Step::Apply(sys(1, 1)), "the change on the best so far");
        assert_eq!(p.on_epoch(at(4, 2.7, 0.0)), Step::Stay, "(1,1) at 0.3 s is kept");
        let (segments, selected) = p.finish(at(5, 3.0, 0.0));
        assert_eq!(selected, Some(sys(1, 1)), "never probed from the default, (2,1), would have missed it");
        let probed: Vec<_> =
            segments.iter().filter(|s| s.role == SegmentRole::Probe).map(|s| s.system.clone()).collect();
        assert_eq!(probed, vec![sys(2, 2), sys(1, 2), sys(1, 1)]);
        // When the default stays the best, the changes are the plain ones.
        let mut q = Pipeline::new(
            Some(ProbePlan { from_best: true, ..plan(configs.clone(), 1, 1, Select::Time) }),
            configs[0].clone(),
            vec![0, 1],
        );
        q.on_epoch(at(1, 1.0, 0.0));
        assert_eq!(q.on_epoch(at(2, 2.0, 0.0)), Step::Apply(sys(1, 2)));
        assert_eq!(q.on_epoch(at(3, 4.0, 0.0)), Step::Apply(sys(2, 1)), "(1,2) slower: threads 1 on the default");
    }

    #[test]
    fn a_change_that_lands_on_a_configuration_already_measured_is_skipped() {
        // "cores 1" twice (a plan no coordinator makes, but an agent takes
        // plans as they come): the second lands on (1,2), measured.
        let configs = vec![sys(2, 2), sys(1, 2), sys(1, 2)];
        let from_best = ProbePlan { from_best: true, ..plan(configs.clone(), 1, 1, Select::Time) };
        let mut p = Pipeline::new(Some(from_best), configs[0].clone(), vec![0, 1]);
        p.on_epoch(at(1, 1.0, 0.0));
        assert_eq!(p.on_epoch(at(2, 2.0, 0.0)), Step::Apply(sys(1, 2)));
        assert_eq!(p.on_epoch(at(3, 2.5, 0.0)), Step::Stay, "skipped: (1,2) is selected at once");
        assert!(!p.probing());
        let (segments, selected) = p.finish(at(4, 3.0, 0.0));
        assert_eq!(selected, Some(sys(1, 2)));
        assert_eq!(segments.iter().filter(|s| s.role == SegmentRole::Probe).count(), 2);
    }

    /// Feeds epochs of these durations (seconds) after time `t` (epoch
    /// `e` the last ended); the steps returned and the new `(e, t)`.
    fn feed(p: &mut Pipeline, (mut e, mut t): (u32, f64), durations: &[f64]) -> (Vec<Step>, (u32, f64)) {
        let mut steps = Vec::new();
        for d in durations {
            e += 1;
            t += d;
            steps.push(p.on_epoch(at(e, t, 0.0)));
        }
        (steps, (e, t))
    }

    #[test]
    fn a_window_with_one_outlying_epoch_is_judged_by_its_median_unit() {
        let configs = vec![sys(1, 1), sys(2, 2)];
        let mut p = Pipeline::new(Some(plan(configs.clone(), 1, 5, Select::Time)), configs[0].clone(), vec![0]);
        let (_, now) = feed(&mut p, (0, 0.0), &[3.0]);
        // (1,1): 1 s an epoch but one of 10 s (a checkpoint): mean 2.8 s.
        let (steps, now) = feed(&mut p, now, &[1.0, 1.0, 10.0, 1.0, 1.0]);
        assert_eq!(steps.last(), Some(&Step::Apply(configs[1].clone())));
        // (2,2): a steady 1.5 s: a better mean, a worse median.
        let (steps, now) = feed(&mut p, now, &[1.5, 1.5, 1.5, 1.5, 1.5]);
        assert_eq!(steps.last(), Some(&Step::Apply(configs[0].clone())), "the median unit decides");
        let (segments, selected) = p.finish(at(now.0, now.1, 0.0));
        assert_eq!(selected, Some(configs[0].clone()));
        assert_eq!(segments[1].unit_median_us, Some(1_000_000));
        assert_eq!(segments[1].unit_spread, Some(0.0));
        assert_eq!(segments[1].us_per_unit(), 2_800_000.0, "the mean is still reported");
    }

    #[test]
    fn configurations_closer_than_their_noise_are_probed_again_and_the_margin_recorded() {
        let configs = vec![sys(1, 1), sys(2, 2)];
        let mut p = Pipeline::new(Some(plan(configs.clone(), 1, 5, Select::Time)), configs[0].clone(), vec![0]);
        let (_, now) = feed(&mut p, (0, 0.0), &[3.0]);
        let (_, now) = feed(&mut p, now, &[1.0, 1.2, 0.9, 1.1, 1.0]);
        // Medians 1.0 and 1.05 s, each window's units spread by 5 to 10 %:
        // too close to tell. (2,2) runs on (no switch), then (1,1) again.
        let (steps, now) = feed(&mut p, now, &[1.05, 0.9, 1.2, 1.0, 1.1]);
        assert_eq!(steps.last(), Some(&Step::Stay), "(2,2) measured again at once");
        assert!(p.probing());
        let (steps, now) = feed(&mut p, now, &[1.6, 1.5, 1.7, 1.6, 1.5]);
        assert_eq!(steps.last(), Some(&Step::Apply(configs[0].clone())), "then (1,1) again");
        let (steps, now) = feed(&mut p, now, &[1.0, 1.0, 1.1, 0.9, 1.0]);
        assert_eq!(steps.last(), Some(&Step::Stay), "(1,1) kept: it runs already");
        assert!(!p.probing());
        let (_, now) = feed(&mut p, now, &[1.0]);
        let (segments, selected) = p.finish(at(now.0, now.1, 0.0));
        assert_eq!(selected, Some(configs[0].clone()));
        let roles: Vec<(SegmentRole, SystemParams)> = segments.iter().map(|s| (s.role, s.system.clone())).collect();
        let (a, b) = (configs[0].clone(), configs[1].clone());
        assert_eq!(
            roles,
            [
                (SegmentRole::Warmup, a.clone()),
                (SegmentRole::Probe, a.clone()),
                (SegmentRole::Probe, b.clone()),
                (SegmentRole::Probe, b),
                (SegmentRole::Probe, a.clone()),
                (SegmentRole::Selected, a)
            ]
        );
        let margin = segments[5].margin.expect("a margin for the choice");
        assert!((2.0..5.0).contains(&margin), "pooled windows: about 3 standard errors apart, got {margin}");
        assert!(segments[..5].iter().all(|s| s.margin.is_none()));
    }

    #[test]
    fn configurations_noise_cannot_tell_apart_are_probed_again_at_most_twice() {
        let configs = vec![sys(1, 1), sys(2, 2)];
        let mut p = Pipeline::new(Some(plan(configs.clone(), 0, 4, Select::Time)), configs[0].clone(), vec![0]);
        let same = [1.0, 1.2, 0.8, 1.1];
        let mut now = (0, 0.0);
        for _ in 0..(2 + 2 * MAX_REPROBES) {
            assert!(p.probing());
            now = feed(&mut p, now, &same).1;
        }
        assert!(!p.probing(), "two rounds again, then a choice");
        let (_, now) = feed(&mut p, now, &[1.0]);
        let (segments, selected) = p.finish(at(now.0, now.1, 0.0));
        assert_eq!(selected, Some(configs[0].clone()), "a tie goes to the first");
        let margin = segments.last().and_then(|s| s.margin).expect("a margin");
        assert!(margin < CONFIDENT_MARGIN, "kept with the low margin it had: {margin}");
        assert_eq!(segments.iter().filter(|s| s.role == SegmentRole::Probe).count(), 2 + 2 * MAX_REPROBES as usize);
    }

    #[test]
    fn energy_rules_pick_by_energy_and_respect_the_slowdown_bound() {
        // Probe k: seconds per epoch and joules per epoch.
        let probes = |v: &[(f64, f64)]| -> Vec<(usize, Segment)> {
            v.iter()
                .enumerate()
                .map(|(k, &(t, j))| {
                    let s = Segment {
                        role: SegmentRole::Probe,
                        system: SystemParams::default(),
                        cpus: vec![],
                        first_epoch: 1,
                        last_epoch: 2,
                        steps: 0,
                        start_us: 0,
                        wall_us: (2.0 * t * 1e6) as u64,
                        energy_j: Some(2.0 * j),
                        cpu_us: None,
                        unit_median_us: None,
                        unit_spread: None,
                        margin: None,
                    };
                    (k, s)
                })
                .collect()
        };
        let p = probes(&[(1.0, 50.0), (2.0, 30.0), (1.05, 40.0)]);
        assert_eq!(select(&p, Select::Time), 0);
        assert_eq!(select(&p, Select::Energy), 1);
        assert_eq!(select(&p, Select::Edp), 2, "1.05 x 40 = 42 < 50 < 60");
        assert_eq!(select(&p, Select::MaxSlowdown { permille: 100 }), 2, "within 10 % of the fastest, least energy");
        assert_eq!(select(&p, Select::MaxSlowdown { permille: 1000 }), 1);
        // eta = 1: energy only; eta = 0: time only.
        assert_eq!(select(&p, Select::Cost { eta_permille: 1000 }), 1);
        assert_eq!(select(&p, Select::Cost { eta_permille: 0 }), 0);
        // No energy figure for one probe: by time.
        let mut q = p.clone();
        q[0].1.energy_j = None;
        assert_eq!(select(&q, Select::Energy), 0);
    }

    #[test]
    fn a_reuse_waits_for_the_first_probe_window_the_window_every_job_ran() {
        let configs = vec![sys(2, 2), sys(1, 2), sys(2, 1)];
        let mut p = Pipeline::new(Some(plan(configs.clone(), 1, 2, Select::Time)), configs[0].clone(), vec![0, 1]);
        assert_eq!(p.on_epoch(at(1, 5.0, 0.0)), Step::Stay, "warm-up (start-up) ends");
        // The reuse arrives inside the first probe window: it waits.
        assert_eq!(p.reconfigure(at(1, 5.2, 0.0), sys(1, 2), SegmentRole::Reused), Step::Stay);
        assert_eq!(p.on_epoch(at(2, 6.0, 0.0)), Step::Stay);
        assert_eq!(p.on_epoch(at(3, 7.0, 0.0)), Step::Apply(sys(1, 2)), "applied when the window ends");
        assert!(!p.probing(), "no other configuration is probed");
        p.on_epoch(at(4, 7.5, 0.0));
        let (segments, selected) = p.finish(at(5, 8.0, 0.0));
        let roles: Vec<_> = segments.iter().map(|s| (s.role, s.first_epoch, s.last_epoch, s.system.clone())).collect();
        assert_eq!(
            roles,
            vec![
                (SegmentRole::Warmup, 1, 1, sys(2, 2)),
                (SegmentRole::Probe, 2, 3, sys(2, 2)),
                (SegmentRole::Reused, 4, 5, sys(1, 2)),
            ]
        );
        assert_eq!(selected, None);
        // A reuse after the first window is applied at once.
        let mut q = Pipeline::new(Some(plan(configs.clone(), 1, 1, Select::Time)), configs[0].clone(), vec![0, 1]);
        q.on_epoch(at(1, 5.0, 0.0));
        assert_eq!(q.on_epoch(at(2, 6.0, 0.0)), Step::Apply(configs[1].clone()));
        assert_eq!(q.reconfigure(at(2, 6.1, 0.0), sys(2, 1), SegmentRole::Reused), Step::Apply(sys(2, 1)));
    }

    #[test]
    fn a_trial_without_a_plan_has_no_segments_unless_reconfigured() {
        let mut p = Pipeline::new(None, sys(2, 2), vec![]);
        assert_eq!(p.on_epoch(at(1, 1.0, 1.0)), Step::Stay);
        assert_eq!(p.clone().finish(at(1, 1.0, 1.0)), (vec![], None));
        assert_eq!(p.reconfigure(at(1, 1.0, 1.0), sys(1, 1), SegmentRole::Reconfigured), Step::Apply(sys(1, 1)));
        p.on_epoch(at(2, 3.0, 4.0));
        let (segments, selected) = p.finish(at(2, 3.0, 4.0));
        assert_eq!(selected, None);
        assert_eq!(segments.len(), 2);
        assert_eq!(
            (segments[1].role, segments[1].energy_j, segments[1].wall_us),
            (SegmentRole::Reconfigured, Some(3.0), 2_000_000)
        );
    }

    #[test]
    fn windows_of_steps_probe_within_epochs_and_an_epoch_end_cuts_a_window_short() {
        let configs = vec![sys(2, 2), sys(1, 2)];
        let plan = ProbePlan { unit: WindowUnit::Steps, ..plan(configs.clone(), 2, 3, Select::Time) };
        let mut p = Pipeline::new(Some(plan), configs[0].clone(), vec![0, 1]);
        let t = std::cell::Cell::new(0.0);
        let step = |p: &mut Pipeline, epoch: u32, dt: f64| {
            t.set(t.get() + dt);
            p.on_step(at(epoch, t.get(), 0.0))
        };
        // Two warm-up steps, then three under (2, 2) at 0.1 s a step.
        step(&mut p, 0, 0.5);
        assert_eq!(step(&mut p, 0, 0.5), Step::Stay, "warm-up over");
        step(&mut p, 0, 0.1);
        step(&mut p, 0, 0.1);
        assert_eq!(step(&mut p, 0, 0.1), Step::Apply(configs[1].clone()));
        // One step under (1, 2), then the epoch ends: that window is cut and measured again.
        step(&mut p, 0, 0.3);
        t.set(t.get() + 1.0);
        assert_eq!(p.on_epoch(at(1, t.get(), 0.0)), Step::Stay);
        assert!(p.probing());
        step(&mut p, 1, 0.3);
        step(&mut p, 1, 0.3);
        assert_eq!(step(&mut p, 1, 0.3), Step::Apply(configs[0].clone()), "(2, 2) at 0.1 s a step beats 0.3 s");
        let (segments, selected) = p.finish(at(1, t.get(), 0.0));
        assert_eq!(selected, Some(configs[0].clone()));
        let roles: Vec<_> = segments.iter().map(|s| (s.role, s.steps)).collect();
        assert_eq!(
            roles,
            vec![(SegmentRole::Warmup, 2), (SegmentRole::Probe, 3), (SegmentRole::Cut, 1), (SegmentRole::Probe, 3)],
            "the selected segment saw no step yet: not reported"
        );
        assert!((segments[1].us_per_unit() - 100_000.0).abs() < 1.0, "{:?}", segments[1]);
        assert_eq!((segments[3].first_epoch, segments[3].last_epoch), (2, 2), "within epoch 2");
        // Epoch lines do not count when windows count steps, nor steps when they count epochs.
        let mut e = Pipeline::new(Some(plan_epochs()), configs[0].clone(), vec![]);
        assert_eq!(e.on_step(at(0, 0.1, 0.0)), Step::Stay);
        assert!(e.probing());
    }

    #[test]
    fn windows_of_steps_longer_than_an_epoch_shrink_to_an_epochs_steps_and_probing_ends() {
        // Windows of 5 steps, epochs of 3 steps: every window used to be cut,
        // and the trial stayed on the configuration it was probing.
        let configs = vec![sys(2, 2), sys(1, 2)];
        let plan = ProbePlan { unit: WindowUnit::Steps, ..plan(configs.clone(), 0, 5, Select::Time) };
        let mut p = Pipeline::new(Some(plan), configs[0].clone(), vec![0, 1]);
        let mut t = 0.0;
        let mut applied = Vec::new();
        for epoch in 1..=6u32 {
            for _ in 0..3 {
                t += if *p.current() == configs[0] { 0.1 } else { 0.3 };
                if let Step::Apply(s) = p.on_step(at(epoch - 1, t, 0.0)) {
                    applied.push(s);
                }
            }
            if let Step::Apply(s) = p.on_epoch(at(epoch, t, 0.0)) {
                applied.push(s);
            }
        }
        assert_eq!(p.adapted_window(), Some(3), "a whole epoch's steps");
        assert!(!p.probing(), "probing ended");
        let (segments, selected) = p.finish(at(6, t, 0.0));
        assert_eq!(selected, Some(configs[0].clone()), "0.1 s a step beats 0.3 s; {segments:?}");
        assert_eq!(applied, vec![configs[1].clone(), configs[0].clone()]);
    }

    fn plan_epochs() -> ProbePlan {
        plan(vec![sys(2, 2), sys(1, 1)], 0, 1, Select::Time)
    }

    #[test]
    fn a_trial_shorter_than_its_plan_selects_nothing() {
        let configs = vec![sys(2, 2), sys(1, 1)];
        let mut p = Pipeline::new(Some(plan(configs.clone(), 0, 1, Select::Time)), configs[0].clone(), vec![]);
        assert_eq!(p.on_epoch(at(1, 1.0, 0.0)), Step::Apply(configs[1].clone()));
        let (segments, selected) = p.finish(at(1, 1.2, 0.0));
        assert_eq!(selected, None);
        assert_eq!(segments.len(), 1, "the second window saw no epoch");
    }
}
