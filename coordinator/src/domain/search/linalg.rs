//! The little dense linear algebra and optimisation the Gaussian-process
//! search needs: a Cholesky factor with its triangular solves, and
//! Nelder-Mead. Matrices are row-major `Vec<f64>` of `n * n`; sizes are a
//! study's trials (hundreds at most), where these O(n^3) loops take
//! milliseconds.

/// The lower Cholesky factor `L` of the symmetric positive definite `a`
/// (`a = L L^T`), or `None` when `a` is not (numerically) positive definite.
pub fn cholesky(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut sum = a[i * n + j];
            for k in 0..j {
                sum -= l[i * n + k] * l[j * n + k];
            }
            if i == j {
                if sum.is_nan() || sum <= 0.0 || !sum.is_finite() {
                    return None;
                }
                l[i * n + i] = sum.sqrt();
            } else {
                l[i * n + j] = sum / l[j * n + j];
            }
        }
    }
    Some(l)
}

/// Solves `L x = b` for the lower triangular `l`.
pub fn solve_lower(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut x = b.to_vec();
    for i in 0..n {
        let mut sum = x[i];
        for k in 0..i {
            sum -= l[i * n + k] * x[k];
        }
        x[i] = sum / l[i * n + i];
    }
    x
}

/// Solves `L X = B` in place for the lower triangular `l` (`n` by `n`) and
/// `b` of `n` rows of `m` columns (row-major): every row an update of
/// contiguous columns, so many right-hand sides cost little more than one.
pub fn solve_lower_many(l: &[f64], n: usize, b: &mut [f64], m: usize) {
    for i in 0..n {
        let (done, rest) = b.split_at_mut(i * m);
        let row = &mut rest[..m];
        for (k, c) in l[i * n..i * n + i].iter().enumerate() {
            if *c != 0.0 {
                for (r, s) in row.iter_mut().zip(&done[k * m..(k + 1) * m]) {
                    *r -= c * s;
                }
            }
        }
        let d = l[i * n + i];
        for r in row.iter_mut() {
            *r /= d;
        }
    }
}

/// Solves `L^T x = b` for the lower triangular `l`.
pub fn solve_upper_t(l: &[f64], n: usize, b: &[f64]) -> Vec<f64> {
    let mut x = b.to_vec();
    for i in (0..n).rev() {
        let mut sum = x[i];
        for k in i + 1..n {
            sum -= l[k * n + i] * x[k];
        }
        x[i] = sum / l[i * n + i];
    }
    x
}

/// Minimises `f` from `x0` with Nelder-Mead (initial simplex: `x0` and one
/// vertex `step` further along each axis), at most `max_evals` evaluations
/// of `f`. Returns the best point and its value. A non-finite value counts
/// as `+inf`.
pub fn nelder_mead(mut f: impl FnMut(&[f64]) -> f64, x0: &[f64], step: f64, max_evals: usize) -> (Vec<f64>, f64) {
    let d = x0.len();
    let mut eval = |x: &[f64]| {
        let v = f(x);
        if v.is_finite() {
            v
        } else {
            f64::INFINITY
        }
    };
    let mut simplex: Vec<(Vec<f64>, f64)> = Vec::with_capacity(d + 1);
    simplex.push((x0.to_vec(), eval(x0)));
    for i in 0..d {
        let mut x = x0.to_vec();
        x[i] += step;
        let v = eval(&x);
        simplex.push((x, v));
    }
    let mut evals = d + 1;
    while evals < max_evals {
        simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (simplex[0].1, simplex[d].1);
        if (worst - best).abs() <= 1e-9 * (1.0 + best.abs()) {
            break;
        }
        let centroid: Vec<f64> =
            (0..d).map(|k| simplex[..d].iter().map(|(x, _)| x[k]).sum::<f64>() / d as f64).collect();
        let along =
            |t: f64| -> Vec<f64> { (0..d).map(|k| centroid[k] + t * (simplex[d].0[k] - centroid[k])).collect() };
        let reflected = along(-1.0);
        let fr = eval(&reflected);
        evals += 1;
        if fr < simplex[0].1 {
            let expanded = along(-2.0);
            let fe = eval(&expanded);
            evals += 1;
            simplex[d] = if fe < fr { (expanded, fe) } else { (reflected, fr) };
        } else if fr < simplex[d - 1].1 {
            simplex[d] = (reflected, fr);
        } else {
            let contracted = if fr < simplex[d].1 { along(-0.5) } else { along(0.5) };
            let fc = eval(&contracted);
            evals += 1;
            if fc < fr.min(simplex[d].1) {
                simplex[d] = (contracted, fc);
            } else {
                // Shrink towards the best vertex.
                let first = simplex[0].0.clone();
                for vertex in simplex.iter_mut().skip(1) {
                    let x: Vec<f64> = vertex.0.iter().zip(&first).map(|(v, b)| b + 0.5 * (v - b)).collect();
                    let v = eval(&x);
                    *vertex = (x, v);
                }
                evals += d;
            }
        }
    }
    simplex.sort_by(|a, b| a.1.total_cmp(&b.1));
    simplex.swap_remove(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cholesky_solves_a_positive_definite_system() {
        let a = [4.0, 2.0, 0.6, 2.0, 5.0, 1.5, 0.6, 1.5, 3.0];
        let l = cholesky(&a, 3).expect("positive definite");
        let b = [1.0, -2.0, 0.5];
        let x = solve_upper_t(&l, 3, &solve_lower(&l, 3, &b));
        for i in 0..3 {
            let ax: f64 = (0..3).map(|j| a[i * 3 + j] * x[j]).sum();
            assert!((ax - b[i]).abs() < 1e-12, "row {i}: {ax} vs {}", b[i]);
        }
        assert!(cholesky(&[1.0, 2.0, 2.0, 1.0], 2).is_none(), "indefinite");
        // Many right-hand sides at once: each column as solved alone.
        let mut many = vec![1.0, 0.3, -2.0, 4.0, 0.5, -1.5];
        solve_lower_many(&l, 3, &mut many, 2);
        for (column, b) in [[1.0, -2.0, 0.5], [0.3, 4.0, -1.5]].iter().enumerate() {
            let alone = solve_lower(&l, 3, b);
            for i in 0..3 {
                assert!((many[i * 2 + column] - alone[i]).abs() < 1e-12, "column {column} row {i}");
            }
        }
    }

    #[test]
    fn nelder_mead_finds_the_minimum_of_a_valley() {
        let rosen = |x: &[f64]| 100.0 * (x[1] - x[0] * x[0]).powi(2) + (1.0 - x[0]).powi(2);
        let (x, v) = nelder_mead(rosen, &[-1.2, 1.0], 0.5, 2000);
        assert!(v < 1e-6 && (x[0] - 1.0).abs() < 1e-2 && (x[1] - 1.0).abs() < 2e-2, "{x:?} {v}");
    }
}
