//! What comes in from the broker, taken apart for the protocol's state
//! machine: connections, the coordinator's (verified) status, its sealed
//! messages (a bundle's one by one), and what is refused, counted by kind.

use tunefleet_common::auth::DownFrame;
use tunefleet_common::message::CoordinatorMessage;

use crate::protocol::{Action, AgentState};
use crate::transport::Delivery;
use crate::{allow, auth};

/// What the agent refused, by kind.
#[derive(Debug, Default)]
pub(crate) struct Refused {
    /// Payloads that do not decode or do not belong on their topic.
    pub(crate) undecodable: u64,
    /// Frames that fail authentication (forged, replayed, another session).
    pub(crate) unauthenticated: u64,
    /// Coordinator statuses with another key, or older than the newest.
    pub(crate) statuses: u64,
    /// Assignments of programs outside `--allow-command`.
    pub(crate) disallowed: u64,
    /// The last refusal of a Hello the coordinator told this agent (logged
    /// once per kind).
    pub(crate) hello: Option<tunefleet_common::auth::RefusalKind>,
    /// A refusal that saying Hello again cannot help: the agent stops.
    pub(crate) fatal: Option<String>,
    /// What the coordinator said last when it refused a Hello.
    pub(crate) last_refusal: Option<String>,
    /// Notices from the coordinator (logged at a bounded rate).
    pub(crate) notices: u64,
}

impl Refused {
    /// The coordinator refused a Hello of this agent (`kind`), saying `message`.
    fn told(&mut self, kind: tunefleet_common::auth::RefusalKind, message: String) {
        self.hello = Some(kind);
        self.last_refusal = Some(message);
    }

    /// Why this agent was never admitted: what the coordinator said last, if anything.
    pub(crate) fn why_never_admitted(&mut self) -> String {
        self.last_refusal
            .take()
            .unwrap_or_else(|| "no coordinator welcomed this agent before --exit-when-idle ran out".into())
    }
}

/// Logs the first ten of a kind of refusal, then at powers of two.
pub(crate) fn loud(n: u64) -> bool {
    n <= 10 || n.is_power_of_two()
}

pub(crate) fn on_inbound(
    state: &mut AgentState,
    auth: &mut auth::AgentAuth,
    allow: &allow::Allow,
    inbound: Delivery,
    refused: &mut Refused,
) -> Vec<Action> {
    match inbound {
        Delivery::Connected { will_hash } => {
            auth.on_connected(will_hash);
            state.on_connected()
        }
        Delivery::Coordinator { kind: _, frame: DownFrame::Stale(signed) } => match auth.stale(&signed) {
            Ok(true) => {
                tracing::warn!("the coordinator holds no session with this agent any more: saying Hello again");
                state.on_session_lost()
            }
            Ok(false) => Vec::new(),
            Err(e) => {
                refused.unauthenticated += 1;
                if loud(refused.unauthenticated) {
                    tracing::warn!(error = %e, refused = refused.unauthenticated, "unauthenticated stale-session notice refused");
                }
                Vec::new()
            }
        },
        Delivery::Coordinator { kind: _, frame: DownFrame::Refused(signed) } => {
            match auth.refused(&signed) {
                Ok(Some(notice)) => {
                    if notice.kind.fatal() {
                        tracing::error!(reason = ?notice.kind, "the coordinator refused this agent: {}", notice.message);
                        refused.fatal = Some(notice.message.clone());
                    } else if refused.hello != Some(notice.kind) {
                        tracing::warn!(reason = ?notice.kind, "the coordinator refused this agent for now (asking again): {}", notice.message);
                    }
                    refused.told(notice.kind, notice.message);
                }
                Ok(None) => {}
                Err(e) => {
                    refused.unauthenticated += 1;
                    if loud(refused.unauthenticated) {
                        tracing::warn!(error = %e, refused = refused.unauthenticated, "unauthenticated refusal notice ignored");
                    }
                }
            }
            Vec::new()
        }
        Delivery::Coordinator { kind, frame } => {
            let opened = match &frame {
                DownFrame::Welcome(signed) => auth.welcome(signed).map(|()| None),
                DownFrame::Sealed(sealed) => auth.open(kind, sealed).map(Some),
                DownFrame::Stale(_) | DownFrame::Refused(_) => Err(tunefleet_common::auth::AuthError::OtherHello),
            };
            match opened {
                Ok(None) => {
                    refused.hello = None;
                    tracing::info!("welcomed by the coordinator: session open");
                    state.on_welcome()
                }
                Ok(Some(msg)) => match msg.unbundle() {
                    Ok(msgs) => msgs.into_iter().flat_map(|m| on_message(state, allow, m, refused)).collect(),
                    Err(why) => {
                        refused.undecodable += 1;
                        if loud(refused.undecodable) {
                            tracing::warn!(topic = kind.as_str(), reason = %why, count = refused.undecodable, "ignoring a malformed bundle");
                        }
                        Vec::new()
                    }
                },
                Err(e) => {
                    refused.unauthenticated += 1;
                    if loud(refused.unauthenticated) {
                        tracing::warn!(topic = kind.as_str(), error = %e, refused = refused.unauthenticated, "unauthenticated message refused");
                    }
                    Vec::new()
                }
            }
        }
        Delivery::CoordinatorStatus { signed, retained } => match auth.coordinator_status(&signed) {
            Ok(status) => {
                tracing::info!(online = status.online, instance = status.instance, retained, "coordinator status");
                state.on_coordinator_status(status)
            }
            Err(e) => {
                refused.statuses += 1;
                if loud(refused.statuses) {
                    tracing::warn!(error = %e, refused = refused.statuses, "coordinator status ignored");
                }
                Vec::new()
            }
        },
        Delivery::Undecodable { topic, error } => {
            refused.undecodable += 1;
            if loud(refused.undecodable) {
                tracing::warn!(%topic, %error, count = refused.undecodable, "ignoring a message that does not decode");
            }
            Vec::new()
        }
    }
}

/// One message of the coordinator's (a bundle's, in order).
fn on_message(
    state: &mut AgentState,
    allow: &allow::Allow,
    msg: CoordinatorMessage,
    refused: &mut Refused,
) -> Vec<Action> {
    match msg {
        CoordinatorMessage::Assign(a) => match allow.check(&a.spec.argv, &a.spec.env) {
            Ok(()) => state.on_assign(a),
            Err(why) => {
                refused.disallowed += 1;
                tracing::warn!(trial = %a.trial, reason = %why, refused = refused.disallowed, "assignment refused by --allow-command");
                state.refuse_assignment(a.trial, why)
            }
        },
        CoordinatorMessage::Cancel(c) => state.on_cancel(c),
        CoordinatorMessage::Ack(a) => state.on_ack(a),
        CoordinatorMessage::Sync(n) => state.on_sync(n),
        CoordinatorMessage::Reconfigure(r) => state.on_reconfigure(r),
        CoordinatorMessage::CoMeasure(c) => vec![Action::CoMeasure(c)],
        CoordinatorMessage::Notice(text) => {
            // Authenticated (sealed in this agent's session), but shown
            // cleaned and cut: it goes to the operator's terminal.
            let shown: String = text
                .chars()
                .filter(|c| !c.is_control() && !tunefleet_common::is_invisible_format(*c))
                .take(tunefleet_common::message::MAX_NOTICE_BYTES)
                .collect();
            refused.notices += 1;
            if loud(refused.notices) {
                tracing::warn!(notices = refused.notices, "the coordinator says: {shown}");
            }
            Vec::new()
        }
        // `unbundle` leaves none.
        CoordinatorMessage::Bundle(_) => Vec::new(),
    }
}
