//! The Tunefleet coordinator as a library.

pub mod broker;
pub mod sched;
pub mod transport;
pub mod study;
pub mod search;
pub mod store;
pub mod cli;
pub mod engine;
pub mod progress;
