//! The gate: an event from the broker made an authenticated, bounded,
//! typed message, or refused and counted. Connection events are logged; a
//! sealed frame is opened with its agent's session (a frame of a session
//! not held passes as [`Gated::Stale`], so the apply stage can tell a
//! known agent); a bundle is taken apart; each message is checked against
//! the bounds of [`crate::domain::bounds`] (a result out of bounds comes
//! back as its `Refused` answer, so its agent parks it). A Hello and a
//! Last Will pass as they are, to the handshake.
//!
//! The gate borrows what authentication and the counters need ([`Gatekeeping`]),
//! nothing of the store or the scheduler, and sends nothing itself.

use tunefleet_common::auth::{self, Signed, UpFrame, Will};
use tunefleet_common::message::{AckOutcome, AgentMessage, ResultAck, SessionToken};
use tunefleet_common::topic::AgentTopic;

use super::types::{loud, EngineStats, Inbound};
use crate::runtime::auth::Sessions;

/// What the gate borrows: the sessions that open frames and the counters
/// of what it refuses.
pub(super) struct Gatekeeping<'a> {
    pub(super) stats: &'a mut EngineStats,
    pub(super) sessions: &'a mut Sessions,
}

/// What passed the gate.
pub(super) enum Gated {
    /// Nothing to act on (a connection event, or refused and counted).
    Nothing,
    /// A Hello, to the handshake.
    Hello { agent: String, signed: Signed },
    /// A Last Will, to be matched with the agent's session.
    Will { agent: String, will: Will },
    /// A frame of a session this coordinator does not hold (it restarted,
    /// or another Hello replaced it): refused and counted; a known agent
    /// is to be told, so it says Hello again instead of talking into the
    /// void.
    Stale { agent: String, token: SessionToken },
    /// Messages of an authenticated agent, each within bounds, in order,
    /// and the answers to its results out of bounds.
    Messages { agent: String, msgs: Vec<(AgentTopic, AgentMessage)>, refused: Vec<ResultAck> },
}

/// Takes `ev` through the gate.
pub(super) fn gate(cx: &mut Gatekeeping<'_>, ev: Inbound) -> Gated {
    let (agent, kind, frame) = match ev {
        Inbound::Connected => {
            tracing::info!("connected to the broker");
            return Gated::Nothing;
        }
        Inbound::Disconnected(why) => {
            // Retried every few seconds while the broker is down: said loudly
            // the first times, then at powers of two, with the count.
            cx.stats.broker_losses += 1;
            if loud(cx.stats.broker_losses) {
                tracing::warn!(error = %why, failures = cx.stats.broker_losses, "lost the broker; reconnecting");
            } else {
                tracing::debug!(error = %why, failures = cx.stats.broker_losses, "lost the broker; reconnecting");
            }
            return Gated::Nothing;
        }
        Inbound::Rejected { topic, reason } => {
            cx.stats.rejected_messages += 1;
            let n = cx.stats.rejected_messages;
            if loud(n) {
                tracing::warn!(topic = %topic, reason = %reason, rejected = n, "rejected a message");
            }
            return Gated::Nothing;
        }
        Inbound::Agent { agent, kind, frame } => (agent, kind, *frame),
    };
    let msg = match frame {
        UpFrame::Hello(signed) => return Gated::Hello { agent, signed },
        UpFrame::Will(will) => return Gated::Will { agent, will },
        UpFrame::Sealed(sealed) => match cx.sessions.open(&agent, kind, &sealed) {
            Ok(msg) => msg,
            Err(e) => {
                cx.stats.bad_tokens += 1;
                if loud(cx.stats.bad_tokens) {
                    tracing::warn!(agent = %agent, topic = kind.as_str(), error = %e, refused = cx.stats.bad_tokens, "unauthenticated message refused");
                }
                if matches!(e, auth::AuthError::NoSession | auth::AuthError::Token { .. }) {
                    return Gated::Stale { agent, token: sealed.token };
                }
                return Gated::Nothing;
            }
        },
    };
    // A bundle is its messages, each taken as if it came alone.
    let msgs = match msg.unbundle() {
        Ok(msgs) => msgs,
        Err(why) => {
            cx.stats.invalid_messages += 1;
            if loud(cx.stats.invalid_messages) {
                tracing::warn!(agent = %agent, topic = kind.as_str(), reason = %why, invalid = cx.stats.invalid_messages, "message refused: a malformed bundle");
            }
            return Gated::Nothing;
        }
    };
    let mut passed = Vec::with_capacity(msgs.len());
    let mut refused = Vec::new();
    for msg in msgs {
        let kind = AgentTopic::of_agent_message(&msg);
        match crate::domain::bounds::message(&msg) {
            Ok(()) => passed.push((kind, msg)),
            Err(why) => {
                cx.stats.invalid_messages += 1;
                if loud(cx.stats.invalid_messages) {
                    tracing::warn!(agent = %agent, topic = kind.as_str(), reason = %why, invalid = cx.stats.invalid_messages, "message refused: out of bounds");
                }
                if let AgentMessage::Result(r) = msg {
                    let outcome = AckOutcome::Refused(format!("out of bounds: {why}"));
                    refused.push(ResultAck { trial: r.trial, outcome });
                }
            }
        }
    }
    Gated::Messages { agent, msgs: passed, refused }
}
