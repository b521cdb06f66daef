//! What a model-based search is told and asked: the [`Sampler`] trait TPE
//! and the Gaussian process implement, and the [`Outcome`] of a trial.

use tunefleet_common::params::Params;

/// What became of a trial, as the model is told it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// It finished with this objective value (as the metric reports it).
    Complete(f64),
    /// It was stopped early after reporting `value` at `epoch`, its last report.
    Pruned { epoch: u32, value: f64 },
}

/// A model-based sampler (TPE, the Gaussian process): the `index`-th ask
/// is a function of its seed, the index and the told and running trials,
/// so a resumed study asks the same.
pub trait Sampler: Send + std::fmt::Debug {
    /// The configuration of the `index`-th ask while `running` run.
    fn ask(&self, index: u64, running: &[(u64, &Params)]) -> Params;
    /// What became of a trial (one objective, or its last report when stopped).
    fn tell(&mut self, trial: u64, params: &Params, outcome: Outcome);
    /// A complete trial's objective and the figures of `[objective] also`.
    fn tell_values(&mut self, trial: u64, params: &Params, value: f64, also: &[f64]);
    /// How far a complete trial told before misses the study's
    /// `[[constraint]]`s (0: feasible). Samplers that do not model
    /// feasibility ignore it.
    fn tell_violation(&mut self, _trial: u64, _violation: f64) {}
    /// Each constraint's signed value for a complete trial told before
    /// (at most 0 where it holds, how far inside; above 0 how far it
    /// misses): what a model per constraint learns from. Samplers that do
    /// not model constraints ignore it.
    fn tell_margins(&mut self, _trial: u64, _margins: &[f64]) {}
    /// Trials told so far.
    fn observations(&self) -> usize;
}
