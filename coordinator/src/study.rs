//! Study files: the TOML description of a tuning study, parsed and validated
//! before anything starts.
//!
//! Every problem is reported with the file name, line and column it refers
//! to (`study.toml:14:7: hyper.lr: low (2) must be below high (1)`). Unknown
//! keys are refused everywhere, so a typo never silently falls back to a
//! default. The parsed [`Study`] keeps the original text in
//! [`Study::source`], so the store can record it and a resumed study can be
//! compared with the one that was started.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Spanned;
use tunefleet_common::measurement::{Measurement, SegmentRole};
use tunefleet_common::message::{AgentInfo, Select, WindowUnit};
use tunefleet_common::params::ParamValue;
use tunefleet_common::template;

/// Placeholders every command template may use besides the parameters.
pub const BUILTINS: [&str; 4] = ["study", "trial", "attempt", "repeat"];

/// Placeholders a `resume` template may use besides the command's.
pub const RESUME_BUILTINS: [&str; 2] = ["checkpoint", "checkpoint_epoch"];

/// Default seconds per trial attempt.
pub const DEFAULT_TIMEOUT_S: u64 = 600;
/// Default attempts before a trial is failed.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Default number of grid points of a float or log_float parameter.
pub const DEFAULT_GRID_POINTS: u32 = 5;
/// Most trials a study may plan (the plan is kept in memory and in the store).
pub const MAX_BUDGET: u64 = 10_000_000;
/// Longest study or parameter name.
pub const MAX_NAME_LEN: usize = 64;

/// Where in the study file a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

impl Location {
    /// The line and column of byte offset `offset` in `text`.
    pub fn of_offset(text: &str, offset: usize) -> Self {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
    }
}

fn fmt_location(location: &Option<Location>) -> String {
    match location {
        Some(l) => format!(":{}:{}", l.line, l.column),
        None => String::new(),
    }
}

/// Why a study file was refused.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("{}: cannot read study file: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}{}: {message}", fmt_location(location))]
    Invalid { origin: String, location: Option<Location>, message: String },
}

impl StudyError {
    /// Where the problem is, when it is about a place in the file.
    pub fn location(&self) -> Option<Location> {
        match self {
            StudyError::Read { .. } => None,
            StudyError::Invalid { location, .. } => *location,
        }
    }
}

/// Whether the objective is to be made small or large.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Minimize,
    Maximize,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Minimize => "minimize",
            Direction::Maximize => "maximize",
        }
    }

    /// Parses `minimize` or `maximize`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "minimize" => Some(Direction::Minimize),
            "maximize" => Some(Direction::Maximize),
            _ => None,
        }
    }

    /// True when `a` is a better objective value than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Direction::Minimize => a < b,
            Direction::Maximize => a > b,
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a study optimises.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Objective {
    /// A metric the workload reports, or `wall_time`, `cpu_time`, `energy`.
    pub metric: String,
    pub direction: Direction,
    /// Further objectives, minimised: the study's result is then the Pareto
    /// front of the metric and these (`tunefleet best --pareto`). Search
    /// strategies and early stopping follow `metric` alone.
    pub also: Vec<Secondary>,
    /// How a trial's value of `metric` is read.
    pub aggregate: Aggregate,
}

/// How a trial's objective is read from its measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// The workload's final value (its `final` line, else its last epoch):
    /// a model's accuracy or loss.
    #[default]
    Final,
    /// The mean of the metric over the epochs run under the configuration
    /// the trial kept: a pipelined trial's `Selected` segment, every epoch
    /// but the first of any other trial (the first carries start-up). For a
    /// performance metric (bandwidth, throughput), which the probe windows
    /// of a pipelined trial would otherwise mix in.
    KeptMean,
}

/// A measured quantity a multi-objective study also minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Secondary {
    /// Joules of the trial (valid readings only).
    Energy,
    /// Seconds of the trial, start to exit.
    WallTime,
}

impl Secondary {
    pub fn as_str(self) -> &'static str {
        match self {
            Secondary::Energy => "energy",
            Secondary::WallTime => "wall_time",
        }
    }
}

/// How trial configurations are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Strategy {
    /// The cartesian product of every parameter's grid, in a stable order.
    Grid,
    /// Seeded sampling: the same seed gives the same trials.
    Random { seed: u64 },
    /// Tree-structured Parzen Estimator (Optuna's default), seeded: learns
    /// from each result which regions to sample next.
    Tpe { seed: u64 },
}

/// Which agents may run the trials of a study.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Selector {
    /// Any of these architectures; empty means any.
    pub arch: Vec<String>,
    /// All of these tags must match the agent's tags.
    pub tags: BTreeMap<String, String>,
    /// Any of these energy sources, readable on the agent; empty means any.
    pub energy: Vec<String>,
    /// At least this many CPUs.
    pub min_cores: Option<u32>,
    /// At least this much memory, in MiB.
    pub min_memory_mib: Option<u64>,
}

/// A device group of a study: its own selector (the study's, with what the
/// group says instead) and budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub name: String,
    pub selector: Selector,
    pub budget: u64,
}

/// Energy source names a selector may ask for.
pub const ENERGY_SOURCES: [&str; 5] = ["rapl", "hwmon", "battery", "estimated", "external"];

impl Selector {
    /// This selector narrowed by a group's: the group's architectures and
    /// energy sources when it names any, both sets of tags, the larger minimums.
    pub fn within(&self, group: Selector) -> Selector {
        let mut tags = self.tags.clone();
        tags.extend(group.tags);
        Selector {
            arch: if group.arch.is_empty() { self.arch.clone() } else { group.arch },
            tags,
            energy: if group.energy.is_empty() { self.energy.clone() } else { group.energy },
            min_cores: group.min_cores.max(self.min_cores),
            min_memory_mib: group.min_memory_mib.max(self.min_memory_mib),
        }
    }

    /// True when `agent` may run trials of the study.
    pub fn matches(&self, agent: &AgentInfo) -> bool {
        (self.arch.is_empty() || self.arch.contains(&agent.arch))
            && self.tags.iter().all(|(k, v)| agent.tags.get(k) == Some(v))
            && (self.energy.is_empty()
                || agent.energy.iter().any(|e| e.readable && self.energy.iter().any(|n| n == e.kind.as_str())))
            && self.min_cores.is_none_or(|n| agent.cores >= n)
            && self.min_memory_mib.is_none_or(|m| agent.memory_bytes >= m.saturating_mul(1 << 20))
    }
}

/// The domain of one parameter.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ParamSpec {
    /// One of these values (non-empty, no duplicates).
    Categorical { values: Vec<ParamValue> },
    /// `low, low + step, ...` up to and including `high` when on the lattice.
    Int { low: i64, high: i64, step: i64 },
    /// Uniform between `low` and `high`; `grid` points for the grid strategy.
    Float { low: f64, high: f64, grid: u32 },
    /// Log-uniform between `low > 0` and `high`; `grid` geometric points.
    LogFloat { low: f64, high: f64, grid: u32 },
}

/// A system parameter the agent applies for real.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemParam {
    /// CPUs the process tree is pinned to.
    Cores,
    /// OMP_NUM_THREADS and friends.
    Threads,
    /// Memory limit in MiB.
    Memory,
}

impl SystemParam {
    pub const ALL: [SystemParam; 3] = [SystemParam::Cores, SystemParam::Threads, SystemParam::Memory];

    pub fn as_str(self) -> &'static str {
        match self {
            SystemParam::Cores => "cores",
            SystemParam::Threads => "threads",
            SystemParam::Memory => "memory",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        SystemParam::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for SystemParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which system configurations a pipelined trial probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeOrder {
    /// PipeTune's: the default configuration, then each other value of one
    /// parameter at a time with the others at their default.
    OneAtATime,
    /// Every combination, the default first.
    Grid,
}

/// `[pipeline] mode = "pipelined"`: system parameters are probed inside
/// each trial instead of being searched across trials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pipelined {
    pub probe: ProbeOrder,
    /// Units (epochs or steps) per probe window.
    pub window: u32,
    /// Units under the default configuration before the first window.
    pub warmup: u32,
    pub unit: WindowUnit,
    pub select: Select,
    /// The workload speaks the control channel (live thread counts).
    pub control: bool,
}

/// `[early_stopping] kind = "asha"`: asynchronous successive halving on
/// the objective as trials report it epoch by epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EarlyStopping {
    /// Keep the best `1 / reduction` at each rung (default 3).
    pub reduction: u32,
    /// Epochs before the first rung (default 1).
    pub grace: u32,
}

/// `[stability]`: measure each configuration again until its objective is
/// stable: after `repeats` runs, another one while the coefficient of
/// variation (standard deviation over the absolute mean) of its values is
/// above `spread`, up to `max_repeats` runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stability {
    pub spread: f64,
    pub max_repeats: u32,
}

/// A validated study.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Study {
    pub name: String,
    /// argv template; `{name}` placeholders name parameters or builtins.
    pub command: Vec<String>,
    /// Environment templates, added to the workload's environment.
    pub env: BTreeMap<String, String>,
    /// Arguments appended to `command` when a trial goes on from the
    /// checkpoint its workload reported (a trial moved off an overloaded
    /// agent); they may use `{checkpoint}` and `{checkpoint_epoch}`.
    pub resume: Vec<String>,
    /// Where checkpoints must be (`resume_prefix`): a checkpoint an agent
    /// reports elsewhere is refused and never resumed from.
    pub resume_prefix: Option<String>,
    /// Seconds per trial attempt.
    pub timeout_s: u64,
    /// Runs of each configuration.
    pub repeats: u32,
    /// Attempts before a trial is failed.
    pub max_attempts: u32,
    pub objective: Objective,
    /// Trials to run, repeats included.
    pub budget: u64,
    pub strategy: Strategy,
    pub selector: Selector,
    pub hyper: BTreeMap<String, ParamSpec>,
    pub system: BTreeMap<SystemParam, ParamSpec>,
    pub early_stopping: Option<EarlyStopping>,
    pub stability: Option<Stability>,
    /// Pipelined mode; `None`: sequential (a trial per hyper x system configuration).
    pub pipeline: Option<Pipelined>,
    /// `[reuse]`: configurations known good for jobs that profile alike
    /// ([`crate::reuse`]); pipelined studies only.
    pub reuse: crate::reuse::Policy,
    /// `[[group]]`: device groups (phones, Graviton, x86...) tuned apart,
    /// each with its selector and budget; see [`Study::expand`].
    pub groups: Vec<Group>,
    /// Where the study was read from (a path or `<stdin>`), for messages.
    pub origin: String,
    /// The study file exactly as it was read.
    pub source: String,
}

impl Study {
    /// The studies this file runs as: itself, or with `[[group]]`s one per
    /// group, named `STUDY-GROUP`, with the group's selector and budget and
    /// everything else the same (each reports apart, side by side on the
    /// fleet). The stored configuration is the whole file, so a resumed
    /// group study finds itself again with [`Study::expand`].
    pub fn expand(&self) -> Vec<Study> {
        if self.groups.is_empty() {
            return vec![self.clone()];
        }
        self.groups
            .iter()
            .map(|g| Study {
                name: format!("{}-{}", self.name, g.name),
                selector: g.selector.clone(),
                budget: g.budget,
                groups: Vec::new(),
                ..self.clone()
            })
            .collect()
    }

    /// Every parameter in the stable order used by the search strategies:
    /// hyper-parameters by name, then system parameters (cores, threads, memory).
    pub fn parameters(&self) -> impl Iterator<Item = (&str, &ParamSpec)> {
        self.hyper.iter().map(|(k, v)| (k.as_str(), v)).chain(self.system.iter().map(|(k, v)| (k.as_str(), v)))
    }

    /// The parameters the search strategy chooses, in the order of
    /// [`Study::parameters`].
    /// In pipelined mode only the hyper-parameters: system parameters are
    /// probed inside each trial.
    pub fn searched(&self) -> Vec<(String, ParamSpec)> {
        if self.pipeline.is_some() {
            return self.hyper.iter().map(|(name, spec)| (name.clone(), spec.clone())).collect();
        }
        self.parameters().map(|(name, spec)| (name.to_string(), spec.clone())).collect()
    }

    /// A successful measurement's objective value, as `objective.aggregate` says.
    pub fn objective_value(&self, m: &Measurement) -> Option<f64> {
        let metric = &self.objective.metric;
        match self.objective.aggregate {
            Aggregate::Final => m.objective_value(metric),
            Aggregate::KeptMean => {
                let kept = m.segments.iter().rev().find(|s| s.role == SegmentRole::Selected);
                let (first, last) = match kept {
                    Some(s) => (s.first_epoch, s.last_epoch),
                    None => (2, u32::MAX),
                };
                let values: Vec<f64> = m
                    .epochs
                    .iter()
                    .filter(|e| (first..=last).contains(&e.epoch))
                    .filter_map(|e| e.metrics.get(metric).copied())
                    .collect();
                if values.is_empty() {
                    // Too short to have kept epochs: the final value.
                    return m.objective_value(metric);
                }
                Some(values.iter().sum::<f64>() / values.len() as f64)
            }
        }
    }

    /// Timeout of one attempt in milliseconds.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_s.saturating_mul(1000)
    }
}

/// Reads and validates the study file at `path`.
pub fn load(path: &Path) -> Result<Study, StudyError> {
    let text = std::fs::read_to_string(path).map_err(|source| StudyError::Read { path: path.to_path_buf(), source })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates study text; `origin` names it in error messages.
pub fn parse(text: &str, origin: &str) -> Result<Study, StudyError> {
    let ctx = Ctx { origin, text };
    let raw: RawStudy = toml::from_str(text).map_err(|e| ctx.toml(&e))?;
    ctx.validate(raw)
}

// ---------------------------------------------------------------------------
// The file as written, with spans.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStudy {
    name: Spanned<String>,
    command: Spanned<Vec<Spanned<String>>>,
    env: Option<Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    resume: Option<Spanned<Vec<Spanned<String>>>>,
    resume_prefix: Option<Spanned<String>>,
    timeout: Option<Spanned<i64>>,
    repeats: Option<Spanned<i64>>,
    max_attempts: Option<Spanned<i64>>,
    objective: RawObjective,
    budget: RawBudget,
    strategy: RawStrategy,
    selector: Option<RawSelector>,
    hyper: Option<Spanned<BTreeMap<Spanned<String>, Spanned<RawParam>>>>,
    system: Option<Spanned<BTreeMap<Spanned<String>, Spanned<RawParam>>>>,
    pipeline: Option<Spanned<RawPipeline>>,
    early_stopping: Option<RawEarlyStopping>,
    stability: Option<Spanned<RawStability>>,
    reuse: Option<Spanned<RawReuse>>,
    group: Option<Vec<Spanned<RawGroup>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    name: Spanned<String>,
    budget: Option<Spanned<i64>>,
    selector: Option<RawSelector>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReuse {
    enabled: Option<bool>,
    group: Option<Vec<Spanned<String>>>,
    radius_factor: Option<f64>,
    min_threshold: Option<f64>,
    verify_bound: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStability {
    spread: f64,
    max_repeats: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum EarlyStoppingKind {
    Asha,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEarlyStopping {
    #[allow(dead_code)]
    kind: EarlyStoppingKind,
    reduction: Option<Spanned<i64>>,
    grace: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum PipelineMode {
    Pipelined,
    Sequential,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPipeline {
    mode: PipelineMode,
    probe: Option<Spanned<String>>,
    window: Option<Spanned<RawWindow>>,
    select: Option<Spanned<toml::Value>>,
    #[serde(default)]
    control: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    epochs: Option<Spanned<i64>>,
    warmup: Option<Spanned<i64>>,
    steps: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawObjective {
    metric: Spanned<String>,
    direction: Direction,
    #[serde(default)]
    also: Vec<Secondary>,
    #[serde(default)]
    aggregate: Aggregate,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    trials: Spanned<i64>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum StrategyKind {
    Grid,
    Random,
    Tpe,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStrategy {
    kind: StrategyKind,
    seed: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelector {
    #[serde(default)]
    arch: Vec<String>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    energy: Vec<Spanned<String>>,
    min_cores: Option<Spanned<i64>>,
    min_memory_mib: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum ParamKind {
    Categorical,
    Int,
    Float,
    LogFloat,
}

impl ParamKind {
    fn as_str(self) -> &'static str {
        match self {
            ParamKind::Categorical => "categorical",
            ParamKind::Int => "int",
            ParamKind::Float => "float",
            ParamKind::LogFloat => "log_float",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawParam {
    kind: Spanned<ParamKind>,
    low: Option<Spanned<toml::Value>>,
    high: Option<Spanned<toml::Value>>,
    step: Option<Spanned<i64>>,
    grid: Option<Spanned<i64>>,
    values: Option<Spanned<Vec<Spanned<toml::Value>>>>,
}

// ---------------------------------------------------------------------------
// Validation.

struct Ctx<'a> {
    origin: &'a str,
    text: &'a str,
}

impl Ctx<'_> {
    fn at(&self, span: Range<usize>, message: impl Into<String>) -> StudyError {
        StudyError::Invalid {
            origin: self.origin.to_string(),
            location: Some(Location::of_offset(self.text, span.start)),
            message: message.into(),
        }
    }

    fn nowhere(&self, message: impl Into<String>) -> StudyError {
        StudyError::Invalid { origin: self.origin.to_string(), location: None, message: message.into() }
    }

    fn toml(&self, e: &toml::de::Error) -> StudyError {
        let message = e.message().trim().to_string();
        match e.span() {
            Some(span) => self.at(span, message),
            None => self.nowhere(message),
        }
    }

    fn validate(&self, raw: RawStudy) -> Result<Study, StudyError> {
        let name = raw.name.get_ref();
        if !valid_study_name(name) {
            return Err(self.at(
                raw.name.span(),
                format!("name: {name:?} is not a valid study name ([a-z0-9_-], 1 to {MAX_NAME_LEN} characters)"),
            ));
        }

        let timeout_s = match &raw.timeout {
            Some(t) => positive(self, t, "timeout")?,
            None => DEFAULT_TIMEOUT_S,
        };
        let repeats = match &raw.repeats {
            Some(r) => positive_u32(self, r, "repeats")?,
            None => 1,
        };
        let max_attempts = match &raw.max_attempts {
            Some(m) => positive_u32(self, m, "max_attempts")?,
            None => DEFAULT_MAX_ATTEMPTS,
        };

        let metric = raw.objective.metric.get_ref().trim();
        if metric.is_empty() {
            return Err(self.at(raw.objective.metric.span(), "objective.metric: must not be empty"));
        }
        let mut also = raw.objective.also.clone();
        also.dedup();
        if also.iter().any(|s| s.as_str() == metric) || also.len() != raw.objective.also.len() {
            return Err(self.at(
                raw.objective.metric.span(),
                "objective.also: each of energy and wall_time at most once, and not the metric itself",
            ));
        }
        let objective = Objective {
            metric: metric.to_string(),
            direction: raw.objective.direction,
            also,
            aggregate: raw.objective.aggregate,
        };

        let budget = positive(self, &raw.budget.trials, "budget.trials")?;
        if budget > MAX_BUDGET {
            return Err(
                self.at(raw.budget.trials.span(), format!("budget.trials: at most {MAX_BUDGET} (got {budget})"))
            );
        }
        if budget < u64::from(repeats) {
            return Err(self.at(
                raw.budget.trials.span(),
                format!("budget.trials: {budget} is less than repeats ({repeats}): no configuration could run"),
            ));
        }

        let strategy = match (raw.strategy.kind, &raw.strategy.seed) {
            (StrategyKind::Grid, Some(seed)) => {
                return Err(self.at(seed.span(), "strategy.seed: only the random and tpe strategies take a seed"))
            }
            (StrategyKind::Grid, None) => Strategy::Grid,
            (StrategyKind::Random, None) => Strategy::Random { seed: 0 },
            (StrategyKind::Random, Some(seed)) => {
                let s = u64::try_from(*seed.get_ref())
                    .map_err(|_| self.at(seed.span(), "strategy.seed: must not be negative"))?;
                Strategy::Random { seed: s }
            }
            (StrategyKind::Tpe, None) => Strategy::Tpe { seed: 0 },
            (StrategyKind::Tpe, Some(seed)) => {
                let s = u64::try_from(*seed.get_ref())
                    .map_err(|_| self.at(seed.span(), "strategy.seed: must not be negative"))?;
                Strategy::Tpe { seed: s }
            }
        };

        let selector = match raw.selector {
            None => Selector::default(),
            Some(s) => self.selector(s, "selector")?,
        };
        let mut groups = Vec::new();
        for g in raw.group.into_iter().flatten() {
            let span = g.span();
            let g = g.into_inner();
            let gname = g.name.get_ref();
            if !valid_study_name(&format!("{name}-{gname}")) {
                return Err(self.at(
                    g.name.span(),
                    format!("group.name: {name}-{gname} (the group's study) is not a valid study name ([a-z0-9_-], 1 to {MAX_NAME_LEN} characters)"),
                ));
            }
            if groups.iter().any(|x: &Group| x.name == *gname) {
                return Err(self.at(g.name.span(), format!("group.name: {gname:?} is listed twice")));
            }
            let budget = match &g.budget {
                Some(b) => positive(self, b, "group.budget")?,
                None => budget,
            };
            if budget > MAX_BUDGET || budget < u64::from(repeats) {
                return Err(self
                    .at(span, format!("group.budget: {budget} must be between repeats ({repeats}) and {MAX_BUDGET}")));
            }
            let own = match g.selector {
                Some(s) => self.selector(s, "group.selector")?,
                None => Selector::default(),
            };
            groups.push(Group { name: gname.clone(), selector: selector.within(own), budget });
        }

        let mut hyper = BTreeMap::new();
        let mut hyper_spans = BTreeMap::new();
        if let Some(table) = &raw.hyper {
            for (key, param) in table.get_ref() {
                let pname = key.get_ref();
                let path = format!("hyper.{pname}");
                if !valid_param_name(pname) {
                    return Err(self.at(
                        key.span(),
                        format!(
                            "{path}: invalid parameter name (letters, digits and '_', not starting with a digit, \
                             at most {MAX_NAME_LEN} characters)"
                        ),
                    ));
                }
                if BUILTINS.contains(&pname.as_str()) {
                    return Err(self.at(key.span(), format!("{path}: {pname:?} is a builtin placeholder name")));
                }
                hyper.insert(pname.clone(), self.param(&path, param, false)?);
                hyper_spans.insert(pname.clone(), key.span());
            }
        }

        let mut system = BTreeMap::new();
        if let Some(table) = &raw.system {
            for (key, param) in table.get_ref() {
                let pname = key.get_ref();
                let path = format!("system.{pname}");
                let Some(which) = SystemParam::parse(pname) else {
                    return Err(self.at(
                        key.span(),
                        format!("{path}: unknown system parameter (expected cores, threads or memory)"),
                    ));
                };
                if hyper_spans.contains_key(pname) {
                    return Err(self.at(key.span(), format!("{path}: {pname:?} is also defined in [hyper]")));
                }
                system.insert(which, self.param(&path, param, true)?);
            }
        }

        if hyper.is_empty() && system.is_empty() {
            let span = raw.hyper.as_ref().or(raw.system.as_ref()).map(|t| t.span());
            let message = "the search space is empty: define at least one [hyper.NAME] or [system.NAME] parameter";
            return Err(match span {
                Some(span) => self.at(span, message),
                None => self.nowhere(message),
            });
        }

        let known: BTreeSet<&str> = hyper
            .keys()
            .map(String::as_str)
            .chain(system.keys().map(|s| s.as_str()))
            .chain(BUILTINS.iter().copied())
            .collect();

        if raw.command.get_ref().is_empty() {
            return Err(self.at(raw.command.span(), "command: must name a program"));
        }
        let mut command = Vec::with_capacity(raw.command.get_ref().len());
        for (i, arg) in raw.command.get_ref().iter().enumerate() {
            if i == 0 && arg.get_ref().trim().is_empty() {
                return Err(self.at(arg.span(), "command: the program must not be empty"));
            }
            self.check_template(&format!("command[{i}]"), arg, &known)?;
            command.push(arg.get_ref().clone());
        }

        let mut resume = Vec::new();
        if let Some(args) = &raw.resume {
            let mut with_checkpoint = known.clone();
            with_checkpoint.extend(RESUME_BUILTINS);
            for (i, arg) in args.get_ref().iter().enumerate() {
                self.check_template(&format!("resume[{i}]"), arg, &with_checkpoint)?;
                resume.push(arg.get_ref().clone());
            }
        }
        let resume_prefix = match &raw.resume_prefix {
            None => None,
            Some(prefix) if resume.is_empty() => {
                return Err(
                    self.at(prefix.span(), "resume_prefix: needs resume (the arguments that use the checkpoint)")
                )
            }
            Some(prefix) => {
                let text = prefix.get_ref();
                if let Err(e) = crate::validate::checkpoint("resume_prefix", text) {
                    return Err(self.at(prefix.span(), e.to_string()));
                }
                Some(text.clone())
            }
        };

        let mut env = BTreeMap::new();
        if let Some(table) = &raw.env {
            for (key, value) in table.get_ref() {
                let k = key.get_ref();
                if !valid_env_name(k) {
                    return Err(self.at(key.span(), format!("env.{k}: invalid environment variable name")));
                }
                self.check_template(&format!("env.{k}"), value, &known)?;
                env.insert(k.clone(), value.get_ref().clone());
            }
        }

        let pipeline = match &raw.pipeline {
            Some(p) => self.pipeline(p, &system)?,
            None => None,
        };

        let early_stopping = match &raw.early_stopping {
            None => None,
            Some(e) => {
                if let Some(why) = crate::search::asha::refused(&objective.metric) {
                    return Err(self.at(raw.objective.metric.span(), why));
                }
                let reduction = match &e.reduction {
                    Some(r) if *r.get_ref() < 2 => {
                        return Err(self.at(r.span(), "early_stopping.reduction: must be 2 or more"))
                    }
                    Some(r) => positive_u32(self, r, "early_stopping.reduction")?,
                    None => 3,
                };
                let grace = match &e.grace {
                    Some(g) => positive_u32(self, g, "early_stopping.grace")?,
                    None => 1,
                };
                Some(EarlyStopping { reduction, grace })
            }
        };

        let stability = match &raw.stability {
            None => None,
            Some(st) => {
                let spread = st.get_ref().spread;
                if !(spread.is_finite() && spread > 0.0) {
                    return Err(self.at(st.span(), format!("stability.spread: must be above 0 (got {spread})")));
                }
                if repeats < 2 {
                    return Err(self.at(
                        st.span(),
                        "stability: a spread needs at least two runs of each configuration: set repeats = 2 or more",
                    ));
                }
                let max_repeats = match &st.get_ref().max_repeats {
                    Some(m) => positive_u32(self, m, "stability.max_repeats")?,
                    None => repeats.saturating_mul(5).max(10),
                };
                if max_repeats < repeats {
                    return Err(self.at(st.span(), "stability.max_repeats: must not be below repeats"));
                }
                Some(Stability { spread, max_repeats })
            }
        };

        let reuse = self.reuse(raw.reuse.as_ref(), &hyper, pipeline.is_some())?;

        Ok(Study {
            name: name.clone(),
            command,
            env,
            resume,
            resume_prefix,
            timeout_s,
            repeats,
            max_attempts,
            objective,
            budget,
            strategy,
            selector,
            hyper,
            system,
            pipeline,
            early_stopping,
            stability,
            reuse,
            groups,
            origin: self.origin.to_string(),
            source: self.text.to_string(),
        })
    }

    fn selector(&self, s: RawSelector, key: &str) -> Result<Selector, StudyError> {
        let mut energy = Vec::new();
        for e in &s.energy {
            if !ENERGY_SOURCES.contains(&e.get_ref().as_str()) {
                return Err(self.at(
                    e.span(),
                    format!("{key}.energy: {:?} is not one of {}", e.get_ref(), ENERGY_SOURCES.join(", ")),
                ));
            }
            energy.push(e.get_ref().clone());
        }
        let min_cores = s.min_cores.as_ref().map(|c| positive_u32(self, c, &format!("{key}.min_cores"))).transpose()?;
        let min_memory_mib =
            s.min_memory_mib.as_ref().map(|m| positive(self, m, &format!("{key}.min_memory_mib"))).transpose()?;
        Ok(Selector { arch: s.arch, tags: s.tags, energy, min_cores, min_memory_mib })
    }

    fn reuse(
        &self,
        raw: Option<&Spanned<RawReuse>>,
        hyper: &BTreeMap<String, ParamSpec>,
        pipelined: bool,
    ) -> Result<crate::reuse::Policy, StudyError> {
        let mut policy = crate::reuse::Policy::default();
        let Some(raw) = raw else { return Ok(policy) };
        if !pipelined {
            return Err(self.at(
                raw.span(),
                "reuse: only pipelined studies probe, so only they reuse ([pipeline] mode = \"pipelined\")",
            ));
        }
        let r = raw.get_ref();
        policy.enabled = r.enabled.unwrap_or(true);
        for g in r.group.iter().flatten() {
            if !hyper.contains_key(g.get_ref()) {
                return Err(
                    self.at(g.span(), format!("reuse.group: {:?} is not a hyper-parameter of this study", g.get_ref()))
                );
            }
            policy.group.push(g.get_ref().clone());
        }
        for (value, key, slot) in [
            (r.radius_factor, "reuse.radius_factor", &mut policy.radius_factor),
            (r.min_threshold, "reuse.min_threshold", &mut policy.min_threshold),
            (r.verify_bound, "reuse.verify_bound", &mut policy.verify_bound),
        ] {
            if let Some(v) = value {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(self.at(raw.span(), format!("{key}: must be a number of 0 or more (got {v})")));
                }
                *slot = v;
            }
        }
        Ok(policy)
    }

    fn pipeline(
        &self,
        raw: &Spanned<RawPipeline>,
        system: &BTreeMap<SystemParam, ParamSpec>,
    ) -> Result<Option<Pipelined>, StudyError> {
        let p = raw.get_ref();
        if p.mode == PipelineMode::Sequential {
            if p.probe.is_some() || p.window.is_some() || p.select.is_some() || p.control {
                return Err(self.at(
                    raw.span(),
                    "pipeline: probe, window, select and control apply to mode = \"pipelined\" only \
                     (with mode = \"sequential\" they would do nothing)",
                ));
            }
            return Ok(None);
        }
        if system.is_empty() {
            return Err(self.at(
                raw.span(),
                "pipeline: pipelined mode probes system parameters: define at least one [system.NAME]",
            ));
        }
        let probe = match &p.probe {
            None => ProbeOrder::OneAtATime,
            Some(s) => match s.get_ref().as_str() {
                "one-at-a-time" => ProbeOrder::OneAtATime,
                "grid" => ProbeOrder::Grid,
                other => {
                    return Err(self.at(s.span(), format!("pipeline.probe: {other:?} is not one-at-a-time or grid")))
                }
            },
        };
        let (mut window, mut warmup, mut unit) = (1, 0, WindowUnit::Epochs);
        if let Some(w) = &p.window {
            let span = w.span();
            let w = w.get_ref();
            match (&w.epochs, &w.steps) {
                (Some(_), Some(_)) => {
                    return Err(self.at(span, "pipeline.window: give epochs or steps, not both"));
                }
                (Some(e), None) => window = positive_u32(self, e, "pipeline.window.epochs")?,
                (None, Some(st)) => {
                    window = positive_u32(self, st, "pipeline.window.steps")?;
                    unit = WindowUnit::Steps;
                }
                (None, None) => {}
            }
            if let Some(e) = &w.warmup {
                warmup = u32::try_from(*e.get_ref())
                    .map_err(|_| self.at(e.span(), "pipeline.window.warmup: must be 0 or more"))?;
            }
        }
        if unit == WindowUnit::Steps && system.contains_key(&SystemParam::Threads) {
            return Err(self.at(
                raw.span(),
                "pipeline: windows of steps cannot probe system.threads: a workload changes its thread \
                 count only between epochs (the control channel); use { epochs = N } windows",
            ));
        }
        let select = match &p.select {
            None => Select::Time,
            Some(v) => self.select(v)?,
        };
        if system.contains_key(&SystemParam::Threads) && !p.control {
            return Err(self.at(
                raw.span(),
                "pipeline: system.threads is read by a workload when it starts, so probing it inside a trial \
                 needs the workload's control channel: set pipeline.control = true if the workload speaks it \
                 (docs/PROTOCOL.md, \"Control channel\"; the bundled workloads do), or use mode = \"sequential\"",
            ));
        }
        Ok(Some(Pipelined { probe, window, warmup, unit, select, control: p.control }))
    }

    fn select(&self, v: &Spanned<toml::Value>) -> Result<Select, StudyError> {
        let bad = || {
            self.at(
                v.span(),
                "pipeline.select: expected \"time\", \"energy\", \"edp\", { cost = ETA } with ETA in [0, 1], \
                 or { max_slowdown = FRACTION } with FRACTION >= 0",
            )
        };
        let fraction = |x: &toml::Value| x.as_float().or_else(|| x.as_integer().map(|i| i as f64));
        match v.get_ref() {
            toml::Value::String(s) => match s.as_str() {
                "time" => Ok(Select::Time),
                "energy" => Ok(Select::Energy),
                "edp" => Ok(Select::Edp),
                _ => Err(bad()),
            },
            toml::Value::Table(t) if t.len() == 1 => {
                let (k, x) = t.iter().next().ok_or_else(bad)?;
                let x = fraction(x).filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(bad)?;
                match k.as_str() {
                    "cost" if x <= 1.0 => Ok(Select::Cost { eta_permille: (x * 1000.0).round() as u16 }),
                    "max_slowdown" if x <= 1000.0 => Ok(Select::MaxSlowdown { permille: (x * 1000.0).round() as u32 }),
                    _ => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    fn check_template(&self, what: &str, t: &Spanned<String>, known: &BTreeSet<&str>) -> Result<(), StudyError> {
        let names = template::placeholders(t.get_ref()).map_err(|e| self.at(t.span(), format!("{what}: {e}")))?;
        for n in names {
            if !known.contains(n.as_str()) {
                return Err(self.at(
                    t.span(),
                    format!(
                        "{what}: placeholder {{{n}}} names neither a parameter nor a builtin ({})",
                        BUILTINS.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn param(&self, path: &str, param: &Spanned<RawParam>, is_system: bool) -> Result<ParamSpec, StudyError> {
        let p = param.get_ref();
        let kind = *p.kind.get_ref();
        let refuse_key = |present: Option<Range<usize>>, key: &str| match present {
            Some(span) => Err(self.at(span, format!("{path}: `{key}` does not apply to kind {}", kind.as_str()))),
            None => Ok(()),
        };
        let low_high =
            |what: &str| -> Result<(&Spanned<toml::Value>, &Spanned<toml::Value>), StudyError> {
                let low = p.low.as_ref().ok_or_else(|| {
                    self.at(param.span(), format!("{path}: missing `low` (required for kind {what})"))
                })?;
                let high = p.high.as_ref().ok_or_else(|| {
                    self.at(param.span(), format!("{path}: missing `high` (required for kind {what})"))
                })?;
                Ok((low, high))
            };
        if is_system && matches!(kind, ParamKind::Float | ParamKind::LogFloat) {
            return Err(self.at(
                p.kind.span(),
                format!("{path}: system parameters take whole numbers: use kind int or categorical"),
            ));
        }
        match kind {
            ParamKind::Categorical => {
                refuse_key(p.low.as_ref().map(Spanned::span), "low")?;
                refuse_key(p.high.as_ref().map(Spanned::span), "high")?;
                refuse_key(p.step.as_ref().map(Spanned::span), "step")?;
                refuse_key(p.grid.as_ref().map(Spanned::span), "grid")?;
                let values = p.values.as_ref().ok_or_else(|| {
                    self.at(param.span(), format!("{path}: missing `values` (required for kind categorical)"))
                })?;
                if values.get_ref().is_empty() {
                    return Err(self.at(values.span(), format!("{path}: `values` must not be empty")));
                }
                let mut out: Vec<ParamValue> = Vec::with_capacity(values.get_ref().len());
                for v in values.get_ref() {
                    let pv = match v.get_ref() {
                        toml::Value::Integer(i) => ParamValue::Int(*i),
                        toml::Value::Float(f) if f.is_finite() => ParamValue::Float(*f),
                        toml::Value::String(s) => ParamValue::Text(s.clone()),
                        other => {
                            return Err(self.at(
                                v.span(),
                                format!(
                                    "{path}: values must be integers, finite floats or strings, not {}",
                                    other.type_str()
                                ),
                            ))
                        }
                    };
                    if is_system && !matches!(pv, ParamValue::Int(i) if i >= 1) {
                        return Err(self.at(v.span(), format!("{path}: system parameter values must be integers >= 1")));
                    }
                    if out.contains(&pv) {
                        return Err(self.at(v.span(), format!("{path}: duplicate value {pv}")));
                    }
                    out.push(pv);
                }
                Ok(ParamSpec::Categorical { values: out })
            }
            ParamKind::Int => {
                refuse_key(p.values.as_ref().map(Spanned::span), "values")?;
                refuse_key(p.grid.as_ref().map(Spanned::span), "grid")?;
                let (low, high) = low_high("int")?;
                let lo = self.int(path, "low", low)?;
                let hi = self.int(path, "high", high)?;
                if lo >= hi {
                    return Err(self.at(low.span(), format!("{path}: low ({lo}) must be below high ({hi})")));
                }
                if is_system && lo < 1 {
                    return Err(
                        self.at(low.span(), format!("{path}: system parameter values must be >= 1 (low is {lo})"))
                    );
                }
                let step = match &p.step {
                    Some(s) if *s.get_ref() < 1 => {
                        return Err(self.at(s.span(), format!("{path}: step must be >= 1 (got {})", s.get_ref())))
                    }
                    Some(s) => *s.get_ref(),
                    None => 1,
                };
                Ok(ParamSpec::Int { low: lo, high: hi, step })
            }
            ParamKind::Float | ParamKind::LogFloat => {
                refuse_key(p.values.as_ref().map(Spanned::span), "values")?;
                refuse_key(p.step.as_ref().map(Spanned::span), "step")?;
                let (low, high) = low_high(kind.as_str())?;
                let lo = self.float(path, "low", low)?;
                let hi = self.float(path, "high", high)?;
                if lo >= hi {
                    return Err(self.at(low.span(), format!("{path}: low ({lo}) must be below high ({hi})")));
                }
                let grid = match &p.grid {
                    Some(g) => u32::try_from(*g.get_ref()).ok().filter(|n| *n >= 2).ok_or_else(|| {
                        self.at(g.span(), format!("{path}: grid must be at least 2 points (got {})", g.get_ref()))
                    })?,
                    None => DEFAULT_GRID_POINTS,
                };
                if kind == ParamKind::LogFloat {
                    if lo <= 0.0 {
                        return Err(self.at(low.span(), format!("{path}: log_float needs low > 0 (got {lo})")));
                    }
                    Ok(ParamSpec::LogFloat { low: lo, high: hi, grid })
                } else {
                    Ok(ParamSpec::Float { low: lo, high: hi, grid })
                }
            }
        }
    }

    fn int(&self, path: &str, key: &str, v: &Spanned<toml::Value>) -> Result<i64, StudyError> {
        match v.get_ref() {
            toml::Value::Integer(i) => Ok(*i),
            other => Err(self.at(v.span(), format!("{path}: {key} must be an integer, not {}", other.type_str()))),
        }
    }

    fn float(&self, path: &str, key: &str, v: &Spanned<toml::Value>) -> Result<f64, StudyError> {
        match v.get_ref() {
            toml::Value::Integer(i) => Ok(*i as f64),
            toml::Value::Float(f) if f.is_finite() => Ok(*f),
            other => Err(self.at(v.span(), format!("{path}: {key} must be a finite number, not {}", other.type_str()))),
        }
    }
}

fn positive(ctx: &Ctx<'_>, v: &Spanned<i64>, key: &str) -> Result<u64, StudyError> {
    u64::try_from(*v.get_ref())
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| ctx.at(v.span(), format!("{key}: must be at least 1 (got {})", v.get_ref())))
}

fn positive_u32(ctx: &Ctx<'_>, v: &Spanned<i64>, key: &str) -> Result<u32, StudyError> {
    let n = positive(ctx, v, key)?;
    u32::try_from(n).map_err(|_| ctx.at(v.span(), format!("{key}: {n} is too large")))
}

/// `[a-z0-9_-]{1,64}`.
pub fn valid_study_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `[A-Za-z_][A-Za-z0-9_]{0,63}`: a name a template can refer to.
pub fn valid_param_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && name.len() <= MAX_NAME_LEN
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"name = "train-example"
command = ["tunefleet-train", "--lr", "{lr}", "--batch-size", "{batch_size}", "--epochs", "6"]
env = { TUNEFLEET_SEED = "{trial}" }
timeout = 120
repeats = 1
max_attempts = 3

[objective]
metric = "accuracy"
direction = "maximize"

[budget]
trials = 12

[strategy]
kind = "random"
seed = 7

[selector]
arch = ["x86_64", "aarch64"]
tags = { pool = "demo" }

[hyper.lr]
kind = "log_float"
low = 0.01
high = 1.0
grid = 4

[hyper.batch_size]
kind = "categorical"
values = [16, 64, 256]

[system.threads]
kind = "int"
low = 1
high = 2
step = 1
"#;

    fn err(text: &str) -> StudyError {
        parse(text, "study.toml").expect_err("should be refused")
    }

    #[test]
    fn resume_prefix_is_a_plain_prefix_and_needs_resume() {
        let with = |extra: &str| edited("timeout = 120", &format!("timeout = 120\n{extra}"));
        let ok =
            parse(&with("resume = [\"--resume\", \"{checkpoint}\"]\nresume_prefix = \"s3://bucket/ckpt/\""), "s.toml")
                .expect("parses");
        assert_eq!(ok.resume_prefix.as_deref(), Some("s3://bucket/ckpt/"));
        assert_eq!(parse(EXAMPLE, "s.toml").expect("parses").resume_prefix, None);
        assert!(err(&with("resume_prefix = \"s3://b/\"")).to_string().contains("needs resume"));
        let dash = err(&with("resume = [\"{checkpoint}\"]\nresume_prefix = \"--x\""));
        assert!(dash.to_string().contains("resume_prefix"), "{dash}");
        assert!(err(&with("resume = [\"{checkpoint}\"]\nresume_prefix = \"a\\nb\"")).to_string().contains("control"));
    }

    /// The example with `from` replaced by `to` (which must occur once).
    fn edited(from: &str, to: &str) -> String {
        assert_eq!(EXAMPLE.matches(from).count(), 1, "{from:?} must occur once");
        EXAMPLE.replace(from, to)
    }

    fn line_of(e: &StudyError) -> usize {
        e.location().map(|l| l.line).unwrap_or_else(|| panic!("no location in {e}"))
    }

    #[test]
    fn parses_the_documented_example() {
        let s = parse(EXAMPLE, "study.toml").expect("example parses");
        assert_eq!(s.name, "train-example");
        assert_eq!(s.command.len(), 7);
        assert_eq!(s.env.get("TUNEFLEET_SEED").map(String::as_str), Some("{trial}"));
        assert_eq!((s.timeout_s, s.repeats, s.max_attempts, s.budget), (120, 1, 3, 12));
        assert_eq!(
            s.objective,
            Objective {
                metric: "accuracy".into(),
                direction: Direction::Maximize,
                also: vec![],
                aggregate: Aggregate::Final
            }
        );
        let multi = parse(
            &edited("direction = \"maximize\"", "direction = \"maximize\"\nalso = [\"energy\", \"wall_time\"]"),
            "s.toml",
        )
        .expect("multi-objective parses");
        assert_eq!(multi.objective.also, vec![Secondary::Energy, Secondary::WallTime]);
        let e = parse(&edited("direction = \"maximize\"", "direction = \"maximize\"\nalso = [\"power\"]"), "s.toml")
            .expect_err("unknown secondary");
        assert!(e.to_string().contains("power"), "{e}");
        assert_eq!(s.strategy, Strategy::Random { seed: 7 });
        assert_eq!(s.selector.arch, vec!["x86_64", "aarch64"]);
        assert_eq!(s.selector.tags.get("pool").map(String::as_str), Some("demo"));
        assert_eq!(s.hyper["lr"], ParamSpec::LogFloat { low: 0.01, high: 1.0, grid: 4 });
        assert_eq!(
            s.hyper["batch_size"],
            ParamSpec::Categorical { values: vec![ParamValue::Int(16), ParamValue::Int(64), ParamValue::Int(256)] }
        );
        assert_eq!(s.system[&SystemParam::Threads], ParamSpec::Int { low: 1, high: 2, step: 1 });
        assert_eq!(s.source, EXAMPLE);
        let names: Vec<&str> = s.parameters().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["batch_size", "lr", "threads"]);
        let json = serde_json::to_value(&s).expect("serialises");
        assert_eq!(json["hyper"]["lr"]["kind"], "log_float");
        assert_eq!(json["system"]["threads"]["kind"], "int");
    }

    #[test]
    fn pipelined_mode_is_checked_before_anything_runs() {
        let with = |p: &str| format!("{EXAMPLE}\n[pipeline]\n{p}\n");
        let s = parse(&with("mode = \"pipelined\"\ncontrol = true\nwindow = { epochs = 2, warmup = 1 }\nselect = { max_slowdown = 0.1 }"), "s.toml")
            .expect("parses");
        let p = s.pipeline.clone().expect("pipelined");
        assert_eq!(
            (p.window, p.warmup, p.select, p.probe),
            (2, 1, Select::MaxSlowdown { permille: 100 }, ProbeOrder::OneAtATime)
        );
        assert_eq!(s.searched().len(), 2, "system parameters are probed, not searched");
        assert_eq!(
            parse(&with("mode = \"pipelined\"\ncontrol = true\nselect = { cost = 0.25 }"), "s.toml")
                .expect("parses")
                .pipeline
                .map(|p| p.select),
            Some(Select::Cost { eta_permille: 250 })
        );
        let e = parse(&with("mode = \"pipelined\""), "s.toml").expect_err("threads without the control channel");
        assert!(e.to_string().contains("control channel"), "{e}");
        let e =
            parse(&with("mode = \"pipelined\"\ncontrol = true\nwindow = { steps = 50 }"), "s.toml").expect_err("steps");
        assert!(e.to_string().contains("steps"), "{e}");
        let e =
            parse(&with("mode = \"pipelined\"\ncontrol = true\nselect = { cost = 2 }"), "s.toml").expect_err("eta > 1");
        assert!(e.to_string().contains("pipeline.select"), "{e}");
        let e =
            parse(&with("mode = \"pipelined\"\ncontrol = true\nprobe = \"sometimes\""), "s.toml").expect_err("probe");
        assert!(e.to_string().contains("one-at-a-time"), "{e}");
        let sequential = parse(&with("mode = \"sequential\""), "s.toml").expect("parses");
        assert_eq!(sequential.pipeline, None);
        assert_eq!(sequential.searched().len(), 3);
    }

    #[test]
    fn kept_mean_reads_the_epochs_of_the_kept_configuration() {
        use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, EpochMetrics, ExitOutcome, Segment};
        let text = edited("direction = \"maximize\"", "direction = \"maximize\"\naggregate = \"kept_mean\"");
        let s = parse(&text, "s.toml").expect("parses");
        assert_eq!(s.objective.aggregate, Aggregate::KeptMean);
        let epochs = [10.0, 1.0, 2.0, 6.0, 8.0];
        let mut m = Measurement {
            epochs: epochs
                .iter()
                .enumerate()
                .map(|(i, v)| EpochMetrics {
                    epoch: i as u32 + 1,
                    elapsed_us: 0,
                    metrics: [("accuracy".to_string(), *v)].into(),
                    checkpoint: None,
                })
                .collect(),
            final_metrics: [("accuracy".to_string(), 8.0)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        };
        assert_eq!(s.objective_value(&m), Some(17.0 / 4.0), "every epoch but the first");
        m.segments.push(Segment {
            role: SegmentRole::Selected,
            system: Default::default(),
            cpus: vec![],
            first_epoch: 4,
            last_epoch: 5,
            steps: 0,
            start_us: 0,
            wall_us: 1,
            energy_j: None,
            cpu_us: None,
        });
        assert_eq!(s.objective_value(&m), Some(7.0), "the Selected segment's epochs");
        let final_only = parse(EXAMPLE, "s.toml").expect("parses");
        assert_eq!(final_only.objective_value(&m), Some(8.0));
    }

    #[test]
    fn selectors_match_energy_sources_cores_and_memory() {
        use tunefleet_common::measurement::EnergySourceKind;
        use tunefleet_common::message::EnergySourceInfo;
        let text = edited(
            "tags = { pool = \"demo\" }",
            "tags = { pool = \"demo\" }\nenergy = [\"rapl\", \"hwmon\"]\nmin_cores = 4\nmin_memory_mib = 2048",
        );
        let s = parse(&text, "s.toml").expect("parses");
        let mut agent = AgentInfo::minimal("a", 1);
        agent.arch = "aarch64".into();
        agent.tags.insert("pool".into(), "demo".into());
        agent.cores = 8;
        agent.memory_bytes = 4 << 30;
        let source = |kind, readable| EnergySourceInfo { kind, domains: vec![], readable, note: None };
        agent.energy = vec![source(EnergySourceKind::Rapl, false), source(EnergySourceKind::Estimated, true)];
        assert!(!s.selector.matches(&agent), "RAPL present but not readable");
        agent.energy.push(source(EnergySourceKind::Hwmon, true));
        assert!(s.selector.matches(&agent));
        agent.cores = 2;
        assert!(!s.selector.matches(&agent), "too few cores");
        agent.cores = 4;
        agent.memory_bytes = 1 << 30;
        assert!(!s.selector.matches(&agent), "too little memory");
        let e = err(&edited("tags = { pool = \"demo\" }", "tags = { pool = \"demo\" }\nenergy = [\"nuclear\"]"));
        assert!(e.to_string().contains("selector.energy"), "{e}");
    }

    #[test]
    fn a_sequential_pipeline_refuses_the_keys_it_would_ignore() {
        let plain = format!("{EXAMPLE}\n[pipeline]\nmode = \"sequential\"\n");
        assert_eq!(parse(&plain, "study.toml").expect("parses").pipeline, None);
        let typo = format!("{EXAMPLE}\n[pipeline]\nmode = \"sequential\"\nprobe = \"bogus\"\n");
        assert!(err(&typo).to_string().contains("apply to mode = \"pipelined\" only"));
    }

    #[test]
    fn groups_run_as_studies_of_their_own_with_narrowed_selectors_and_budgets() {
        let text = format!(
            "{EXAMPLE}\n[[group]]\nname = \"phones\"\nbudget = 4\nselector = {{ arch = [\"aarch64\"], tags = {{ kind = \"phone\" }}, energy = [\"battery\"] }}\n\
             [[group]]\nname = \"x86\"\nselector = {{ arch = [\"x86_64\"], min_cores = 8 }}\n"
        );
        let s = parse(&text, "study.toml").expect("groups parse");
        let parts = s.expand();
        let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, vec!["train-example-phones", "train-example-x86"]);
        assert_eq!((parts[0].budget, parts[1].budget), (4, 12), "a group without a budget has the study's");
        assert_eq!(parts[0].selector.arch, vec!["aarch64"]);
        let tags: Vec<(&str, &str)> = parts[0].selector.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(tags, vec![("kind", "phone"), ("pool", "demo")], "the study's tags and the group's");
        assert_eq!(parts[0].selector.energy, vec!["battery"]);
        assert_eq!(
            (parts[1].selector.arch.clone(), parts[1].selector.min_cores),
            (vec!["x86_64".to_string()], Some(8))
        );
        assert!(parts.iter().all(|p| p.groups.is_empty() && p.source == s.source), "each keeps the whole file");
        assert_eq!(parse(EXAMPLE, "study.toml").expect("parses").expand().len(), 1);

        let twice = format!("{EXAMPLE}\n[[group]]\nname = \"a\"\n[[group]]\nname = \"a\"\n");
        assert!(err(&twice).to_string().contains("listed twice"));
        let bad = format!("{EXAMPLE}\n[[group]]\nname = \"Phones!\"\n");
        assert!(err(&bad).to_string().contains("not a valid study name"));
        let energy = format!("{EXAMPLE}\n[[group]]\nname = \"p\"\nselector = {{ energy = [\"solar\"] }}\n");
        assert!(err(&energy).to_string().contains("group.selector.energy"));
    }

    #[test]
    fn stability_needs_repeats_and_a_positive_spread() {
        let with = |repeats: u32, st: &str| {
            format!("{}\n[stability]\n{st}\n", edited("repeats = 1", &format!("repeats = {repeats}")))
        };
        let s = parse(&with(3, "spread = 0.05\nmax_repeats = 8"), "s.toml").expect("parses");
        assert_eq!(s.stability, Some(Stability { spread: 0.05, max_repeats: 8 }));
        assert!(err(&with(1, "spread = 0.05")).to_string().contains("at least two runs"));
        assert!(err(&with(3, "spread = 0")).to_string().contains("above 0"));
        assert!(err(&with(3, "spread = 0.1\nmax_repeats = 2")).to_string().contains("below repeats"));
    }

    #[test]
    fn defaults_apply() {
        let text = r#"name = "d"
command = ["run", "{x}"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = 3
[strategy]
kind = "grid"
[hyper.x]
kind = "float"
low = 0
high = 1
"#;
        let s = parse(text, "d.toml").expect("parses");
        assert_eq!((s.timeout_s, s.repeats, s.max_attempts), (DEFAULT_TIMEOUT_S, 1, DEFAULT_MAX_ATTEMPTS));
        assert_eq!(s.strategy, Strategy::Grid);
        assert_eq!(s.hyper["x"], ParamSpec::Float { low: 0.0, high: 1.0, grid: DEFAULT_GRID_POINTS });
        assert_eq!(s.selector, Selector::default());
        assert!(s.env.is_empty());
        let text = text.replace("kind = \"grid\"", "kind = \"random\"");
        assert_eq!(parse(&text, "d.toml").expect("parses").strategy, Strategy::Random { seed: 0 });
    }

    #[test]
    fn unknown_keys_are_refused_with_their_line() {
        let e = err(&edited("repeats = 1", "repeats = 1\nrepeat = 2"));
        assert_eq!(line_of(&e), 6, "{e}");
        assert!(e.to_string().starts_with("study.toml:6:"), "{e}");
        assert!(e.to_string().contains("repeat"), "{e}");

        let e = err(&edited("grid = 4", "grid = 4\nlog = true"));
        assert_eq!(line_of(&e), 28, "{e}");
        let e = err(&edited("direction = \"maximize\"", "direction = \"maximize\"\ngoal = 1"));
        assert_eq!(line_of(&e), 11, "{e}");
    }

    #[test]
    fn low_not_below_high_names_line_and_values() {
        let e = err(&edited("low = 0.01", "low = 2"));
        assert_eq!(line_of(&e), 25, "{e}");
        let msg = e.to_string();
        assert!(msg.starts_with("study.toml:25:"), "{msg}");
        assert!(msg.contains("hyper.lr: low (2) must be below high (1)"), "{msg}");
    }

    #[test]
    fn missing_and_mistyped_keys() {
        let e = err(&edited("metric = \"accuracy\"\n", ""));
        assert!(e.to_string().contains("metric"), "{e}");
        assert!(e.location().is_some(), "{e}");
        let e = err(&edited("timeout = 120", "timeout = \"2m\""));
        assert_eq!(line_of(&e), 4, "{e}");
        let e = err(&edited("direction = \"maximize\"", "direction = \"up\""));
        assert_eq!(line_of(&e), 10, "{e}");
        let e = err(&edited("kind = \"random\"", "kind = \"annealing\""));
        assert_eq!(line_of(&e), 16, "{e}");
        let e = err(&edited("values = [16, 64, 256]", "values = [16, true]"));
        assert_eq!(line_of(&e), 31, "{e}");
        let e = err(&edited("values = [16, 64, 256]", "values = [16, 64, 16]"));
        assert!(e.to_string().contains("duplicate value 16"), "{e}");
        let e = err(&edited("low = 1\n", "low = 1.5\n"));
        assert!(e.to_string().contains("system.threads: low must be an integer"), "{e}");
        let e = err(&edited("kind = \"log_float\"", "kind = \"int\""));
        assert!(e.to_string().contains("`grid` does not apply to kind int"), "{e}");
    }

    #[test]
    fn semantic_errors_are_refused() {
        let cases: &[(&str, &str, &str)] = &[
            ("values = [16, 64, 256]", "values = []", "must not be empty"),
            ("low = 0.01", "low = 0.0", "log_float needs low > 0"),
            ("[system.threads]", "[system.swap]", "unknown system parameter"),
            ("trials = 12", "trials = 0", "budget.trials: must be at least 1"),
            ("trials = 12", "trials = 10000001", "budget.trials: at most"),
            ("timeout = 120", "timeout = 0", "timeout: must be at least 1"),
            ("max_attempts = 3", "max_attempts = 0", "max_attempts: must be at least 1"),
            ("name = \"train-example\"", "name = \"Train Example\"", "not a valid study name"),
            ("\"--epochs\", \"6\"]", "\"--epochs\", \"{epochs}\"]", "placeholder {epochs} names neither"),
            ("\"{trial}\" }", "\"{seed}\" }", "env.TUNEFLEET_SEED: placeholder {seed}"),
            ("\"--epochs\", \"6\"]", "\"--epochs\", \"{oops\"]", "unclosed"),
            ("[hyper.batch_size]", "[hyper.threads]", "also defined in [hyper]"),
            ("low = 1\n", "low = 0\n", "system parameter values must be >= 1"),
            ("step = 1", "step = 0", "step must be >= 1"),
            ("grid = 4", "grid = 1", "grid must be at least 2"),
            ("seed = 7", "seed = -1", "must not be negative"),
            ("[hyper.batch_size]", "[hyper.trial]", "builtin placeholder name"),
            ("[hyper.batch_size]", "[hyper.2x]", "invalid parameter name"),
        ];
        for (from, to, want) in cases {
            let e = err(&edited(from, to));
            assert!(e.to_string().contains(want), "{from} -> {to}: got {e}, want {want:?}");
            assert!(e.location().is_some(), "{from} -> {to}: no location in {e}");
        }
    }

    #[test]
    fn command_must_name_a_program() {
        let e = err(&edited(
            "command = [\"tunefleet-train\", \"--lr\", \"{lr}\", \"--batch-size\", \"{batch_size}\", \"--epochs\", \"6\"]",
            "command = []",
        ));
        assert_eq!(line_of(&e), 2, "{e}");
        assert!(e.to_string().contains("command"), "{e}");
    }

    #[test]
    fn empty_search_space_is_refused() {
        let text = r#"name = "e"
command = ["run"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = 1
[strategy]
kind = "grid"
"#;
        assert!(err(text).to_string().contains("search space is empty"));
        let e = err(&format!("{text}[hyper]\n"));
        assert!(e.to_string().contains("search space is empty"), "{e}");
    }

    #[test]
    fn system_params_must_be_whole_and_positive() {
        let e = err(&edited("[system.threads]\nkind = \"int\"", "[system.threads]\nkind = \"float\""));
        assert!(e.to_string().contains("whole numbers"), "{e}");
        let text = edited(
            "[system.threads]\nkind = \"int\"\nlow = 1\nhigh = 2\nstep = 1",
            "[system.memory]\nkind = \"categorical\"\nvalues = [512, 0]",
        );
        let e = err(&text);
        assert!(e.to_string().contains("integers >= 1"), "{e}");
    }

    #[test]
    fn budget_below_repeats_is_refused() {
        let e = err(&edited("repeats = 1", "repeats = 20"));
        assert!(e.to_string().contains("less than repeats"), "{e}");
    }

    #[test]
    fn location_counts_lines_and_characters() {
        let text = "a\nbé c\n";
        assert_eq!(Location::of_offset(text, 0), Location { line: 1, column: 1 });
        assert_eq!(Location::of_offset(text, 2), Location { line: 2, column: 1 });
        // 'c' is at byte 6 ("b" 1 byte, "é" 2 bytes, " " 1 byte), character 4.
        assert_eq!(Location::of_offset(text, 6), Location { line: 2, column: 4 });
        assert_eq!(Location::of_offset(text, 999), Location { line: 3, column: 1 });
    }

    #[test]
    fn selector_matches_arch_and_tags() {
        let s = parse(EXAMPLE, "study.toml").expect("parses").selector;
        let mut agent = AgentInfo {
            agent: "a".into(),
            instance: 1,
            version: "0".into(),
            arch: "aarch64".into(),
            os: "linux".into(),
            kernel: "6".into(),
            cores: 2,
            memory_bytes: 1 << 30,
            slots: 1,
            energy: vec![],
            counters: vec![],
            tags: BTreeMap::from([("pool".to_string(), "demo".to_string())]),
        };
        assert!(s.matches(&agent));
        agent.arch = "riscv64".into();
        assert!(!s.matches(&agent));
        agent.arch = "x86_64".into();
        agent.tags.clear();
        assert!(!s.matches(&agent));
        assert!(Selector::default().matches(&agent));
    }

    #[test]
    fn load_reports_missing_files_with_their_path() {
        let e = load(Path::new("/nonexistent/study.toml")).expect_err("missing");
        assert!(e.to_string().starts_with("/nonexistent/study.toml:"), "{e}");
    }
}
