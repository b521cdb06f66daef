//! The engine: what the coordinator does with each turn's events, with no
//! I/O but the store. [`core::Core::turn`] takes the broker's events, the
//! control socket's asks and the clocks, and returns what to send; the
//! async shell around it ([`crate::runtime::shell::Engine`]) reads the
//! transport and the clocks and performs what it returns. Nothing in this
//! folder imports the transport, the control socket or the sink: they
//! import the engine's types ([`types`]).
//!
//! Every frame is authenticated first ([`crate::runtime::auth`]); every message that
//! passes is validated before it reaches the scheduler or the store
//! ([`crate::domain::bounds`]). Bad input is counted, logged at a bounded rate and
//! answered where the agent must act (a refused result is parked by the
//! agent); it never ends the run. Each message is handled inside a
//! savepoint of its own: a store error while handling it undoes only its
//! writes (counted, logged, a result answered `Refused` so the agent parks
//! it) and the turn goes on with the next.
//!
//! A turn in three stages, as the agent's: `gate` (a frame made an
//! authenticated, bounded, typed message), `dispatch` (a message made a
//! decision, reading the state and changing nothing), `apply` (the
//! decision performed: store writes in a savepoint, then memory, then what
//! to send). Beside them: [`core`] (the turn itself, studies started and
//! stopped), `hello` (the handshake and Last Wills), `ctx` (what the
//! apply stage may touch, and the rules applied through it), `learn`
//! (reuse learning and refits), `active` (a running study), [`points`]
//! (InfluxDB lines), [`types`] (what the engine speaks in: its inbound
//! events, the control socket's asks and answers, errors, counters and
//! clocks).
//!
//! Each turn takes every event that is waiting (up to a batch), applies them
//! in one store transaction, commits, and only then are assignments and
//! result acknowledgements sent: an agent forgets a result only once it is
//! on disk.

mod active;
mod apply;
pub mod core;
mod ctx;
mod dispatch;
mod effects;
mod gate;
mod hello;
mod learn;
pub mod points;
mod start;
#[cfg(test)]
mod tests;
pub mod types;
mod warm;

pub use self::active::{Best, Summary};
pub use self::core::{Core, Headway, Outgoing, Started, LEASE_GRACE};
pub use self::start::{open_study, open_study_at};
pub use self::types::{unix_ms, EngineError, EngineStats, Now};
pub use self::types::{Answer, Ask, Inbound};
