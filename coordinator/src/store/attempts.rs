//! An attempt's life in the store: its assignment, and the result that
//! ends it (accepted once a trial, a duplicate, or superseded).

use tunefleet_common::measurement::Measurement;
use tunefleet_common::message::TrialRef;

use super::batch::json_text;
use super::batch::RecordOutcome;
use super::sql::{self, params, Optional, Row, ToSql};
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
        // On a server, a row of one statement for the turn's assignments,
        // sent with the next statement that needs an answer: a trial that
        // ended is refused when the batch settles or commits (nothing of
        // it is written), not at once.
        if self.tx.on_server() {
            return self
                .tx
                .prepare_cached(&GROUPED.assign)
                .ctx(context)?
                .write_grouped(params![trial.study, id, trial.attempt, agent, at, held], group_key(trial), assigned)
                .ctx(context);
        }
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
        let kept = Kept::of(trial, at_ms, measurement, &score.into(), context)?;
        let at = kept.at;
        // On a server, the read and the writes of an accepted result are
        // one statement (one round trip, one plan); a file reads first.
        let (accepted, held) = match self.tx.on_server() {
            true => self.accept_on_server(trial, agent, &kept)?,
            false => self.attempt_found(trial, agent)?,
        };
        if accepted == Some(trial.attempt) {
            return Ok(RecordOutcome::Duplicate);
        }
        // Any attempt really handed to this agent may complete a trial that has
        // no result yet, a trial failed because its attempts ran out included (a
        // result that arrives after its agent was presumed dead is still a good
        // result); everything after that is superseded.
        if accepted.is_some() || !held {
            self.supersede(trial, agent, &kept.exit, at)?;
            return Ok(RecordOutcome::Superseded);
        }
        if !self.tx.on_server() {
            self.accept(trial, agent, &kept)?;
        }
        self.written += ROW_BYTES + kept.measurement.len() as u64;
        Ok(RecordOutcome::Stored)
    }

    /// [`Batch::record_result`] of a result the engine judged accepted (no
    /// result yet, the attempt its agent's), answered late on a server: it
    /// is a row of one statement for the turn's results, sent with the next
    /// statement that needs an answer like an assignment
    /// ([`Batch::record_assignment`]), and the store's
    /// answer is judged then; one that is not [`RecordOutcome::Stored`] is
    /// refused there ([`StoreError::Refused`]: the engine's memory and its
    /// store disagree), and a commit after it commits nothing.
    ///
    /// `Ok(Err(e))`: the result cannot be written as it is (a figure out of
    /// range, a text the server cannot hold), and nothing of it was sent.
    /// `Err(e)`: the batch failed. On a file the result is written and
    /// judged at once, every error the batch's.
    pub fn record_accepted(
        &mut self,
        trial: &TrialRef,
        agent: &str,
        measurement: &Measurement,
        score: impl Into<Score>,
        at_ms: u64,
    ) -> Result<std::result::Result<(), StoreError>> {
        let context = || format!("recording the result of {trial} from {agent}");
        if !self.tx.on_server() {
            return match self.record_result(trial, agent, measurement, score, at_ms)? {
                RecordOutcome::Stored => Ok(Ok(())),
                other => Err(StoreError::Refused(disagreeing(&trial.study, trial.trial, other))),
            };
        }
        let kept = match Kept::of(trial, at_ms, measurement, &score.into(), context) {
            Ok(kept) => kept,
            Err(e) => return Ok(Err(e)),
        };
        let mut accept = self.tx.prepare_cached(&GROUPED.accept).ctx(context)?;
        let state = kept.state.as_str();
        let values = [&kept.row(trial, &agent)[..], &[&state, &kept.reason]].concat();
        // Deferred, a write fails here only on its own values, never sent.
        if let Err(e) = accept.write_grouped(&values[..], group_key(trial), accepted_as_judged).ctx(context) {
            return Ok(Err(e));
        }
        self.written += ROW_BYTES + kept.measurement.len() as u64;
        Ok(Ok(()))
    }

    /// In one statement: the attempt whose result `trial` has, if any, and
    /// whether `agent` was handed this attempt; an unknown trial, an error.
    fn attempt_found(&mut self, trial: &TrialRef, agent: &str) -> Result<(Option<u32>, bool)> {
        let context = || format!("recording the result of {trial} from {agent}");
        self.tx
            .prepare_cached(
                "SELECT (SELECT attempt FROM results WHERE study = ?1 AND trial = ?2),
                        EXISTS(SELECT 1 FROM attempts WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?4)
                 FROM trials WHERE study = ?1 AND trial = ?2",
            )
            .ctx(context)?
            .query_row(params![trial.study, to_i64("trial", trial.trial)?, trial.attempt, agent], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .ctx(context)?
            .ok_or_else(|| StoreError::UnknownTrial { study: trial.study.clone(), trial: trial.trial })
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
    fn accept(&mut self, trial: &TrialRef, agent: &str, kept: &Kept) -> Result<()> {
        let context = || format!("recording the result of {trial} from {agent}");
        let (k, id, at) = (kept, kept.id, kept.at);
        self.tx
            .prepare_cached(
                "INSERT INTO results (study, trial, attempt, agent, success, objective, wall_us, user_us, sys_us,
                     max_rss_kib, exit, energy_j, energy_source, energy_valid, measurement, received_ms, gpu_energy_j,
                     violation, system)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
            )
            .ctx(context)?
            .write(&k.row(trial, &agent)[..])
            .ctx(context)?;
        self.tx
            // A trial stopped early stays stopped: its result is kept for the record.
            .prepare_cached(
                "UPDATE trials SET state = ?3, reason = ?4 WHERE study = ?1 AND trial = ?2 AND state != 'stopped'",
            )
            .ctx(context)?
            .write(params![trial.study, id, k.state.as_str(), k.reason])
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
            .write(params![trial.study, id, trial.attempt, at, k.exit])
            .ctx(context)?;
        Ok(())
    }

    /// [`Batch::attempt_found`] and, when it says so, [`Batch::accept`], in
    /// one statement on a server: what the trial had before, as the read
    /// alone answers.
    fn accept_on_server(&mut self, trial: &TrialRef, agent: &str, kept: &Kept) -> Result<(Option<u32>, bool)> {
        let context = || format!("recording the result of {trial} from {agent}");
        let k = kept;
        self.tx
            .prepare_cached(ACCEPT_ON_SERVER)
            .ctx(context)?
            .query_row(&[&k.row(trial, &agent)[..], &[&k.state.as_str(), &k.reason]].concat()[..], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .optional()
            .ctx(context)?
            .ok_or_else(|| StoreError::UnknownTrial { study: trial.study.clone(), trial: trial.trial })
    }
}

/// [`Batch::record_assignment_held`]'s three statements for many
/// assignments at once on a server (`tunefleet_assign_{v}` of
/// [`GROUPED_FUNCTIONS`]), each argument a column of them.
const ASSIGN_GROUPED: &str = "SELECT * FROM tunefleet_assign_{v}(?1, ?2, ?3, ?4, ?5, ?6)";

/// [`Batch::record_accepted`]'s statement for many results at once on a
/// server (`tunefleet_accept_{v}`): [`ACCEPT_ON_SERVER`]'s read and writes.
const ACCEPT_GROUPED: &str =
    "SELECT * FROM tunefleet_accept_{v}(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, \
     ?19, ?20, ?21)";

/// [`GROUPED_FUNCTIONS`] and the statements that call them, `{v}` in
/// their names the digest of the functions' text: a function changed is
/// a function of another name, created beside the one a coordinator of
/// the build before may still call (a function found is never replaced).
struct Grouped {
    functions: String,
    assign: String,
    accept: String,
}

static GROUPED: std::sync::LazyLock<Grouped> = std::sync::LazyLock::new(|| {
    let v = format!("{:016x}", super::fnv(GROUPED_FUNCTIONS.as_bytes(), super::FNV_START));
    Grouped {
        functions: GROUPED_FUNCTIONS.replace("{v}", &v),
        assign: ASSIGN_GROUPED.replace("{v}", &v),
        accept: ACCEPT_GROUPED.replace("{v}", &v),
    }
});

/// What the migration runs on a server: the grouped writes' functions,
/// created where missing ([`GROUPED_FUNCTIONS`]).
pub(super) fn grouped_functions() -> &'static str {
    &GROUPED.functions
}

/// What [`ASSIGN_GROUPED`] and [`ACCEPT_GROUPED`] call, created on a
/// server in the store's schema. Each takes its rows as arrays, a column
/// each, and writes them in one statement: one executor start and one
/// round trip a run of rows where a statement a row cost the server about
/// 130 µs of CPU each. It answers only the rows it did not take, as the
/// statement a row answered them. Created in the migration's transaction,
/// under the lock that keeps two coordinators starting at once from racing
/// on the schema. Their tables are the caller's (its `search_path`, the
/// store's schema), so a schema renamed or restored under another name
/// writes its own. Their statements' plans are kept as the writer's
/// session keeps its own (once, or made each run where the tables were
/// analysed while small), made with scans and hash and merge joins off:
/// a row is reached by its key whatever the tables' size or statistics
/// (a plan made once while the tables were small joined the rows by
/// scanning them, and kept doing so as they grew). Their reads are scalar
/// subqueries, which the server never turns into one read of a whole table
/// as it may an `EXISTS`.
const GROUPED_FUNCTIONS: &str = r#"
DO $do$ BEGIN
IF to_regprocedure('tunefleet_assign_{v}(text[], bigint[], bigint[], text[], bigint[], bigint[])') IS NULL THEN
CREATE FUNCTION tunefleet_assign_{v}(s text[], t bigint[], a bigint[], ag text[], at bigint[], h bigint[])
RETURNS TABLE (running bigint, state text, study text, trial bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off
    SET enable_hashjoin = off SET enable_mergejoin = off
AS $f$
#variable_conflict use_column
BEGIN RETURN QUERY
WITH u AS MATERIALIZED (SELECT * FROM unnest(s, t, a, ag, at, h) AS u(study, trial, attempt, agent, at, held)),
    run AS (
        UPDATE trials SET state = 'running', attempts = u.attempt FROM u
        WHERE trials.study = u.study AND trials.trial = u.trial AND trials.state NOT IN ('done', 'failed', 'stopped')
        RETURNING u.study, u.trial, u.attempt, u.agent, u.at, u.held),
    reassigned AS (
        UPDATE attempts SET ended_ms = r.at, outcome = 'reassigned' FROM run r
        WHERE attempts.study = r.study AND attempts.trial = r.trial AND attempts.attempt <> r.attempt
            AND attempts.ended_ms IS NULL),
    given AS (
        INSERT INTO attempts (study, trial, attempt, agent, assigned_ms, ended_ms, outcome, superseded, held)
        SELECT r.study, r.trial, r.attempt, r.agent, r.at, NULL, NULL, 0, r.held FROM run r
        ON CONFLICT (study, trial, attempt) DO UPDATE SET
            agent = excluded.agent, assigned_ms = excluded.assigned_ms,
            ended_ms = NULL, outcome = NULL, superseded = 0, held = excluded.held)
SELECT 0::bigint, (SELECT x.state FROM trials x WHERE x.study = u.study AND x.trial = u.trial), u.study, u.trial
FROM u WHERE (SELECT count(*) FROM run) < cardinality(s)
    AND NOT EXISTS (SELECT 1 FROM run r WHERE r.study = u.study AND r.trial = u.trial AND r.attempt = u.attempt);
END $f$;
END IF;
IF to_regprocedure('tunefleet_accept_{v}(text[], bigint[], bigint[], text[], bigint[], float8[], bigint[], bigint[], bigint[], bigint[], text[], float8[], text[], bigint[], text[], bigint[], float8[], float8[], text[], text[], text[])') IS NULL THEN
CREATE FUNCTION tunefleet_accept_{v}(s text[], t bigint[], a bigint[], ag text[], ok bigint[], obj float8[],
    wall bigint[], usr bigint[], sys bigint[], rss bigint[], ex text[], ej float8[], es text[], ev bigint[], m text[],
    at bigint[], gj float8[], vi float8[], sy text[], st text[], why text[])
RETURNS TABLE (accepted bigint, held boolean, study text, trial bigint)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off
    SET enable_hashjoin = off SET enable_mergejoin = off
AS $f$
#variable_conflict use_column
BEGIN RETURN QUERY
WITH u AS MATERIALIZED (
        SELECT * FROM unnest(s, t, a, ag, ok, obj, wall, usr, sys, rss, ex, ej, es, ev, m, at, gj, vi, sy, st, why)
            AS u(study, trial, attempt, agent, success, objective, wall_us, user_us, sys_us, max_rss_kib, exit,
                energy_j, energy_source, energy_valid, measurement, received_ms, gpu_energy_j, violation, system,
                state, reason)),
    found AS MATERIALIZED (
        SELECT u.*, (SELECT x.attempt FROM results x WHERE x.study = u.study AND x.trial = u.trial) AS accepted,
            COALESCE((SELECT x.agent FROM attempts x
                WHERE x.study = u.study AND x.trial = u.trial AND x.attempt = u.attempt) = u.agent, false)
            AND (SELECT x.state FROM trials x WHERE x.study = u.study AND x.trial = u.trial) IS NOT NULL AS held
        FROM u),
    kept AS MATERIALIZED (SELECT * FROM found WHERE found.accepted IS NULL AND found.held),
    result AS (
        INSERT INTO results (study, trial, attempt, agent, success, objective, wall_us, user_us, sys_us,
            max_rss_kib, exit, energy_j, energy_source, energy_valid, measurement, received_ms, gpu_energy_j,
            violation, system)
        SELECT k.study, k.trial, k.attempt, k.agent, k.success, k.objective, k.wall_us, k.user_us, k.sys_us,
            k.max_rss_kib, k.exit, k.energy_j, k.energy_source, k.energy_valid, k.measurement, k.received_ms,
            k.gpu_energy_j, k.violation, k.system
        FROM kept k),
    done AS (
        UPDATE trials SET state = k.state, reason = k.reason FROM kept k
        WHERE trials.study = k.study AND trials.trial = k.trial AND trials.state <> 'stopped'),
    ended AS (
        UPDATE attempts SET ended_ms = k.received_ms,
            outcome = CASE WHEN attempts.attempt = k.attempt THEN k.exit
                ELSE 'cancelled: attempt ' || k.attempt || ' delivered first' END
        FROM kept k
        WHERE attempts.study = k.study AND attempts.trial = k.trial
            AND (attempts.attempt = k.attempt OR attempts.ended_ms IS NULL))
SELECT f.accepted, f.held, f.study, f.trial FROM found f WHERE NOT (f.accepted IS NULL AND f.held);
END $f$;
END IF;
END $do$"#;

/// A row's key among grouped writes ([`sql::Stmt::write_grouped`]): its
/// trial, whose rows alone its statements touch.
fn group_key(trial: &TrialRef) -> String {
    format!("{}:{}:{}", trial.study.len(), trial.study, trial.trial)
}

/// Judges a row [`ASSIGN_GROUPED`] did not take: the trial was running,
/// else why not (in the words a file's store says it at once).
fn assigned(r: &Row<'_>) -> sql::Result<()> {
    if r.get::<_, i64>("running")? > 0 {
        return Ok(());
    }
    let (study, trial): (String, i64) = (r.get("study")?, r.get("trial")?);
    let trial = u64::try_from(trial).unwrap_or(0);
    let why = match r.get::<_, Option<String>>("state")? {
        Some(text) => match TrialState::parse(&text) {
            Some(state) => StoreError::TrialClosed { study, trial, state }.to_string(),
            None => format!("trial {study}/{trial} is in a state this build does not know ({text:?})"),
        },
        None => StoreError::UnknownTrial { study, trial }.to_string(),
    };
    Err(sql::Error::Refused(why))
}

/// [`Batch::attempt_found`]'s read and [`Batch::accept`]'s three writes as
/// one statement of a server's: the writes only where the read says the
/// result is accepted (no result yet, the attempt this agent's), and the
/// read's answer as the trial was before them.
const ACCEPT_ON_SERVER: &str = "WITH found AS (
        SELECT (SELECT attempt FROM results WHERE study = ?1 AND trial = ?2) AS accepted,
               EXISTS(SELECT 1 FROM attempts WHERE study = ?1 AND trial = ?2 AND attempt = ?3 AND agent = ?4) AS held
        FROM trials WHERE study = ?1 AND trial = ?2),
    kept AS (SELECT 1 FROM found WHERE accepted IS NULL AND held),
    result AS (
        INSERT INTO results (study, trial, attempt, agent, success, objective, wall_us, user_us, sys_us,
            max_rss_kib, exit, energy_j, energy_source, energy_valid, measurement, received_ms, gpu_energy_j,
            violation, system)
        SELECT ?1, ?2, ?3, ?4::TEXT, ?5::INTEGER, ?6::REAL, ?7::INTEGER, ?8::INTEGER, ?9::INTEGER, ?10::INTEGER,
            ?11::TEXT, ?12::REAL, ?13::TEXT, ?14::INTEGER, ?15::TEXT, ?16::INTEGER, ?17::REAL, ?18::REAL, ?19::TEXT
        FROM kept),
    done AS (
        UPDATE trials SET state = ?20, reason = ?21
        WHERE study = ?1 AND trial = ?2 AND state != 'stopped' AND EXISTS (SELECT 1 FROM kept)),
    ended AS (
        UPDATE attempts SET ended_ms = ?16,
            outcome = CASE WHEN attempt = ?3 THEN ?11 ELSE 'cancelled: attempt ' || ?3 || ' delivered first' END
        WHERE study = ?1 AND trial = ?2 AND (attempt = ?3 OR ended_ms IS NULL) AND EXISTS (SELECT 1 FROM kept))
    SELECT accepted, held, ?1::TEXT AS study, ?2::BIGINT AS trial FROM found";

/// Judges [`ACCEPT_ON_SERVER`]'s answer for a result judged accepted: no
/// result before it and the attempt its agent's, else what the store says.
fn accepted_as_judged(r: &Row<'_>) -> sql::Result<()> {
    let (accepted, held): (Option<u32>, bool) = (r.get("accepted")?, r.get("held")?);
    let (study, trial): (String, i64) = (r.get("study")?, r.get("trial")?);
    let trial = u64::try_from(trial).unwrap_or(0);
    match (accepted, held) {
        (None, true) => Ok(()),
        (Some(_), _) => Err(sql::Error::Refused(disagreeing(&study, trial, RecordOutcome::Duplicate))),
        (None, false) => Err(sql::Error::Refused(disagreeing(&study, trial, RecordOutcome::Superseded))),
    }
}

/// Why a result the engine judged accepted is refused: the store answered
/// `outcome` (a duplicate: it holds a result of the trial already).
fn disagreeing(study: &str, trial: u64, outcome: RecordOutcome) -> String {
    let holds = match outcome {
        RecordOutcome::Stored => "it",
        RecordOutcome::Duplicate => "a result of the trial already",
        RecordOutcome::Superseded => "no attempt of it given to that agent",
    };
    format!(
        "the result of {study}/{trial} was judged accepted, but the store holds {holds}: the coordinator's memory \
         and its store disagree"
    )
}

/// What an accepted result writes of its measurement, worked out once
/// for either way of writing it.
struct Kept {
    /// The trial's number and when the result was received, as stored.
    id: i64,
    at: i64,
    success: bool,
    /// A finite objective, or none.
    objective: Option<f64>,
    wall_us: i64,
    user_us: i64,
    sys_us: i64,
    max_rss_kib: i64,
    exit: String,
    /// The trial's whole energy (its CPU share and its GPUs'), and the GPUs' apart.
    joules: Option<f64>,
    gpu_joules: Option<f64>,
    source: &'static str,
    valid: bool,
    /// The measurement as JSON.
    measurement: String,
    /// A violation without end (a figure missing) is kept as the largest number.
    violation: Option<f64>,
    system: Option<String>,
    /// `done`, or `failed` with why in words a user can act on (its exit and last line).
    state: TrialState,
    reason: Option<String>,
}

impl Kept {
    /// The row of `results` it writes for `trial` from `agent`, in the
    /// order of its columns.
    fn row<'a>(&'a self, trial: &'a TrialRef, agent: &'a &'a str) -> [&'a dyn ToSql; 19] {
        [
            &trial.study,
            &self.id,
            &trial.attempt,
            agent,
            &self.success,
            &self.objective,
            &self.wall_us,
            &self.user_us,
            &self.sys_us,
            &self.max_rss_kib,
            &self.exit,
            &self.joules,
            &self.source,
            &self.valid,
            &self.measurement,
            &self.at,
            &self.gpu_joules,
            &self.violation,
            &self.system,
        ]
    }

    fn of(
        trial: &TrialRef,
        at_ms: u64,
        measurement: &Measurement,
        score: &Score,
        context: impl Fn() -> String,
    ) -> Result<Kept> {
        let success = measurement.exit.success();
        let energy = measurement.energy_figure();
        Ok(Kept {
            id: to_i64("trial", trial.trial)?,
            at: to_i64("time", at_ms)?,
            success,
            objective: score.objective.filter(|v| v.is_finite()),
            wall_us: to_i64("wall_us", measurement.wall_us)?,
            user_us: to_i64("user_us", measurement.user_us)?,
            sys_us: to_i64("sys_us", measurement.sys_us)?,
            max_rss_kib: to_i64("max_rss_kib", measurement.max_rss_kib)?,
            exit: exit_text(&measurement.exit),
            joules: energy.joules.filter(|j| j.is_finite()),
            gpu_joules: measurement.gpu_joules().filter(|j| j.is_finite()),
            source: measurement.energy.source.as_str(),
            valid: energy.valid,
            measurement: serde_json::to_string(measurement)
                .map_err(|source| StoreError::Json { context: context(), source })?,
            violation: score.violation.map(|v| v.min(f64::MAX)),
            system: score.system.as_ref().map(|s| json_text(s, &context)).transpose()?,
            state: if success { TrialState::Done } else { TrialState::Failed },
            reason: (!success).then(|| crate::domain::failure::cause(&measurement.exit, &measurement.log_tail)),
        })
    }
}
