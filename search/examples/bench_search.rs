//! The search benchmark's Tunefleet side (`scripts/bench-search.sh`): runs
//! Tunefleet's own TPE (`tunefleet_search::tpe`, the code
//! a `kind = "tpe"` study asks) in-process on standard test functions and
//! prints one JSON line per (function, seed, workers) with the regret of
//! the best trial after 50 and after 100 trials.
//!
//! `workers = 4` simulates four agents of equal speed: four trials in
//! flight, the oldest finishes, one more is asked while the other three run
//! (TPE's constant liar sees them), exactly as the Optuna side does with its
//! ask-and-tell interface.
//!
//! Usage: `bench_search SEEDS BUDGET WORKERS [FUNCTION...]`.

use std::f64::consts::PI;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tunefleet_common::params::{ParamValue, Params};
use tunefleet_search::gp::{BatchRule, Gp, GpSettings};
use tunefleet_search::space::{Direction, ParamSpec};
use tunefleet_search::tpe::{Outcome, Tpe, TpeSettings};
use tunefleet_search::Sampler;

/// A test function: its space, its value (noise-free) and its minimum.
struct Function {
    name: &'static str,
    space: Vec<(String, ParamSpec)>,
    f: fn(&Params) -> f64,
    optimum: f64,
    /// Standard deviation of the Gaussian noise added to what the sampler sees.
    noise: f64,
}

fn float(p: &Params, k: &str) -> f64 {
    p.get(k).and_then(ParamValue::as_f64).unwrap_or(f64::NAN)
}

/// The values of `x0` .. `x{n-1}`.
fn coords(p: &Params, n: usize) -> Vec<f64> {
    (0..n).map(|i| float(p, &format!("x{i}"))).collect()
}

fn box_space(names: &[&str], low: f64, high: f64) -> Vec<(String, ParamSpec)> {
    names.iter().map(|n| (n.to_string(), ParamSpec::Float { low, high, grid: 2 })).collect()
}

fn branin(p: &Params) -> f64 {
    let (x1, x2) = (float(p, "x1"), float(p, "x2"));
    let b = 5.1 / (4.0 * PI * PI);
    let c = 5.0 / PI;
    let t = 1.0 / (8.0 * PI);
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

fn hartmann6(p: &Params) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [1312.0, 1696.0, 5569.0, 124.0, 8283.0, 5886.0],
        [2329.0, 4135.0, 8307.0, 3736.0, 1004.0, 9991.0],
        [2348.0, 1451.0, 3522.0, 2883.0, 3047.0, 6650.0],
        [4047.0, 8828.0, 8732.0, 5743.0, 1091.0, 381.0],
    ];
    let x = coords(p, 6);
    -(0..4)
        .map(|i| ALPHA[i] * (-(0..6).map(|j| A[i][j] * (x[j] - P[i][j] * 1e-4).powi(2)).sum::<f64>()).exp())
        .sum::<f64>()
}

fn styblinski_tang(p: &Params) -> f64 {
    coords(p, 4).into_iter().map(|x| 0.5 * (x.powi(4) - 16.0 * x * x + 5.0 * x)).sum()
}

fn rosenbrock(p: &Params) -> f64 {
    let x = coords(p, 4);
    x.windows(2).map(|w| 100.0 * (w[1] - w[0] * w[0]).powi(2) + (1.0 - w[0]).powi(2)).sum()
}

fn mixed(p: &Params) -> f64 {
    let offset = match p.get("opt").map(ToString::to_string).as_deref() {
        Some("adam") => 0.0,
        Some("rmsprop") => 0.25,
        Some("sgd") => 0.5,
        _ => 1.0,
    };
    (float(p, "x") - 0.7).powi(2)
        + (float(p, "lr").log10() + 3.0).powi(2) / 4.0
        + ((float(p, "n") - 17.0) / 10.0).powi(2)
        + ((float(p, "batch") - 96.0) / 64.0).powi(2)
        + offset
}

/// Held out: never looked at while the batch rules were written.
fn levy(p: &Params) -> f64 {
    let w: Vec<f64> = coords(p, 5).iter().map(|x| 1.0 + (x - 1.0) / 4.0).collect();
    let last = w[4];
    (PI * w[0]).sin().powi(2)
        + w[..4].iter().map(|wi| (wi - 1.0).powi(2) * (1.0 + 10.0 * (PI * wi + 1.0).sin().powi(2))).sum::<f64>()
        + (last - 1.0).powi(2) * (1.0 + (2.0 * PI * last).sin().powi(2))
}

fn hartmann3(p: &Params) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 3]; 4] = [[3.0, 10.0, 30.0], [0.1, 10.0, 35.0], [3.0, 10.0, 30.0], [0.1, 10.0, 35.0]];
    const P: [[f64; 3]; 4] =
        [[3689.0, 1170.0, 2673.0], [4699.0, 4387.0, 7470.0], [1091.0, 8732.0, 5547.0], [381.0, 5743.0, 8828.0]];
    let x = coords(p, 3);
    -(0..4)
        .map(|i| ALPHA[i] * (-(0..3).map(|j| A[i][j] * (x[j] - P[i][j] * 1e-4).powi(2)).sum::<f64>()).exp())
        .sum::<f64>()
}

fn ackley(p: &Params) -> f64 {
    let x = coords(p, 4);
    let n = x.len() as f64;
    let s1 = x.iter().map(|v| v * v).sum::<f64>() / n;
    let s2 = x.iter().map(|v| (2.0 * PI * v).cos()).sum::<f64>() / n;
    -20.0 * (-0.2 * s1.sqrt()).exp() - s2.exp() + 20.0 + std::f64::consts::E
}

fn camel(p: &Params) -> f64 {
    let (x, y) = (float(p, "x1"), float(p, "x2"));
    (4.0 - 2.1 * x * x + x.powi(4) / 3.0) * x * x + x * y + (-4.0 + 4.0 * y * y) * y * y
}

fn rastrigin(p: &Params) -> f64 {
    let x = coords(p, 3);
    10.0 * x.len() as f64 + x.iter().map(|v| v * v - 10.0 * (2.0 * PI * v).cos()).sum::<f64>()
}

fn dixon_price(p: &Params) -> f64 {
    let x = coords(p, 4);
    (x[0] - 1.0).powi(2) + (1..4).map(|i| (i + 1) as f64 * (2.0 * x[i] * x[i] - x[i - 1]).powi(2)).sum::<f64>()
}

fn griewank(p: &Params) -> f64 {
    let x = coords(p, 5);
    let product: f64 = x.iter().enumerate().map(|(i, v)| (v / ((i + 1) as f64).sqrt()).cos()).product();
    1.0 + x.iter().map(|v| v * v).sum::<f64>() / 4000.0 - product
}

fn himmelblau(p: &Params) -> f64 {
    let (x, y) = (float(p, "x"), float(p, "y"));
    (x * x + y - 11.0).powi(2) + (x + y * y - 7.0).powi(2)
}

fn functions() -> Vec<Function> {
    let text =
        |v: &[&str]| ParamSpec::Categorical { values: v.iter().map(|s| ParamValue::Text(s.to_string())).collect() };
    vec![
        Function {
            name: "branin",
            space: vec![
                ("x1".into(), ParamSpec::Float { low: -5.0, high: 10.0, grid: 2 }),
                ("x2".into(), ParamSpec::Float { low: 0.0, high: 15.0, grid: 2 }),
            ],
            f: branin,
            optimum: 0.397_887_357_729_738,
            noise: 0.0,
        },
        Function {
            name: "hartmann6",
            space: box_space(&["x0", "x1", "x2", "x3", "x4", "x5"], 0.0, 1.0),
            f: hartmann6,
            optimum: -3.322_368_011_415_51,
            noise: 0.0,
        },
        Function {
            name: "styblinski_tang4",
            space: box_space(&["x0", "x1", "x2", "x3"], -5.0, 5.0),
            f: styblinski_tang,
            optimum: -39.166_165_703_771_42 * 4.0,
            noise: 0.0,
        },
        Function {
            name: "rosenbrock4",
            space: box_space(&["x0", "x1", "x2", "x3"], -2.048, 2.048),
            f: rosenbrock,
            optimum: 0.0,
            noise: 0.0,
        },
        Function {
            name: "mixed_int_cat",
            space: vec![
                ("x".into(), ParamSpec::Float { low: -3.0, high: 3.0, grid: 2 }),
                ("lr".into(), ParamSpec::LogFloat { low: 1e-5, high: 1.0, grid: 2 }),
                ("n".into(), ParamSpec::Int { low: 0, high: 30, step: 1 }),
                ("batch".into(), ParamSpec::Int { low: 16, high: 256, step: 16 }),
                ("opt".into(), text(&["adam", "sgd", "rmsprop", "adagrad"])),
            ],
            f: mixed,
            optimum: 0.0,
            noise: 0.0,
        },
        Function {
            name: "himmelblau_noisy",
            space: box_space(&["x", "y"], -5.0, 5.0),
            f: himmelblau,
            optimum: 0.0,
            noise: 1.0,
        },
        Function {
            name: "levy5",
            space: box_space(&["x0", "x1", "x2", "x3", "x4"], -10.0, 10.0),
            f: levy,
            optimum: 0.0,
            noise: 0.0,
        },
        Function {
            name: "hartmann3",
            space: box_space(&["x0", "x1", "x2"], 0.0, 1.0),
            f: hartmann3,
            optimum: -3.862_782_147_820_756,
            noise: 0.0,
        },
        Function {
            name: "ackley4",
            space: box_space(&["x0", "x1", "x2", "x3"], -5.0, 5.0),
            f: ackley,
            optimum: 0.0,
            noise: 0.0,
        },
        Function {
            name: "camel",
            space: vec![
                ("x1".into(), ParamSpec::Float { low: -3.0, high: 3.0, grid: 2 }),
                ("x2".into(), ParamSpec::Float { low: -2.0, high: 2.0, grid: 2 }),
            ],
            f: camel,
            optimum: -1.031_628_453_489_877,
            noise: 0.0,
        },
        // Held out from the width of the confidence bound (fourth
        // round): added after it was chosen.
        Function {
            name: "rastrigin3",
            space: box_space(&["x0", "x1", "x2"], -5.12, 5.12),
            f: rastrigin,
            optimum: 0.0,
            noise: 0.0,
        },
        Function {
            name: "dixon_price4",
            space: box_space(&["x0", "x1", "x2", "x3"], -10.0, 10.0),
            f: dixon_price,
            optimum: 0.0,
            noise: 0.0,
        },
        Function {
            name: "griewank5",
            space: box_space(&["x0", "x1", "x2", "x3", "x4"], -10.0, 10.0),
            f: griewank,
            optimum: 0.0,
            noise: 0.0,
        },
    ]
}

/// A problem of two objectives (both minimised) and the reference point
/// its hypervolume is measured from.
struct TwoObjectives {
    name: &'static str,
    space: Vec<(String, ParamSpec)>,
    f: fn(&Params) -> [f64; 2],
    reference: [f64; 2],
}

/// ZDT1 of 5 variables (convex front f2 = 1 - sqrt(f1)).
fn zdt1(p: &Params) -> [f64; 2] {
    let x = coords(p, 5);
    let g = 1.0 + 9.0 * x[1..].iter().sum::<f64>() / 4.0;
    [x[0], g * (1.0 - (x[0] / g).sqrt())]
}

/// Fonseca-Fleming of 3 variables (concave front).
fn fonseca_fleming(p: &Params) -> [f64; 2] {
    let x = coords(p, 3);
    let c = 1.0 / 3f64.sqrt();
    let f = |s: f64| 1.0 - (-x.iter().map(|v| (v - s * c).powi(2)).sum::<f64>()).exp();
    [f(1.0), f(-1.0)]
}

fn two_objective_problems() -> Vec<TwoObjectives> {
    vec![
        TwoObjectives {
            name: "zdt1",
            space: box_space(&["x0", "x1", "x2", "x3", "x4"], 0.0, 1.0),
            f: zdt1,
            reference: [1.1, 11.0],
        },
        TwoObjectives {
            name: "fonseca_fleming",
            space: box_space(&["x0", "x1", "x2"], -4.0, 4.0),
            f: fonseca_fleming,
            reference: [1.0, 1.0],
        },
    ]
}

/// The hypervolume of two-objective points (minimised) from `reference`.
fn hypervolume2(points: &[[f64; 2]], reference: [f64; 2]) -> f64 {
    let mut inside: Vec<[f64; 2]> =
        points.iter().copied().filter(|p| p[0] < reference[0] && p[1] < reference[1]).collect();
    inside.sort_by(|a, b| a[0].total_cmp(&b[0]).then(a[1].total_cmp(&b[1])));
    let (mut volume, mut ceiling) = (0.0, reference[1]);
    for p in inside {
        if p[1] < ceiling {
            volume += (reference[0] - p[0]) * (ceiling - p[1]);
            ceiling = p[1];
        }
    }
    volume
}

/// One two-objective study as [`study`] runs one: the hypervolume of all
/// trials after 50 and after `budget` trials.
fn study2(problem: &TwoObjectives, strategy: &str, seed: u64, budget: u64, workers: usize) -> (f64, f64) {
    let mut sampler = sampler(strategy, &problem.space, 2, seed);
    let (mut seen, mut at50) = (Vec::new(), f64::NAN);
    let _ = drive(&mut sampler, budget, workers, |sampler, trial, p| {
        let v = (problem.f)(&p);
        sampler.tell_values(trial, &p, v[0], &[v[1]]);
        seen.push(v);
        if seen.len() == 50 {
            at50 = hypervolume2(&seen, problem.reference);
        }
    });
    (at50, hypervolume2(&seen, problem.reference))
}

/// Runs `budget` trials with `workers` in flight: asks while fewer are in
/// flight, then `finish`es the oldest (which tells the sampler). Returns
/// each ask's time in milliseconds.
fn drive(
    sampler: &mut Box<dyn Sampler>,
    budget: u64,
    workers: usize,
    mut finish: impl FnMut(&mut Box<dyn Sampler>, u64, Params),
) -> Vec<f64> {
    let mut times = Vec::new();
    let mut in_flight: std::collections::VecDeque<(u64, Params)> = Default::default();
    let (mut asked, mut finished) = (0u64, 0u64);
    while finished < budget {
        while in_flight.len() < workers.max(1) && asked < budget {
            let running: Vec<(u64, &Params)> = in_flight.iter().map(|(t, p)| (*t, p)).collect();
            let started = std::time::Instant::now();
            let p = sampler.ask(asked, &running);
            times.push(started.elapsed().as_secs_f64() * 1e3);
            in_flight.push_back((asked, p));
            asked += 1;
        }
        let Some((trial, p)) = in_flight.pop_front() else { break };
        finish(sampler, trial, p);
        finished += 1;
    }
    times
}

/// One study: `budget` trials with `workers` in flight; the regret (true
/// value minus the optimum) of the trial with the best observed value
/// after 50 and after `budget` trials, the median time of an ask (ms), and
/// the regret after each trial.
fn study(fun: &Function, strategy: &str, seed: u64, budget: u64, workers: usize) -> (f64, f64, f64, Vec<f64>) {
    let mut sampler = sampler(strategy, &fun.space, 1, seed);
    let mut noise = ChaCha8Rng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let (mut best_seen, mut best_true) = (f64::INFINITY, f64::INFINITY);
    let (mut finished, mut at50) = (0u64, f64::NAN);
    let mut curve = Vec::new();
    let mut times = drive(&mut sampler, budget, workers, |sampler, trial, p| {
        let truth = (fun.f)(&p);
        let seen = if fun.noise > 0.0 {
            let (u1, u2) = (1.0 - noise.random::<f64>(), noise.random::<f64>());
            truth + fun.noise * (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
        } else {
            truth
        };
        sampler.tell(trial, &p, Outcome::Complete(seen));
        if seen < best_seen {
            best_seen = seen;
            best_true = truth;
        }
        finished += 1;
        curve.push(best_true - fun.optimum);
        if finished == 50 {
            at50 = best_true - fun.optimum;
        }
    });
    times.sort_by(f64::total_cmp);
    (at50, best_true - fun.optimum, times.get(times.len() / 2).copied().unwrap_or(f64::NAN), curve)
}

/// The sampler under test: `kind = "gp"` for "gp", else `kind = "tpe"`,
/// over `space` with `objectives` objectives.
fn sampler(strategy: &str, space: &[(String, ParamSpec)], objectives: usize, seed: u64) -> Box<dyn Sampler> {
    let space = space.to_vec();
    match strategy {
        "gp" => {
            let mut settings = GpSettings::default();
            if let Some(batch) = std::env::var("GP_BATCH").ok().and_then(|b| BatchRule::from_name(&b)) {
                settings.batch = batch;
            }
            if let Some(from) = std::env::var("GP_REFIT_FROM").ok().and_then(|v| v.parse().ok()) {
                settings.refit_from = from;
            }
            if let Some(n) = std::env::var("GP_CANDIDATES").ok().and_then(|v| v.parse().ok()) {
                settings.candidates = n;
            }
            if let Some(n) = std::env::var("GP_FIT_EVALS").ok().and_then(|v| v.parse().ok()) {
                settings.fit_evals = n;
            }
            if let Some(points) = std::env::var("GP_MODEL_POINTS").ok().and_then(|v| v.parse().ok()) {
                settings.model_points = points;
            }
            Box::new(Gp::new(space, Direction::Minimize, objectives, seed, settings))
        }
        _ => Box::new(Tpe::new(space, Direction::Minimize, seed, TpeSettings::default()).with_objectives(objectives)),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (seeds, budget, workers) = (number(0, 10), number(1, 100), number(2, 1) as usize);
    let only: Vec<&String> = args.iter().skip(3).collect();
    let strategy = std::env::var("STRATEGY").unwrap_or_else(|_| "tpe".into());
    // BENCH_SIDE: the side's name in the output (two builds or settings side by side).
    let side = match (strategy.as_str(), std::env::var("GP_BATCH"), std::env::var("BENCH_SIDE")) {
        (_, _, Ok(side)) => side,
        ("tpe", _, _) => "tunefleet".to_string(),
        ("gp", Ok(batch), _) => format!("tunefleet-gp-{batch}"),
        _ => format!("tunefleet-{strategy}"),
    };
    // SEED_FROM: seeds from there (to confirm on seeds a comparison never saw).
    let first: u64 = std::env::var("SEED_FROM").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    for fun in functions().iter().filter(|f| only.is_empty() || only.iter().any(|o| o.as_str() == f.name)) {
        for seed in first..first + seeds {
            let (r50, r100, ask_ms, curve) = study(fun, &strategy, seed, budget, workers);
            // BENCH_CURVE: the regret after every trial too.
            let curve = match std::env::var("BENCH_CURVE") {
                Ok(_) => format!(
                    ",\"curve\":[{}]",
                    curve.iter().map(|v| format!("{v:e}")).collect::<Vec<String>>().join(",")
                ),
                Err(_) => String::new(),
            };
            println!(
                "{{\"side\":\"{side}\",\"fn\":\"{}\",\"seed\":{seed},\"workers\":{workers},\"regret50\":{r50},\"regret100\":{r100},\"ask_ms\":{ask_ms}{curve}}}",
                fun.name
            );
        }
    }
    for problem in
        two_objective_problems().iter().filter(|p| only.is_empty() || only.iter().any(|o| o.as_str() == p.name))
    {
        for seed in 0..seeds {
            let (h50, h100) = study2(problem, &strategy, seed, budget, workers);
            println!(
                "{{\"side\":\"{side}\",\"fn\":\"{}\",\"seed\":{seed},\"workers\":{workers},\"hv50\":{h50},\"hv100\":{h100}}}",
                problem.name
            );
        }
    }
}
