//! `tunefleet best`: a study's best trials, four ways. Ranked by the
//! objective (with what reuse decided for each); its configurations by mean
//! objective when the study runs each more than once; the Pareto front of
//! the objective against `objective.also`; the best per device class. Each
//! is computed from the store's rows into a [`View`], which `crate::cli` renders as the
//! text `best` prints or serialises as the JSON `best --json` prints.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use tunefleet_common::message::SystemParams;
use tunefleet_common::params::Params;

use crate::domain::study::{self, Direction, Secondary, StudyError};
use crate::store::{AgentRow, DecisionRow, Ranked, Store, StoreError, Unranked};

/// Which view `best` asks for (the flags `--pareto` and `--by-class`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BestAsk {
    /// The `n` best trials, or, for a study that repeats its
    /// configurations, its `n` best configurations.
    Best,
    Pareto,
    ByClass,
}

/// What `best` shows, as data; `view` names the variant in JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "view", rename_all = "snake_case")]
pub enum View {
    /// The best trials, best first.
    Ranked {
        study: String,
        trials: Vec<RankedTrial>,
        /// Successful trials left out, and why.
        unranked: Unranked,
        /// Set when the trials took their energy from different sources.
        mixed_sources: Option<String>,
        /// Each parameter's share of the objective's variance it explains
        /// alone, over every ranked trial ([`crate::domain::importance`]).
        importance: Vec<(String, f64)>,
        /// How many ranked trials that was computed over.
        ranked: usize,
    },
    /// A study that runs each configuration more than once: its best
    /// configurations by mean objective.
    Configurations { study: String, metric: String, direction: Direction, configurations: Vec<Configuration> },
    /// The trials no other beats on the objective and on every axis.
    Pareto {
        study: String,
        metric: String,
        direction: Direction,
        /// What the objective is weighed against (all minimised).
        axes: Vec<Secondary>,
        /// Trials considered: successful, every figure valid.
        considered: usize,
        front: Vec<Ranked>,
        mixed_sources: Option<String>,
        /// The volume the front dominates up to `reference` (objective in
        /// its own direction, then the axes): Optuna's reference point, each
        /// worst value among the trials considered moved 10 % further out.
        /// `None` without trials.
        hypervolume: Option<Hypervolume>,
    },
    /// The best trials of each device class (architecture, cores, energy source).
    ByClass { study: String, classes: Vec<ClassBest> },
}

/// The hypervolume of a Pareto front and the point it is measured from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Hypervolume {
    pub volume: f64,
    /// The objective (as the metric reports it), then each axis.
    pub reference: Vec<f64>,
}

/// A ranked trial and what reuse decided for the attempt that gave its result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankedTrial {
    #[serde(flatten)]
    pub row: Ranked,
    pub decisions: Vec<DecisionRow>,
    /// What its agent said disturbed the measurement (other work on the
    /// machine); empty when nothing did.
    pub interference: Vec<String>,
}

/// One configuration of a study that repeats its configurations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Configuration {
    pub params: Params,
    /// The system configuration of its first ranked run.
    pub system: Option<SystemParams>,
    pub mean: f64,
    /// Standard deviation over |mean| (`None` with a single run).
    pub spread: Option<f64>,
    /// Its runs: trial and objective, best ranked first.
    pub runs: Vec<(u64, f64)>,
}

/// The best trials of one device class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassBest {
    pub class: String,
    /// How many trials of the class are ranked.
    pub ranked: usize,
    /// Its `n` best.
    pub trials: Vec<Ranked>,
}

/// Why there is nothing to show.
#[derive(Debug, thiserror::Error)]
pub enum BestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Study(#[from] StudyError),
    #[error("no study {study:?} in {store}; {known}")]
    NoStudy { study: String, store: String, known: String },
    #[error("study {study:?} has no successful trial in {store}: {why}")]
    NoSuccess { study: String, store: String, why: String },
    #[error("study {study:?} has no trial to rank in {store}: {note}")]
    NothingRanked { study: String, store: String, note: String },
}

/// The class of a result whose agent the store does not know.
pub const UNKNOWN_AGENT: &str = "unknown agent";

/// `rows` grouped by the device class of their agent, by class name; each
/// group keeps the order of `rows` (best first, as [`crate::store::Store::best`] gives them).
pub fn by_class<'a>(rows: &'a [Ranked], agents: &[AgentRow]) -> BTreeMap<String, Vec<&'a Ranked>> {
    let classes: HashMap<&str, String> = agents.iter().map(|a| (a.name.as_str(), a.info.device_class())).collect();
    let mut groups: BTreeMap<String, Vec<&Ranked>> = BTreeMap::new();
    for r in rows {
        let class = classes.get(r.result.agent.as_str()).cloned().unwrap_or_else(|| UNKNOWN_AGENT.to_string());
        groups.entry(class).or_default().push(r);
    }
    groups
}

/// The view `ask` of `study`, with at most `n` trials (or configurations)
/// per list; the Pareto front is shown whole.
pub fn view(store: &Store, study: &str, n: usize, ask: BestAsk) -> Result<View, BestError> {
    if store.study(study)?.is_none() {
        return Err(no_study(store, study));
    }
    match ask {
        BestAsk::Pareto => pareto_front(store, study),
        BestAsk::ByClass => best_by_class(store, study, n),
        BestAsk::Best => match repeated_configurations(store, study, n)? {
            Some(view) => Ok(view),
            None => ranked(store, study, n),
        },
    }
}

fn no_success(store: &Store, study: &str) -> BestError {
    let counts = store.study(study).ok().flatten().map(|_| store.failure_causes(study));
    let why = match counts {
        Some(Ok(causes)) if !causes.is_empty() => {
            let failed = causes.iter().map(|(_, n)| n).sum();
            crate::domain::failure::summary(failed, &causes, 3)
        }
        _ => "no trial has finished yet".to_string(),
    };
    BestError::NoSuccess { study: study.to_string(), store: store.path().to_string(), why }
}

/// [`BestError::NoStudy`], naming the studies the store does have.
pub fn no_study(store: &Store, study: &str) -> BestError {
    let names: Vec<String> = store.studies().map(|v| v.into_iter().map(|r| r.name).collect()).unwrap_or_default();
    let known =
        if names.is_empty() { "it has no study yet".to_string() } else { format!("its studies: {}", names.join(", ")) };
    BestError::NoStudy { study: study.to_string(), store: store.path().to_string(), known }
}

fn ranked(store: &Store, study: &str, n: usize) -> Result<View, BestError> {
    let rows = store.best(study, n)?;
    let unranked = store.unranked(study)?;
    if rows.is_empty() {
        return Err(match unranked_note(&unranked) {
            Some(note) => BestError::NothingRanked { study: study.to_string(), store: store.path().to_string(), note },
            None => no_success(store, study),
        });
    }
    let mixed_sources = mixed_sources(rows.iter().map(|r| r.result.energy.source_name()));
    let decisions = store.decisions(Some(study))?;
    let shown: Vec<u64> = rows.iter().map(|r| r.plan.trial).collect();
    let provenance = store.provenance(study, &shown)?;
    let trials = rows
        .into_iter()
        .map(|row| {
            let decisions = decisions
                .iter()
                .filter(|d| d.trial == row.plan.trial && d.attempt == row.result.attempt)
                .cloned()
                .collect();
            let interference = provenance
                .iter()
                .find(|p| p.trial == row.plan.trial)
                .map(|p| p.interference.clone())
                .unwrap_or_default();
            RankedTrial { row, decisions, interference }
        })
        .collect();
    let all = store.best(study, usize::MAX)?;
    let importance = crate::domain::importance::importance(
        &all.iter().map(|r| (r.plan.params.clone(), r.objective())).collect::<Vec<_>>(),
    );
    Ok(View::Ranked { study: study.to_string(), trials, unranked, mixed_sources, importance, ranked: all.len() })
}

/// The `n` best trials of `study` in each device class of the agents that ran them.
fn best_by_class(store: &Store, study: &str, n: usize) -> Result<View, BestError> {
    let rows = store.best(study, usize::MAX)?;
    let groups = by_class(&rows, &store.agents()?);
    if groups.is_empty() {
        return Err(no_success(store, study));
    }
    let classes = groups
        .into_iter()
        .map(|(class, rows)| ClassBest {
            class,
            ranked: rows.len(),
            trials: rows.into_iter().take(n).cloned().collect(),
        })
        .collect();
    Ok(View::ByClass { study: study.to_string(), classes })
}

/// When some configuration of `study` ran more than once: its
/// configurations in the one ranking order ([`crate::domain::rank`], the
/// order [`Store::best`] returns), each with its runs (`None` when every
/// configuration ran once: the trials are the configurations then).
fn repeated_configurations(store: &Store, study: &str, n: usize) -> Result<Option<View>, BestError> {
    let Some(row) = store.study(study)? else { return Ok(None) };
    let rows = store.best(study, usize::MAX)?;
    if rows.iter().all(|r| r.runs < 2) {
        return Ok(None);
    }
    // Runs of one configuration come together, best first: the first of
    // each group leads it.
    let mut configurations: Vec<Configuration> = Vec::new();
    for r in rows {
        let full = configurations.len() == n;
        match configurations.last_mut().filter(|c| c.params == r.plan.params) {
            Some(c) => c.runs.push((r.plan.trial, r.objective())),
            None if full => break,
            None => configurations.push(Configuration {
                runs: vec![(r.plan.trial, r.objective())],
                params: r.plan.params,
                system: r.result.system,
                mean: r.mean,
                spread: None,
            }),
        }
    }
    for c in &mut configurations {
        let values: Vec<f64> = c.runs.iter().map(|r| r.1).collect();
        c.spread = crate::domain::search::spread(&values);
    }
    Ok(Some(View::Configurations {
        study: study.to_string(),
        metric: row.metric,
        direction: row.direction,
        configurations,
    }))
}

/// The Pareto front of a study: its objective (in its direction) against
/// the objectives of `objective.also` (energy when none), all trials with a
/// successful result and every figure valid; in a study with constraints,
/// of the results that meet them (the constrained front, as Optuna's
/// `best_trials`: empty while none does).
fn pareto_front(store: &Store, study: &str) -> Result<View, BestError> {
    let row = store.study(study)?.ok_or_else(|| no_study(store, study))?;
    let parsed = match store.stored(study)?.and_then(|s| s.study()) {
        Some(parsed) => parsed,
        // Not readable by this program: the parse error says why.
        None => study::parse(&row.config, &format!("study {study:?} in the store"))?,
    };
    let mut axes = parsed.objective.also.clone();
    if axes.is_empty() {
        axes.push(Secondary::Energy);
    }
    let rows: Vec<_> = store
        .best(study, usize::MAX)?
        .into_iter()
        .filter(|r| !axes.contains(&Secondary::Energy) || r.energy().counted().is_some())
        .filter(|r| !r.result.violation.is_some_and(|v| v > 0.0))
        .collect();
    let sign = if parsed.objective.direction == Direction::Maximize { -1.0 } else { 1.0 };
    let points: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| std::iter::once(sign * r.objective()).chain(axes.iter().map(|&a| figure(r, a))).collect())
        .collect();
    let on_front = tunefleet_search::pareto::front(&points);
    let hypervolume = tunefleet_search::pareto::reference_point(&points).map(|reference| {
        let front_points: Vec<Vec<f64>> = on_front.iter().map(|&i| points[i].clone()).collect();
        let volume = tunefleet_search::pareto::hypervolume(&front_points, &reference);
        let mut reference = reference;
        reference[0] *= sign;
        Hypervolume { volume, reference }
    });
    let front: Vec<Ranked> = on_front.into_iter().map(|i| rows[i].clone()).collect();
    Ok(View::Pareto {
        hypervolume,
        study: study.to_string(),
        metric: parsed.objective.metric,
        direction: parsed.objective.direction,
        axes,
        considered: rows.len(),
        mixed_sources: mixed_sources(front.iter().map(|r| r.result.energy.source_name())),
        front,
    })
}

/// The figure of `r` on a Pareto axis: energy in joules (NaN when it does
/// not count), wall time in seconds.
pub fn figure(r: &Ranked, axis: Secondary) -> f64 {
    match axis {
        Secondary::Energy => r.energy().counted().unwrap_or(f64::NAN),
        Secondary::WallTime => r.result.wall_us as f64 / 1e6,
    }
}

/// A warning when ranked trials took their energy from different sources
/// (a RAPL joule and an estimated one are not the same quantity).
pub fn mixed_sources<'a>(sources: impl Iterator<Item = Option<&'a str>>) -> Option<String> {
    let mut seen: Vec<&str> = sources.map(|s| s.unwrap_or("none")).collect();
    seen.sort_unstable();
    seen.dedup();
    (seen.len() > 1).then(|| {
        format!("note: these trials were measured with different energy sources ({}); energy figures are not comparable across them", seen.join(", "))
    })
}

/// `  infeasible (misses its constraints by V)` for a result whose
/// configuration does not meet the study's constraints, else nothing.
pub fn infeasible_note(r: &Ranked) -> String {
    match r.feasible() {
        true => String::new(),
        false => format!("  infeasible (misses its constraints by {:.6})", r.mean_violation),
    }
}

/// What `best` left out and why, when it left anything out.
pub fn unranked_note(u: &Unranked) -> Option<String> {
    let mut why = Vec::new();
    if u.invalid_energy > 0 {
        why.push(format!("{} with an invalid energy reading", u.invalid_energy));
    }
    if u.no_value > 0 {
        why.push(format!("{} without a value for the objective", u.no_value));
    }
    let plural = if u.total() == 1 { "" } else { "s" };
    (!why.is_empty()).then(|| format!("{} successful trial{plural} not ranked: {}", u.total(), why.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::{mixed_sources, unranked_note};
    use crate::store::Unranked;

    #[test]
    fn unranked_trials_are_counted_with_why() {
        assert_eq!(unranked_note(&Unranked::default()), None);
        let one = unranked_note(&Unranked { invalid_energy: 1, no_value: 0 }).expect("a note");
        assert_eq!(one, "1 successful trial not ranked: 1 with an invalid energy reading");
        let both = unranked_note(&Unranked { invalid_energy: 2, no_value: 1 }).expect("a note");
        assert!(
            both.starts_with("3 successful trials not ranked: 2 with an invalid energy reading, 1 without"),
            "{both}"
        );
    }

    #[test]
    fn mixed_energy_sources_are_called_out() {
        assert_eq!(mixed_sources([Some("rapl"), Some("rapl")].into_iter()), None);
        let note = mixed_sources([Some("rapl"), Some("estimated"), None].into_iter()).expect("mixed");
        assert!(note.contains("estimated, none, rapl"), "{note}");
    }
}
