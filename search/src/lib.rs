//! Tunefleet's search: a search space, the proposers and the samplers that
//! learn from results, with nothing of a study file, a store or a fleet.
//!
//! * [`space`]: the domain of each parameter and an objective's direction;
//! * [`proposer`]: one configuration at a time: the grid, random draws, or a
//!   [`Sampler`] (as [`proposer::sampled`]);
//! * [`tpe`] and [`gp`]: the samplers that model the objective (the tree of
//!   Parzen estimators and a Gaussian process), asked with the trials still
//!   in flight;
//! * [`asha`]: asynchronous successive halving, which stops trials early;
//! * [`pareto`]: fronts, ranks and hypervolume for two objectives;
//! * [`warm`]: configurations of an earlier study as first proposals;
//! * [`AskDepth`]: how many trials were in flight at each ask.
//!
//! Every proposer is seeded and pure: the same study, seed and told results
//! give the same proposals bit for bit.

pub mod asha;
mod depth;
mod draw;
pub mod gp;
mod linalg;
pub mod pareto;
pub mod proposer;
mod sampler;
pub mod space;
pub mod tpe;
pub mod warm;

pub use depth::AskDepth;
pub use draw::sample;
pub use sampler::{Outcome, Sampler};
