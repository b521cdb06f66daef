//! What one turn's apply stage may touch ([`Ctx`]): the engine's state,
//! the turn's store batch and what it queues to send.

use std::collections::{HashMap, HashSet};

use tunefleet_common::message::CoordinatorMessage;

use super::active::ActiveStudy;
use super::types::{EngineStats, Now};
use crate::domain::comeasure::CoMeasures;
use crate::domain::offload::LoadHistory;
use crate::domain::reuse::Book;
use crate::domain::sched::{Effect, Scheduler};
use crate::runtime::auth::Sessions;
use crate::store::Batch;

/// What handling a message may touch: the engine's state, borrowed for one
/// turn, with the turn's store batch and what it queues to send.
pub(super) struct Ctx<'a, 'b> {
    pub(super) sched: &'a mut Scheduler,
    pub(super) batch: &'a mut Batch<'b>,
    pub(super) studies: &'a mut HashMap<String, ActiveStudy>,
    pub(super) stats: &'a mut EngineStats,
    pub(super) agents_seen: &'a mut HashSet<String>,
    pub(super) out: &'a mut Vec<(String, CoordinatorMessage)>,
    pub(super) welcomes: &'a mut Vec<(String, Vec<u8>)>,
    pub(super) effects: &'a mut Vec<Effect>,
    pub(super) influx: bool,
    pub(super) sessions: &'a mut Sessions,
    pub(super) unsynced: &'a mut HashMap<String, u64>,
    pub(super) telemetry: &'a mut LoadHistory,
    /// The turn's clocks: the engine's for the scheduler, the wall clock
    /// for the store, the monotonic instant for the session limits.
    pub(super) now: Now,
    /// Measurements agents flag as disturbed are taken again (with offloading).
    pub(super) remeasure: bool,
    pub(super) book: &'a mut Book,
    /// Nodes measuring other agents' trials (`[measure] nodes`).
    pub(super) co: &'a mut CoMeasures,
}

impl Ctx<'_, '_> {
    /// What the dispatch reads ([`super::dispatch::decide`]): the state, shared.
    pub(super) fn view(&self) -> super::dispatch::EngineView<'_> {
        super::dispatch::EngineView {
            sched: self.sched,
            studies: self.studies,
            co: self.co,
            book: self.book,
            remeasure: self.remeasure,
            influx: self.influx,
        }
    }
}

/// Co-measurement steps ([`CoMeasures`]) as the messages that carry them.
pub(super) fn co_messages(
    sends: Vec<(String, tunefleet_common::message::CoMeasure)>,
) -> impl Iterator<Item = (String, CoordinatorMessage)> {
    sends.into_iter().map(|(node, m)| (node, CoordinatorMessage::CoMeasure(m)))
}
