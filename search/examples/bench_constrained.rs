//! The constrained search benchmark's Tunefleet side
//! (`scripts/bench-constrained.sh`): `gp` and `tpe` in-process on four
//! constrained problems from the literature, each trial told its value and
//! its total violation (Optuna's rule: the sum of how far each constraint
//! is missed). One JSON line per (problem, seed, workers): the best
//! feasible value after the budget (`null` when none was feasible) and the
//! trials until the first feasible one.
//!
//! Problems: Gardner et al. 2014's first (`gardner`), Gramacy et al.
//! 2016's toy (`gramacy`), and two never tuned on: Simionescu's
//! (`simionescu`) and Mishra's bird, constrained (`mishra_bird`).
//!
//! `workers = 4`: four trials in flight, the oldest finishes, one more is
//! asked while the other three run, as the Optuna side does.
//!
//! Usage: `bench_constrained SEEDS BUDGET WORKERS [PROBLEM...]`, the
//! strategy in `STRATEGY` (`gp` or `tpe`).

use tunefleet_common::params::{ParamValue, Params};
use tunefleet_search::gp::{Gp, GpSettings};
use tunefleet_search::space::{Direction, ParamSpec};
use tunefleet_search::tpe::{Outcome, Tpe, TpeSettings};
use tunefleet_search::Sampler;

struct Problem {
    name: &'static str,
    space: Vec<(String, ParamSpec)>,
    /// The value and each constraint's signed value (at most 0: it holds).
    f: fn(&Params) -> (f64, Vec<f64>),
}

fn float(p: &Params, k: &str) -> f64 {
    p.get(k).and_then(ParamValue::as_f64).unwrap_or(f64::NAN)
}

fn space(bounds: &[(&str, f64, f64)]) -> Vec<(String, ParamSpec)> {
    bounds.iter().map(|(n, low, high)| (n.to_string(), ParamSpec::Float { low: *low, high: *high, grid: 2 })).collect()
}

fn gardner(p: &Params) -> (f64, Vec<f64>) {
    let (x, y) = (float(p, "x"), float(p, "y"));
    (x.sin() + y, vec![x.sin() * y.sin() + 0.95])
}

fn gramacy(p: &Params) -> (f64, Vec<f64>) {
    let (x, y) = (float(p, "x"), float(p, "y"));
    let c1 = 1.5 - x - 2.0 * y - 0.5 * (2.0 * std::f64::consts::PI * (x * x - 2.0 * y)).sin();
    let c2 = x * x + y * y - 1.5;
    (x + y, vec![c1, c2])
}

fn simionescu(p: &Params) -> (f64, Vec<f64>) {
    let (x, y) = (float(p, "x"), float(p, "y"));
    let r = 1.0 + 0.2 * (8.0 * x.atan2(y)).cos();
    (0.1 * x * y, vec![x * x + y * y - r * r])
}

fn mishra_bird(p: &Params) -> (f64, Vec<f64>) {
    let (x, y) = (float(p, "x"), float(p, "y"));
    let f = y.sin() * (1.0 - x.cos()).powi(2).exp() + x.cos() * (1.0 - y.sin()).powi(2).exp() + (x - y).powi(2);
    (f, vec![(x + 5.0).powi(2) + (y + 5.0).powi(2) - 25.0])
}

fn problems() -> Vec<Problem> {
    vec![
        Problem { name: "gardner", space: space(&[("x", 0.0, 6.0), ("y", 0.0, 6.0)]), f: gardner },
        Problem { name: "gramacy", space: space(&[("x", 0.0, 1.0), ("y", 0.0, 1.0)]), f: gramacy },
        Problem { name: "simionescu", space: space(&[("x", -1.25, 1.25), ("y", -1.25, 1.25)]), f: simionescu },
        Problem { name: "mishra_bird", space: space(&[("x", -10.0, 0.0), ("y", -6.5, 0.0)]), f: mishra_bird },
    ]
}

fn sampler(strategy: &str, space: &[(String, ParamSpec)], seed: u64) -> Box<dyn Sampler> {
    match strategy {
        "gp" => Box::new(Gp::new(space.to_vec(), Direction::Minimize, 1, seed, GpSettings::default())),
        _ => Box::new(Tpe::new(space.to_vec(), Direction::Minimize, seed, TpeSettings::default())),
    }
}

/// One study: the best feasible value and the trials until the first feasible one.
fn study(problem: &Problem, strategy: &str, seed: u64, budget: u64, workers: usize) -> (Option<f64>, Option<u64>) {
    let mut s = sampler(strategy, &problem.space, seed);
    let mut in_flight: std::collections::VecDeque<(u64, Params)> = Default::default();
    let (mut asked, mut finished) = (0u64, 0u64);
    let (mut best, mut first) = (None::<f64>, None::<u64>);
    while finished < budget {
        while in_flight.len() < workers.max(1) && asked < budget {
            let running: Vec<(u64, &Params)> = in_flight.iter().map(|(t, p)| (*t, p)).collect();
            let p = s.ask(asked, &running);
            in_flight.push_back((asked, p));
            asked += 1;
        }
        let Some((trial, p)) = in_flight.pop_front() else { break };
        let (value, margins) = (problem.f)(&p);
        let violation: f64 = margins.iter().map(|c| c.max(0.0)).sum();
        s.tell(trial, &p, Outcome::Complete(value));
        s.tell_violation(trial, violation);
        // TOLD=violation: the total alone, as a search resumed from a store is told.
        if std::env::var("TOLD").as_deref() != Ok("violation") {
            s.tell_margins(trial, &margins);
        }
        finished += 1;
        if violation == 0.0 {
            best = Some(best.map_or(value, |b: f64| b.min(value)));
            first.get_or_insert(finished);
        }
    }
    (best, first)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (seeds, budget, workers) = (number(0, 20), number(1, 40), number(2, 1) as usize);
    let only: Vec<&String> = args.iter().skip(3).collect();
    let strategy = std::env::var("STRATEGY").unwrap_or_else(|_| "gp".into());
    for problem in problems().iter().filter(|p| only.is_empty() || only.iter().any(|o| o.as_str() == p.name)) {
        for seed in 0..seeds {
            let (best, first) = study(problem, &strategy, seed, budget, workers);
            let json = |v: Option<String>| v.unwrap_or_else(|| "null".into());
            println!(
                "{{\"side\":\"tunefleet-{strategy}\",\"fn\":\"{}\",\"seed\":{seed},\"workers\":{workers},\"best\":{},\"first_feasible\":{}}}",
                problem.name,
                json(best.map(|b| b.to_string())),
                json(first.map(|f| f.to_string()))
            );
        }
    }
}
