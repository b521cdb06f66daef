//! How an ask of [`super::Gp`] refines its best candidates.

/// How an ask refines its best candidates while the model has at most
/// [`REFINED_FULL`] points: ten of them (Optuna's `GPSampler` runs ten
/// local searches from its best preliminary samples too), each a compass
/// search of at most [`SWEEPS`] sweeps. Beyond, a scored point costs
/// `O(n^2)` and an ask's work is kept about bounded: three, the step
/// halved after every sweep, eight sweeps (the refinement before issue
/// 37's second round).
pub(super) const FULL: Refinement = Refinement { starts: 10, compass: true, sweeps: SWEEPS };
pub(super) const BOUNDED: Refinement = Refinement { starts: 3, compass: false, sweeps: 8 };
pub(super) const REFINED_FULL: usize = 100;

/// How the best candidates of an ask are refined.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Refinement {
    /// Candidates refined.
    pub starts: usize,
    /// A compass search (a start's step halves only after a sweep that found
    /// nothing better), or the step halved after every sweep.
    pub compass: bool,
    /// Most sweeps.
    pub sweeps: usize,
}

impl Refinement {
    /// The refinement of an ask whose model has `n` points.
    pub fn of(n: usize) -> Refinement {
        if n <= REFINED_FULL {
            FULL
        } else {
            BOUNDED
        }
    }

    /// The sweeps of a refinement of `starts` (scores and points) over
    /// `axes` axes: `along(starts, alive, steps, d, moved)` steps each start
    /// of `alive` along axis `d` (setting `moved` where one moved); after a
    /// sweep the step of each start that did not move (of every start,
    /// without a compass search) halves, and a start is done when its step
    /// is below [`MIN_STEP`].
    pub fn run(
        self,
        starts: &mut [(f64, Vec<f64>)],
        axes: usize,
        mut along: impl FnMut(&mut [(f64, Vec<f64>)], &[usize], &[f64], usize, &mut [bool]),
    ) {
        let count = starts.len();
        let mut steps = vec![FIRST_STEP; count];
        let mut alive: Vec<usize> = (0..count).collect();
        for _ in 0..self.sweeps {
            alive.retain(|&c| steps[c] >= MIN_STEP);
            if alive.is_empty() {
                break;
            }
            let mut moved = vec![false; count];
            for d in 0..axes {
                along(starts, &alive, &steps, d, &mut moved);
            }
            for &c in &alive {
                if !self.compass || !moved[c] {
                    steps[c] *= 0.5;
                }
            }
        }
    }
}

/// Most sweeps of that refinement, a compass search: the step halves after
/// a sweep that found nothing better and stays after one that did ...
pub(super) const SWEEPS: usize = 40;
/// ... from this first step (unit coordinates) ...
pub(super) const FIRST_STEP: f64 = 0.1;
/// ... until it falls below this.
pub(super) const MIN_STEP: f64 = 1e-5;
