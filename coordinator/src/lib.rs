//! The Tunefleet coordinator as a library.
