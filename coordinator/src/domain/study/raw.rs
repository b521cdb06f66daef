//! The study file as written: serde mirrors of its tables with the spans
//! of their values, so [`super::validate`] can say where a problem is.
//! Unknown keys are refused here (`deny_unknown_fields`).

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::model::{Aggregate, Direction, Secondary};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStudy {
    pub(super) name: Spanned<String>,
    pub(super) command: Spanned<Vec<Spanned<String>>>,
    pub(super) env: Option<Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    pub(super) resume: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) resume_prefix: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<i64>>,
    pub(super) repeats: Option<Spanned<i64>>,
    pub(super) max_attempts: Option<Spanned<i64>>,
    pub(super) lookahead: Option<Spanned<i64>>,
    pub(super) gpus: Option<Spanned<i64>>,
    pub(super) objective: RawObjective,
    pub(super) budget: RawBudget,
    pub(super) strategy: RawStrategy,
    pub(super) selector: Option<RawSelector>,
    pub(super) hyper: Option<Spanned<BTreeMap<Spanned<String>, Spanned<RawParam>>>>,
    pub(super) system: Option<Spanned<BTreeMap<Spanned<String>, Spanned<RawParam>>>>,
    pub(super) pipeline: Option<Spanned<RawPipeline>>,
    pub(super) early_stopping: Option<RawEarlyStopping>,
    pub(super) stability: Option<Spanned<RawStability>>,
    pub(super) reuse: Option<Spanned<RawReuse>>,
    pub(super) group: Option<Vec<Spanned<RawGroup>>>,
    pub(super) measure: Option<RawMeasure>,
    pub(super) warm_start: Option<Spanned<RawWarmStart>>,
    pub(super) constraint: Option<Vec<Spanned<RawConstraint>>>,
    /// `[[enqueue]]`: configurations to try first, a value by parameter name.
    pub(super) enqueue: Option<Vec<Spanned<RawConfig>>>,
}

/// A configuration as written: a value by parameter name.
pub(super) type RawConfig = BTreeMap<String, Spanned<toml::Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConstraint {
    pub(super) metric: Spanned<String>,
    pub(super) at_most: Option<f64>,
    pub(super) at_least: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWarmStart {
    pub(super) studies: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMeasure {
    pub(super) nodes: Option<RawNodes>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNodes {
    pub(super) tags: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    pub(super) name: Spanned<String>,
    pub(super) budget: Option<Spanned<i64>>,
    pub(super) selector: Option<RawSelector>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReuse {
    pub(super) enabled: Option<bool>,
    pub(super) group: Option<Vec<Spanned<String>>>,
    pub(super) radius_factor: Option<f64>,
    pub(super) min_threshold: Option<f64>,
    pub(super) verify_bound: Option<f64>,
    pub(super) across_workloads: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStability {
    pub(super) spread: f64,
    pub(super) max_repeats: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum EarlyStoppingKind {
    Asha,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEarlyStopping {
    #[allow(dead_code)]
    pub(super) kind: EarlyStoppingKind,
    pub(super) reduction: Option<Spanned<i64>>,
    pub(super) grace: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum PipelineMode {
    Pipelined,
    Sequential,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPipeline {
    pub(super) mode: PipelineMode,
    pub(super) probe: Option<Spanned<String>>,
    pub(super) window: Option<Spanned<RawWindow>>,
    pub(super) select: Option<Spanned<toml::Value>>,
    #[serde(default)]
    pub(super) control: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWindow {
    pub(super) epochs: Option<Spanned<i64>>,
    pub(super) warmup: Option<Spanned<i64>>,
    pub(super) steps: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawObjective {
    pub(super) metric: Spanned<String>,
    pub(super) direction: Direction,
    #[serde(default)]
    pub(super) also: Vec<Secondary>,
    #[serde(default)]
    pub(super) aggregate: Aggregate,
    pub(super) eta: Option<Spanned<f64>>,
    pub(super) max_power_w: Option<Spanned<f64>>,
    /// A bound as a `[[constraint]]` has one.
    pub(super) to_target: Option<Spanned<RawConstraint>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    pub(super) trials: Spanned<i64>,
    pub(super) max_failures: Option<Spanned<i64>>,
}

/// `[strategy] kind` as written; with the seed beside it, the check makes
/// it the model's [`super::model::Strategy`] (the one the rest of the code
/// sees: `domain::search`'s module doc names the search's other parts).
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawStrategyKind {
    Grid,
    Random,
    Tpe,
    Gp,
    External,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStrategy {
    pub(super) kind: RawStrategyKind,
    pub(super) seed: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSelector {
    #[serde(default)]
    pub(super) arch: Vec<String>,
    #[serde(default)]
    pub(super) tags: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) energy: Vec<Spanned<String>>,
    pub(super) min_cores: Option<Spanned<i64>>,
    pub(super) min_memory_mib: Option<Spanned<i64>>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum ParamKind {
    Categorical,
    Int,
    Float,
    LogFloat,
}

impl ParamKind {
    pub(super) fn as_str(self) -> &'static str {
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
pub(super) struct RawParam {
    pub(super) kind: Spanned<ParamKind>,
    pub(super) low: Option<Spanned<toml::Value>>,
    pub(super) high: Option<Spanned<toml::Value>>,
    pub(super) step: Option<Spanned<i64>>,
    pub(super) grid: Option<Spanned<i64>>,
    pub(super) values: Option<Spanned<Vec<Spanned<toml::Value>>>>,
}
