//! The live page of `tunefleet serve` (`cli/page.rs` serves it): the fleet
//! (each agent, whether it is online, its slots and the attempts it holds,
//! when it was last seen, the trials it lost before they started, whether
//! its last telemetry says it was disturbed) and the studies (progress,
//! best by the one ranking rule, failures by cause, a link to each
//! report, and its objective over its trials with the best so far),
//! rendered here from what `status --json` and `agents --json` say, so the
//! page and the commands agree. The page reloads its `<main>` every 2 s.

use std::fmt::Write as _;

use serde::Serialize;

use super::Esc;
use crate::query::status::StudyStatus;
use crate::store::{AgentRow, RefusalRow};

/// What the page shows, as `/status.json` serves it.
#[derive(Debug, Clone, Serialize)]
pub struct LiveData {
    pub studies: Vec<StudyStatus>,
    pub agents: Vec<AgentRow>,
    /// Names whose Hello was refused, and why (the latest first).
    pub refusals: Vec<RefusalRow>,
    /// Unix ms the data was read at.
    pub at_ms: u64,
    /// Each study's objective by trial, for its history chart (not in
    /// `/status.json`: `export` has every trial).
    #[serde(skip)]
    pub histories: Vec<History>,
}

/// One study's objective by trial.
#[derive(Debug, Clone)]
pub struct History {
    pub study: String,
    pub metric: String,
    pub direction: crate::domain::study::Direction,
    /// `(trial, objective, feasible)` of its successful trials, by trial.
    pub points: Vec<(u64, f64, bool)>,
    /// Its last trials' learning curves: the metric epoch by epoch.
    pub curves: Vec<(u64, Vec<(f64, f64)>)>,
}

/// Seconds since `then_ms`, for reading (`4 s ago`, `3 min ago`).
fn ago(now_ms: u64, then_ms: u64) -> String {
    let s = now_ms.saturating_sub(then_ms) / 1000;
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

/// What the agent's last telemetry says disturbs its measurements: work
/// from outside (over half a CPU), charging, throttling.
fn disturbance(t: &tunefleet_common::measurement::Telemetry) -> String {
    let mut why = Vec::new();
    if let Some(cpu) = t.foreign_cpu.filter(|c| *c > 0.5) {
        why.push(format!("outside load {cpu:.1} CPUs"));
    }
    if t.conditions.charging == Some(true) {
        why.push("charging".to_string());
    }
    if t.conditions.throttled == Some(true) {
        why.push("throttled".to_string());
    }
    why.join(", ")
}

/// The page's `<main>`: the fleet and the studies. `query` is appended to
/// links (the access token, when the page needs one).
pub fn main_html(data: &LiveData, query: &str) -> String {
    let mut out = String::from("<main id=\"live\">");
    let online = data.agents.iter().filter(|a| a.online).count();
    let slots: u32 = data.agents.iter().filter(|a| a.online).map(|a| a.info.slots).sum();
    let busy: usize = data.agents.iter().filter(|a| a.online).map(|a| a.running.len()).sum();
    let held: usize = data.agents.iter().filter(|a| a.online).map(|a| a.held.len()).sum();
    let _ = write!(
        out,
        "<h2>Fleet</h2><p id=\"fleet-summary\"><span id=\"agents-online\">{online}</span> of \
         <span id=\"agents-known\">{}</span> agents online, <span id=\"slots-busy\">{busy}</span> of \
         <span id=\"slots-online\">{slots}</span> slots busy, <span id=\"held-ahead\">{held}</span> trials held \
         ahead</p>",
        data.agents.len()
    );
    out.push_str(
        "<table id=\"agents\"><tr><th>agent</th><th>state</th><th>slots</th><th>running</th><th>held ahead</th>\
         <th>last seen</th><th>lost before start</th><th>disturbed</th></tr>",
    );
    for a in &data.agents {
        let disturbed = a.telemetry.as_ref().map(disturbance).filter(|t| !t.is_empty()).unwrap_or_else(|| "-".into());
        let _ = write!(
            out,
            "<tr data-agent=\"{0}\"><td>{0}</td><td class=\"{1}\">{1}</td><td class=\"n\">{2}</td>\
             <td class=\"n\">{3}</td><td class=\"n\">{7}</td><td>{4}</td><td class=\"n\">{5}</td><td>{6}</td></tr>",
            Esc(&a.name),
            if a.online { "online" } else { "offline" },
            a.info.slots,
            a.running.len(),
            ago(data.at_ms, a.last_seen_ms),
            a.lost_held,
            Esc(&disturbed),
            a.held.len(),
        );
    }
    out.push_str("</table>");
    if !data.refusals.is_empty() {
        out.push_str(
            "<h3>Refused</h3><table id=\"refused\"><tr><th>name</th><th>why</th><th>last</th><th>times</th></tr>",
        );
        for r in data.refusals.iter().take(50) {
            let _ = write!(
                out,
                "<tr data-refused=\"{0}\"><td>{0}</td><td>{1}</td><td>{2}</td><td class=\"n\">{3}</td></tr>",
                Esc(&r.name),
                Esc(&r.reason),
                ago(data.at_ms, r.at_ms),
                r.count
            );
        }
        out.push_str("</table>");
    }
    out.push_str("<h2>Studies</h2>");
    out.push_str(
        "<table id=\"studies\"><tr><th>study</th><th>state</th><th>done</th><th>of</th><th>running</th>\
         <th>held ahead</th><th>failed</th><th>stopped</th><th>best</th><th>failures by cause</th><th>report</th></tr>",
    );
    for s in &data.studies {
        let best =
            match (s.best, s.best_runs) {
                (Some((v, t)), 0 | 1) => format!("{}={v:.6} (trial {t})", Esc(&s.metric)),
                (Some((v, t)), n) => format!("{}={v:.6} (mean of {n} runs, best run trial {t})", Esc(&s.metric)),
                (None, _) => "-".to_string(),
            } + if s.best_feasible == Some(false) { " (infeasible: no trial meets the constraints)" } else { "" };
        let causes = if s.failures.is_empty() {
            "-".to_string()
        } else {
            s.failures.iter().map(|(c, n)| format!("{n} &times; {}", Esc(c))).collect::<Vec<_>>().join("<br>")
        };
        let _ = write!(
            out,
            "<tr data-study=\"{0}\"><td>{0}</td><td>{1}</td><td class=\"n done\">{2}</td><td class=\"n\">{3}</td>\
             <td class=\"n\">{4}</td><td class=\"n\">{7}</td><td class=\"n failed\">{5}</td><td class=\"n\">{6}</td>\
             <td class=\"best\">{best}</td><td>{causes}</td><td><a href=\"/study/{0}{query}\">views</a> \
             <a href=\"/report/{0}{query}\">report</a></td></tr>",
            Esc(&s.study),
            Esc(&s.state),
            s.done,
            s.total,
            s.running,
            s.failed,
            s.stopped,
            s.held,
        );
    }
    out.push_str("</table>");
    for s in data.studies.iter().filter(|s| s.waits.is_some()) {
        let why = s.waits.as_deref().unwrap_or_default();
        let _ = write!(out, "<p class=\"waits\" data-waits=\"{0}\">{0} waits: {1}</p>", Esc(&s.study), Esc(why));
    }
    histories(&mut out, &data.histories);
    if let Some(free) = data.studies.first().and_then(|s| s.store_free_bytes) {
        let _ = write!(
            out,
            "<p class=\"small\" id=\"store-free\">The store's disk has {} free.</p>",
            crate::runtime::disk::readable(free)
        );
    }
    out.push_str("</main>");
    out
}

/// Each study's objective over its trials with the best so far (the
/// report's chart: at most [`super::svg::MAX_DOTS`] dots, sampled beyond).
fn histories(out: &mut String, histories: &[History]) {
    let drawn: Vec<&History> = histories.iter().filter(|h| !h.points.is_empty() || !h.curves.is_empty()).collect();
    if drawn.is_empty() {
        return;
    }
    out.push_str("<h2>History</h2>");
    for (i, h) in drawn.iter().enumerate() {
        let points: Vec<(u64, f64)> = h.points.iter().map(|&(t, v, _)| (t, v)).collect();
        let infeasible = h.points.iter().filter(|p| !p.2).map(|p| p.0).collect();
        let series = super::sample::objective_series_feasible(&points, &infeasible, h.direction, super::svg::MAX_DOTS);
        let curves = match h.curves.is_empty() {
            true => String::new(),
            false => super::svg::curves_chart(&format!("curves-{i}"), &h.curves, &h.metric),
        };
        let _ = write!(
            out,
            "<figure data-history=\"{0}\"><figcaption>{0}: {1} of {2} trials, the best so far in red{4}</figcaption>\
             {3}{curves}</figure>",
            Esc(&h.study),
            Esc(&h.metric),
            h.points.len(),
            super::svg::objective_chart(&format!("history-{i}"), &series, &h.metric),
            if h.curves.is_empty() { "" } else { "; the last trials' learning curves" },
        );
    }
}

/// The whole page: `main` and the script that reloads it every 2 s.
pub fn page_html(data: &LiveData, query: &str) -> String {
    shell(
        "Tunefleet: fleet and studies",
        &format!(
            "The same figures as <code>tunefleet status --json</code> and <code>tunefleet agents --json</code> \
             (<a href=\"/status.json{query}\">status.json</a>)."
        ),
        &main_html(data, query),
        data.at_ms,
        Some("/main"),
    )
}

/// The style of every page of the live page: readable at 1400 px and on a phone.
const PAGE_STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;\
margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}td.n{text-align:right}\
.online{color:#1a7f37}.offline{color:#999}.small{color:#666;font-size:12px}\
.stale{background:#fde8e8;border:1px solid #d33;color:#a00;padding:6px 10px}\
figure{margin:0 0 1em;max-width:960px}section{max-width:1400px}nav.views a{margin-right:1em}\
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:8px}.grid figure{margin:0}\
.scroll{overflow-x:auto;max-width:100%}pre{background:#f6f6f6;padding:8px;overflow-x:auto;white-space:pre-wrap}\
svg .pc{fill:none;stroke-width:1.2;stroke-opacity:.75}svg .pc.infeasible{stroke:#aaa;stroke-dasharray:4 3}svg .bar{fill:#4e79a7}\
svg .dot.contour-dot{stroke:#e15759;stroke-opacity:.9;stroke-width:4}svg .front{stroke:#e15759;stroke-width:2;fill:none}\
svg .front-dot{fill:#e15759}\
@media (max-width:700px){body{margin:.5em;font-size:13px}td,th{padding:2px 4px}.scroll>svg.chart{min-width:600px}}";

/// A page of the live page: `title`, a line that says when it was read
/// and `intro`, then `main`; with `main_path`, a script reloads `main`
/// from it every 2 s and, when the service stops answering, says so with
/// the time of the last update instead of going on showing the past as now.
pub fn shell(title: &str, intro: &str, main: &str, at_ms: u64, main_path: Option<&str>) -> String {
    let script = match main_path {
        Some(path) => format!(
            "<script>var seen=new Date({at_ms});function stale(on){{var b=document.getElementById('stale');b.hidden=!on;\
             if(on){{b.textContent='Not updated since '+seen.toISOString().slice(0,19).replace('T',' ')+\
             ' UTC: the coordinator does not answer (it stopped, or is out of reach); what follows is as it was \
             then.'}}}}\
             setInterval(function(){{fetch({}+location.search).then(function(r){{\
             if(!r.ok){{throw r.status}}return r.text()}}).then(function(t){{document.getElementById('live').outerHTML=t;\
             seen=new Date();document.getElementById('updated').textContent=\
             seen.toISOString().slice(0,19).replace('T',' ')+' UTC';stale(false)}}).catch(function(){{stale(true)}})}},\
             2000);</script>",
            serde_json::Value::from(path)
        ),
        None => String::new(),
    };
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{}</title>\
         <style>{PAGE_STYLE}{chart}</style></head><body>\
         <h1>{}</h1><p class=\"small\">Read only; {}last updated <span id=\"updated\">{}</span>. {intro}</p>\
         <p id=\"stale\" class=\"stale\" hidden></p>{main}{script}</body></html>",
        Esc(title),
        Esc(title),
        if main_path.is_some() { "updates every 2 s; " } else { "" },
        super::utc(at_ms),
        chart = super::svg::CHART_STYLE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_links_keep_the_token() {
        let study = StudyStatus {
            study: "s<1>".into(),
            state: "running".into(),
            total: 10,
            pending: 5,
            running: 2,
            held: 0,
            done: 3,
            failed: 1,
            stopped: 0,
            metric: "loss".into(),
            best: Some((0.5, 3)),
            best_runs: 2,
            best_feasible: None,
            store_free_bytes: None,
            live_agents: 1,
            coordinator_running: true,
            coordinator_seen_s: Some(1.0),
            broker: None,
            waits: None,
            failures: vec![("exit 1, `boom`".into(), 1)],
            per_minute: None,
            eta_s: None,
        };
        let refused = RefusalRow { name: "x<y>".into(), reason: "no <token>".into(), at_ms: 0, count: 2 };
        let data = LiveData {
            studies: vec![study],
            agents: Vec::new(),
            refusals: vec![refused],
            at_ms: 0,
            histories: Vec::new(),
        };
        let html = page_html(&data, "?token=abc");
        assert!(html.contains("<td>s&lt;1&gt;</td>") && !html.contains("<td>s<1></td>"), "{html}");
        assert!(html.contains("href=\"/report/s&lt;1&gt;?token=abc\""));
        assert!(html.contains("loss=0.500000 (mean of 2 runs, best run trial 3)"));
        assert!(html.contains("1 &times; exit 1, `boom`"));
        assert!(html.contains("<td>x&lt;y&gt;</td><td>no &lt;token&gt;</td>"), "{html}");
    }

    #[test]
    fn each_study_with_results_has_its_history_drawn() {
        let history = |study: &str, points: Vec<(u64, f64, bool)>| History {
            study: study.into(),
            metric: "loss".into(),
            direction: crate::domain::study::Direction::Minimize,
            points,
            curves: Vec::new(),
        };
        let data = LiveData {
            studies: Vec::new(),
            agents: Vec::new(),
            refusals: Vec::new(),
            at_ms: 0,
            histories: vec![
                history("<a>", vec![(0, 3.0, true), (1, 1.0, false), (4, 2.0, true)]),
                history("none", Vec::new()),
            ],
        };
        let html = main_html(&data, "");
        assert!(html.contains("<figure data-history=\"&lt;a&gt;\">"), "{html}");
        assert!(html.contains("loss of 3 trials") && html.contains("<svg id=\"history-0\""), "{html}");
        assert!(!html.contains("data-history=\"none\""), "nothing to draw, no chart");
        // Trial 1 misses its constraints: drawn apart, never the best so far.
        assert!(html.contains("class=\"dot infeasible\"") && html.contains("best feasible"), "{html}");
        // A study whose trials report epochs: a line a trial.
        let mut with_epochs = history("epochs", vec![(0, 1.0, true)]);
        with_epochs.curves = vec![(0, vec![(1.0, 2.0), (2.0, 1.5)]), (1, vec![(1.0, 3.0)])];
        let html = main_html(&LiveData { histories: vec![with_epochs], ..data.clone() }, "");
        assert_eq!(html.matches("class=\"curve\"").count(), 2, "{html}");
        assert!(html.contains("<svg id=\"curves-0\""), "{html}");
        let page = page_html(&data, "");
        assert!(page.contains("svg .best{"), "the chart's style is on the page");
    }
}
