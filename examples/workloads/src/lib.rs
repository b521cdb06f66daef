//! Shared pieces of the example workloads.
