//! Pareto fronts of multi-objective studies: the trials no other trial
//! beats on every objective at once, and the hypervolume they dominate.
//!
//! Pure. Every coordinate is minimised (the caller negates what is
//! maximised). Sorting the points lexicographically first means a point can
//! only be dominated by one before it, so each point is compared with the
//! front found so far: O(n log n + n x front) rather than O(n^2).

use std::cmp::Ordering;

/// True when `a` is at least as good as `b` everywhere and better somewhere.
pub fn dominates(a: &[f64], b: &[f64]) -> bool {
    a.iter().zip(b).all(|(x, y)| x <= y) && a.iter().zip(b).any(|(x, y)| x < y)
}

/// Indices of the non-dominated points of `points` (all minimised), in
/// order of the first coordinate. Points with a non-finite coordinate are
/// left out; equal points are all kept.
pub fn front(points: &[Vec<f64>]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..points.len()).filter(|&i| points[i].iter().all(|v| v.is_finite())).collect();
    order.sort_by(|&a, &b| {
        points[a]
            .iter()
            .zip(&points[b])
            // Numeric order, not `total_cmp`: -0.0 and 0.0 are equal here as
            // they are in `dominates`, else a point could sort before its
            // dominator and be kept beside it. No NaN is left to compare.
            .map(|(x, y)| x.partial_cmp(y).unwrap_or(Ordering::Equal))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or(a.cmp(&b))
    });
    let mut kept: Vec<usize> = Vec::new();
    for i in order {
        if !kept.iter().any(|&k| dominates(&points[k], &points[i])) {
            kept.push(i);
        }
    }
    kept
}

/// The reference point Optuna's multi-objective TPE uses for a set of
/// points (all minimised): per coordinate, the worst value moved 10 %
/// further out (`max(1.1 w, 0.9 w)`), a zero replaced by 1e-12. `None` for
/// no points or a non-finite coordinate.
pub fn reference_point(points: &[Vec<f64>]) -> Option<Vec<f64>> {
    let d = points.first()?.len();
    (0..d)
        .map(|k| {
            let worst = points.iter().map(|p| p.get(k).copied().unwrap_or(f64::NAN)).fold(f64::NEG_INFINITY, f64::max);
            let r = (1.1 * worst).max(0.9 * worst);
            if !r.is_finite() {
                None
            } else if r == 0.0 {
                Some(1e-12)
            } else {
                Some(r)
            }
        })
        .collect()
}

/// The volume of the region that `points` (all minimised) dominate and
/// that dominates `reference`: the union of the boxes from each point to
/// the reference. Points not strictly better than the reference on every
/// coordinate add nothing. Exact, by slicing along the last coordinate
/// (fine for the fronts of a study: tens to thousands of points, a few
/// objectives).
pub fn hypervolume(points: &[Vec<f64>], reference: &[f64]) -> f64 {
    let inside: Vec<&[f64]> = points
        .iter()
        .map(Vec::as_slice)
        .filter(|p| p.len() == reference.len() && p.iter().zip(reference).all(|(x, r)| x < r))
        .collect();
    slice_volume(&inside, reference)
}

fn slice_volume(points: &[&[f64]], reference: &[f64]) -> f64 {
    let d = reference.len();
    if points.is_empty() || d == 0 {
        return 0.0;
    }
    if d == 1 {
        return reference[0] - points.iter().map(|p| p[0]).fold(f64::INFINITY, f64::min);
    }
    let last = d - 1;
    let mut sorted: Vec<&[f64]> = points.to_vec();
    sorted.sort_by(|a, b| a[last].partial_cmp(&b[last]).unwrap_or(Ordering::Equal));
    let mut volume = 0.0;
    for i in 0..sorted.len() {
        let top = sorted.get(i + 1).map_or(reference[last], |p| p[last]);
        let depth = top - sorted[i][last];
        if depth > 0.0 {
            let below: Vec<&[f64]> = sorted[..=i].iter().map(|p| &p[..last]).collect();
            volume += depth * slice_volume(&below, &reference[..last]);
        }
    }
    volume
}

/// The non-domination rank of every point (all minimised, finite): 0 for
/// the front, 1 for the front of what is left, and so on. Quadratic per
/// front peeled: for the few hundred trials a multi-objective search
/// splits.
pub fn ranks(points: &[Vec<f64>]) -> Vec<usize> {
    let mut rank = vec![usize::MAX; points.len()];
    let mut left: Vec<usize> = (0..points.len()).collect();
    let mut r = 0;
    while !left.is_empty() {
        let (on, rest): (Vec<usize>, Vec<usize>) =
            left.iter().partition(|&&i| !left.iter().any(|&j| dominates(&points[j], &points[i])));
        for &i in &on {
            rank[i] = r;
        }
        left = rest;
        r += 1;
    }
    rank
}

/// `k` of `candidates` (indices into `points`, all minimised) chosen
/// greedily to maximise the hypervolume from `reference` of those chosen:
/// each step adds the point contributing most (the first on ties). Optuna's
/// multi-objective TPE fills its last good front this way.
pub fn greedy_subset(points: &[Vec<f64>], candidates: &[usize], k: usize, reference: &[f64]) -> Vec<usize> {
    let mut chosen: Vec<usize> = Vec::new();
    let mut left: Vec<usize> = candidates.to_vec();
    while chosen.len() < k && !left.is_empty() {
        let with = |c: usize| {
            let set: Vec<Vec<f64>> = chosen.iter().chain(std::iter::once(&c)).map(|&i| points[i].clone()).collect();
            hypervolume(&set, reference)
        };
        let mut best = 0;
        let mut best_volume = f64::NEG_INFINITY;
        for (pos, &c) in left.iter().enumerate() {
            let v = with(c);
            if v > best_volume {
                best_volume = v;
                best = pos;
            }
        }
        chosen.push(left.remove(best));
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranks_peel_fronts_and_the_subset_keeps_the_spread() {
        let p = vec![vec![1.0, 4.0], vec![2.0, 2.0], vec![4.0, 1.0], vec![3.0, 3.0], vec![4.0, 4.0], vec![2.1, 2.1]];
        assert_eq!(ranks(&p), vec![0, 0, 0, 2, 3, 1]);
        // Of the front, one point from (5, 5): the middle one dominates 9,
        // an end 4; then the two ends add 1 each (first on ties).
        assert_eq!(greedy_subset(&p, &[0, 1, 2], 1, &[5.0, 5.0]), vec![1]);
        assert_eq!(greedy_subset(&p, &[0, 1, 2], 2, &[5.0, 5.0]), vec![1, 0]);
        assert_eq!(greedy_subset(&p, &[0, 1, 2], 5, &[5.0, 5.0]).len(), 3);
    }

    #[test]
    fn keeps_the_trade_offs_and_drops_the_dominated() {
        let p =
            vec![vec![1.0, 5.0], vec![2.0, 2.0], vec![3.0, 3.0], vec![4.0, 1.0], vec![1.0, 6.0], vec![f64::NAN, 0.0]];
        assert_eq!(front(&p), vec![0, 1, 3]);
        assert_eq!(front(&[vec![1.0, 1.0], vec![1.0, 1.0]]), vec![0, 1], "equal points are both optimal");
        assert!(front(&[]).is_empty());
    }

    #[test]
    fn negative_zero_is_zero() {
        // [0.0, 0.5] dominates [-0.0, 1.0]: equal first coordinates.
        assert_eq!(front(&[vec![-0.0, 1.0], vec![0.0, 0.5]]), vec![1]);
        assert_eq!(front(&[vec![0.5, -0.0], vec![1.0, 0.0], vec![0.5, 0.0]]), vec![0, 2]);
    }

    #[test]
    fn hypervolume_of_known_fronts() {
        // Two points in 2-d against (4, 4): boxes 3 x 1 and 1 x 3 overlap 1 x 1.
        assert_eq!(hypervolume(&[vec![1.0, 3.0], vec![3.0, 1.0]], &[4.0, 4.0]), 5.0);
        // A dominated point and one outside the reference add nothing.
        let more = [vec![1.0, 3.0], vec![3.0, 1.0], vec![3.5, 3.5], vec![0.5, 5.0]];
        assert_eq!(hypervolume(&more, &[4.0, 4.0]), 5.0);
        // 3-d: a unit cube corner at the origin against (2, 2, 2) is 8; with
        // (1, 1, 0) too, the extra slab is 1 x 1 x 1.
        assert_eq!(hypervolume(&[vec![0.0, 0.0, 0.0]], &[2.0, 2.0, 2.0]), 8.0);
        assert_eq!(hypervolume(&[vec![1.0, 1.0, 1.0], vec![1.5, 1.5, 0.0]], &[2.0, 2.0, 2.0]), 1.0 + 0.25);
        assert_eq!(hypervolume(&[], &[1.0]), 0.0);
        // Worst 3 and 0: 1.1 x 3, and 0 made 1e-12; worst -10: 0.9 x -10.
        assert_eq!(reference_point(&[vec![1.0, -2.0], vec![3.0, -4.0], vec![0.0, 0.0]]), Some(vec![1.1 * 3.0, 1e-12]));
        assert_eq!(reference_point(&[vec![-10.0], vec![-20.0]]), Some(vec![0.9 * -10.0]));
        assert_eq!(reference_point(&[vec![f64::NAN]]), None);
    }

    proptest! {
        /// Against a Monte Carlo estimate on a grid of the box.
        #[test]
        fn hypervolume_counts_the_dominated_cells(points in prop::collection::vec(prop::collection::vec(0u8..8, 3), 0..12)) {
            let p: Vec<Vec<f64>> = points.iter().map(|v| v.iter().map(|&x| f64::from(x)).collect()).collect();
            let reference = [8.0, 8.0, 8.0];
            // Unit cells [a, a+1) x ... dominated when some point is <= their lower corner.
            let mut cells = 0;
            for a in 0..8 { for b in 0..8 { for c in 0..8 {
                let corner = [f64::from(a), f64::from(b), f64::from(c)];
                if p.iter().any(|q| q.iter().zip(&corner).all(|(x, y)| x <= y)) { cells += 1; }
            }}}
            prop_assert_eq!(hypervolume(&p, &reference), f64::from(cells));
        }

        /// Same answer as comparing every pair.
        #[test]
        fn agrees_with_the_quadratic_definition(points in prop::collection::vec(prop::collection::vec(0u8..7, 3), 0..40)) {
            // 6 stands for -0.0, beside 0.0.
            let value = |x: u8| if x == 6 { -0.0 } else { f64::from(x) };
            let p: Vec<Vec<f64>> = points.iter().map(|v| v.iter().map(|&x| value(x)).collect()).collect();
            let mut fast = front(&p);
            fast.sort_unstable();
            let slow: Vec<usize> = (0..p.len()).filter(|&i| !p.iter().any(|q| dominates(q, &p[i]))).collect();
            prop_assert_eq!(fast, slow);
        }
    }
}
