//! The report's charts as hand-written SVG: a linear scale with round
//! ticks, axes, and three kinds of chart (objective over trials, a point
//! cloud with its Pareto front, per-agent timelines). Pure: plain values in,
//! SVG text out.
//!
//! Every coordinate goes through [`Px`], which writes a non-finite value as
//! 0: callers leave NaN and infinity out, and if one slipped through it
//! still never reaches the file. Dots are zero-length path segments with
//! round caps (one `<path>` for thousands of dots), so a chart's size
//! grows by about a dozen bytes a point.

use std::fmt::{self, Write as _};

use tunefleet_common::measurement::SegmentRole;

use super::sample::{ObjectiveSeries, Timeline};

/// Text escaped for HTML and SVG, in element content and in quoted attributes.
#[derive(Debug, Clone, Copy)]
pub struct Esc<'a>(pub &'a str);

impl fmt::Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(i) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..i])?;
            f.write_str(match rest.as_bytes()[i] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[i + 1..];
        }
        f.write_str(rest)
    }
}

/// Width of every chart, in CSS pixels.
pub const WIDTH: f64 = 960.0;
/// Height of the objective and Pareto charts.
pub const HEIGHT: f64 = 360.0;
/// A point cloud larger than this is drawn as a density grid.
pub const MAX_DOTS: usize = 2000;
/// Columns and rows of a density grid.
const GRID: (usize, usize) = (64, 40);

/// Colours of system configurations, most used first (Tableau 10, which
/// stays apart for the common colour blindnesses); the last colour is for
/// every configuration after the first nine.
pub const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];

/// The colour of configuration `i` (by use, most used first).
pub fn config_colour(i: usize) -> &'static str {
    PALETTE[i.min(PALETTE.len() - 1)]
}

/// A coordinate as SVG text: at most one decimal, and 0 for a value that is
/// not finite.
#[derive(Debug, Clone, Copy)]
pub struct Px(pub f64);

impl fmt::Display for Px {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = if self.0.is_finite() { (self.0 * 10.0).round() / 10.0 } else { 0.0 };
        if v == v.trunc() && v.abs() < 1e15 {
            write!(f, "{}", v as i64)
        } else {
            write!(f, "{v:.1}")
        }
    }
}

/// A number for people: four significant digits, exponent notation when
/// very large or small, `-` when not finite.
pub fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "-".to_string();
    }
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        return format!("{v:.3e}");
    }
    let decimals = if a == 0.0 { 0 } else { (3 - a.log10().floor() as i32).clamp(0, 6) as usize };
    trim_zeros(format!("{v:.decimals$}"))
}

fn trim_zeros(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A tick label: as many decimals as the step between ticks needs.
pub(super) fn tick_label(v: f64, step: f64) -> String {
    if step.abs() >= 1e6 || (step != 0.0 && step.abs() < 1e-4) {
        return format!("{v:.2e}");
    }
    let decimals = if step > 0.0 { (-step.log10().floor()).clamp(0.0, 6.0) as usize } else { 0 };
    // Round first so -0.0 prints as 0.
    let v = if v.abs() < step * 1e-9 { 0.0 } else { v };
    format!("{v:.decimals$}")
}

/// A linear map from a data range to a pixel range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scale {
    lo: f64,
    hi: f64,
    from: f64,
    to: f64,
}

impl Scale {
    /// The range of the finite `values` with a little room on each side,
    /// mapped onto `from..to` (pixels). No finite value: `0..1`. One value
    /// (or all equal): a range around it.
    pub fn over(values: impl IntoIterator<Item = f64>, from: f64, to: f64) -> Scale {
        let mut range: Option<(f64, f64)> = None;
        for v in values.into_iter().filter(|v| v.is_finite()) {
            let (lo, hi) = range.unwrap_or((v, v));
            range = Some((lo.min(v), hi.max(v)));
        }
        let (lo, hi) = match range {
            None => (0.0, 1.0),
            Some((lo, hi)) if hi - lo <= f64::EPSILON * lo.abs().max(1.0) => {
                let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
                (lo - pad, hi + pad)
            }
            Some((lo, hi)) => {
                let pad = (hi - lo) * 0.04;
                (lo - pad, hi + pad)
            }
        };
        // A range too wide for f64 arithmetic (values near f64::MAX).
        let (lo, hi) = if (hi - lo).is_finite() { (lo, hi) } else { (-1.0, 1.0) };
        Scale { lo, hi, from, to }
    }

    /// The pixel of `v`.
    pub fn at(&self, v: f64) -> f64 {
        self.from + (v - self.lo) / (self.hi - self.lo) * (self.to - self.from)
    }

    /// The data range.
    pub fn domain(&self) -> (f64, f64) {
        (self.lo, self.hi)
    }

    /// Round tick values inside the range (about six), and their step.
    pub fn ticks(&self) -> (Vec<f64>, f64) {
        let span = self.hi - self.lo;
        if !(span > 0.0 && span.is_finite()) {
            return (vec![self.lo], 0.0);
        }
        let raw = span / 6.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step =
            [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(magnitude * 10.0);
        let first = (self.lo / step).ceil();
        let ticks = (0..20)
            .map(|i| (first + f64::from(i)) * step)
            .take_while(|t| *t <= self.hi + step * 1e-9)
            .filter(|t| t.is_finite())
            .collect();
        (ticks, step)
    }
}

/// Where a chart draws inside its SVG.
#[derive(Debug, Clone, Copy)]
pub(super) struct Area {
    pub left: f64,
    pub right: f64,
    pub top: f64,
    pub bottom: f64,
}

const PLOT: Area = Area { left: 72.0, right: WIDTH - 16.0, top: 28.0, bottom: HEIGHT - 46.0 };

fn open(out: &mut String, id: &str, label: &str, height: f64) {
    open_sized(out, id, label, WIDTH, height);
}

/// Opens a chart `width` by `height` CSS pixels (it shrinks to its box).
pub(super) fn open_sized(out: &mut String, id: &str, label: &str, width: f64, height: f64) {
    let _ = write!(
        out,
        r#"<svg id="{}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}">"#,
        Esc(id),
        Esc(label),
        w = Px(width),
        h = Px(height),
    );
}

/// A chart with nothing to draw: its frame and `message`, so the page keeps
/// every chart's place and id.
pub fn empty(id: &str, label: &str, message: &str) -> String {
    let mut out = String::new();
    open(&mut out, id, label, 80.0);
    let _ = write!(
        out,
        r#"<rect class="frame" x="1" y="1" width="{}" height="78"/><text class="empty" x="{}" y="45" text-anchor="middle">{}</text></svg>"#,
        Px(WIDTH - 2.0),
        Px(WIDTH / 2.0),
        Esc(message)
    );
    out
}

/// Grid lines, ticks and labels of the x axis and, when given, the y axis.
pub(super) fn axes(out: &mut String, area: Area, x: &Scale, y: Option<&Scale>, x_label: &str, y_label: &str) {
    framed_axes(out, area, &numeric_ticks(x), &y.map(numeric_ticks).unwrap_or_default(), (x_label, y_label));
}

/// Pixel positions and labels of a numeric scale's ticks.
pub(super) fn numeric_ticks(scale: &Scale) -> Vec<(f64, String)> {
    let (ticks, step) = scale.ticks();
    ticks.into_iter().map(|t| (scale.at(t), tick_label(t, step))).collect()
}

/// Axes of a plot: `x` and `y` ticks (pixel, label), grid lines, the frame and labels.
pub(super) fn framed_axes(
    out: &mut String,
    area: Area,
    x: &[(f64, String)],
    y: &[(f64, String)],
    labels: (&str, &str),
) {
    out.push_str(r#"<g class="axes">"#);
    for (px, text) in x {
        let _ = write!(
            out,
            r#"<line class="grid" x1="{p}" x2="{p}" y1="{}" y2="{}"/><text x="{p}" y="{}" text-anchor="middle">{}</text>"#,
            Px(area.top),
            Px(area.bottom),
            Px(area.bottom + 16.0),
            Esc(text),
            p = Px(*px)
        );
    }
    for (py, text) in y {
        let _ = write!(
            out,
            r#"<line class="grid" x1="{}" x2="{}" y1="{p}" y2="{p}"/><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            Px(area.left),
            Px(area.right),
            Px(area.left - 6.0),
            Px(py + 4.0),
            Esc(text),
            p = Px(*py)
        );
    }
    let _ = write!(
        out,
        r#"<rect class="frame" x="{}" y="{}" width="{}" height="{}"/><text class="label" x="{}" y="{}" text-anchor="middle">{}</text><text class="label" transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text></g>"#,
        Px(area.left),
        Px(area.top),
        Px(area.right - area.left),
        Px(area.bottom - area.top),
        Px((area.left + area.right) / 2.0),
        Px(area.bottom + 38.0),
        Esc(labels.0),
        Px((area.top + area.bottom) / 2.0),
        Esc(labels.1)
    );
}

/// Points as one path of zero-length segments (dots with round caps).
pub(super) fn dots(out: &mut String, class: &str, points: impl Iterator<Item = (f64, f64)>) {
    let _ = write!(out, r#"<path class="{class}" d=""#);
    for (x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
        let _ = write!(out, "M{} {}h0", Px(x), Px(y));
    }
    out.push_str(r#""/>"#);
}

/// The style of the charts drawn here (the report's and the live page's).
pub const CHART_STYLE: &str = "
svg.chart{display:block;max-width:100%;height:auto;margin:6px 0;font-size:11px}
svg text{fill:#333}svg .label{font-size:12px}svg .empty{fill:#777;font-size:14px}
svg .grid{stroke:#eee}svg .frame{fill:none;stroke:#bbb}
svg .dot{stroke:#4e79a7;stroke-width:5;stroke-linecap:round;stroke-opacity:.6;fill:none}
svg .best{stroke:#e15759;stroke-width:2;fill:none}
svg .dot.infeasible{stroke:#aaa}
svg .curve{stroke:#4e79a7;stroke-opacity:.4;stroke-width:1.2;fill:none}
";

/// The objective of each trial (dots) and the best so far (a step line).
pub fn objective_chart(id: &str, series: &ObjectiveSeries, metric: &str) -> String {
    if series.points.is_empty() && series.infeasible.is_empty() {
        return empty(id, "objective over trials", "No trial with a value for the objective yet.");
    }
    let all = || series.points.iter().chain(&series.infeasible);
    let x = Scale::over(all().map(|p| p.0).chain([series.last_trial]), PLOT.left, PLOT.right);
    let y = Scale::over(all().map(|p| p.1), PLOT.bottom, PLOT.top);
    let mut out = String::with_capacity(series.points.len() * 16 + 4096);
    open(&mut out, id, &format!("{metric} over trials, with the best so far"), HEIGHT);
    axes(&mut out, PLOT, &x, Some(&y), "trial", metric);
    dots(&mut out, "dot", series.points.iter().map(|&(t, v)| (x.at(t), y.at(v))));
    if !series.infeasible.is_empty() {
        dots(&mut out, "dot infeasible", series.infeasible.iter().map(|&(t, v)| (x.at(t), y.at(v))));
    }
    let mut best = series.best.iter();
    if let Some(&(t0, v0)) = best.next() {
        let _ = write!(out, r#"<path class="best" d="M{} {}"#, Px(x.at(t0)), Px(y.at(v0)));
        for &(t, v) in best {
            let _ = write!(out, "H{}V{}", Px(x.at(t)), Px(y.at(v)));
        }
        let _ = write!(out, r#"H{}"/>"#, Px(x.at(series.last_trial)));
    }
    match series.infeasible.is_empty() {
        true => legend(&mut out, &[("dot", "a trial"), ("best", "best so far")]),
        false => legend(&mut out, &[("dot", "feasible"), ("dot infeasible", "infeasible"), ("best", "best feasible")]),
    }
    out.push_str("</svg>");
    out
}

/// Learning curves: each trial's `metric` epoch by epoch, a line a trial.
pub fn curves_chart(id: &str, curves: &[(u64, Vec<(f64, f64)>)], metric: &str) -> String {
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let all = || curves.iter().flat_map(|(_, c)| c.iter().filter(finite));
    if all().next().is_none() {
        return empty(id, "learning curves", "No trial reported its epochs yet.");
    }
    let x = Scale::over(all().map(|p| p.0), PLOT.left, PLOT.right);
    let y = Scale::over(all().map(|p| p.1), PLOT.bottom, PLOT.top);
    let mut out = String::with_capacity(4096 + curves.len() * 256);
    open(&mut out, id, &format!("{metric} epoch by epoch, a line a trial"), HEIGHT);
    axes(&mut out, PLOT, &x, Some(&y), "epoch", metric);
    for (trial, curve) in curves {
        let mut points = curve.iter().filter(finite);
        let Some(&(e0, v0)) = points.next() else { continue };
        let _ = write!(out, r#"<path class="curve" data-trial="{trial}" d="M{} {}"#, Px(x.at(e0)), Px(y.at(v0)));
        for &(e, v) in points {
            let _ = write!(out, "L{} {}", Px(x.at(e)), Px(y.at(v)));
        }
        out.push_str(r#""/>"#);
    }
    out.push_str("</svg>");
    out
}

/// A legend in one row above the plot, at its right: `(class, text)` per entry.
fn legend(out: &mut String, entries: &[(&str, &str)]) {
    const ENTRY: f64 = 120.0;
    let y = PLOT.top - 10.0;
    for (i, (class, text)) in entries.iter().enumerate() {
        let x = PLOT.right - ENTRY * (entries.len() - i) as f64;
        let _ = write!(
            out,
            r#"<path class="{class}" d="M{} {}h{}"/><text x="{}" y="{}">{}</text>"#,
            Px(x + if class.starts_with("dot") { 9.0 } else { 0.0 }),
            Px(y - 4.0),
            if class.starts_with("dot") { "0" } else { "18" },
            Px(x + 24.0),
            Px(y),
            Esc(text)
        );
    }
}

/// Points of a cloud: the feasible ones, and the ones that miss the study's constraints.
pub type Cloud<'a> = (&'a [(f64, f64)], &'a [(f64, f64)]);

/// A point cloud (`points`, all of them, and apart in grey the
/// `infeasible` ones that miss the study's constraints) and its Pareto
/// front (`front`: trial, x, y, by x: of the feasible points), both axes in
/// the units of their labels. A cloud of more than [`MAX_DOTS`] points is
/// drawn as a density grid.
pub fn pareto_chart(
    id: &str,
    label: &str,
    (points, infeasible): Cloud<'_>,
    front: &[(u64, f64, f64)],
    x_label: &str,
    y_label: &str,
) -> String {
    if points.is_empty() && infeasible.is_empty() {
        return empty(id, label, "No trial with a valid energy reading to draw.");
    }
    let all = || points.iter().chain(infeasible);
    let x = Scale::over(all().map(|p| p.0), PLOT.left, PLOT.right);
    let y = Scale::over(all().map(|p| p.1), PLOT.bottom, PLOT.top);
    let mut out = String::with_capacity(points.len().min(MAX_DOTS) * 16 + front.len() * 80 + 8192);
    open(&mut out, id, label, HEIGHT);
    axes(&mut out, PLOT, &x, Some(&y), x_label, y_label);
    if points.len() <= MAX_DOTS {
        dots(&mut out, "dot", points.iter().map(|&(a, b)| (x.at(a), y.at(b))));
    } else {
        let cells = super::sample::density(points, x.domain(), y.domain(), GRID.0, GRID.1);
        let most = cells.iter().map(|c| c.2).max().unwrap_or(1).max(1) as f64;
        let (cw, ch) = ((PLOT.right - PLOT.left) / GRID.0 as f64, (PLOT.bottom - PLOT.top) / GRID.1 as f64);
        out.push_str(r#"<g class="cell">"#);
        for (c, r, n) in cells {
            let _ = write!(
                out,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill-opacity="{:.2}"/>"#,
                Px(PLOT.left + c as f64 * cw),
                Px(PLOT.bottom - (r + 1) as f64 * ch),
                Px(cw),
                Px(ch),
                0.12 + 0.88 * (1.0 + n as f64).ln() / (1.0 + most).ln()
            );
        }
        out.push_str("</g>");
    }
    if !infeasible.is_empty() {
        dots(&mut out, "dot infeasible", infeasible.iter().take(MAX_DOTS).map(|&(a, b)| (x.at(a), y.at(b))));
    }
    let mut steps = front.iter().filter(|p| p.1.is_finite() && p.2.is_finite());
    if let Some(&(_, a0, b0)) = steps.next() {
        let _ = write!(out, r#"<path class="front" d="M{} {}"#, Px(x.at(a0)), Px(y.at(b0)));
        for &(_, a, b) in steps {
            let _ = write!(out, "H{}V{}", Px(x.at(a)), Px(y.at(b)));
        }
        out.push_str(r#""/>"#);
    }
    for &(trial, a, b) in front.iter().filter(|p| p.1.is_finite() && p.2.is_finite()) {
        let _ = write!(
            out,
            r#"<circle class="front-dot" cx="{}" cy="{}" r="3.5"><title>trial {trial}: {} {}, {} {}</title></circle>"#,
            Px(x.at(a)),
            Px(y.at(b)),
            Esc(&fmt_num(a)),
            Esc(x_label),
            Esc(&fmt_num(b)),
            Esc(y_label)
        );
    }
    let cloud = if points.len() <= MAX_DOTS { "dot" } else { "cell-key" };
    match infeasible.is_empty() {
        true => legend(&mut out, &[(cloud, "trials"), ("front", "Pareto front")]),
        false => {
            legend(&mut out, &[(cloud, "feasible"), ("dot infeasible", "infeasible"), ("front", "feasible front")])
        }
    }
    out.push_str("</svg>");
    out
}

const LANE: f64 = 12.0;
const LANE_GAP: f64 = 2.0;
const AGENT_GAP: f64 = 10.0;
const NAMES: f64 = 170.0;

/// `text` in at most `max` characters: its start and its end around an
/// ellipsis when longer (agents' names often differ only at the end).
pub fn shorten(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max || max < 3 {
        return text.to_string();
    }
    let tail = (max - 1) / 2;
    let head = max - 1 - tail;
    let start: String = text.chars().take(head).collect();
    let end: String = text.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// What a window's role is called on the page and in its CSS class
/// (`warmup`, `probe`, `selected`...; `whole` for a whole trial).
pub fn role_name(role: Option<SegmentRole>) -> String {
    role.map_or_else(|| "whole".to_string(), |r| format!("{r:?}").to_lowercase())
}

/// Each agent's windows as bars over time, coloured by configuration, a
/// lane per trial running at once; the probe window a trial kept is
/// outlined and marked. `x_label` names the time axis (seconds since the
/// start of the earliest window).
pub fn timeline_chart(id: &str, tl: &Timeline, x_label: &str) -> String {
    if tl.agents.is_empty() {
        return empty(id, "windows per agent", "No measured window yet.");
    }
    let rows: f64 = tl.agents.iter().map(|a| a.lanes as f64 * (LANE + LANE_GAP) + AGENT_GAP).sum();
    let area = Area { left: NAMES, right: WIDTH - 16.0, top: 10.0, bottom: 10.0 + rows };
    let height = area.bottom + 46.0;
    let (t0, t1) = tl.span_us;
    let secs = |us: u64| us.saturating_sub(t0) as f64 / 1e6;
    let x = Scale { lo: 0.0, hi: secs(t1).max(1e-6), from: area.left, to: area.right };
    let mut out = String::with_capacity(tl.agents.iter().map(|a| a.bars.len()).sum::<usize>() * 150 + 8192);
    open(&mut out, id, "windows per agent over time, coloured by system configuration", height);
    axes(&mut out, area, &x, None, x_label, "");
    let mut top = area.top;
    for a in &tl.agents {
        let _ = write!(
            out,
            r#"<text class="agent" x="{}" y="{}" text-anchor="end"><title>{}</title>{}</text>"#,
            Px(area.left - 8.0),
            Px(top + LANE - 2.0),
            Esc(&a.agent),
            Esc(&shorten(&a.agent, 24))
        );
        for b in &a.bars {
            let bx = x.at(secs(b.start_us));
            let bw = (x.at(secs(b.start_us.saturating_add(b.wall_us))) - bx).max(1.0);
            let by = top + b.lane as f64 * (LANE + LANE_GAP);
            let config = tl.configs.get(b.config).map_or("unknown", |c| c.0.as_str());
            let energy = b.energy_j.map_or_else(String::new, |j| format!(", {} J", fmt_num(j)));
            let chosen = if b.chosen { " chosen" } else { "" };
            let role = role_name(b.role);
            let _ = write!(
                out,
                r#"<rect class="w {role}{chosen}" x="{}" y="{}" width="{}" height="{}" fill="{}"><title>trial {} {role}: {}, {} s{}{}</title></rect>"#,
                Px(bx),
                Px(by),
                Px(bw),
                Px(LANE),
                config_colour(b.config),
                b.trial,
                Esc(config),
                fmt_num(b.wall_us as f64 / 1e6),
                Esc(&energy),
                if b.chosen { " (kept)" } else { "" }
            );
            if b.chosen {
                let _ = write!(out, r#"<path class="mark" d="M{} {}l-4 -5h8z"/>"#, Px(bx + bw / 2.0), Px(by));
            }
        }
        top += a.lanes as f64 * (LANE + LANE_GAP) + AGENT_GAP;
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_are_short_and_never_nan() {
        assert_eq!(Px(12.0).to_string(), "12");
        assert_eq!(Px(12.345).to_string(), "12.3");
        assert_eq!(Px(-0.04).to_string(), "0");
        assert_eq!(Px(f64::NAN).to_string(), "0");
        assert_eq!(Px(f64::INFINITY).to_string(), "0");
        assert_eq!(Px(f64::NEG_INFINITY).to_string(), "0");
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(0.912345), "0.9123");
        assert_eq!(fmt_num(12.5), "12.5");
        assert_eq!(fmt_num(1234.56), "1235");
        assert_eq!(fmt_num(2_500_000.0), "2.500e6");
        assert_eq!(fmt_num(f64::NAN), "-");
        assert_eq!(tick_label(0.30000000000000004, 0.1), "0.3");
        assert_eq!(tick_label(-1e-17, 0.1), "0.0");
        assert_eq!(tick_label(200.0, 50.0), "200");
    }

    #[test]
    fn a_scale_over_one_point_or_none_still_has_a_range() {
        for s in [
            Scale::over([5.0], 0.0, 100.0),
            Scale::over([0.0], 0.0, 100.0),
            Scale::over([], 0.0, 100.0),
            Scale::over([f64::NAN, f64::INFINITY], 0.0, 100.0),
            Scale::over([f64::MAX, -f64::MAX], 0.0, 100.0),
        ] {
            let (lo, hi) = s.domain();
            assert!(lo < hi && lo.is_finite() && hi.is_finite(), "{s:?}");
            let (ticks, _) = s.ticks();
            assert!(!ticks.is_empty() && ticks.iter().all(|t| t.is_finite() && s.at(*t).is_finite()), "{s:?}");
        }
        let s = Scale::over([5.0], 0.0, 100.0);
        assert!((s.at(5.0) - 50.0).abs() < 1e-9, "a single point sits in the middle");
    }

    #[test]
    fn ticks_are_round_and_inside_the_range() {
        let s = Scale::over([0.0, 100.0], 0.0, 500.0);
        let (ticks, step) = s.ticks();
        assert_eq!(step, 20.0);
        assert_eq!(ticks, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let flipped = Scale::over([0.0, 1.0], 300.0, 10.0);
        assert!(flipped.at(1.0) < flipped.at(0.0), "y grows upwards");
    }

    #[test]
    fn long_names_keep_their_start_and_end() {
        assert_eq!(shorten("agent-1", 24), "agent-1");
        let long = "t-report-20327-1667373901-a2";
        let short = shorten(long, 24);
        assert_eq!(short.chars().count(), 24);
        assert_eq!(short, "t-report-203…67373901-a2");
        assert_eq!(shorten("ééééééééé", 5), "éé…éé", "characters, not bytes");
    }

    #[test]
    fn an_empty_chart_keeps_its_id() {
        let s = empty("chart-x", "x", "nothing <here>");
        assert!(s.starts_with(r#"<svg id="chart-x""#) && s.ends_with("</svg>"));
        assert!(s.contains("nothing &lt;here&gt;"));
    }
}
