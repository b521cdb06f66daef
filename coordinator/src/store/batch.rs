//! The write batch: creating studies, recording assignments, results,
//! progress, requeues and failures, and the agents seen.

use super::sql::{self, params, Optional, ToSql};
use tunefleet_common::measurement::Measurement;
use tunefleet_common::message::{AgentInfo, Progress, TrialRef};

use super::{
    params_json, to_i64, trial_state, unix_ms, Batch, Result, SqlContext, Store, StoreError, TrialState, ROW_BYTES,
};
use crate::domain::search::TrialPlan;
use crate::domain::study::{Opening, Study};

/// What [`Batch::open_study`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StudyOpened {
    /// A new study.
    Created,
    /// The study existed with the same configuration; its rows are kept.
    Resumed,
}

/// What [`Batch::record_result`] did with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    /// The trial's one accepted result.
    Stored,
    /// This attempt's result was already stored (a retransmission).
    Duplicate,
    /// Another attempt owns the trial (or already delivered its result): the
    /// attempt is marked superseded and nothing is added to `results`.
    Superseded,
}

impl Store {
    /// Starts a write transaction. Dropping the batch without
    /// [`Batch::commit`] rolls everything in it back.
    ///
    /// A database that cannot be reached is [`StoreError::Unreachable`]:
    /// nothing was done, and the batch may be asked for again. While a
    /// commit sent without waiting is under way the batch begins with
    /// nothing sent ([`Batch::commit_pipelined`]): a database lost then
    /// fails that commit and what follows it instead.
    pub fn batch(&mut self) -> Result<Batch<'_>> {
        let path = self.path.clone();
        let tx = self.conn.begin().map_err(|cause| match cause {
            sql::Error::Fenced { .. } => StoreError::SteppedDown { path: path.clone(), cause },
            cause if cause.is_unreachable() => StoreError::Unreachable { path: path.clone(), cause },
            cause => StoreError::Sql { context: format!("{path}: starting a write transaction"), cause },
        })?;
        Ok(Batch { tx, written: 0 })
    }

    /// A setting of the store's session on its server (`plan_cache_mode`:
    /// how a writer's and a reader's statements are planned); none for a
    /// file.
    pub fn setting(&self, name: &str) -> Result<Option<String>> {
        if !self.conn.on_server() {
            return Ok(None);
        }
        let context = || format!("{}: reading the setting {name}", self.path);
        Ok(Some(self.conn.query_row("SELECT current_setting(?1)", [name], |r| r.get(0)).ctx(context)?))
    }

    /// Its owner has seen every commit sent without waiting that failed
    /// and starts over from what the store holds: writes run again
    /// ([`Batch::commit_pipelined`]). It first waits until everything sent
    /// before has been answered, so nothing built on the failed commit
    /// runs. The engine does so only when its database was lost, and takes
    /// its studies back from the store before it writes again; otherwise
    /// it stops.
    pub fn failed_commit_seen(&self) {
        self.conn.failed_commit_seen();
    }

    /// Whether the store's database answers now (a file always does), else
    /// why not.
    pub fn reachable(&self) -> Result<()> {
        self.conn.query_row("SELECT 1", (), |r| r.get::<_, i64>(0)).map(|_| ()).ctx(|| "asking the database".into())
    }
}

impl Store {
    /// Runs `sql` on the store's connection: tests plant triggers with it
    /// to make a write fail on purpose.
    #[cfg(test)]
    pub(crate) fn execute_for_test(&mut self, sql: &str) -> Result<()> {
        self.conn.execute_batch(sql).ctx(|| format!("running {sql:?}"))
    }
}

impl Batch<'_> {
    /// Commits everything recorded in this batch.
    pub fn commit(self) -> Result<()> {
        self.tx.commit().ctx(|| "committing a batch".into())
    }

    /// [`Batch::commit`] without waiting for a server's answer: the batch
    /// is committed once [`Committing::landed`] says so. If it fails,
    /// nothing written after it is kept until [`Store::failed_commit_seen`].
    /// A file's is committed here.
    pub fn commit_pipelined(self) -> Result<Committing> {
        self.tx.commit_pipelined().map(Committing).ctx(|| "committing a batch".into())
    }
}

/// A batch's commit under way ([`Batch::commit_pipelined`]).
#[derive(Debug, Default)]
pub struct Committing(sql::Committing);

impl Committing {
    /// Waits for its answer: `Ok` once the batch is durable.
    pub async fn landed(&mut self) -> Result<()> {
        self.0.landed().await.ctx(|| "committing a batch".into())
    }
}

impl Batch<'_> {
    /// Opens a savepoint named `name` inside the batch: what follows can be
    /// rolled back alone ([`Batch::rollback_to`]) or kept ([`Batch::release`]).
    /// Savepoints nest; `name` is one of the engine's fixed names, never input.
    /// A checked write not answered yet (an assignment, or a result the
    /// engine judged accepted, on a server) is answered first: its refusal
    /// or error is the batch's, never taken for one of what the savepoint
    /// holds.
    pub fn savepoint(&mut self, name: &'static str) -> Result<()> {
        let context = || format!("opening savepoint {name}");
        self.tx.settle_checks().ctx(context)?;
        self.tx.prepare_cached(&format!("SAVEPOINT {name}")).ctx(context)?.write(()).ctx(context)?;
        Ok(())
    }

    /// Keeps what was written since savepoint `name` (it is part of the batch again).
    pub fn release(&mut self, name: &'static str) -> Result<()> {
        let context = || format!("releasing savepoint {name}");
        self.tx.prepare_cached(&format!("RELEASE {name}")).ctx(context)?.write(()).ctx(context)?;
        Ok(())
    }

    /// Undoes what was written since savepoint `name`, and closes it; the
    /// rest of the batch is kept.
    pub fn rollback_to(&mut self, name: &'static str) -> Result<()> {
        // Writes not sent yet go first; their errors are what is undone.
        self.tx
            .execute_batch_forgiving(&format!("ROLLBACK TO {name}; RELEASE {name}"))
            .ctx(|| format!("rolling back to savepoint {name}"))
    }

    /// Waits for the writes of the batch not answered yet: on a server a
    /// write is sent with the next statement that needs an answer, so its
    /// error comes late. The engine settles before it changes its memory
    /// on the strength of what it wrote (a result it counts, a key it
    /// trusts); the first error of those writes here. An assignment and an
    /// accepted result whose row is all it writes are the exceptions: the
    /// engine counts them (and queues what it sends) before the server
    /// judged them (with the turn's next answer, at the latest its commit),
    /// as a refused one fails the whole turn.
    pub fn settle(&mut self) -> Result<()> {
        self.tx.settle().ctx(|| "writing the batch".into())
    }

    /// Whether writes are answered late, with the next statement that
    /// needs an answer (a server's); a file answers each at once.
    pub fn answers_late(&self) -> bool {
        self.tx.on_server()
    }

    /// Opens `study` with the trials of `plan` (often none: see
    /// [`Batch::add_trials`]), all pending, as `opening` says (the
    /// caller's decision over [`Batch::stored`]: the store keeps study
    /// text and never reads it): created; resumed with its rows as they
    /// are; continued under its changed file; or refused.
    pub fn open_study(&mut self, study: &Study, plan: &[TrialPlan], opening: &Opening) -> Result<StudyOpened> {
        self.open_study_at(study, plan, opening, unix_ms())
    }

    /// Continues `study` under its changed file (`changes`, what differs):
    /// the store keeps the new file, the study runs again, and each change
    /// is recorded.
    fn continue_with(&mut self, study: &Study, changes: &[String], at_ms: u64) -> Result<()> {
        let context = || format!("continuing study {:?} under its changed file", study.name);
        self.tx
            .prepare_cached("UPDATE studies SET config = ?2, state = 'running', finished_ms = NULL WHERE name = ?1")
            .ctx(context)?
            .write(params![study.name, study.source])
            .ctx(context)?;
        for change in changes {
            self.tx
                .prepare_cached("INSERT INTO study_changes (study, at_ms, change) VALUES (?1, ?2, ?3)")
                .ctx(context)?
                .write(params![study.name, to_i64("time", at_ms)?, change])
                .ctx(context)?;
            tracing::info!(study = %study.name, %change, "study continues under its changed file");
        }
        Ok(())
    }

    /// The coordinator (process `pid`) is alive at `at_ms`, and `paused`
    /// or not (for room on the store's disk): `status` tells a running
    /// study from a paused one and from one whose coordinator is gone.
    /// `broker`: the embedded broker's counters (JSON), when it runs one;
    /// `waits`: why studies wait (JSON, study -> reason).
    pub fn beat(&mut self, pid: u32, at_ms: u64, paused: bool, broker: Option<&str>, waits: &str) -> Result<()> {
        let context = || "recording the coordinator's heartbeat".to_string();
        self.tx
            .prepare_cached(
                "INSERT INTO heartbeat (id, pid, beat_ms, stopped_ms, paused, broker, waits)
                 VALUES (1, ?1, ?2, NULL, ?3, ?4, ?5)
                 ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, beat_ms = excluded.beat_ms, stopped_ms = NULL,
                     paused = excluded.paused, broker = excluded.broker, waits = excluded.waits",
            )
            .ctx(context)?
            .write(params![pid, to_i64("time", at_ms)?, paused, broker, waits])
            .ctx(context)?;
        Ok(())
    }

    /// The coordinator stopped at `at_ms` (its last beat).
    pub fn stop_beat(&mut self, at_ms: u64) -> Result<()> {
        let context = || "recording that the coordinator stopped".to_string();
        self.tx
            .prepare_cached("UPDATE heartbeat SET beat_ms = ?1, stopped_ms = ?1")
            .ctx(context)?
            .write(params![to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(())
    }

    /// [`Batch::open_study`] with an explicit time.
    pub fn open_study_at(
        &mut self,
        study: &Study,
        plan: &[TrialPlan],
        opening: &Opening,
        at_ms: u64,
    ) -> Result<StudyOpened> {
        match opening {
            Opening::Create => {}
            Opening::Resume => return Ok(StudyOpened::Resumed),
            Opening::Continue { changes } => {
                self.continue_with(study, changes, at_ms)?;
                return Ok(StudyOpened::Resumed);
            }
            Opening::Refuse { keys } => {
                return Err(StoreError::ConfigMismatch { study: study.name.clone(), keys: keys.clone() })
            }
        }
        let context = || format!("creating study {:?}", study.name);
        self.tx
            .prepare_cached(
                "INSERT INTO studies (name, config, metric, direction, created_ms, finished_ms, state)
                 VALUES (?1, ?2, ?3, ?4, ?5, NULL, 'running')",
            )
            .ctx(context)?
            .write(params![
                study.name,
                study.source,
                study.objective.metric,
                study.objective.direction.as_str(),
                to_i64("time", at_ms)?
            ])
            .ctx(context)?;
        self.add_trials(&study.name, plan)?;
        Ok(StudyOpened::Created)
    }

    /// The random id kept for study `name`; `fresh` (a random draw) becomes
    /// its id when it has none yet: a study just created, or one created by
    /// an older program. Trial references carry it (see
    /// [`tunefleet_common::message::TrialRef`]).
    pub fn study_id(&mut self, name: &str, fresh: u64) -> Result<u64> {
        let context = || format!("reading the id of study {name:?}");
        let kept: Option<i64> = self
            .tx
            .prepare_cached("SELECT id FROM study_ids WHERE name = ?1")
            .ctx(context)?
            .query_row([name], |r| r.get(0))
            .optional()
            .ctx(context)?;
        if let Some(id) = kept {
            // The column holds the id's 64 bits as SQLite's signed integer.
            return Ok(u64::from_le_bytes(id.to_le_bytes()));
        }
        let context = || format!("keeping the id of study {name:?}");
        self.tx
            .prepare_cached("INSERT INTO study_ids (name, id) VALUES (?1, ?2)")
            .ctx(context)?
            .write(params![name, i64::from_le_bytes(fresh.to_le_bytes())])
            .ctx(context)?;
        Ok(fresh)
    }

    /// Whether attempt `trial.attempt` of `trial` was given to `agent` (its
    /// row in `attempts`, kept across coordinator restarts). The study id is
    /// the caller's to check: the store keeps one study per name.
    pub fn attempt_given(&mut self, trial: &TrialRef, agent: &str) -> Result<bool> {
        let context = || format!("looking up attempt {trial} of {agent}");
        self.tx
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM attempts WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?4)",
            )
            .ctx(context)?
            .query_row(params![trial.study, to_i64("trial", trial.trial)?, trial.attempt, agent], |r| r.get(0))
            .ctx(context)
    }

    /// Adds trials to a study, all pending (a search creates them as the
    /// study goes): up to 32 a statement.
    pub fn add_trials(&mut self, study: &str, plan: &[TrialPlan]) -> Result<()> {
        let context = || format!("adding trials to study {study:?}");
        let mut rest = plan;
        while !rest.is_empty() {
            // A power of two at a time: few texts to prepare and keep.
            let (chunk, tail) = rest.split_at(TRIAL_ROWS.min(1 << rest.len().ilog2()));
            rest = tail;
            let rows = chunk
                .iter()
                .map(|t| Ok((to_i64("trial", t.trial)?, params_json(&t.params), t.repeat)))
                .collect::<Result<Vec<_>>>()?;
            let mut values: Vec<&dyn ToSql> = vec![&study];
            for (id, params, repeat) in &rows {
                values.extend([id as &dyn ToSql, params, repeat]);
            }
            self.tx.prepare_cached(&trial_rows(chunk.len())).ctx(context)?.write(&values[..]).ctx(context)?;
        }
        Ok(())
    }

    /// Keeps `agent`'s latest telemetry (for `tunefleet agents`).
    pub fn record_telemetry(
        &mut self,
        agent: &str,
        telemetry: &tunefleet_common::measurement::Telemetry,
    ) -> Result<()> {
        let context = || format!("recording the telemetry of {agent}");
        self.tx
            .prepare_cached("UPDATE agents SET telemetry = ?2 WHERE name = ?1")
            .ctx(context)?
            .write(params![agent, json_text(telemetry, context)?])
            .ctx(context)?;
        Ok(())
    }

    /// Marks a trial stopped early (final, not failed, never retried); its
    /// running attempt is closed with `reason`.
    pub fn stop_trial(&mut self, trial: &TrialRef, reason: &str, at_ms: u64) -> Result<()> {
        let context = || format!("stopping {trial}");
        let id = to_i64("trial", trial.trial)?;
        self.tx
            .prepare_cached("UPDATE trials SET state = 'stopped', reason = ?3 WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .write(params![trial.study, id, reason])
            .ctx(context)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?4, outcome = ?5
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND ended_ms IS NULL",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, to_i64("time", at_ms)?, format!("stopped: {reason}")])
            .ctx(context)?;
        Ok(())
    }

    /// Records the segments of a stored result (its system configuration
    /// is stored with it: [`Score::system`]).
    pub fn record_segments(&mut self, trial: &TrialRef, measurement: &Measurement) -> Result<()> {
        if measurement.segments.is_empty() {
            return Ok(());
        }
        let context = || format!("recording the segments of {trial}");
        let id = to_i64("trial", trial.trial)?;
        let mut insert = self
            .tx
            .prepare_cached(
                "INSERT INTO segments (study, trial, idx, role, system, cpus, first_epoch, last_epoch,
                     start_us, wall_us, energy_j, cpu_us)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT (study, trial, idx) DO UPDATE SET role = excluded.role, system = excluded.system,
                     cpus = excluded.cpus, first_epoch = excluded.first_epoch, last_epoch = excluded.last_epoch,
                     start_us = excluded.start_us, wall_us = excluded.wall_us, energy_j = excluded.energy_j,
                     cpu_us = excluded.cpu_us",
            )
            .ctx(context)?;
        for (i, s) in measurement.segments.iter().enumerate() {
            insert
                .write(params![
                    trial.study,
                    id,
                    i as i64,
                    format!("{:?}", s.role).to_lowercase(),
                    json_text(&s.system, context)?,
                    json_text(&s.cpus, context)?,
                    s.first_epoch,
                    s.last_epoch,
                    to_i64("start_us", s.start_us)?,
                    to_i64("wall_us", s.wall_us)?,
                    s.energy_j.filter(|j| j.is_finite()),
                    s.cpu_us.map(|c| to_i64("cpu_us", c)).transpose()?,
                ])
                .ctx(context)?;
        }
        Ok(())
    }

    /// Closes an attempt that ended without a result (the workload could not
    /// start, was cancelled...) with `outcome`; the trial state is left to
    /// [`Batch::requeue`] or [`Batch::fail_trial`]. An attempt already closed
    /// keeps its first outcome. Returns false for an attempt never assigned.
    pub fn end_attempt(&mut self, trial: &TrialRef, agent: &str, outcome: &str, at_ms: u64) -> Result<bool> {
        let context = || format!("ending attempt {trial} on {agent}");
        let n = self
            .tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = COALESCE(ended_ms, ?4), outcome = COALESCE(outcome, ?5)
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3",
            )
            .ctx(context)?
            .execute(params![
                trial.study,
                to_i64("trial", trial.trial)?,
                trial.attempt,
                to_i64("time", at_ms)?,
                outcome
            ])
            .ctx(context)?;
        Ok(n > 0)
    }

    /// Stores one epoch's metrics; a repeated report of the same epoch is ignored.
    pub fn record_progress(&mut self, progress: &Progress) -> Result<()> {
        let t = &progress.trial;
        let context = || format!("recording progress of {t}");
        let metrics = serde_json::to_string(&progress.metrics)
            .map_err(|source| StoreError::Json { context: context(), source })?;
        self.tx
            .prepare_cached(
                "INSERT OR IGNORE INTO progress (study, trial, attempt, epoch, metrics, elapsed_us, checkpoint)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .ctx(context)?
            .write(params![
                t.study,
                to_i64("trial", t.trial)?,
                t.attempt,
                progress.epoch,
                metrics,
                to_i64("elapsed_us", progress.elapsed_us)?,
                progress.checkpoint
            ])
            .ctx(context)?;
        self.written += ROW_BYTES + metrics.len() as u64 + progress.checkpoint.as_ref().map_or(0, |c| c.len() as u64);
        Ok(())
    }

    /// Bytes of results and progress this batch wrote so far: their
    /// payloads (the measurement's and the metrics' JSON, a checkpoint) and
    /// [`ROW_BYTES`] a row. What an agent's share of a study's store counts.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Whether `trial`'s attempt waits on its agent behind busy slots (held
    /// ahead, `true`) or runs: what `status`, `agents` and the page count
    /// apart.
    pub fn set_held(&mut self, trial: &TrialRef, held: bool) -> Result<()> {
        let context = || format!("recording whether {trial} is held ahead");
        self.tx
            .prepare_cached("UPDATE attempts SET held = ?4 WHERE study = ?1 AND trial = ?2 AND attempt = ?3")
            .ctx(context)?
            .write(params![trial.study, to_i64("trial", trial.trial)?, trial.attempt, held])
            .ctx(context)?;
        Ok(())
    }

    /// Every open attempt of `study` counted as running, none as held: what
    /// a coordinator taking them back from the store assumes.
    pub fn clear_held(&mut self, study: &str) -> Result<()> {
        let context = || format!("taking the open attempts of {study} back");
        self.tx
            .prepare_cached("UPDATE attempts SET held = 0 WHERE study = ?1 AND held = 1")
            .ctx(context)?
            .write([study])
            .ctx(context)?;
        Ok(())
    }

    /// The attempt ended without a result (timeout of the agent, refusal,
    /// agent gone): the attempt is closed with `reason` and the trial is
    /// pending again. Returns false (and changes no trial) when the trial is
    /// not running this attempt any more.
    pub fn requeue(&mut self, trial: &TrialRef, reason: &str) -> Result<bool> {
        self.requeue_at(trial, reason, unix_ms())
    }

    /// [`Batch::requeue`] with an explicit time.
    pub fn requeue_at(&mut self, trial: &TrialRef, reason: &str, at_ms: u64) -> Result<bool> {
        let context = || format!("requeueing {trial}");
        let id = to_i64("trial", trial.trial)?;
        self.trial_state(trial)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = COALESCE(ended_ms, ?4), outcome = COALESCE(outcome, ?5)
                 WHERE study = ?1 AND trial = ?2 AND attempt = ?3",
            )
            .ctx(context)?
            .write(params![trial.study, id, trial.attempt, to_i64("time", at_ms)?, reason])
            .ctx(context)?;
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE trials SET state = 'pending'
                 WHERE study = ?1 AND trial = ?2 AND state = 'running' AND attempts = ?3",
            )
            .ctx(context)?
            .execute(params![trial.study, id, trial.attempt])
            .ctx(context)?;
        Ok(changed > 0)
    }

    /// Gives up on a trial (attempts exhausted, study cancelled). Open
    /// attempts are closed with `reason`. A trial that already has its final
    /// outcome is left as it is; returns whether the trial changed.
    pub fn fail_trial(&mut self, study: &str, trial: u64, reason: &str) -> Result<bool> {
        self.fail_trial_at(study, trial, reason, unix_ms())
    }

    /// [`Batch::fail_trial`] with an explicit time.
    pub fn fail_trial_at(&mut self, study: &str, trial: u64, reason: &str, at_ms: u64) -> Result<bool> {
        let context = || format!("failing trial {study}/{trial}");
        // `trial_state` reads the study name and trial alone.
        let r = TrialRef { study: study.to_string(), study_id: 0, trial, attempt: 0 };
        self.trial_state(&r)?;
        let id = to_i64("trial", trial)?;
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?3, outcome = ?4
                 WHERE study = ?1 AND trial = ?2 AND ended_ms IS NULL",
            )
            .ctx(context)?
            .write(params![study, id, to_i64("time", at_ms)?, reason])
            .ctx(context)?;
        let changed = self
            .tx
            .prepare_cached(
                "UPDATE trials SET state = 'failed', reason = ?3
                 WHERE study = ?1 AND trial = ?2 AND state IN ('pending', 'running')",
            )
            .ctx(context)?
            .execute(params![study, id, reason])
            .ctx(context)?;
        Ok(changed > 0)
    }

    /// On resume: every running trial of `study` goes back to pending and its
    /// open attempt is closed with `reason`. Returns how many trials changed.
    pub fn reset_running(&mut self, study: &str, reason: &str, at_ms: u64) -> Result<u64> {
        let context = || format!("resetting running trials of study {study:?}");
        self.tx
            .prepare_cached(
                "UPDATE attempts SET ended_ms = ?2, outcome = ?3
                 WHERE study = ?1 AND ended_ms IS NULL
                   AND trial IN (SELECT trial FROM trials WHERE study = ?1 AND state = 'running')",
            )
            .ctx(context)?
            .write(params![study, to_i64("time", at_ms)?, reason])
            .ctx(context)?;
        let n = self
            .tx
            .prepare_cached("UPDATE trials SET state = 'pending' WHERE study = ?1 AND state = 'running'")
            .ctx(context)?
            .execute([study])
            .ctx(context)?;
        Ok(n as u64)
    }

    /// Records an agent's announcement; it is online from now on.
    pub fn upsert_agent(&mut self, info: &AgentInfo, at_ms: u64) -> Result<()> {
        let context = || format!("recording agent {}", info.agent);
        let json = serde_json::to_string(info).map_err(|source| StoreError::Json { context: context(), source })?;
        let at = to_i64("time", at_ms)?;
        self.tx
            .prepare_cached(
                "INSERT INTO agents (name, info, first_seen_ms, last_seen_ms, online) VALUES (?1, ?2, ?3, ?3, 1)
                 ON CONFLICT (name) DO UPDATE SET info = excluded.info, last_seen_ms = excluded.last_seen_ms,
                     online = 1",
            )
            .ctx(context)?
            .write(params![info.agent, json, at])
            .ctx(context)?;
        Ok(())
    }

    /// Sets an agent's online flag; returns false for an agent never announced.
    pub fn set_agent_online(&mut self, name: &str, online: bool, at_ms: u64) -> Result<bool> {
        let context = || format!("setting agent {name} online={online}");
        let n = self
            .tx
            .prepare_cached("UPDATE agents SET online = ?2, last_seen_ms = MAX(last_seen_ms, ?3) WHERE name = ?1")
            .ctx(context)?
            .execute(params![name, online, to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(n > 0)
    }

    /// `agent` was heard from at `at_ms`: its `last seen`.
    pub fn agent_heard(&mut self, name: &str, at_ms: u64) -> Result<()> {
        let context = || format!("noting when agent {name} was last heard");
        self.tx
            .prepare_cached("UPDATE agents SET last_seen_ms = MAX(last_seen_ms, ?2) WHERE name = ?1")
            .ctx(context)?
            .write(params![name, to_i64("time", at_ms)?])
            .ctx(context)?;
        Ok(())
    }

    /// Marks the study finished.
    pub fn finish_study(&mut self, name: &str, at_ms: u64) -> Result<()> {
        let context = || format!("finishing study {name:?}");
        let n = self
            .tx
            .prepare_cached("UPDATE studies SET state = 'finished', finished_ms = ?2 WHERE name = ?1")
            .ctx(context)?
            .execute(params![name, to_i64("time", at_ms)?])
            .ctx(context)?;
        if n == 0 {
            return Err(StoreError::UnknownStudy(name.to_string()));
        }
        Ok(())
    }

    /// The state and highest attempt of a trial, or `UnknownTrial`.
    pub(super) fn trial_state(&self, trial: &TrialRef) -> Result<(TrialState, u32)> {
        let context = || format!("reading the state of trial {}/{}", trial.study, trial.trial);
        self.tx
            .prepare_cached("SELECT state, attempts FROM trials WHERE study = ?1 AND trial = ?2")
            .ctx(context)?
            .query_row(params![trial.study, to_i64("trial", trial.trial)?], |r| Ok((trial_state(r, 0)?, r.get(1)?)))
            .optional()
            .ctx(context)?
            .ok_or_else(|| StoreError::UnknownTrial { study: trial.study.clone(), trial: trial.trial })
    }
}

/// `value` as JSON text, for a column.
pub(super) fn json_text<T: serde::Serialize>(value: &T, context: impl Fn() -> String) -> Result<String> {
    serde_json::to_string(value).map_err(|source| StoreError::Json { context: context(), source })
}

/// Trials one statement adds at most ([`Batch::add_trials`]), a power of two.
const TRIAL_ROWS: usize = 32;

/// The statement adding `n` trials of one study, pending: `?1` the
/// study, then each trial's number, parameters and repeat.
fn trial_rows(n: usize) -> String {
    let rows: Vec<String> =
        (0..n).map(|i| format!("(?1, ?{}, ?{}, ?{}, 'pending', 0)", 3 * i + 2, 3 * i + 3, 3 * i + 4)).collect();
    format!("INSERT INTO trials (study, trial, params, repeat, state, attempts) VALUES {}", rows.join(", "))
}
