//! How a Gaussian-process ask accounts for the trials still running (a
//! fleet's parallel asks): each rule turns the model of the told
//! trials and the configurations in flight into a score whose maximum is
//! the next configuration, spread away from what already runs.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::cube::{Axis, Cube, Theta};
use super::model::{log_ei_of, Model};
use super::score::Rule;
use super::settings::BatchRule;
use crate::linalg::{cholesky, solve_lower, solve_upper_t};
use crate::tpe::standard_normal;

/// Random Fourier features of a [`BatchRule::Pathwise`] prior draw.
const FEATURES: usize = 512;
/// Fantasies averaged by [`BatchRule::Fantasy`].
const FANTASIES: usize = 4;
/// Random candidates a Thompson sample is drawn over (the local ones come
/// on top, every second of them): a joint sample is cubic in their number.
const THOMPSON_RANDOM: usize = 128;
/// Width of the confidence bound of [`BatchRule::Ucb`], in deviations: one
/// (BENCHMARKS.md measured 0.5, 1, 1.5 and 2 at 4 and 16 in flight; the believer
/// already spreads the asks, and a wider bound spends them on exploring).
const UCB_WIDTH: f64 = 1.0;
/// Joint draws of the running trials' results averaged by [`BatchRule::QEi`]
/// (half of them the others negated).
const QEI_DRAWS: usize = 128;
/// Width of [`BatchRule::UcbPending`]'s bound with none in flight, in
/// deviations: the confidence bound's width when it was measured.
const PENDING_BASE: f64 = 2.0;

/// An ask with trials in flight.
pub(super) struct Pending<'a> {
    pub cube: &'a Cube,
    /// The model of the told trials alone.
    pub model: &'a Model,
    /// The incumbent: the best posterior mean at a told configuration ...
    pub best: f64,
    /// ... and that configuration.
    pub incumbent: &'a [f64],
    /// The told values, standardised.
    pub y: &'a [f64],
    /// Unit coordinates of the running trials (at least one).
    pub pending: Vec<Vec<f64>>,
    /// The told values, standardised, in id order ([`BatchRule::Trust`]'s
    /// region is replayed from them; empty for the other rules).
    pub history: &'a [f64],
}

impl Pending<'_> {
    /// The next configuration under `rule`, from `candidates`.
    pub fn choose(&self, rule: BatchRule, candidates: Vec<Vec<f64>>, rng: &mut ChaCha8Rng) -> Option<Vec<f64>> {
        let cube = self.cube;
        match rule {
            BatchRule::Believer | BatchRule::Ucb | BatchRule::UcbPending => {
                let model = self.believed();
                let score = match rule {
                    BatchRule::Ucb => Rule::Ucb { width: UCB_WIDTH },
                    BatchRule::UcbPending => Rule::Ucb { width: pending_width(self.pending.len()) },
                    _ => Rule::Ei { best: self.best },
                };
                cube.maximise_posterior(&model, score, candidates, self.incumbent)
            }
            BatchRule::LiarMax | BatchRule::LiarMean => {
                let n = self.y.len().max(1) as f64;
                let lie = match rule {
                    BatchRule::LiarMax => self.y.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    _ => self.y.iter().sum::<f64>() / n,
                };
                let model = self.with_pending(&vec![lie; self.pending.len()]).unwrap_or_else(|| self.model.clone());
                self.expected(&model, candidates)
            }
            BatchRule::Fantasy => {
                let draws = self.joint_draws(&self.pending, FANTASIES, rng)?;
                let models: Vec<(Model, f64)> = draws
                    .iter()
                    .filter_map(|f| {
                        let best = f.iter().copied().fold(self.best, f64::min);
                        Some((self.with_pending(f)?, best))
                    })
                    .collect();
                if models.is_empty() {
                    return self.expected(self.model, candidates);
                }
                let k = (models.len() as f64).ln();
                cube.maximise(self.model, candidates, Some(self.incumbent), &|us| {
                    let each: Vec<Vec<f64>> = models.iter().map(|(m, b)| cube.log_ei(m, *b, us)).collect();
                    (0..us.len()).map(|j| log_sum_exp(&each.iter().map(|e| e[j]).collect::<Vec<f64>>()) - k).collect()
                })
            }
            BatchRule::Penalise => {
                let lipschitz = self.lipschitz(&candidates);
                let balls: Vec<(Vec<f64>, f64, f64)> = self
                    .pending
                    .iter()
                    .map(|u| {
                        let (mu, var) = self.model.predict(cube, u);
                        (u.clone(), mu, (var + self.model.theta.noise).sqrt())
                    })
                    .collect();
                cube.maximise(self.model, candidates, Some(self.incumbent), &|us| {
                    let ei = cube.log_ei(self.model, self.best, us);
                    us.iter()
                        .zip(ei)
                        .map(|(u, ei)| {
                            let penalty: f64 = balls
                                .iter()
                                .map(|(c, mu, sd)| {
                                    log_normal_cdf((lipschitz * cube.unit_distance(u, c) + self.best - mu) / sd)
                                })
                                .sum();
                            ei + penalty
                        })
                        .collect()
                })
            }
            BatchRule::Trust => self.trust(candidates),
            BatchRule::Pathwise => self.pathwise(candidates, rng),
            BatchRule::QEi => match Joint::draw(self, rng) {
                Some(joint) => {
                    cube.maximise(self.model, candidates, Some(self.incumbent), &|us| joint.scores(self, us))
                }
                None => cube.maximise_posterior(
                    &self.believed(),
                    Rule::Ucb { width: UCB_WIDTH },
                    candidates,
                    self.incumbent,
                ),
            },
            BatchRule::Thompson => {
                let model = self.believed();
                let random = cube.settings.candidates.max(1).min(candidates.len());
                let points: Vec<Vec<f64>> = candidates
                    .iter()
                    .take(random.min(THOMPSON_RANDOM))
                    .chain(candidates[random..].iter().step_by(2))
                    .cloned()
                    .collect();
                let pending = Pending { model: &model, ..self.shallow() };
                match pending.joint_draws(&points, 1, rng).and_then(|d| d.into_iter().next()) {
                    Some(draw) => {
                        let at = (0..points.len()).min_by(|&a, &b| draw[a].total_cmp(&draw[b]))?;
                        points.into_iter().nth(at)
                    }
                    None => self.expected(&model, candidates),
                }
            }
        }
    }

    /// The candidate of highest expected improvement of `model` over the
    /// incumbent.
    fn expected(&self, model: &Model, candidates: Vec<Vec<f64>>) -> Option<Vec<f64>> {
        self.cube.maximise_posterior(model, Rule::Ei { best: self.best }, candidates, self.incumbent)
    }

    /// [`BatchRule::Trust`]'s ask: the believer's bound over the candidates
    /// moved into the region, nothing outside it.
    fn trust(&self, candidates: Vec<Vec<f64>>) -> Option<Vec<f64>> {
        let cube = self.cube;
        let model = self.believed();
        let numeric: Vec<usize> = cube.numeric_axes().collect();
        let side = trust_side(self.history, cube.settings.startup, self.pending.len() + 1, numeric.len());
        let length = &self.model.theta.length;
        let mean_log = numeric.iter().map(|&d| length[d].max(1e-12).ln()).sum::<f64>() / numeric.len().max(1) as f64;
        let mut lo = vec![0.0; self.incumbent.len()];
        let mut hi = vec![1.0; self.incumbent.len()];
        for &d in &numeric {
            let step = match cube.axes[d] {
                Axis::Numeric { lattice, .. } if lattice > 0.0 => 1.0 / lattice,
                _ => 0.0,
            };
            let half = (0.5 * side * (length[d].max(1e-12).ln() - mean_log).exp()).max(step);
            lo[d] = (self.incumbent[d] - half).max(0.0);
            hi[d] = (self.incumbent[d] + half).min(1.0);
        }
        let random = cube.settings.candidates.max(1).min(candidates.len());
        let inside: Vec<Vec<f64>> = candidates
            .into_iter()
            .enumerate()
            .map(|(i, mut u)| {
                for &d in &numeric {
                    u[d] = if i < random { lo[d] + u[d] * (hi[d] - lo[d]) } else { u[d].clamp(lo[d], hi[d]) };
                }
                cube.snap(u)
            })
            .collect();
        let within = |u: &[f64]| numeric.iter().all(|&d| u[d] >= lo[d] - 1e-12 && u[d] <= hi[d] + 1e-12);
        let rule = Rule::Ucb { width: UCB_WIDTH };
        cube.maximise(&model, inside, Some(self.incumbent), &|us| {
            model
                .predict_many(cube, us)
                .into_iter()
                .zip(us)
                .map(|((mu, var), u)| if within(u) { rule.score(mu, var) } else { f64::NEG_INFINITY })
                .collect()
        })
    }

    /// [`BatchRule::Pathwise`]'s ask: the minimum of one sample path of the
    /// believer's model.
    fn pathwise(&self, candidates: Vec<Vec<f64>>, rng: &mut ChaCha8Rng) -> Option<Vec<f64>> {
        let cube = self.cube;
        let model = self.believed();
        let path = Path::draw(cube, &model, rng)?;
        cube.maximise(&model, candidates, Some(self.incumbent), &|us| {
            us.iter().map(|u| -path.at(cube, &model, u)).collect()
        })
    }

    fn shallow(&self) -> Pending<'_> {
        Pending {
            cube: self.cube,
            model: self.model,
            best: self.best,
            incumbent: self.incumbent,
            y: self.y,
            pending: Vec::new(),
            history: self.history,
        }
    }

    /// The kriging believer's model: the running trials told their
    /// posterior means (the told trials' model where that cannot factor).
    pub(super) fn believed(&self) -> Model {
        let lies: Vec<f64> = self.pending.iter().map(|u| self.model.predict(self.cube, u).0).collect();
        self.with_pending(&lies).unwrap_or_else(|| self.model.clone())
    }

    /// The model of the told trials and the running ones with `values`.
    fn with_pending(&self, values: &[f64]) -> Option<Model> {
        let model = self.model;
        let mut xs = model.x.clone();
        xs.extend(self.pending.iter().cloned());
        let mut ys = model.y.clone();
        ys.extend_from_slice(values);
        self.cube.model(xs, &ys, &model.theta, Some(model))
    }

    /// `count` joint draws of the posterior (latent, plus the noise) at
    /// `points`; `None` when their covariance is not positive definite
    /// even with some jitter.
    fn joint_draws(&self, points: &[Vec<f64>], count: usize, rng: &mut ChaCha8Rng) -> Option<Vec<Vec<f64>>> {
        let model = self.model;
        let m = points.len();
        let (mean, _, cov) = joint_posterior(self.cube, model, points);
        let l = jittered_cholesky(&cov, m, model.theta.noise.max(1e-8 * model.theta.signal), 4)?;
        Some(
            (0..count)
                .map(|_| {
                    let z: Vec<f64> = (0..m).map(|_| standard_normal(rng)).collect();
                    correlated(&mean, &l, &z)
                })
                .collect(),
        )
    }

    /// The largest slope of the model's mean over the first candidates
    /// (finite differences along the numeric axes), at least a small floor.
    fn lipschitz(&self, candidates: &[Vec<f64>]) -> f64 {
        let (cube, model) = (self.cube, self.model);
        let h = 1e-4;
        let mut most: f64 = 1e-7;
        for u in candidates.iter().take(200) {
            let mu = model.predict_mean(cube, u);
            let mut g2 = 0.0;
            for d in cube.numeric_axes() {
                let mut v = u.clone();
                v[d] = if u[d] + h <= 1.0 { u[d] + h } else { u[d] - h };
                let slope = (model.predict_mean(cube, &v) - mu) / (v[d] - u[d]);
                g2 += slope * slope;
            }
            most = most.max(g2.sqrt());
        }
        most
    }
}

/// [`BatchRule::QEi`]'s joint draws of the running trials' latent values, and
/// what each candidate's value is given them.
pub(super) struct Joint {
    /// `L^-1 k(X, p)` for each running trial `p`, point-major (`n` a trial).
    solved: Vec<f64>,
    /// The factor of the running trials' posterior covariance.
    chol: Vec<f64>,
    /// Standard normal draws, `p` a draw: a draw of the running trials'
    /// values is their posterior mean plus `chol` times it.
    z: Vec<Vec<f64>>,
    /// Each draw's best: the incumbent's mean or a running trial's drawn
    /// value, the lower.
    best: Vec<f64>,
}

impl Joint {
    /// The draws of `at`'s running trials; `None` when their posterior
    /// covariance cannot be factored even with some jitter.
    pub(super) fn draw(at: &Pending<'_>, rng: &mut ChaCha8Rng) -> Option<Joint> {
        let model = at.model;
        let p = at.pending.len();
        let (mean, solved, cov) = joint_posterior(at.cube, model, &at.pending);
        let solved = solved.concat();
        // Up to a tenth of the signal: 1e-9, 1e-7, ... 1e-1 of it.
        let chol = jittered_cholesky(&cov, p, 1e-9 * model.theta.signal, 5)?;
        let mut z: Vec<Vec<f64>> = Vec::with_capacity(QEI_DRAWS);
        for _ in 0..QEI_DRAWS / 2 {
            let d: Vec<f64> = (0..p).map(|_| standard_normal(rng)).collect();
            z.push(d.iter().map(|v| -v).collect());
            z.push(d);
        }
        let best = z.iter().map(|d| correlated(&mean, &chol, d).into_iter().fold(at.best, f64::min)).collect();
        Some(Joint { solved, chol, z, best })
    }

    /// The log of the batch's expected improvement with each of `us` added.
    pub(super) fn scores(&self, at: &Pending<'_>, us: &[Vec<f64>]) -> Vec<f64> {
        let (cube, model) = (at.cube, at.model);
        let (n, m, p) = (model.x.len(), us.len(), at.pending.len());
        let (k, mean) = model.solved_many(cube, us);
        let ln_draws = (self.z.len() as f64).ln();
        let mut each = vec![0.0; self.z.len()];
        (0..m)
            .map(|j| {
                let column = |r: usize| k[r * m + j];
                let var = (model.theta.signal - (0..n).map(|r| column(r) * column(r)).sum::<f64>()).max(1e-12);
                let c: Vec<f64> = (0..p)
                    .map(|i| {
                        let solved = &self.solved[i * n..(i + 1) * n];
                        cube.kernel(&us[j], &at.pending[i], &model.theta)
                            - (0..n).map(|r| column(r) * solved[r]).sum::<f64>()
                    })
                    .collect();
                let a = solve_lower(&self.chol, p, &c);
                let given = (var - a.iter().map(|v| v * v).sum::<f64>()).max(1e-12);
                for ((e, d), best) in each.iter_mut().zip(&self.z).zip(&self.best) {
                    let shift: f64 = a.iter().zip(d).map(|(x, y)| x * y).sum();
                    *e = log_ei_of(*best, mean[j] + shift, given);
                }
                log_sum_exp(&each) - ln_draws
            })
            .collect()
    }
}

/// The Cholesky factor of the `m` by `m` covariance `cov` with `jitter` on
/// its diagonal, the jitter a hundred times larger after each failure, at
/// most `tries` times; `None` when none factors.
fn jittered_cholesky(cov: &[f64], m: usize, mut jitter: f64, tries: usize) -> Option<Vec<f64>> {
    for _ in 0..tries {
        let mut with = cov.to_vec();
        for i in 0..m {
            with[i * m + i] += jitter;
        }
        if let Some(l) = cholesky(&with, m) {
            return Some(l);
        }
        jitter *= 100.0;
    }
    None
}

/// `mean + l z`, `l` lower triangular (`m` by `m`, row-major): a joint
/// draw from standard normal `z`.
fn correlated(mean: &[f64], l: &[f64], z: &[f64]) -> Vec<f64> {
    let m = mean.len();
    (0..m).map(|i| mean[i] + (0..=i).map(|k| l[i * m + k] * z[k]).sum::<f64>()).collect()
}

/// `model`'s posterior jointly at `points`: the means, each point's kernel
/// column solved against the factor (`L^-1 k(X, u)`), and the covariance
/// (row-major).
fn joint_posterior(cube: &Cube, model: &Model, points: &[Vec<f64>]) -> (Vec<f64>, Vec<Vec<f64>>, Vec<f64>) {
    let n = model.x.len();
    let m = points.len();
    let mut mean = Vec::with_capacity(m);
    let mut v = Vec::with_capacity(m);
    for u in points {
        let k: Vec<f64> = model.x.iter().map(|x| cube.kernel(x, u, &model.theta)).collect();
        mean.push(k.iter().zip(&model.alpha).map(|(a, b)| a * b).sum::<f64>());
        v.push(solve_lower(&model.chol, n, &k));
    }
    let mut cov = vec![0.0; m * m];
    for a in 0..m {
        for b in 0..=a {
            let c = cube.kernel(&points[a], &points[b], &model.theta)
                - v[a].iter().zip(&v[b]).map(|(p, q)| p * q).sum::<f64>();
            cov[a * m + b] = c;
            cov[b * m + a] = c;
        }
    }
    (mean, v, cov)
}

/// The width of [`BatchRule::UcbPending`]'s bound with `pending` trials in
/// flight: [`PENDING_BASE`] times `sqrt(1 + ln(1 + pending))`, so 2 with
/// none, 1.55 times that with 3 (4 in flight), 1.94 times with 15 (16 in
/// flight): the deviation's factor grows as the square root of a
/// logarithm, as GP-UCB's does in the number of evaluations.
pub(super) fn pending_width(pending: usize) -> f64 {
    PENDING_BASE * (1.0 + (pending as f64).ln_1p()).sqrt()
}

/// One sample path of a model's posterior ([`BatchRule::Pathwise`]): a
/// prior draw `phi(u) . w` from random Fourier features and the update
/// `k(u, X) v` that conditions it on the model's points.
pub(super) struct Path {
    /// Frequencies in the embedding space, one row a feature.
    omega: Vec<Vec<f64>>,
    phase: Vec<f64>,
    /// The features' weights, times the features' scale.
    weight: Vec<f64>,
    /// `(K + noise)^-1 (y - prior(X) - e)`.
    update: Vec<f64>,
}

impl Path {
    /// A draw for `model`; `None` when its kernel has no usable scale.
    pub(super) fn draw(cube: &Cube, model: &Model, rng: &mut ChaCha8Rng) -> Option<Path> {
        let theta = &model.theta;
        let dims = embed(cube, theta, &model.x.first()?.clone()).len();
        // Matérn 5/2's spectral density: a Student t with 5 degrees of
        // freedom over the length-scaled coordinates.
        let omega: Vec<Vec<f64>> = (0..FEATURES)
            .map(|_| {
                let chi2: f64 = (0..5).map(|_| standard_normal(rng).powi(2)).sum();
                let scale = (5.0 / chi2.max(1e-12)).sqrt();
                (0..dims).map(|_| standard_normal(rng) * scale).collect()
            })
            .collect();
        let phase: Vec<f64> = (0..FEATURES).map(|_| rng.random::<f64>() * 2.0 * std::f64::consts::PI).collect();
        let amplitude = (2.0 * theta.signal / FEATURES as f64).sqrt();
        if !amplitude.is_finite() {
            return None;
        }
        let weight: Vec<f64> = (0..FEATURES).map(|_| amplitude * standard_normal(rng)).collect();
        let mut path = Path { omega, phase, weight, update: Vec::new() };
        let n = model.x.len();
        let noise = (theta.noise + 1e-9).sqrt();
        let rhs: Vec<f64> = model
            .x
            .iter()
            .zip(&model.y)
            .map(|(x, y)| y - path.prior(&embed(cube, theta, x)) - noise * standard_normal(rng))
            .collect();
        path.update = solve_upper_t(&model.chol, n, &solve_lower(&model.chol, n, &rhs));
        Some(path)
    }

    fn prior(&self, e: &[f64]) -> f64 {
        self.omega
            .iter()
            .zip(&self.phase)
            .zip(&self.weight)
            .map(|((w, b), a)| a * (w.iter().zip(e).map(|(p, q)| p * q).sum::<f64>() + b).cos())
            .sum()
    }

    /// The path's value at `u`.
    pub(super) fn at(&self, cube: &Cube, model: &Model, u: &[f64]) -> f64 {
        let mut row = Vec::with_capacity(model.x.len());
        cube.kernel_row(&model.columns, model.x.len(), u, &model.theta, &mut row);
        self.prior(&embed(cube, &model.theta, u)) + row.iter().zip(&self.update).map(|(k, v)| k * v).sum::<f64>()
    }
}

/// `u` where the kernel is a Matérn of the Euclidean distance: a numeric
/// coordinate over its length scale, a categorical one one-hot over its
/// length scale times the root of two (two one-hot vectors that differ are
/// the root of two apart).
fn embed(cube: &Cube, theta: &Theta, u: &[f64]) -> Vec<f64> {
    let mut e = Vec::with_capacity(u.len());
    for (d, axis) in cube.axes.iter().enumerate() {
        match *axis {
            Axis::Numeric { .. } => e.push(u[d] / theta.length[d]),
            Axis::Categorical { values, .. } => {
                let scale = 1.0 / (theta.length[d] * std::f64::consts::SQRT_2);
                e.extend((0..values).map(|v| if v as f64 == u[d] { scale } else { 0.0 }));
            }
        }
    }
    e
}

/// The side of [`BatchRule::Trust`]'s region (unit cube: 1 is a side as long
/// as the cube's), replayed from the told values in id order after the
/// `startup` ones, `q` at a time: 0.8 at first, doubled (to at most 1.6)
/// after three batches in a row that improve on the best by a thousandth
/// of a deviation, halved after `ceil(max(4, d) / q)` in a row that do
/// not, and back to 0.8 below 0.5^7.
pub(super) fn trust_side(history: &[f64], startup: usize, q: usize, d: usize) -> f64 {
    const FIRST: f64 = 0.8;
    let q = q.max(1);
    let fail_after = (4.max(d)).div_ceil(q).max(1);
    let (mut side, mut wins, mut losses) = (FIRST, 0, 0);
    let start = startup.min(history.len());
    let mut best = history[..start].iter().copied().fold(f64::INFINITY, f64::min);
    for batch in history[start..].chunks(q) {
        let low = batch.iter().copied().fold(f64::INFINITY, f64::min);
        if low < best - 1e-3 {
            wins += 1;
            losses = 0;
        } else {
            losses += 1;
            wins = 0;
        }
        best = best.min(low);
        if wins == 3 {
            side = (2.0 * side).min(1.6);
            wins = 0;
        } else if losses == fail_after {
            side /= 2.0;
            losses = 0;
        }
        if side < 0.5f64.powi(7) {
            side = FIRST;
        }
    }
    side
}

/// `ln sum exp` of finite or minus-infinite values.
fn log_sum_exp(v: &[f64]) -> f64 {
    let top = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if top == f64::NEG_INFINITY {
        return top;
    }
    top + v.iter().map(|x| (x - top).exp()).sum::<f64>().ln()
}

/// `ln Phi(z)`, with its asymptote far in the left tail.
pub(super) fn log_normal_cdf(z: f64) -> f64 {
    if z > -37.0 {
        (0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)).ln()
    } else {
        // Phi(z) ~ phi(z) / -z.
        -0.5 * z * z - 0.5 * (2.0 * std::f64::consts::PI).ln() - (-z).ln()
    }
}
