//! A study's own page on `tunefleet serve`'s live page (`/study/NAME`): the
//! views users of optuna-dashboard and the Ray dashboard reach for, drawn
//! from the rows `tunefleet export` writes (so its numbers are export's):
//! the history, importance as bars, a slice per parameter, parallel
//! coordinates, a contour over the two parameters that matter most, the
//! learning curves from the stored epochs, the Pareto front of a study with
//! two objectives, and a table of every trial, each opening its detail
//! (`/study/NAME/trial/N`: parameters, system configuration, energy with
//! its source, counters, attempts, its failure line and log tail).
//!
//! Inline SVG and CSS only: nothing is fetched from anywhere else.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use tunefleet_common::measurement::Measurement;
use tunefleet_common::params::ParamValue;

use super::plots;
use super::svg::{self, fmt_num, Esc};
use crate::domain::study::{Direction, Secondary};
use crate::query::export::Exported;
use crate::store::{AttemptRow, Store, TrialState};

/// Most rows of the trial table (the latest trials beyond it).
pub const MAX_TABLE: usize = 1000;
/// Most slices drawn (parameters by importance beyond it).
pub const MAX_SLICES: usize = 16;
/// The trials whose learning curves are drawn, the last ones.
const CURVES: u64 = 50;

/// What a study's page shows, read from the store.
#[derive(Debug, Clone)]
pub struct StudyView {
    pub study: String,
    pub state: String,
    pub metric: String,
    pub direction: Direction,
    /// Its further objectives (`[objective] also`).
    pub also: Vec<Secondary>,
    /// Every trial as `export` writes it, ranked by the one rule.
    pub rows: Vec<Exported>,
    /// Why each failed trial failed.
    pub reasons: BTreeMap<u64, String>,
    /// The last trials' learning curves.
    pub curves: Vec<crate::store::Curve>,
    /// Unix ms the data was read at.
    pub at_ms: u64,
}

impl StudyView {
    /// The successful trials with a finite objective: (row, objective, feasible).
    fn scored(&self) -> impl Iterator<Item = (&Exported, f64, bool)> {
        self.rows.iter().filter(|r| r.record.state == TrialState::Done).filter_map(|r| {
            let y = r.result().and_then(|o| o.objective).filter(|y| y.is_finite())?;
            Some((r, y, r.result().and_then(|o| o.violation).is_none_or(|v| v == 0.0)))
        })
    }

    /// Reads the measurement of trial `trial`'s result, which its detail
    /// page shows (the views read none: a study's thousands of
    /// measurements at every reload).
    pub fn measure(&mut self, store: &Store, trial: u64) -> Result<(), crate::store::StoreError> {
        let json = store.measurement_json(&self.study, trial)?;
        if let Some(o) =
            self.rows.iter_mut().find(|r| r.record.plan.trial == trial).and_then(|r| r.record.result.as_mut())
        {
            o.measurement_json = json;
        }
        Ok(())
    }

    fn maximize(&self) -> bool {
        self.direction == Direction::Maximize
    }
}

/// Reads the page of `study`; `None` when there is no such study.
pub fn load(store: &Store, study: &str, at_ms: u64) -> Result<Option<StudyView>, crate::store::StoreError> {
    let Some(row) = store.study(study)? else { return Ok(None) };
    let also = store.stored(study)?.and_then(|s| s.study()).map(|s| s.objective.also).unwrap_or_default();
    let rows = crate::query::export::ranked_rows(store, study, crate::store::Measured::Without)?;
    let reasons = rows.iter().filter_map(|r| Some((r.record.plan.trial, r.record.reason.clone()?))).collect();
    Ok(Some(StudyView {
        study: row.name.clone(),
        state: row.state.as_str().to_string(),
        curves: store.learning_curves(study, &row.metric, CURVES)?,
        metric: row.metric,
        direction: row.direction,
        also,
        rows,
        reasons,
        at_ms,
    }))
}

/// The study's page's `<main>`, which the page reloads.
pub fn main_html(v: &StudyView, query: &str) -> String {
    let mut out = String::from("<main id=\"live\">");
    let scored: Vec<(&Exported, f64, bool)> = v.scored().collect();
    let done = v.rows.iter().filter(|r| r.record.state == TrialState::Done).count();
    let best = v.rows.iter().find(|r| r.rank.is_some_and(|p| p.0 == 1));
    let _ = write!(
        out,
        "<p id=\"study-summary\"><b>{}</b> ({}): <span id=\"trials-done\">{done}</span> of {} trials done; best \
         {}</p><nav class=\"views\"><a href=\"#view-history\">history</a><a href=\"#view-importance\">importance</a>\
         <a href=\"#view-slice\">slice</a><a href=\"#view-parallel\">parallel coordinates</a>\
         <a href=\"#view-contour\">contour</a><a href=\"#view-curves\">learning curves</a>\
         <a href=\"#view-pareto\">Pareto front</a><a href=\"#view-trials\">trials</a></nav>",
        Esc(&v.study),
        Esc(&v.state),
        v.rows.len(),
        best.map_or_else(
            || "-".to_string(),
            |b| format!(
                "{}=<span id=\"best-value\">{}</span> (trial <a href=\"{}\">{}</a>)",
                Esc(&v.metric),
                b.result().and_then(|o| o.objective).map_or_else(|| "-".into(), |y| y.to_string()),
                trial_link(&v.study, b.record.plan.trial, query),
                b.record.plan.trial
            )
        ),
    );
    history(&mut out, v, &scored);
    let shares = importance(&scored);
    section(&mut out, "view-importance", "Importance", || {
        plots::bars_chart("importance", "the share of the objective's variance each parameter explains", &shares)
    });
    slices(&mut out, v, &scored, &shares);
    parallel(&mut out, v, &scored, &shares);
    contour(&mut out, v, &scored, &shares);
    section(&mut out, "view-curves", "Learning curves", || svg::curves_chart("curves", &v.curves, &v.metric));
    pareto(&mut out, v, &scored);
    trials_table(&mut out, v, query);
    out.push_str("</main>");
    out
}

/// A view of one wide chart, which a phone scrolls sideways rather than shrink past reading.
fn section(out: &mut String, id: &str, title: &str, body: impl FnOnce() -> String) {
    let _ = write!(out, "<section id=\"{id}\"><h2>{title}</h2><div class=\"scroll\">{}</div></section>", body());
}

fn trial_link(study: &str, trial: u64, query: &str) -> String {
    format!("/study/{}/trial/{trial}{}", Esc(study), Esc(query))
}

/// Each parameter's share of the variance ([`crate::domain::importance`]), largest first.
fn importance(scored: &[(&Exported, f64, bool)]) -> Vec<(String, f64)> {
    let trials: Vec<_> = scored.iter().map(|(r, y, _)| (r.record.plan.params.clone(), *y)).collect();
    crate::domain::importance::importance(&trials)
}

/// Every parameter name, the important ones first, then by name.
fn names_by_importance<'a>(v: &'a StudyView, shares: &'a [(String, f64)]) -> Vec<&'a str> {
    let mut names: Vec<&str> = shares.iter().map(|(n, _)| n.as_str()).collect();
    let all: std::collections::BTreeSet<&str> =
        v.rows.iter().flat_map(|r| r.record.plan.params.keys().map(String::as_str)).collect();
    names.extend(all.into_iter().filter(|n| !shares.iter().any(|(s, _)| s == n)));
    names
}

fn history(out: &mut String, v: &StudyView, scored: &[(&Exported, f64, bool)]) {
    let all: Vec<(u64, f64)> = scored.iter().map(|(r, y, _)| (r.record.plan.trial, *y)).collect();
    let infeasible = scored.iter().filter(|p| !p.2).map(|p| p.0.record.plan.trial).collect();
    let series = super::sample::objective_series_feasible(&all, &infeasible, v.direction, svg::MAX_DOTS);
    section(out, "view-history", "History", || svg::objective_chart("history", &series, &v.metric));
}

fn slices(out: &mut String, v: &StudyView, scored: &[(&Exported, f64, bool)], shares: &[(String, f64)]) {
    let names = names_by_importance(v, shares);
    out.push_str("<section id=\"view-slice\"><h2>Slice</h2><div class=\"grid\">");
    for (i, name) in names.iter().take(MAX_SLICES).enumerate() {
        let points: Vec<(&ParamValue, f64, bool)> =
            scored.iter().filter_map(|(r, y, ok)| Some((r.record.plan.params.get(*name)?, *y, *ok))).collect();
        let _ = write!(
            out,
            "<figure data-slice=\"{}\">{}</figure>",
            Esc(name),
            plots::slice_chart(&format!("slice-{i}"), name, &v.metric, &points)
        );
    }
    out.push_str("</div>");
    if names.len() > MAX_SLICES {
        let _ = write!(out, "<p class=\"small\">The {MAX_SLICES} parameters that matter most of {}.</p>", names.len());
    }
    out.push_str("</section>");
}

fn parallel(out: &mut String, v: &StudyView, scored: &[(&Exported, f64, bool)], shares: &[(String, f64)]) {
    let names = names_by_importance(v, shares);
    let names: Vec<&str> = names.into_iter().take(MAX_SLICES).collect();
    // The best trials when there are too many lines to read.
    let mut kept: Vec<&(&Exported, f64, bool)> = scored.iter().collect();
    kept.sort_by_key(|(r, _, _)| r.rank.map_or(u64::MAX, |p| p.0));
    kept.truncate(MAX_TABLE);
    let trials: Vec<(u64, Vec<Option<&ParamValue>>, f64, bool)> = kept
        .iter()
        .map(|(r, y, ok)| (r.record.plan.trial, names.iter().map(|n| r.record.plan.params.get(*n)).collect(), *y, *ok))
        .collect();
    section(out, "view-parallel", "Parallel coordinates", || {
        plots::parallel_chart("parallel", &names, &v.metric, v.maximize(), &trials)
    });
}

fn contour(out: &mut String, v: &StudyView, scored: &[(&Exported, f64, bool)], shares: &[(String, f64)]) {
    // Two numbers when the study has them: a contour over categories reads poorly.
    let all = names_by_importance(v, shares);
    let numeric: Vec<&str> = all
        .iter()
        .copied()
        .filter(|n| v.rows.iter().filter_map(|r| r.record.plan.params.get(*n)).all(|p| p.as_f64().is_some()))
        .collect();
    let names = if numeric.len() >= 2 { numeric } else { all };
    section(out, "view-contour", "Contour", || match names.as_slice() {
        [a, b, ..] => {
            let points: Vec<(&ParamValue, &ParamValue, f64, bool)> = scored
                .iter()
                .filter_map(|(r, y, ok)| Some((r.record.plan.params.get(*a)?, r.record.plan.params.get(*b)?, *y, *ok)))
                .collect();
            plots::contour_chart("contour", (a, b), &v.metric, v.maximize(), &points)
        }
        _ => svg::empty("contour", "contour", "A contour needs two parameters; this study has fewer."),
    });
}

/// The front of the objective and each further objective, for a study with two or more.
fn pareto(out: &mut String, v: &StudyView, scored: &[(&Exported, f64, bool)]) {
    out.push_str("<section id=\"view-pareto\"><h2>Pareto front</h2>");
    if v.also.is_empty() {
        out.push_str(
            "<p class=\"small\" id=\"pareto\">One objective: no front. A study with <code>[objective] also</code> \
             (energy, wall time) draws its front here.</p>",
        );
    }
    let sign = if v.maximize() { -1.0 } else { 1.0 };
    for (i, also) in v.also.iter().enumerate() {
        let figure = |r: &Exported| match also {
            Secondary::Energy => r.result().and_then(|o| o.energy.counted()).unwrap_or(f64::NAN),
            Secondary::WallTime => r.result().map(|o| o.wall_us).map_or(f64::NAN, |us| us as f64 / 1e6),
        };
        let placed: Vec<(u64, f64, f64, bool)> = scored
            .iter()
            .map(|(r, y, ok)| (r.record.plan.trial, figure(r), *y, *ok))
            .filter(|p| p.1.is_finite())
            .collect();
        let feasible: Vec<&(u64, f64, f64, bool)> = placed.iter().filter(|p| p.3).collect();
        let keys: Vec<Vec<f64>> = feasible.iter().map(|p| vec![p.1, sign * p.2]).collect();
        let mut front: Vec<(u64, f64, f64)> = tunefleet_search::pareto::front(&keys)
            .into_iter()
            .map(|i| (feasible[i].0, feasible[i].1, feasible[i].2))
            .collect();
        front.sort_by(|a, b| a.1.total_cmp(&b.1));
        let unit = match also {
            Secondary::Energy => "energy (J)",
            Secondary::WallTime => "wall time (s)",
        };
        let cloud: Vec<(f64, f64)> = feasible.iter().map(|p| (p.1, p.2)).collect();
        let grey: Vec<(f64, f64)> = placed.iter().filter(|p| !p.3).map(|p| (p.1, p.2)).collect();
        let _ = write!(
            out,
            "<figure class=\"scroll\" data-front=\"{}\" data-front-trials=\"{}\">{}</figure>",
            also.as_str(),
            front.iter().map(|p| p.0.to_string()).collect::<Vec<_>>().join(" "),
            svg::pareto_chart(
                &format!("pareto-{i}"),
                &format!("{} against {unit}", v.metric),
                (&cloud, &grey),
                &front,
                unit,
                &v.metric
            )
        );
    }
    out.push_str("</section>");
}

fn trials_table(out: &mut String, v: &StudyView, query: &str) {
    let names: std::collections::BTreeSet<&str> =
        v.rows.iter().flat_map(|r| r.record.plan.params.keys().map(String::as_str)).collect();
    let constrained = v.rows.iter().any(|r| r.result().and_then(|o| o.violation).is_some());
    out.push_str("<section id=\"view-trials\"><h2>Trials</h2>");
    let skipped = v.rows.len().saturating_sub(MAX_TABLE);
    if skipped > 0 {
        let _ = write!(out, "<p class=\"small\">The last {MAX_TABLE} of {} trials (export has all).</p>", v.rows.len());
    }
    let _ = write!(
        out,
        "<div class=\"scroll\"><table id=\"trials\"><tr><th>trial</th><th>state</th><th>{}</th><th>rank</th>{}",
        Esc(&v.metric),
        if constrained { "<th>feasible</th>" } else { "" }
    );
    for n in &names {
        let _ = write!(out, "<th>{}</th>", Esc(n));
    }
    out.push_str("<th>agent</th><th>wall s</th><th>energy J</th><th>source</th><th>attempts</th></tr>");
    for r in v.rows.iter().skip(skipped) {
        let _ = write!(
            out,
            "<tr data-trial=\"{0}\"><td><a href=\"{1}\">{0}</a></td><td>{2}</td><td class=\"n objective\">{3}</td>\
             <td class=\"n\">{4}</td>",
            r.record.plan.trial,
            trial_link(&v.study, r.record.plan.trial, query),
            r.record.state.as_str(),
            r.result().and_then(|o| o.objective).map_or_else(String::new, |y| y.to_string()),
            r.rank.map_or_else(String::new, |p| p.0.to_string()),
        );
        if constrained {
            let _ = write!(
                out,
                "<td>{}</td>",
                r.result().and_then(|o| o.violation).map_or("", |x| if x == 0.0 { "yes" } else { "no" })
            );
        }
        for n in &names {
            let _ = write!(
                out,
                "<td>{}</td>",
                r.record.plan.params.get(*n).map_or_else(String::new, |p| Esc(&p.to_string()).to_string())
            );
        }
        let _ = write!(
            out,
            "<td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            Esc(r.result().map(|o| o.agent.as_str()).unwrap_or("")),
            r.result().map(|o| o.wall_us).map_or_else(String::new, |us| fmt_num(us as f64 / 1e6)),
            r.result().and_then(|o| o.energy.joules).map_or_else(String::new, fmt_num),
            Esc(r.result().and_then(|o| o.energy.source_name()).unwrap_or("")),
            r.record.attempts
        );
    }
    out.push_str("</table></div></section>");
}

/// The study's whole page: its views, reloaded every 2 s.
pub fn page_html(v: &StudyView, query: &str) -> String {
    super::live::shell(
        &format!("Tunefleet: {}", v.study),
        &format!(
            "The same trials as <code>tunefleet export {0}</code>. <a href=\"/{1}\">The fleet</a>, \
             <a href=\"/report/{0}{1}\">the report</a>.",
            Esc(&v.study),
            Esc(query)
        ),
        &main_html(v, query),
        v.at_ms,
        Some(&format!("/study/{}/main", v.study)),
    )
}

/// One trial's page.
pub fn trial_page(v: &StudyView, trial: u64, attempts: &[AttemptRow], query: &str) -> Option<String> {
    let body = trial_html(v, trial, attempts, query)?;
    Some(super::live::shell(&format!("Tunefleet: {} trial {trial}", v.study), "", &body, v.at_ms, None))
}

/// One trial's detail page's body; `None` when the study has no such trial.
pub fn trial_html(v: &StudyView, trial: u64, attempts: &[AttemptRow], query: &str) -> Option<String> {
    let r = v.rows.iter().find(|r| r.record.plan.trial == trial)?;
    let mut out = String::from("<main id=\"trial\">");
    let _ = write!(
        out,
        "<p><a href=\"/study/{0}{1}\">&larr; {0}</a></p><h2>Trial {2}{3}</h2><table id=\"trial-summary\">\
         <tr><th>state</th><td>{4}</td></tr><tr><th>{5}</th><td id=\"trial-objective\">{6}</td></tr>\
         <tr><th>rank</th><td>{7}</td></tr>",
        Esc(&v.study),
        Esc(query),
        trial,
        if r.record.plan.repeat > 0 { format!(" (repeat {})", r.record.plan.repeat) } else { String::new() },
        r.record.state.as_str(),
        Esc(&v.metric),
        r.result().and_then(|o| o.objective).map_or_else(|| "-".into(), |y| y.to_string()),
        r.rank.map_or_else(
            || "-".into(),
            |p| format!(
                "{} (its configuration's mean {} over {} run{})",
                p.0,
                p.1,
                p.2,
                if p.2 == 1 { "" } else { "s" }
            )
        ),
    );
    if let Some(x) = r.result().and_then(|o| o.violation) {
        let _ =
            write!(out, "<tr><th>feasible</th><td>{} (violation {x})</td></tr>", if x == 0.0 { "yes" } else { "no" });
    }
    if let Some(reason) = v.reasons.get(&trial) {
        let _ = write!(out, "<tr><th>failed</th><td id=\"failure\">{}</td></tr>", Esc(reason));
    }
    if let Some(exit) = r.result().map(|o| &o.exit) {
        let _ = write!(out, "<tr><th>exit</th><td>{}</td></tr>", Esc(exit));
    }
    out.push_str("</table><h3>Parameters</h3><table id=\"trial-params\">");
    for (k, p) in &r.record.plan.params {
        let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", Esc(k), Esc(&p.to_string()));
    }
    out.push_str("</table>");
    match r.result().and_then(|o| o.measurement()) {
        Some(Ok(m)) => measurement(&mut out, r, &m),
        Some(Err(_)) => out.push_str("<p class=\"small\">Its measurement is in a form this version does not read.</p>"),
        None => out.push_str("<p class=\"small\" id=\"no-result\">No result stored for this trial yet.</p>"),
    }
    out.push_str(
        "<h3>Attempts</h3><table id=\"trial-attempts\"><tr><th>attempt</th><th>agent</th><th>outcome</th></tr>",
    );
    for a in attempts {
        let _ = write!(
            out,
            "<tr><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            a.attempt,
            Esc(&a.agent),
            Esc(a.outcome.as_deref().unwrap_or(if a.ended_ms.is_none() { "running" } else { "-" }))
        );
    }
    out.push_str("</table></main>");
    Some(out)
}

/// The system configuration, energy, counters and log tail of a result.
fn measurement(out: &mut String, r: &Exported, m: &Measurement) {
    let memory = match m.limits.memory {
        tunefleet_common::measurement::MemoryLimit::None => "no limit".to_string(),
        tunefleet_common::measurement::MemoryLimit::Cgroup { bytes } => format!("{bytes} bytes (cgroup)"),
        tunefleet_common::measurement::MemoryLimit::Rlimit { bytes } => format!("{bytes} bytes (RLIMIT_AS)"),
    };
    let _ = write!(
        out,
        "<h3>System configuration</h3><table id=\"trial-system\"><tr><th>agent</th><td>{}</td></tr>\
         <tr><th>CPUs</th><td>{}</td></tr><tr><th>threads</th><td>{}</td></tr><tr><th>memory</th><td>{memory}</td></tr>\
         <tr><th>kept configuration</th><td>{}</td></tr><tr><th>wall time</th><td>{} s</td></tr>\
         <tr><th>CPU time</th><td>{} s user, {} s system</td></tr><tr><th>peak memory</th><td>{} KiB</td></tr></table>",
        Esc(r.result().map(|o| o.agent.as_str()).unwrap_or("-")),
        if m.limits.cpus.is_empty() {
            "not pinned".to_string()
        } else {
            m.limits.cpus.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
        },
        m.limits.threads.map_or_else(|| "-".into(), |t| t.to_string()),
        Esc(&super::sample::system_text(m.selected.as_ref())),
        fmt_num(m.wall_us as f64 / 1e6),
        fmt_num(m.user_us as f64 / 1e6),
        fmt_num(m.sys_us as f64 / 1e6),
        m.max_rss_kib,
    );
    let e = &m.energy;
    let _ = write!(
        out,
        "<h3>Energy</h3><table id=\"trial-energy\"><tr><th>joules</th><td id=\"energy-j\">{}</td></tr>\
         <tr><th>source</th><td id=\"energy-source\">{}</td></tr><tr><th>valid</th><td>{}</td></tr>",
        e.joules,
        Esc(&e.source.to_string()),
        if e.valid { "yes" } else { "no" },
    );
    if let Some(note) = &e.note {
        let _ = write!(out, "<tr><th>note</th><td>{}</td></tr>", Esc(note));
    }
    for d in &e.domains {
        let _ = write!(out, "<tr><th>{}</th><td>{} J</td></tr>", Esc(&d.domain), fmt_num(d.joules));
    }
    for g in &m.gpus {
        let _ = write!(out, "<tr><th>GPU {}</th><td>{} J</td></tr>", g.index, fmt_num(g.joules));
    }
    for i in &m.interference {
        let _ = write!(out, "<tr><th>disturbed</th><td>{}</td></tr>", Esc(i));
    }
    out.push_str("</table><h3>Counters</h3>");
    if m.counters.is_empty() {
        out.push_str("<p class=\"small\">No counter was read.</p>");
    } else {
        out.push_str("<table id=\"trial-counters\"><tr><th>event</th><th>value</th><th>running</th></tr>");
        for c in &m.counters {
            let share = if c.time_enabled_ns > 0 { c.time_running_ns as f64 / c.time_enabled_ns as f64 } else { 1.0 };
            let _ = write!(
                out,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.0}%</td></tr>",
                Esc(&c.event),
                c.value,
                share * 100.0
            );
        }
        out.push_str("</table>");
    }
    let _ = write!(out, "<h3>Log tail</h3><pre id=\"log-tail\">{}</pre>", Esc(&m.log_tail));
}

#[cfg(test)]
mod tests;
