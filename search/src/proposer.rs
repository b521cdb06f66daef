//! [`Proposer`]: what proposes a study's configurations one at a time.
//! [`Grid`] walks the cartesian product, [`Random`] samples with a seed,
//! and a [`Sampler`] (as [`sampled`]) proposes for the strategies that
//! learn.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tunefleet_common::params::Params;

use crate::draw::sample;
use crate::sampler::{Outcome, Sampler};
use crate::space::{grid_value, ParamSpec};

/// Proposes configurations one at a time and may learn from results.
pub trait Proposer: Send + std::fmt::Debug {
    /// The next configuration to try; `None` when there is nothing left.
    /// `running`: the trials created and not yet told (trial number and
    /// configuration), which a proposer that learns may steer away from;
    /// the search lists them only for a strategy that learns
    /// (the study's strategy learns from results).
    fn ask(&mut self, running: &[(u64, &Params)]) -> Option<Params>;
    /// What became of trial `trial` run with `params` (a complete trial's
    /// value is finite; the metric's own direction). Proposers that do not
    /// learn ignore it.
    fn tell(&mut self, _trial: u64, _params: &Params, _outcome: Outcome) {}
    /// A complete trial's objective `value` and the figures of the study's
    /// `[objective] also` (minimised, in that order; non-finite when not
    /// measured validly). A proposer searching one objective learns `value`.
    fn tell_values(&mut self, trial: u64, params: &Params, value: f64, also: &[f64]) {
        let _ = also;
        self.tell(trial, params, Outcome::Complete(value));
    }
    /// How far a complete trial told before misses the study's
    /// `[[constraint]]`s (0: feasible); ignored by proposers that do not
    /// model feasibility.
    fn tell_violation(&mut self, _trial: u64, _violation: f64) {}
    /// Each constraint's signed value (at most 0: it holds) of a complete
    /// trial told before; ignored by proposers that do not model them.
    fn tell_margins(&mut self, _trial: u64, _margins: &[f64]) {}
    /// Results the proposer has learnt from (0 for one that does not learn).
    fn observations(&self) -> usize {
        0
    }
}

/// The cartesian product of every parameter's grid, the last parameter
/// varying fastest; the `i`-th configuration is computed, never the list.
#[derive(Debug)]
pub struct Grid {
    axes: Vec<(String, ParamSpec, u64)>,
    next: u64,
    size: u64,
}

impl Grid {
    pub fn new(space: &[(String, ParamSpec)]) -> Self {
        let axes: Vec<_> = space.iter().map(|(n, s)| (n.clone(), s.clone(), s.grid_len())).collect();
        let size = axes.iter().fold(1u64, |acc, (_, _, len)| acc.saturating_mul(*len));
        Grid { axes, next: 0, size }
    }
}

impl Proposer for Grid {
    fn ask(&mut self, _running: &[(u64, &Params)]) -> Option<Params> {
        if self.next >= self.size {
            return None;
        }
        let mut rest = self.next;
        self.next += 1;
        let mut out = Params::new();
        for (name, spec, len) in self.axes.iter().rev() {
            let len = (*len).max(1);
            out.insert(name.clone(), grid_value(spec, rest % len));
            rest /= len;
        }
        Some(out)
    }
}

/// Configurations sampled with ChaCha8 seeded by the study's seed.
#[derive(Debug)]
pub struct Random {
    space: Vec<(String, ParamSpec)>,
    rng: ChaCha8Rng,
}

impl Random {
    pub fn new(space: &[(String, ParamSpec)], seed: u64) -> Self {
        Random { space: space.to_vec(), rng: ChaCha8Rng::seed_from_u64(seed) }
    }
}

impl Proposer for Random {
    fn ask(&mut self, _running: &[(u64, &Params)]) -> Option<Params> {
        Some(self.space.iter().map(|(name, spec)| (name.clone(), sample(spec, &mut self.rng))).collect())
    }
}

/// A [`Sampler`] as a proposer: its asks numbered in the order they are made.
#[derive(Debug)]
struct Sampled<S> {
    sampler: S,
    index: u64,
}

/// `sampler` as a study's proposer, from its first ask.
pub fn sampled(sampler: impl Sampler + 'static) -> Box<dyn Proposer> {
    Box::new(Sampled { sampler, index: 0 })
}

impl<S: Sampler> Proposer for Sampled<S> {
    fn ask(&mut self, running: &[(u64, &Params)]) -> Option<Params> {
        let params = self.sampler.ask(self.index, running);
        self.index += 1;
        Some(params)
    }

    fn observations(&self) -> usize {
        self.sampler.observations()
    }

    fn tell(&mut self, trial: u64, params: &Params, outcome: Outcome) {
        self.sampler.tell(trial, params, outcome);
    }

    fn tell_values(&mut self, trial: u64, params: &Params, value: f64, also: &[f64]) {
        self.sampler.tell_values(trial, params, value, also);
    }

    fn tell_violation(&mut self, trial: u64, violation: f64) {
        self.sampler.tell_violation(trial, violation);
    }

    fn tell_margins(&mut self, trial: u64, margins: &[f64]) {
        self.sampler.tell_margins(trial, margins);
    }
}
