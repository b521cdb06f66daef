//! The fitted Gaussian process of [`super::Gp`]: its points, factor and
//! hyper-parameters, what it predicts, and the expected improvement.

use super::{Gp, Paths};
use crate::linalg::{cholesky_from, cholesky_plain, solve_lower, solve_lower_many, solve_lower_many_plain};
use std::f64::consts::{PI, SQRT_2};

/// A fitted process.
#[derive(Debug, Clone)]
pub(super) struct Model {
    pub(super) x: Vec<Vec<f64>>,
    /// `x` axis by axis, scaled ([`Gp::columns`]), for [`Gp::kernel_row`].
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

#[derive(Debug, Clone)]
pub(super) struct Theta {
    pub(super) length: Vec<f64>,
    pub(super) signal: f64,
    pub(super) noise: f64,
}

impl Theta {
    /// The same values, bit for bit (a kernel matrix of the same points is).
    pub(super) fn same_as(&self, other: &Theta) -> bool {
        let bits = |t: &Theta| t.length.iter().chain([&t.signal, &t.noise]).map(|v| v.to_bits()).collect::<Vec<u64>>();
        bits(self) == bits(other)
    }
}

impl Model {
    /// Posterior mean and variance at each of `us`: the kernel columns of
    /// all of them solved at once (row by row, each a contiguous update).
    pub(super) fn predict_many(&self, gp: &Gp, us: &[Vec<f64>]) -> Vec<(f64, f64)> {
        let m = us.len();
        let (k, mean) = self.solved_many(gp, us);
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
    pub(super) fn solved_many(&self, gp: &Gp, us: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
        let (n, m) = (self.x.len(), us.len());
        let mut k = vec![0.0; n * m];
        for (i, x) in self.x.iter().enumerate() {
            for (j, u) in us.iter().enumerate() {
                k[i * m + j] = gp.kernel(x, u, &self.theta);
            }
        }
        let mut mean = vec![0.0; m];
        for (i, a) in self.alpha.iter().enumerate() {
            for (mu, kij) in mean.iter_mut().zip(&k[i * m..(i + 1) * m]) {
                *mu += a * kij;
            }
        }
        if gp.settings.paths == Paths::Plain {
            solve_lower_many_plain(&self.chol, n, &mut k, m);
        } else {
            solve_lower_many(&self.chol, n, &mut k, m);
        }
        (k, mean)
    }

    /// [`Model::predict_mean`] at each of its own points, from its kernel
    /// matrix instead of the kernel again (the kernel is symmetric bit for
    /// bit, and the diagonal's noise is left out: the same values).
    pub(super) fn told_means(&self, gp: &Gp) -> Vec<f64> {
        let n = self.x.len();
        let k = |i: usize, j: usize| match i.cmp(&j) {
            std::cmp::Ordering::Equal => gp.kernel(&self.x[i], &self.x[i], &self.theta),
            std::cmp::Ordering::Greater => self.kernel[i * n + j],
            std::cmp::Ordering::Less => self.kernel[j * n + i],
        };
        (0..n).map(|i| self.alpha.iter().enumerate().map(|(j, a)| k(i, j) * a).sum::<f64>()).collect()
    }

    /// Posterior mean at `u`.
    pub(super) fn predict_mean(&self, gp: &Gp, u: &[f64]) -> f64 {
        self.x.iter().zip(&self.alpha).map(|(x, a)| gp.kernel(x, u, &self.theta) * a).sum()
    }

    /// Posterior mean and variance (of the latent function) at `u`.
    pub(super) fn predict(&self, gp: &Gp, u: &[f64]) -> (f64, f64) {
        let n = self.x.len();
        let k: Vec<f64> = self.x.iter().map(|x| gp.kernel(x, u, &self.theta)).collect();
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
