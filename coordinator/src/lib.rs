//! The Tunefleet coordinator as a library.

pub mod auth;
pub mod broker;
pub mod cli;
pub mod engine;
pub mod progress;
pub mod sched;
pub mod search;
pub mod sink;
pub mod store;
pub mod study;
pub mod transport;
pub mod validate;
