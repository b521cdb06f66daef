//! Read queries over a store: studies, trials, attempts, results, the best
//! and unranked results, progress and agents.

use super::sql::{self, params, Conn, Optional, Row};
use serde::Serialize;
use tunefleet_common::measurement::{EnergyFigure, Measurement};
use tunefleet_common::message::{AgentInfo, TrialRef};

use super::record::{outcome, outcome_cols, plan, record, record_select, Measured};
use super::{
    bad_text, energy_cols, get_opt_u64, get_u64, json_col, to_i64, trial_state, Result, SqlContext, Store, StoreError,
    StudyState, TrialState,
};
use crate::domain::study::Direction;
use crate::domain::trial::{Ranked, TrialRecord};

/// A study as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StudyRow {
    pub name: String,
    /// The study file text it was created from.
    pub config: String,
    pub metric: String,
    pub direction: Direction,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
    pub state: StudyState,
    /// Trials of the study, repeats included.
    pub total: u64,
    pub pending: u64,
    /// Trials given to an agent, held ahead included.
    pub running: u64,
    /// Of those, the ones waiting on their agent behind busy slots.
    pub held: u64,
    pub done: u64,
    pub failed: u64,
}

/// Counts of a study's trials by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TrialCounts {
    pub pending: u64,
    pub running: u64,
    pub done: u64,
    pub failed: u64,
    pub stopped: u64,
}

impl TrialCounts {
    pub fn total(&self) -> u64 {
        self.pending + self.running + self.done + self.failed + self.stopped
    }
}

/// One attempt of a trial.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRow {
    pub trial: u64,
    pub attempt: u32,
    pub agent: String,
    pub assigned_ms: u64,
    pub ended_ms: Option<u64>,
    pub outcome: Option<String>,
    pub superseded: bool,
}

/// Whether a result of a study optimising `metric` is left out of the
/// ranking for its energy: an `energy` study ranks only energy that counts
/// (stores written before objectives left invalid readings out hold their
/// joules as the objective anyway).
fn energy_left_out(metric: &str, energy: EnergyFigure) -> bool {
    metric == "energy" && energy.counted().is_none()
}

/// Successful results [`Store::best`] does not rank (see [`Store::unranked`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Unranked {
    /// The objective is `energy` and the energy reading is invalid (a
    /// battery charging or on external power, a zone that vanished...).
    pub invalid_energy: u64,
    /// No value for the objective (the workload did not report the metric).
    pub no_value: u64,
}

impl Unranked {
    pub fn total(&self) -> u64 {
        self.invalid_energy + self.no_value
    }
}

/// One epoch report as stored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgressRow {
    pub trial: u64,
    pub attempt: u32,
    pub epoch: u32,
    pub metrics: tunefleet_common::measurement::Metrics,
    pub checkpoint: Option<String>,
}

/// An agent the coordinator has seen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgentRow {
    pub name: String,
    pub info: AgentInfo,
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    pub online: bool,
    /// Its latest telemetry, when it sent any.
    pub telemetry: Option<tunefleet_common::measurement::Telemetry>,
    /// Attempts it runs now, as `study/trial#attempt`.
    pub running: Vec<String>,
    /// Attempts it holds ahead of its busy slots, not started yet.
    pub held: Vec<String>,
    /// Trials it lost before they started (offline, restarted, or their
    /// lease ran out while it held them): none counted a failure, and each
    /// loss halved what it may hold at once.
    pub lost_held: u64,
}

impl Store {
    /// Every study, oldest first.
    pub fn studies(&self) -> Result<Vec<StudyRow>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("{STUDY_SELECT} ORDER BY s.created_ms, s.name"))
            .ctx(|| "listing studies".into())?;
        let rows = stmt.query_map((), study_row).ctx(|| "listing studies".into())?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(|| "listing studies".into())
    }

    /// One study, if it exists.
    pub fn study(&self, name: &str) -> Result<Option<StudyRow>> {
        study_by_name(&self.conn, name)
    }

    /// What each agent's results and progress take of `study`'s store, as
    /// [`Batch::written`] counts it: the shares a restarted coordinator
    /// goes on from.
    pub fn written_by_agent(&self, study: &str) -> Result<Vec<(String, u64)>> {
        let context = || format!("reading what agents wrote to study {study:?}");
        let row = super::ROW_BYTES;
        let sql = format!(
            "SELECT agent, SUM(n) FROM (
                 SELECT agent, {row} + LENGTH(measurement) AS n FROM results WHERE study = ?1
                 UNION ALL
                 SELECT a.agent, {row} + LENGTH(p.metrics) + IFNULL(LENGTH(p.checkpoint), 0)
                 FROM progress p JOIN attempts a
                   ON a.study = p.study AND a.trial = p.trial AND a.attempt = p.attempt
                 WHERE p.study = ?1) AS written
             GROUP BY agent"
        );
        let mut stmt = self.conn.prepare_cached(&sql).ctx(context)?;
        let rows = stmt.query_map([study], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))).ctx(context)?;
        let rows = rows.collect::<sql::Result<Vec<_>>>().ctx(context)?;
        Ok(rows.into_iter().map(|(agent, n)| (agent, u64::try_from(n).unwrap_or(0))).collect())
    }

    /// Every trial of `study`, by trial id, with its accepted result's
    /// figures (not its measurement).
    pub fn trials(&self, study: &str) -> Result<Vec<TrialRecord>> {
        self.trials_read(study, Measured::Without)
    }

    /// Trials without a final outcome (pending or running), by trial id: what
    /// a resumed study still has to run. Running trials were interrupted;
    /// `Batch::reset_running` turns them back into pending ones.
    pub fn pending_trials(&self, study: &str) -> Result<Vec<TrialRecord>> {
        self.records(study, Measured::Without, "AND t.state IN ('pending', 'running') ORDER BY t.trial")
    }

    /// The records of `study` [`record_select`] reads, `rest` (conditions
    /// and an order) after its own.
    pub(super) fn records(&self, study: &str, measured: Measured, rest: &str) -> Result<Vec<TrialRecord>> {
        let context = || format!("reading trials of study {study:?}");
        let mut stmt = self.conn.prepare_cached(&format!("{} {rest}", record_select(measured))).ctx(context)?;
        let rows = stmt.query_map([study], record).ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// How many trials of `study` are in each state.
    pub fn trial_counts(&self, study: &str) -> Result<TrialCounts> {
        let context = || format!("counting trials of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached("SELECT state, COUNT(*) FROM trials WHERE study = ?1 GROUP BY state")
            .ctx(context)?;
        let rows = stmt.query_map([study], |row| Ok((trial_state(row, 0)?, get_u64(row, 1)?))).ctx(context)?;
        let mut counts = TrialCounts::default();
        for row in rows {
            let (state, n) = row.ctx(context)?;
            match state {
                TrialState::Pending => counts.pending = n,
                TrialState::Running => counts.running = n,
                TrialState::Done => counts.done = n,
                TrialState::Failed => counts.failed = n,
                TrialState::Stopped => counts.stopped = n,
            }
        }
        Ok(counts)
    }

    /// Every attempt of one trial, in order.
    pub fn attempts(&self, study: &str, trial: u64) -> Result<Vec<AttemptRow>> {
        let context = || format!("reading attempts of {study}/{trial}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT trial, attempt, agent, assigned_ms, ended_ms, outcome, superseded
                 FROM attempts WHERE study = ?1 AND trial = ?2 ORDER BY attempt",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map(params![study, to_i64("trial", trial)?], |row| {
                Ok(AttemptRow {
                    trial: get_u64(row, "trial")?,
                    attempt: row.get("attempt")?,
                    agent: row.get("agent")?,
                    assigned_ms: get_u64(row, "assigned_ms")?,
                    ended_ms: get_opt_u64(row, "ended_ms")?,
                    outcome: row.get("outcome")?,
                    superseded: row.get("superseded")?,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// Each successful result's objective and whether it meets the study's
    /// constraints, `(trial, value, feasible)` by trial: what a history
    /// chart draws, without the measurements.
    pub fn objective_points(&self, study: &str) -> Result<Vec<(u64, f64, bool)>> {
        let context = || format!("reading the objective of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT trial, objective, COALESCE(violation, 0) <= 0 FROM results
                 WHERE study = ?1 AND success = 1 AND objective IS NOT NULL ORDER BY trial",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map(params![study], |r| Ok((get_u64(r, "trial")?, r.get::<_, f64>(1)?, r.get(2)?)))
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// The learning curves of `study`'s last `last` trials that reported
    /// epochs: `metric` epoch by epoch, of each trial's latest attempt.
    pub fn learning_curves(&self, study: &str, metric: &str, last: u64) -> Result<Vec<Curve>> {
        let context = || format!("reading the learning curves of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT trial, attempt, epoch, metrics FROM progress
                 WHERE study = ?1 AND trial > (SELECT MAX(trial) FROM progress WHERE study = ?1) - ?2
                 ORDER BY trial, attempt, epoch",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map(params![study, to_i64("trials", last)?], |r| {
                let metrics: tunefleet_common::measurement::Metrics = json_col(r, 3)?;
                Ok((get_u64(r, "trial")?, r.get::<_, u32>(1)?, r.get::<_, u32>(2)?, metrics.get(metric).copied()))
            })
            .ctx(context)?;
        // Each trial's curve with the attempt it is of.
        let mut curves: Vec<(u32, Curve)> = Vec::new();
        for row in rows {
            let (trial, attempt, epoch, value) = row.ctx(context)?;
            let Some(v) = value else { continue };
            let point = (f64::from(epoch), v);
            match curves.last_mut() {
                Some((a, c)) if c.0 == trial && *a == attempt => c.1.push(point),
                // A later attempt of the same trial replaces the earlier one's curve.
                Some(last) if last.1 .0 == trial => *last = (attempt, (trial, vec![point])),
                _ => curves.push((attempt, (trial, vec![point]))),
            }
        }
        Ok(curves.into_iter().map(|(_, c)| c).collect())
    }

    /// Every trial of `study` with an accepted result, by trial id, with
    /// the result's measurement.
    pub fn results(&self, study: &str) -> Result<Vec<TrialRecord>> {
        self.records(study, Measured::With, "AND r.trial IS NOT NULL ORDER BY t.trial")
    }

    /// The `n` best successful results with an objective, by the one
    /// ranking rule ([`crate::domain::rank`]: configurations by the mean of
    /// their runs, each configuration's runs best first). In an `energy`
    /// study only valid energy readings are ranked (stores written before
    /// objectives left invalid readings out hold their joules anyway);
    /// [`Store::unranked`] counts what was left out.
    pub fn best(&self, study: &str, n: usize) -> Result<Vec<Ranked>> {
        let row = self.study(study)?.ok_or_else(|| StoreError::UnknownStudy(study.to_string()))?;
        let context = || format!("reading the best results of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT r.trial, t.repeat, t.params, {}
                 FROM results r JOIN trials t ON t.study = r.study AND t.trial = r.trial
                 WHERE r.study = ?1 AND r.success = 1 AND r.objective IS NOT NULL
                 ORDER BY r.trial ASC",
                outcome_cols(Measured::Without)
            ))
            .ctx(context)?;
        let rows = stmt
            .query_map(params![study], |row| {
                let result = outcome(row)?.ok_or_else(|| bad_text(row, "result_attempt", "result", "NULL"))?;
                Ok(Ranked { plan: plan(row)?, result, runs: 1, mean: 0.0, mean_violation: 0.0 })
            })
            .ctx(context)?;
        let mut rows = rows.collect::<sql::Result<Vec<_>>>().ctx(context)?;
        rows.retain(|r| !energy_left_out(&row.metric, r.energy()));
        let keyed: Vec<(String, u64, f64, f64)> = rows
            .iter()
            .map(|r| {
                (super::params_json(&r.plan.params), r.plan.trial, r.objective(), r.result.violation.unwrap_or(0.0))
            })
            .collect();
        let order = crate::domain::rank::rank(row.direction, &keyed);
        let mut slots: Vec<Option<Ranked>> = rows.into_iter().map(Some).collect();
        Ok(order
            .into_iter()
            .take(n)
            .filter_map(|(i, standing)| {
                let mut r = slots.get_mut(i)?.take()?;
                r.runs = standing.runs;
                r.mean = standing.mean;
                r.mean_violation = standing.violation;
                Some(r)
            })
            .collect())
    }

    /// Successful results of `study` that [`Store::best`] leaves out, by why.
    pub fn unranked(&self, study: &str) -> Result<Unranked> {
        let row = self.study(study)?.ok_or_else(|| StoreError::UnknownStudy(study.to_string()))?;
        let context = || format!("counting the unranked results of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT objective IS NULL AS no_value, energy_j, energy_valid FROM results
                 WHERE study = ?1 AND success = 1",
            )
            .ctx(context)?;
        let rows =
            stmt.query_map(params![study], |r| Ok((r.get::<_, bool>("no_value")?, energy_cols(r)?))).ctx(context)?;
        let mut unranked = Unranked::default();
        for r in rows {
            let (no_value, energy) = r.ctx(context)?;
            if energy_left_out(&row.metric, energy) {
                unranked.invalid_energy += 1;
            } else if no_value {
                unranked.no_value += 1;
            }
        }
        Ok(unranked)
    }

    /// The coordinator's last heartbeat (Unix ms), when it stopped cleanly,
    /// and whether it was paused for room on the store's disk; `None` when
    /// no coordinator ever ran on this store.
    pub fn heartbeat(&self) -> Result<Option<Heartbeat>> {
        let context = || "reading the coordinator's heartbeat".to_string();
        self.conn
            .prepare_cached("SELECT beat_ms, stopped_ms, paused, broker, waits FROM heartbeat WHERE id = 1")
            .ctx(context)?
            .query_row((), |r| {
                Ok(Heartbeat {
                    at_ms: get_u64(r, 0)?,
                    stopped_ms: r.get::<_, Option<i64>>(1)?.and_then(|v| u64::try_from(v).ok()),
                    paused: r.get::<_, Option<bool>>(2)?.unwrap_or(false),
                    broker: r.get::<_, Option<String>>(3)?,
                    waits: r.get::<_, Option<String>>(4)?,
                })
            })
            .optional()
            .ctx(context)
    }

    /// How `study` changed since it was created (a larger budget), as
    /// `(when, what)`, oldest first.
    pub fn study_changes(&self, study: &str) -> Result<Vec<(u64, String)>> {
        let context = || format!("reading the changes of {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached("SELECT at_ms, change FROM study_changes WHERE study = ?1 ORDER BY at_ms, rowid")
            .ctx(context)?;
        let rows = stmt.query_map([study], |r| Ok((get_u64(r, 0)?, r.get(1)?))).ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// The failed trials of `study` grouped by why they failed (the
    /// reason the store kept: see [`crate::domain::failure::cause`]), most
    /// frequent first.
    pub fn failure_causes(&self, study: &str) -> Result<Vec<(String, u64)>> {
        let context = || format!("reading why the trials of {study:?} failed");
        let mut stmt = self
            .conn
            .prepare_cached("SELECT reason, COUNT(*) FROM trials WHERE study = ?1 AND state = 'failed' GROUP BY reason")
            .ctx(context)?;
        let rows = stmt.query_map([study], |r| Ok((r.get::<_, Option<String>>(0)?, get_u64(r, 1)?))).ctx(context)?;
        Ok(crate::domain::failure::group(rows.collect::<sql::Result<Vec<_>>>().ctx(context)?))
    }

    /// The metrics that successful trials of `study` without a value for
    /// the objective did report (final and epoch metrics, from at most 50
    /// of them): what to compare with the metric the study expects.
    pub fn metrics_without_objective(&self, study: &str) -> Result<std::collections::BTreeSet<String>> {
        let context = || format!("reading the metrics of the unranked trials of {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT measurement FROM results WHERE study = ?1 AND success = 1 AND objective IS NULL LIMIT 50",
            )
            .ctx(context)?;
        let texts = stmt.query_map([study], |r| r.get::<_, String>(0)).ctx(context)?;
        let mut seen = std::collections::BTreeSet::new();
        for text in texts {
            let Ok(m) = serde_json::from_str::<Measurement>(&text.ctx(context)?) else { continue };
            seen.extend(m.final_metrics.keys().cloned());
            for e in &m.epochs {
                seen.extend(e.metrics.keys().cloned());
            }
        }
        Ok(seen)
    }

    /// Progress reports of one attempt, by epoch: `(epoch, elapsed_us, metrics)`.
    pub fn progress(&self, trial: &TrialRef) -> Result<Vec<(u32, u64, tunefleet_common::measurement::Metrics)>> {
        let context = || format!("reading progress of {trial}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT epoch, elapsed_us, metrics FROM progress
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3 ORDER BY epoch",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map(params![trial.study, to_i64("trial", trial.trial)?, trial.attempt], |row| {
                Ok((row.get(0)?, get_u64(row, 1)?, json_col(row, 2)?))
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// Every epoch report of `study`: `(trial, attempt, epoch, metrics,
    /// checkpoint)`, by trial, attempt and epoch (what early stopping and
    /// moved trials need again after a restart).
    pub fn study_progress(&self, study: &str) -> Result<Vec<ProgressRow>> {
        let context = || format!("reading the progress of {study}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT trial, attempt, epoch, metrics, checkpoint FROM progress
                 WHERE study = ?1 ORDER BY trial, attempt, epoch",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map([study], |row| {
                Ok(ProgressRow {
                    trial: get_u64(row, "trial")?,
                    attempt: row.get("attempt")?,
                    epoch: row.get("epoch")?,
                    metrics: json_col(row, "metrics")?,
                    checkpoint: row.get("checkpoint")?,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// Every agent seen, by name.
    pub fn agents(&self) -> Result<Vec<AgentRow>> {
        let context = || "listing agents".to_string();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT a.name, a.info, a.first_seen_ms, a.last_seen_ms, a.online, a.telemetry,
                        (SELECT group_concat(t.study || '/' || t.trial || '#' || t.attempts, ' ') FROM trials t
                         JOIN attempts x ON x.study = t.study AND x.trial = t.trial AND x.attempt = t.attempts
                         WHERE t.state = 'running' AND x.agent = a.name AND x.ended_ms IS NULL AND x.held = 0)
                            AS running,
                        (SELECT group_concat(t.study || '/' || t.trial || '#' || t.attempts, ' ') FROM trials t
                         JOIN attempts x ON x.study = t.study AND x.trial = t.trial AND x.attempt = t.attempts
                         WHERE t.state = 'running' AND x.agent = a.name AND x.ended_ms IS NULL AND x.held = 1)
                            AS held,
                        COALESCE((SELECT e.lost_held FROM agent_enrolment e WHERE e.name = a.name), 0) AS lost_held
                 FROM agents a ORDER BY a.name",
            )
            .ctx(context)?;
        let rows = stmt
            .query_map((), |row| {
                Ok(AgentRow {
                    name: row.get("name")?,
                    info: json_col(row, "info")?,
                    first_seen_ms: get_u64(row, "first_seen_ms")?,
                    last_seen_ms: get_u64(row, "last_seen_ms")?,
                    online: row.get("online")?,
                    telemetry: row
                        .get::<_, Option<String>>("telemetry")?
                        .and_then(|text| serde_json::from_str(&text).ok()),
                    running: words(row.get("running")?),
                    held: words(row.get("held")?),
                    lost_held: get_u64(row, "lost_held")?,
                })
            })
            .ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }
}

/// A trial's learning curve: its number, and `(epoch, value)` by epoch.
pub type Curve = (u64, Vec<(f64, f64)>);

/// A space-separated list, as `group_concat` makes one.
fn words(text: Option<String>) -> Vec<String> {
    text.map(|t| t.split(' ').map(str::to_string).collect()).unwrap_or_default()
}

const STUDY_SELECT: &str = "SELECT s.name, s.config, s.metric, s.direction, s.created_ms, s.finished_ms, s.state,
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name) AS total,
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'pending') AS pending,
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'running') AS running,
        (SELECT COUNT(*) FROM trials t JOIN attempts x ON x.study = t.study AND x.trial = t.trial
             AND x.attempt = t.attempts
         WHERE t.study = s.name AND t.state = 'running' AND x.held = 1 AND x.ended_ms IS NULL) AS held,
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'done') AS done,
        (SELECT COUNT(*) FROM trials t WHERE t.study = s.name AND t.state = 'failed') AS failed
    FROM studies s";

fn study_row(row: &Row<'_>) -> sql::Result<StudyRow> {
    let direction: String = row.get("direction")?;
    let state: String = row.get("state")?;
    Ok(StudyRow {
        name: row.get("name")?,
        config: row.get("config")?,
        metric: row.get("metric")?,
        direction: Direction::parse(&direction).ok_or_else(|| bad_text(row, "direction", "direction", &direction))?,
        created_ms: get_u64(row, "created_ms")?,
        finished_ms: get_opt_u64(row, "finished_ms")?,
        state: StudyState::parse(&state).ok_or_else(|| bad_text(row, "state", "study state", &state))?,
        total: get_u64(row, "total")?,
        pending: get_u64(row, "pending")?,
        running: get_u64(row, "running")?,
        held: get_u64(row, "held")?,
        done: get_u64(row, "done")?,
        failed: get_u64(row, "failed")?,
    })
}

pub(super) fn study_by_name(conn: &Conn, name: &str) -> Result<Option<StudyRow>> {
    let context = || format!("reading study {name:?}");
    conn.prepare_cached(&format!("{STUDY_SELECT} WHERE s.name = ?1"))
        .ctx(context)?
        .query_row([name], study_row)
        .optional()
        .ctx(context)
}

/// The coordinator's last heartbeat, as `status` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// When it last beat (Unix ms).
    pub at_ms: u64,
    /// When it stopped cleanly, if it did.
    pub stopped_ms: Option<u64>,
    /// Paused for room on the store's disk at that beat.
    pub paused: bool,
    /// Its embedded broker's counters at that beat (JSON), when it ran one.
    pub broker: Option<String>,
    /// Why its studies waited at that beat (JSON, study -> reason).
    pub waits: Option<String>,
}
