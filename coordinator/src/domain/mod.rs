//! The domain: a study and the pure decisions made on it. Nothing here does
//! I/O or reads a clock; the runtime passes plain values in and performs what
//! comes back.

pub mod bounds;
pub mod campaign;
pub mod cluster;
pub mod comeasure;
pub mod failure;
pub mod importance;
pub mod offload;
pub mod params;
pub mod rank;
pub mod reuse;
pub mod sched;
pub mod search;
pub mod select;
pub mod study;
pub mod trial;
