//! The parameter plots of a study's page (`/study/NAME`), as optuna-dashboard
//! and the Ray dashboard draw them: importance as bars, a slice per
//! parameter (the objective against its value), parallel coordinates (a
//! line a trial across every parameter and the objective) and a contour of
//! the objective over two parameters. Pure: plain values in, SVG text out,
//! every coordinate through [`Px`].
//!
//! A parameter's axis ([`ParamAxis`]) is linear, logarithmic (positive
//! values spanning three decades or more: a learning rate) or its
//! categories evenly spaced (text values), so every plot reads a
//! parameter the same way.

use std::fmt::Write as _;

use tunefleet_common::params::ParamValue;

use super::svg::{self, fmt_num, framed_axes, numeric_ticks, open_sized, tick_label, Area, Esc, Px, Scale};

/// How a parameter's values are laid along an axis.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamAxis {
    Linear,
    /// Base-10 logarithm of the value.
    Log,
    /// Text values, sorted, at 0, 1, 2...
    Categories(Vec<String>),
}

impl ParamAxis {
    /// The axis that suits `values` (every value one parameter took).
    pub fn of<'a>(values: impl IntoIterator<Item = &'a ParamValue>) -> ParamAxis {
        let mut texts = std::collections::BTreeSet::new();
        let (mut lo, mut hi, mut any_text) = (f64::INFINITY, f64::NEG_INFINITY, false);
        for v in values {
            texts.insert(v.to_string());
            match v.as_f64() {
                Some(x) if x.is_finite() => (lo, hi) = (lo.min(x), hi.max(x)),
                Some(_) => {}
                None => any_text = true,
            }
        }
        if any_text {
            // A parameter mixing numbers and text (a choice of both) reads as categories.
            return ParamAxis::Categories(texts.into_iter().collect());
        }
        if lo > 0.0 && hi / lo >= 1000.0 {
            ParamAxis::Log
        } else {
            ParamAxis::Linear
        }
    }

    /// Where `v` lies along the axis, in the axis's own unit.
    pub fn coord(&self, v: &ParamValue) -> Option<f64> {
        match self {
            ParamAxis::Categories(names) => {
                let text = v.to_string();
                names.iter().position(|n| *n == text).map(|i| i as f64)
            }
            ParamAxis::Log => v.as_f64().filter(|x| *x > 0.0).map(f64::log10),
            ParamAxis::Linear => v.as_f64().filter(|x| x.is_finite()),
        }
    }

    /// The scale of the axis over `coords`, onto `from..to` pixels.
    fn scale(&self, coords: impl IntoIterator<Item = f64>, from: f64, to: f64) -> Scale {
        match self {
            ParamAxis::Categories(names) => {
                Scale::over([-0.5, names.len().max(1) as f64 - 0.5].into_iter().chain(coords), from, to)
            }
            _ => Scale::over(coords, from, to),
        }
    }

    /// Tick positions (axis units) and their labels.
    fn ticks(&self, scale: &Scale) -> Vec<(f64, String)> {
        match self {
            ParamAxis::Categories(names) => {
                names.iter().enumerate().map(|(i, n)| (i as f64, svg::shorten(n, 14))).collect()
            }
            ParamAxis::Log => {
                let (lo, hi) = scale.domain();
                (lo.ceil() as i32..=hi.floor() as i32).map(|e| (f64::from(e), fmt_num(10f64.powi(e)))).collect()
            }
            ParamAxis::Linear => {
                let (ticks, step) = scale.ticks();
                ticks.into_iter().map(|t| (t, tick_label(t, step))).collect()
            }
        }
    }
}

/// Colour of `t` in 0..=1 on a ramp from dark (0: the best) to light
/// (1: the worst), viridis's stops, which stay apart in grey and for the
/// common colour blindnesses.
pub fn ramp(t: f64) -> String {
    const STOPS: [(f64, f64, f64); 5] =
        [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    let t = if t.is_finite() { t.clamp(0.0, 1.0) } else { 1.0 };
    let at = t * (STOPS.len() - 1) as f64;
    let i = (at.floor() as usize).min(STOPS.len() - 2);
    let f = at - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round().clamp(0.0, 255.0) as u8;
    format!("#{:02x}{:02x}{:02x}", mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Where each objective value falls from the best (0) to the worst (1).
pub fn goodness(values: &[f64], maximize: bool) -> impl Fn(f64) -> f64 {
    let finite = values.iter().copied().filter(|v| v.is_finite());
    let lo = finite.clone().fold(f64::INFINITY, f64::min);
    let hi = finite.fold(f64::NEG_INFINITY, f64::max);
    move |v: f64| {
        let span = hi - lo;
        let t = if span > 0.0 && span.is_finite() { (v - lo) / span } else { 0.0 };
        if maximize {
            1.0 - t
        } else {
            t
        }
    }
}

/// Importance as horizontal bars: `(parameter, share)`, largest first.
pub fn bars_chart(id: &str, label: &str, bars: &[(String, f64)]) -> String {
    if bars.is_empty() {
        return svg::empty(id, label, "Too few trials, or an objective that does not vary, to say.");
    }
    const ROW: f64 = 26.0;
    const NAMES: f64 = 180.0;
    let height = 24.0 + ROW * bars.len() as f64;
    let right = svg::WIDTH - 80.0;
    let mut out = String::with_capacity(256 * bars.len() + 512);
    open_sized(&mut out, id, label, svg::WIDTH, height);
    for (i, (name, share)) in bars.iter().enumerate() {
        let y = 12.0 + ROW * i as f64;
        let w = (right - NAMES) * share.clamp(0.0, 1.0);
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text><rect class="bar" data-name="{}" data-share="{share}" x="{}" y="{}" width="{}" height="{}"><title>{}: {:.3}</title></rect><text x="{}" y="{}">{:.3}</text>"#,
            Px(NAMES - 8.0),
            Px(y + 15.0),
            Esc(&svg::shorten(name, 24)),
            Esc(name),
            Px(NAMES),
            Px(y + 2.0),
            Px(w.max(1.0)),
            Px(ROW - 8.0),
            Esc(name),
            share,
            Px(NAMES + w + 6.0),
            Px(y + 15.0),
            share,
        );
    }
    out.push_str("</svg>");
    out
}

/// The width and height of one slice.
const SLICE: (f64, f64) = (420.0, 280.0);
const SLICE_AREA: Area = Area { left: 64.0, right: SLICE.0 - 12.0, top: 14.0, bottom: SLICE.1 - 44.0 };

/// Pixel positions and labels of a parameter axis's ticks.
fn param_ticks(axis: &ParamAxis, scale: &Scale) -> Vec<(f64, String)> {
    axis.ticks(scale).into_iter().map(|(t, text)| (scale.at(t), text)).collect()
}

/// One slice: the objective of each trial against `param`'s value;
/// `points` are (value, objective, feasible).
pub fn slice_chart(id: &str, param: &str, metric: &str, points: &[(&ParamValue, f64, bool)]) -> String {
    let axis = ParamAxis::of(points.iter().map(|p| p.0));
    let placed: Vec<(f64, f64, bool)> =
        points.iter().filter_map(|&(v, y, ok)| Some((axis.coord(v)?, y, ok))).filter(|p| p.1.is_finite()).collect();
    let label = format!("{metric} against {param}");
    let mut out = String::with_capacity(placed.len() * 14 + 2048);
    open_sized(&mut out, id, &label, SLICE.0, SLICE.1);
    let x = axis.scale(placed.iter().map(|p| p.0), SLICE_AREA.left, SLICE_AREA.right);
    let y = Scale::over(placed.iter().map(|p| p.1), SLICE_AREA.bottom, SLICE_AREA.top);
    let name = match axis {
        ParamAxis::Log => format!("{param} (log scale)"),
        _ => param.to_string(),
    };
    framed_axes(&mut out, SLICE_AREA, &param_ticks(&axis, &x), &numeric_ticks(&y), (&name, metric));
    let _ = write!(out, r#"<g data-points="{}">"#, placed.len());
    svg::dots(&mut out, "dot", placed.iter().filter(|p| p.2).map(|p| (x.at(p.0), y.at(p.1))));
    if placed.iter().any(|p| !p.2) {
        svg::dots(&mut out, "dot infeasible", placed.iter().filter(|p| !p.2).map(|p| (x.at(p.0), y.at(p.1))));
    }
    out.push_str("</g></svg>");
    out
}

/// Height of the parallel coordinates and the contour.
const TALL: f64 = 400.0;

/// Parallel coordinates: an axis a parameter and the objective last; a
/// line a trial, coloured from the best (dark) to the worst (light), a
/// trial that misses the study's constraints dashed in grey. `trials` are
/// (trial, its value of each parameter in `params`' order, objective,
/// feasible).
pub fn parallel_chart(
    id: &str,
    params: &[&str],
    metric: &str,
    maximize: bool,
    trials: &[(u64, Vec<Option<&ParamValue>>, f64, bool)],
) -> String {
    let label = format!("parallel coordinates of {} parameters and {metric}", params.len());
    if trials.is_empty() || params.is_empty() {
        return svg::empty(id, &label, "No trial with parameters and a value for the objective yet.");
    }
    let area = Area { left: 60.0, right: svg::WIDTH - 60.0, top: 40.0, bottom: TALL - 40.0 };
    let columns = params.len() + 1;
    let xs: Vec<f64> =
        (0..columns).map(|i| area.left + (area.right - area.left) * i as f64 / (columns - 1) as f64).collect();
    let axes: Vec<ParamAxis> =
        (0..params.len()).map(|i| ParamAxis::of(trials.iter().filter_map(|t| t.1.get(i).copied().flatten()))).collect();
    let scales: Vec<Scale> = axes
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let coords = trials.iter().filter_map(|t| a.coord(t.1.get(i).copied().flatten()?));
            a.scale(coords.collect::<Vec<_>>(), area.bottom, area.top)
        })
        .collect();
    let objective: Vec<f64> = trials.iter().map(|t| t.2).collect();
    let y_obj = Scale::over(objective.iter().copied(), area.bottom, area.top);
    let good = goodness(&objective, maximize);
    let mut out = String::with_capacity(trials.len() * (24 + 14 * columns) + 4096);
    open_sized(&mut out, id, &label, svg::WIDTH, TALL);
    // The worst first, so the best lines are drawn on top.
    let mut order: Vec<usize> = (0..trials.len()).filter(|&i| trials[i].2.is_finite()).collect();
    // Infeasible lines under the feasible ones.
    order.sort_by(|&a, &b| {
        (trials[a].3, good(trials[b].2))
            .partial_cmp(&(trials[b].3, good(trials[a].2)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    out.push_str(r#"<g class="lines">"#);
    for i in order {
        let (trial, values, y, feasible) = &trials[i];
        let mut d = String::new();
        for (k, ((axis, scale), value)) in axes.iter().zip(&scales).zip(values).enumerate() {
            let Some(c) = value.and_then(|v| axis.coord(v)) else { continue };
            let _ = write!(d, "{}{} {}", if d.is_empty() { "M" } else { "L" }, Px(xs[k]), Px(scale.at(c)));
        }
        let _ = write!(d, "{}{} {}", if d.is_empty() { "M" } else { "L" }, Px(xs[columns - 1]), Px(y_obj.at(*y)));
        match feasible {
            true => {
                let _ = write!(out, r#"<path class="pc" data-trial="{trial}" stroke="{}" d="{d}"/>"#, ramp(good(*y)));
            }
            false => {
                let _ = write!(out, r#"<path class="pc infeasible" data-trial="{trial}" d="{d}"/>"#);
            }
        }
    }
    out.push_str("</g>");
    let named = params.iter().map(|p| (*p, None)).chain([(metric, Some(&y_obj))]);
    for (k, (name, objective_axis)) in named.enumerate() {
        let x = Px(xs[k]);
        let _ = write!(
            out,
            r#"<g class="axes"><line class="frame" x1="{x}" x2="{x}" y1="{}" y2="{}"/><text class="label" x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            Px(area.top),
            Px(area.bottom),
            Px(area.top - 16.0),
            Esc(&svg::shorten(name, 18)),
        );
        let ticks = match objective_axis {
            Some(scale) => numeric_ticks(scale),
            None => param_ticks(&axes[k], &scales[k]),
        };
        for (py, text) in ticks {
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                Px(xs[k] - 4.0),
                Px(py + 4.0),
                Esc(&text)
            );
        }
        out.push_str("</g>");
    }
    out.push_str("</svg>");
    out
}

/// Columns and rows of the contour's grid.
const CONTOUR_GRID: (usize, usize) = (48, 30);

/// The objective over two parameters: a grid each cell of which is the
/// inverse-distance-weighted mean of the trials (in the axes' units,
/// scaled to the plot), coloured best (dark) to worst (light), and the
/// trials as dots. `points` are (x value, y value, objective, feasible):
/// where the trials nearest a cell mostly miss the study's constraints
/// (the same weighting of feasibility below one half), the cell is
/// hatched: the feasible region is what is left clear.
pub fn contour_chart(
    id: &str,
    names: (&str, &str),
    metric: &str,
    maximize: bool,
    points: &[(&ParamValue, &ParamValue, f64, bool)],
) -> String {
    let label = format!("{metric} over {} and {}", names.0, names.1);
    let ax = ParamAxis::of(points.iter().map(|p| p.0));
    let ay = ParamAxis::of(points.iter().map(|p| p.1));
    let placed: Vec<(f64, f64, f64, bool)> = points
        .iter()
        .filter_map(|&(a, b, v, ok)| Some((ax.coord(a)?, ay.coord(b)?, v, ok)))
        .filter(|p| p.2.is_finite())
        .collect();
    if placed.len() < 2 {
        return svg::empty(id, &label, "Too few trials with both parameters and a value to draw.");
    }
    let area = Area { left: 72.0, right: svg::WIDTH - 90.0, top: 14.0, bottom: TALL - 44.0 };
    let x = ax.scale(placed.iter().map(|p| p.0), area.left, area.right);
    let y = ay.scale(placed.iter().map(|p| p.1), area.bottom, area.top);
    let values: Vec<f64> = placed.iter().map(|p| p.2).collect();
    let good = goodness(&values, maximize);
    let mut out = String::with_capacity(CONTOUR_GRID.0 * CONTOUR_GRID.1 * 80 + placed.len() * 14 + 4096);
    open_sized(&mut out, id, &label, svg::WIDTH, TALL);
    let (cw, ch) = ((area.right - area.left) / CONTOUR_GRID.0 as f64, (area.bottom - area.top) / CONTOUR_GRID.1 as f64);
    // Distances in pixels, so both axes weigh alike whatever their units.
    let pixels: Vec<(f64, f64, f64)> = placed.iter().map(|p| (x.at(p.0), y.at(p.1), p.2)).collect();
    let constrained = placed.iter().any(|p| !p.3);
    let feasibility: Vec<(f64, f64, f64)> =
        placed.iter().map(|p| (x.at(p.0), y.at(p.1), if p.3 { 1.0 } else { 0.0 })).collect();
    let mut hatched = Vec::new();
    out.push_str(r#"<g class="cells">"#);
    for r in 0..CONTOUR_GRID.1 {
        for c in 0..CONTOUR_GRID.0 {
            let (px, py) = (area.left + (c as f64 + 0.5) * cw, area.top + (r as f64 + 0.5) * ch);
            let v = weighted(&pixels, px, py);
            if constrained && weighted(&feasibility, px, py) < 0.5 {
                hatched.push((area.left + c as f64 * cw, area.top + r as f64 * ch));
            }
            let _ = write!(
                out,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>"#,
                Px(area.left + c as f64 * cw),
                Px(area.top + r as f64 * ch),
                Px(cw + 0.5),
                Px(ch + 0.5),
                ramp(good(v))
            );
        }
    }
    out.push_str("</g>");
    if constrained {
        let _ = write!(
            out,
            r##"<defs><pattern id="{id}-hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff" fill-opacity=".45"/><line x1="0" y1="0" x2="0" y2="6" stroke="#555" stroke-width="1.5"/></pattern></defs><g class="infeasible-region" data-cells="{}">"##,
            hatched.len()
        );
        for (hx, hy) in &hatched {
            let _ = write!(
                out,
                r#"<rect x="{}" y="{}" width="{}" height="{}" fill="url(#{id}-hatch)"/>"#,
                Px(*hx),
                Px(*hy),
                Px(cw + 0.5),
                Px(ch + 0.5)
            );
        }
        out.push_str("</g>");
    }
    framed_axes(&mut out, area, &param_ticks(&ax, &x), &param_ticks(&ay, &y), names);
    let _ = write!(out, r#"<g data-points="{}">"#, placed.len());
    svg::dots(&mut out, "dot contour-dot", placed.iter().filter(|p| p.3).map(|p| (x.at(p.0), y.at(p.1))));
    if constrained {
        svg::dots(&mut out, "dot infeasible", placed.iter().filter(|p| !p.3).map(|p| (x.at(p.0), y.at(p.1))));
    }
    out.push_str("</g>");
    colour_key(&mut out, area, &values, maximize, metric);
    out.push_str("</svg>");
    out
}

/// The inverse-square-distance-weighted mean of `points` (x, y, value) at (px, py).
fn weighted(points: &[(f64, f64, f64)], px: f64, py: f64) -> f64 {
    let (mut sum, mut weights) = (0.0, 0.0);
    for &(x, y, v) in points {
        let d2 = (x - px).powi(2) + (y - py).powi(2);
        if d2 < 1e-9 {
            return v;
        }
        let w = 1.0 / d2;
        sum += w * v;
        weights += w;
    }
    if weights > 0.0 {
        sum / weights
    } else {
        f64::NAN
    }
}

/// A vertical colour bar right of `area` from the best value to the worst.
fn colour_key(out: &mut String, area: Area, values: &[f64], maximize: bool, metric: &str) {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (best, worst) = if maximize { (hi, lo) } else { (lo, hi) };
    let x = area.right + 16.0;
    let steps = 20;
    let h = (area.bottom - area.top) / f64::from(steps);
    for i in 0..steps {
        let _ = write!(
            out,
            r#"<rect x="{}" y="{}" width="14" height="{}" fill="{}"/>"#,
            Px(x),
            Px(area.top + h * f64::from(i)),
            Px(h + 0.5),
            ramp(f64::from(i) / f64::from(steps - 1))
        );
    }
    let _ = write!(
        out,
        r#"<text x="{}" y="{}">{}</text><text x="{}" y="{}">{}</text><text class="key" x="{}" y="{}">{}</text>"#,
        Px(x + 18.0),
        Px(area.top + 10.0),
        Esc(&fmt_num(best)),
        Px(x + 18.0),
        Px(area.bottom),
        Esc(&fmt_num(worst)),
        Px(x),
        Px(area.bottom + 16.0),
        Esc(&svg::shorten(metric, 10)),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_suit_their_values() {
        let lr = [ParamValue::Float(1e-5), ParamValue::Float(0.1)];
        assert_eq!(ParamAxis::of(&lr), ParamAxis::Log);
        assert_eq!(ParamAxis::Log.coord(&lr[1]), Some(-1.0));
        let n = [ParamValue::Int(1), ParamValue::Int(8)];
        assert_eq!(ParamAxis::of(&n), ParamAxis::Linear);
        let mixed = [ParamValue::Text("relu".into()), ParamValue::Int(3), ParamValue::Text("gelu".into())];
        let axis = ParamAxis::of(&mixed);
        assert_eq!(axis, ParamAxis::Categories(vec!["3".into(), "gelu".into(), "relu".into()]));
        assert_eq!(axis.coord(&mixed[0]), Some(2.0));
        assert_eq!(ParamAxis::Linear.coord(&ParamValue::Text("x".into())), None);
    }

    #[test]
    fn the_ramp_runs_dark_to_light_and_goodness_follows_the_direction() {
        assert_eq!(ramp(0.0), "#440154");
        assert_eq!(ramp(1.0), "#fde725");
        assert_eq!(ramp(f64::NAN), "#fde725");
        let min = goodness(&[1.0, 3.0], false);
        assert_eq!((min(1.0), min(3.0)), (0.0, 1.0));
        let max = goodness(&[1.0, 3.0], true);
        assert_eq!((max(1.0), max(3.0)), (1.0, 0.0));
    }

    #[test]
    fn a_slice_has_a_dot_a_trial_and_infeasible_ones_apart() {
        let (a, b, c) = (ParamValue::Float(0.5), ParamValue::Float(1.5), ParamValue::Float(2.0));
        let chart =
            slice_chart("s", "x", "loss", &[(&a, 1.0, true), (&b, 2.0, true), (&c, f64::NAN, true), (&c, 3.0, false)]);
        assert!(chart.contains("data-points=\"3\""), "{chart}");
        let feasible = chart.split("class=\"dot\" d=\"").nth(1).and_then(|d| d.split('"').next()).unwrap_or_default();
        assert_eq!(feasible.matches("h0").count(), 2);
        assert!(chart.contains("class=\"dot infeasible\""));
    }

    #[test]
    fn parallel_coordinates_draw_a_line_a_trial_best_on_top() {
        let (a, b) = (ParamValue::Int(1), ParamValue::Text("adam".into()));
        let (c, d) = (ParamValue::Int(4), ParamValue::Text("sgd".into()));
        let trials = vec![(7, vec![Some(&a), Some(&b)], 0.5, true), (9, vec![Some(&c), Some(&d)], 0.9, true)];
        let chart = parallel_chart("pc", &["n", "opt"], "acc", true, &trials);
        assert_eq!(chart.matches("class=\"pc\"").count(), 2, "{chart}");
        // Maximised: trial 9 is the best, drawn last (on top) and darkest.
        let last = chart.rfind("class=\"pc\"").unwrap_or(0);
        assert!(chart[last..].starts_with("class=\"pc\" data-trial=\"9\" stroke=\"#440154\""), "{chart}");
        assert!(chart.contains(">sgd</text>") && chart.contains(">acc</text>"), "{chart}");
        // Each line crosses three axes.
        let d9 = chart[last..].split(" d=\"").nth(1).and_then(|d| d.split('"').next()).unwrap_or_default();
        assert_eq!(d9.matches('L').count(), 2, "{d9}");
    }

    #[test]
    fn the_contour_interpolates_between_trials_and_keeps_them_exact() {
        assert_eq!(weighted(&[(0.0, 0.0, 1.0), (10.0, 0.0, 3.0)], 0.0, 0.0), 1.0);
        assert!((weighted(&[(0.0, 0.0, 1.0), (10.0, 0.0, 3.0)], 5.0, 0.0) - 2.0).abs() < 1e-12);
        let (x1, x2) = (ParamValue::Float(0.0), ParamValue::Float(1.0));
        let (y1, y2) = (ParamValue::Int(1), ParamValue::Int(5));
        let points = [(&x1, &y1, 1.0, true), (&x2, &y2, 2.0, true), (&x2, &y1, 4.0, true)];
        let chart = contour_chart("c", ("x", "y"), "loss", false, &points);
        assert!(chart.contains("data-points=\"3\""), "{chart}");
        assert_eq!(chart.matches("<rect x=").count(), CONTOUR_GRID.0 * CONTOUR_GRID.1 + 20, "cells and the key");
        assert!(!chart.contains("infeasible-region"), "nothing to hatch");
        let too_few = contour_chart("c", ("x", "y"), "loss", false, &[(&x1, &y1, 1.0, true)]);
        assert!(too_few.contains("Too few trials"));
    }

    /// The half of the plane nearest an infeasible trial is hatched, the
    /// half nearest the feasible one is clear; the infeasible trial is a
    /// grey dot and a grey dashed line.
    #[test]
    fn the_infeasible_region_is_hatched_and_its_trials_grey() {
        let (lo, hi, y) = (ParamValue::Float(0.0), ParamValue::Float(1.0), ParamValue::Float(0.5));
        let (y2, n) = (ParamValue::Float(0.6), ParamValue::Int(1));
        let chart = contour_chart("c", ("x", "y"), "loss", false, &[(&lo, &y, 1.0, true), (&hi, &y2, 2.0, false)]);
        let cells: usize = chart
            .split("data-cells=\"")
            .nth(1)
            .and_then(|c| c.split('"').next())
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let all = CONTOUR_GRID.0 * CONTOUR_GRID.1;
        assert!(cells > all / 3 && cells < all * 2 / 3, "about half: {cells} of {all}");
        assert!(chart.contains("class=\"dot infeasible\""), "{chart}");
        let trials = vec![(1, vec![Some(&n)], 2.0, false), (2, vec![Some(&n)], 1.0, true)];
        let pc = parallel_chart("pc", &["n"], "loss", false, &trials);
        assert!(pc.contains("class=\"pc infeasible\" data-trial=\"1\""), "{pc}");
        assert!(pc.find("data-trial=\"1\"") < pc.find("data-trial=\"2\""), "feasible lines on top: {pc}");
    }

    #[test]
    fn importance_bars_are_as_long_as_their_share() {
        let chart = bars_chart("imp", "importance", &[("lr".into(), 0.75), ("<n>".into(), 0.25)]);
        assert!(chart.contains("data-name=\"lr\" data-share=\"0.75\""), "{chart}");
        assert!(chart.contains("data-name=\"&lt;n&gt;\""), "{chart}");
        let width = |name: &str| {
            let at = chart.find(&format!("data-name=\"{name}\"")).unwrap_or(0);
            chart[at..].split("width=\"").nth(1).and_then(|w| w.split('"').next()).and_then(|w| w.parse::<f64>().ok())
        };
        let (lr, n) = (width("lr").unwrap_or(0.0), width("&lt;n&gt;").unwrap_or(0.0));
        assert!((lr / n - 3.0).abs() < 0.01, "{lr} {n}");
        assert!(bars_chart("imp", "importance", &[]).contains("Too few trials"));
    }
}
