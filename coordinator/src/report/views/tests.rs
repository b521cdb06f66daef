use tunefleet_common::counter::{CounterKind, CounterReading};
use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};

use super::*;
use crate::domain::search::TrialPlan;
use crate::store::{Outcome, StoredEnergy, TrialRecord};

fn row(trial: u64, x: f64, kind: &str, y: Option<f64>, energy: f64) -> Exported {
    let stored = StoredEnergy { joules: Some(energy), source: Some(EnergySourceKind::Rapl), valid: true };
    let mut result = Outcome::for_test("a<1>", y, 1_000_000 + trial * 1000, stored);
    result.success = y.is_some();
    result.exit = "exit 0".into();
    let params = [("x".to_string(), ParamValue::Float(x)), ("kind".to_string(), ParamValue::Text(kind.into()))];
    Exported {
        record: TrialRecord {
            plan: TrialPlan { trial, params: params.into(), repeat: 0 },
            state: if y.is_some() { TrialState::Done } else { TrialState::Failed },
            attempts: 1,
            failures: 0,
            reason: None,
            agent: Some("a<1>".into()),
            result: Some(result),
        },
        rank: None,
    }
}

/// Six trials of a study minimising `loss` over `x` and `kind`, ranked
/// as the store ranks them (the smallest loss first), the fourth failed.
fn view() -> StudyView {
    let mut rows = vec![
        row(0, 0.1, "a", Some(3.0), 10.0),
        row(1, 0.5, "b", Some(1.0), 30.0),
        row(2, 0.9, "a", Some(2.0), 5.0),
        row(3, 0.3, "b", None, 1.0),
        row(4, 0.7, "a", Some(4.0), 40.0),
        row(5, 0.2, "b", Some(1.5), 20.0),
    ];
    let objective = |r: &Exported| r.result().and_then(|o| o.objective);
    let mut done: Vec<usize> = (0..rows.len()).filter(|&i| objective(&rows[i]).is_some()).collect();
    done.sort_by(|&a, &b| objective(&rows[a]).partial_cmp(&objective(&rows[b])).expect("finite"));
    for (place, i) in done.into_iter().enumerate() {
        rows[i].rank = Some((place as u64 + 1, objective(&rows[i]).unwrap_or_default(), 1));
    }
    StudyView {
        study: "s1".into(),
        state: "finished".into(),
        metric: "loss".into(),
        direction: Direction::Minimize,
        also: Vec::new(),
        rows,
        reasons: [(3, "exit 1, `ImportError: <torch>`".to_string())].into(),
        curves: vec![(0, vec![(1.0, 4.0), (2.0, 3.0)])],
        at_ms: 0,
    }
}

fn between<'a>(html: &'a str, from: &str, to: &str) -> &'a str {
    let at = html.find(from).unwrap_or_else(|| panic!("no {from} in {html}"));
    let rest = &html[at..];
    &rest[..rest.find(to).unwrap_or(rest.len())]
}

#[test]
fn every_view_is_drawn_from_the_rows_export_writes() {
    let v = view();
    let html = main_html(&v, "");
    for id in [
        "view-history",
        "view-importance",
        "view-slice",
        "view-parallel",
        "view-contour",
        "view-curves",
        "view-pareto",
        "view-trials",
    ] {
        assert!(html.contains(&format!("<section id=\"{id}\">")), "{id} missing");
    }
    // The best by rank, linked to its detail.
    assert!(
        html.contains("loss=<span id=\"best-value\">1</span> (trial <a href=\"/study/s1/trial/1\">1</a>)"),
        "{html}"
    );
    assert!(html.contains("<span id=\"trials-done\">5</span> of 6 trials"));
    // A dot per successful trial in the history and in each slice.
    let history = between(&html, "id=\"view-history\"", "</section>");
    let dots = history.split("class=\"dot\" d=\"").nth(1).and_then(|d| d.split('"').next()).unwrap_or_default();
    assert_eq!(dots.matches("h0").count(), 5, "{history}");
    for name in ["x", "kind"] {
        let slice = between(&html, &format!("data-slice=\"{name}\""), "</figure>");
        assert!(slice.contains("data-points=\"5\""), "{slice}");
    }
    // A line a successful trial; a contour over both parameters.
    let parallel = between(&html, "id=\"view-parallel\"", "</section>");
    assert_eq!(parallel.matches("class=\"pc\"").count(), 5);
    assert!(html.contains("aria-label=\"loss over ") && html.contains("data-points=\"5\""), "{html}");
    assert_eq!(html.matches("class=\"curve\"").count(), 1);
    // The table: every trial, its objective as export writes it, the failed one without.
    let table = between(&html, "<table id=\"trials\">", "</table>");
    assert_eq!(table.matches("<tr data-trial=").count(), 6);
    let cell = |t: u64| between(table, &format!("<tr data-trial=\"{t}\">"), "</tr>").to_string();
    assert!(cell(5).contains("<td class=\"n objective\">1.5</td><td class=\"n\">2</td>"), "{}", cell(5));
    assert!(cell(3).contains("<td class=\"n objective\"></td>") && cell(3).contains(">failed<"), "{}", cell(3));
    assert!(cell(0).contains("<td>a&lt;1&gt;</td>"), "names escaped: {}", cell(0));
    assert!(html.contains("One objective: no front"));
}

#[test]
fn importance_orders_the_slices_and_the_contour() {
    let mut v = view();
    // The loss follows x alone.
    for r in &mut v.rows {
        let x = r.record.plan.params.get("x").and_then(ParamValue::as_f64);
        if let (Some(y), Some(x)) = (r.record.result.as_mut().and_then(|o| o.objective.as_mut()), x) {
            *y = x * 10.0;
        }
    }
    let html = main_html(&v, "");
    let imp = between(&html, "id=\"view-importance\"", "</section>");
    assert!(imp.find("data-name=\"x\"") < imp.find("data-name=\"kind\"").or(Some(usize::MAX)), "{imp}");
    let slices = between(&html, "id=\"view-slice\"", "</section>");
    assert!(slices.find("data-slice=\"x\"") < slices.find("data-slice=\"kind\""), "{slices}");
    // Two numeric parameters: the contour is theirs, though `kind` may matter more.
    let mut numeric = view();
    for r in &mut numeric.rows {
        r.record.plan.params.insert("n".into(), ParamValue::Int(i64::try_from(r.record.plan.trial % 3).unwrap_or(0)));
    }
    let html = main_html(&numeric, "");
    let contour = between(&html, "id=\"view-contour\"", "</section>");
    assert!(
        contour.contains("aria-label=\"loss over x and n\"") || contour.contains("aria-label=\"loss over n and x\"")
    );
    // One parameter only: the contour says why it is not drawn.
    for r in &mut v.rows {
        r.record.plan.params.remove("kind");
    }
    assert!(main_html(&v, "").contains("A contour needs two parameters"));
}

#[test]
fn a_study_with_two_objectives_draws_its_front() {
    let mut v = view();
    v.also = vec![Secondary::Energy];
    let html = main_html(&v, "");
    // (energy, loss): 0 (10, 3), 1 (30, 1), 2 (5, 2), 4 (40, 4), 5 (20, 1.5):
    // 2 and 5 and 1 are beaten by none on both.
    let front = between(&html, "data-front=\"energy\"", ">");
    assert!(front.contains("data-front-trials=\"2 5 1\""), "{front}");
    assert_eq!(html.matches("class=\"front-dot\"").count(), 3);
    // Trial 1 misses the study's constraints: the front is of the others
    // (the constrained front), trial 1 a grey dot, "no" in the table.
    for r in &mut v.rows {
        let trial = r.record.plan.trial;
        if let Some(o) = r.record.result.as_mut() {
            o.violation = o.objective.map(|_| if trial == 1 { 0.5 } else { 0.0 });
        }
    }
    let html = main_html(&v, "");
    let front = between(&html, "data-front=\"energy\"", ">");
    assert!(front.contains("data-front-trials=\"2 5\""), "{front}");
    let pareto = between(&html, "id=\"view-pareto\"", "</section>");
    assert!(pareto.contains("class=\"dot infeasible\""), "{pareto}");
    assert!(between(&html, "<tr data-trial=\"1\">", "</tr>").contains("<td>no</td>"));
    assert!(html.contains("class=\"pc infeasible\" data-trial=\"1\""));
}

#[test]
fn a_trial_opens_its_detail() {
    let mut v = view();
    let m = Measurement {
        wall_us: 1_500_000,
        log_tail: "epoch 3 <done>\n".into(),
        counters: vec![CounterReading {
            event: "task-clock".into(),
            kind: CounterKind::Software,
            value: 1234,
            time_enabled_ns: 10,
            time_running_ns: 5,
        }],
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, "a model"))
    };
    if let Some(o) = v.rows[1].record.result.as_mut() {
        o.measurement_json = Some(serde_json::to_string(&m).expect("json"));
    }
    let attempts = [AttemptRow {
        trial: 1,
        attempt: 1,
        agent: "a<1>".into(),
        assigned_ms: 0,
        ended_ms: Some(5),
        outcome: Some("stored".into()),
        superseded: false,
    }];
    let page = trial_page(&v, 1, &attempts, "").expect("trial 1");
    assert!(page.contains("<td id=\"trial-objective\">1</td>"), "{page}");
    assert!(page.contains("<tr><th>x</th><td>0.5</td></tr>") && page.contains("<tr><th>kind</th><td>b</td></tr>"));
    assert!(page.contains("<td id=\"energy-source\">estimated</td>"), "{page}");
    assert!(page.contains("<td>task-clock</td><td class=\"n\">1234</td><td class=\"n\">50%</td>"), "{page}");
    assert!(page.contains("<pre id=\"log-tail\">epoch 3 &lt;done&gt;\n</pre>"), "{page}");
    assert!(page.contains("<td>a&lt;1&gt;</td><td>stored</td>"), "{page}");
    assert!(!page.contains("setInterval"), "a trial's page does not reload");
    // The failed trial: its failure line; no result stored.
    let failed = trial_page(&v, 3, &[], "").expect("trial 3");
    assert!(failed.contains("<td id=\"failure\">exit 1, `ImportError: &lt;torch&gt;`</td>"), "{failed}");
    assert!(failed.contains("id=\"no-result\""));
    assert!(trial_page(&v, 99, &[], "").is_none());
    // The study's page reloads its views from their own path.
    assert!(page_html(&v, "").contains("fetch(\"/study/s1/main\"+location.search)"));
}
