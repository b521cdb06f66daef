//! The report page: sections, tables and notes around the charts of
//! [`super::svg`], with inline CSS. Every text from the store goes through
//! [`Esc`]. Pure: [`page`] turns a [`ReportData`] into the page's text.

use std::collections::HashMap;
use std::fmt::Write as _;

use tunefleet_common::measurement::SegmentRole;
use tunefleet_common::params::Params;

use super::class::summaries;
use super::data::{ReportData, ReuseRow, CHART_IDS, MAX_FRONT, MAX_REUSE_ROWS};
use super::sample::{objective_series_feasible, system_text, timeline, ObjectiveSeries};
use super::svg::{self, config_colour, fmt_num, Esc};
use crate::domain::study::Direction;
use crate::query::best::by_class;
use crate::store::{ProvenanceRow, Ranked};

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

const STYLE: &str = "
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;margin:0 auto;max-width:1000px;padding:16px 20px 40px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 4px}nav a{margin-right:12px}
.meta,.note{color:#555}.note{font-size:13px;margin:4px 0}.warn{color:#a33}
table{border-collapse:collapse;font-size:13px;margin:6px 0;width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ok{color:#2a7a2a}.bad{color:#a33}.est{color:#666;font-style:italic}.small{font-size:12px;color:#555}
.bar{height:10px;background:#4a7ab5}
svg .front{stroke:#e15759;stroke-width:1.5;fill:none}svg .front-dot{fill:#e15759}
svg .cell rect{fill:#4e79a7}svg .cell-key{stroke:#4e79a7;stroke-width:8;stroke-opacity:.6}
svg .w{stroke:none}svg .w.warmup,svg .w.cut{opacity:.45}svg .w.cut{stroke:#333;stroke-dasharray:2 2}
svg .w.probe{stroke:#333;stroke-width:.5}svg .w.chosen{stroke:#000;stroke-width:2}svg .mark{fill:#000}
ul.legend{list-style:none;padding:0;margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 16px;font-size:13px}
.sw{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px;border:1px solid #999}
";

/// The whole page.
pub fn page(data: &ReportData) -> String {
    let mut out = String::with_capacity(256 * 1024);
    let name = data.study.name.as_str();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <link rel=\"icon\" href=\"data:,\"><title>Tunefleet report: {}</title><style>{STYLE}{}</style></head><body>",
        Esc(name),
        svg::CHART_STYLE
    );
    header(&mut out, data);
    objective(&mut out, data);
    pareto(&mut out, data);
    timelines(&mut out, data);
    classes(&mut out, data);
    best(&mut out, data);
    reuse(&mut out, &data.reuse, &data.clusters, &data.study.name);
    let _ = writeln!(
        out,
        "<footer class=\"note\"><p>Made by tunefleet {} on {}. One self-contained file: inline CSS and SVG, no script, \
         nothing fetched.</p></footer></body></html>",
        env!("CARGO_PKG_VERSION"),
        utc(data.generated_ms)
    );
    out
}

fn header(out: &mut String, data: &ReportData) {
    let s = &data.study;
    let finished = s.finished_ms.map_or_else(String::new, |ms| format!(", finished {}", utc(ms)));
    // The same counts as `run`'s summary and `status`: of the study's budget.
    let stopped = s.total.saturating_sub(s.pending + s.running + s.done + s.failed);
    let _ = write!(
        out,
        "<h1>Tunefleet report: {}</h1><p class=\"meta\">Objective <b>{}</b> ({}). Study {}, created {}{finished}. \
         <span id=\"counts\">{}/{} done, {} running, {} held ahead, {} pending, {} failed, {} stopped</span>; {} \
         ranked.</p>",
        Esc(&s.name),
        Esc(&s.metric),
        s.direction,
        s.state,
        utc(s.created_ms),
        s.done,
        data.planned.max(s.total),
        s.running.saturating_sub(s.held),
        s.held,
        s.pending,
        s.failed,
        stopped,
        data.ranked.len()
    );
    if s.failed > 0 {
        let why = crate::domain::failure::summary(s.failed, &data.failures, 5);
        let _ = write!(out, "<p class=\"note warn\" id=\"failures\">{}.</p>", Esc(&why));
    }
    if let Some(note) = crate::query::best::unranked_note(&data.unranked) {
        let _ = write!(out, "<p class=\"note\">{}.</p>", Esc(&note));
    }
    out.push_str(
        "<nav><a href=\"#objective\">Objective</a><a href=\"#pareto\">Pareto fronts</a>\
         <a href=\"#timelines\">Windows per agent</a><a href=\"#classes\">Device classes</a>\
         <a href=\"#best\">Best configurations</a><a href=\"#reuse\">Clusters and reuse</a></nav>",
    );
}

fn objective(out: &mut String, data: &ReportData) {
    let mut points: Vec<(u64, f64)> = data.ranked.iter().map(|r| (r.plan.trial, r.objective())).collect();
    points.sort_by_key(|p| p.0);
    let infeasible =
        data.ranked.iter().filter(|r| r.result.violation.is_some_and(|v| v > 0.0)).map(|r| r.plan.trial).collect();
    let series = objective_series_feasible(&points, &infeasible, data.study.direction, data.options.max_points);
    let _ = write!(out, "<section id=\"objective\"><h2>Objective over trials</h2>");
    out.push_str(&svg::objective_chart(CHART_IDS[0], &series, &data.study.metric));
    let _ = write!(out, "<p class=\"note\">{}</p></section>", Esc(&sampling_note(&series, data.study.direction)));
}

/// How the objective chart was sampled, in a sentence.
fn sampling_note(s: &ObjectiveSeries, direction: Direction) -> String {
    let better = match direction {
        Direction::Minimize => "lower",
        Direction::Maximize => "higher",
    };
    let mut note = format!(
        "{} ranked trials by trial number ({better} is better); the red line is the best so far, which improved {} times.",
        s.total, s.improvements
    );
    if s.sampled() {
        let _ = write!(
            note,
            " Sampled to {} dots: every improvement of the best so far{}, and a deterministic stride over the other trials.",
            s.points.len(),
            if s.improvements_thinned() { " (more than half the dots: thinned by a stride too)" } else { "" }
        );
    } else if s.total > 0 {
        note.push_str(" Every trial is drawn.");
    }
    note
}

fn pareto(out: &mut String, data: &ReportData) {
    out.push_str("<section id=\"pareto\"><h2>Pareto fronts</h2>");
    let valid: Vec<&Ranked> =
        data.ranked.iter().filter(|r| r.energy().counted().is_some() && r.objective().is_finite()).collect();
    let _ = write!(
        out,
        "<p class=\"note\">Ranked trials with a valid energy reading: {} of {}. The front holds the trials no other \
         beats on both axes at once (red; hover a point for its trial).{}</p>",
        valid.len(),
        data.ranked.len(),
        if valid.len() > svg::MAX_DOTS {
            format!(" More than {} trials: the cloud is a density grid, darker where more trials fall.", svg::MAX_DOTS)
        } else {
            String::new()
        }
    );
    if let Some(note) = crate::query::best::mixed_sources(valid.iter().map(|r| r.result.energy.source_name())) {
        let _ = write!(out, "<p class=\"note warn\">{}</p>", Esc(&note));
    }
    let energy = |r: &Ranked| r.result.energy.joules.unwrap_or(f64::NAN);
    // The front is of the results that meet the study's constraints; the others are drawn apart.
    let feasible = |r: &Ranked| !r.result.violation.is_some_and(|v| v > 0.0);
    let estimated = |r: &&Ranked| r.result.energy.estimated();
    if !valid.is_empty() && valid.iter().all(estimated) {
        // Estimated energy is a function of CPU time: against wall time it only draws that function.
        let _ = write!(
            out,
            "<h3>Wall time against energy</h3><p class=\"note\" id=\"{}\">Not drawn: every energy figure here is \
             estimated from CPU time (no RAPL, hwmon, battery or external meter on these agents), so it says nothing \
             time does not. Give the agents a measured source to compare time and energy.</p>",
            CHART_IDS[1]
        );
    } else {
        let wall_time: Vec<(u64, f64, f64, bool)> =
            valid.iter().map(|r| (r.plan.trial, r.result.wall_us as f64 / 1e6, energy(r), feasible(r))).collect();
        front_chart(out, CHART_IDS[1], "Wall time against energy", ("wall time (s)", "energy (J)"), &wall_time, 1.0);
    }
    let metric = data.study.metric.as_str();
    if !valid.is_empty() && valid.iter().all(estimated) && !data.asks_energy {
        // A study that never asked for energy, and only a model of CPU time to show.
        let _ = write!(
            out,
            "<h3>{} against energy</h3><p class=\"note\" id=\"{}\">Not drawn: this study does not ask for energy \
             (its metric, or <code>[objective] also</code>), and every energy figure here is estimated from CPU time, \
             so a front of it would only redraw CPU time.</p>",
            Esc(metric),
            CHART_IDS[2]
        );
    } else {
        let objective: Vec<(u64, f64, f64, bool)> =
            valid.iter().map(|r| (r.plan.trial, energy(r), r.objective(), feasible(r))).collect();
        let sign = if data.study.direction == Direction::Maximize { -1.0 } else { 1.0 };
        front_chart(out, CHART_IDS[2], &format!("{metric} against energy"), ("energy (J)", metric), &objective, sign);
    }
    out.push_str("</section>");
}

/// One Pareto chart: `points` (trial, x, y, feasible) and the front of
/// the feasible ones (the constrained front) that minimise x and `y_sign` x y.
fn front_chart(
    out: &mut String,
    id: &str,
    title: &str,
    labels: (&str, &str),
    points: &[(u64, f64, f64, bool)],
    y_sign: f64,
) {
    let (feasible, infeasible): (Vec<&(u64, f64, f64, bool)>, Vec<_>) = points.iter().partition(|p| p.3);
    let keys: Vec<Vec<f64>> = feasible.iter().map(|p| vec![p.1, y_sign * p.2]).collect();
    let front_idx = tunefleet_search::pareto::front(&keys);
    let stride = front_idx.len().div_ceil(MAX_FRONT).max(1);
    let front: Vec<(u64, f64, f64)> =
        front_idx.iter().step_by(stride).map(|&i| (feasible[i].0, feasible[i].1, feasible[i].2)).collect();
    let cloud: Vec<(f64, f64)> = feasible.iter().map(|p| (p.1, p.2)).collect();
    let grey: Vec<(f64, f64)> = infeasible.iter().map(|p| (p.1, p.2)).collect();
    let _ = write!(out, "<h3>{}</h3>", Esc(title));
    out.push_str(&svg::pareto_chart(id, title, (&cloud, &grey), &front, labels.0, labels.1));
    if !front_idx.is_empty() {
        let drawn = if stride > 1 { format!(", every {stride}th drawn") } else { String::new() };
        let n = front_idx.len();
        // Optuna's reference point: each worst value 10 % further out.
        let volume = tunefleet_search::pareto::reference_point(&keys).map(|r| {
            let on_front: Vec<Vec<f64>> = front_idx.iter().map(|&i| keys[i].clone()).collect();
            (tunefleet_search::pareto::hypervolume(&on_front, &r), r[0], y_sign * r[1])
        });
        let hv = volume.map_or(String::new(), |(v, x, y)| format!("; hypervolume {v:.4} from ({x:.4}, {y:.4})"));
        let _ = write!(out, "<p class=\"note\">Front: {n} trial{}{drawn}{hv}.</p>", if n == 1 { "" } else { "s" });
    }
}

fn timelines(out: &mut String, data: &ReportData) {
    let o = &data.options;
    let tl = timeline(&data.windows, o.windows_per_agent, o.max_agents);
    out.push_str("<section id=\"timelines\"><h2>Windows per agent</h2>");
    let probed = data.windows.iter().any(|w| w.role == Some(SegmentRole::Probe));
    if probed {
        let _ = write!(
            out,
            "<p class=\"note\">Each agent's {} most recent windows (a probe window, the warm-up, the rest under the \
             selected configuration, or a whole trial that ran under one configuration), coloured by the system \
             configuration it ran under; a trial's windows share a lane, trials that ran at once take more lanes. \
             The probe window whose configuration the trial kept is outlined in black and marked with a triangle. \
             Times are on the coordinator's clock.",
            o.windows_per_agent
        );
    } else {
        let _ = write!(
            out,
            "<p class=\"note\">Each agent's {} most recent trials, coloured by the system configuration they ran \
             under; trials that ran at once take more lanes. Times are on the coordinator's clock.",
            o.windows_per_agent
        );
    }
    if tl.agents.len() < tl.agents_total {
        let _ = write!(out, " {} of {} agents shown: the most recently active.", tl.agents.len(), tl.agents_total);
    }
    let cut = tl.agents.iter().filter(|a| a.windows_read > a.bars.len()).count();
    if cut > 0 {
        let _ = write!(out, " {cut} agents have older windows, not shown.");
    }
    out.push_str("</p>");
    let label = format!("seconds since {}", utc(tl.span_us.0 / 1000));
    out.push_str(&svg::timeline_chart(CHART_IDS[3], &tl, &label));
    if !tl.configs.is_empty() {
        out.push_str("<ul class=\"legend\">");
        let others = tl.configs.len().saturating_sub(svg::PALETTE.len() - 1);
        for (i, (config, n)) in tl.configs.iter().enumerate().take(svg::PALETTE.len() - 1) {
            let _ = write!(
                out,
                "<li><span class=\"sw\" style=\"background:{}\"></span>{} ({n} windows)</li>",
                config_colour(i),
                Esc(config)
            );
        }
        if others > 0 {
            let n: usize = tl.configs.iter().skip(svg::PALETTE.len() - 1).map(|c| c.1).sum();
            let _ = write!(
                out,
                "<li><span class=\"sw\" style=\"background:{}\"></span>{others} other configurations ({n} windows)</li>",
                config_colour(svg::PALETTE.len() - 1)
            );
        }
        out.push_str("</ul>");
        if probed {
            out.push_str(
                "<p class=\"note\">Faded: warm-up and cut probe windows (dashed). Thin outline: a probe window.</p>",
            );
        }
    }
    out.push_str("</section>");
}

fn classes(out: &mut String, data: &ReportData) {
    out.push_str("<section id=\"classes\"><h2>Device classes</h2>");
    let groups = by_class(&data.ranked, &data.agents);
    let rows = summaries(&groups);
    if rows.is_empty() {
        out.push_str("<p class=\"empty\" id=\"table-classes\">No ranked trial yet, so no device class to summarise.</p></section>");
        return;
    }
    out.push_str(
        "<p class=\"note\">A device class is the architecture, core count and energy source of the agents that ran \
         the trials (as <code>tunefleet best --by-class</code>): classes are ranked apart.</p>\
         <table id=\"table-classes\"><tr><th>class</th><th>agents</th><th>ranked trials</th><th>best</th>\
         <th>median</th><th>mean wall (s)</th><th>mean energy (J, valid)</th><th>energy sources</th></tr>",
    );
    for c in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{} <span class=\"small\">trial {}</span></td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            Esc(&c.class),
            c.agents,
            c.ranked,
            fmt_num(c.best.objective()),
            c.best.plan.trial,
            fmt_num(c.median_objective),
            fmt_num(c.mean_wall_s),
            c.mean_energy_j.map_or_else(|| "-".to_string(), fmt_num),
            Esc(&c.sources.join(", "))
        );
    }
    out.push_str("</table></section>");
}

fn params_text(params: &Params) -> String {
    crate::domain::params::params_text(params)
}

/// A ranked trial's objective, with its configuration's mean and runs
/// where the configuration ran more than once (what it is ranked by).
fn objective_cell(r: &Ranked) -> String {
    let value = match r.runs {
        0 | 1 => fmt_num(r.objective()),
        n => format!("{} <span class=\"small\">mean {} of {n} runs</span>", fmt_num(r.objective()), fmt_num(r.mean)),
    };
    match r.feasible() {
        true => value,
        false => format!(
            "{value} <span class=\"small\">infeasible: misses its constraints by {}</span>",
            fmt_num(r.mean_violation)
        ),
    }
}

fn list_or_none(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_string()
    } else {
        v.join(", ")
    }
}

fn best(out: &mut String, data: &ReportData) {
    let _ = write!(out, "<section id=\"best\"><h2>Best configurations</h2>");
    let rows: Vec<&Ranked> = data.ranked.iter().take(data.options.best).collect();
    if rows.is_empty() {
        out.push_str("<p class=\"empty\" id=\"table-best\">No ranked trial yet.</p></section>");
        return;
    }
    let provenance: HashMap<u64, &ProvenanceRow> = data.provenance.iter().map(|p| (p.trial, p)).collect();
    let _ = write!(
        out,
        "<p class=\"note\">The {} best of {} ranked trials, with where their figures came from: the energy source and \
         whether its reading is valid, and which counters were hardware (PMU) or software (kernel) events. \
         Configurations are ranked by the mean of their runs, each one's runs best first.</p>",
        rows.len(),
        data.ranked.len()
    );
    if let Some(note) = crate::query::best::mixed_sources(rows.iter().map(|r| r.result.energy.source_name())) {
        let _ = write!(out, "<p class=\"note warn\">{}</p>", Esc(&note));
    }
    let disturbed =
        rows.iter().filter(|r| provenance.get(&r.plan.trial).is_some_and(|p| !p.interference.is_empty())).count();
    if disturbed > 0 {
        let _ = write!(
            out,
            "<p class=\"note warn\" id=\"interference-note\">{disturbed} of these trials ran while their agent was busy \
             with other work (the interference column): their time and energy are inflated and do not compare with \
             the others. Run them again on a quiet machine, or run the study with <code>--offload</code>: the \
             coordinator then measures a disturbed trial again elsewhere.</p>"
        );
    }
    let _ = write!(
        out,
        "<table id=\"table-best\"><tr><th>#</th><th>trial</th><th>{}</th><th>parameters</th><th>system configuration</th>\
         <th>agent</th><th>wall (s)</th><th>energy (J)</th><th>energy source</th><th>counters</th><th>interference</th></tr>",
        Esc(&data.study.metric)
    );
    for (rank, r) in rows.iter().enumerate() {
        let p = provenance.get(&r.plan.trial);
        let estimated = r.result.energy.estimated();
        let validity = match (r.result.energy.valid, p.and_then(|p| p.energy_note.as_deref())) {
            // A model of CPU time is no measurement: never "valid" beside a meter's joules.
            (true, _) if estimated => {
                "<span class=\"est\" title=\"a model of CPU time, not a measurement\">estimate</span>".to_string()
            }
            (true, _) => "<span class=\"ok\">measured</span>".to_string(),
            (false, Some(why)) => {
                format!("<span class=\"bad\">invalid</span> <span class=\"small\">{}</span>", Esc(why))
            }
            (false, None) => "<span class=\"bad\">invalid</span>".to_string(),
        };
        let counters = p.map_or_else(
            || "-".to_string(),
            |p| {
                let mut text = format!(
                    "hardware: {}; software: {}",
                    Esc(&list_or_none(&p.hardware_counters)),
                    Esc(&list_or_none(&p.software_counters))
                );
                if !p.missing_counters.is_empty() {
                    let _ = write!(
                        text,
                        "; <span class=\"small\" title=\"{}\">{} not measured</span>",
                        Esc(&p.missing_counters.join(", ")),
                        p.missing_counters.len()
                    );
                }
                text
            },
        );
        let interference = p.map_or_else(|| "-".to_string(), |p| list_or_none(&p.interference));
        let energy = energy_cell(r.result.energy.joules, p.copied());
        let _ = write!(
            out,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{energy}</td><td>{} {validity}</td><td>{counters}</td><td>{}</td></tr>",
            rank + 1,
            r.plan.trial,
            objective_cell(r),
            Esc(&params_text(&r.plan.params)),
            Esc(&system_text(r.result.system.as_ref())),
            Esc(&r.result.agent),
            fmt_num(r.result.wall_us as f64 / 1e6),
            Esc(&gpu_source(r.result.energy.source_name(), p.copied())),
            Esc(&interference)
        );
    }
    out.push_str("</table>");
    importance(out, data);
    out.push_str("</section>");
}

/// A trial's energy, and for one given GPUs its two parts: the CPU's
/// share and the GPUs' (with the GPUs' share of the whole).
fn energy_cell(whole: Option<f64>, p: Option<&ProvenanceRow>) -> String {
    let Some(whole) = whole else { return "-".to_string() };
    let Some(p) = p.filter(|p| !p.gpus.is_empty()) else { return fmt_num(whole) };
    let gpu: f64 = p.gpus.iter().map(|g| g.joules).sum();
    let share = if whole > 0.0 { format!(", {:.0} % of it", 100.0 * gpu / whole) } else { String::new() };
    format!(
        "{}<br><span class=\"small\">CPU {}, GPU {}{share}</span>",
        fmt_num(whole),
        fmt_num(p.cpu_energy_j),
        fmt_num(gpu)
    )
}

/// The energy source, and NVML's for a trial given GPUs.
fn gpu_source(source: Option<&str>, p: Option<&ProvenanceRow>) -> String {
    let source = source.unwrap_or("none");
    match p.filter(|p| !p.gpus.is_empty()) {
        Some(p) => format!("{source} + nvml ({} GPU{})", p.gpus.len(), if p.gpus.len() == 1 { "" } else { "s" }),
        None => source.to_string(),
    }
}

/// Which parameters mattered ([`crate::domain::importance`]), over every
/// ranked trial: one bar per parameter.
fn importance(out: &mut String, data: &ReportData) {
    let trials: Vec<(Params, f64)> = data.ranked.iter().map(|r| (r.plan.params.clone(), r.objective())).collect();
    let shares = crate::domain::importance::importance(&trials);
    if shares.is_empty() {
        return;
    }
    let _ = write!(
        out,
        "<h3>Which parameters mattered</h3><p class=\"note\">Each parameter's share of the variance of {} that it \
         explains alone over the {} ranked trials (a first-order functional ANOVA; interactions are not \
         attributed; shares sum to 1).</p><table id=\"table-importance\"><tr><th>parameter</th><th>share</th>\
         <th></th></tr>",
        Esc(&data.study.metric),
        trials.len()
    );
    for (name, share) in &shares {
        let width = (share.clamp(0.0, 1.0) * 200.0).round();
        let _ = write!(
            out,
            "<tr><td>{}</td><td class=\"n\">{share:.2}</td><td><div class=\"bar\" style=\"width:{width}px\"></div>\
             </td></tr>",
            Esc(name)
        );
    }
    out.push_str("</table>");
}

fn reuse(out: &mut String, rows: &[ReuseRow], clusters: &[crate::query::profiles::ClusterView], study: &str) {
    out.push_str("<section id=\"reuse\"><h2>Clusters and reuse decisions</h2>");
    if !clusters.is_empty() {
        out.push_str(
            "<table id=\"table-clusters\"><tr><th>device class</th><th>cluster</th><th>members</th>\
             <th>of this study</th><th>workloads</th><th>best configuration per group</th></tr>",
        );
        for c in clusters {
            let own = c.members.iter().filter(|m| m.rsplit_once('/').is_some_and(|(s, _)| s == study)).count();
            let kinds: Vec<String> = c.workloads.iter().map(|(w, n)| format!("{w} x{n}")).collect();
            let best: Vec<String> = c
                .configurations
                .iter()
                .map(|(g, sys, t, from)| format!("{g}: {sys} ({t:.3} x first probe window, {from} jobs)"))
                .collect();
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{own}</td><td>{}</td><td>{}</td></tr>",
                Esc(&c.class),
                c.cluster,
                c.size,
                Esc(&kinds.join(", ")),
                Esc(&best.join("; "))
            );
        }
        out.push_str("</table>");
    }
    if rows.is_empty() {
        out.push_str(
            "<p class=\"empty\" id=\"table-reuse\">No cluster or reuse decision is recorded for this study: \
             every trial chose its configuration by its own search or probe.</p></section>",
        );
        return;
    }
    if rows.len() > MAX_REUSE_ROWS {
        let _ = write!(out, "<p class=\"note\">The first {MAX_REUSE_ROWS} of {} decisions, by trial.</p>", rows.len());
    }
    out.push_str(
        "<table id=\"table-reuse\"><tr><th>trial</th><th>decision</th><th>cluster</th><th>distance</th>\
         <th>threshold</th><th>reason</th></tr>",
    );
    let num = |v: Option<f64>| v.map_or_else(|| "-".to_string(), fmt_num);
    for r in rows.iter().take(MAX_REUSE_ROWS) {
        let _ = write!(
            out,
            "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            r.trial,
            Esc(&r.decision),
            r.cluster.map_or_else(|| "none".to_string(), |c| c.to_string()),
            num(r.distance),
            num(r.threshold),
            Esc(&r.reason)
        );
    }
    out.push_str("</table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::search::TrialPlan;
    use crate::report::Options;
    use crate::store::{Outcome, StoredEnergy, StudyRow, StudyState, Unranked, WindowRow};
    use tunefleet_common::measurement::{EnergySourceKind, SegmentRole};
    use tunefleet_common::message::SystemParams;
    use tunefleet_common::params::ParamValue;

    fn study(name: &str) -> StudyRow {
        StudyRow {
            name: name.into(),
            config: String::new(),
            metric: "accuracy".into(),
            direction: Direction::Maximize,
            created_ms: 1_700_000_000_000,
            finished_ms: None,
            state: StudyState::Running,
            total: 0,
            pending: 0,
            running: 0,
            held: 0,
            done: 0,
            failed: 0,
        }
    }

    fn data(name: &str, ranked: Vec<Ranked>) -> ReportData {
        ReportData {
            study: study(name),
            generated_ms: 1_700_000_100_000,
            ranked,
            unranked: Unranked::default(),
            planned: 0,
            failures: Vec::new(),
            agents: Vec::new(),
            windows: Vec::new(),
            provenance: Vec::new(),
            reuse: Vec::new(),
            clusters: Vec::new(),
            asks_energy: true,
            options: Options::default(),
        }
    }

    fn row(trial: u64, objective: f64, energy: Option<f64>) -> Ranked {
        let source = energy.map(|_| EnergySourceKind::Estimated);
        let stored = StoredEnergy { joules: energy, source, valid: energy.is_some() };
        let mut result = Outcome::for_test("agent-1", Some(objective), 1_000_000 + trial * 1000, stored);
        result.system = Some(SystemParams { cores: Some(2), ..SystemParams::default() });
        Ranked {
            plan: TrialPlan { trial, params: Params::from([("lr".to_string(), ParamValue::Float(0.1))]), repeat: 0 },
            result,
            runs: 1,
            mean: objective,
            mean_violation: 0.0,
        }
    }

    /// The report's fronts are of the results that meet the constraints:
    /// the best-accuracy trial that misses them is a grey dot, off the front.
    #[test]
    fn the_fronts_are_constrained_and_infeasible_trials_drawn_apart() {
        let mut best = row(1, 0.99, Some(5.0));
        best.result.violation = Some(0.2);
        let mut ok = row(2, 0.9, Some(6.0));
        ok.result.violation = Some(0.0);
        let page = page(&data("c", vec![best, ok]));
        let chart = page.split(&format!("id=\"{}\"", CHART_IDS[2])).nth(1).and_then(|c| c.split("</svg>").next());
        let chart = chart.expect("the objective-energy chart");
        assert_eq!(chart.matches("class=\"front-dot\"").count(), 1, "{chart}");
        assert!(chart.contains("<title>trial 2:") && !chart.contains("<title>trial 1:"), "{chart}");
        assert!(chart.contains("class=\"dot infeasible\""), "{chart}");
    }

    /// Every number in an SVG attribute or path parses as a finite number.
    fn assert_no_bad_numbers(page: &str) {
        for bad in ["NaN", "inf", "Infinity"] {
            let in_svg = page.split("<svg").skip(1).any(|s| s.split("</svg>").next().is_some_and(|s| s.contains(bad)));
            assert!(!in_svg, "{bad} in an SVG");
        }
    }

    fn assert_well_formed(page: &str) {
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.trim_end().ends_with("</html>"));
        for id in CHART_IDS.iter().chain(&["table-classes", "table-best", "table-reuse"]) {
            assert!(page.contains(&format!("id=\"{id}\"")), "{id} missing");
        }
        assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
        assert_eq!(page.matches("<section").count(), page.matches("</section>").count());
        assert!(!page.contains("<script"), "no script");
        let namespaces = page.matches("xmlns=\"http://www.w3.org/2000/svg\"").count();
        assert_eq!(page.matches("http").count(), namespaces, "nothing fetched");
        assert_no_bad_numbers(page);
    }

    #[test]
    fn names_with_markup_are_escaped_everywhere() {
        assert_eq!(Esc("a<b>&\"c'").to_string(), "a&lt;b&gt;&amp;&quot;c&#39;");
        assert_eq!(Esc("plain").to_string(), "plain");
        let mut d = data("<script>alert('x')</script> & co", vec![row(0, 0.5, Some(2.0)), row(1, 0.7, Some(3.0))]);
        d.study.metric = "acc<&>".into();
        d.ranked[0].result.agent = "<b>agent</b>".into();
        d.ranked[0].plan.params.insert("mode".into(), ParamValue::Text("\"<fast>\"".into()));
        d.windows = vec![WindowRow {
            agent: "<img src=x>".into(),
            trial: 0,
            role: None,
            system: None,
            start_us: 0,
            wall_us: 10,
            energy_j: None,
            chosen: None,
        }];
        d.reuse = vec![ReuseRow {
            trial: 0,
            decision: "reused<".into(),
            cluster: Some(1),
            distance: Some(0.5),
            threshold: Some(f64::NAN),
            reason: "</table>".into(),
        }];
        d.clusters = vec![crate::query::profiles::ClusterView {
            class: "x86_64, 2 cores, <rapl>".into(),
            cluster: 0,
            size: 2,
            radius: 0.1,
            workloads: [("<train>".to_string(), 2)].into(),
            members: vec![format!("{}/0", d.study.name), "other/3".into()],
            configurations: vec![("{}".into(), "threads=2".into(), 0.5, 2)],
        }];
        let page = page(&d);
        assert_well_formed(&page);
        assert!(page.contains("id=\"table-clusters\""));
        assert!(page.contains("threads=2 (0.500 x first probe window, 2 jobs)"), "a cluster's best configuration");
        for raw in ["<script>", "<b>agent", "<img", "acc<&>", "<fast>", "reused<", "</table></td>", "<rapl>", "<train>"]
        {
            assert!(!page.contains(raw), "{raw} not escaped");
        }
        assert!(page.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co"));
        assert!(page.contains("acc&lt;&amp;&gt;"));
    }

    #[test]
    fn an_empty_study_says_so_in_every_section() {
        let page = page(&data("empty", Vec::new()));
        assert_well_formed(&page);
        assert!(page.contains("No trial with a value for the objective yet."));
        assert_eq!(page.matches("No trial with a valid energy reading to draw.").count(), 2);
        assert!(page.contains("No measured window yet."));
        assert!(page.contains("No ranked trial yet"));
        assert!(page.contains("No cluster or reuse decision is recorded"));
        assert!(page.contains("2023-11-14 22:13:20 UTC"), "the creation time");
    }

    #[test]
    fn a_study_without_energy_draws_its_objective_and_says_why_no_front() {
        let d = data("no-energy", vec![row(1, 0.9, None), row(0, 0.8, None)]);
        let page = page(&d);
        assert_well_formed(&page);
        assert!(page.contains("Ranked trials with a valid energy reading: 0 of 2."));
        assert_eq!(page.matches("No trial with a valid energy reading to draw.").count(), 2);
        assert!(page.contains("class=\"dot\""), "the objective is drawn");
        assert!(page.contains("<td>none <span class=\"bad\">invalid</span></td>"));
    }

    #[test]
    fn a_single_point_draws_every_chart() {
        let mut d = data("one", vec![row(0, 0.5, Some(2.0))]);
        d.windows = vec![WindowRow {
            agent: "agent-1".into(),
            trial: 0,
            role: Some(SegmentRole::Probe),
            system: Some(SystemParams { cores: Some(2), ..SystemParams::default() }),
            start_us: 5_000_000,
            wall_us: 0,
            energy_j: Some(f64::INFINITY),
            chosen: Some(SystemParams { cores: Some(2), ..SystemParams::default() }),
        }];
        let page = page(&d);
        assert_well_formed(&page);
        assert!(page.contains("Front: 1 trial; hypervolume "), "{page}");
        assert!(page.contains("class=\"w probe chosen\""));
        assert!(page.contains("class=\"mark\""));
    }

    #[test]
    fn the_parameters_that_mattered_are_shown_under_the_best_ones() {
        // The objective follows lr alone; batch is noise-free and irrelevant.
        let ranked: Vec<Ranked> = (0..12u64)
            .map(|t| {
                let mut r = row(t, 0.0, None);
                let lr = (t % 4) as f64 / 10.0;
                r.plan.params = Params::from([
                    ("lr".to_string(), ParamValue::Float(lr)),
                    ("batch".to_string(), ParamValue::Int([16, 32, 64][(t / 4) as usize])),
                ]);
                r.result.objective = Some(lr * 3.0);
                r
            })
            .collect();
        let page = page(&data("imp", ranked));
        assert_well_formed(&page);
        let table = page.split("id=\"table-importance\"").nth(1).expect("an importance table").split("</table>").next();
        let table = table.unwrap_or_default();
        let lr = table.find(">lr<").expect("lr listed");
        let batch = table.find(">batch<").expect("batch listed");
        assert!(lr < batch, "the parameter that explains the objective comes first: {table}");
        assert!(table.contains(">1.00<"), "lr explains it all: {table}");
        // Too few trials: no table.
        assert!(!page_of_one().contains("table-importance"));
    }

    fn page_of_one() -> String {
        page(&data("one", vec![row(0, 0.5, None)]))
    }

    #[test]
    fn estimated_energy_draws_no_front_for_a_study_that_never_asked_for_energy() {
        let rows: Vec<Ranked> = (0..6u64).map(|t| row(t, t as f64, Some(1.0 + t as f64))).collect();
        let mut d = data("noenergy", rows);
        let asked = page(&d);
        assert!(!asked.contains("this study does not ask for energy"));
        d.asks_energy = false;
        let not_asked = page(&d);
        assert!(not_asked.contains(&format!("id=\"{}\">Not drawn: this study does not ask for energy", CHART_IDS[2])));
        assert!(asked.matches("<svg").count() > not_asked.matches("<svg").count(), "one chart fewer");
    }

    #[test]
    fn non_finite_values_never_reach_an_svg() {
        let mut rows = vec![row(0, f64::NAN, Some(f64::INFINITY)), row(1, f64::INFINITY, Some(1.0))];
        rows.push(row(2, 1.0, Some(f64::NAN)));
        rows.push(row(3, 2.0, Some(2.0)));
        rows[1].result.wall_us = u64::MAX;
        let page = page(&data("nan", rows));
        assert_well_formed(&page);
    }

    /// A trial given GPUs shows its whole energy and both parts,
    /// the GPUs' share of it, and NVML beside its CPU source.
    #[test]
    fn a_trial_given_gpus_shows_its_cpu_and_gpu_parts() {
        use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
        let mut d = data("gpu", vec![row(0, 0.9, Some(400.0)), row(1, 0.8, Some(12.5))]);
        let prov = |trial, gpus: Vec<GpuEnergy>, cpu| ProvenanceRow {
            trial,
            energy_source: EnergySourceKind::Rapl,
            energy_valid: true,
            energy_note: None,
            hardware_counters: Vec::new(),
            software_counters: Vec::new(),
            missing_counters: Vec::new(),
            interference: Vec::new(),
            cpu_energy_j: cpu,
            gpus,
        };
        let gpu = GpuEnergy {
            index: 0,
            uuid: "GPU-a".into(),
            joules: 300.0,
            method: GpuMethod::Counter,
            valid: true,
            note: None,
        };
        d.provenance = vec![prov(0, vec![gpu], 100.0), prov(1, vec![], 12.5)];
        let page = page(&d);
        assert_well_formed(&page);
        assert!(page.contains("CPU 100, GPU 300, 75 % of it"), "{page}");
        assert!(page.contains("estimated + nvml (1 GPU)"), "{page}");
        assert!(!page.contains("CPU 12.5"), "a trial without GPUs shows its energy alone");
    }

    #[test]
    fn a_large_study_stays_small() {
        let rows: Vec<Ranked> =
            (0..100_000u64).map(|t| row(t, (t % 977) as f64 / 977.0, Some(1.0 + (t % 311) as f64))).collect();
        let mut d = data("large", rows);
        d.provenance = vec![ProvenanceRow {
            trial: 0,
            energy_source: EnergySourceKind::Estimated,
            energy_valid: true,
            energy_note: None,
            hardware_counters: Vec::new(),
            software_counters: vec!["task-clock".into()],
            missing_counters: vec!["cycles".into()],
            interference: Vec::new(),
            cpu_energy_j: 0.0,
            gpus: vec![],
        }];
        let page = page(&d);
        assert_well_formed(&page);
        assert!(page.len() < 400_000, "{} bytes", page.len());
        assert!(page.contains("Sampled to"), "the page says it sampled");
        assert!(page.contains("density grid"));
        assert!(page
            .contains("hardware: none; software: task-clock; <span class=\"small\" title=\"cycles\">1 not measured"));
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_709_251_199_000), "2024-02-29 23:59:59 UTC");
    }
}
