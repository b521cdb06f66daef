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
//!   axis at a time ([`Refinement`]: the ten best by compass search to a
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
use crate::linalg::{exp_neg, nelder_mead, solve_lower, solve_upper_t};
use crate::sampler::{Outcome, Sampler};
use crate::space::{Direction, ParamSpec};
use crate::tpe::{choices, decode, encode, int_top, standard_normal};

mod batch;
mod model;
mod refine;
mod score;
mod settings;
mod values;
pub use batch::BatchRule;
use model::{factorise, fit_point, log_ei_of, Model, Theta};
pub(super) use refine::Refinement;
use score::{Rule, SCORED_AT_ONCE};
pub use settings::{GpSettings, Paths};
use values::{simplex_weights, stable_subset, standardise, subset, warp};

/// Weight of the sum in the augmented Chebyshev scalarisation (ParEGO's 0.05).
const CHEBYSHEV_RHO: f64 = 0.05;
/// Told configurations whose neighbourhoods are searched for candidates.
const LOCAL_CENTRES: usize = 5;
/// Perturbations drawn around each of them.
const LOCAL_DRAWS: usize = 64;
/// Most told trials the hyper-parameters are fitted on (a likelihood
/// evaluation is cubic in them); beyond, the best half and an even spread
/// of the rest (`values::subset`).
const FIT_POINTS: usize = 100;
/// Bounds of the hyper-parameters, in natural log: length scales, signal
/// variance, noise variance (the values are standardised).
const LOG_LENGTH: (f64, f64) = (-4.6, 3.0);
const LOG_SIGNAL: (f64, f64) = (-4.6, 4.6);
const LOG_NOISE: (f64, f64) = (-16.0, 0.0);

/// One axis of the unit cube.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Axis {
    /// `index` into the space; the model coordinate `e` of [`encode`] maps
    /// to `(e - lo) / (hi - lo)`; `lattice`: the largest lattice index of an
    /// int (values are rounded to it), 0 for floats.
    Numeric { index: usize, lo: f64, hi: f64, lattice: f64 },
    /// `index` into the space; the coordinate is the value's index.
    Categorical { index: usize, values: usize },
}

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
    axes: Vec<Axis>,
    direction: Direction,
    /// Objectives of the study: 1, or 1 + `also`.
    objectives: usize,
    seed: u64,
    settings: GpSettings,
    told: BTreeMap<u64, (Option<Vec<f64>>, Told)>,
    /// The hyper-parameters last fitted and the told trials (id, value
    /// bits) they were fitted on ([`Gp::hyper_parameters`]).
    fitted: RefCell<Option<(FitKey, Theta)>>,
    /// The model of the last ask's told trials: the next ask's factor
    /// starts from the rows of the points both begin with ([`Gp::model`]).
    /// Shared, not copied: its factor is megabytes at 1,000 told.
    factored: RefCell<Option<Arc<Model>>>,
}

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
            axes,
            direction,
            objectives: objectives.max(1),
            seed,
            settings,
            told: BTreeMap::new(),
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
        let history = if self.settings.batch == BatchRule::Trust { y.clone() } else { Vec::new() };
        let (x, y) = stable_subset(x, y, self.settings.model_points.max(2));
        let theta = self.hyper_parameters(rng, &x, &y);
        let last = self.factored.try_borrow_mut().ok().and_then(|mut cell| cell.take());
        let model = Arc::new(self.model(x.clone(), &y, &theta, last.as_deref())?);
        if let Ok(mut cell) = self.factored.try_borrow_mut() {
            *cell = Some(Arc::clone(&model));
        }
        // Best posterior mean at a told configuration: the incumbent, which
        // every ask's refinement starts from too (Optuna's `GPSampler` starts
        // a local search at its best trial).
        let means = model.told_means(self);
        let at = (0..means.len()).min_by(|&a, &b| means[a].total_cmp(&means[b]))?;
        let (best, incumbent) = (means[at], &model.x[at]);
        let pending: Vec<Vec<f64>> =
            running.iter().filter(|(t, _)| !self.told.contains_key(t)).filter_map(|(_, p)| self.unit(p)).collect();
        let candidates = self.candidates(rng, &x, &y, &theta);
        if pending.is_empty() {
            return self.maximise_posterior(&model, Rule::Ei { best }, candidates, incumbent);
        }
        let batch = batch::Pending { gp: self, model: &model, best, incumbent, y: &y, pending, history: &history };
        batch.choose(self.settings.batch, candidates, rng)
    }

    /// The hyper-parameters of an ask whose training set is `x`, `y`: fitted
    /// on them while few trials are told (or with several objectives, whose
    /// scalarisation changes every ask); past [`GpSettings::refit_from`] told trials,
    /// fitted on the first [`fit_point`] told trials (by id), remembered
    /// until that point moves (every tenth more told): an ask stays a
    /// function of what was told, and most asks fit nothing.
    fn hyper_parameters(&self, rng: &mut ChaCha8Rng, x: &[Vec<f64>], y: &[f64]) -> Theta {
        let n = self.told.len();
        let m = fit_point(n, self.settings.refit_from);
        if self.objectives > 1 || m >= n {
            let (fit_x, fit_y) = subset(x.to_vec(), y.to_vec(), FIT_POINTS);
            return self.fit(&fit_x, &fit_y);
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
            self.fit(&fit_x, &fit_y)
        } else {
            let (fit_x, fit_y) = subset(x.to_vec(), y.to_vec(), FIT_POINTS);
            self.fit(&fit_x, &fit_y)
        };
        if let Ok(mut cell) = self.fitted.try_borrow_mut() {
            *cell = Some((key, theta.clone()));
        }
        theta
    }

    /// The log expected improvement over `best` of `model` at each of `us`
    /// (minus infinity where it cannot be computed).
    fn log_ei(&self, model: &Model, best: f64, us: &[Vec<f64>]) -> Vec<f64> {
        model.predict_many(self, us).into_iter().map(|(mu, var)| log_ei_of(best, mu, var)).collect()
    }

    /// The candidates of an ask: [`GpSettings::candidates`] random points,
    /// then perturbations of the best told configurations (`x` by `y`).
    fn candidates(&self, rng: &mut ChaCha8Rng, x: &[Vec<f64>], y: &[f64], theta: &Theta) -> Vec<Vec<f64>> {
        let mut out: Vec<Vec<f64>> = (0..self.settings.candidates.max(1))
            .map(|_| self.snap(self.axes.iter().map(|a| self.random_coordinate(a, rng)).collect()))
            .collect();
        let mut centres: Vec<usize> = (0..x.len()).collect();
        centres.sort_by(|&a, &b| y[a].total_cmp(&y[b]));
        for &c in centres.iter().take(LOCAL_CENTRES) {
            for _ in 0..LOCAL_DRAWS {
                let u = self
                    .axes
                    .iter()
                    .zip(&x[c])
                    .zip(&theta.length)
                    .map(|((a, v), l)| match a {
                        Axis::Numeric { .. } => (v + 0.25 * l.min(1.0) * standard_normal(rng)).clamp(0.0, 1.0),
                        Axis::Categorical { .. } if rng.random::<f64>() < 0.2 => self.random_coordinate(a, rng),
                        Axis::Categorical { .. } => *v,
                    })
                    .collect();
                out.push(self.snap(u));
            }
        }
        out
    }

    /// The candidate of highest `score` (which scores a batch of points at
    /// once: one triangular solve for all), the best few refined, and the
    /// `incumbent` too (the told configuration of best posterior mean, where
    /// an expected improvement is measured from: BENCHMARKS.md measured it
    /// against the best few alone, BENCHMARKS.md).
    fn maximise(
        &self,
        model: &Model,
        candidates: Vec<Vec<f64>>,
        incumbent: Option<&[f64]>,
        score: &impl Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Option<Vec<f64>> {
        let scores = candidates.chunks(SCORED_AT_ONCE).flat_map(score);
        let mut scored: Vec<(f64, Vec<f64>)> = scores.zip(candidates.iter().cloned()).collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let plan = Refinement::of(model.x.len());
        scored.truncate(plan.starts);
        if let Some(u) = incumbent {
            let own = score(&[u.to_vec()]);
            scored.push((own.first().copied().unwrap_or(f64::NEG_INFINITY), u.to_vec()));
        }
        self.refine(scored, plan, score)
    }

    /// One axis at a time from each start (a numeric axis tries a step
    /// either way, a categorical every other value), the step as `plan`
    /// says, until it is below [`refine::MIN_STEP`] or after its sweeps. The best
    /// point found.
    fn refine(
        &self,
        mut starts: Vec<(f64, Vec<f64>)>,
        plan: Refinement,
        score: &impl Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Option<Vec<f64>> {
        plan.run(&mut starts, self.axes.len(), |starts, alive, steps, d, moved| {
            for &c in alive {
                let tried = self.tries(&starts[c].1, d, steps[c]);
                let scores = score(&tried);
                for (v, s) in tried.into_iter().zip(scores) {
                    if s > starts[c].0 {
                        starts[c] = (s, v);
                        moved[c] = true;
                    }
                }
            }
        });
        starts.into_iter().max_by(|a, b| a.0.total_cmp(&b.0)).map(|(_, u)| u)
    }

    /// The points a refinement step from `u` along axis `d` scores: a step
    /// of `step` either way on a numeric axis (at least one lattice step of
    /// an int), every value of a categorical.
    fn tries(&self, u: &[f64], d: usize, step: f64) -> Vec<Vec<f64>> {
        let values: Vec<f64> = match self.axes[d] {
            Axis::Numeric { lattice, .. } => {
                let s = if lattice > 0.0 { step.max(1.0 / lattice) } else { step };
                vec![(u[d] - s).max(0.0), (u[d] + s).min(1.0)]
            }
            Axis::Categorical { values, .. } => (0..values).map(|i| i as f64).collect(),
        };
        values
            .into_iter()
            .map(|t| {
                let mut v = u.to_vec();
                v[d] = t;
                self.snap(v)
            })
            .collect()
    }

    fn random_coordinate(&self, axis: &Axis, rng: &mut ChaCha8Rng) -> f64 {
        match axis {
            Axis::Numeric { .. } => rng.random(),
            Axis::Categorical { values, .. } => rng.random_range(0..(*values).max(1)) as f64,
        }
    }

    /// Ints rounded to their lattice.
    fn snap(&self, mut u: Vec<f64>) -> Vec<f64> {
        for (v, a) in u.iter_mut().zip(&self.axes) {
            if let Axis::Numeric { lattice, .. } = a {
                if *lattice > 0.0 {
                    *v = (*v * lattice).round() / lattice;
                }
            }
        }
        u
    }

    /// Unit coordinates of a configuration; `None` when it lacks a modelled
    /// parameter or has one outside its domain.
    fn unit(&self, params: &Params) -> Option<Vec<f64>> {
        self.axes
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
            let axis = self.axes.iter().position(|a| match a {
                Axis::Numeric { index, .. } | Axis::Categorical { index, .. } => *index == i,
            });
            let value = match axis {
                Some(d) => match self.axes[d] {
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

    /// Euclidean distance in unit coordinates (a categorical axis counts 1
    /// when the values differ).
    fn unit_distance(&self, a: &[f64], b: &[f64]) -> f64 {
        let mut r2 = 0.0;
        for (d, axis) in self.axes.iter().enumerate() {
            r2 += match axis {
                Axis::Numeric { .. } => (a[d] - b[d]).powi(2),
                Axis::Categorical { .. } => f64::from(u8::from(a[d] != b[d])),
            };
        }
        r2.sqrt()
    }

    /// The coordinates of `points` axis by axis, a column of one value a
    /// point, a numeric axis's divided by its length scale of `theta` (as
    /// [`Gp::distance2`] divides them), for [`Gp::kernel_row`].
    fn columns(&self, points: &[Vec<f64>], theta: &Theta) -> Vec<Vec<f64>> {
        let scaled = |d: usize, v: f64| match self.axes[d] {
            Axis::Numeric { .. } => v * (1.0 / theta.length[d]),
            Axis::Categorical { .. } => v,
        };
        (0..self.axes.len()).map(|d| points.iter().map(|p| scaled(d, p[d])).collect()).collect()
    }

    /// The indices of the numeric axes.
    fn numeric_axes(&self) -> impl Iterator<Item = usize> + '_ {
        self.axes.iter().enumerate().filter(|(_, a)| matches!(a, Axis::Numeric { .. })).map(|(d, _)| d)
    }

    /// Squared scaled distance of the kernel.
    fn distance2(&self, a: &[f64], b: &[f64], length: &[f64]) -> f64 {
        let mut r2 = 0.0;
        for (d, axis) in self.axes.iter().enumerate() {
            let l = length[d];
            match axis {
                Axis::Numeric { .. } => {
                    let inv = 1.0 / l;
                    let z = a[d] * inv - b[d] * inv;
                    r2 += z * z;
                }
                Axis::Categorical { .. } => {
                    if a[d] != b[d] {
                        r2 += 1.0 / (l * l);
                    }
                }
            }
        }
        r2
    }

    fn kernel(&self, a: &[f64], b: &[f64], theta: &Theta) -> f64 {
        let r = (5.0 * self.distance2(a, b, &theta.length)).sqrt();
        theta.signal * (1.0 + r + r * r / 3.0) * exp_neg(r)
    }

    /// [`Gp::kernel`] between each of the first `count` points of
    /// `columns` (their coordinates axis by axis, each numeric one already
    /// divided by its length scale, [`Gp::columns`]) and `u`, in `out`: bit
    /// for bit the same values (the same operations for each point in the
    /// same order, the kernel being symmetric bit for bit), one axis at a
    /// time over all the points, which the compiler turns into vector
    /// operations, the exponential included ([`exp_neg`]).
    fn kernel_row(&self, columns: &[Vec<f64>], count: usize, u: &[f64], theta: &Theta, out: &mut Vec<f64>) {
        out.clear();
        out.resize(count, 0.0);
        for (d, axis) in self.axes.iter().enumerate() {
            let (column, l) = (&columns[d][..count], theta.length[d]);
            match axis {
                Axis::Numeric { .. } => {
                    let at = u[d] * (1.0 / l);
                    for (r2, x) in out.iter_mut().zip(column) {
                        let z = x - at;
                        *r2 += z * z;
                    }
                }
                Axis::Categorical { .. } => {
                    let (apart, at) = (1.0 / (l * l), u[d]);
                    for (r2, x) in out.iter_mut().zip(column) {
                        if *x != at {
                            *r2 += apart;
                        }
                    }
                }
            }
        }
        for k in out.iter_mut() {
            let r = (5.0 * *k).sqrt();
            *k = theta.signal * (1.0 + r + r * r / 3.0) * exp_neg(r);
        }
    }

    /// The process conditioned on `x`, `y`. `known`: a model with the same
    /// hyper-parameters whose points `x` begins with, as far as they agree
    /// (the last ask's, or the told trials' when the running ones are added):
    /// the factor's rows of those points are its own (bit for bit what a
    /// full factorisation gives, [`cholesky_from`]), and only the rows of
    /// the others are computed, `O(n^2)` each.
    fn model(&self, x: Vec<Vec<f64>>, y: &[f64], theta: &Theta, known: Option<&Model>) -> Option<Model> {
        let n = x.len();
        let known = known.filter(|m| m.theta.same_as(theta));
        let p = known.map_or(0, |m| m.x.iter().zip(&x).take_while(|(a, b)| a == b).count());
        let p = if self.settings.paths == Paths::Plain { 0 } else { p };
        let mut k = vec![0.0; n * n];
        if let Some(m) = known {
            let stride = m.x.len();
            for i in 0..p {
                k[i * n..i * n + i + 1].copy_from_slice(&m.kernel[i * stride..i * stride + i + 1]);
            }
        }
        let cols = self.columns(&x, theta);
        let mut row = Vec::with_capacity(n);
        for i in p..n {
            self.kernel_row(&cols, i + 1, &x[i], theta, &mut row);
            k[i * n..i * n + i + 1].copy_from_slice(&row);
            k[i * n + i] += theta.noise + 1e-9;
        }
        let (rows, stride) = known.map_or((&[][..], 0), |m| (&m.chol[..], m.x.len()));
        let chol = factorise(&k, n, rows, stride, p, self.settings.paths)?;
        let alpha = solve_upper_t(&chol, n, &solve_lower(&chol, n, y));
        Some(Model { x, columns: cols, y: y.to_vec(), kernel: k, chol, alpha, theta: theta.clone() })
    }

    /// The Cholesky factor of the kernel matrix over `x` (noise on its
    /// diagonal) and `alpha = K^-1 y`; `None` when not positive definite.
    fn factor(&self, x: &[Vec<f64>], y: &[f64], theta: &Theta) -> Option<(Vec<f64>, Vec<f64>)> {
        let n = x.len();
        let mut k = vec![0.0; n * n];
        let cols = self.columns(x, theta);
        let mut row = Vec::with_capacity(n);
        for i in 0..n {
            self.kernel_row(&cols, i + 1, &x[i], theta, &mut row);
            for (j, v) in row.iter().enumerate() {
                k[i * n + j] = *v;
                k[j * n + i] = *v;
            }
            k[i * n + i] += theta.noise + 1e-9;
        }
        let chol = factorise(&k, n, &[], 0, 0, self.settings.paths)?;
        let alpha = solve_upper_t(&chol, n, &solve_lower(&chol, n, y));
        Some((chol, alpha))
    }

    /// Hyper-parameters maximising the marginal likelihood with their priors.
    fn fit(&self, x: &[Vec<f64>], y: &[f64]) -> Theta {
        let d = self.axes.len();
        let theta_of = |p: &[f64]| Theta {
            length: p[..d].iter().map(|v| v.clamp(LOG_LENGTH.0, LOG_LENGTH.1).exp()).collect(),
            signal: p[d].clamp(LOG_SIGNAL.0, LOG_SIGNAL.1).exp(),
            noise: p[d + 1].clamp(LOG_NOISE.0, LOG_NOISE.1).exp(),
        };
        let objective = |p: &[f64]| {
            let theta = theta_of(p);
            // Factored in place: the points are not copied per evaluation.
            let Some((chol, alpha)) = self.factor(x, y, &theta) else { return f64::INFINITY };
            let n = x.len();
            let fit: f64 = 0.5 * y.iter().zip(&alpha).map(|(a, b)| a * b).sum::<f64>();
            let det: f64 = (0..n).map(|i| chol[i * n + i].ln()).sum();
            // Weak log-normal priors: length scales around 0.5, signal
            // around 1, noise small but learnable.
            let prior = p[..d].iter().map(|v| 0.5 * (v - 0.5f64.ln()).powi(2)).sum::<f64>()
                + 0.5 * p[d].powi(2)
                + 0.5 * ((p[d + 1] - 1e-4f64.ln()) / 4.0).powi(2);
            fit + det + prior
        };
        let mut start = vec![0.5f64.ln(); d];
        start.push(0.0);
        start.push(1e-4f64.ln());
        let (best, _) = nelder_mead(objective, &start, 1.0, self.settings.fit_evals.max(d + 2));
        theta_of(&best)
    }
}

impl Sampler for Gp {
    /// The configuration for the `index`-th ask while `running` (trials
    /// created and not told) run; see the module documentation.
    fn ask(&self, index: u64, running: &[(u64, &Params)]) -> Params {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index);
        let chosen = if self.told.len() < self.settings.startup || self.axes.is_empty() {
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

    /// Trials told so far (complete with finite values, or stopped early).
    fn observations(&self) -> usize {
        self.told.len()
    }
}

#[cfg(test)]
mod tests;
