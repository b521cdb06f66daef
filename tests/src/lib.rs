//! Helpers for the integration tests: temp dirs, free ports, processes.
