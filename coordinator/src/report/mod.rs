//! `tunefleet report STUDY -o report.html`: one self-contained HTML file
//! (inline CSS and SVG, no script, nothing fetched) that shows a study: the
//! objective over trials with the best so far, Pareto fronts of wall time
//! against energy and of the objective against energy, each agent's windows
//! over time coloured by system configuration (the probe window a
//! pipelined trial kept is marked), per device class summaries, the best
//! configurations with where their figures came from, and clusters and
//! reuse decisions.
//!
//! [`load`] reads the store into a [`ReportData`] of plain rows; [`render`]
//! is a pure function from it to the page, so tests build rows by hand.
//!
//! # Why hand-written SVG
//!
//! The report draws four kinds of chart, each a few dozen lines of SVG
//! text. plotters with its SVG backend would add a dependency for axes and
//! dots, and it writes one element per point with its style spelled out
//! (`<circle cx cy r opacity fill stroke stroke-width/>`, about 90 bytes a
//! dot: ~180 kB for a 2,000-point chart) where one `<path>` of zero-length
//! round-capped segments costs about 13 bytes a dot here (~26 kB); and the
//! HTML around the charts (ids the tests look for, `<title>` tooltips, CSS
//! classes) would still be ours. Hand-written SVG keeps the file's size
//! under our control at 100,000 trials, and every coordinate goes through
//! one formatter that never writes NaN.
//!
//! # Scale: what is drawn at 100,000 trials
//!
//! * Objective over trials: at most [`Options::max_points`] dots: every
//!   improvement of the best so far, and a deterministic stride over the
//!   other trials ([`sample::objective_series`]); the page says so.
//! * Pareto clouds: up to `svg::MAX_DOTS` trials as dots, more as a
//!   density grid; every front point is drawn (a front of more than
//!   [`MAX_FRONT`] points by a stride).
//! * Timelines: each agent's [`Options::windows_per_agent`] most recent
//!   windows, for the [`Options::max_agents`] agents active most recently.
//! * Tables: the [`Options::best`] best configurations, every device class,
//!   at most [`MAX_REUSE_ROWS`] reuse decisions.
//!
//! The file stays under about 1 MB whatever the study's size.

mod class;
mod data;
mod html;
pub use html::utc;
pub mod live;
mod plots;
mod sample;
mod svg;
pub mod views;

use std::path::{Path, PathBuf};

pub use class::{summaries, ClassSummary};
pub use data::{Options, ReportData, ReuseRow, CHART_IDS, MAX_FRONT, MAX_REUSE_ROWS};
pub use sample::{objective_series, system_text, timeline, ObjectiveSeries, Timeline};
pub use svg::Esc;

use crate::store::{Store, StoreError};

/// What went wrong making a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("no study {study:?} in {store}")]
    UnknownStudy { study: String, store: String },
    #[error("writing the report {path}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Profiles(#[from] crate::query::profiles::ProfilesError),
}

/// Reads what the report of `study` shows.
pub fn load(store: &Store, study: &str, options: Options) -> Result<ReportData, ReportError> {
    let row = store
        .study(study)?
        .ok_or_else(|| ReportError::UnknownStudy { study: study.to_string(), store: store.path().to_string() })?;
    let ranked = store.best(study, usize::MAX)?;
    let best: Vec<u64> = ranked.iter().take(options.best).map(|r| r.plan.trial).collect();
    Ok(ReportData {
        generated_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        unranked: store.unranked(study)?,
        planned: crate::query::status::planned(store, &row)?,
        failures: store.failure_causes(study)?,
        agents: store.agents()?,
        windows: store.recent_windows(study, options.windows_per_agent)?,
        provenance: store.provenance(study, &best)?,
        reuse: store
            .decisions(Some(study))?
            .into_iter()
            .map(|d| ReuseRow {
                trial: d.trial,
                decision: d.decision,
                cluster: d.cluster.and_then(|c| u32::try_from(c).ok()),
                distance: d.distance,
                threshold: d.threshold,
                reason: d.reason,
            })
            .collect(),
        clusters: crate::query::profiles::classes(store)?
            .into_iter()
            .flat_map(|c| c.clusters)
            .filter(|c| c.members.iter().any(|m| m.rsplit_once('/').is_some_and(|(s, _)| s == study)))
            .collect(),
        ranked,
        asks_energy: store.stored(study)?.and_then(|s| s.study()).is_some_and(|s| {
            s.objective.metric == "energy" || s.objective.also.contains(&crate::domain::study::Secondary::Energy)
        }),
        study: row,
        options,
    })
}

/// The page of `data`.
pub fn render(data: &ReportData) -> String {
    html::page(data)
}

/// Writes the report of `study` to `path`; returns its size in bytes.
pub fn write(store: &Store, study: &str, options: Options, path: &Path) -> Result<usize, ReportError> {
    let page = render(&load(store, study, options)?);
    std::fs::write(path, &page).map_err(|source| ReportError::Write { path: path.to_path_buf(), source })?;
    Ok(page.len())
}
