//! The Tunefleet coordinator as a library: [`run`] runs a study; `main.rs`
//! parses flags ([`cli`]) and waits for signals.

pub use run::{run, RunConfig, RunError, RunOutcome};

pub mod auth;
pub mod best;
pub mod broker;
pub mod campaign;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod control;
pub mod engine;
pub mod launch;
pub mod manual;
pub mod offload;
pub mod params;
pub mod pareto;
pub mod profiles;
pub mod progress;
pub mod report;
pub mod reuse;
pub mod run;
pub mod sched;
pub mod search;
pub mod select;
pub mod sink;
pub mod status;
pub mod store;
pub mod study;
pub mod transport;
pub mod validate;
