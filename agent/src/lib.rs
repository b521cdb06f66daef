//! The Tunefleet agent as a library: `run(config, shutdown)` connects to the
//! broker, takes trials and measures them. `main.rs` only parses flags.
