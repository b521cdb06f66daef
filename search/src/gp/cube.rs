//! The unit cube a [`super::Gp`] models a space in: one axis a searched
//! parameter, the Matérn 5/2 kernel over it, and the moves an ask's
//! refinement takes along its axes.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::settings::GpSettings;
use crate::linalg::exp_neg;

/// The axes of a space and the settings an ask takes on them.
#[derive(Debug, Clone)]
pub(super) struct Cube {
    pub(super) axes: Vec<Axis>,
    pub(super) settings: GpSettings,
}

/// One axis of the unit cube.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Axis {
    /// `index` into the space; the model coordinate `e` of [`encode`] maps
    /// to `(e - lo) / (hi - lo)`; `lattice`: the largest lattice index of an
    /// int (values are rounded to it), 0 for floats.
    Numeric { index: usize, lo: f64, hi: f64, lattice: f64 },
    /// `index` into the space; the coordinate is the value's index.
    Categorical { index: usize, values: usize },
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

impl Cube {
    pub(super) fn random_coordinate(&self, axis: &Axis, rng: &mut ChaCha8Rng) -> f64 {
        match axis {
            Axis::Numeric { .. } => rng.random(),
            Axis::Categorical { values, .. } => rng.random_range(0..(*values).max(1)) as f64,
        }
    }

    /// Ints rounded to their lattice.
    pub(super) fn snap(&self, mut u: Vec<f64>) -> Vec<f64> {
        for (v, a) in u.iter_mut().zip(&self.axes) {
            if let Axis::Numeric { lattice, .. } = a {
                if *lattice > 0.0 {
                    *v = (*v * lattice).round() / lattice;
                }
            }
        }
        u
    }

    /// The points a refinement step from `u` along axis `d` scores: a step
    /// of `step` either way on a numeric axis (at least one lattice step of
    /// an int), every value of a categorical.
    pub(super) fn tries(&self, u: &[f64], d: usize, step: f64) -> Vec<Vec<f64>> {
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

    /// Euclidean distance in unit coordinates (a categorical axis counts 1
    /// when the values differ).
    pub(super) fn unit_distance(&self, a: &[f64], b: &[f64]) -> f64 {
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
    pub(super) fn columns(&self, points: &[Vec<f64>], theta: &Theta) -> Vec<Vec<f64>> {
        let scaled = |d: usize, v: f64| match self.axes[d] {
            Axis::Numeric { .. } => v * (1.0 / theta.length[d]),
            Axis::Categorical { .. } => v,
        };
        (0..self.axes.len()).map(|d| points.iter().map(|p| scaled(d, p[d])).collect()).collect()
    }

    /// The indices of the numeric axes.
    pub(super) fn numeric_axes(&self) -> impl Iterator<Item = usize> + '_ {
        self.axes.iter().enumerate().filter(|(_, a)| matches!(a, Axis::Numeric { .. })).map(|(d, _)| d)
    }

    /// Squared scaled distance of the kernel.
    pub(super) fn distance2(&self, a: &[f64], b: &[f64], length: &[f64]) -> f64 {
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

    pub(super) fn kernel(&self, a: &[f64], b: &[f64], theta: &Theta) -> f64 {
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
    pub(super) fn kernel_row(&self, columns: &[Vec<f64>], count: usize, u: &[f64], theta: &Theta, out: &mut Vec<f64>) {
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
}
