//! Reuse learning: the profile book loaded from the store ([`load_book`]),
//! a pipelined trial's first window decided on (reuse a configuration of
//! its cluster, or probe: [`apply_reuse`] performs what the dispatch decided), and a finished trial's profile
//! learnt, with the class's k-means model refitted as its records grow
//! ([`learn`]).
//!
//! The refit runs inside the turn that stores the result. It is amortised
//! ([`crate::domain::reuse::Class::stale_at`]: every record below 100, then each
//! time the records grew by a tenth), so it is rare, but choosing k is
//! quadratic in the records: with many thousands per class, it belongs on a
//! blocking task whose model comes back as an event of a later turn (the
//! store write and the book update would then move there too).

use tunefleet_common::message::{CoordinatorMessage, TrialRef};

use super::ctx::Ctx;
use super::dispatch::ReuseStep;
use super::types::EngineError;
use crate::store::Store;

/// Every profile record and stored model, by device class.
pub(super) fn load_book(store: &Store) -> Result<crate::domain::reuse::Book, EngineError> {
    let mut book = crate::domain::reuse::Book::default();
    for r in store.profile_records()? {
        book.classes.entry(r.class.clone()).or_default().records.push(r);
    }
    for (class, model, fitted_on) in store.cluster_models()? {
        let c = book.classes.entry(class).or_default();
        c.model = Some(model);
        c.fitted_on = usize::try_from(fitted_on).unwrap_or(usize::MAX);
    }
    for c in book.classes.values_mut() {
        c.place_all();
    }
    Ok(book)
}

/// What a pipelined attempt's first-window profile decided
/// ([`super::dispatch::ReuseStep`]): recorded, and a reused configuration
/// sent to the agent (it stops probing).
pub(super) fn apply_reuse(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    step: ReuseStep,
) -> Result<(), EngineError> {
    use crate::domain::reuse::{self, ReuseDecision};
    let ReuseStep { class, decision, malformed } = step;
    let Some(a) = cx.studies.get_mut(&trial.study) else { return Ok(()) };
    let mut row = crate::store::DecisionRow {
        study: trial.study.clone(),
        trial: trial.trial,
        attempt: trial.attempt,
        class,
        decision: "probe".into(),
        cluster: None,
        distance: None,
        threshold: None,
        system: None,
        expected: None,
        reason: decision.reason(),
        at_ms: cx.now.unix_ms,
    };
    match &decision {
        ReuseDecision::Reuse { cluster, distance, threshold, system, expected, .. } => {
            row.decision = "reuse".into();
            (row.cluster, row.distance, row.threshold) = (Some(*cluster as u64), Some(*distance), Some(*threshold));
            row.system = Some(reuse::system_text(system));
            row.expected = Some(*expected);
        }
        ReuseDecision::Probe { cluster, distance, threshold, .. } => {
            (row.cluster, row.distance, row.threshold) = (cluster.map(|c| c as u64), *distance, *threshold);
        }
    }
    // Written first: a store error leaves the attempt undecided, as it was.
    cx.batch.record_decision(&row)?;
    a.decided.insert((trial.trial, trial.attempt));
    if malformed {
        cx.stats.bad_profiles += 1;
    }
    match decision {
        ReuseDecision::Reuse { system, expected, .. } => {
            a.reused.insert(trial.trial, (system.clone(), expected));
            cx.stats.reused += 1;
            tracing::info!(trial = %trial, agent = %agent, reason = %row.reason, "configuration reused: probing skipped");
            cx.out.push((
                agent.to_string(),
                CoordinatorMessage::Reconfigure(tunefleet_common::message::Reconfigure {
                    trial: trial.clone(),
                    system,
                    reason: tunefleet_common::message::ReconfigureReason::Reuse,
                }),
            ));
        }
        ReuseDecision::Probe { .. } => tracing::info!(trial = %trial, agent = %agent, reason = %row.reason, "probing"),
    }
    Ok(())
}

/// A pipelined trial's result: its first-window profile, with how each
/// configuration ran, joins its device class's profiles (the model is
/// refitted as they grow); a reused configuration is checked against
/// what its cluster promised. Nothing is learnt from an agent the study's
/// selector does not admit.
pub(super) fn learn(
    cx: &mut Ctx<'_, '_>,
    agent: &str,
    trial: &TrialRef,
    m: &tunefleet_common::measurement::Measurement,
    now: u64,
) -> Result<(), EngineError> {
    use crate::domain::reuse::{self, Promise, Record};
    let Some(a) = cx.studies.get(&trial.study) else { return Ok(()) };
    let (Some(wp), Some(probe), Some(plan)) = (&m.window_profile, &a.probe, a.plans.get(trial.trial as usize)) else {
        return Ok(());
    };
    if reuse::check(&wp.profile).is_err() {
        return Ok(());
    }
    let Some(outcomes) = reuse::outcomes(&m.segments) else { return Ok(()) };
    let Some(class) = cx.sched.agent_class(agent) else { return Ok(()) };
    // Only agents the study's selector admits teach its device class.
    if !cx.sched.admits(&trial.study, agent) {
        tracing::info!(trial = %trial, agent = %agent, "profile not learnt: the study's selector does not admit this agent");
        return Ok(());
    }
    let reused = m.segments.iter().any(|s| s.role == tunefleet_common::measurement::SegmentRole::Reused);
    let mut worse = None;
    if let Some((system, expected)) = a.reused.get(&trial.trial).filter(|_| reused) {
        let verdict = reuse::verify(&outcomes, system, *expected, a.study.reuse.verify_bound);
        let (decision, reason, measured) = match &verdict {
            Promise::Kept { measured, .. } => (
                "kept",
                format!(
                    "the reused configuration ran at {measured:.3} x the first probe window, as promised ({expected:.3})"
                ),
                Some(*measured),
            ),
            Promise::Worse { why, measured, .. } => {
                cx.stats.reuse_worse += 1;
                tracing::warn!(trial = %trial, %why, "reused configuration ran slower than its record: its cluster is probed again");
                worse = Some(why.clone());
                ("worse", why.clone(), Some(*measured))
            }
            Promise::Unverified => ("kept", "not verified: no reused window was measured".to_string(), None),
        };
        cx.batch.record_decision(&crate::store::DecisionRow {
            study: trial.study.clone(),
            trial: trial.trial,
            attempt: trial.attempt,
            class: class.clone(),
            decision: decision.into(),
            cluster: None,
            distance: None,
            threshold: None,
            system: Some(reuse::system_text(system)),
            expected: measured,
            reason,
            at_ms: now,
        })?;
    }
    let profile = if reused { wp.profile.clone() } else { reuse::with_signature(wp, &outcomes, probe.select) };
    let workload = a.study.program().to_string();
    let record = Record {
        study: trial.study.clone(),
        trial: trial.trial,
        class: class.clone(),
        workload,
        identity: a.study.workload(),
        group: reuse::group_key(&a.study.reuse.group, &plan.params),
        profile,
        outcomes,
        reused,
        worse,
        at_ms: now,
    };
    cx.batch.record_profile(&record)?;
    add_to_book(cx, class, record, now)
}

/// `record` joins its device class's profiles in the store and the book:
/// the class's model is refitted first when it is stale, and written
/// before the book changes (a store error leaves the book as the store
/// has it).
fn add_to_book(
    cx: &mut Ctx<'_, '_>,
    class: String,
    record: crate::domain::reuse::Record,
    now: u64,
) -> Result<(), EngineError> {
    use crate::domain::reuse::Record;
    let c = cx.book.classes.entry(class.clone()).or_default();
    let same = |r: &Record| r.study == record.study && r.trial == record.trial;
    let replaced = c.records.iter().any(same);
    let mut refitted = None;
    if c.stale_at(c.records.len() + usize::from(!replaced)) {
        let profiles: Vec<tunefleet_common::profile::Profile> =
            c.records.iter().filter(|r| !same(r)).chain(std::iter::once(&record)).map(|r| r.profile.clone()).collect();
        match crate::domain::cluster::fit(&profiles, &crate::domain::cluster::FitOptions::default()) {
            Ok(fitted) => {
                tracing::info!(class = %class, k = fitted.model.k(), profiles = profiles.len(), "profile clusters refitted");
                cx.batch.record_model(&class, &fitted.model, profiles.len(), now)?;
                refitted = Some((fitted.model, profiles.len()));
            }
            Err(e) => tracing::warn!(class = %class, error = %e, "cannot cluster profiles"),
        }
    }
    let placed = c.model.as_ref().and_then(|m| m.place(&record.profile)).map(|p| p.cluster);
    c.records.retain(|r| !same(r));
    c.records.push(record);
    // A refit or a replaced record places every record again; else only the new one.
    if let Some((model, fitted_on)) = refitted {
        c.model = Some(model);
        c.fitted_on = fitted_on;
        c.place_all();
    } else if replaced {
        c.place_all();
    } else {
        c.clusters.push(placed);
    }
    Ok(())
}
