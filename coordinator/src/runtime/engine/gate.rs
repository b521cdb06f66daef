//! The gate: an event from the broker made an authenticated, bounded,
//! typed message, or refused and counted. Connection events are logged; a
//! sealed frame is opened with its agent's session (a known agent whose
//! session is gone is told so, signed); a bundle is taken apart; each
//! message is checked against the bounds of [`crate::domain::bounds`] (a
//! result out of bounds is answered `Refused`, so its agent parks it). A
//! Hello and a Last Will pass as they are, to the handshake.

use tunefleet_common::auth::{self, Signed, UpFrame, Will};
use tunefleet_common::message::{AckOutcome, AgentMessage, CoordinatorMessage, ResultAck};
use tunefleet_common::topic::AgentTopic;

use super::ctx::Ctx;
use super::types::{loud, EngineError, Inbound};

/// What passed the gate.
pub(super) enum Gated {
    /// Nothing to act on (a connection event, or refused and counted).
    Nothing,
    /// A Hello, to the handshake.
    Hello { agent: String, signed: Signed },
    /// A Last Will, to be matched with the agent's session.
    Will { agent: String, will: Will },
    /// Messages of an authenticated agent, each within bounds, in order.
    Messages { agent: String, msgs: Vec<(AgentTopic, AgentMessage)> },
}

/// Takes `ev` through the gate.
pub(super) fn gate(cx: &mut Ctx<'_, '_>, ev: Inbound) -> Result<Gated, EngineError> {
    let (agent, kind, frame) = match ev {
        Inbound::Connected => {
            tracing::info!("connected to the broker");
            return Ok(Gated::Nothing);
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
            return Ok(Gated::Nothing);
        }
        Inbound::Rejected { topic, reason } => {
            cx.stats.rejected_messages += 1;
            let n = cx.stats.rejected_messages;
            if loud(n) {
                tracing::warn!(topic = %topic, reason = %reason, rejected = n, "rejected a message");
            }
            return Ok(Gated::Nothing);
        }
        Inbound::Agent { agent, kind, frame } => (agent, kind, *frame),
    };
    let msg = match frame {
        UpFrame::Hello(signed) => return Ok(Gated::Hello { agent, signed }),
        UpFrame::Will(will) => return Ok(Gated::Will { agent, will }),
        UpFrame::Sealed(sealed) => match cx.sessions.open(&agent, kind, &sealed) {
            Ok(msg) => msg,
            Err(e) => {
                cx.stats.bad_tokens += 1;
                if loud(cx.stats.bad_tokens) {
                    tracing::warn!(agent = %agent, topic = kind.as_str(), error = %e, refused = cx.stats.bad_tokens, "unauthenticated message refused");
                }
                // A frame of a session this coordinator does not hold (it
                // restarted, or another Hello replaced it): a known agent is
                // told, signed, so it says Hello again instead of talking
                // into the void.
                if matches!(e, auth::AuthError::NoSession | auth::AuthError::Token { .. })
                    && cx.batch.agent_key(&agent)?.is_some()
                {
                    if let Some(notice) = cx.sessions.stale_notice(&agent, sealed.token, cx.now.instant) {
                        cx.welcomes.push((agent, notice));
                    }
                }
                return Ok(Gated::Nothing);
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
            return Ok(Gated::Nothing);
        }
    };
    let mut passed = Vec::with_capacity(msgs.len());
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
                    cx.out.push((agent.clone(), CoordinatorMessage::Ack(ResultAck { trial: r.trial, outcome })));
                }
            }
        }
    }
    Ok(Gated::Messages { agent, msgs: passed })
}
