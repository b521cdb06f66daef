use super::model::log_expected_improvement;
use super::refine::{Refinement, BOUNDED, FULL, REFINED_FULL};
use super::*;
use crate::linalg::solve_lower;
use crate::pareto::{front, hypervolume};
use crate::proposer::Proposer;
use crate::proposer::Random;
use tunefleet_common::params::ParamValue;

fn float(low: f64, high: f64) -> ParamSpec {
    ParamSpec::Float { low, high, grid: 2 }
}

fn x(p: &Params, k: &str) -> f64 {
    p.get(k).and_then(ParamValue::as_f64).unwrap_or(f64::NAN)
}

/// A 3-d bowl with its minimum 0 at (0.3, 0.7, 0.5).
fn bowl(p: &Params) -> f64 {
    (x(p, "a") - 0.3).powi(2) + (x(p, "b") - 0.7).powi(2) + (x(p, "c") - 0.5).powi(2)
}

fn box3() -> Vec<(String, ParamSpec)> {
    ["a", "b", "c"].iter().map(|n| (n.to_string(), float(0.0, 1.0))).collect()
}

/// The best value found by `ask` in `n` sequential trials of `f`.
fn best_of(
    n: u64,
    mut ask: impl FnMut(u64) -> Params,
    mut tell: impl FnMut(u64, &Params, f64),
    f: fn(&Params) -> f64,
) -> f64 {
    let mut best = f64::INFINITY;
    for i in 0..n {
        let p = ask(i);
        let v = f(&p);
        tell(i, &p, v);
        best = best.min(v);
    }
    best
}

#[test]
fn the_model_finds_a_bowls_minimum_far_better_than_random_sampling() {
    // Same seeds, 30 trials each: the GP's best against random's best, seed
    // by seed. Random's expected best of 30 on this bowl is about 0.03.
    let mut wins = 0;
    let mut gp_bests = Vec::new();
    for seed in 0..5 {
        let mut gp = Gp::new(box3(), Direction::Minimize, 1, seed, GpSettings::default());
        let cell = std::cell::RefCell::new(&mut gp);
        let g = best_of(
            30,
            |i| cell.borrow().ask(i, &[]),
            |t, p, v| cell.borrow_mut().tell(t, p, Outcome::Complete(v)),
            bowl,
        );
        let mut random = Random::new(&box3(), seed);
        let r = best_of(30, |_| random.ask(&[]).expect("random asks forever"), |_, _, _| {}, bowl);
        if g < r / 10.0 {
            wins += 1;
        }
        gp_bests.push(g);
    }
    assert_eq!(wins, 5, "the GP's bests {gp_bests:?} should be 10x better than random's on every seed");
}

#[test]
fn asks_are_reproducible_and_stay_in_the_domain_on_lattices_and_categories() {
    let space = vec![
        ("lr".to_string(), ParamSpec::LogFloat { low: 1e-5, high: 1.0, grid: 2 }),
        ("n".to_string(), ParamSpec::Int { low: 16, high: 256, step: 16 }),
        (
            "opt".to_string(),
            ParamSpec::Categorical { values: vec![ParamValue::Text("adam".into()), ParamValue::Text("sgd".into())] },
        ),
        ("fixed".to_string(), ParamSpec::Int { low: 3, high: 3, step: 1 }),
    ];
    let f = |p: &Params| {
        (x(p, "lr").log10() + 3.0).powi(2)
            + ((x(p, "n") - 96.0) / 64.0).powi(2)
            + if p.get("opt") == Some(&ParamValue::Text("sgd".into())) { 0.0 } else { 1.0 }
    };
    let mut gp = Gp::new(space, Direction::Minimize, 1, 3, GpSettings::default());
    let mut asked = Vec::new();
    for i in 0..25 {
        let p = gp.ask(i, &[]);
        assert_eq!(p, gp.ask(i, &[]), "an ask is a function of the seed, its index and what was told");
        let lr = x(&p, "lr");
        let n = p.get("n").and_then(ParamValue::as_f64).expect("n");
        assert!((1e-5..=1.0).contains(&lr) && (16.0..=256.0).contains(&n) && n % 16.0 == 0.0, "{p:?}");
        assert_eq!(p.get("fixed"), Some(&ParamValue::Int(3)));
        gp.tell(i, &p, Outcome::Complete(f(&p)));
        asked.push(p);
    }
    let late_sgd = asked[15..].iter().filter(|p| p.get("opt") == Some(&ParamValue::Text("sgd".into()))).count();
    assert!(late_sgd >= 7, "the better category is chosen once learnt: {late_sgd} of 10");
}

#[test]
fn parallel_asks_spread_out_while_trials_run() {
    let (gp, running) = parallel_asks(GpSettings::default().batch, 11);
    for (i, a) in running.iter().enumerate() {
        for b in &running[i + 1..] {
            assert!(distance(a, b) > 1e-3, "two parallel asks at the same point: {a:?} {b:?}");
        }
    }
    // Without the running trials the same index asks what the first did.
    let alone = gp.ask(20, &[]);
    assert_eq!(alone, running[0]);
    assert_ne!(gp.ask(21, &[]), gp.ask(21, &[(20, &running[0])]), "the running trial changes the next ask");
}

#[test]
fn a_region_where_trials_were_stopped_is_avoided() {
    // Trials on the left half stopped early (ASHA) with reports that look
    // good, those on the right complete with middling values: the model
    // must not send the next asks to the left.
    let space = vec![("a".to_string(), float(0.0, 1.0))];
    let mut gp = Gp::new(space, Direction::Minimize, 1, 2, GpSettings::default());
    for i in 0..20u64 {
        let a = (i as f64 + 0.5) / 20.0;
        let p: Params = [("a".to_string(), ParamValue::Float(a))].into_iter().collect();
        if a < 0.5 {
            gp.tell(i, &p, Outcome::Pruned { epoch: 1, value: 0.0 });
        } else {
            gp.tell(i, &p, Outcome::Complete(1.0 + (a - 0.75).abs()));
        }
    }
    let left = (20..30).filter(|&i| x(&gp.ask(i, &[]), "a") < 0.5).count();
    assert!(left <= 3, "{left} of 10 asks went where every trial was stopped");
}

/// Two objectives on [0, 1]^2 (ZDT1-like: f1 = a, f2 = g (1 - sqrt(a / g))).
fn zdt(p: &Params) -> [f64; 2] {
    let (a, b) = (x(p, "a"), x(p, "b"));
    let g = 1.0 + 9.0 * b;
    [a, g * (1.0 - (a / g).sqrt())]
}

#[test]
fn several_objectives_are_searched_as_a_front() {
    // ParEGO against random sampling, same seeds, 40 trials: the front's
    // hypervolume from (1.1, 11) is larger on every seed.
    let space = || vec![("a".to_string(), float(0.0, 1.0)), ("b".to_string(), float(0.0, 1.0))];
    let volume = |points: &[Vec<f64>]| {
        let on: Vec<Vec<f64>> = front(points).into_iter().map(|i| points[i].clone()).collect();
        hypervolume(&on, &[1.1, 11.0])
    };
    for seed in 0..3 {
        let mut gp = Gp::new(space(), Direction::Minimize, 2, seed, GpSettings::default());
        let mut ours = Vec::new();
        for i in 0..40 {
            let p = gp.ask(i, &[]);
            let [f1, f2] = zdt(&p);
            gp.tell_values(i, &p, f1, &[f2]);
            ours.push(vec![f1, f2]);
        }
        let mut random = Random::new(&space(), seed);
        let theirs: Vec<Vec<f64>> = (0..40).map(|_| zdt(&random.ask(&[]).expect("random")).to_vec()).collect();
        let (o, t) = (volume(&ours), volume(&theirs));
        assert!(o > t, "seed {seed}: hypervolume {o} against random's {t}");
        // Both ends of the front are explored, not the first objective alone.
        let low_f2 = ours[20..].iter().filter(|v| v[1] < 0.3).count();
        let low_f1 = ours[20..].iter().filter(|v| v[0] < 0.3).count();
        assert!(low_f1 > 0 && low_f2 > 0, "seed {seed}: {ours:?}");
    }
}

#[test]
fn the_log_expected_improvement_is_continuous_and_increasing() {
    let mut last = f64::NEG_INFINITY;
    let mut z = -60.0;
    while z < 5.0 {
        let v = log_expected_improvement(z);
        assert!(v.is_finite() && v > last, "at {z}: {v} after {last}");
        last = v;
        z += 0.01;
    }
    for edge in [-1.0, -37.0] {
        let (a, b) = (log_expected_improvement(edge - 1e-9), log_expected_improvement(edge + 1e-9));
        assert!((a - b).abs() < 1e-3 * a.abs().max(1.0), "jump at {edge}: {a} {b}");
    }
}

#[test]
fn extreme_values_neither_panic_nor_make_an_ask_leave_its_domain() {
    // Finite but enormous values (a workload reporting garbage, or a hostile
    // one): the model may give up, the asks stay finite and in range.
    let mut gp = Gp::new(box3(), Direction::Minimize, 2, 5, GpSettings::default());
    for i in 0..30u64 {
        let p = gp.ask(i, &[]);
        for k in ["a", "b", "c"] {
            let v = x(&p, k);
            assert!(v.is_finite() && (0.0..=1.0).contains(&v), "ask {i}: {p:?}");
        }
        let huge = if i % 2 == 0 { 1e300 } else { -1e300 };
        gp.tell_values(i, &p, huge * (i as f64 + 1.0), &[f64::MAX / (i as f64 + 1.0)]);
    }
    let mut one = Gp::new(box3(), Direction::Maximize, 1, 5, GpSettings::default());
    for i in 0..20u64 {
        let p = one.ask(i, &[]);
        assert!(["a", "b", "c"].iter().all(|k| (0.0..=1.0).contains(&x(&p, k))), "{p:?}");
        one.tell(i, &p, Outcome::Complete(if i % 3 == 0 { f64::MAX } else { -f64::MAX }));
    }
}

#[test]
fn without_every_objective_measured_the_first_one_is_searched() {
    // Two objectives, the second never measured (an energy reading never
    // valid): the search still learns the first instead of sampling blindly.
    let mut gp = Gp::new(box3(), Direction::Minimize, 2, 7, GpSettings::default());
    let mut best = f64::INFINITY;
    for i in 0..30u64 {
        let p = gp.ask(i, &[]);
        let v = bowl(&p);
        best = best.min(v);
        gp.tell_values(i, &p, v, &[f64::NAN]);
    }
    assert!(best < 3e-3, "best {best}: the first objective was not searched");
}

/// Twenty told trials of the bowl, then four asks under `rule`, each while
/// the ones before it run: the search and the asks.
fn parallel_asks(rule: BatchRule, seed: u64) -> (Gp, Vec<Params>) {
    let settings = GpSettings { batch: rule, ..GpSettings::default() };
    let mut gp = Gp::new(box3(), Direction::Minimize, 1, seed, settings);
    for i in 0..20 {
        let p = gp.ask(i, &[]);
        gp.tell(i, &p, Outcome::Complete(bowl(&p)));
    }
    let mut running: Vec<(u64, Params)> = Vec::new();
    for i in 20..24 {
        let view: Vec<(u64, &Params)> = running.iter().map(|(t, p)| (*t, p)).collect();
        let p = gp.ask(i, &view);
        running.push((i, p));
    }
    (gp, running.into_iter().map(|(_, p)| p).collect())
}

fn distance(a: &Params, b: &Params) -> f64 {
    ["a", "b", "c"].iter().map(|k| (x(a, k) - x(b, k)).powi(2)).sum::<f64>().sqrt()
}

#[test]
fn every_batch_rule_spreads_the_asks_made_while_trials_run() {
    for rule in BatchRule::ALL {
        assert_eq!(BatchRule::from_name(rule.name()), Some(rule));
        // Ignoring the running trials, the four asks fall within 1e-5 of
        // one point (the refinement's last step). The believer with the
        // expected improvement, maximised precisely, asks on the rim its
        // believed value leaves around a running trial (8e-4 away here),
        // as the kriging believer is known to: apart, but barely.
        let (_, asks) = parallel_asks(rule, 11);
        for (i, a) in asks.iter().enumerate() {
            for b in &asks[i + 1..] {
                assert!(distance(a, b) > 1e-4, "{}: two parallel asks at one point: {a:?} {b:?}", rule.name());
            }
        }
    }
}

#[test]
fn local_penalisation_keeps_an_ask_off_the_ball_around_a_running_trial() {
    // The running trial sits at the bowl's minimum, where the expected
    // improvement is largest: without its penalty, the next ask lands on it
    // (within 1e-5, the refinement's last step). The ball's radius is the
    // believed gap to the best over the Lipschitz constant, next to nothing
    // at the minimum itself: the penalty keeps the ask off the point, no
    // farther (3e-4 here).
    let settings = GpSettings { batch: BatchRule::Penalise, ..GpSettings::default() };
    let mut gp = Gp::new(box3(), Direction::Minimize, 1, 5, settings);
    for i in 0..25 {
        let p = gp.ask(i, &[]);
        gp.tell(i, &p, Outcome::Complete(bowl(&p)));
    }
    let alone = gp.ask(25, &[]);
    let next = gp.ask(25, &[(25, &alone)]);
    assert!(distance(&alone, &next) > 1e-4, "{alone:?} then {next:?}");
}

#[test]
fn the_hyper_parameters_are_refitted_on_a_schedule_and_an_ask_stays_a_function_of_the_history() {
    let points: Vec<usize> = (28..=50).map(|n| fit_point(n, 30)).collect();
    assert_eq!(points, [28, 29, 30, 30, 30, 33, 33, 33, 36, 36, 36, 39, 39, 39, 42, 42, 42, 42, 46, 46, 46, 46, 50]);
    assert_eq!(fit_point(1000, 30), 972);
    // One search asked along the way (its fit remembered), one fresh with
    // the same history: the same asks, also after a trial is told again
    // with another value (the remembered fit is then not reused).
    let mut along = Gp::new(box3(), Direction::Minimize, 1, 9, GpSettings::default());
    let mut told = Vec::new();
    for i in 0..40 {
        let p = along.ask(i, &[]);
        along.tell(i, &p, Outcome::Complete(bowl(&p)));
        told.push(p);
    }
    let _ = along.ask(40, &[]);
    along.tell(3, &told[3], Outcome::Complete(50.0));
    let mut fresh = Gp::new(box3(), Direction::Minimize, 1, 9, GpSettings::default());
    for (i, p) in told.iter().enumerate() {
        let v = if i == 3 { 50.0 } else { bowl(p) };
        fresh.tell(i as u64, p, Outcome::Complete(v));
    }
    assert_eq!(along.ask(41, &[]), fresh.ask(41, &[]));
}

/// The configurations a study of `f` proposes over 45 asks with
/// `in_flight` trials running at each (the oldest told before the next
/// ask), with `paths`' arithmetic.
fn proposals(paths: Paths, seed: u64, in_flight: usize, settings: GpSettings) -> Vec<Params> {
    let settings = GpSettings { paths, ..settings };
    let space: Vec<(String, ParamSpec)> =
        ["a", "b", "c", "d"].iter().map(|n| (n.to_string(), float(0.0, 1.0))).collect();
    let f = |p: &Params| {
        ["a", "b", "c", "d"].iter().enumerate().map(|(i, k)| (x(p, k) - 0.2 * i as f64).powi(2)).sum::<f64>()
            + 0.1 * (7.0 * x(p, "a")).sin()
    };
    study_asks(Gp::new(space, Direction::Minimize, 1, seed, settings), 45, in_flight, f)
}

/// What `gp` proposes over `asks` asks of a study of `f` with `in_flight`
/// trials running at each (the oldest told before the next ask).
fn study_asks(mut gp: Gp, asks: u64, in_flight: usize, f: impl Fn(&Params) -> f64) -> Vec<Params> {
    let mut running: std::collections::VecDeque<(u64, Params)> = std::collections::VecDeque::new();
    let mut asked = Vec::new();
    for i in 0..asks {
        if running.len() >= in_flight {
            if let Some((t, p)) = running.pop_front() {
                gp.tell(t, &p, Outcome::Complete(f(&p)));
            }
        }
        let view: Vec<(u64, &Params)> = running.iter().map(|(t, p)| (*t, p)).collect();
        let p = gp.ask(i, &view);
        asked.push(p.clone());
        running.push_back((i, p));
    }
    assert!(gp.factored.borrow().is_some(), "the last ask's model is kept for the next");
    asked
}

#[test]
fn the_incremental_model_proposes_what_a_full_refactorisation_does() {
    // Told and running trials grow one by one, the hyper-parameters are
    // refitted along the way (at 30, 33, 36... told), and past 24 told the
    // model keeps a subset that shifts as trials are told (the factor's
    // known rows then end where the subsets part): every proposal as with
    // every factor computed afresh, one row at a time.
    let small = GpSettings { model_points: 24, ..GpSettings::default() };
    for (seed, in_flight, settings) in
        [(1, 1, GpSettings::default()), (2, 4, GpSettings::default()), (3, 1, small), (4, 4, small)]
    {
        let incremental = proposals(Paths::Fast, seed, in_flight, settings);
        let reference = proposals(Paths::Plain, seed, in_flight, settings);
        assert_eq!(incremental.len(), reference.len());
        for (i, (a, b)) in incremental.iter().zip(&reference).enumerate() {
            for k in ["a", "b", "c", "d"] {
                assert!(
                    (x(a, k) - x(b, k)).abs() <= 1e-12,
                    "seed {seed}, {in_flight} in flight, ask {i}: {a:?} against the reference {b:?}"
                );
            }
        }
    }
}

/// A space and a function on it.
type Problem = (Vec<(String, ParamSpec)>, fn(&Params) -> f64);

/// A space of every kind (two floats, a log float, an int on a lattice,
/// a categorical) and a function on it with a minimum inside.
fn mixed() -> Problem {
    let text =
        |v: &[&str]| ParamSpec::Categorical { values: v.iter().map(|s| ParamValue::Text(s.to_string())).collect() };
    let space = vec![
        ("a".to_string(), float(0.0, 1.0)),
        ("b".to_string(), float(-2.0, 2.0)),
        ("lr".to_string(), ParamSpec::LogFloat { low: 1e-4, high: 1.0, grid: 2 }),
        ("n".to_string(), ParamSpec::Int { low: 0, high: 40, step: 4 }),
        ("opt".to_string(), text(&["adam", "sgd", "rmsprop"])),
    ];
    let f = |p: &Params| {
        let opt = if p.get("opt") == Some(&ParamValue::Text("sgd".into())) { 0.0 } else { 0.3 };
        (x(p, "a") - 0.3).powi(2)
            + (x(p, "b") - 0.5).powi(2)
            + 0.2 * (3.0 * x(p, "b")).sin()
            + (x(p, "lr").log10() + 2.0).powi(2) / 4.0
            + ((x(p, "n") - 12.0) / 20.0).powi(2)
            + opt
    };
    (space, f)
}

#[test]
fn pruned_scoring_proposes_what_scoring_every_candidate_does() {
    // Seeded studies, sequential (the expected improvement) and with trials
    // in flight (the confidence bound, the believer's and a liar's expected
    // improvement), past the model size where the rows are solved in two
    // stages: every ask the same, bit for bit, as with every candidate's
    // and refinement step's variance computed.
    let (space, f) = mixed();
    for (seed, in_flight, batch) in
        [(1, 1, BatchRule::Ucb), (2, 4, BatchRule::Ucb), (3, 3, BatchRule::Believer), (4, 2, BatchRule::LiarMean)]
    {
        let settings = GpSettings { batch, ..GpSettings::default() };
        let gp = || Gp::new(space.clone(), Direction::Minimize, 1, seed, settings);
        let pruned = study_asks(gp(), 50, in_flight, f);
        let unpruned = GpSettings { paths: Paths::Unpruned, ..settings };
        let full = study_asks(Gp::new(space.clone(), Direction::Minimize, 1, seed, unpruned), 50, in_flight, f);
        for (i, (a, b)) in pruned.iter().zip(&full).enumerate() {
            assert_eq!(a, b, "seed {seed}, {in_flight} in flight, {}: ask {i}", batch.name());
        }
    }
}

#[test]
fn the_bound_widened_by_the_trials_in_flight_is_the_current_search_with_none() {
    // With none in flight its width is two deviations, and a
    // sequential study asks what the default search asks, bit for bit; with
    // trials in flight it widens with their number, and asks otherwise.
    assert_eq!(batch::pending_width(0).to_bits(), 2.0_f64.to_bits());
    let widths: Vec<f64> = (0..=16).map(batch::pending_width).collect();
    assert!(widths.windows(2).all(|w| w[0] < w[1]), "{widths:?}");
    let (space, f) = mixed();
    let settings = |batch| GpSettings { batch, ..GpSettings::default() };
    let asks = |in_flight, batch| {
        study_asks(Gp::new(space.clone(), Direction::Minimize, 1, 6, settings(batch)), 30, in_flight, f)
    };
    assert_eq!(asks(1, BatchRule::UcbPending), asks(1, GpSettings::default().batch));
    assert_ne!(asks(4, BatchRule::UcbPending), asks(4, BatchRule::Ucb));
}

#[test]
fn a_score_at_a_smaller_variance_never_exceeds_the_bound_at_a_larger() {
    // Across the branches of the log expected improvement (its asymptote
    // past 37 deviations overestimates by up to 3 / 37^2: a variance just
    // below where the incumbent is 37 deviations away scores above one just
    // at it) and for the confidence bound.
    let rules = [Rule::Ei { best: 0.0 }, Rule::Ucb { width: 2.0 }];
    for rule in rules {
        for &top in &[1e-12, 1e-6, 0.01, 1.0, 30.0] {
            let sd = f64::sqrt(top);
            for z in [-60.0, -37.0, -36.999_999, -20.0, -1.0, -0.999_999, 0.0, 0.5, 3.0] {
                let mu = -z * sd;
                for shrink in [1.0, 1.0 - 1e-7, 0.999, 0.5, 1e-3, 0.0] {
                    let var = (top * shrink).max(1e-12);
                    let (s, b) = (rule.score(mu, var), rule.bound(mu, top));
                    assert!(s <= b, "{rule:?}, variance {var} of {top}, mean {mu}: score {s} above the bound {b}");
                }
            }
        }
    }
}

#[test]
fn a_row_of_the_kernel_is_the_kernel_of_each_point_bit_for_bit() {
    // Both argument orders (the model's matrix takes a point's row over the
    // points before it), a numeric and a categorical axis, and a point equal
    // to the one asked about.
    let (space, _) = mixed();
    let gp = Gp::new(space, Direction::Minimize, 1, 0, GpSettings::default());
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut points: Vec<Vec<f64>> = (0..40)
        .map(|_| gp.cube.snap(gp.cube.axes.iter().map(|a| gp.cube.random_coordinate(a, &mut rng)).collect()))
        .collect();
    points.push(points[3].clone());
    let theta = Theta { length: vec![0.3, 1.7, 0.05, 0.9, 0.4], signal: 1.3, noise: 1e-4 };
    let cols = gp.cube.columns(&points, &theta);
    let mut row = Vec::new();
    for u in &points[..5] {
        gp.cube.kernel_row(&cols, points.len(), u, &theta, &mut row);
        for (x, k) in points.iter().zip(&row) {
            assert_eq!(k.to_bits(), gp.cube.kernel(x, u, &theta).to_bits(), "{x:?} {u:?}");
            assert_eq!(k.to_bits(), gp.cube.kernel(u, x, &theta).to_bits(), "{u:?} {x:?}");
        }
    }
}

#[test]
fn past_the_model_points_an_ask_keeps_the_last_asks_points_and_adds_the_new_one() {
    // Told points one by one past `max`: between two schedule points the
    // model's points are the last ask's with the new one at the end (its
    // factor continued a row, not computed again), never more than `max`,
    // the subset chosen again every `max / 10` points, the best point kept.
    let max = 40;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let x: Vec<Vec<f64>> = (0..200).map(|_| vec![rng.random::<f64>()]).collect();
    let y: Vec<f64> = (0..200).map(|_| rng.random::<f64>()).collect();
    let at = |n: usize| values::stable_subset(x[..n].to_vec(), y[..n].to_vec(), max);
    assert_eq!(at(max).0, x[..max].to_vec(), "all the points up to max");
    let mut chosen_again = 0;
    for n in max..199 {
        let (a, ya) = at(n);
        let (b, _) = at(n + 1);
        assert!(b.len() <= max, "{} points at {}", b.len(), n + 1);
        let best = y[..n].iter().copied().fold(f64::INFINITY, f64::min);
        assert!(ya.contains(&best), "the best point is kept at {n}");
        if b.len() == a.len() + 1 && b[..a.len()] == a[..] {
            assert_eq!(b[a.len()], x[n], "the new point at the end");
        } else {
            chosen_again += 1;
        }
    }
    // Once past max (all the points, then a subset), then at every step.
    assert_eq!(chosen_again, 1 + (199 - max) / (max / 10), "chosen again every max / 10 points, only then");
}

#[test]
fn the_refinement_walks_to_a_far_maximum_and_settles_on_it() {
    // A score peaked at c, the start half the box away on every axis: the
    // compass search keeps its step while it climbs and ends within its
    // last step of the peak. The bounded refinement (the step halved every
    // sweep, eight sweeps) moves at most 0.2 an axis and stops short.
    let gp = Gp::new(box3(), Direction::Minimize, 1, 1, GpSettings::default());
    let c = [0.33, 0.67, 0.02];
    let score = |us: &[Vec<f64>]| -> Vec<f64> {
        us.iter().map(|u| -u.iter().zip(&c).map(|(a, b)| (a - b).powi(2)).sum::<f64>()).collect()
    };
    let start = vec![0.8, 0.2, 0.5];
    let s0 = score(std::slice::from_ref(&start))[0];
    let far = |u: &[f64]| u.iter().zip(&c).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    let full = gp.cube.refine(vec![(s0, start.clone())], FULL, &score).expect("a point");
    assert!(far(&full) < 1e-4, "the compass search ends at {full:?}, not at {c:?}");
    let bounded = gp.cube.refine(vec![(s0, start)], BOUNDED, &score).expect("a point");
    assert!(far(&bounded) > 0.2, "the bounded refinement reached {bounded:?}");
    // Asks of a model of at most REFINED_FULL points are refined in full.
    assert!(Refinement::of(REFINED_FULL).compass && !Refinement::of(REFINED_FULL + 1).compass);
    assert_eq!((Refinement::of(10).starts, Refinement::of(1000).starts), (10, 3));
}

#[test]
fn an_expected_improvement_is_refined_from_the_incumbent_too() {
    // A score with a broad low hill around the candidates and a narrow high
    // peak beside the incumbent: every candidate climbs the hill; the
    // incumbent's own start climbs the peak.
    let gp = Gp::new(box3(), Direction::Minimize, 1, 1, GpSettings::default());
    let (hill, peak) = ([0.85, 0.85, 0.85], [0.2, 0.3, 0.4]);
    let d2 = |u: &[f64], c: &[f64]| u.iter().zip(c).map(|(a, b)| (a - b).powi(2)).sum::<f64>();
    let score = |us: &[Vec<f64>]| -> Vec<f64> {
        us.iter().map(|u| (-d2(u, &hill)).exp().max(2.0 * (-d2(u, &peak) / 0.002).exp())).collect()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let candidates: Vec<Vec<f64>> =
        (0..30).map(|_| (0..3).map(|_| 0.7 + 0.3 * rng.random::<f64>()).collect()).collect();
    let x: Vec<Vec<f64>> = (0..5).map(|i| vec![0.1 * i as f64, 0.5, 0.5]).collect();
    let y: Vec<f64> = (0..5).map(|i| i as f64).collect();
    let theta = Theta { length: vec![0.3; 3], signal: 1.0, noise: 1e-4 };
    let model = gp.cube.model(x, &y, &theta, None).expect("a model");
    let incumbent = [0.23, 0.28, 0.43];
    let with = gp.cube.maximise(&model, candidates.clone(), Some(&incumbent), &score).expect("a point");
    assert!(d2(&with, &peak) < 1e-6, "refined from the incumbent too, it ends at {with:?}, not at the peak");
    let without = gp.cube.maximise(&model, candidates, None, &score).expect("a point");
    assert!(d2(&without, &hill) < 1e-4, "from the candidates alone it ends on the hill, at {without:?}");
    // The pruned path starts from the incumbent under the expected
    // improvement alone.
    assert!(score::own_start(Rule::Ei { best: 0.0 }, &incumbent).is_some());
    assert!(score::own_start(Rule::Ucb { width: 2.0 }, &incumbent).is_none());
}

/// Levy's function in 3-d on [-10, 10]^3 (many ripples, its minimum 0 at
/// (1, 1, 1)), over `box3`'s unit coordinates.
fn levy3(p: &Params) -> f64 {
    let w: Vec<f64> = ["a", "b", "c"].iter().map(|k| 1.0 + (20.0 * x(p, k) - 10.0 - 1.0) / 4.0).collect();
    let pi = std::f64::consts::PI;
    let mid: f64 = w[..2].iter().map(|w| (w - 1.0).powi(2) * (1.0 + 10.0 * (pi * w + 1.0).sin().powi(2))).sum();
    (pi * w[0]).sin().powi(2) + mid + (w[2] - 1.0).powi(2) * (1.0 + (2.0 * pi * w[2]).sin().powi(2))
}

#[test]
fn with_trials_in_flight_a_study_refines_as_the_sequential_one_does() {
    // Four in flight against one, same seeds, 50 trials, the best value
    // seed by seed (floored at 1e-4): the confidence bound's width decides
    // how many of the parallel asks go on exploring. At one deviation the
    // geometric mean of the six ratios is 0.33; at two (the width before
    // the benchmark's fourth round) 3.5.
    let best = |seed, in_flight| {
        let asked =
            study_asks(Gp::new(box3(), Direction::Minimize, 1, seed, GpSettings::default()), 50, in_flight, levy3);
        asked.iter().map(levy3).fold(f64::INFINITY, f64::min)
    };
    let ratios: Vec<f64> = (0..6).map(|seed| best(seed, 4).max(1e-4) / best(seed, 1).max(1e-4)).collect();
    let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
    assert!(geo < 1.3, "four in flight over one, seed by seed: {ratios:?} (geometric mean {geo})");
}

#[test]
fn a_pathwise_draw_has_the_posterior_mean_and_variance() {
    // Paths drawn from random Fourier features and conditioned on six
    // points, against the model's own mean and variance at three points
    // (one near the data, two away from it) and the first two's
    // covariance: 2,000 draws, on three floats and on a float, a
    // categorical of three values and a float (the categorical one-hot in
    // the features; the two points away from the data differ in it alone).
    let x: Vec<Vec<f64>> = (0..6).map(|i| vec![0.15 * i as f64, 0.5, 0.3 + 0.05 * i as f64]).collect();
    let at = [vec![0.32, 0.5, 0.4], vec![0.9, 0.1, 0.8], vec![0.5, 0.9, 0.1]];
    paths_match_the_posterior(box3(), x, &at, vec![0.3; 3]);
    let three =
        ParamSpec::Categorical { values: ["p", "q", "r"].iter().map(|v| ParamValue::Text(v.to_string())).collect() };
    let mixed = vec![("a".to_string(), float(0.0, 1.0)), ("c".to_string(), three), ("b".to_string(), float(0.0, 1.0))];
    let x: Vec<Vec<f64>> = (0..6).map(|i| vec![0.15 * i as f64, (i % 3) as f64, 0.3 + 0.05 * i as f64]).collect();
    let at = [vec![0.95, 2.0, 0.95], vec![0.95, 0.0, 0.95], vec![0.5, 1.0, 0.1]];
    paths_match_the_posterior(mixed, x, &at, vec![0.3, 1.0, 0.3]);
}

fn paths_match_the_posterior(space: Vec<(String, ParamSpec)>, x: Vec<Vec<f64>>, at: &[Vec<f64>], length: Vec<f64>) {
    let gp = Gp::new(space, Direction::Minimize, 1, 1, GpSettings::default());
    let y: Vec<f64> = (0..x.len()).map(|i| ((i as f64) * 1.3).sin()).collect();
    let theta = Theta { length, signal: 1.0, noise: 1e-4 };
    let model = gp.cube.model(x, &y, &theta, None).expect("a model");
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let draws = 2000;
    let values: Vec<Vec<f64>> = (0..draws)
        .map(|_| {
            let path = batch::Path::draw(&gp.cube, &model, &mut rng).expect("a path");
            at.iter().map(|u| path.at(&gp.cube, &model, u)).collect()
        })
        .collect();
    for (j, u) in at.iter().enumerate() {
        let (mu, var) = model.predict(&gp.cube, u);
        let mean = values.iter().map(|v| v[j]).sum::<f64>() / draws as f64;
        let spread = values.iter().map(|v| (v[j] - mean).powi(2)).sum::<f64>() / (draws - 1) as f64;
        assert!((mean - mu).abs() < 4.0 * (var / draws as f64).sqrt() + 1e-3, "at {u:?}: mean {mean} against {mu}");
        assert!((spread / var - 1.0).abs() < 0.2, "at {u:?}: variance {spread} against {var}");
    }
    let n = model.x.len();
    let solved: Vec<Vec<f64>> = at[..2]
        .iter()
        .map(|u| {
            solve_lower(&model.chol, n, &model.x.iter().map(|x| gp.cube.kernel(x, u, &theta)).collect::<Vec<f64>>())
        })
        .collect();
    let cov =
        gp.cube.kernel(&at[0], &at[1], &theta) - solved[0].iter().zip(&solved[1]).map(|(a, b)| a * b).sum::<f64>();
    let m: Vec<f64> = (0..2).map(|j| values.iter().map(|v| v[j]).sum::<f64>() / draws as f64).collect();
    let seen = values.iter().map(|v| (v[0] - m[0]) * (v[1] - m[1])).sum::<f64>() / (draws - 1) as f64;
    let scale = (model.predict(&gp.cube, &at[0]).1 * model.predict(&gp.cube, &at[1]).1).sqrt();
    assert!((seen - cov).abs() < 0.1 * scale, "covariance {seen} against {cov} (scale {scale})");
}

#[test]
fn a_trust_region_doubles_after_three_improving_batches_and_halves_after_enough_that_do_not() {
    // Start-up of 2, batches of 2 (two in flight), 4 axes: ceil(4 / 2) = 2
    // batches without improvement halve the side.
    let improving: Vec<f64> = (0..8).map(|i| -(i as f64)).collect();
    assert_eq!(batch::trust_side(&improving, 2, 2, 4), 1.6, "three improving batches double 0.8");
    let flat = vec![0.0; 10];
    assert_eq!(batch::trust_side(&flat, 2, 2, 4), 0.2, "four flat batches halve twice");
    // A gain under a thousandth of a deviation is no gain.
    let tiny: Vec<f64> = (0..10).map(|i| -1e-4 * i as f64).collect();
    assert_eq!(batch::trust_side(&tiny, 2, 2, 4), 0.2);
    // Seven halvings fall below 0.5^7: back to the first side; one more
    // after it.
    assert_eq!(batch::trust_side(&vec![0.0; 2 + 2 * 14], 2, 2, 4), 0.8);
    assert_eq!(batch::trust_side(&vec![0.0; 2 + 2 * 16], 2, 2, 4), 0.4);
    assert_eq!(batch::trust_side(&[], 10, 16, 6), 0.8, "nothing told yet");
}

#[test]
fn the_batch_expected_improvement_is_the_mean_gain_over_joint_draws() {
    // Six told points, two running: the score of four candidates (two
    // near a running trial, one near the data, one away from both) against
    // the mean of `(min(best, f(running)) - f(u))+` over 200,000 joint
    // draws of the latent values at the running trials and the candidate
    // (it fails with the draws' shift of the candidate's mean left out, or
    // its variance not reduced by them); and a candidate on a running trial
    // gains nothing.
    let gp = Gp::new(box3(), Direction::Minimize, 1, 1, GpSettings::default());
    let x: Vec<Vec<f64>> = (0..6).map(|i| vec![0.15 * i as f64, 0.5, 0.3 + 0.05 * i as f64]).collect();
    let y: Vec<f64> = (0..6).map(|i| ((i as f64) * 1.3).sin()).collect();
    let theta = Theta { length: vec![0.3; 3], signal: 1.0, noise: 1e-4 };
    let model = gp.cube.model(x, &y, &theta, None).expect("a model");
    let means = model.told_means(&gp.cube);
    let at = (0..means.len()).min_by(|&a, &b| means[a].total_cmp(&means[b])).expect("points");
    let pending = vec![vec![0.5, 0.6, 0.5], vec![0.3, 0.4, 0.35]];
    let state = batch::Pending {
        cube: &gp.cube,
        model: &model,
        best: means[at],
        incumbent: &model.x[at],
        y: &y,
        pending: pending.clone(),
        history: &[],
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let joint = batch::Joint::draw(&state, &mut rng).expect("factored");
    let us = [vec![0.55, 0.62, 0.45], vec![0.7, 0.5, 0.6], vec![0.9, 0.1, 0.9], vec![0.52, 0.61, 0.51]];
    let scores = joint.scores(&state, &us);
    let n = model.x.len();
    for (u, score) in us.iter().zip(&scores) {
        let points: Vec<&Vec<f64>> = pending.iter().chain(std::iter::once(u)).collect();
        let solved: Vec<Vec<f64>> = points
            .iter()
            .map(|p| {
                solve_lower(&model.chol, n, &model.x.iter().map(|x| gp.cube.kernel(x, p, &theta)).collect::<Vec<f64>>())
            })
            .collect();
        let mean: Vec<f64> = points.iter().map(|p| model.predict_mean(&gp.cube, p)).collect();
        let mut cov = vec![0.0; 9];
        for a in 0..3 {
            for b in 0..3 {
                cov[a * 3 + b] = gp.cube.kernel(points[a], points[b], &theta)
                    - solved[a].iter().zip(&solved[b]).map(|(p, q)| p * q).sum::<f64>()
                    + if a == b { 1e-10 } else { 0.0 };
            }
        }
        let l = crate::linalg::cholesky(&cov, 3).expect("factored");
        let draws = 200_000;
        let mut draw_rng = ChaCha8Rng::seed_from_u64(17);
        let gains: Vec<f64> = (0..draws)
            .map(|_| {
                let z: Vec<f64> = (0..3).map(|_| standard_normal(&mut draw_rng)).collect();
                let f: Vec<f64> = (0..3).map(|i| mean[i] + (0..=i).map(|k| l[i * 3 + k] * z[k]).sum::<f64>()).collect();
                (f[0].min(f[1]).min(means[at]) - f[2]).max(0.0)
            })
            .collect();
        let seen = gains.iter().sum::<f64>() / draws as f64;
        let spread = (gains.iter().map(|g| (g - seen).powi(2)).sum::<f64>() / draws as f64).sqrt();
        // The score's own draws are 128: a looser bound than the brute
        // force's standard error (the score is within 3 % here).
        let gain = score.exp();
        assert!(
            (gain - seen).abs() < 0.06 * seen + 4.0 * spread / (draws as f64).sqrt(),
            "at {u:?}: the score's gain {gain} against {seen} over the joint draws"
        );
    }
    let on_running = joint.scores(&state, &pending[..1]);
    assert!(on_running[0] < scores[0] - 5.0, "on a running trial: {} against {}", on_running[0], scores[0]);
}

/// The bowl of `a`, `b` at (0.2, 0.2), and how far `a + b` falls short
/// of 1.2 (the constraint `a + b >= 1.2`): the feasible minimum is 0.32
/// at (0.6, 0.6), the unconstrained one infeasible.
fn constrained_bowl(p: &Params) -> (f64, f64) {
    let (a, b) = (x(p, "a"), x(p, "b"));
    ((a - 0.2).powi(2) + (b - 0.2).powi(2), (1.2 - a - b).max(0.0))
}

/// `n` sequential trials of [`constrained_bowl`], the violations told when
/// `tell_violations`: the best feasible value and the feasible trials among
/// the last `tail`.
fn constrained_run(seed: u64, n: u64, tail: u64, tell_violations: bool) -> (f64, u64) {
    let space: Vec<(String, ParamSpec)> = ["a", "b"].iter().map(|k| (k.to_string(), float(0.0, 1.0))).collect();
    let mut gp = Gp::new(space, Direction::Minimize, 1, seed, GpSettings::default());
    let (mut best, mut late_feasible) = (f64::INFINITY, 0);
    for i in 0..n {
        let p = gp.ask(i, &[]);
        let (v, violation) = constrained_bowl(&p);
        gp.tell(i, &p, Outcome::Complete(v));
        if tell_violations {
            gp.tell_violation(i, violation);
        }
        if violation == 0.0 {
            best = best.min(v);
            late_feasible += u64::from(i >= n - tail);
        }
    }
    (best, late_feasible)
}

/// Told the violations, the model searches along the constraint's boundary
/// and finds the feasible minimum (0.321 to 0.322 on three seeds); not
/// told, it chases the infeasible one (best feasible 0.36 to 0.51).
#[test]
fn told_violations_the_model_finds_the_feasible_minimum() {
    for seed in 0..3 {
        let (best, late) = constrained_run(seed, 30, 10, true);
        let (blind_best, blind_late) = constrained_run(seed, 30, 10, false);
        assert!(best < 0.33, "seed {seed}: best feasible {best} (the minimum is 0.32)");
        // The minimum is on the boundary: the asks straddle it (measured 3 to 5 of 10; blind, none).
        assert!(late >= 3, "seed {seed}: {late} of the last 10 asks feasible");
        assert!(late > blind_late, "seed {seed}: {late} feasible late asks against {blind_late} blind");
        assert!(best <= blind_best, "seed {seed}: {best} against {blind_best} blind");
    }
}

/// With trials in flight the constrained asks spread out (the believer),
/// and a violation told for a trial never told is ignored.
#[test]
fn constrained_asks_in_flight_differ_and_stray_violations_are_ignored() {
    let space: Vec<(String, ParamSpec)> = ["a", "b"].iter().map(|k| (k.to_string(), float(0.0, 1.0))).collect();
    let mut gp = Gp::new(space, Direction::Minimize, 1, 5, GpSettings::default());
    for i in 0..15 {
        let p = gp.ask(i, &[]);
        let (v, violation) = constrained_bowl(&p);
        gp.tell(i, &p, Outcome::Complete(v));
        gp.tell_violation(i, violation);
    }
    gp.tell_violation(99, 1.0);
    assert_eq!(gp.violations.len(), 15);
    let first = gp.ask(15, &[]);
    let second = gp.ask(16, &[(15, &first)]);
    assert_ne!(first, second, "the second ask sees the first in flight");
}

/// Told each constraint's signed value, a model per constraint: on the
/// constrained bowl it ends closer to the feasible minimum (0.32) than the
/// model of the total violation alone, which sees nothing inside the
/// feasible region.
#[test]
fn told_margins_a_model_per_constraint_ends_at_least_as_close() {
    let space: Vec<(String, ParamSpec)> = ["a", "b"].iter().map(|k| (k.to_string(), float(0.0, 1.0))).collect();
    let run = |seed: u64, margins: bool| {
        let mut gp = Gp::new(space.clone(), Direction::Minimize, 1, seed, GpSettings::default());
        let mut best = f64::INFINITY;
        for i in 0..25 {
            let p = gp.ask(i, &[]);
            let (v, violation) = constrained_bowl(&p);
            gp.tell(i, &p, Outcome::Complete(v));
            gp.tell_violation(i, violation);
            if margins {
                gp.tell_margins(i, &[1.2 - x(&p, "a") - x(&p, "b")]);
            }
            if violation == 0.0 {
                best = best.min(v);
            }
        }
        (best, gp.margins.len())
    };
    for seed in 0..3 {
        let (with, told) = run(seed, true);
        let (without, none) = run(seed, false);
        assert_eq!((told, none), (25, 0));
        // Measured: 0.32005 to 0.32026 with, 0.3229 to 0.3269 without.
        assert!(with < 0.321 && with < without, "seed {seed}: {with} with the margins, {without} without");
    }
}
