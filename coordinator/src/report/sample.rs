//! How many rows become a bounded picture: the objective series thinned to
//! a fixed number of points (every improvement of the best so far kept),
//! point clouds binned into a density grid, and each agent's most recent
//! windows laid out in lanes. Pure: plain values in, plain values out.

use std::collections::BTreeMap;

use tunefleet_common::measurement::SegmentRole;
use tunefleet_common::message::SystemParams;

use crate::domain::study::Direction;
use crate::store::WindowRow;

/// The objective over trials, ready to draw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ObjectiveSeries {
    /// `(trial, objective)` to draw as dots, by trial.
    pub points: Vec<(f64, f64)>,
    /// `(trial, best so far)` at each improvement kept, by trial: the best
    /// so far is a step line through them to the last trial.
    pub best: Vec<(f64, f64)>,
    /// The last trial with a finite objective (where the step line ends).
    pub last_trial: f64,
    /// Trials with a finite objective.
    pub total: usize,
    /// Improvements of the best so far among them.
    pub improvements: usize,
    /// `(trial, objective)` of the shown points that miss the study's
    /// constraints, drawn apart (the best so far is of the others).
    pub infeasible: Vec<(f64, f64)>,
}

impl ObjectiveSeries {
    /// True when some points were left out.
    pub fn sampled(&self) -> bool {
        self.points.len() < self.total
    }

    /// True when some improvements were left out (more than half the
    /// budget improved on the one before: a near-monotone study).
    pub fn improvements_thinned(&self) -> bool {
        self.best.len() < self.improvements
    }
}

/// Every `stride`-th index of `0..n` (`stride` at least 1) such that at
/// most `max` are kept, always with the first and the last.
fn stride_keep(n: usize, max: usize) -> Vec<usize> {
    if n <= max {
        return (0..n).collect();
    }
    if max < 2 {
        return (0..n.min(max)).collect();
    }
    let stride = (n - 1).div_ceil(max - 1);
    let mut kept: Vec<usize> = (0..n).step_by(stride).collect();
    if kept.last() != Some(&(n - 1)) {
        kept.push(n - 1);
    }
    kept
}

/// The objective series of `points` (`(trial, objective)` by trial) in at
/// most `max` dots: every improvement of the best so far (thinned by a
/// stride too when they alone take more than half of `max`), then a
/// deterministic stride over the other trials for the rest. Non-finite
/// values are left out.
pub fn objective_series(points: &[(u64, f64)], direction: Direction, max: usize) -> ObjectiveSeries {
    objective_series_feasible(points, &std::collections::HashSet::new(), direction, max)
}

/// [`objective_series`] of a study with constraints: the trials in
/// `infeasible` are shown apart and never the best so far.
pub fn objective_series_feasible(
    points: &[(u64, f64)],
    infeasible: &std::collections::HashSet<u64>,
    direction: Direction,
    max: usize,
) -> ObjectiveSeries {
    let finite: Vec<(f64, f64)> = points.iter().filter(|p| p.1.is_finite()).map(|&(t, v)| (t as f64, v)).collect();
    let missed = |i: usize| infeasible.contains(&(finite[i].0 as u64));
    let mut best_so_far: Option<f64> = None;
    let mut improved = Vec::new();
    let mut others = Vec::new();
    for (i, &(_, v)) in finite.iter().enumerate() {
        if !missed(i) && best_so_far.is_none_or(|b| direction.better(v, b)) {
            best_so_far = Some(v);
            improved.push(i);
        } else {
            others.push(i);
        }
    }
    let best: Vec<usize> = stride_keep(improved.len(), max / 2).into_iter().map(|k| improved[k]).collect();
    let room = max.saturating_sub(best.len());
    let mut shown: Vec<usize> = stride_keep(others.len(), room).into_iter().map(|k| others[k]).collect();
    shown.extend(&best);
    shown.sort_unstable();
    ObjectiveSeries {
        points: shown.iter().filter(|&&i| !missed(i)).map(|&i| finite[i]).collect(),
        infeasible: shown.iter().filter(|&&i| missed(i)).map(|&i| finite[i]).collect(),
        best: best.iter().map(|&i| finite[i]).collect(),
        last_trial: finite.last().map_or(0.0, |p| p.0),
        total: finite.len(),
        improvements: improved.len(),
    }
}

/// Counts of points per cell of a `cols` x `rows` grid over
/// `[x0, x1] x [y0, y1]`: `(col, row, count)` for the cells that hold any,
/// row 0 at the bottom. Points outside the ranges or not finite are left out.
pub fn density(
    points: &[(f64, f64)],
    x: (f64, f64),
    y: (f64, f64),
    cols: usize,
    rows: usize,
) -> Vec<(usize, usize, u64)> {
    let cell = |v: f64, (lo, hi): (f64, f64), n: usize| -> Option<usize> {
        if !v.is_finite() || v < lo || v > hi || n == 0 {
            return None;
        }
        let span = hi - lo;
        let at = if span > 0.0 { ((v - lo) / span * n as f64) as usize } else { 0 };
        Some(at.min(n - 1))
    };
    let mut counts: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for &(px, py) in points {
        if let (Some(c), Some(r)) = (cell(px, x, cols), cell(py, y, rows)) {
            *counts.entry((c, r)).or_default() += 1;
        }
    }
    counts.into_iter().map(|((c, r), n)| (c, r, n)).collect()
}

/// One window placed on its agent's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub trial: u64,
    /// `None`: a whole trial without segments.
    pub role: Option<SegmentRole>,
    /// Index into [`Timeline::configs`].
    pub config: usize,
    pub lane: usize,
    pub start_us: u64,
    pub wall_us: u64,
    pub energy_j: Option<f64>,
    /// The probe window whose configuration the trial kept.
    pub chosen: bool,
}

/// One agent's row of lanes (a lane per trial running at once).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentLanes {
    pub agent: String,
    pub lanes: usize,
    pub bars: Vec<Bar>,
    /// Windows read for this agent, before keeping the most recent ones.
    pub windows_read: usize,
}

/// Agents' windows laid out for drawing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// By agent name.
    pub agents: Vec<AgentLanes>,
    /// Agents with windows, shown or not.
    pub agents_total: usize,
    /// Each configuration as text, with how many shown windows ran under
    /// it; most used first.
    pub configs: Vec<(String, usize)>,
    /// Earliest start and latest end of the shown windows (µs).
    pub span_us: (u64, u64),
}

/// A system configuration in a few words (`cores=2 threads=1`), `unknown`
/// when a window does not say.
pub fn system_text(system: Option<&SystemParams>) -> String {
    system.map_or_else(|| "unknown".to_string(), crate::domain::params::system_text)
}

/// Lays out `windows`: each agent's `per_agent` most recent windows, for
/// the `max_agents` agents active most recently; a trial's windows share a
/// lane, and trials that overlap in time get different lanes.
pub fn timeline(windows: &[WindowRow], per_agent: usize, max_agents: usize) -> Timeline {
    let mut by_agent: BTreeMap<&str, Vec<&WindowRow>> = BTreeMap::new();
    for w in windows {
        by_agent.entry(w.agent.as_str()).or_default().push(w);
    }
    let agents_total = by_agent.len();
    let end = |w: &WindowRow| w.start_us.saturating_add(w.wall_us);
    let mut recent: Vec<(&str, u64)> =
        by_agent.iter().map(|(a, ws)| (*a, ws.iter().map(|w| end(w)).max().unwrap_or(0))).collect();
    recent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    recent.truncate(max_agents);
    let kept: Vec<(&str, Vec<&WindowRow>)> = recent
        .iter()
        .map(|(agent, _)| {
            let mut ws = by_agent.get(agent).cloned().unwrap_or_default();
            ws.sort_by_key(|w| std::cmp::Reverse((w.start_us, w.trial)));
            ws.truncate(per_agent);
            ws.reverse();
            (*agent, ws)
        })
        .collect();

    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (_, ws) in &kept {
        for w in ws {
            *counts.entry(system_text(w.system.as_ref())).or_default() += 1;
        }
    }
    let mut configs: Vec<(String, usize)> = counts.into_iter().collect();
    configs.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let index: BTreeMap<&str, usize> = configs.iter().enumerate().map(|(i, (c, _))| (c.as_str(), i)).collect();

    let mut span: Option<(u64, u64)> = None;
    let mut agents: Vec<AgentLanes> = kept
        .iter()
        .map(|(agent, ws)| {
            for w in ws {
                let (lo, hi) = span.unwrap_or((w.start_us, end(w)));
                span = Some((lo.min(w.start_us), hi.max(end(w))));
            }
            let (lanes, lane_of) = lanes(ws);
            let chosen = chosen_windows(ws);
            let bars = ws
                .iter()
                .enumerate()
                .map(|(i, w)| Bar {
                    trial: w.trial,
                    role: w.role,
                    config: index.get(system_text(w.system.as_ref()).as_str()).copied().unwrap_or(0),
                    lane: lane_of.get(&w.trial).copied().unwrap_or(0),
                    start_us: w.start_us,
                    wall_us: w.wall_us,
                    energy_j: w.energy_j,
                    chosen: chosen.contains(&i),
                })
                .collect();
            AgentLanes {
                agent: (*agent).to_string(),
                lanes,
                bars,
                windows_read: by_agent.get(agent).map_or(0, Vec::len),
            }
        })
        .collect();
    agents.sort_by(|a, b| a.agent.cmp(&b.agent));
    Timeline { agents, agents_total, configs, span_us: span.unwrap_or((0, 0)) }
}

/// Lanes for the trials of `windows` (one agent's, by start): the number of
/// lanes and each trial's lane. A trial takes the first lane free at its start.
fn lanes(windows: &[&WindowRow]) -> (usize, BTreeMap<u64, usize>) {
    let mut spans: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for w in windows {
        let e = spans.entry(w.trial).or_insert((w.start_us, w.start_us));
        e.0 = e.0.min(w.start_us);
        e.1 = e.1.max(w.start_us.saturating_add(w.wall_us));
    }
    let mut order: Vec<(u64, (u64, u64))> = spans.into_iter().collect();
    order.sort_by_key(|&(trial, (start, _))| (start, trial));
    let mut lane_ends: Vec<u64> = Vec::new();
    let mut lane_of = BTreeMap::new();
    for (trial, (start, stop)) in order {
        let lane = match lane_ends.iter().position(|&e| e <= start) {
            Some(l) => l,
            None => {
                lane_ends.push(0);
                lane_ends.len() - 1
            }
        };
        lane_ends[lane] = stop;
        lane_of.insert(trial, lane);
    }
    (lane_ends.len().max(1), lane_of)
}

/// Indices of the probe windows each trial kept: its last probe window
/// under the configuration the trial chose.
fn chosen_windows(windows: &[&WindowRow]) -> Vec<usize> {
    let mut last: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, w) in windows.iter().enumerate() {
        if w.role == Some(SegmentRole::Probe) && w.chosen.is_some() && w.system == w.chosen {
            last.insert(w.trial, i);
        }
    }
    last.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_series_is_kept_whole_with_its_improvements() {
        let s = objective_series(&[(0, 5.0), (1, 7.0), (2, 3.0), (3, f64::NAN), (4, 3.0)], Direction::Minimize, 100);
        assert_eq!(s.points, vec![(0.0, 5.0), (1.0, 7.0), (2.0, 3.0), (4.0, 3.0)], "NaN left out");
        assert_eq!(s.best, vec![(0.0, 5.0), (2.0, 3.0)], "a tie is no improvement");
        assert_eq!((s.total, s.improvements, s.last_trial), (4, 2, 4.0));
        assert!(!s.sampled());
        let up = objective_series(&[(0, 5.0), (1, 7.0)], Direction::Maximize, 100);
        assert_eq!(up.best, vec![(0.0, 5.0), (1.0, 7.0)]);
        assert_eq!(objective_series(&[], Direction::Minimize, 10), ObjectiveSeries::default());
    }

    #[test]
    fn a_long_series_keeps_every_improvement_and_a_stride_of_the_rest() {
        // 100,000 trials, improving at powers of two.
        let points: Vec<(u64, f64)> =
            (0..100_000u64).map(|t| (t, if t.is_power_of_two() { -(t as f64) } else { 1.0 })).collect();
        let s = objective_series(&points, Direction::Minimize, 2000);
        assert!(s.points.len() <= 2000 && s.points.len() > 1900, "{}", s.points.len());
        assert_eq!(s.improvements, 18, "trial 0 (1.0), then 1, 2, 4 ... 65536");
        assert_eq!(s.best.len(), 18);
        assert!(s.best.iter().all(|b| s.points.contains(b)), "every improvement is drawn");
        assert!(s.points.windows(2).all(|w| w[0].0 < w[1].0), "by trial");
        assert_eq!(s.points.last(), Some(&(99_999.0, 1.0)), "the last trial is drawn");
        assert_eq!(s.last_trial, 99_999.0);
        assert!(s.sampled() && !s.improvements_thinned());
        assert_eq!(objective_series(&points, Direction::Minimize, 2000), s, "deterministic");
    }

    #[test]
    fn a_monotone_series_thins_its_improvements_too() {
        let points: Vec<(u64, f64)> = (0..10_000u64).map(|t| (t, -(t as f64))).collect();
        let s = objective_series(&points, Direction::Minimize, 1000);
        assert!(s.points.len() <= 1000);
        assert!(s.best.len() <= 500 && s.improvements_thinned());
        assert_eq!(s.best.first(), Some(&(0.0, 0.0)));
        assert_eq!(s.best.last(), Some(&(9999.0, -9999.0)), "the final best is always kept");
    }

    #[test]
    fn density_counts_points_per_cell_and_skips_what_is_out() {
        let pts = [(0.0, 0.0), (0.1, 0.1), (1.0, 1.0), (f64::NAN, 0.5), (2.0, 0.5), (0.5, f64::INFINITY)];
        assert_eq!(density(&pts, (0.0, 1.0), (0.0, 1.0), 2, 2), vec![(0, 0, 2), (1, 1, 1)]);
        assert_eq!(density(&[(3.0, 3.0)], (3.0, 3.0), (3.0, 3.0), 4, 4), vec![(0, 0, 1)], "a single point");
    }

    fn window(agent: &str, trial: u64, role: Option<SegmentRole>, cores: u32, start_us: u64) -> WindowRow {
        WindowRow {
            agent: agent.into(),
            trial,
            role,
            system: Some(SystemParams { cores: Some(cores), ..SystemParams::default() }),
            start_us,
            wall_us: 10,
            energy_j: None,
            chosen: Some(SystemParams { cores: Some(2), ..SystemParams::default() }),
        }
    }

    #[test]
    fn timelines_keep_recent_windows_in_lanes_and_mark_the_chosen_probe() {
        let probe = Some(SegmentRole::Probe);
        let ws = vec![
            window("a", 1, probe, 1, 0),
            window("a", 1, probe, 2, 10),
            window("a", 1, Some(SegmentRole::Selected), 2, 20),
            // Overlaps trial 1: a second lane.
            window("a", 2, None, 2, 5),
            // After both: back in the first lane.
            window("a", 3, None, 1, 40),
            window("b", 9, None, 1, 1000),
        ];
        let t = timeline(&ws, 10, 10);
        assert_eq!(t.agents.iter().map(|a| a.agent.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        let a = &t.agents[0];
        assert_eq!(a.lanes, 2);
        let lanes: Vec<(u64, usize)> = a.bars.iter().map(|b| (b.trial, b.lane)).collect();
        assert_eq!(lanes, vec![(1, 0), (2, 1), (1, 0), (1, 0), (3, 0)], "by start");
        let chosen: Vec<(u64, u64)> = a.bars.iter().filter(|b| b.chosen).map(|b| (b.trial, b.start_us)).collect();
        assert_eq!(chosen, vec![(1, 10)], "the probe under the chosen configuration");
        assert_eq!(t.configs, vec![("cores=1".to_string(), 3), ("cores=2".to_string(), 3)], "a tie goes by name");
        assert_eq!(t.span_us, (0, 1010));

        let few = timeline(&ws, 2, 1);
        assert_eq!(few.agents.len(), 1, "the most recently active agent");
        assert_eq!(few.agents[0].agent, "b");
        assert_eq!(few.agents_total, 2);
        let a = timeline(&ws, 2, 10);
        let starts: Vec<u64> = a.agents[0].bars.iter().map(|b| b.start_us).collect();
        assert_eq!(starts, vec![20, 40], "the 2 most recent windows");
        assert_eq!(a.agents[0].windows_read, 5);
        assert_eq!(timeline(&[], 10, 10), Timeline::default());
    }

    #[test]
    fn configurations_read_as_words() {
        assert_eq!(system_text(None), "unknown");
        assert_eq!(system_text(Some(&SystemParams::default())), "default");
        let s = SystemParams { cores: Some(2), threads: Some(4), memory_mib: Some(512) };
        assert_eq!(system_text(Some(&s)), "cores=2 threads=4 memory=512 MiB");
    }
}
