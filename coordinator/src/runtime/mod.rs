//! The running coordinator: one run ([`run`]) wires the broker, the
//! transport, the store and the engine; the engine's core decides, its shell
//! and the modules beside it (sessions, control socket, launchers, sinks,
//! progress) do the I/O.

pub mod auth;
/// The embedded broker (its own crate: it imports nothing of the coordinator).
pub use tunefleet_broker as broker;
pub mod control;
pub mod disk;
pub mod engine;
pub mod failover;
pub mod launch;
pub mod logins;
pub mod progress;
pub mod run;
pub mod shell;
pub mod sink;
pub mod transport;
