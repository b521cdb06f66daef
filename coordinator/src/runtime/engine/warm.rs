//! What a study's start and the coordinator's heartbeat read beside the
//! turn: the results a study warm-starts from (`[warm_start]`), and the
//! embedded broker's counters the heartbeat carries to `status`.

use super::types::EngineError;
use crate::domain::search::Search;
use crate::domain::study::Study;
use crate::store::Store;

/// Tells `search` the results of the studies `study` warm-starts from
/// (`[warm_start]`): those of the same objective, each inside its space.
pub(super) fn warm_start(store: &Store, study: &Study, search: &mut Search) -> Result<(), EngineError> {
    use tunefleet_search::warm::WARM_ID_BASE;
    let mut told = 0u64;
    for name in &study.warm_start {
        let Some(other) = store.stored(name)?.and_then(|s| s.study()) else {
            tracing::warn!(study = %study.name, from = %name, "warm start: no such study in the store");
            continue;
        };
        if (&other.objective.metric, other.objective.direction) != (&study.objective.metric, study.objective.direction)
        {
            tracing::warn!(study = %study.name, from = %name, "warm start: another objective, nothing told");
            continue;
        }
        told += search.warm(study, &store.trials(name)?, WARM_ID_BASE + told);
    }
    if !study.warm_start.is_empty() {
        tracing::info!(study = %study.name, told, from = ?study.warm_start, "warm start: earlier results told to the search");
    }
    Ok(())
}

/// The embedded broker's counters now, as JSON (`None` without one): what
/// `tunefleet status --json` shows of it.
pub(super) fn broker_counters() -> Option<String> {
    let c = crate::runtime::broker::running_counters()?;
    let mut all: serde_json::Map<String, serde_json::Value> =
        c.snapshot().into_iter().map(|(name, _, _, v)| (name.to_string(), v.into())).collect();
    let logins: serde_json::Map<String, serde_json::Value> =
        c.by_kind().into_iter().map(|(k, n)| (k.to_string(), n.into())).collect();
    all.insert("logins".into(), logins.into());
    serde_json::to_string(&all).ok()
}
