//! Pareto fronts of multi-objective studies: the trials no other trial
//! beats on every objective at once.
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    proptest! {
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
