//! Asynchronous successive halving (ASHA, Li et al., MLSys 2020) as early
//! stopping on the epoch metrics trials report while they run.
//!
//! Rungs sit at epochs `grace * reduction^k` (k = 0, 1, ...). A trial is
//! judged at a rung by its first report at or past that rung's epoch (as
//! Ray Tune's `ASHAScheduler` does: a workload reporting every second epoch
//! still meets rungs 1, 3, 9), at the highest rung it has reached and not
//! been judged at; a report past a rung it was already judged at is not
//! judged again. Its value is compared with the values other trials
//! reached at that rung so far: a trial outside the best `1 / reduction` of
//! them is stopped; the first trial at a rung always goes on. Then its value
//! joins the rung. Nothing waits for a rung to fill, so no agent idles (the
//! asynchronous part), and a trial that reached a rung early is never
//! stopped later for others' sake. The cut is the `1 - 1/reduction`
//! quantile of the recorded values, linearly interpolated
//! (`numpy.percentile`'s default).
//!
//! A NaN is the worst value (a diverged run): it is stopped at any rung
//! that has a value, and counts as the worst there. (Ray lets a NaN go on.)
//!
//! Only objectives a workload reports epoch by epoch can be judged; a
//! measured objective (`wall_time`, `cpu_time`, `energy`) is known only when
//! a trial ends, and a study asking for both is refused ([`refused`]).
//!
//! Pure: values in, decisions out.

use std::collections::{BTreeMap, BTreeSet};

use crate::space::Direction;

/// What to do with a trial after a report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pruning {
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

    /// The highest rung at or below `epoch` (`None` before the first).
    pub fn rung_of(&self, epoch: u32) -> Option<u32> {
        let mut r = u64::from(self.grace);
        let mut last = None;
        while r <= u64::from(epoch) {
            last = u32::try_from(r).ok();
            r *= u64::from(self.reduction);
        }
        last
    }

    /// Trial `trial` reached `value` of the objective at the end of `epoch`:
    /// [`Asha::judge`], then [`Asha::record`].
    pub fn report(&mut self, trial: u64, epoch: u32, value: f64) -> Pruning {
        let Some(judged) = self.judge(trial, epoch, value) else { return Pruning::Continue };
        self.record(&judged);
        judged.pruning
    }

    /// The verdict on trial `trial` reaching `value` at the end of `epoch`,
    /// changing nothing; `None` before the first rung, or when the trial
    /// was judged at this rung already (a report past a rung already
    /// judged is not judged again at a lower one).
    pub fn judge(&self, trial: u64, epoch: u32, value: f64) -> Option<Judged> {
        let rung = self.rung_of(epoch)?;
        if self.seen.contains(&(trial, rung)) {
            return None;
        }
        // NaN is the worst value there is.
        let value = match (value.is_nan(), self.direction) {
            (false, _) => value,
            (true, Direction::Minimize) => f64::INFINITY,
            (true, Direction::Maximize) => f64::NEG_INFINITY,
        };
        let recorded = self.rungs.get(&rung).map_or(&[][..], Vec::as_slice);
        let pruning = match cutoff(recorded, self.reduction, self.direction) {
            Some(cut) if self.direction.better(cut, value) || value == worst(self.direction) => {
                Pruning::Stop { rung, value, cutoff: cut }
            }
            _ => Pruning::Continue,
        };
        Some(Judged { trial, rung, value, pruning })
    }

    /// Records a verdict of [`Asha::judge`]: its value joins its rung, and
    /// the trial is not judged there again.
    pub fn record(&mut self, judged: &Judged) {
        if self.seen.insert((judged.trial, judged.rung)) {
            self.rungs.entry(judged.rung).or_default().push(judged.value);
        }
    }
}

/// A trial's report judged at a rung ([`Asha::judge`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    pub trial: u64,
    pub rung: u32,
    /// The value recorded at the rung (NaN made the worst there is).
    pub value: f64,
    pub pruning: Pruning,
}

/// The worst value in a direction.
fn worst(direction: Direction) -> f64 {
    match direction {
        Direction::Minimize => f64::INFINITY,
        Direction::Maximize => f64::NEG_INFINITY,
    }
}

/// Why a study with this objective metric cannot use ASHA, if it cannot:
/// measured objectives are known only when a trial ends, not per epoch.
pub fn refused(metric: &str) -> Option<String> {
    matches!(metric, "wall_time" | "cpu_time" | "energy" | "energy_time").then(|| {
        format!(
            "early_stopping: the objective {metric:?} is measured when a trial ends, not reported epoch by \
             epoch, so ASHA has nothing to judge at its rungs; stop early on a metric the workload reports \
             (or drop [early_stopping])"
        )
    })
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
    let (a, b, t) = (sorted[lo], sorted[hi], pos - lo as f64);
    // Infinite ends (a NaN recorded as the worst value) interpolate to themselves.
    Some(if t == 0.0 || a == b {
        a
    } else if a.is_infinite() || b.is_infinite() {
        if t < 0.5 {
            a
        } else {
            b
        }
    } else {
        a + (b - a) * t
    })
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
        assert_eq!(a.report(0, 1, 0.5), Pruning::Continue, "the first at a rung always goes on");
        assert_eq!(a.report(1, 1, 0.7), Pruning::Continue, "better than the median of [0.5]");
        assert!(matches!(a.report(2, 1, 0.4), Pruning::Stop { rung: 1, .. }), "below the median of [0.5, 0.7]");
        assert_eq!(a.report(3, 3, 0.1), Pruning::Continue, "epoch 3 is past rung 2, the first there");
        assert_eq!(a.report(2, 1, 0.4), Pruning::Continue, "a repeated report counts once");
        // Minimize: small is good.
        let mut m = Asha::new(3, 1, Direction::Minimize);
        m.report(0, 1, 1.0);
        m.report(1, 1, 2.0);
        m.report(2, 1, 3.0);
        // Keep the best third: cutoff at the 1/3 quantile of [1, 2, 3] = 1.667.
        assert!(matches!(m.report(3, 1, 1.8), Pruning::Stop { .. }));
        assert_eq!(m.report(4, 1, 1.5), Pruning::Continue);
        assert!(matches!(m.report(5, 1, f64::NAN), Pruning::Stop { .. }), "NaN is the worst value");
    }

    #[test]
    fn a_trial_is_judged_at_its_first_report_at_or_past_each_rung() {
        let mut a = Asha::new(3, 1, Direction::Maximize);
        assert_eq!((a.rung_of(0), a.rung_of(2), a.rung_of(8), a.rung_of(9)), (None, Some(1), Some(3), Some(9)));
        a.report(0, 1, 0.9);
        a.report(0, 3, 0.9);
        a.report(1, 1, 0.8);
        a.report(1, 3, 0.8);
        // Reporting every second epoch: epoch 2 is judged at rung 1, epoch 4 at rung 3.
        assert!(matches!(a.report(2, 2, 0.1), Pruning::Stop { rung: 1, .. }));
        assert!(matches!(a.report(3, 4, 0.1), Pruning::Stop { rung: 3, .. }), "first report past rung 3");
        // Judged once per rung: a later report before the next rung is not.
        let mut b = Asha::new(3, 1, Direction::Maximize);
        b.report(0, 1, 0.9);
        assert!(matches!(b.report(1, 2, 0.1), Pruning::Stop { .. }));
        assert_eq!(b.report(1, 4, 0.1), Pruning::Continue, "rung 3: the first there");
        assert_eq!(b.report(1, 6, 0.1), Pruning::Continue, "rung 3 already judged");
    }

    /// The same nine workloads reporting every epoch and every second epoch
    /// (values rising with the epoch, each trial its own quality): ASHA
    /// stops about as many either way (the issue found 8 of 9 and 0 of 9).
    #[test]
    fn reporting_every_second_epoch_stops_as_many_trailing_trials() {
        let stopped = |every: u32| {
            let mut a = Asha::new(3, 1, Direction::Maximize);
            let mut stopped = 0;
            // Trials arrive one after another, the better ones later (the
            // harshest order for ASHA: each is compared with worse ones).
            for trial in 0..9u64 {
                let quality = [0.5, 0.2, 0.9, 0.1, 0.6, 0.3, 0.8, 0.4, 0.7][trial as usize];
                for epoch in (every..=10).step_by(every as usize) {
                    if matches!(a.report(trial, epoch, quality * f64::from(epoch)), Pruning::Stop { .. }) {
                        stopped += 1;
                        break;
                    }
                }
            }
            stopped
        };
        let (each, second) = (stopped(1), stopped(2));
        assert!(each >= 4, "{each} of 9 stopped reporting every epoch");
        assert_eq!(second, each, "every second epoch: {second} of 9, every epoch: {each}");
    }

    #[test]
    fn nan_counts_as_the_worst_value_at_its_rung() {
        let mut a = Asha::new(2, 1, Direction::Minimize);
        assert_eq!(a.report(0, 1, f64::NAN), Pruning::Continue, "the first at a rung goes on");
        // Recorded as the worst: a finite value is better than the cut.
        assert_eq!(a.report(1, 1, 5.0), Pruning::Continue);
        assert!(matches!(a.report(2, 1, f64::NAN), Pruning::Stop { .. }));
    }

    #[test]
    fn measured_objectives_are_refused() {
        for m in ["wall_time", "cpu_time", "energy"] {
            assert!(refused(m).is_some_and(|why| why.contains(m)), "{m}");
        }
        assert_eq!(refused("loss"), None);
    }

    #[test]
    fn with_many_trials_about_one_in_reduction_passes_each_rung() {
        // Values arrive in a random order; ASHA keeps roughly the top third.
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut a = Asha::new(3, 1, Direction::Maximize);
        let stopped = (0..900).filter(|&t| matches!(a.report(t, 1, rng.random::<f64>()), Pruning::Stop { .. })).count();
        assert!((520..680).contains(&stopped), "{stopped} of 900 stopped at the first rung (about 2/3 expected)");
    }
}
