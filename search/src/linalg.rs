//! The little dense linear algebra and optimisation the Gaussian-process
//! search needs: a Cholesky factor with its triangular solves, and
//! Nelder-Mead. Matrices are row-major `Vec<f64>` of `n * n`; sizes are a
//! study's trials (hundreds at most), where these O(n^3) loops take
//! milliseconds.

/// The lower Cholesky factor `L` of the symmetric positive definite `a`
/// (`a = L L^T`), or `None` when `a` is not (numerically) positive definite.
/// Only the lower triangle of `a` is read.
pub fn cholesky(a: &[f64], n: usize) -> Option<Vec<f64>> {
    cholesky_from(a, n, &[], 0, 0)
}

/// Rows of a Cholesky factor computed together: their sums are independent
/// chains the processor overlaps.
const ROWS_AT_ONCE: usize = 4;

/// [`cholesky`] of `a` (`n` by `n`) whose first `p` rows are known:
/// `known` is a factor (row-major, rows of `stride`) whose leading `p` by
/// `p` block factors `a`'s, as the factor of a kernel matrix over points
/// that begin with the same `p` does. Row `i` of a factor depends on `a`'s rows up to `i` alone,
/// so the rows past `p` cost `O((n - p) n^2)` instead of `O(n^3)`: a point
/// added to a model costs `O(n^2)`. Every entry is the sum of the same
/// products in the same order as the one-row-at-a-time loop
/// (`tests::cholesky_plain`): the factor is bit for bit the same.
pub fn cholesky_from(a: &[f64], n: usize, known: &[f64], stride: usize, p: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..p.min(n) {
        l[i * n..i * n + i + 1].copy_from_slice(&known[i * stride..i * stride + i + 1]);
    }
    let mut i0 = p.min(n);
    while i0 < n {
        let i1 = (i0 + ROWS_AT_ONCE).min(n);
        // Columns left of the block: the rows' sums side by side.
        let (done, block) = l.split_at_mut(i0 * n);
        for j in 0..i0 {
            let lj = &done[j * n..j * n + j];
            let d = done[j * n + j];
            if i1 - i0 == ROWS_AT_ONCE {
                let mut sums: [f64; ROWS_AT_ONCE] = std::array::from_fn(|r| a[(i0 + r) * n + j]);
                for (k, y) in lj.iter().enumerate() {
                    for (r, sum) in sums.iter_mut().enumerate() {
                        *sum -= block[r * n + k] * y;
                    }
                }
                for (r, sum) in sums.into_iter().enumerate() {
                    block[r * n + j] = sum / d;
                }
            } else {
                for i in i0..i1 {
                    let row = &mut block[(i - i0) * n..(i - i0 + 1) * n];
                    let mut sum = a[i * n + j];
                    for (x, y) in row[..j].iter().zip(lj) {
                        sum -= x * y;
                    }
                    row[j] = sum / d;
                }
            }
        }
        // The block's own triangle, column by column.
        for j in i0..i1 {
            for i in j..i1 {
                entry(a, &mut l, n, i, j)?;
            }
        }
        i0 = i1;
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

/// Columns of [`solve_lower_many`] solved together, held in registers.
pub const COLUMNS_AT_ONCE: usize = 8;

/// A block of [`COLUMNS_AT_ONCE`] columns of `n` rows: row `i` holds the
/// columns' entries of row `i`.
pub type Block = Vec<[f64; COLUMNS_AT_ONCE]>;

/// Solves `L X = B` in place for the lower triangular `l` (`n` by `n`) and
/// `b` of `n` rows of `m` columns (row-major). Columns are solved
/// [`COLUMNS_AT_ONCE`] at a time ([`solve_lower_block`]), a block small
/// enough to stay in the first-level cache while the rows of `l` stream
/// past; every entry is the same subtractions in the same order as a column
/// solved alone ([`solve_lower`]): bit for bit its result.
pub fn solve_lower_many(l: &[f64], n: usize, b: &mut [f64], m: usize) {
    const W: usize = COLUMNS_AT_ONCE;
    let mut block: Block = vec![[0.0f64; W]; n];
    for c0 in (0..m).step_by(W) {
        let w = W.min(m - c0);
        for (i, row) in block.iter_mut().enumerate() {
            *row = [0.0; W];
            row[..w].copy_from_slice(&b[i * m + c0..i * m + c0 + w]);
        }
        solve_lower_block(l, n, &mut block, 0..n);
        for (i, row) in block.iter().enumerate() {
            b[i * m + c0..i * m + c0 + w].copy_from_slice(&row[..w]);
        }
    }
}

/// Rows `rows` of `L X = B` solved in place in `block` (`n` rows), its rows
/// before `rows.start` already solved: a solve stopped after some rows and
/// continued later ends as one solve of all of them, bit for bit (row `i`
/// of the solution depends on the rows before it alone, and each entry is
/// the same subtractions in the same order as in [`solve_lower`]).
pub fn solve_lower_block(l: &[f64], n: usize, block: &mut [[f64; COLUMNS_AT_ONCE]], rows: std::ops::Range<usize>) {
    const W: usize = COLUMNS_AT_ONCE;
    let end = rows.end.min(n).min(block.len());
    // Two rows at a time: their sums over the rows before both are
    // independent; the second then takes the first's term, last, as it
    // would alone.
    let mut i = rows.start;
    while i < end {
        let two = i + 1 < end;
        let (done, rest) = block.split_at_mut(i);
        let mut acc = rest[0];
        let mut next = if two { rest[1] } else { [0.0; W] };
        let upper = &l[i * n..i * n + i];
        let lower = if two { &l[(i + 1) * n..(i + 1) * n + i] } else { upper };
        for ((c, e), s) in upper.iter().zip(lower).zip(done.iter()) {
            if *c != 0.0 {
                for (r, v) in acc.iter_mut().zip(s) {
                    *r -= c * v;
                }
            }
            if two && *e != 0.0 {
                for (r, v) in next.iter_mut().zip(s) {
                    *r -= e * v;
                }
            }
        }
        let d = l[i * n + i];
        for r in acc.iter_mut() {
            *r /= d;
        }
        rest[0] = acc;
        if two {
            let (c, d) = (l[(i + 1) * n + i], l[(i + 1) * n + i + 1]);
            if c != 0.0 {
                for (r, v) in next.iter_mut().zip(&acc) {
                    *r -= c * v;
                }
            }
            for r in next.iter_mut() {
                *r /= d;
            }
            rest[1] = next;
        }
        i += 2;
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

/// `e^-r` for `r >= 0` (0 past 700), within an ulp or two of `(-r).exp()`
/// and written in plain arithmetic so that a loop of them runs in vector
/// registers (the kernel's exponential was a third of an ask's time at 1,000
/// told): `-r = k ln 2 + f` with `k` whole and `|f| <= ln 2 / 2`,
/// `e^f` by its Taylor series to the 13th power (truncation below 1e-17),
/// times `2^k` built from its bits.
pub fn exp_neg(r: f64) -> f64 {
    // 1.5 * 2^52: adding it rounds to a whole number, held in the low bits.
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    // ln 2 split so that k * LN2_HI is exact for |k| < 2^11 (fdlibm's).
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    let x = -r.clamp(0.0, 700.0);
    let t = x * std::f64::consts::LOG2_E + SHIFT;
    let k = t - SHIFT;
    let f = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = 1.0 / 6_227_020_800.0;
    for c in [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = p * f + c;
    }
    // k is in [-1010, 0]: 2^k is a normal number, its exponent field k + 1023.
    let whole = t.to_bits().wrapping_sub(SHIFT.to_bits()) as i64;
    let scale = f64::from_bits(((whole + 1023) as u64) << 52);
    if r > 700.0 {
        0.0
    } else {
        p * scale
    }
}

/// The factor one row at a time, one entry after the other: what
/// [`cholesky_from`] must equal bit for bit.
pub(crate) fn cholesky_plain(a: &[f64], n: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; n * n];
    for i in 0..n {
        for j in 0..=i {
            entry(a, &mut l, n, i, j)?;
        }
    }
    Some(l)
}

/// The factor's entry `(i, j)`, `j <= i`, from `a` and the entries before
/// it in row `i` and in row `j`; `None` when the matrix is not positive
/// definite at the diagonal.
fn entry(a: &[f64], l: &mut [f64], n: usize, i: usize, j: usize) -> Option<()> {
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
    Some(())
}

/// `L X = B` one row at a time over all the columns: what
/// [`solve_lower_many`] must equal bit for bit.
pub(crate) fn solve_lower_many_plain(l: &[f64], n: usize, b: &mut [f64], m: usize) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel-like positive definite matrix of `n` points on a line.
    fn gram(n: usize) -> Vec<f64> {
        let p: Vec<f64> = (0..n).map(|i| ((i * 37) % 101) as f64 / 101.0).collect();
        let mut a = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                a[i * n + j] = (-(p[i] - p[j]).powi(2) / 0.1).exp() + if i == j { 1e-3 } else { 0.0 };
            }
        }
        a
    }

    #[test]
    fn the_blocked_factor_and_its_continuation_equal_the_row_by_row_loop_bit_for_bit() {
        for n in [1, 2, 3, 5, 9, 30] {
            let a = gram(n);
            let reference = cholesky_plain(&a, n).expect("positive definite");
            assert_eq!(cholesky(&a, n).as_deref(), Some(&reference[..]), "n = {n}");
            for p in 0..=n {
                // The factor of the leading block, extended by the rest.
                let lead: Vec<f64> = (0..p).flat_map(|i| a[i * n..i * n + p].to_vec()).collect();
                let known = cholesky_plain(&lead, p).expect("leading block");
                assert_eq!(cholesky_from(&a, n, &known, p, p).as_deref(), Some(&reference[..]), "n = {n}, p = {p}");
                // Or read from a larger factor of which it is the leading block.
                assert_eq!(cholesky_from(&a, n, &reference, n, p).as_deref(), Some(&reference[..]), "n = {n}, p = {p}");
            }
        }
        let mut bad = gram(9);
        bad[7 * 9 + 7] = -1.0;
        assert!(cholesky(&bad, 9).is_none() && cholesky_plain(&bad, 9).is_none());
    }

    #[test]
    fn many_columns_solved_at_once_equal_each_solved_alone_bit_for_bit() {
        let n = 30;
        let l = cholesky(&gram(n), n).expect("positive definite");
        for m in [1, 7, 8, 9, 21] {
            let b: Vec<f64> = (0..n * m).map(|k| ((k * 7919) % 211) as f64 / 50.0 - 2.0).collect();
            let mut many = b.clone();
            solve_lower_many(&l, n, &mut many, m);
            let mut reference = b.clone();
            solve_lower_many_plain(&l, n, &mut reference, m);
            assert_eq!(many, reference, "m = {m}");
            // Stopped after `cut` rows and continued: the same, bit for bit.
            for cut in [0, 1, 7, 13, n] {
                let mut block: Block = (0..n).map(|i| std::array::from_fn(|c| b[i * m + c % m])).collect();
                solve_lower_block(&l, n, &mut block, 0..cut);
                solve_lower_block(&l, n, &mut block, cut..n);
                for (i, row) in block.iter().enumerate() {
                    for (c, v) in row.iter().enumerate() {
                        assert_eq!(v.to_bits(), many[i * m + c % m].to_bits(), "m = {m}, cut {cut}, row {i}");
                    }
                }
            }
            for column in 0..m {
                let alone = solve_lower(&l, n, &(0..n).map(|i| b[i * m + column]).collect::<Vec<f64>>());
                for i in 0..n {
                    assert_eq!(many[i * m + column].to_bits(), alone[i].to_bits(), "m = {m}, column {column}, row {i}");
                }
            }
        }
    }

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

    #[test]
    fn the_vector_exponential_is_the_libraries_to_an_ulp_or_two() {
        let mut worst = 0.0f64;
        for i in 0..200_000 {
            let r = i as f64 * 0.0035 + (i % 7) as f64 * 1e-7;
            let (ours, libm) = (super::exp_neg(r), (-r).exp());
            worst = worst.max(((ours - libm) / libm).abs());
        }
        assert!(worst < 5e-16, "relative error up to {worst:e}");
        assert_eq!(super::exp_neg(0.0), 1.0);
        assert_eq!(super::exp_neg(800.0), 0.0);
        assert_eq!(super::exp_neg(f64::INFINITY), 0.0);
    }
}
