//! The Tree-structured Parzen Estimator (TPE) as Optuna 5's default
//! `TPESampler` runs it for one objective: multivariate kernels, the prior
//! in every estimator, ints scored by the probability of their bin, pruned
//! trials told, and a constant liar for the trials still running. Seeded
//! and reproducible.
//!
//! # How it chooses
//!
//! While fewer than [`TpeSettings::startup`] trials were told (complete or
//! pruned), a configuration is drawn at random with [`super::sample`]. After
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
//! - One objective: a multi-objective study searches its first objective
//!   (Optuna 5 switches to independent MOTPE for several objectives).
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

use super::draw::sample;
use crate::domain::study::{Direction, ParamSpec};

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

/// What became of a trial, as the model is told it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// It finished with this objective value (as the metric reports it).
    Complete(f64),
    /// It was stopped early after reporting `value` at `epoch`, its last report.
    Pruned { epoch: u32, value: f64 },
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
        Tpe { space, modelled, direction, seed, settings, told: BTreeMap::new() }
    }

    /// The configuration for the `index`-th ask, `running` being the trials
    /// created and not yet told (trial number, configuration): random while
    /// fewer than `settings.startup` trials were told, chosen by the model
    /// after. A function of (seed, index, told trials, running trials). A
    /// categorical parameter without values is left out.
    pub fn ask(&self, index: u64, running: &[(u64, &Params)]) -> Params {
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
    pub fn tell(&mut self, trial: u64, params: &Params, outcome: Outcome) {
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
        self.told.insert(trial, Observation { state, coords });
    }

    /// Trials told so far (complete with a finite value, or pruned).
    pub fn observations(&self) -> usize {
        self.told.len()
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
        complete.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
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
fn choices(spec: &ParamSpec) -> f64 {
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
fn int_top(low: i64, high: i64, step: i64) -> i128 {
    ((i128::from(high) - i128::from(low)) / i128::from(step.max(1))).max(0)
}

/// The model coordinate of a value: the index of a categorical value, the
/// lattice index `(v - low) / step` of an int (on the lattice only), the
/// value of a float, the natural log of a log_float. `None` outside the
/// domain.
fn encode(spec: &ParamSpec, value: &ParamValue) -> Option<f64> {
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
fn decode(spec: &ParamSpec, x: f64) -> Option<ParamValue> {
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
fn standard_normal(rng: &mut impl Rng) -> f64 {
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
mod tests {
    use super::*;

    fn float(v: &ParamValue) -> f64 {
        v.as_f64().expect("numeric")
    }

    fn categorical(values: &[&str]) -> ParamSpec {
        ParamSpec::Categorical { values: values.iter().map(|v| ParamValue::Text((*v).to_string())).collect() }
    }

    /// x in [-2, 2], lr log-uniform in [1e-6, 1], opt one of four.
    fn bench_space() -> Vec<(String, ParamSpec)> {
        vec![
            ("x".to_string(), ParamSpec::Float { low: -2.0, high: 2.0, grid: 5 }),
            ("lr".to_string(), ParamSpec::LogFloat { low: 1e-6, high: 1.0, grid: 5 }),
            ("opt".to_string(), categorical(&["adam", "sgd", "rmsprop", "adagrad"])),
        ]
    }

    /// Minimum 0 at x = 0.3, lr = 10^-2.5, opt = "adam".
    fn bench(p: &Params) -> f64 {
        let penalty = if p["opt"].to_string() == "adam" { 0.0 } else { 1.0 };
        (float(&p["x"]) - 0.3).powi(2) + (float(&p["lr"]).log10() + 2.5).powi(2) + penalty
    }

    /// Runs `budget` sequential asks of a TPE on `f`, telling each result;
    /// the values in ask order.
    fn run(tpe: &mut Tpe, budget: u64, mut f: impl FnMut(&Params) -> f64) -> Vec<f64> {
        (0..budget)
            .map(|i| {
                let p = tpe.ask(i, &[]);
                let v = f(&p);
                tpe.tell(i, &p, Outcome::Complete(v));
                v
            })
            .collect()
    }

    fn min(values: &[f64]) -> f64 {
        values.iter().copied().fold(f64::INFINITY, f64::min)
    }

    fn mean(values: &[f64]) -> f64 {
        values.iter().sum::<f64>() / values.len() as f64
    }

    fn unit() -> Vec<(String, ParamSpec)> {
        vec![("x".to_string(), ParamSpec::Float { low: 0.0, high: 1.0, grid: 3 })]
    }

    fn at(x: f64) -> Params {
        Params::from([("x".to_string(), ParamValue::Float(x))])
    }

    #[test]
    fn defaults_are_optunas() {
        assert_eq!(TpeSettings::default(), TpeSettings { startup: 10, candidates: 24, gamma: 0.1 });
        assert_eq!(default_weights(3), vec![1.0; 3]);
        // Optuna 5: np.concatenate([np.linspace(1 / 28, 1, 3), np.ones(25)]).
        let w = default_weights(28);
        assert_eq!(w.len(), 28);
        assert!((w[0] - 1.0 / 28.0).abs() < 1e-15 && (w[1] - (1.0 / 28.0 + 1.0) / 2.0).abs() < 1e-15, "{w:?}");
        assert!(w[2..].iter().all(|v| *v == 1.0));
        assert_eq!(default_weights(26)[0], 1.0 / 26.0);
    }

    /// Optuna 5's `_ParzenEstimator` on the same observations (computed
    /// with optuna 5.0.0, `scripts/bench-search.sh`'s virtual environment):
    /// per-kernel bandwidths and the log density of a few points.
    #[test]
    fn the_estimator_matches_optunas_numbers() {
        // One point at 0.8 on [0, 1]: the larger gap to the domain's ends
        // (0.8), above the magic clip's floor 1 / 3; the prior at 0.5 with
        // deviation 1.
        assert_eq!(bandwidths(&[0.8], 0.0, 1.0), vec![0.8]);
        // [0.1, 0.15, 0.9]: gaps 0.05 (the outer ones take their inner gap),
        // 0.75, 0.75; the floor is 1 / min(100, 1 + 4) = 0.2.
        let s = bandwidths(&[0.9, 0.1, 0.15], 0.0, 1.0);
        assert!((s[0] - 0.75).abs() < 1e-15 && (s[1] - 0.2).abs() < 1e-15 && (s[2] - 0.75).abs() < 1e-15, "{s:?}");

        // A mixed space: float [0, 1], log_float [1e-3, 1], int 1..=10 step 3
        // (lattice 1, 4, 7, 10), categorical of three.
        let specs = [
            ParamSpec::Float { low: 0.0, high: 1.0, grid: 3 },
            ParamSpec::LogFloat { low: 1e-3, high: 1.0, grid: 3 },
            ParamSpec::Int { low: 1, high: 10, step: 3 },
            categorical(&["a", "b", "c"]),
        ];
        let obs = |x: f64, lr: f64, n: i64, c: &str| -> Vec<f64> {
            [ParamValue::Float(x), ParamValue::Float(lr), ParamValue::Int(n), ParamValue::Text(c.into())]
                .iter()
                .zip(&specs)
                .map(|(v, s)| encode(s, v).expect("in the domain"))
                .collect()
        };
        let points = vec![obs(0.8, 0.01, 4, "b"), obs(0.2, 0.5, 10, "a"), obs(0.5, 0.001, 1, "b")];
        let refs: Vec<&ParamSpec> = specs.iter().collect();
        let m = Mixture::new(&refs, &points);
        // Optuna 5.0.0, the same observations (script in BENCHMARKS.md):
        //   _ParzenEstimator(obs, space, _ParzenEstimatorParameters(1.0, True, False, default_weights, True))
        //   .log_pdf({"x": [0.3, 0.95], "lr": [0.02, 0.002], "n": [4, 10], "c": [1, 2]})
        let want = [-3.910_397_088_000_802_3, -5.436_126_939_629_982_5];
        for (i, (x, lr, n, c)) in [(0.3, 0.02, 4, "b"), (0.95, 0.002, 10, "c")].into_iter().enumerate() {
            let got = m.log_pdf(&obs(x, lr, n, c));
            assert!((got - want[i]).abs() < 1e-9, "point {i}: {got} vs Optuna's {}", want[i]);
        }
    }

    #[test]
    fn an_int_scores_the_probability_of_its_bin() {
        // One kernel at index 1 of the lattice 0..=3 (bins [-0.5, 3.5]):
        // the probabilities of the four values sum to one exactly.
        let spec = ParamSpec::Int { low: 0, high: 3, step: 1 };
        let d = Dim::new(&spec, &[1.0]);
        let total: f64 = (0..4).map(|k| d.log_pdf(0, f64::from(k)).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12, "{total}");
        // The bin's mass, not the density at the point: sigma here is 2.5
        // (the gap to the far end, 3.5 - 1), so the two differ.
        let Dim::Numeric { sigma, log_mass, .. } = &d else { panic!("numeric") };
        let s = sigma[0];
        assert_eq!(s, 2.5);
        let bin = (0.5 * libm::erfc(-(0.5 / s) / SQRT_2) - 0.5 * libm::erfc((0.5 / s) / SQRT_2)).ln() - log_mass[0];
        assert!((d.log_pdf(0, 1.0) - bin).abs() < 1e-12);
        let density = -0.5 * (2.0 * PI).ln() - s.ln() - log_mass[0];
        assert!((d.log_pdf(0, 1.0) - density).abs() > 1e-3);
    }

    #[test]
    fn gauss_mass_is_accurate_in_the_tails() {
        // ln(Phi(-40) - Phi(-41)) and far right, where 1 - Phi cancels.
        assert!((log_gauss_mass(-41.0, -40.0) - log_ndtr(-40.0)).abs() < 1e-9);
        assert!((log_ndtr(-40.0) - (-804.608_442_013_754_2)).abs() < 1e-6, "{}", log_ndtr(-40.0));
        assert!((log_gauss_mass(40.0, 41.0) - log_gauss_mass(-41.0, -40.0)).abs() < 1e-12);
        assert!((log_gauss_mass(-1.0, 1.0) - 0.682_689_492_137_085_9f64.ln()).abs() < 1e-14);
        assert!((log_gauss_mass(f64::NEG_INFINITY, f64::INFINITY)).abs() < 1e-15);
        assert_eq!(log_gauss_mass(1.0, 1.0), f64::NEG_INFINITY);
        // A narrow bin far out: about the density times the width.
        let narrow = log_gauss_mass(8.0, 8.0 + 1e-6);
        let approx = -32.0 - 0.5 * (2.0 * PI).ln() + 1e-6f64.ln();
        assert!((narrow - approx).abs() < 1e-4, "{narrow} vs {approx}");
    }

    #[test]
    fn pruned_trials_are_bad_after_complete_ones_and_ranked_by_their_last_report() {
        let mut t = Tpe::new(unit(), Direction::Minimize, 1, TpeSettings { startup: 0, ..Default::default() });
        // 25 told: 3 good (ceil(2.5)). Two complete, so one pruned is good:
        // the one that got furthest (epoch 5), not the better value at epoch 2.
        t.tell(0, &at(0.10), Outcome::Complete(9.0));
        t.tell(1, &at(0.11), Outcome::Complete(8.0));
        t.tell(2, &at(0.50), Outcome::Pruned { epoch: 2, value: 0.1 });
        t.tell(3, &at(0.60), Outcome::Pruned { epoch: 5, value: 3.0 });
        t.tell(4, &at(0.70), Outcome::Pruned { epoch: 5, value: f64::NAN });
        for i in 5..25 {
            t.tell(i, &at(0.9), Outcome::Pruned { epoch: 1, value: 0.0 });
        }
        let (good, bad) = t.split(&[]);
        assert_eq!(good, vec![vec![0.10], vec![0.11], vec![0.60]]);
        assert_eq!(bad.len(), 22);
        assert_eq!(bad[..2], [vec![0.50], vec![0.70]], "in trial order");
        // A complete trial told later replaces the pruned one it was.
        t.tell(4, &at(0.70), Outcome::Complete(1.0));
        assert_eq!(t.split(&[]).0, vec![vec![0.10], vec![0.11], vec![0.70]]);
        assert_eq!(t.observations(), 25);
    }

    #[test]
    fn a_stopped_region_is_avoided_once_told() {
        // Ten complete trials on a grid, the best two at 0.25 and 0.35; then
        // ten trials stopped early, either right beside the best (0.20 to
        // 0.29) or far away (0.80 to 0.89). Told beside the best, they pull
        // the next asks away from there.
        let near = |stopped_at: f64| {
            let mut t = Tpe::new(unit(), Direction::Minimize, 4, TpeSettings::default());
            for i in 0..10u64 {
                let x = 0.05 + 0.1 * i as f64;
                t.tell(i, &at(x), Outcome::Complete((x - 0.3).powi(2)));
            }
            for i in 10..20u64 {
                t.tell(i, &at(stopped_at + 0.01 * (i - 10) as f64), Outcome::Pruned { epoch: 1, value: 5.0 });
            }
            (20..220).filter(|&i| (0.2..0.3).contains(&float(&t.ask(i, &[])["x"]))).count()
        };
        let (far, beside) = (near(0.8), near(0.2));
        assert!(beside * 2 < far, "asks in [0.2, 0.3): {beside} with the stopped trials there, {far} without");
    }

    #[test]
    fn the_constant_liar_spreads_parallel_asks() {
        // Minimise (x - 0.8)^2, then ask four at once: each ask sees the
        // earlier ones running. Without the liar they crowd the mode.
        let f = |p: &Params| (float(&p["x"]) - 0.8).powi(2);
        let (mut crowded, mut spread) = (0.0, 0.0);
        for seed in 0..10 {
            let mut t = Tpe::new(unit(), Direction::Minimize, seed, TpeSettings::default());
            run(&mut t, 30, f);
            let batch = |liar: bool| -> Vec<f64> {
                let mut running: Vec<(u64, Params)> = Vec::new();
                for i in 30..34 {
                    let refs: Vec<(u64, &Params)> = running.iter().map(|(t, p)| (*t, p)).collect();
                    let p = t.ask(i, if liar { &refs } else { &[] });
                    running.push((i, p));
                }
                running.iter().map(|(_, p)| float(&p["x"])).collect()
            };
            let width = |xs: &[f64]| {
                let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(*x), b.max(*x)));
                hi - lo
            };
            let (plain, lied) = (batch(false), batch(true));
            crowded += width(&plain);
            spread += width(&lied);
            // Asking is pure: the same running set gives the same answer.
            assert_eq!(batch(true), lied);
        }
        assert!(spread > 1.5 * crowded, "mean spread of 4 parallel asks: {spread} with the liar, {crowded} without");
    }

    #[test]
    fn same_seed_and_history_give_the_same_asks() {
        let new = |seed| Tpe::new(bench_space(), Direction::Minimize, seed, TpeSettings::default());
        let (mut a, mut b, mut c) = (new(5), new(5), new(6));
        let asks = |t: &mut Tpe| -> Vec<Params> {
            (0..30)
                .map(|i| {
                    let p = t.ask(i, &[]);
                    t.tell(i, &p, Outcome::Complete(bench(&p)));
                    p
                })
                .collect()
        };
        let (pa, pb, pc) = (asks(&mut a), asks(&mut b), asks(&mut c));
        assert_eq!(pa, pb);
        // Model-based asks (after the 10 random ones) too, not just the startup.
        assert_ne!(pa[..10], pc[..10]);
        assert_ne!(pa[10..], pc[10..]);

        // Asking is a function of (seed, index, told set): a fresh TPE told the
        // same results in reverse order answers the same, and asking twice
        // changes nothing.
        let mut d = new(5);
        for (i, p) in pa.iter().enumerate().rev() {
            d.tell(i as u64, p, Outcome::Complete(bench(p)));
        }
        assert_eq!(d.observations(), 30);
        assert_eq!(a.ask(30, &[]), d.ask(30, &[]));
        assert_eq!(a.ask(30, &[]), a.ask(30, &[]));
        assert_ne!(a.ask(30, &[]), a.ask(31, &[]));
    }

    #[test]
    fn non_finite_and_foreign_values_are_ignored_or_left_out() {
        let mut t = Tpe::new(bench_space(), Direction::Minimize, 1, TpeSettings { startup: 0, ..Default::default() });
        let p = t.ask(0, &[]);
        t.tell(0, &p, Outcome::Complete(f64::NAN));
        t.tell(1, &p, Outcome::Complete(f64::INFINITY));
        assert_eq!(t.observations(), 0);
        // Out of the domain, of the wrong type, or missing: told, but no kernel.
        let mut odd = Params::new();
        odd.insert("x".into(), ParamValue::Float(7.0));
        odd.insert("opt".into(), ParamValue::Text("lbfgs".into()));
        t.tell(2, &odd, Outcome::Complete(1.0));
        assert_eq!(t.observations(), 1);
        assert_eq!(t.told[&2].coords, None);
        let ask = t.ask(1, &[]);
        assert!((-2.0..=2.0).contains(&float(&ask["x"])));
        assert_eq!(encode(&ParamSpec::Int { low: 1, high: 9, step: 4 }, &ParamValue::Int(3)), None, "off the lattice");
    }

    #[test]
    fn asks_stay_in_the_domain_before_and_after_startup() {
        let space = vec![
            ("c".to_string(), categorical(&["a", "b", "c"])),
            ("n".to_string(), ParamSpec::Int { low: -5, high: 8, step: 4 }),
            ("one".to_string(), ParamSpec::Int { low: 3, high: 3, step: 1 }),
            ("huge".to_string(), ParamSpec::Int { low: i64::MIN, high: i64::MAX, step: 1 }),
            ("f".to_string(), ParamSpec::Float { low: 2.5, high: 3.5, grid: 3 }),
            ("lr".to_string(), ParamSpec::LogFloat { low: 1e-4, high: 1e-1, grid: 3 }),
            ("only".to_string(), categorical(&["z"])),
        ];
        for seed in 0..4 {
            let mut t = Tpe::new(space.clone(), Direction::Minimize, seed, TpeSettings::default());
            let mut seen_n = std::collections::BTreeSet::new();
            let mut seen_c = std::collections::BTreeSet::new();
            // Pulls the model towards the edges: small f, large lr, n at the top.
            let values = run(&mut t, 150, |p| {
                let ParamValue::Int(n) = p["n"] else { panic!("n is an int: {p:?}") };
                let ParamValue::Int(one) = p["one"] else { panic!("one is an int: {p:?}") };
                let ParamValue::Int(_) = p["huge"] else { panic!("huge is an int: {p:?}") };
                assert!([-5, -1, 3, 7].contains(&n), "{n} off the lattice");
                assert_eq!(one, 3);
                assert_eq!(p["only"].to_string(), "z");
                seen_n.insert(n);
                let c = p["c"].to_string();
                assert!(["a", "b", "c"].contains(&c.as_str()), "{c}");
                seen_c.insert(c);
                let f = float(&p["f"]);
                assert!((2.5..=3.5).contains(&f), "{f}");
                let lr = float(&p["lr"]);
                assert!((1e-4..=1e-1).contains(&lr), "{lr}");
                f - lr.log10() - n as f64
            });
            assert_eq!(values.len(), 150);
            assert_eq!(t.observations(), 150);
            assert_eq!(seen_n.len(), 4, "seed {seed}: {seen_n:?}");
            assert_eq!(seen_c.len(), 3, "seed {seed}: {seen_c:?}");
        }
    }

    #[test]
    fn int_asks_find_the_best_lattice_point() {
        let space = vec![("n".to_string(), ParamSpec::Int { low: 1, high: 200, step: 3 })];
        let mut t = Tpe::new(space, Direction::Minimize, 9, TpeSettings::default());
        // Best at 100 (on the lattice 1, 4, ..., 100, ..., 199).
        let values = run(&mut t, 60, |p| (float(&p["n"]) - 100.0).abs());
        assert_eq!(min(&values), 0.0, "{values:?}");
    }

    #[test]
    fn the_mixture_integrates_to_one_over_the_domain() {
        for points in [vec![], vec![0.9], vec![0.0, 0.1, 0.15, 1.0], vec![0.5; 7]] {
            let spec = ParamSpec::Float { low: 0.0, high: 1.0, grid: 3 };
            let rows: Vec<Vec<f64>> = points.iter().map(|p| vec![*p]).collect();
            let m = Mixture::new(&[&spec], &rows);
            let steps = 20_000;
            let h = 1.0 / steps as f64;
            let integral: f64 = (0..steps).map(|i| m.log_pdf(&[(i as f64 + 0.5) * h]).exp() * h).sum();
            assert!((integral - 1.0).abs() < 1e-3, "{points:?}: {integral}");
            assert_eq!(m.log_pdf(&[1.5]), f64::NEG_INFINITY);
        }
        // Categorical: each observation's row 1/4 on every value and 1 more on
        // its own (over 7/4), the prior row uniform; mixed with equal weights.
        let spec = categorical(&["a", "b", "c"]);
        let m = Mixture::new(&[&spec], &[vec![0.0], vec![0.0], vec![2.0]]);
        let p: Vec<f64> = (0..3).map(|i| m.log_pdf(&[f64::from(i)]).exp()).collect();
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let want = [(10.0 / 7.0 + 1.0 / 7.0 + 1.0 / 3.0) / 4.0, (3.0 / 7.0 + 1.0 / 3.0) / 4.0];
        assert!((p[0] - want[0]).abs() < 1e-12 && (p[1] - want[1]).abs() < 1e-12, "{p:?} {want:?}");
    }

    /// TPE against the best of as many random draws ([`sample`] with ChaCha8
    /// seeded the same), over 20 seeds; the table prints with `--nocapture`.
    #[test]
    fn tpe_beats_random_search() {
        let budget = 60;
        let mut wins = 0;
        let (mut tpe_total, mut random_total) = (0.0, 0.0);
        for seed in 0..20 {
            let mut t = Tpe::new(bench_space(), Direction::Minimize, seed, TpeSettings::default());
            let tpe_best = min(&run(&mut t, budget, bench));
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let random: Vec<f64> = (0..budget)
                .map(|_| bench(&bench_space().iter().map(|(n, s)| (n.clone(), sample(s, &mut rng))).collect()))
                .collect();
            let random_best = min(&random);
            println!("seed {seed}: tpe {tpe_best:.5} random {random_best:.5}");
            wins += usize::from(tpe_best < random_best);
            tpe_total += tpe_best;
            random_total += random_best;
        }
        println!("mean: tpe {:.5} random {:.5}; tpe better in {wins}/20", tpe_total / 20.0, random_total / 20.0);
        assert!(tpe_total * 2.0 < random_total, "mean best: tpe {} random {}", tpe_total / 20.0, random_total / 20.0);
        assert!(wins >= 16, "tpe better in only {wins} of 20 seeds");
    }

    #[test]
    fn maximize_seeks_high_values_and_minimize_low_ones() {
        let space = vec![
            ("x".to_string(), ParamSpec::Float { low: 0.0, high: 1.0, grid: 3 }),
            ("n".to_string(), ParamSpec::Int { low: 0, high: 20, step: 2 }),
        ];
        // Highest (0) at x = 0.7, n = 6; lowest at x = 0, n = 20.
        let h = |p: &Params| -(float(&p["x"]) - 0.7).powi(2) - ((float(&p["n"]) - 6.0) / 10.0).powi(2);
        for seed in 0..3 {
            let new = |d| Tpe::new(space.clone(), d, seed, TpeSettings::default());
            let up = run(&mut new(Direction::Maximize), 60, h);
            let down = run(&mut new(Direction::Minimize), 60, h);
            let best_up = up.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert!(best_up > -0.005, "seed {seed}: best {best_up}");
            // After the startup, each direction's asks move its own way from the random ones.
            let (start, late_up, late_down) = (mean(&up[..10]), mean(&up[30..]), mean(&down[30..]));
            assert!(late_up > start + 0.05, "seed {seed}: late {late_up} vs startup {start}");
            assert!(late_down < start - 0.05, "seed {seed}: late {late_down} vs startup {start}");
        }
    }
}
