//! An attempt's life in the store: its assignment, and the result that
//! ends it (accepted once a trial, a duplicate, or superseded).

use tunefleet_common::measurement::Measurement;
use tunefleet_common::message::TrialRef;

use super::batch::json_text;
use super::batch::RecordOutcome;
use super::sql::{params, Optional};
use super::{exit_text, to_i64, Batch, Result, Score, SqlContext, StoreError, TrialState, ROW_BYTES};

impl Batch<'_> {
    /// Marks `trial` running as attempt `trial.attempt` on `agent`. Earlier
    /// attempts still open are closed as reassigned.
    pub fn record_assignment(&mut self, trial: &TrialRef, agent: &str, at_ms: u64) -> Result<()> {
        self.record_assignment_held(trial, agent, at_ms, false)
    }

    /// [`Batch::record_assignment`] of an attempt `held` ahead of its
    /// agent's busy slots (until [`Batch::set_held`] says it started).
    pub fn record_assignment_held(&mut self, trial: &TrialRef, agent: &str, at_ms: u64, held: bool) -> Result<()> {
        let context = || format!("recording the assignment of {trial} to {agent}");
        let id = to_i64("trial", trial.trial)?;
        let at = to_i64("time", at_ms)?;
        // One statement: a trial that ended is left as it is, and said why.
        let running = self
            .tx
            .prepare_cached(
                "UPDATE trials SET state = 'running', attempts = ?3
                 WHERE study = ?1 AND trial = ?2 AND state NOT IN ('done', 'failed', 'stopped')",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt])
            .ctx(context)?;
        if running == 0 {
            let (state, _) = self.trial_state(trial)?;
            return Err(StoreError::TrialClosed { study: trial.study.clone(), trial: trial.trial, state });
        }
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?4, outcome = 'reassigned'
                 WHERE study = ?1 AND trial = ?2 AND attempt <> ?3 AND ended_ms IS NULL",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, at])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "INSERT INTO attempts (study, trial, attempt, agent, assigned_ms, ended_ms, outcome, superseded, held)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL, NULL, 0, ?6)
                 ON CONFLICT (study, trial, attempt) DO UPDATE SET
                     agent = excluded.agent, assigned_ms = excluded.assigned_ms,
                     ended_ms = NULL, outcome = NULL, superseded = 0, held = excluded.held",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, agent, at, held])
            .ctx(context)?;
        Ok(())
    }

    /// Records the measurement of one attempt; at most one result per trial
    /// is ever accepted. An accepted result makes the trial `done` when the
    /// workload exited with status 0 and `failed` otherwise (an engine that
    /// wants to retry a failed run calls [`Batch::requeue`] instead). A trial
    /// failed without a result ([`Batch::fail_trial`]) still takes the late
    /// result of an attempt it had.
    pub fn record_result(
        &mut self,
        trial: &TrialRef,
        agent: &str,
        measurement: &Measurement,
        score: impl Into<Score>,
        at_ms: u64,
    ) -> Result<RecordOutcome> {
        let context = || format!("recording the result of {trial} from {agent}");
        let id = to_i64("trial", trial.trial)?;
        let at = to_i64("time", at_ms)?;
        let exit = exit_text(&measurement.exit);

        // In one statement (one round trip on a server): the attempt whose
        // result the trial has, if any, and whether this agent was handed
        // this attempt; no row for an unknown trial, an error.
        let (accepted, held): (Option<u32>, bool) = self
            .tx
            .prepare_cached(
                "SELECT (SELECT attempt FROM results WHERE study = ?1 AND trial = ?2),
                        EXISTS(SELECT 1 FROM attempts WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?4)
                 FROM trials WHERE study = ?1 AND trial = ?2",
            )
            .ctx(context)?
            .query_row(params![trial.study, id, trial.attempt, agent], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
            .ctx(context)?
            .ok_or_else(|| StoreError::UnknownTrial { study: trial.study.clone(), trial: trial.trial })?;
        if accepted == Some(trial.attempt) {
            return Ok(RecordOutcome::Duplicate);
        }
        // Any attempt really handed to this agent may complete a trial that has
        // no result yet, a trial failed because its attempts ran out included (a
        // result that arrives after its agent was presumed dead is still a good
        // result); everything after that is superseded.
        if accepted.is_some() || !held {
            self.supersede(trial, agent, &exit, at)?;
            return Ok(RecordOutcome::Superseded);
        }
        self.accept(trial, agent, measurement, score.into(), at)?;
        Ok(RecordOutcome::Stored)
    }

    /// Keeps a result [`Batch::record_result`] does not accept on its
    /// attempt (one it creates when the agent never held it), superseded,
    /// with the attempt's `exit`.
    fn supersede(&mut self, trial: &TrialRef, agent: &str, exit: &str, at: i64) -> Result<()> {
        let context = || format!("recording the result of {trial} from {agent}");
        let id = to_i64("trial", trial.trial)?;
        self.tx
            .prepare_cached(
                "INSERT OR IGNORE INTO attempts (study, trial, attempt, agent, assigned_ms, superseded)
                 VALUES (?1, ?2, ?3, ?4, ?5, 1)",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, agent, at])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET superseded = 1, ended_ms = COALESCE(ended_ms, ?4),
                     outcome = COALESCE(outcome || '; ', '') || 'superseded result: ' || ?5
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?6 AND superseded = 0",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, at, exit, agent])
            .ctx(context)?;
        Ok(())
    }

    /// Stores the result [`Batch::record_result`] accepts: the trial is
    /// `done` or `failed` (with why), its attempt ended, any newer attempt
    /// still open cancelled.
    fn accept(
        &mut self,
        trial: &TrialRef,
        agent: &str,
        measurement: &Measurement,
        score: Score,
        at: i64,
    ) -> Result<()> {
        let context = || format!("recording the result of {trial} from {agent}");
        let id = to_i64("trial", trial.trial)?;
        let exit = exit_text(&measurement.exit);
        let success = measurement.exit.success();
        let objective = score.objective.filter(|v| v.is_finite());
        // A violation without end (a figure missing) is kept as the largest number.
        let violation = score.violation.map(|v| v.min(f64::MAX));
        let json =
            serde_json::to_string(measurement).map_err(|source| StoreError::Json { context: context(), source })?;
        self.written += ROW_BYTES + json.len() as u64;
        // The trial's whole energy (its CPU share and its GPUs'), and the GPUs' apart.
        let energy = measurement.energy_figure();
        let joules = energy.joules.filter(|j| j.is_finite());
        let gpu_joules = measurement.gpu_joules().filter(|j| j.is_finite());
        let system = score.system.as_ref().map(|s| json_text(s, context)).transpose()?;
        self.tx
            .prepare_cached(
                "INSERT INTO results (study, trial, attempt, agent, success, objective, wall_us, user_us, sys_us,
                     max_rss_kib, exit, energy_j, energy_source, energy_valid, measurement, received_ms, gpu_energy_j,
                     violation, system)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
            )
            .ctx(context)?
            .write(params![
                trial.study,
                id,
                trial.attempt,
                agent,
                success,
                objective,
                to_i64("wall_us", measurement.wall_us)?,
                to_i64("user_us", measurement.user_us)?,
                to_i64("sys_us", measurement.sys_us)?,
                to_i64("max_rss_kib", measurement.max_rss_kib)?,
                exit,
                joules,
                measurement.energy.source.as_str(),
                energy.valid,
                json,
                at,
                gpu_joules,
                violation,
                system
            ])
            .ctx(context)?;
        // A failed trial keeps why, in words a user can act on (its exit and last line).
        let cause = (!success).then(|| crate::domain::failure::cause(&measurement.exit, &measurement.log_tail));
        let (new_state, reason) =
            if success { (TrialState::Done, None) } else { (TrialState::Failed, cause.as_deref()) };
        self.tx
            // A trial stopped early stays stopped: its result is kept for the record.
            .prepare_cached(
                "UPDATE trials SET state = ?3, reason = ?4 WHERE study = ?1 AND trial = ?2 AND state != 'stopped'",
            )
            .ctx(context)?
            .write(params![trial.study, id, new_state.as_str(), reason])
            .ctx(context)?;
        // This attempt ends with its exit; another still open is cancelled:
        // this result came first. One statement.
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?4,
                     outcome = CASE WHEN attempt = ?3 THEN ?5 ELSE 'cancelled: attempt ' || ?3 || ' delivered first' END
                 WHERE study = ?1 AND trial = ?2 AND (attempt = ?3 OR ended_ms IS NULL)",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, at, exit])
            .ctx(context)?;
        Ok(())
    }
}
