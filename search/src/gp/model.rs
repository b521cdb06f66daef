//! The fitted Gaussian process of [`super::Gp`]: its points, factor and
//! hyper-parameters, what it predicts, and the expected improvement.

use super::cube::{Cube, Theta};
use super::settings::Paths;
use crate::linalg::{
    cholesky_from, cholesky_plain, nelder_mead, solve_lower, solve_lower_many, solve_lower_many_plain, solve_upper_t,
};
use std::f64::consts::{PI, SQRT_2};

/// A fitted process.
#[derive(Debug, Clone)]
pub(super) struct Model {
    pub(super) x: Vec<Vec<f64>>,
    /// `x` axis by axis, scaled ([`Cube::columns`]), for [`Cube::kernel_row`].
    pub(super) columns: Vec<Vec<f64>>,
    /// The standardised values it was conditioned on.
    pub(super) y: Vec<f64>,
    /// The lower triangle of the kernel matrix over `x` (row-major, the
    /// noise on its diagonal), which `chol` factors.
    pub(super) kernel: Vec<f64>,
    pub(super) chol: Vec<f64>,
    pub(super) alpha: Vec<f64>,
    pub(super) theta: Theta,
}

impl Model {
    /// Posterior mean and variance at each of `us`: the kernel columns of
    /// all of them solved at once (row by row, each a contiguous update).
    pub(super) fn predict_many(&self, cube: &Cube, us: &[Vec<f64>]) -> Vec<(f64, f64)> {
        let m = us.len();
        let (k, mean) = self.solved_many(cube, us);
        let mut explained = vec![0.0; m];
        for row in k.chunks(m.max(1)) {
            for (e, v) in explained.iter_mut().zip(row) {
                *e += v * v;
            }
        }
        mean.into_iter().zip(explained).map(|(mu, e)| (mu, (self.theta.signal - e).max(1e-12))).collect()
    }

    /// The kernel columns of `us` solved against the factor (`L^-1 k(X,
    /// u)`, row-major: row `i` a model point, column `j` a point of `us`)
    /// and the posterior means at `us`.
    pub(super) fn solved_many(&self, cube: &Cube, us: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
        let (n, m) = (self.x.len(), us.len());
        let mut k = vec![0.0; n * m];
        for (i, x) in self.x.iter().enumerate() {
            for (j, u) in us.iter().enumerate() {
                k[i * m + j] = cube.kernel(x, u, &self.theta);
            }
        }
        let mut mean = vec![0.0; m];
        for (i, a) in self.alpha.iter().enumerate() {
            for (mu, kij) in mean.iter_mut().zip(&k[i * m..(i + 1) * m]) {
                *mu += a * kij;
            }
        }
        if cube.settings.paths == Paths::Plain {
            solve_lower_many_plain(&self.chol, n, &mut k, m);
        } else {
            solve_lower_many(&self.chol, n, &mut k, m);
        }
        (k, mean)
    }

    /// [`Model::predict_mean`] at each of its own points, from its kernel
    /// matrix instead of the kernel again (the kernel is symmetric bit for
    /// bit, and the diagonal's noise is left out: the same values).
    pub(super) fn told_means(&self, cube: &Cube) -> Vec<f64> {
        let n = self.x.len();
        let k = |i: usize, j: usize| match i.cmp(&j) {
            std::cmp::Ordering::Equal => cube.kernel(&self.x[i], &self.x[i], &self.theta),
            std::cmp::Ordering::Greater => self.kernel[i * n + j],
            std::cmp::Ordering::Less => self.kernel[j * n + i],
        };
        (0..n).map(|i| self.alpha.iter().enumerate().map(|(j, a)| k(i, j) * a).sum::<f64>()).collect()
    }

    /// Posterior mean at `u`.
    pub(super) fn predict_mean(&self, cube: &Cube, u: &[f64]) -> f64 {
        self.x.iter().zip(&self.alpha).map(|(x, a)| cube.kernel(x, u, &self.theta) * a).sum()
    }

    /// Posterior mean and variance (of the latent function) at `u`.
    pub(super) fn predict(&self, cube: &Cube, u: &[f64]) -> (f64, f64) {
        let n = self.x.len();
        let k: Vec<f64> = self.x.iter().map(|x| cube.kernel(x, u, &self.theta)).collect();
        let mean: f64 = k.iter().zip(&self.alpha).map(|(a, b)| a * b).sum();
        let v = solve_lower(&self.chol, n, &k);
        let var = (self.theta.signal - v.iter().map(|x| x * x).sum::<f64>()).max(1e-12);
        (mean, var)
    }
}

/// [`cholesky_from`]; with [`Paths::Plain`], the plain factorisation:
/// every row, one at a time, whatever is known.
pub(super) fn factorise(k: &[f64], n: usize, known: &[f64], stride: usize, p: usize, paths: Paths) -> Option<Vec<f64>> {
    if paths == Paths::Plain {
        let full: Vec<f64> = (0..n * n).map(|c| if c % n <= c / n { k[c] } else { k[(c % n) * n + c / n] }).collect();
        return cholesky_plain(&full, n);
    }
    cholesky_from(k, n, known, stride, p)
}

/// How many of `n` told trials the hyper-parameters are fitted on: all up
/// to `from`, then the last point of the sequence `from`, then a tenth more
/// than the one before each (30, 33, 36, 39, 42, 46...) not above `n`.
pub(super) fn fit_point(n: usize, from: usize) -> usize {
    if n <= from {
        return n;
    }
    let mut m = from.max(1);
    loop {
        let next = m + (m / 10).max(1);
        if next > n {
            return m;
        }
        m = next;
    }
}

/// The log expected improvement over `best` of a posterior of mean `mu` and
/// variance `var` (minus infinity where it cannot be computed).
pub(super) fn log_ei_of(best: f64, mu: f64, var: f64) -> f64 {
    let sd = var.sqrt();
    let s = log_expected_improvement((best - mu) / sd) + sd.ln();
    if s.is_nan() {
        f64::NEG_INFINITY
    } else {
        s
    }
}

/// `ln(z Phi(z) + phi(z))`: the log of the expected improvement of a unit
/// Gaussian over `z` deviations, accurate far into the left tail.
pub(super) fn log_expected_improvement(z: f64) -> f64 {
    let log_phi = -0.5 * z * z - 0.5 * (2.0 * PI).ln();
    if z > -1.0 {
        (z * 0.5 * libm::erfc(-z / SQRT_2) + log_phi.exp()).ln()
    } else if z > -37.0 {
        // phi(z) (1 - t R(t)), t = -z, R = Phi(-t) / phi(t) (Mills' ratio).
        let t = -z;
        let ratio = t * (0.5 * libm::erfc(t / SQRT_2)).ln().exp() / log_phi.exp();
        log_phi + (1.0 - ratio).max(f64::MIN_POSITIVE).ln()
    } else {
        log_phi - 2.0 * (-z).ln()
    }
}

/// Bounds of the hyper-parameters, in natural log: length scales, signal
/// variance, noise variance (the values are standardised).
const LOG_LENGTH: (f64, f64) = (-4.6, 3.0);
const LOG_SIGNAL: (f64, f64) = (-4.6, 4.6);
const LOG_NOISE: (f64, f64) = (-16.0, 0.0);

impl Cube {
    /// The log expected improvement over `best` of `model` at each of `us`
    /// (minus infinity where it cannot be computed).
    pub(super) fn log_ei(&self, model: &Model, best: f64, us: &[Vec<f64>]) -> Vec<f64> {
        model.predict_many(self, us).into_iter().map(|(mu, var)| log_ei_of(best, mu, var)).collect()
    }

    /// The process conditioned on `x`, `y`. `known`: a model with the same
    /// hyper-parameters whose points `x` begins with, as far as they agree
    /// (the last ask's, or the told trials' when the running ones are added):
    /// the factor's rows of those points are its own (bit for bit what a
    /// full factorisation gives, [`cholesky_from`]), and only the rows of
    /// the others are computed, `O(n^2)` each.
    pub(super) fn model(&self, x: Vec<Vec<f64>>, y: &[f64], theta: &Theta, known: Option<&Model>) -> Option<Model> {
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
    pub(super) fn factor(&self, x: &[Vec<f64>], y: &[f64], theta: &Theta) -> Option<(Vec<f64>, Vec<f64>)> {
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
    pub(super) fn fit(&self, x: &[Vec<f64>], y: &[f64]) -> Theta {
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
