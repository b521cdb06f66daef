//! `tunefleet status [STUDY] [--watch] [--json]`: where each study stands,
//! read from the store (a running service or run commits every turn, and
//! SQLite's WAL lets readers in while it writes), with the throughput and
//! the time left estimated between two looks.

use serde::Serialize;

use crate::store::{Store, StoreError, StudyState};

/// One study now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StudyStatus {
    pub study: String,
    pub state: String,
    pub total: u64,
    pub pending: u64,
    /// Trials running now on an agent's slots.
    pub running: u64,
    /// Trials held ahead on agents whose slots are busy (not running yet).
    pub held: u64,
    pub done: u64,
    pub failed: u64,
    pub stopped: u64,
    pub metric: String,
    /// The leading configuration's mean objective and its best run's trial
    /// (the one ranking rule, [`crate::domain::rank`]).
    pub best: Option<(f64, u64)>,
    /// How many ranked runs that mean is over.
    pub best_runs: u32,
    /// Whether the leader meets the study's `[[constraint]]`s (`None`: it
    /// has none, or nothing is ranked); it fails them only when no
    /// configuration meets them.
    pub best_feasible: Option<bool>,
    /// Bytes free on the store's disk (a coordinator pauses below its
    /// `--store-min-free-mib`).
    pub store_free_bytes: Option<u64>,
    /// Agents online now (the whole fleet's); 0 when no coordinator runs.
    pub live_agents: usize,
    /// Whether a coordinator is running on this store now (its heartbeat
    /// is recent and it did not say it stopped).
    pub coordinator_running: bool,
    /// Seconds since the coordinator's last heartbeat, when one ran.
    pub coordinator_seen_s: Option<f64>,
    /// Its failed trials grouped by why they failed, most frequent first.
    pub failures: Vec<(String, u64)>,
    /// Trials finished per minute since the previous look (`--watch`).
    pub per_minute: Option<f64>,
    /// Seconds left at that pace.
    pub eta_s: Option<f64>,
    /// The running coordinator's embedded broker, at its last heartbeat:
    /// connections by kind of login, refusals, denials, dropped copies,
    /// queued and retained bytes (the names of its `/metrics`).
    pub broker: Option<serde_json::Value>,
    /// Why it waits with agents online that cannot run it, when it does.
    pub waits: Option<String>,
}

impl StudyStatus {
    fn finished(&self) -> u64 {
        self.done + self.failed + self.stopped
    }
}

/// A coordinator whose heartbeat is older than this is gone (it beats
/// every [`crate::runtime::engine::core::BEAT_MS`]).
pub const STALE_MS: u64 = 10_000;

/// The trials `row`'s study counts against: a running (or interrupted)
/// study its budget as its search counts it (at least the trials it has),
/// read from the file the store kept; a finished (or cancelled) one the
/// trials it ran. `status` and the report both count this way.
pub fn planned(store: &Store, row: &crate::store::StudyRow) -> Result<u64, StoreError> {
    if row.state == StudyState::Finished {
        return Ok(row.total);
    }
    let study = store.stored(&row.name)?.and_then(|s| s.study());
    Ok(study.map_or(row.total, |s| crate::domain::search::Search::new(&s).planned().max(row.total)))
}

/// Every study (or `study` alone) as the store has it now, at `now_ms`
/// (Unix ms: to judge the coordinator's heartbeat).
pub fn snapshot(store: &Store, study: Option<&str>, now_ms: u64) -> Result<Vec<StudyStatus>, StoreError> {
    let beat = store.heartbeat()?;
    let coordinator_running =
        beat.as_ref().is_some_and(|b| b.stopped_ms.is_none() && now_ms.saturating_sub(b.at_ms) < STALE_MS);
    let paused = coordinator_running && beat.as_ref().is_some_and(|b| b.paused);
    let coordinator_seen_s = beat.as_ref().map(|b| now_ms.saturating_sub(b.at_ms) as f64 / 1000.0);
    let broker: Option<serde_json::Value> = beat
        .as_ref()
        .filter(|_| coordinator_running)
        .and_then(|b| b.broker.as_deref())
        .and_then(|j| serde_json::from_str(j).ok());
    let waits: serde_json::Map<String, serde_json::Value> = beat
        .as_ref()
        .filter(|_| coordinator_running)
        .and_then(|b| b.waits.as_deref())
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default();
    let live_agents = if coordinator_running { store.agents()?.iter().filter(|a| a.online).count() } else { 0 };
    let store_free_bytes = crate::runtime::disk::free_bytes(std::path::Path::new(store.path()));
    let mut out = Vec::new();
    for s in store.studies()? {
        if study.is_some_and(|n| n != s.name) {
            continue;
        }
        let leader = store.best(&s.name, 1)?;
        let best = leader.first().map(|b| (b.mean, b.plan.trial));
        let best_runs = leader.first().map_or(0, |b| b.runs);
        let best_feasible = leader.first().filter(|b| b.result.violation.is_some()).map(|b| b.feasible());
        let stopped = s.total.saturating_sub(s.pending + s.running + s.done + s.failed);
        let total = planned(store, &s)?;
        let failures = if s.failed > 0 { store.failure_causes(&s.name)? } else { Vec::new() };
        let waits = waits.get(&s.name).and_then(|w| w.as_str()).map(str::to_string);
        out.push(StudyStatus {
            study: s.name,
            state: match s.state {
                // Its coordinator waits for room on the store's disk.
                StudyState::Running if paused => "paused",
                StudyState::Running if coordinator_running => "running",
                // Its coordinator stopped or died before it finished.
                StudyState::Running => "interrupted",
                StudyState::Finished => "finished",
            }
            .to_string(),
            total,
            pending: s.pending,
            running: s.running.saturating_sub(s.held),
            held: s.held,
            done: s.done,
            failed: s.failed,
            stopped,
            metric: s.metric,
            best,
            best_runs,
            best_feasible,
            store_free_bytes,
            live_agents,
            coordinator_running,
            coordinator_seen_s,
            failures,
            per_minute: None,
            eta_s: None,
            broker: broker.clone(),
            waits,
        });
    }
    Ok(out)
}

/// Fills the pace of `now` from `before`, `seconds` earlier.
pub fn pace(before: &[StudyStatus], now: &mut [StudyStatus], seconds: f64) {
    if seconds <= 0.0 {
        return;
    }
    for s in now.iter_mut() {
        let Some(b) = before.iter().find(|b| b.study == s.study) else { continue };
        if s.state != "running" {
            // A finished or interrupted study has no pace.
            continue;
        }
        let per_minute = s.finished().saturating_sub(b.finished()) as f64 / seconds * 60.0;
        s.per_minute = Some(per_minute);
        let left = s.total.saturating_sub(s.finished());
        s.eta_s = (per_minute > 0.0 && s.state == "running").then(|| left as f64 / per_minute * 60.0);
    }
}

/// How far back the pace of `status --watch` looks: long enough that a
/// trial ending every few seconds gives a steady figure, short enough to
/// follow a change of pace.
pub const PACE_WINDOW_S: f64 = 30.0;

/// The pace over a sliding window of looks (from the previous
/// look alone, one second before, it flipped between a rate and 0.0 as
/// trials ended between looks).
#[derive(Debug, Default)]
pub struct Pacer {
    /// Earlier looks, oldest first: when (seconds on any clock) and what.
    looks: std::collections::VecDeque<(f64, Vec<StudyStatus>)>,
}

impl Pacer {
    /// Fills the pace of `now`, seen at `at_s`, from the oldest look within
    /// [`PACE_WINDOW_S`] (the newest older one while none is), and keeps it.
    pub fn look(&mut self, at_s: f64, now: &mut [StudyStatus]) {
        while self.looks.len() > 1 && self.looks.get(1).is_some_and(|(t, _)| at_s - t >= PACE_WINDOW_S) {
            self.looks.pop_front();
        }
        if let Some((t, before)) = self.looks.front() {
            pace(before, now, at_s - t);
        }
        self.looks.push_back((at_s, now.to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One look a second, a trial ending every 1.5 s:
    /// the pace no longer flips between 60 and 0 trials a minute.
    #[test]
    fn regression_the_watched_pace_is_steady_when_trials_end_between_looks() {
        let mut p = Pacer::default();
        let mut paces = Vec::new();
        for second in 0..90u64 {
            let mut now = vec![row(second * 2 / 3, "running")];
            p.look(second as f64, &mut now);
            if second >= 40 {
                paces.push(now[0].per_minute.expect("a pace"));
            }
        }
        let (lo, hi) = paces.iter().fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        assert!(lo > 36.0 && hi < 44.0, "about 40 a minute, steadily: {lo} to {hi}");
        // The previous look alone flips.
        let (mut a, mut b) = (vec![row(10, "running")], vec![row(10, "running")]);
        pace(&a.clone(), &mut b, 1.0);
        assert_eq!(b[0].per_minute, Some(0.0));
        pace(&[row(9, "running")], &mut a, 1.0);
        assert_eq!(a[0].per_minute, Some(60.0));
    }

    fn row(done: u64, state: &str) -> StudyStatus {
        StudyStatus {
            study: "s".into(),
            state: state.into(),
            total: 100,
            pending: 100 - done,
            running: 0,
            held: 0,
            done,
            failed: 0,
            stopped: 0,
            metric: "loss".into(),
            best: Some((0.5, 3)),
            best_runs: 1,
            best_feasible: None,
            store_free_bytes: None,
            live_agents: 2,
            coordinator_running: true,
            coordinator_seen_s: Some(1.0),
            failures: Vec::new(),
            per_minute: None,
            eta_s: None,
            broker: None,
            waits: None,
        }
    }

    #[test]
    fn pace_and_time_left_between_two_looks() {
        let before = vec![row(10, "running")];
        let mut now = vec![row(20, "running")];
        pace(&before, &mut now, 30.0);
        assert_eq!(now[0].per_minute, Some(20.0));
        assert_eq!(now[0].eta_s, Some(240.0), "80 left at 20 a minute");
        let mut finished = vec![row(100, "finished")];
        pace(&before, &mut finished, 30.0);
        assert_eq!((finished[0].per_minute, finished[0].eta_s), (None, None), "no pace once finished");
        let mut stalled = vec![row(10, "running")];
        pace(&before, &mut stalled, 30.0);
        assert_eq!(stalled[0].eta_s, None, "no pace, no estimate");
    }
}
