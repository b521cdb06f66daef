//! Example workloads for Tunefleet studies.
//!
//! Three jobs with different characters, so their counter profiles differ:
//! - `tunefleet-train` ([`train`]): compute-bound, a small MLP trained with
//!   mini-batch SGD on the bundled UCI handwritten digits ([`digits`], [`mlp`]);
//! - `tunefleet-stream` ([`transpose`]): memory-bound, a blocked out-of-place
//!   matrix transpose that checks its own result;
//! - `tunefleet-io` ([`disk`]): I/O-bound, files written, synced, read back,
//!   checksummed and deleted, in small system calls.
//!
//! All print one JSON line per epoch and a final line on stdout ([`report`]);
//! everything else goes to stderr. All speak the control channel
//! ([`control`]): with `TUNEFLEET_CONTROL=stdin` the agent can change their
//! thread count between epochs. `tunefleet-train` and `tunefleet-io` also
//! print step lines and save checkpoints ([`checkpoint`]).

pub mod checkpoint;
pub mod checksum;
pub mod control;
pub mod digits;
pub mod disk;
pub mod mlp;
pub mod report;
pub mod threads;
pub mod train;
pub mod transpose;
