//! The Tunefleet wire protocol, shared by the agent and the coordinator.
//!
//! * [`topic`]: the MQTT topic scheme under one versioned prefix.
//! * [`message`]: the typed messages that travel on those topics.
//! * [`measurement`]: the record an agent produces for every trial;
//!   [`counter`]: its perf counter readings.
//! * [`params`]: parameter values and the system parameters of a trial.
//! * [`profile`]: the versioned workload profile vector derived from counters.
//! * [`auth`]: keys, signed handshakes and sealed (MAC'd) session frames.
//! * [`codec`]: postcard encoding behind a one-byte protocol version.
//! * [`template`]: substitution of trial parameters into a command template.
//! * [`agent_cli`] (feature `agent-cli`): the agent's command line, which the
//!   coordinator also reads to generate the agent's man pages and completions.
//!
//! `docs/PROTOCOL.md` describes the same thing for people writing other clients.

#[cfg(feature = "agent-cli")]
pub mod agent_cli;
pub mod auth;
pub mod broker_url;
pub mod codec;
pub mod counter;
pub mod measurement;
pub mod message;
pub mod params;
pub mod profile;
#[cfg(feature = "security")]
pub mod security;
pub mod template;
pub mod topic;

pub use broker_url::BrokerUrl;

/// Whether `c` changes how text around it is shown without being seen
/// itself: bidirectional overrides and isolates (U+202E makes `exe.txt`
/// of `txt.exe`), zero-width characters and the byte-order mark. Text from
/// a workload or an agent is refused or cleaned of them where people read
/// it (logs, summaries, `status`, the report), as of control characters.
pub fn is_invisible_format(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}
pub use codec::{decode, decode_stored_result, encode, CodecError, MAX_MESSAGE_BYTES, PROTOCOL_VERSION};

/// What `--version` shows after the program's name, on the agent and the
/// coordinator alike: the release, the wire protocol ([`PROTOCOL_VERSION`];
/// an agent and a coordinator work together when theirs match) and the
/// workload profile ([`profile::PROFILE_VERSION`]), e.g.
/// `0.1.0 (protocol 6, profile 2)`.
pub fn version() -> &'static str {
    static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!("{} (protocol {PROTOCOL_VERSION}, profile {})", env!("CARGO_PKG_VERSION"), profile::PROFILE_VERSION)
    });
    VERSION.as_str()
}
