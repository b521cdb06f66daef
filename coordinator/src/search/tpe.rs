//! The Tree-structured Parzen Estimator (TPE), Optuna's default sampler:
//! seeded, reproducible, univariate, for a scalar objective.
//!
//! # How it chooses
//!
//! While fewer than [`TpeSettings::startup`] observations were told, a
//! configuration is drawn at random with [`super::sample`]. After that the
//! told observations are split at `gamma`: the best
//! `min(ceil(gamma * n), GAMMA_CAP)` are "good", the rest "bad". For each
//! parameter on its own (univariate TPE, as Optuna's default) two densities
//! are built, `l(x)` from the good values and `g(x)` from the bad ones;
//! [`TpeSettings::candidates`] candidates are drawn from `l` and the one
//! maximising `l(x) / g(x)` is chosen.
//!
//! - Numbers are modelled by a Parzen estimator: a mixture of Gaussians
//!   truncated to the domain, one per observation (standard deviation the
//!   larger distance to its neighbours, clipped to `[width / min(100, 1 + k),
//!   width]` for `k` kernels) plus a prior kernel at the middle of the domain
//!   with the domain's width as deviation and weight [`PRIOR_WEIGHT`].
//!   `log_float` is modelled in log space; `int` in lattice-index space
//!   (`k = (v - low) / step` on `[-0.5, k_max + 0.5]`, candidates rounded to
//!   the lattice before they are scored).
//! - Categorical values are modelled by a smoothed histogram: each
//!   observation counts one, the prior weight is spread over all values.
//!
//! # Reproducibility
//!
//! [`Tpe::ask`] draws from a ChaCha8 stream chosen by `(seed, index)` and
//! builds the model from the told observations only, kept in a canonical
//! order (by objective, then by value): the same seed, index and *set* of
//! told observations give the same configuration, whatever the order the
//! results arrived in. For that reason the model differs from Optuna's in
//! one point: every observation has the same weight (Optuna lowers the
//! weight of old trials past 25, which needs trial numbers that
//! [`Tpe::tell`] does not carry).
//!
//! # Why not the `tpe` crate
//!
//! The `tpe` crate (sile/tpe, by the optuna-rs author) was judged and not
//! used. It is small and readable and takes the caller's RNG, but: 0.3.1
//! needs rand 0.10 and Rust 1.88 while this workspace is on rand 0.9 /
//! rand_chacha 0.9 and declares Rust 1.85 (the ChaCha8Rng that
//! [`super::sample`] uses does not implement its `Rng`, so the startup and
//! model phases would need two RNG families; 0.2 is on rand 0.8 and pulls
//! statrs); its ranges are half-open (`tell` refuses a float's `high`, which
//! our domains include); it has no int lattice, no startup phase and no
//! gamma cap; and it keeps one optimizer per parameter, so all that plus the
//! good/bad split per configuration would be written here around it anyway.
//! The estimator below is about as long as that glue.

use std::cmp::Ordering;
use std::f64::consts::{PI, SQRT_2};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tunefleet_common::params::{ParamValue, Params};

use super::sample;
use crate::study::{Direction, ParamSpec};

/// Most observations counted as "good", whatever `gamma` says (Optuna's 25).
pub const GAMMA_CAP: usize = 25;
/// Weight of the prior kernel (numbers) or of the uniform prior spread over
/// the values (categorical), in observations (Optuna's 1.0).
pub const PRIOR_WEIGHT: f64 = 1.0;
/// Draws of a truncated Gaussian before falling back to its clamped mean.
/// Every kernel's mean lies in the domain and its deviation is at most the
/// domain's width, so one draw lands inside with probability above 1/3.
const TRUNCATED_TRIES: usize = 64;

/// Settings of [`Tpe`]; the defaults are Optuna's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TpeSettings {
    /// Observations told before the model is used; until then configurations
    /// are random. Default 10.
    pub startup: usize,
    /// Candidates drawn from `l(x)` per parameter and ask (at least 1 is
    /// used). Default 24.
    pub candidates: usize,
    /// Fraction of the observations that are "good" (rounded up, at most
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
    direction: Direction,
    seed: u64,
    settings: TpeSettings,
    /// Told observations, best first (ties by coordinates), so the model
    /// does not depend on the order of [`Tpe::tell`] calls.
    observed: Vec<Observation>,
}

/// One told result, in model terms.
#[derive(Debug, Clone)]
struct Observation {
    /// The objective as a value to minimise (negated when maximising).
    loss: f64,
    /// Each parameter's model coordinate (see [`encode`]); `None` when the
    /// configuration lacked the parameter or had it outside its domain.
    coords: Vec<Option<f64>>,
}

impl Tpe {
    /// `space`: every parameter searched, in a stable order (name, domain).
    pub fn new(space: Vec<(String, ParamSpec)>, direction: Direction, seed: u64, settings: TpeSettings) -> Self {
        Tpe { space, direction, seed, settings, observed: Vec::new() }
    }

    /// The configuration for the `index`-th ask: random while fewer than
    /// `settings.startup` observations were told, chosen by the model after.
    /// A function of (seed, index, the told observations): asking twice with
    /// nothing told in between gives the same answer. A categorical
    /// parameter without values is left out.
    pub fn ask(&mut self, index: u64) -> Params {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(index);
        let searched = self.space.iter().enumerate().filter(|(_, (_, spec))| !is_empty(spec));
        if self.observed.len() < self.settings.startup {
            return searched.map(|(_, (name, spec))| (name.clone(), sample(spec, &mut rng))).collect();
        }
        let (good, bad) = self.observed.split_at(self.good_count());
        let candidates = self.settings.candidates.max(1);
        searched
            .filter_map(|(i, (name, spec))| {
                let column = |set: &[Observation]| set.iter().filter_map(|o| o.coords[i]).collect::<Vec<f64>>();
                Some((name.clone(), suggest(spec, &column(good), &column(bad), candidates, &mut rng)?))
            })
            .collect()
    }

    /// An observed objective value of a configuration returned by `ask` (or
    /// any configuration in the space), as the study's metric reports it: the
    /// direction given to [`Tpe::new`] decides what is better. Non-finite
    /// values are ignored; parameters missing from `params` or outside their
    /// domain are left out of that parameter's model.
    pub fn tell(&mut self, params: &Params, value: f64) {
        if !value.is_finite() {
            return;
        }
        let loss = match self.direction {
            Direction::Minimize => value,
            Direction::Maximize => -value,
        };
        let coords = self.space.iter().map(|(name, spec)| params.get(name).and_then(|v| encode(spec, v))).collect();
        let observation = Observation { loss, coords };
        let at = self.observed.partition_point(|o| canonical(o, &observation) != Ordering::Greater);
        self.observed.insert(at, observation);
    }

    /// Observations told so far (finite values only).
    pub fn observations(&self) -> usize {
        self.observed.len()
    }

    /// How many of the (sorted) observations are "good".
    fn good_count(&self) -> usize {
        let n = self.observed.len();
        // A NaN or negative gamma saturates to 0 good observations: l(x) is the prior alone.
        let wanted = (self.settings.gamma * n as f64).ceil() as usize;
        wanted.min(GAMMA_CAP).min(n)
    }
}

/// Best first, then by coordinates (missing first), so equal objectives sort
/// the same way whatever order they were told in.
fn canonical(a: &Observation, b: &Observation) -> Ordering {
    a.loss.total_cmp(&b.loss).then_with(|| {
        for (x, y) in a.coords.iter().zip(&b.coords) {
            let order = match (x, y) {
                (Some(x), Some(y)) => x.total_cmp(y),
                (x, y) => x.is_some().cmp(&y.is_some()),
            };
            if order != Ordering::Equal {
                return order;
            }
        }
        Ordering::Equal
    })
}

fn is_empty(spec: &ParamSpec) -> bool {
    matches!(spec, ParamSpec::Categorical { values } if values.is_empty())
}

/// The largest lattice index of an int domain (0 when `high < low`).
fn int_top(low: i64, high: i64, step: i64) -> i128 {
    ((i128::from(high) - i128::from(low)) / i128::from(step.max(1))).max(0)
}

/// The model coordinate of a value: the index of a categorical value, the
/// lattice index `(v - low) / step` of an int, the value of a float, the
/// natural log of a log_float. `None` outside the domain.
fn encode(spec: &ParamSpec, value: &ParamValue) -> Option<f64> {
    match spec {
        ParamSpec::Categorical { values } => values.iter().position(|v| v == value).map(|i| i as f64),
        ParamSpec::Int { low, high, step } => {
            let step = (*step).max(1) as f64;
            match value {
                ParamValue::Int(v) if (low..=high).contains(&v) => {
                    Some((i128::from(*v) - i128::from(*low)) as f64 / step)
                }
                ParamValue::Float(v) if *v >= *low as f64 && *v <= *high as f64 => Some((v - *low as f64) / step),
                _ => None,
            }
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

/// The model's domain of a numeric parameter: `[low, high]` in model
/// coordinates. `None` for a categorical.
fn bounds(spec: &ParamSpec) -> Option<(f64, f64)> {
    match spec {
        ParamSpec::Categorical { .. } => None,
        ParamSpec::Int { low, high, step } => Some((-0.5, int_top(*low, *high, *step) as f64 + 0.5)),
        ParamSpec::Float { low, high, .. } => Some((*low, *high)),
        ParamSpec::LogFloat { low, high, .. } => Some((low.ln(), high.ln())),
    }
}

/// One parameter's value: the candidate drawn from `l` (built from `good`)
/// with the largest `l(x) / g(x)` (`g` built from `bad`). `None` only for a
/// categorical without values.
fn suggest(spec: &ParamSpec, good: &[f64], bad: &[f64], candidates: usize, rng: &mut impl Rng) -> Option<ParamValue> {
    let best = match (spec, bounds(spec)) {
        (ParamSpec::Categorical { values }, _) => {
            let (l, g) = (Histogram::new(good, values.len()), Histogram::new(bad, values.len()));
            best_candidate(&l, &g, candidates, rng, |x| x)
        }
        // A single point (low == high): nothing to choose.
        (_, Some((low, high))) if high.partial_cmp(&low) != Some(Ordering::Greater) => low,
        (_, Some((low, high))) => {
            let (l, g) = (Parzen::new(good, low, high), Parzen::new(bad, low, high));
            // Ints are scored where they will land: on the lattice.
            let snap =
                |x: f64| if matches!(spec, ParamSpec::Int { .. }) { x.round().clamp(0.0, high - 0.5) } else { x };
            best_candidate(&l, &g, candidates, rng, snap)
        }
        (_, None) => return None,
    };
    decode(spec, best)
}

/// A density over model coordinates that can be sampled.
trait Density {
    fn log_pdf(&self, x: f64) -> f64;
    fn draw(&self, rng: &mut impl Rng) -> f64;
}

/// Of `n` candidates drawn from `l` (and snapped), the one with the largest
/// `log l - log g`; the first one on ties.
fn best_candidate<D: Density>(l: &D, g: &D, n: usize, rng: &mut impl Rng, snap: impl Fn(f64) -> f64) -> f64 {
    let mut best = (f64::NEG_INFINITY, f64::NAN);
    for _ in 0..n {
        let x = snap(l.draw(rng));
        let score = l.log_pdf(x) - g.log_pdf(x);
        if best.1.is_nan() || score > best.0 {
            best = (score, x);
        }
    }
    best.1
}

/// A categorical distribution, Optuna's: a mixture of one kernel per
/// observation (its value, plus [`PRIOR_WEIGHT`]` / kernels` on every value,
/// normalised) and a uniform prior kernel of weight [`PRIOR_WEIGHT`]. The
/// smoothing inside each kernel is strong for few observations (the good
/// set) and weak for many (the bad set), so a value the bad observations
/// rarely have keeps a chance.
#[derive(Debug)]
struct Histogram {
    /// Probability of each value; sums to 1.
    p: Vec<f64>,
}

impl Histogram {
    fn new(indices: &[f64], n_values: usize) -> Self {
        let k = n_values.max(1) as f64;
        let n = indices.len() as f64;
        let smoothing = PRIOR_WEIGHT / (n + 1.0);
        // Each observation's kernel: `smoothing` on every value, 1 more on its own.
        let row_total = smoothing * k + 1.0;
        let mut p = vec![(n * smoothing / row_total + PRIOR_WEIGHT / k) / (n + PRIOR_WEIGHT); n_values];
        for &i in indices {
            // Indices come from `encode`, so they are whole and in range.
            if let Some(slot) = p.get_mut(i as usize) {
                *slot += 1.0 / row_total / (n + PRIOR_WEIGHT);
            }
        }
        Histogram { p }
    }
}

impl Density for Histogram {
    fn log_pdf(&self, x: f64) -> f64 {
        self.p.get(x as usize).map_or(f64::NEG_INFINITY, |p| p.ln())
    }

    fn draw(&self, rng: &mut impl Rng) -> f64 {
        let mut u: f64 = rng.random();
        for (i, p) in self.p.iter().enumerate() {
            if u < *p {
                return i as f64;
            }
            u -= p;
        }
        // Rounding left `u` past the last bucket.
        self.p.len().saturating_sub(1) as f64
    }
}

/// A mixture of Gaussians truncated to `[low, high]`, equally weighted but
/// for the prior kernel (the last one).
#[derive(Debug)]
struct Parzen {
    low: f64,
    high: f64,
    mu: Vec<f64>,
    sigma: Vec<f64>,
    /// Per kernel: log(weight / (sigma * sqrt(2 pi) * mass inside the domain)).
    log_coef: Vec<f64>,
    /// Per kernel: cumulative weight, for drawing a kernel.
    cumulative: Vec<f64>,
}

impl Parzen {
    /// Needs `low < high`; `points` lie in `[low, high]`.
    fn new(points: &[f64], low: f64, high: f64) -> Self {
        let width = high - low;
        let mut mu = points.to_vec();
        mu.sort_by(f64::total_cmp);
        let n = mu.len();
        // Each kernel as wide as the larger gap to its neighbours (the domain's
        // ends act as neighbours of a lone point), the outer ones as wide as
        // their only inner gap.
        let mut sigma: Vec<f64> = (0..n)
            .map(|j| {
                let left = if j == 0 { low } else { mu[j - 1] };
                let right = if j + 1 == n { high } else { mu[j + 1] };
                (mu[j] - left).max(right - mu[j])
            })
            .collect();
        if n >= 2 {
            sigma[0] = mu[1] - mu[0];
            sigma[n - 1] = mu[n - 1] - mu[n - 2];
        }
        let kernels = n + 1;
        let min_sigma = width / (1.0 + kernels as f64).min(100.0);
        sigma.iter_mut().for_each(|s| *s = s.clamp(min_sigma, width));
        mu.push(low + width / 2.0);
        sigma.push(width);

        let total = n as f64 + PRIOR_WEIGHT;
        let weight = |j: usize| if j == n { PRIOR_WEIGHT } else { 1.0 } / total;
        let log_coef = (0..kernels)
            .map(|j| {
                let mass = phi((high - mu[j]) / sigma[j]) - phi((low - mu[j]) / sigma[j]);
                weight(j).ln() - sigma[j].ln() - 0.5 * (2.0 * PI).ln() - mass.max(f64::MIN_POSITIVE).ln()
            })
            .collect();
        let cumulative = (0..kernels)
            .scan(0.0, |acc, j| {
                *acc += weight(j);
                Some(*acc)
            })
            .collect();
        Parzen { low, high, mu, sigma, log_coef, cumulative }
    }
}

impl Density for Parzen {
    fn log_pdf(&self, x: f64) -> f64 {
        if !(self.low..=self.high).contains(&x) {
            return f64::NEG_INFINITY;
        }
        let terms = self.mu.iter().zip(&self.sigma).zip(&self.log_coef).map(|((mu, sigma), c)| {
            let z = (x - mu) / sigma;
            c - 0.5 * z * z
        });
        log_sum_exp(terms)
    }

    fn draw(&self, rng: &mut impl Rng) -> f64 {
        let u: f64 = rng.random();
        let j = self.cumulative.partition_point(|c| *c <= u).min(self.mu.len() - 1);
        let (mu, sigma) = (self.mu[j], self.sigma[j]);
        for _ in 0..TRUNCATED_TRIES {
            let x = mu + sigma * standard_normal(rng);
            if (self.low..=self.high).contains(&x) {
                return x;
            }
        }
        mu.clamp(self.low, self.high)
    }
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

/// The standard normal distribution function.
fn phi(z: f64) -> f64 {
    0.5 * erfc(-z / SQRT_2)
}

/// The complementary error function, to a relative error below 1.2e-7
/// (the Chebyshev fit of Numerical Recipes' `erfcc`).
fn erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| acc * t + c);
    let r = t * (-x * x + poly).exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
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

    /// Runs `budget` asks of a TPE on `f`, telling each result; the values in ask order.
    fn run(tpe: &mut Tpe, budget: u64, mut f: impl FnMut(&Params) -> f64) -> Vec<f64> {
        (0..budget)
            .map(|i| {
                let p = tpe.ask(i);
                let v = f(&p);
                tpe.tell(&p, v);
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

    #[test]
    fn defaults_are_optunas() {
        assert_eq!(TpeSettings::default(), TpeSettings { startup: 10, candidates: 24, gamma: 0.1 });
    }

    #[test]
    fn same_seed_and_history_give_the_same_asks() {
        let new = |seed| Tpe::new(bench_space(), Direction::Minimize, seed, TpeSettings::default());
        let (mut a, mut b, mut c) = (new(5), new(5), new(6));
        let asks = |t: &mut Tpe| -> Vec<Params> {
            (0..30)
                .map(|i| {
                    let p = t.ask(i);
                    t.tell(&p, bench(&p));
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
        for p in pa.iter().rev() {
            d.tell(p, bench(p));
        }
        assert_eq!(d.observations(), 30);
        assert_eq!(a.ask(30), d.ask(30));
        assert_eq!(a.ask(30), a.ask(30));
        assert_ne!(a.ask(30), a.ask(31));
    }

    #[test]
    fn non_finite_and_foreign_values_are_ignored_or_left_out() {
        let mut t = Tpe::new(bench_space(), Direction::Minimize, 1, TpeSettings { startup: 0, ..Default::default() });
        let p = t.ask(0);
        t.tell(&p, f64::NAN);
        t.tell(&p, f64::INFINITY);
        assert_eq!(t.observations(), 0);
        // Out of the domain, of the wrong type, or missing: still one observation.
        let mut odd = Params::new();
        odd.insert("x".into(), ParamValue::Float(7.0));
        odd.insert("opt".into(), ParamValue::Text("lbfgs".into()));
        t.tell(&odd, 1.0);
        assert_eq!(t.observations(), 1);
        assert_eq!(t.observed[0].coords, vec![None, None, None]);
        let ask = t.ask(1);
        assert!((-2.0..=2.0).contains(&float(&ask["x"])));
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
    fn parzen_density_integrates_to_one_over_the_domain() {
        for points in [vec![], vec![0.9], vec![0.0, 0.1, 0.15, 1.0], vec![0.5; 7]] {
            let p = Parzen::new(&points, 0.0, 1.0);
            let steps = 20_000;
            let h = 1.0 / steps as f64;
            let integral: f64 = (0..steps).map(|i| p.log_pdf((i as f64 + 0.5) * h).exp() * h).sum();
            assert!((integral - 1.0).abs() < 1e-3, "{points:?}: {integral}");
            assert_eq!(p.log_pdf(1.5), f64::NEG_INFINITY);
        }
        let h = Histogram::new(&[0.0, 0.0, 2.0], 3);
        assert!((h.p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Kernels of the three observations: 1/4 on each value and 1 on their
        // own, over 7/4: [5, 1, 1] / 7 twice and [1, 1, 5] / 7; the prior
        // kernel 1/3 each. Mixed with equal weights:
        let want = [(10.0 / 7.0 + 1.0 / 7.0 + 1.0 / 3.0) / 4.0, (3.0 / 7.0 + 1.0 / 3.0) / 4.0];
        assert!((h.p[0] - want[0]).abs() < 1e-12 && (h.p[1] - want[1]).abs() < 1e-12, "{:?} {want:?}", h.p);
        assert_eq!(Histogram::new(&[], 4).p, vec![0.25; 4]);
    }

    #[test]
    fn erfc_matches_known_values() {
        for (x, want) in
            [(0.0, 1.0), (0.5, 0.479_500_122), (1.0, 0.157_299_207), (-1.0, 1.842_700_793), (3.0, 2.209e-5)]
        {
            assert!((erfc(x) - want).abs() < 1e-7 * want.max(1.0) + 1e-9, "erfc({x}) = {}", erfc(x));
        }
    }

    /// TPE against the best of as many random draws ([`sample`] with ChaCha8
    /// seeded the same), over ten seeds (the table prints with `--nocapture`).
    /// Measured when written: mean best 0.156 (TPE) vs 0.322 (random), TPE
    /// better in 9 of 10; over seeds 100..200 as a check that 0..10 is not a
    /// lucky pick, 0.109 vs 0.459 and 89 of 100.
    #[test]
    fn tpe_beats_random_search() {
        let budget = 60;
        let mut wins = 0;
        let (mut tpe_total, mut random_total) = (0.0, 0.0);
        for seed in 0..10 {
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
        println!("mean: tpe {:.5} random {:.5}; tpe better in {wins}/10", tpe_total / 10.0, random_total / 10.0);
        assert!(tpe_total < random_total, "mean best: tpe {} random {}", tpe_total / 10.0, random_total / 10.0);
        assert!(wins >= 7, "tpe better in only {wins} of 10 seeds");
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
