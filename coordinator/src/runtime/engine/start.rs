//! Starting a study: created in the store or resumed from it (its search
//! replays the trials it made, is told their results and the progress of
//! trials stopped early), and a study file submitted to the service.

use std::collections::HashMap;

use super::active::ActiveStudy;
use super::core::{Core, Started, LEASE_GRACE};
use super::dispatch::usable_checkpoint;
use super::learn::load_book;
use super::types::{Answer, EngineError, Now};
use crate::domain::sched::{Restored, StudyPolicy};
use crate::domain::search::{Search, TrialPlan};
use crate::domain::study::{self, Study};
use crate::store::{Batch, StoreError, StudyOpened, TrialState};

/// Opens `study` in the store with the trials of `plan`: the study of its
/// name the store holds is read back here (the store keeps study text and
/// never reads it) to decide whether it is created, resumed, continued
/// under its changed file or refused ([`study::opening`]).
pub fn open_study(batch: &mut Batch<'_>, study: &Study, plan: &[TrialPlan]) -> Result<StudyOpened, StoreError> {
    open_study_at(batch, study, plan, super::unix_ms())
}

/// [`open_study`] at `at_ms`.
pub fn open_study_at(
    batch: &mut Batch<'_>,
    study: &Study,
    plan: &[TrialPlan],
    at_ms: u64,
) -> Result<StudyOpened, StoreError> {
    let stored = batch.stored(&study.name)?;
    batch.open_study_at(study, plan, &study::opening(stored.as_ref(), study), at_ms)
}

impl Core {
    /// A study file submitted to the service: started (or resumed) beside
    /// the others.
    pub(super) fn submit(&mut self, text: &str, origin: &str, now: Now, shown: &mut Vec<Started>) -> Answer {
        let file = match crate::domain::study::parse(text, origin) {
            Ok(s) => s,
            Err(e) => return Answer::Error { message: e.to_string() },
        };
        let studies = file.expand();
        for study in &studies {
            let name = &study.name;
            if self.studies.get(name).is_some_and(|a| !a.cancelled)
                && self.sched.counts(name).is_some_and(|c| !c.finished())
            {
                return Answer::Error { message: format!("study {name} is running already") };
            }
        }
        let mut started = Vec::new();
        for study in studies {
            let name = study.name.clone();
            let submitted = study.clone();
            match self.start_study(study, now) {
                Ok(s) => shown.push(s),
                Err(e) if e.database_lost() => {
                    self.submitted_when_lost.push(submitted);
                    return Answer::Error {
                        message: format!(
                            "{e}: the store may have kept study {name}; if it did, it runs from the next tick, or once the \
                             database answers (look with `tunefleet status`)"
                        ),
                    };
                }
                Err(e) => return Answer::Error { message: e.to_string() },
            }
            let total = self.sched.counts(&name).map_or(0, |c| c.total);
            tracing::info!(study = %name, "study submitted");
            started.push(format!("study {name} submitted ({total} trials so far)"));
        }
        Answer::Ok { message: started.join("\n") }
    }

    /// `params` (name, value as TOML) tried first among the trials of the
    /// running study `name` not created yet: checked as a `[[enqueue]]`
    /// entry of its file is, kept in the stored file (so a restart keeps
    /// it, and the change is recorded), then put first in its search.
    pub(super) fn enqueue(&mut self, name: &str, params: &[(String, String)]) -> Answer {
        let error = |message: String| Answer::Error { message };
        let (study, entry) = match self.checked_entry(name, params) {
            Ok(checked) => checked,
            Err(message) => return error(message),
        };
        let stored = self.store.batch().and_then(|mut b| open_study(&mut b, &study, &[]).and_then(|_| b.commit()));
        if let Err(e) = stored {
            return error(e.to_string());
        }
        let Some(active) = self.studies.get_mut(name) else { return error(format!("study {name} ended")) };
        active.search.enqueue_first(entry.clone());
        active.study = study;
        tracing::info!(study = %name, params = ?entry, "configuration enqueued");
        Answer::Ok { message: format!("enqueued in study {name}: tried before any trial not created yet") }
    }

    /// `params` of the running study `name` checked as a `[[enqueue]]`
    /// entry of its file: the study with the entry added, and the entry.
    fn checked_entry(
        &self,
        name: &str,
        params: &[(String, String)],
    ) -> Result<(Study, tunefleet_common::params::Params), String> {
        let Some(active) = self.studies.get(name).filter(|a| !a.cancelled) else {
            return Err(format!(
                "study {name} is not running on this service: add an [[enqueue]] entry to its file instead"
            ));
        };
        if active.search.configs_left() == 0 {
            return Err(format!("study {name} has created all its trials: give it a larger [budget] first"));
        }
        let mut text = format!("{}\n[[enqueue]]\n", active.study.source.trim_end());
        for (key, value) in params {
            text.push_str(&format!("{key} = {value}\n"));
        }
        let parsed = crate::domain::study::parse(&text, &active.study.origin).map(|f| f.expand());
        let study = match parsed {
            Ok(mut studies) if studies.len() == 1 && studies[0].name == name => studies.remove(0),
            Ok(_) => return Err(format!("study {name}'s file holds several studies: enqueue in the file")),
            Err(e) => return Err(e.to_string()),
        };
        let entry = study.enqueue.last().cloned().ok_or_else(|| "nothing to enqueue".to_string())?;
        Ok((study, entry))
    }

    /// A configuration an outside sampler chose for the external study
    /// `name` (`[strategy] kind = "external"`): checked as an enqueued one
    /// and complete (every searched parameter), its trials (its repeats)
    /// created now, so the answer names them.
    pub(super) fn tell(&mut self, name: &str, params: &[(String, String)]) -> Answer {
        let error = |message: String| Answer::Error { message };
        if self.studies.get(name).is_some_and(|a| !a.search.external()) {
            return error(format!(
                "study {name} chooses its own configurations: only a study with [strategy] kind = \"external\" is told \
                 them (tunefleet enqueue puts one first in any study)"
            ));
        }
        let (study, entry) = match self.checked_entry(name, params) {
            Ok(checked) => checked,
            Err(message) => return error(message),
        };
        let missing: Vec<String> =
            study.searched().into_iter().map(|(n, _)| n).filter(|n| !entry.contains_key(n)).collect();
        if !missing.is_empty() {
            return error(format!(
                "study {name}: a told configuration sets every parameter; missing: {}",
                missing.join(", ")
            ));
        }
        let Some(active) = self.studies.get_mut(name) else { return error(format!("study {name} ended")) };
        active.search.tell_configuration(entry.clone());
        let Some(trials) = active.search.next_trials_while(&[]) else {
            return error(format!("study {name} takes no more configurations"));
        };
        let numbers: Vec<u64> = trials.iter().map(|t| t.trial).collect();
        let created = self.store.batch().map_err(EngineError::from).and_then(|mut batch| {
            active.create(&mut self.sched, &mut batch, trials)?;
            batch.commit().map_err(EngineError::from)
        });
        if let Err(e) = created {
            return error(e.to_string());
        }
        if active.search.exhausted() {
            self.sched.set_open(name, false);
        }
        tracing::info!(study = %name, params = ?entry, trials = ?numbers, "configuration told");
        Answer::Created { message: format!("told study {name}: trials {numbers:?}"), trials: numbers }
    }

    /// Creates the study in the store, or resumes it if it is there already
    /// with the same configuration, and starts scheduling its trials; what
    /// the progress display starts with.
    pub fn start_study(&mut self, study: Study, now: Now) -> Result<Started, EngineError> {
        if self.book.is_none() {
            self.book = Some(load_book(&self.store)?);
        }
        let id = {
            let mut batch = self.store.batch()?;
            open_study(&mut batch, &study, &[])?;
            // Drawn the first time the study runs, kept in the store after.
            let id = batch.study_id(&study.name, rand::random())?;
            // The scheduler takes the open attempts back as started: so does the store.
            batch.clear_held(&study.name)?;
            batch.commit()?;
            id
        };
        let rows = self.store.trials(&study.name)?;
        let plans: Vec<TrialPlan> = rows.iter().map(|r| r.plan.clone()).collect();
        let mut search = Search::new(&study);
        search.restore(&study, &rows);
        let mut states = Vec::with_capacity(rows.len());
        let mut values: Vec<(u64, f64, Option<f64>, String)> = Vec::new();
        // Trials ASHA stopped: told to the search with their last report below.
        let mut stopped: HashMap<u64, tunefleet_common::params::Params> = HashMap::new();
        for row in rows {
            if row.plan.trial != states.len() as u64 {
                tracing::error!(study = %study.name, trial = row.plan.trial, "trial ids in the store are not dense; later trials ignored");
                break;
            }
            states.push(match row.state {
                TrialState::Pending => Restored::Pending { last_attempt: row.attempts, failures: row.failures },
                TrialState::Running => Restored::Running {
                    agent: row.agent.clone().unwrap_or_default(),
                    attempt: row.attempts,
                    failures: row.failures,
                },
                TrialState::Done => Restored::Done,
                TrialState::Failed => Restored::Failed,
                TrialState::Stopped => {
                    stopped.insert(row.plan.trial, row.plan.params.clone());
                    Restored::Stopped
                }
            });
            if let (Some(value), Some(agent)) = (row.objective(), row.agent.clone()) {
                values.push((row.plan.trial, value, row.violation(), agent));
            }
        }
        super::warm::warm_start(&self.store, &study, &mut search)?;
        let policy = StudyPolicy {
            name: study.name.clone(),
            id,
            selector: study.selector.clone(),
            max_attempts: study.max_attempts,
            ahead_per_slot: study.ahead_per_slot(),
            ahead_per_agent: study.ahead_per_agent(),
            lease_ms: study.timeout_ms() + LEASE_GRACE.as_millis() as u64,
            gpus: study.gpus,
            store_share: self.store_share,
        };
        self.sched.add_study(policy, states, now.engine_ms);
        self.sched.set_written(&study.name, self.store.written_by_agent(&study.name)?);
        self.sched.set_open(&study.name, !search.exhausted());
        let c = self.sched.counts(&study.name).unwrap_or_default();
        let shown = Started {
            study: study.name.clone(),
            total: search.planned().max(c.total),
            done: c.done + c.failed + c.stopped,
        };
        let mut active = ActiveStudy::new(study, search, plans);
        active.at_start = (c.failed, c.done);
        for (trial, value, violation, agent) in values {
            active.record_value(trial, value, violation, &agent);
        }
        self.replay_progress(&mut active, &stopped)?;
        self.studies.insert(active.study.name.clone(), active);
        Ok(shown)
    }

    /// What a coordinator that stopped had seen of `active`'s epochs, from
    /// the store: early stopping's rungs, the checkpoint each trial's latest
    /// attempt reported, and the last report of each trial ASHA `stopped`
    /// told to the search.
    fn replay_progress(
        &self,
        active: &mut ActiveStudy,
        stopped: &HashMap<u64, tunefleet_common::params::Params>,
    ) -> Result<(), EngineError> {
        let mut last_reports: HashMap<u64, (u32, f64)> = HashMap::new();
        for p in self.store.study_progress(&active.study.name)? {
            let judged = active.study.stopping_metric().0.to_string();
            if let (Some(asha), Some(&value)) = (active.asha.as_mut(), p.metrics.get(&judged)) {
                let _ = asha.report(p.trial, p.epoch, value);
            }
            // Counted to a target, a stopped trial's last report is not the objective: the worst.
            let to_target = active.study.objective.to_target.is_some();
            if let Some(value) = p
                .metrics
                .get(&judged)
                .map(|v| if to_target { f64::NAN } else { *v })
                .filter(|_| stopped.contains_key(&p.trial))
            {
                let last = last_reports.entry(p.trial).or_insert((p.epoch, value));
                if p.epoch >= last.0 {
                    *last = (p.epoch, value);
                }
            }
            // A checkpoint stored before the coordinator checked them (an
            // injected option, a path outside resume_prefix) is not resumed from.
            let usable = |c: &String| usable_checkpoint(&active.study, c).is_ok();
            match p.checkpoint.filter(usable) {
                Some(reference) => {
                    active.checkpoints.insert(p.trial, (p.epoch, reference));
                }
                // A later attempt that started over has no checkpoint yet.
                None if p.epoch <= 1 => {
                    active.checkpoints.remove(&p.trial);
                }
                None => {}
            }
        }
        for (trial, (epoch, value)) in last_reports {
            if let Some(params) = stopped.get(&trial) {
                active.search.tell_pruned(trial, params, epoch, value);
            }
        }
        Ok(())
    }
}
