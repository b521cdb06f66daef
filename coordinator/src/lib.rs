//! The Tunefleet coordinator as a library: [`run`] runs a study; `main.rs`
//! parses flags ([`cli`]) and waits for signals.
//!
//! The folders are the layers, each importing only from the ones below it
//! (docs/ARCHITECTURE.md):
//!
//! - [`domain`]: what a study is and the pure decisions on it (the study
//!   model, search strategies, the scheduler, reuse, clustering, offloading,
//!   Pareto fronts, message bounds). No I/O.
//! - [`store`]: the SQLite store, the coordinator's memory.
//! - [`runtime`]: the running coordinator (the engine's core and its async
//!   shell, the broker, transport, sessions, control socket, launchers,
//!   sinks, progress).
//! - [`query`] and [`report`]: what the store says, as data and as HTML.
//! - [`cli`]: the commands, their flags and configuration file, and the text
//!   views.

pub use runtime::run::{run, RunConfig, RunError, RunOutcome};

pub mod cli;
pub mod domain;
pub mod query;
pub mod report;
pub mod runtime;
pub mod store;
