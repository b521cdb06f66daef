//! Example workloads for Tunefleet studies.
//!
//! Two jobs with different characters, so their counter profiles differ:
//! - `tunefleet-train` ([`train`]): compute-bound, a small MLP trained with
//!   mini-batch SGD on the bundled UCI handwritten digits ([`digits`], [`mlp`]);
//! - `tunefleet-stream` ([`transpose`]): memory-bound, a blocked out-of-place
//!   matrix transpose that checks its own result.
//!
//! Both print one JSON line per epoch and a final line on stdout ([`report`]);
//! everything else goes to stderr. Both speak the control channel
//! ([`control`]): with `TUNEFLEET_CONTROL=stdin` the agent can change their
//! thread count between epochs.

pub mod checkpoint;
pub mod control;
pub mod digits;
pub mod mlp;
pub mod report;
pub mod threads;
pub mod train;
pub mod transpose;
