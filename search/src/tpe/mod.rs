//! The Tree-structured Parzen Estimator (TPE) as Optuna 5's default
//! `TPESampler` runs it for one objective: multivariate kernels, the prior
//! in every estimator, ints scored by the probability of their bin, pruned
//! trials told, and a constant liar for the trials still running. Seeded
//! and reproducible.
//!
//! # How it chooses
//!
//! While fewer than [`TpeSettings::startup`] trials were told (complete or
//! pruned), a configuration is drawn at random with [`crate::sample`]. After
//! that the told trials are split (Optuna's `_split_trials`):
//!
//! - `n_below = min(ceil(gamma * n), GAMMA_CAP)` of the `n` told trials are
//!   "good": the best complete ones first, then, if fewer complete trials
//!   than that exist, the best pruned ones, ranked by the last epoch they
//!   reported (later first) and then by the value they reported there (a
//!   NaN is the worst). All the others are "bad", and so is every trial
//!   still running (the constant liar: the model treats them as bad until
//!   their result arrives, so parallel asks spread out instead of crowding
//!   one mode).
//! - Two estimators are built over the whole space: `l(x)` from the good
//!   trials and `g(x)` from the bad ones. Each is a mixture with one kernel
//!   per trial plus a prior kernel; a kernel is a product over the
//!   parameters (multivariate TPE). Kernel weights are Optuna's
//!   `default_weights` in trial order (1 each up to 25, older trials ramped
//!   down past that) and [`PRIOR_WEIGHT`] for the prior, normalised.
//! - [`TpeSettings::candidates`] configurations are drawn from `l` and the
//!   one maximising `log l(x) - log g(x)` is chosen (the first on ties).
//!
//! Per parameter, in model coordinates:
//!
//! - `float` (and `log_float` in log space): a Gaussian truncated to
//!   `[low, high]` per trial, centred on its value, with as deviation the
//!   larger distance to its sorted neighbours (the domain's ends count as
//!   neighbours; the outermost kernels take their inner gap), clipped to
//!   `[width / min(100, 1 + kernels), width]` (Optuna's "magic clip",
//!   `kernels` counting the prior); the prior kernel sits at the middle
//!   with the domain's width as deviation. The prior takes part in the
//!   bandwidths through the clip only, as in Optuna 5 (earlier Optuna
//!   versions also placed it among the neighbours).
//! - `int`: the same on the lattice index `k = (v - low) / step` over the
//!   widened domain `[-0.5, k_max + 0.5]`; a value's probability is the
//!   mass of its bin `[k - 0.5, k + 0.5]` (normalised by the kernel's mass
//!   in the domain), and a drawn value is rounded to the lattice.
//! - `categorical`: per trial a distribution putting `1 + prior / kernels`
//!   on its value and `prior / kernels` on every other, normalised; the
//!   prior kernel is uniform.
//!
//! Parameters with a single value are not modelled (Optuna leaves them out
//! of the relative search space); they take their value.
//!
//! # Where it differs from Optuna, and why
//!
//! - Random numbers: ChaCha8 seeded by `(seed, ask index)` rather than one
//!   NumPy `RandomState`, so an ask is a function of the seed, its index and
//!   the told and running trials, whatever order results arrived in (a
//!   resumed study asks the same). Same distributions, other draws.
//! - Truncated Gaussians are drawn by rejection (at most
//!   `TRUNCATED_TRIES` draws; a kernel's centre lies in the domain and its
//!   deviation is at most the domain's width, so a draw lands inside with
//!   probability above 1/3) rather than by inverse CDF: the same
//!   distribution.
//! - No `group` decomposition: a study's space is fixed (no conditional
//!   parameters), so the whole space is one group. A told configuration
//!   lacking a parameter, or with a value outside its domain (a study file
//!   edited between runs), counts towards `n` but adds no kernel, as Optuna
//!   does with a trial outside the intersection search space; Optuna would
//!   then sample the new parameter independently, this model from its prior.
//! - Trials that fail (or return a non-finite objective) are not told, as
//!   in Optuna. A pruned trial here is one ASHA stopped; its last report is
//!   what the engine tells.
//! - Several objectives (`[objective] also`, [`Tpe::with_objectives`]):
//!   the good trials are chosen by front as Optuna's multi-objective TPE
//!   does (whole fronts by non-domination rank, then the points of the
//!   next front adding most hypervolume). Optuna then weighs the good
//!   trials' kernels by their hypervolume contributions; here they keep
//!   the weights of the one-objective case (by age), which is simpler and
//!   was not measured to matter. Optuna also samples each parameter
//!   independently for several objectives; this model stays multivariate.
//!
//! # Why not the `tpe` crate
//!
//! The `tpe` crate (sile/tpe, by the optuna-rs author) was judged and not
//! used: it is univariate (one optimizer per parameter: no joint kernels),
//! has no int lattice, no startup phase, no gamma cap, no pruned or running
//! trials, half-open ranges (its `tell` refuses a float's `high`, which our
//! domains include), and 0.3 needs rand 0.10 and Rust 1.88 where this
//! workspace is on rand 0.9 and Rust 1.85. Optuna 5's behaviour would have
//! to be written around it; the estimator below is shorter than that.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::f64::consts::{PI, SQRT_2};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tunefleet_common::params::{ParamValue, Params};

use crate::draw::sample;
use crate::pareto;
pub use crate::sampler::Outcome;
use crate::sampler::Sampler;
use crate::space::{Direction, ParamSpec};

/// Most trials counted as "good", whatever `gamma` says (Optuna's 25).
pub const GAMMA_CAP: usize = 25;
/// Weight of the prior kernel, in trials (Optuna's 1.0).
pub const PRIOR_WEIGHT: f64 = 1.0;
/// Trials with full weight in an estimator; older ones are ramped down
/// (Optuna's `default_weights`).
const FLAT_WEIGHTS: usize = 25;
/// Draws of a truncated Gaussian before falling back to its clamped mean.
const TRUNCATED_TRIES: usize = 64;

/// Settings of [`Tpe`]; the defaults are Optuna's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TpeSettings {
    /// Trials told (complete or pruned) before the model is used; until then
    /// configurations are random. Default 10.
    pub startup: usize,
    /// Candidates drawn from `l(x)` per ask (at least 1 is used). Default 24.
    pub candidates: usize,
    /// Fraction of the told trials that are "good" (rounded up, at most
    /// [`GAMMA_CAP`]). Default 0.1.
    pub gamma: f64,
}

impl Default for TpeSettings {
    fn default() -> Self {
        TpeSettings { startup: 10, candidates: 24, gamma: 0.1 }
    }
}

/// A TPE search over a fixed space; see the module documentation.
#[derive(Debug, Clone)]
pub struct Tpe {
    space: Vec<(String, ParamSpec)>,
    /// Indices into `space` of the parameters the model covers (more than
    /// one possible value).
    modelled: Vec<usize>,
    direction: Direction,
    seed: u64,
    settings: TpeSettings,
    /// Objectives of the study: 1, or 1 + its `also` (see [`Tpe::with_objectives`]).
    objectives: usize,
    /// Told trials by trial number.
    told: BTreeMap<u64, Observation>,
}

/// One told trial, in model terms.
#[derive(Debug, Clone, PartialEq)]
struct Observation {
    state: State,
    /// Model coordinates of the modelled parameters (see [`encode`]);
    /// `None` when the configuration lacked one or had it outside its domain.
    coords: Option<Vec<f64>>,
    /// A complete trial's figures of the study's `also` (minimised).
    also: Vec<f64>,
    /// How far it misses the study's constraints (0: feasible).
    violation: f64,
}

/// A told trial's result as a loss (smaller is better).
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Complete(f64),
    /// Its last report; a NaN value becomes `+inf`, the worst loss.
    Pruned {
        epoch: u32,
        loss: f64,
    },
}

impl Tpe {
    /// `space`: every parameter searched, in a stable order (name, domain).
    pub fn new(space: Vec<(String, ParamSpec)>, direction: Direction, seed: u64, settings: TpeSettings) -> Self {
        let modelled = space.iter().enumerate().filter(|(_, (_, spec))| choices(spec) > 1.0).map(|(i, _)| i).collect();
        Tpe { space, modelled, direction, seed, settings, objectives: 1, told: BTreeMap::new() }
    }

    /// A search of `n` objectives: the study's and its `also` (told with
    /// [`Tpe::tell_values`]); the good trials are then chosen by front.
    pub fn with_objectives(mut self, n: usize) -> Self {
        self.objectives = n.max(1);
        self
    }

    /// Model coordinates of the modelled parameters of `params`.
    fn coords(&self, params: &Params) -> Option<Vec<f64>> {
        self.modelled
            .iter()
            .map(|&i| {
                let (name, spec) = &self.space[i];
                params.get(name).and_then(|v| encode(spec, v))
            })
            .collect()
    }

    /// The coordinates of the good and of the bad trials, each in trial
    /// order (Optuna's `_split_trials`); running trials are bad.
    fn split(&self, running: &[(u64, &Params)]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let n = self.told.len();
        // A NaN or negative gamma saturates to 0 good trials: l(x) is the prior alone.
        let mut n_below = ((self.settings.gamma * n as f64).ceil() as usize).min(GAMMA_CAP).min(n);
        let mut complete: Vec<(u64, f64)> = Vec::new();
        let mut pruned: Vec<(u64, u32, f64)> = Vec::new();
        for (&trial, o) in &self.told {
            match o.state {
                State::Complete(loss) => complete.push((trial, loss)),
                State::Pruned { epoch, loss } => pruned.push((trial, epoch, loss)),
            }
        }
        // Optuna's constrained split: feasible trials first (by the
        // objective, or by front), then the others by their violation.
        let violation = |t: &u64| self.told.get(t).map_or(0.0, |o| o.violation);
        let (mut feasible, mut infeasible): Split = complete.into_iter().partition(|(t, _)| violation(t) <= 0.0);
        if self.objectives > 1 {
            feasible = self.by_front(&feasible, n_below);
        } else {
            feasible.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        }
        infeasible
            .sort_by(|a, b| violation(&a.0).total_cmp(&violation(&b.0)).then(a.1.total_cmp(&b.1)).then(a.0.cmp(&b.0)));
        feasible.extend(infeasible);
        let complete = feasible;
        pruned.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.total_cmp(&b.2)).then(a.0.cmp(&b.0)));
        let mut below: Vec<u64> = Vec::new();
        let mut above: Vec<u64> = Vec::new();
        for (i, (trial, _)) in complete.iter().enumerate() {
            if i < n_below {
                below.push(*trial)
            } else {
                above.push(*trial)
            }
        }
        n_below = n_below.saturating_sub(below.len());
        for (i, (trial, _, _)) in pruned.iter().enumerate() {
            if i < n_below {
                below.push(*trial)
            } else {
                above.push(*trial)
            }
        }
        below.sort_unstable();
        above.sort_unstable();
        let coords = |trials: &[u64]| -> Vec<(u64, Vec<f64>)> {
            trials.iter().filter_map(|t| Some((*t, self.told.get(t)?.coords.clone()?))).collect()
        };
        let good = coords(&below);
        let mut bad = coords(&above);
        for (trial, params) in running {
            if !self.told.contains_key(trial) {
                if let Some(c) = self.coords(params) {
                    bad.push((*trial, c));
                }
            }
        }
        bad.sort_by_key(|(t, _)| *t);
        (good.into_iter().map(|(_, c)| c).collect(), bad.into_iter().map(|(_, c)| c).collect())
    }
}

impl Sampler for Tpe {
    /// The configuration for the `index`-th ask, `running` being the trials
    /// created and not yet told (trial number, configuration): random while
    /// fewer than `settings.startup` trials were told, chosen by the model
    /// after. A function of (seed, index, told trials, running trials). A
    /// categorical parameter without values is left out.
    fn ask(&self, index: u64, running: &[(u64, &Params)]) -> Params {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index);
        if self.told.len() < self.settings.startup || self.modelled.is_empty() {
            return self
                .space
                .iter()
                .filter(|(_, spec)| choices(spec) > 0.0)
                .map(|(name, spec)| (name.clone(), sample(spec, &mut rng)))
                .collect();
        }
        let (below, above) = self.split(running);
        let specs: Vec<&ParamSpec> = self.modelled.iter().map(|&i| &self.space[i].1).collect();
        let l = Mixture::new(&specs, &below);
        let g = Mixture::new(&specs, &above);
        let mut best: Option<(f64, Vec<f64>)> = None;
        for _ in 0..self.settings.candidates.max(1) {
            let x = l.draw(&mut rng);
            let score = l.log_pdf(&x) - g.log_pdf(&x);
            if best.as_ref().is_none_or(|(s, _)| score > *s || s.is_nan()) {
                best = Some((score, x));
            }
        }
        let chosen = best.map(|(_, x)| x).unwrap_or_default();
        let mut out = Params::new();
        for (i, (name, spec)) in self.space.iter().enumerate() {
            let value = match self.modelled.iter().position(|&m| m == i) {
                Some(d) => chosen.get(d).and_then(|x| decode(spec, *x)),
                // A single possible value (or none).
                None => decode(spec, 0.0).filter(|_| choices(spec) > 0.0),
            };
            if let Some(v) = value {
                out.insert(name.clone(), v);
            }
        }
        out
    }

    /// What became of trial `trial` run with `params`: a complete trial's
    /// objective as the study's metric reports it (the direction given to
    /// [`Tpe::new`] decides what is better; a non-finite value is not told,
    /// as Optuna fails such a trial), or the last report of a pruned one.
    /// Telling a trial again replaces what was told.
    fn tell(&mut self, trial: u64, params: &Params, outcome: Outcome) {
        let loss = |v: f64| match self.direction {
            Direction::Minimize => v,
            Direction::Maximize => -v,
        };
        let state = match outcome {
            Outcome::Complete(v) if !v.is_finite() => return,
            Outcome::Complete(v) => State::Complete(loss(v)),
            Outcome::Pruned { epoch, value } => {
                State::Pruned { epoch, loss: if value.is_nan() { f64::INFINITY } else { loss(value) } }
            }
        };
        let coords = self.coords(params);
        self.told.insert(trial, Observation { state, coords, also: Vec::new(), violation: 0.0 });
    }

    /// Trial `trial` completed with `value` (the metric's own direction; not
    /// told when not finite) and the figures of the study's `also`
    /// (minimised; non-finite ones keep the trial out of the good ones of
    /// a multi-objective search).
    fn tell_values(&mut self, trial: u64, params: &Params, value: f64, also: &[f64]) {
        self.tell(trial, params, Outcome::Complete(value));
        if let Some(o) = self.told.get_mut(&trial) {
            o.also = also.to_vec();
        }
    }

    fn tell_violation(&mut self, trial: u64, violation: f64) {
        if let Some(o) = self.told.get_mut(&trial) {
            o.violation = if violation.is_nan() { f64::INFINITY } else { violation.max(0.0) };
        }
    }

    /// Trials told so far (complete with a finite value, or pruned).
    fn observations(&self) -> usize {
        self.told.len()
    }
}

/// Trials (trial, loss) with every objective, and the others.
type Split = (Vec<(u64, f64)>, Vec<(u64, f64)>);

impl Tpe {
    /// The complete trials (trial, loss) reordered so that the first
    /// `n_below` are the good ones of a multi-objective search (Optuna's
    /// `_split_complete_trials_multi_objective`): whole fronts by
    /// non-domination rank while they fit, then the points of the next
    /// front adding most hypervolume, greedily, from the reference point
    /// 10 % beyond that front's worst. Trials without every objective come
    /// last.
    fn by_front(&self, complete: &[(u64, f64)], n_below: usize) -> Vec<(u64, f64)> {
        let (full, partial): Split = complete.iter().partition(|(t, loss)| {
            self.told.get(t).is_some_and(|o| {
                o.also.len() + 1 == self.objectives && loss.is_finite() && o.also.iter().all(|v| v.is_finite())
            })
        });
        let points: Vec<Vec<f64>> = full
            .iter()
            .map(|(t, loss)| {
                let also = self.told.get(t).map(|o| o.also.as_slice()).unwrap_or_default();
                std::iter::once(*loss).chain(also.iter().copied()).collect()
            })
            .collect();
        let rank = pareto::ranks(&points);
        let mut good: Vec<usize> = Vec::new();
        let mut r = 0;
        while good.len() < n_below.min(points.len()) {
            let front: Vec<usize> = (0..points.len()).filter(|&i| rank[i] == r).collect();
            if good.len() + front.len() <= n_below {
                good.extend(front);
            } else {
                let members: Vec<Vec<f64>> = front.iter().map(|&i| points[i].clone()).collect();
                let reference = pareto::reference_point(&members).unwrap_or_default();
                good.extend(pareto::greedy_subset(&points, &front, n_below - good.len(), &reference));
            }
            r += 1;
        }
        let mut out: Vec<(u64, f64)> = good.iter().map(|&i| full[i]).collect();
        out.extend((0..full.len()).filter(|i| !good.contains(i)).map(|i| full[i]));
        // By the first objective among themselves, should they be needed.
        let mut partial = partial;
        partial.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        out.extend(partial);
        out
    }
}

/// Optuna's `default_weights(n)`: 1 for the last 25, a linear ramp from
/// `1 / n` for the older ones.
fn default_weights(n: usize) -> Vec<f64> {
    if n < FLAT_WEIGHTS {
        return vec![1.0; n];
    }
    let ramp = n - FLAT_WEIGHTS;
    let first = 1.0 / n as f64;
    let mut w: Vec<f64> = (0..ramp)
        .map(|i| if ramp == 1 { first } else { first + (1.0 - first) * i as f64 / (ramp - 1) as f64 })
        .collect();
    w.extend(std::iter::repeat_n(1.0, FLAT_WEIGHTS));
    w
}

/// How many values a parameter can take (as a float: ints can have 2^64).
pub(super) fn choices(spec: &ParamSpec) -> f64 {
    match spec {
        ParamSpec::Categorical { values } => values.len() as f64,
        ParamSpec::Int { low, high, step } if high >= low => int_top(*low, *high, *step) as f64 + 1.0,
        ParamSpec::Int { .. } => 1.0,
        ParamSpec::Float { low, high, .. } | ParamSpec::LogFloat { low, high, .. } => {
            if high > low {
                f64::INFINITY
            } else {
                1.0
            }
        }
    }
}

/// The largest lattice index of an int domain (0 when `high < low`).
pub(super) fn int_top(low: i64, high: i64, step: i64) -> i128 {
    ((i128::from(high) - i128::from(low)) / i128::from(step.max(1))).max(0)
}

/// The model coordinate of a value: the index of a categorical value, the
/// lattice index `(v - low) / step` of an int (on the lattice only), the
/// value of a float, the natural log of a log_float. `None` outside the
/// domain.
pub(super) fn encode(spec: &ParamSpec, value: &ParamValue) -> Option<f64> {
    match spec {
        ParamSpec::Categorical { values } => values.iter().position(|v| v == value).map(|i| i as f64),
        ParamSpec::Int { low, high, step } => {
            let v = match value {
                ParamValue::Int(v) => i128::from(*v),
                ParamValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => *f as i128,
                _ => return None,
            };
            let offset = v - i128::from(*low);
            let step = i128::from((*step).max(1));
            (v >= i128::from(*low) && v <= i128::from(*high) && offset % step == 0).then(|| (offset / step) as f64)
        }
        ParamSpec::Float { low, high, .. } => value.as_f64().filter(|v| (*low..=*high).contains(v)),
        ParamSpec::LogFloat { low, high, .. } => {
            value.as_f64().filter(|v| *v > 0.0 && (*low..=*high).contains(v)).map(f64::ln)
        }
    }
}

/// The value at model coordinate `x` (the inverse of [`encode`]), always in
/// the domain: ints rounded to the lattice, numbers clamped to
/// `[low, high]`. `None` only for a categorical without values.
pub(super) fn decode(spec: &ParamSpec, x: f64) -> Option<ParamValue> {
    Some(match spec {
        ParamSpec::Categorical { values } => {
            // `as` saturates: NaN and negatives give 0, huge values the last index.
            return values.get((x.round() as usize).min(values.len().saturating_sub(1))).cloned();
        }
        ParamSpec::Int { low, high, step } => {
            let k = (x.round() as i128).clamp(0, int_top(*low, *high, *step));
            // In range by construction: low <= low + k * step <= high.
            ParamValue::Int((i128::from(*low) + k * i128::from((*step).max(1))) as i64)
        }
        ParamSpec::Float { low, high, .. } => ParamValue::Float(x.clamp(*low, *high)),
        ParamSpec::LogFloat { low, high, .. } => ParamValue::Float(x.exp().clamp(*low, *high)),
    })
}

/// A mixture of product kernels over the modelled parameters: one kernel
/// per observation and the prior kernel last.
#[derive(Debug)]
struct Mixture {
    /// Per kernel: log of its normalised weight.
    log_weight: Vec<f64>,
    /// Per kernel: cumulative normalised weight, for drawing a kernel.
    cumulative: Vec<f64>,
    dims: Vec<Dim>,
}

/// One parameter's components, one per kernel.
#[derive(Debug)]
enum Dim {
    /// Truncated Gaussians on `[low, high]`; `discrete`: scored by the mass
    /// of the unit bin around a lattice index and drawn values rounded.
    Numeric {
        low: f64,
        high: f64,
        discrete: bool,
        mu: Vec<f64>,
        sigma: Vec<f64>,
        /// Per kernel: log of its Gaussian's mass in `[low, high]`.
        log_mass: Vec<f64>,
    },
    /// Per kernel: the probability of each value.
    Categorical { p: Vec<Vec<f64>> },
}

impl Mixture {
    /// `observations`: coordinates of the modelled parameters, in trial order.
    fn new(specs: &[&ParamSpec], observations: &[Vec<f64>]) -> Self {
        let n = observations.len();
        let mut weights = default_weights(n);
        weights.push(if n == 0 { 1.0 } else { PRIOR_WEIGHT });
        let total: f64 = weights.iter().sum();
        let log_weight = weights.iter().map(|w| (w / total).ln()).collect();
        let cumulative = weights
            .iter()
            .scan(0.0, |acc, w| {
                *acc += w / total;
                Some(*acc)
            })
            .collect();
        let dims = specs
            .iter()
            .enumerate()
            .map(|(d, spec)| {
                let column: Vec<f64> = observations.iter().map(|o| o[d]).collect();
                Dim::new(spec, &column)
            })
            .collect();
        Mixture { log_weight, cumulative, dims }
    }

    fn log_pdf(&self, x: &[f64]) -> f64 {
        let terms = (0..self.log_weight.len())
            .map(|j| self.log_weight[j] + self.dims.iter().zip(x).map(|(d, x)| d.log_pdf(j, *x)).sum::<f64>());
        log_sum_exp(terms)
    }

    fn draw(&self, rng: &mut impl Rng) -> Vec<f64> {
        let u: f64 = rng.random();
        let j = self.cumulative.partition_point(|c| *c <= u).min(self.log_weight.len() - 1);
        self.dims.iter().map(|d| d.draw(j, rng)).collect()
    }
}

impl Dim {
    fn new(spec: &ParamSpec, points: &[f64]) -> Self {
        let (low, high, discrete) = match spec {
            ParamSpec::Categorical { values } => return Dim::categorical(values.len(), points),
            ParamSpec::Int { low, high, step } => (-0.5, int_top(*low, *high, *step) as f64 + 0.5, true),
            ParamSpec::Float { low, high, .. } => (*low, *high, false),
            ParamSpec::LogFloat { low, high, .. } => (low.ln(), high.ln(), false),
        };
        let (mut mu, mut sigma) = (points.to_vec(), bandwidths(points, low, high));
        mu.push(0.5 * (low + high));
        sigma.push(high - low);
        let log_mass = mu.iter().zip(&sigma).map(|(m, s)| log_gauss_mass((low - m) / s, (high - m) / s)).collect();
        Dim::Numeric { low, high, discrete, mu, sigma, log_mass }
    }

    fn categorical(k: usize, points: &[f64]) -> Self {
        let n = points.len();
        let k = k.max(1);
        if n == 0 {
            return Dim::Categorical { p: vec![vec![1.0 / k as f64; k]] };
        }
        let fill = PRIOR_WEIGHT / (n + 1) as f64;
        let mut p: Vec<Vec<f64>> = points
            .iter()
            .map(|&i| {
                let mut row = vec![fill; k];
                // Indices come from `encode`, so they are whole and in range.
                if let Some(slot) = row.get_mut(i as usize) {
                    *slot += 1.0;
                }
                let sum: f64 = row.iter().sum();
                row.iter().map(|v| v / sum).collect()
            })
            .collect();
        p.push(vec![1.0 / k as f64; k]);
        Dim::Categorical { p }
    }

    /// Log of kernel `j`'s density (probability, for ints and categoricals) at `x`.
    fn log_pdf(&self, j: usize, x: f64) -> f64 {
        match self {
            Dim::Categorical { p } => p[j].get(x as usize).map_or(f64::NEG_INFINITY, |p| p.ln()),
            Dim::Numeric { low, high, discrete, mu, sigma, log_mass } => {
                if !(*low..=*high).contains(&x) {
                    return f64::NEG_INFINITY;
                }
                let (m, s) = (mu[j], sigma[j]);
                if *discrete {
                    let (a, b) = ((x - 0.5).max(*low), (x + 0.5).min(*high));
                    log_gauss_mass((a - m) / s, (b - m) / s) - log_mass[j]
                } else {
                    let z = (x - m) / s;
                    -0.5 * z * z - s.ln() - 0.5 * (2.0 * PI).ln() - log_mass[j]
                }
            }
        }
    }

    fn draw(&self, j: usize, rng: &mut impl Rng) -> f64 {
        match self {
            Dim::Categorical { p } => {
                let mut u: f64 = rng.random();
                for (i, p) in p[j].iter().enumerate() {
                    if u < *p {
                        return i as f64;
                    }
                    u -= p;
                }
                // Rounding left `u` past the last value.
                p[j].len().saturating_sub(1) as f64
            }
            Dim::Numeric { low, high, discrete, mu, sigma, .. } => {
                let (m, s) = (mu[j], sigma[j]);
                let mut x = m.clamp(*low, *high);
                for _ in 0..TRUNCATED_TRIES {
                    let y = m + s * standard_normal(rng);
                    if (*low..=*high).contains(&y) {
                        x = y;
                        break;
                    }
                }
                if *discrete {
                    x.round().clamp(0.0, high - 0.5)
                } else {
                    x
                }
            }
        }
    }
}

/// Each point's kernel deviation (Optuna's, `consider_endpoints = False`):
/// the larger gap to its sorted neighbours, the domain's ends acting as
/// neighbours of the outermost points, except that with two points or more
/// the outermost take their inner gap; clipped to `[width / min(100, 1 +
/// kernels), width]`, `kernels` counting the prior.
fn bandwidths(points: &[f64], low: f64, high: f64) -> Vec<f64> {
    let n = points.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| points[a].total_cmp(&points[b]));
    let sorted: Vec<f64> = order.iter().map(|&i| points[i]).collect();
    let mut sorted_sigma: Vec<f64> = (0..n)
        .map(|j| {
            let left = if j == 0 { low } else { sorted[j - 1] };
            let right = if j + 1 == n { high } else { sorted[j + 1] };
            (sorted[j] - left).max(right - sorted[j])
        })
        .collect();
    if n >= 2 {
        sorted_sigma[0] = sorted[1] - sorted[0];
        sorted_sigma[n - 1] = sorted[n - 1] - sorted[n - 2];
    }
    let width = high - low;
    let min_sigma = width / (1.0 + (n + 1) as f64).min(100.0);
    let mut sigma = vec![0.0; n];
    for (rank, &i) in order.iter().enumerate() {
        sigma[i] = sorted_sigma[rank].clamp(min_sigma, width);
    }
    sigma
}

/// `ln(sum(exp(terms)))` without overflow; `-inf` for no terms.
fn log_sum_exp(terms: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = terms.clone().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + terms.map(|t| (t - max).exp()).sum::<f64>().ln()
}

/// A standard normal draw (Box-Muller).
pub(super) fn standard_normal(rng: &mut impl Rng) -> f64 {
    // 1 - [0, 1) is (0, 1]: the log is finite.
    let u1 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
}

/// `ln Phi(x)`, the log of the standard normal distribution function,
/// accurate in both tails.
fn log_ndtr(x: f64) -> f64 {
    if x > 6.0 {
        (-0.5 * libm::erfc(x / SQRT_2)).ln_1p()
    } else if x > -37.0 {
        (0.5 * libm::erfc(-x / SQRT_2)).ln()
    } else {
        // Asymptotic series of Mills' ratio (relative error below 1e-9 here).
        let x2 = x * x;
        -0.5 * x2 - (-x).ln() - 0.5 * (2.0 * PI).ln() + (1.0 - 1.0 / x2 + 3.0 / (x2 * x2)).ln()
    }
}

/// `ln(Phi(b) - Phi(a))` for `a <= b`, accurate in the tails (Optuna's
/// `_log_gauss_mass`); `-inf` for an empty interval.
fn log_gauss_mass(a: f64, b: f64) -> f64 {
    if a.partial_cmp(&b) != Some(Ordering::Less) {
        return f64::NEG_INFINITY;
    }
    if b <= 0.0 {
        let (p, q) = (log_ndtr(b), log_ndtr(a));
        if q == f64::NEG_INFINITY {
            p
        } else {
            p + (-(q - p).exp_m1()).ln()
        }
    } else if a >= 0.0 {
        log_gauss_mass(-b, -a)
    } else {
        // Both tails outside: 1 - Phi(a) - Phi(-b).
        (-0.5 * libm::erfc(-a / SQRT_2) - 0.5 * libm::erfc(b / SQRT_2)).ln_1p()
    }
}

#[cfg(test)]
mod tests;
