//! What a report shows ([`ReportData`]), how much of it ([`Options`]), and
//! the page's fixed limits: the data the loader reads and the page renders.

use crate::store::{AgentRow, ProvenanceRow, Ranked, StudyRow, Unranked, WindowRow};

/// The id of every chart on the page, present even when it has nothing to draw.
pub const CHART_IDS: [&str; 4] =
    ["chart-objective", "chart-pareto-time-energy", "chart-pareto-objective-energy", "chart-timelines"];

/// Most reuse decisions listed.
pub const MAX_REUSE_ROWS: usize = 500;
/// Most points of a Pareto front drawn.
pub const MAX_FRONT: usize = 1000;

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
    /// Ranked results, best first ([`crate::store::Store::best`]).
    pub ranked: Vec<Ranked>,
    pub unranked: Unranked,
    /// The trials the study plans in all (its budget), at least those it has.
    pub planned: u64,
    /// Its failed trials grouped by why they failed, most frequent first.
    pub failures: Vec<(String, u64)>,
    pub agents: Vec<AgentRow>,
    /// The windows of each agent's most recent trials.
    pub windows: Vec<WindowRow>,
    /// Provenance of the best [`Options::best`] results.
    pub provenance: Vec<ProvenanceRow>,
    pub reuse: Vec<ReuseRow>,
    /// The profile clusters this study's jobs are members of.
    pub clusters: Vec<crate::query::profiles::ClusterView>,
    /// The study asks for energy (its metric, or one of `also`).
    pub asks_energy: bool,
    pub options: Options,
}
