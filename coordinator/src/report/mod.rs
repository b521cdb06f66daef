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
//! * Pareto clouds: up to [`svg::MAX_DOTS`] trials as dots, more as a
//!   density grid; every front point is drawn (a front of more than
//!   [`MAX_FRONT`] points by a stride).
//! * Timelines: each agent's [`Options::windows_per_agent`] most recent
//!   windows, for the [`Options::max_agents`] agents active most recently.
//! * Tables: the [`Options::best`] best configurations, every device class,
//!   at most [`MAX_REUSE_ROWS`] reuse decisions.
//!
//! The file stays under about 1 MB whatever the study's size.

mod class;
mod html;
mod sample;
mod svg;

use std::path::{Path, PathBuf};

pub use class::{summaries, ClassSummary};
pub use sample::{objective_series, system_text, timeline, ObjectiveSeries, Timeline};
pub use svg::Esc;

use crate::store::{AgentRow, BestRow, ProvenanceRow, Store, StoreError, StudyRow, Unranked, WindowRow};

/// The id of every chart on the page, present even when it has nothing to draw.
pub const CHART_IDS: [&str; 4] =
    ["chart-objective", "chart-pareto-time-energy", "chart-pareto-objective-energy", "chart-timelines"];

/// Most reuse decisions listed.
pub const MAX_REUSE_ROWS: usize = 500;
/// Most points of a Pareto front drawn.
pub const MAX_FRONT: usize = 1000;

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

/// How much the report shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Rows of the table of best configurations.
    pub best: usize,
    /// Most dots of the objective chart.
    pub max_points: usize,
    /// Most recent windows shown per agent.
    pub windows_per_agent: usize,
    /// Most agents in the timelines.
    pub max_agents: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { best: 10, max_points: 2000, windows_per_agent: 120, max_agents: 24 }
    }
}

/// One decision of the profile clusters about a trial: whether it reused a
/// cluster's configuration or was probed, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct ReuseRow {
    pub trial: u64,
    /// What was decided (`reused`, `probed`, `re-probed`...).
    pub decision: String,
    /// The cluster the trial's profile fell in, if any.
    pub cluster: Option<u32>,
    /// Distance of the profile to that cluster.
    pub distance: Option<f64>,
    /// The distance under which a configuration is reused.
    pub threshold: Option<f64>,
    pub reason: String,
}

/// Everything the page shows, read from the store.
#[derive(Debug, Clone)]
pub struct ReportData {
    pub study: StudyRow,
    /// When the report was made (Unix ms).
    pub generated_ms: u64,
    /// Ranked results, best first ([`Store::best`]).
    pub ranked: Vec<BestRow>,
    pub unranked: Unranked,
    pub agents: Vec<AgentRow>,
    /// The windows of each agent's most recent trials.
    pub windows: Vec<WindowRow>,
    /// Provenance of the best [`Options::best`] results.
    pub provenance: Vec<ProvenanceRow>,
    pub reuse: Vec<ReuseRow>,
    /// The profile clusters this study's jobs are members of.
    pub clusters: Vec<crate::query::profiles::ClusterView>,
    pub options: Options,
}

/// Reads what the report of `study` shows.
pub fn load(store: &Store, study: &str, options: Options) -> Result<ReportData, ReportError> {
    let row = store
        .study(study)?
        .ok_or_else(|| ReportError::UnknownStudy { study: study.to_string(), store: store.path().to_string() })?;
    let ranked = store.best(study, usize::MAX)?;
    let best: Vec<u64> = ranked.iter().take(options.best).map(|r| r.trial).collect();
    Ok(ReportData {
        generated_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        unranked: store.unranked(study)?,
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
