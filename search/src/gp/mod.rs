//! Bayesian optimisation with a Gaussian process (`kind = "gp"`): for the
//! small budgets of real trials (tens to a few hundred), a model of the
//! objective over the whole space finds better configurations than TPE's
//! density ratio, as Optuna's own `GPSampler` and the literature on TPE's
//! weaknesses show (BENCHMARKS.md, "Search quality against Optuna 5"
//! measures it against Optuna 5's default TPE). Seeded and reproducible:
//! an ask is a function of the seed, its index and the told and running
//! trials, so a resumed study asks the same.
//!
//! # How it chooses
//!
//! - Until [`GpSettings::startup`] trials are told, configurations are drawn
//!   at random ([`crate::sample`]), as TPE does.
//! - Coordinates: every parameter with more than one value is an axis of
//!   the unit cube (a float linearly, a log_float in log space, an int by
//!   its lattice index, always rounded to the lattice before it is scored);
//!   a categorical is its value's index, compared for equality only.
//! - The model: a Gaussian process with a constant mean and a Matérn 5/2
//!   kernel with one length scale per axis (a categorical axis adds
//!   `1 / length^2` to the squared distance when two values differ, a
//!   Hamming kernel), a signal and a noise variance, on the told values
//!   standardised (mean 0, deviation 1) after a monotone warping that keeps
//!   a few huge values from flattening the rest (values above the median
//!   are compressed as `median + s * ln(1 + (y - median) / s)`, `s` their
//!   interquartile range). Its hyper-parameters maximise the marginal
//!   likelihood with weak log-normal priors (Nelder-Mead in log space,
//!   from the same start every ask, so the ask does not depend on history).
//! - The next configuration maximises the log of the expected improvement
//!   over the best posterior mean at a told configuration (robust to
//!   noise), over [`GpSettings::candidates`] random points and
//!   perturbations of the best told ones, the best few then refined one
//!   axis at a time ([`refine::Refinement`]: the ten best by compass search to a
//!   step of 1e-5 while the model has at most 100 points, the three best
//!   on a halving step beyond; BENCHMARKS.md measured the ten against Optuna's
//!   `GPSampler`, whose ten local searches they follow), and the incumbent
//!   itself refined beside them (Optuna's warm start at its best trial:
//!   the converged studies end ten times closer on hartmann6).
//! - Trials still running (a fleet's parallel asks, [`BatchRule::Ucb`]): each
//!   is added to the model with its posterior mean as its value (the
//!   "kriging believer"), which takes away the uncertainty where it runs,
//!   and the next configuration is the one of lowest confidence bound
//!   (posterior mean less one deviation) instead of the largest expected
//!   improvement: parallel asks spread out instead of repeating one point,
//!   and explore a little wider than the improvement would, which pays
//!   when the results they wait for are missing (two deviations explored
//!   too much: the benchmark's fourth round measured 0.5 to 2). BENCHMARKS.md
//!   compared it with the believer and the expected improvement (the rule
//!   before), constant liars (the worst or the mean value), fantasies
//!   drawn from the posterior, local penalisation, Thompson sampling and
//!   (its sixth round) the q-batch expected improvement of Optuna's
//!   `GPSampler` on ten functions at 4 and 16 in flight, then confirmed
//!   on ten seeds never used in the comparison (BENCHMARKS.md, "gp with
//!   trials in flight" and the rounds after it): it was the
//!   best or tied on most functions; the others stay as
//!   [`GpSettings::batch`] for the benchmark. With nothing in flight the
//!   rules are the same. The scheduler asks a `gp` study's trials just in
//!   time (one held per agent,
//!   the study's `ahead_per_agent`).
//! - A trial stopped early (ASHA) is told with the worse of its last report
//!   and the median of the complete trials: it trailed where it was cut,
//!   and its final value is unknown.
//! - Several objectives (`[objective] also`): ParEGO. Every ask draws a
//!   weight vector uniformly on the simplex and models the augmented
//!   Chebyshev scalarisation `max_i w_i f_i + 0.05 sum_i w_i f_i` of the
//!   objectives, each normalised to [0, 1] over the told trials: over
//!   asks, the weights sweep the whole front. Trials without every
//!   objective (an invalid energy reading, a stopped trial) are left out.
//!
//! # Cost
//!
//! Fitting the hyper-parameters (a Cholesky factorisation per likelihood
//! evaluation, O(n^3), on at most [`FIT_POINTS`] told trials) is done at
//! every ask up to [`GpSettings::refit_from`] told trials (30), then only
//! each time a tenth more are told, on the first told trials up to that
//! point (by id), and remembered in between: most asks fit nothing and an
//! ask is still a function of what was told. An ask then conditions the
//! model on at most [`GpSettings::model_points`] told trials (beyond
//! either count, the best half and an even spread of the rest are kept;
//! past the model's count that subset is chosen again only every tenth of
//! it more told, the trials told in between added at its end,
//! `values::stable_subset`; the factor is continued from the rows it
//! shares with the last ask's, `O(n^2)` a new point, bit for bit a full
//! factorisation) and scores a
//! few thousand candidates and refinement steps: a kernel column and the
//! mean, O(n), for each, the variance (O(n^2)) only for those whose bound
//! can still beat the best few (`gp_score.rs`: the same proposal, bit for
//! bit). BENCHMARKS.md gives
//! the time per ask (`cargo run --release --example gp_ask_cost`); for
//! studies of thousands of short trials, TPE (linear in n) is cheaper.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tunefleet_common::params::Params;

use crate::draw::sample;
use crate::sampler::{Outcome, Sampler};
use crate::space::{Direction, ParamSpec};
use crate::tpe::{choices, decode, encode, int_top, standard_normal};

mod batch;
mod cube;
mod feasible;
mod model;
mod refine;
mod score;
mod settings;
mod values;
use cube::{Axis, Cube, Theta};
use feasible::Feasibility;
use model::{fit_point, log_ei_of, Model};
use score::Rule;
pub use settings::{BatchRule, GpSettings, Paths};
use values::{simplex_weights, stable_subset, standardise, subset, warp};

/// Weight of the sum in the augmented Chebyshev scalarisation (ParEGO's 0.05).
const CHEBYSHEV_RHO: f64 = 0.05;
/// At most `max` rows of `x` and their `margins`: all when there are no
/// more, else an even spread in their order (the feasibility models).
fn subset_rows(x: Vec<Vec<f64>>, margins: Vec<Vec<f64>>, max: usize) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    if x.len() <= max {
        return (x, margins);
    }
    let keep: Vec<usize> = (0..max).map(|k| k * x.len() / max).collect();
    (keep.iter().map(|&i| x[i].clone()).collect(), keep.iter().map(|&i| margins[i].clone()).collect())
}

/// Told configurations whose neighbourhoods are searched for candidates.
const LOCAL_CENTRES: usize = 5;
/// Perturbations drawn around each of them.
const LOCAL_DRAWS: usize = 64;
/// Most told trials the hyper-parameters are fitted on (a likelihood
/// evaluation is cubic in them); beyond, the best half and an even spread
/// of the rest (`values::subset`).
const FIT_POINTS: usize = 100;

/// What a told trial was, in model terms.
#[derive(Debug, Clone, PartialEq)]
enum Told {
    /// Losses (smaller is better): the objective, then `also`'s.
    Complete(Vec<f64>),
    /// The last report's loss (`+inf` for a NaN).
    Pruned(f64),
}

/// A Gaussian-process search over a fixed space; see the module documentation.
#[derive(Debug, Clone)]
pub struct Gp {
    space: Vec<(String, ParamSpec)>,
    cube: Cube,
    direction: Direction,
    /// Objectives of the study: 1, or 1 + `also`.
    objectives: usize,
    seed: u64,
    told: BTreeMap<u64, (Option<Vec<f64>>, Told)>,
    /// Each told trial's total violation of the study's constraints (none
    /// without constraints): [`feasible`].
    violations: BTreeMap<u64, f64>,
    /// Each told trial's constraints' signed values, where told ([`feasible`]).
    margins: BTreeMap<u64, Vec<f64>>,
    /// The hyper-parameters last fitted and the told trials (id, value
    /// bits) they were fitted on ([`Gp::hyper_parameters`]).
    fitted: RefCell<Option<(FitKey, Theta)>>,
    /// The model of the last ask's told trials: the next ask's factor
    /// starts from the rows of the points both begin with ([`Gp::model`]).
    /// Shared, not copied: its factor is megabytes at 1,000 told.
    factored: RefCell<Option<Arc<Model>>>,
}

/// A complete trial as the feasibility models read it: its coordinates,
/// its violation and, where told, each constraint's value.
type FeasibilityRow<'a> = (Vec<f64>, f64, Option<&'a Vec<f64>>);

/// The told trials a fit was made on: (trial id, its value's bits).
type FitKey = Vec<(u64, u64)>;

impl Gp {
    /// `space`: every parameter searched (name, domain), in a stable order;
    /// `objectives`: 1, or 1 + the study's `also`.
    pub fn new(
        space: Vec<(String, ParamSpec)>,
        direction: Direction,
        objectives: usize,
        seed: u64,
        settings: GpSettings,
    ) -> Self {
        let axes = space
            .iter()
            .enumerate()
            .filter(|(_, (_, spec))| choices(spec) > 1.0)
            .map(|(index, (_, spec))| match spec {
                ParamSpec::Categorical { values } => Axis::Categorical { index, values: values.len() },
                ParamSpec::Int { low, high, step } => {
                    let top = int_top(*low, *high, *step) as f64;
                    Axis::Numeric { index, lo: 0.0, hi: top, lattice: top }
                }
                ParamSpec::Float { low, high, .. } => Axis::Numeric { index, lo: *low, hi: *high, lattice: 0.0 },
                ParamSpec::LogFloat { low, high, .. } => {
                    Axis::Numeric { index, lo: low.ln(), hi: high.ln(), lattice: 0.0 }
                }
            })
            .collect();
        Gp {
            space,
            cube: Cube { axes, settings },
            direction,
            objectives: objectives.max(1),
            seed,
            told: BTreeMap::new(),
            violations: BTreeMap::new(),
            margins: BTreeMap::new(),
            fitted: RefCell::new(None),
            factored: RefCell::new(None),
        }
    }

    fn loss(&self, v: f64) -> f64 {
        match self.direction {
            Direction::Minimize => v,
            Direction::Maximize => -v,
        }
    }

    /// The training set: unit coordinates and a loss for each usable told
    /// trial (the ParEGO scalarisation with several objectives, when at
    /// least two trials measured every one; the first objective otherwise).
    /// Only the first `limit` told trials (by id) are read.
    fn training(&self, rng: &mut ChaCha8Rng, limit: usize) -> (Vec<Vec<f64>>, Vec<f64>) {
        let usable = self.told.values().take(limit).filter_map(|(u, t)| Some((u.as_ref()?, t)));
        let rows: Vec<(&Vec<f64>, &Vec<f64>)> = usable
            .clone()
            .filter_map(|(u, t)| match t {
                Told::Complete(l) if l.len() == self.objectives && l.iter().all(|v| v.is_finite()) => Some((u, l)),
                _ => None,
            })
            .collect();
        // Several objectives need trials that measured them all; without two
        // such (energy never valid, say) the first objective alone is searched.
        if self.objectives > 1 && rows.len() >= 2 {
            let weights = simplex_weights(self.objectives, rng);
            let (lo, hi): (Vec<f64>, Vec<f64>) = (0..self.objectives)
                .map(|k| {
                    let column = rows.iter().map(|(_, l)| l[k]);
                    (column.clone().fold(f64::INFINITY, f64::min), column.fold(f64::NEG_INFINITY, f64::max))
                })
                .unzip();
            let y = rows
                .iter()
                .map(|(_, l)| {
                    let scaled: Vec<f64> = (0..self.objectives)
                        .map(|k| {
                            let range = hi[k] - lo[k];
                            weights[k] * if range > 0.0 { (l[k] - lo[k]) / range } else { 0.0 }
                        })
                        .collect();
                    scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                        + CHEBYSHEV_RHO * scaled.iter().sum::<f64>()
                })
                .collect();
            return (rows.into_iter().map(|(u, _)| u.clone()).collect(), y);
        }
        let mut complete: Vec<f64> = self
            .told
            .values()
            .take(limit)
            .filter_map(|(_, t)| match t {
                Told::Complete(l) => l.first().copied(),
                Told::Pruned(_) => None,
            })
            .collect();
        complete.sort_by(f64::total_cmp);
        let median = complete.get(complete.len() / 2).copied();
        let worst = complete.last().copied();
        let mut x = Vec::new();
        let mut y = Vec::new();
        for (u, t) in usable {
            let v = match t {
                Told::Complete(l) => l.first().copied(),
                Told::Pruned(loss) => match (median, worst) {
                    (Some(m), Some(w)) => Some(if loss.is_finite() { loss.max(m) } else { w }),
                    _ => loss.is_finite().then_some(*loss),
                },
            };
            if let Some(v) = v.filter(|v| v.is_finite()) {
                x.push(u.clone());
                y.push(v);
            }
        }
        (x, y)
    }

    /// The unit coordinates maximising the expected improvement, or `None`
    /// when the model cannot be fitted (too few usable trials).
    fn choose(&self, rng: &mut ChaCha8Rng, running: &[(u64, &Params)]) -> Option<Vec<f64>> {
        let (x, y) = self.training(rng, usize::MAX);
        if x.len() < 2 {
            return None;
        }
        let y = standardise(&warp(&y));
        if y.iter().any(|v| !v.is_finite()) {
            // Values so far apart that their spread overflows: sample at random.
            return None;
        }
        let history = if self.cube.settings.batch == BatchRule::Trust { y.clone() } else { Vec::new() };
        let (x, y) = stable_subset(x, y, self.cube.settings.model_points.max(2));
        let theta = self.hyper_parameters(rng, &x, &y);
        let last = self.factored.try_borrow_mut().ok().and_then(|mut cell| cell.take());
        let model = Arc::new(self.cube.model(x.clone(), &y, &theta, last.as_deref())?);
        if let Ok(mut cell) = self.factored.try_borrow_mut() {
            *cell = Some(Arc::clone(&model));
        }
        // Best posterior mean at a told configuration: the incumbent, which
        // every ask's refinement starts from too (Optuna's `GPSampler` starts
        // a local search at its best trial).
        let means = model.told_means(&self.cube);
        let at = (0..means.len()).min_by(|&a, &b| means[a].total_cmp(&means[b]))?;
        let (best, incumbent) = (means[at], &model.x[at]);
        let pending: Vec<Vec<f64>> =
            running.iter().filter(|(t, _)| !self.told.contains_key(t)).filter_map(|(_, p)| self.unit(p)).collect();
        let candidates = self.candidates(rng, &x, &y, &theta);
        if let Some((feasibility, feasible)) = self.feasibility() {
            return self.choose_feasible(&model, &feasibility, &feasible, candidates, pending, &y);
        }
        if pending.is_empty() {
            return self.cube.maximise_posterior(&model, Rule::Ei { best }, candidates, incumbent);
        }
        let batch =
            batch::Pending { cube: &self.cube, model: &model, best, incumbent, y: &y, pending, history: &history };
        batch.choose(self.cube.settings.batch, candidates, rng)
    }

    /// The model of the told violations and the told configurations that
    /// met the constraints; `None` without constraints, or while every told
    /// trial meets them (nothing to learn).
    fn feasibility(&self) -> Option<(Feasibility, Vec<Vec<f64>>)> {
        if self.violations.is_empty() {
            return None;
        }
        // (coordinates, violation, each constraint's value if told) of each complete trial.
        let rows: Vec<FeasibilityRow<'_>> = self
            .told
            .iter()
            .filter(|(_, (_, t))| matches!(t, Told::Complete(_)))
            .filter_map(|(id, (u, _))| Some((u.clone()?, *self.violations.get(id)?, self.margins.get(id))))
            .collect();
        let feasible: Vec<Vec<f64>> = rows.iter().filter(|r| r.1 == 0.0).map(|r| r.0.clone()).collect();
        // A model per constraint when every trial told its constraints' values alike.
        let width = rows.first().and_then(|r| r.2).map(Vec::len).filter(|k| *k > 0);
        let margins: Option<Vec<Vec<f64>>> =
            width.and_then(|k| rows.iter().map(|r| r.2.filter(|m| m.len() == k).cloned()).collect());
        if let Some(margins) = margins {
            let x: Vec<Vec<f64>> = rows.iter().map(|r| r.0.clone()).collect();
            let (x, m) = subset_rows(x, margins, self.cube.settings.model_points.max(2));
            return Feasibility::fit_margins(&self.cube, &x, &m).map(|f| (f, feasible));
        }
        let (x, v): (Vec<Vec<f64>>, Vec<f64>) = rows.into_iter().map(|r| (r.0, r.1)).unzip();
        let (x, v) = subset(x, v, self.cube.settings.model_points.max(2));
        Feasibility::fit(&self.cube, x, &v).map(|f| (f, feasible))
    }

    /// The ask of a study with constraints ([`feasible`]): the expected
    /// improvement over the best feasible told configuration (on the
    /// believer's model with trials in flight) times the probability of
    /// feasibility; while none is feasible, the probability alone.
    fn choose_feasible(
        &self,
        model: &Model,
        feasibility: &Feasibility,
        feasible: &[Vec<f64>],
        candidates: Vec<Vec<f64>>,
        pending: Vec<Vec<f64>>,
        y: &[f64],
    ) -> Option<Vec<f64>> {
        let cube = &self.cube;
        // While none is feasible, the probability alone, the trials in flight
        // or not (Optuna's GPSampler too): spreading the parallel asks (a
        // liar on the feasibility model) found a first feasible trial later
        // on islands of feasibility (BENCHMARKS.md).
        let pending = if feasible.is_empty() { Vec::new() } else { pending };
        let means = model.told_means(cube);
        let by_mean = |a: &usize, b: &usize| means[*a].total_cmp(&means[*b]);
        let best_feasible = (0..model.x.len()).filter(|&i| feasible.contains(&model.x[i])).min_by(by_mean);
        let best_any = (0..model.x.len()).min_by(by_mean)?;
        let in_flight = !pending.is_empty();
        let believed = in_flight.then(|| {
            let at = best_feasible.unwrap_or(best_any);
            let batch =
                batch::Pending { cube, model, best: means[at], incumbent: &model.x[at], y, pending, history: &[] };
            batch.believed()
        });
        let objective = believed.as_ref().unwrap_or(model);
        let reference = best_feasible.or(in_flight.then_some(best_any)).map(|i| means[i]);
        let score = |us: &[Vec<f64>]| {
            let pof = feasibility.log_probability(cube, us);
            match reference {
                Some(best) => objective
                    .predict_many(cube, us)
                    .into_iter()
                    .zip(pof)
                    .map(|((mu, var), p)| log_ei_of(best, mu, var) + p)
                    .collect(),
                None => pof,
            }
        };
        cube.maximise(objective, candidates, best_feasible.map(|i| model.x[i].as_slice()), &score)
    }

    /// The hyper-parameters of an ask whose training set is `x`, `y`: fitted
    /// on them while few trials are told (or with several objectives, whose
    /// scalarisation changes every ask); past [`GpSettings::refit_from`] told trials,
    /// fitted on the first [`fit_point`] told trials (by id), remembered
    /// until that point moves (every tenth more told): an ask stays a
    /// function of what was told, and most asks fit nothing.
    fn hyper_parameters(&self, rng: &mut ChaCha8Rng, x: &[Vec<f64>], y: &[f64]) -> Theta {
        let n = self.told.len();
        let m = fit_point(n, self.cube.settings.refit_from);
        if self.objectives > 1 || m >= n {
            let (fit_x, fit_y) = subset(x.to_vec(), y.to_vec(), FIT_POINTS);
            return self.cube.fit(&fit_x, &fit_y);
        }
        let key: FitKey = self
            .told
            .iter()
            .take(m)
            .map(|(id, (_, t))| {
                let bits = match t {
                    Told::Complete(l) => l.first().map_or(0, |v| v.to_bits()),
                    Told::Pruned(v) => !v.to_bits(),
                };
                (*id, bits)
            })
            .collect();
        if let Some((k, theta)) = self.fitted.try_borrow().ok().as_deref().and_then(Option::as_ref) {
            if *k == key {
                return theta.clone();
            }
        }
        let (fx, fy) = self.training(rng, m);
        let fy = standardise(&warp(&fy));
        let theta = if fx.len() >= 2 && fy.iter().all(|v| v.is_finite()) {
            let (fit_x, fit_y) = subset(fx, fy, FIT_POINTS);
            self.cube.fit(&fit_x, &fit_y)
        } else {
            let (fit_x, fit_y) = subset(x.to_vec(), y.to_vec(), FIT_POINTS);
            self.cube.fit(&fit_x, &fit_y)
        };
        if let Ok(mut cell) = self.fitted.try_borrow_mut() {
            *cell = Some((key, theta.clone()));
        }
        theta
    }

    /// The candidates of an ask: [`GpSettings::candidates`] random points,
    /// then perturbations of the best told configurations (`x` by `y`).
    fn candidates(&self, rng: &mut ChaCha8Rng, x: &[Vec<f64>], y: &[f64], theta: &Theta) -> Vec<Vec<f64>> {
        let mut out: Vec<Vec<f64>> = (0..self.cube.settings.candidates.max(1))
            .map(|_| self.cube.snap(self.cube.axes.iter().map(|a| self.cube.random_coordinate(a, rng)).collect()))
            .collect();
        let mut centres: Vec<usize> = (0..x.len()).collect();
        centres.sort_by(|&a, &b| y[a].total_cmp(&y[b]));
        for &c in centres.iter().take(LOCAL_CENTRES) {
            for _ in 0..LOCAL_DRAWS {
                let u = self
                    .cube
                    .axes
                    .iter()
                    .zip(&x[c])
                    .zip(&theta.length)
                    .map(|((a, v), l)| match a {
                        Axis::Numeric { .. } => (v + 0.25 * l.min(1.0) * standard_normal(rng)).clamp(0.0, 1.0),
                        Axis::Categorical { .. } if rng.random::<f64>() < 0.2 => self.cube.random_coordinate(a, rng),
                        Axis::Categorical { .. } => *v,
                    })
                    .collect();
                out.push(self.cube.snap(u));
            }
        }
        out
    }

    /// Unit coordinates of a configuration; `None` when it lacks a modelled
    /// parameter or has one outside its domain.
    fn unit(&self, params: &Params) -> Option<Vec<f64>> {
        self.cube
            .axes
            .iter()
            .map(|a| match a {
                Axis::Numeric { index, lo, hi, .. } => {
                    let (name, spec) = &self.space[*index];
                    let e = encode(spec, params.get(name)?)?;
                    Some(if hi > lo { ((e - lo) / (hi - lo)).clamp(0.0, 1.0) } else { 0.0 })
                }
                Axis::Categorical { index, .. } => {
                    let (name, spec) = &self.space[*index];
                    encode(spec, params.get(name)?)
                }
            })
            .collect()
    }

    fn decode(&self, u: &[f64]) -> Params {
        let mut out = Params::new();
        for (i, (name, spec)) in self.space.iter().enumerate() {
            let axis = self.cube.axes.iter().position(|a| match a {
                Axis::Numeric { index, .. } | Axis::Categorical { index, .. } => *index == i,
            });
            let value = match axis {
                Some(d) => match self.cube.axes[d] {
                    Axis::Numeric { lo, hi, .. } => decode(spec, lo + u[d] * (hi - lo)),
                    Axis::Categorical { .. } => decode(spec, u[d]),
                },
                None => decode(spec, 0.0).filter(|_| choices(spec) > 0.0),
            };
            if let Some(v) = value {
                out.insert(name.clone(), v);
            }
        }
        out
    }
}

impl Sampler for Gp {
    /// The configuration for the `index`-th ask while `running` (trials
    /// created and not told) run; see the module documentation.
    fn ask(&self, index: u64, running: &[(u64, &Params)]) -> Params {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index);
        let chosen = if self.told.len() < self.cube.settings.startup || self.cube.axes.is_empty() {
            None
        } else {
            self.choose(&mut rng, running)
        };
        match chosen {
            Some(u) => self.decode(&u),
            None => self
                .space
                .iter()
                .filter(|(_, spec)| choices(spec) > 0.0)
                .map(|(name, spec)| (name.clone(), sample(spec, &mut rng)))
                .collect(),
        }
    }

    /// What became of trial `trial` run with `params` (one objective; see
    /// [`Gp::tell_values`] for several). Telling a trial again replaces it.
    fn tell(&mut self, trial: u64, params: &Params, outcome: Outcome) {
        match outcome {
            Outcome::Complete(v) => self.tell_values(trial, params, v, &[]),
            Outcome::Pruned { value, .. } => {
                let loss = if value.is_nan() { f64::INFINITY } else { self.loss(value) };
                let u = self.unit(params);
                self.told.insert(trial, (u, Told::Pruned(loss)));
            }
        }
    }

    /// Trial `trial` completed with objective `value` (in the metric's own
    /// direction; not told when not finite) and the figures of `also`
    /// (minimised; a non-finite one leaves the trial out of a
    /// multi-objective model).
    fn tell_values(&mut self, trial: u64, params: &Params, value: f64, also: &[f64]) {
        if !value.is_finite() {
            return;
        }
        let losses = std::iter::once(self.loss(value)).chain(also.iter().copied()).collect();
        let u = self.unit(params);
        self.told.insert(trial, (u, Told::Complete(losses)));
    }

    /// How far a complete trial told before misses the study's
    /// constraints (0: feasible; NaN: a figure never measured, as far as
    /// can be): the asks that follow weigh feasibility ([`feasible`]).
    fn tell_violation(&mut self, trial: u64, violation: f64) {
        if self.told.contains_key(&trial) {
            let v = if violation.is_nan() { f64::INFINITY } else { violation.max(0.0) };
            self.violations.insert(trial, v);
        }
    }

    /// Each constraint's signed value of a complete trial told before
    /// (NaN: never measured, as far as can be): a model per constraint.
    fn tell_margins(&mut self, trial: u64, margins: &[f64]) {
        if self.told.contains_key(&trial) {
            let m = margins.iter().map(|v| if v.is_nan() { f64::INFINITY } else { *v }).collect();
            self.margins.insert(trial, m);
        }
    }

    /// Trials told so far (complete with finite values, or stopped early).
    fn observations(&self) -> usize {
        self.told.len()
    }
}

#[cfg(test)]
mod tests;
