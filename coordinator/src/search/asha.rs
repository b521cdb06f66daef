//! Asynchronous successive halving (ASHA, Li et al., MLSys 2020) as early
//! stopping on the epoch metrics trials report while they run.
//!
//! Rungs sit at epochs `grace * reduction^k` (k = 0, 1, ...). When a trial
//! reports the study's objective at a rung epoch, its value is compared with
//! the values other trials reached at that rung so far: a trial outside the
//! best `1 / reduction` of them is stopped; the first trial at a rung always
//! goes on. Then its value joins the rung. Nothing waits for a rung to fill,
//! so no agent idles (the asynchronous part), and a trial that reached a rung
//! early is never stopped later for others' sake (as in Ray Tune's
//! `ASHAScheduler`). The cut is the `1 - 1/reduction` quantile of the
//! recorded values, linearly interpolated (`numpy.nanpercentile`'s default).
//!
//! Pure: values in, decisions out.

use std::collections::{BTreeMap, BTreeSet};

use crate::study::Direction;

/// What to do with a trial after a report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    Continue,
    /// Stop it: at rung epoch `rung`, `value` is behind `cutoff`.
    Stop {
        rung: u32,
        value: f64,
        cutoff: f64,
    },
}

/// ASHA's state for one study.
#[derive(Debug, Clone)]
pub struct Asha {
    reduction: u32,
    grace: u32,
    direction: Direction,
    /// Values recorded at each rung epoch.
    rungs: BTreeMap<u32, Vec<f64>>,
    /// (trial, rung) pairs already recorded: a retransmitted report counts once.
    seen: BTreeSet<(u64, u32)>,
}

impl Asha {
    /// `reduction` >= 2, `grace` >= 1 epochs (validated by the study file).
    pub fn new(reduction: u32, grace: u32, direction: Direction) -> Self {
        Asha {
            reduction: reduction.max(2),
            grace: grace.max(1),
            direction,
            rungs: BTreeMap::new(),
            seen: BTreeSet::new(),
        }
    }

    /// Whether `epoch` is a rung.
    pub fn is_rung(&self, epoch: u32) -> bool {
        let mut r = u64::from(self.grace);
        while r <= u64::from(epoch) {
            if r == u64::from(epoch) {
                return true;
            }
            r *= u64::from(self.reduction);
        }
        false
    }

    /// Trial `trial` reached `value` of the objective at the end of `epoch`.
    pub fn report(&mut self, trial: u64, epoch: u32, value: f64) -> Decision {
        if !value.is_finite() || !self.is_rung(epoch) || !self.seen.insert((trial, epoch)) {
            return Decision::Continue;
        }
        let recorded = self.rungs.entry(epoch).or_default();
        let decision = match cutoff(recorded, self.reduction, self.direction) {
            Some(cut) if self.direction.better(cut, value) => Decision::Stop { rung: epoch, value, cutoff: cut },
            _ => Decision::Continue,
        };
        recorded.push(value);
        decision
    }
}

/// The value a trial must reach to be in the best `1 / reduction` of
/// `recorded`; `None` when nothing is recorded.
fn cutoff(recorded: &[f64], reduction: u32, direction: Direction) -> Option<f64> {
    if recorded.is_empty() {
        return None;
    }
    let mut sorted = recorded.to_vec();
    sorted.sort_by(f64::total_cmp);
    let keep = 1.0 / f64::from(reduction);
    // Maximize: the (1 - keep) quantile; minimize: the keep quantile.
    let q = match direction {
        Direction::Maximize => 1.0 - keep,
        Direction::Minimize => keep,
    };
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_are_grace_times_powers_of_the_reduction() {
        let a = Asha::new(3, 1, Direction::Maximize);
        let rungs: Vec<u32> = (1..=30).filter(|&e| a.is_rung(e)).collect();
        assert_eq!(rungs, vec![1, 3, 9, 27]);
        let b = Asha::new(2, 2, Direction::Maximize);
        assert_eq!((1..=20).filter(|&e| b.is_rung(e)).collect::<Vec<_>>(), vec![2, 4, 8, 16]);
    }

    #[test]
    fn trailing_trials_are_stopped_and_leading_ones_go_on() {
        let mut a = Asha::new(2, 1, Direction::Maximize);
        assert_eq!(a.report(0, 1, 0.5), Decision::Continue, "the first at a rung always goes on");
        assert_eq!(a.report(1, 1, 0.7), Decision::Continue, "better than the median of [0.5]");
        assert!(matches!(a.report(2, 1, 0.4), Decision::Stop { rung: 1, .. }), "below the median of [0.5, 0.7]");
        assert_eq!(a.report(3, 2, 0.1), Decision::Continue, "epoch 2 is no rung");
        assert_eq!(a.report(2, 1, 0.4), Decision::Continue, "a repeated report counts once");
        // Minimize: small is good.
        let mut m = Asha::new(3, 1, Direction::Minimize);
        m.report(0, 1, 1.0);
        m.report(1, 1, 2.0);
        m.report(2, 1, 3.0);
        // Keep the best third: cutoff at the 1/3 quantile of [1, 2, 3] = 1.667.
        assert!(matches!(m.report(3, 1, 1.8), Decision::Stop { .. }));
        assert_eq!(m.report(4, 1, 1.5), Decision::Continue);
        assert_eq!(m.report(5, 1, f64::NAN), Decision::Continue, "no value, no decision");
    }

    #[test]
    fn with_many_trials_about_one_in_reduction_passes_each_rung() {
        // Values arrive in a random order; ASHA keeps roughly the top third.
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut a = Asha::new(3, 1, Direction::Maximize);
        let stopped =
            (0..900).filter(|&t| matches!(a.report(t, 1, rng.random::<f64>()), Decision::Stop { .. })).count();
        assert!((520..680).contains(&stopped), "{stopped} of 900 stopped at the first rung (about 2/3 expected)");
    }
}
