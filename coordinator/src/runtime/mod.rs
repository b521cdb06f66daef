//! The running coordinator: one run ([`run`]) wires the broker, the
//! transport, the store and the engine; the engine's core decides, its shell
//! and the modules beside it (sessions, control socket, launchers, sinks,
//! progress) do the I/O.

pub mod auth;
pub mod broker;
pub mod control;
pub mod engine;
pub mod launch;
pub mod progress;
pub mod run;
pub mod shell;
pub mod sink;
pub mod space;
pub mod transport;
