//! The model of a study: the validated [`Study`] and its parts, as the
//! search strategies, the scheduler and the engine read them. Plain types;
//! `super::validate` builds them from the file's `super::raw` mirror.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use tunefleet_common::measurement::{EnergySourceKind, Measurement, SegmentRole};
use tunefleet_common::message::{Select, WindowUnit};
pub use tunefleet_search::space::{Direction, ParamSpec};

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
    /// `metric = "energy_time"`: its knob and the power time is weighed at.
    pub energy_time: Option<super::measured::EnergyTime>,
    /// `to_target`: a measured metric counted up to the first epoch that
    /// reached this target; trials that never did miss it as a constraint.
    pub to_target: Option<super::measured::Target>,
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
    /// Bayesian optimisation with a Gaussian process, seeded: models the
    /// objective over the whole space (best for budgets of up to a few
    /// hundred trials).
    Gp { seed: u64 },
    /// The configurations come from outside: a sampler of the user's own
    /// (Optuna's CMA-ES, NSGA-II...) asks and tells through `serve`'s API
    /// (`/api/v1/studies/NAME/ask` and `/tell`); the study waits for them.
    External,
}

impl Strategy {
    /// Whether it chooses each trial from the results told so far (a model
    /// of the objective): its trials are asked when a slot can start them,
    /// held at most one per slot ahead ([`Study::ahead_per_slot`]), and it
    /// is told of the trials still running. The one place this is decided:
    /// a new strategy must say (the match has no catch-all).
    pub fn learns_from_results(&self) -> bool {
        match self {
            // An outside sampler is told through the API, not here.
            Strategy::Grid | Strategy::Random { .. } | Strategy::External => false,
            Strategy::Tpe { .. } | Strategy::Gp { .. } => true,
        }
    }
}

/// Which agents may run the trials of a study.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Selector {
    /// Any of these architectures; empty means any.
    pub arch: Vec<String>,
    /// All of these tags must match the agent's tags.
    pub tags: BTreeMap<String, String>,
    /// Any of these energy sources, readable on the agent; empty means any.
    #[serde(serialize_with = "energy_names")]
    pub energy: Vec<EnergySourceKind>,
    /// At least this many CPUs.
    pub min_cores: Option<u32>,
    /// At least this much memory, in MiB.
    pub min_memory_mib: Option<u64>,
}

/// Energy sources by the names a study file gives them (`rapl`, not `Rapl`).
fn energy_names<S: serde::Serializer>(kinds: &[EnergySourceKind], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(kinds.iter().map(|k| k.as_str()))
}

/// A device group of a study: its own selector (the study's, with what the
/// group says instead) and budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    pub name: String,
    pub selector: Selector,
    pub budget: u64,
}

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
    /// The default configuration, then each other value of one parameter
    /// at a time, applied to the best configuration measured so far (the
    /// agent's pipeline chooses it as windows close: `ProbePlan::from_best`).
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

impl Pipelined {
    /// How many system configurations a trial probes
    /// (`search::probe_configs` lists them): the default and each other
    /// value of one parameter at a time, or the whole grid.
    pub fn configurations(&self, system: &BTreeMap<SystemParam, ParamSpec>) -> u64 {
        let sizes = system.values().map(ParamSpec::grid_len);
        match self.probe {
            ProbeOrder::OneAtATime => 1 + sizes.map(|n| n.saturating_sub(1)).sum::<u64>(),
            ProbeOrder::Grid => sizes.fold(1u64, u64::saturating_mul),
        }
    }
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

/// `[reuse]` of a study: see [`crate::domain::reuse`] and docs/STUDY.md.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReusePolicy {
    /// Reuse configurations (profiles are learned either way).
    pub enabled: bool,
    /// Hyper-parameters whose values must match for a configuration to be
    /// reused (a batch size changes what is best).
    pub group: Vec<String>,
    pub radius_factor: f64,
    pub min_threshold: f64,
    /// How much slower (relative) a reused configuration may run than its
    /// record before the cluster is probed again; `None`: derived from the
    /// noise of the trial's own windows ([`crate::domain::reuse::verify`]).
    pub verify_bound: Option<f64>,
    /// Reuse what jobs of other workloads measured when their profiles are
    /// close (by default only jobs of the same [`Study::workload`]).
    pub across_workloads: bool,
}

impl Default for ReusePolicy {
    fn default() -> Self {
        ReusePolicy {
            enabled: true,
            group: Vec::new(),
            radius_factor: 2.0,
            min_threshold: 1.5,
            verify_bound: None,
            across_workloads: false,
        }
    }
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
    /// Whether its trials may be assigned ahead to an agent whose slots are
    /// busy, held there and started the moment one frees (`lookahead = 1`,
    /// the default); `lookahead = 0`: only to a free slot, so a trial never
    /// waits behind another on an agent.
    pub lookahead: bool,
    /// GPUs each trial is given (`gpus = N`, default 0): its own, named in
    /// `CUDA_VISIBLE_DEVICES`, their energy part of the trial's. Only
    /// agents with that many GPUs take its trials.
    pub gpus: u32,
    pub objective: Objective,
    /// Trials to run, repeats included.
    pub budget: u64,
    /// `[budget] max_failures`: a run stops once this many of its trials
    /// failed (`Some(0)`: never); unset, once [`FAIL_FAST_DEFAULT`] failed
    /// and none succeeded. Not part of what the study computes: a resumed
    /// study may change it.
    pub max_failures: Option<u64>,
    pub strategy: Strategy,
    pub selector: Selector,
    pub hyper: BTreeMap<String, ParamSpec>,
    pub system: BTreeMap<SystemParam, ParamSpec>,
    pub early_stopping: Option<EarlyStopping>,
    pub stability: Option<Stability>,
    /// Pipelined mode; `None`: sequential (a trial per hyper x system configuration).
    pub pipeline: Option<Pipelined>,
    /// `[reuse]`: configurations known good for jobs that profile alike
    /// ([`crate::domain::reuse`]); pipelined studies only.
    pub reuse: ReusePolicy,
    /// `[[group]]`: device groups (phones, Graviton, x86...) tuned apart,
    /// each with its selector and budget; see [`Study::expand`].
    pub groups: Vec<Group>,
    /// `[measure] nodes = { tags = {...} }`: the agents with all these tags
    /// (but the one that runs the trial) measure their machines over each
    /// trial ([`crate::domain::comeasure`]); `None`: only the trial's agent.
    pub measure_nodes: Option<BTreeMap<String, String>>,
    /// `[warm_start] studies`: studies in the same store whose results (of
    /// the same objective, inside this study's space) its search is told
    /// before its first ask (tpe and gp).
    pub warm_start: Vec<String>,
    /// `[[enqueue]]`: configurations the search tries first, in order, each
    /// inside the space; a parameter one leaves out is the strategy's to
    /// choose (Optuna's `enqueue_trial`).
    pub enqueue: Vec<tunefleet_common::params::Params>,
    /// `[[constraint]]`: bounds every trial must keep to be feasible.
    pub constraints: Vec<super::constraint::Constraint>,
    /// Where the study was read from (a path or `<stdin>`), for messages.
    pub origin: String,
    /// The study file exactly as it was read.
    pub source: String,
}

/// Trials failed with none succeeded after which a run stops, when
/// `[budget] max_failures` does not say.
pub const FAIL_FAST_DEFAULT: u64 = 5;

impl Study {
    /// Why a run with `failed` and `done` trials so far (this run's) stops
    /// early, if it does ([`Study::max_failures`]).
    pub fn fails_fast(&self, failed: u64, done: u64) -> Option<String> {
        match self.max_failures {
            Some(0) => None,
            Some(max) if failed >= max => Some(format!("{failed} trials failed ([budget] max_failures = {max})")),
            Some(_) => None,
            None if failed >= FAIL_FAST_DEFAULT && done == 0 => Some(format!(
                "its first {failed} trials failed and none succeeded (set [budget] max_failures = 0 to run on \
                 whatever fails)"
            )),
            None => None,
        }
    }

    /// How many of its trials an agent may hold ahead per slot while its
    /// slots are busy: none with `lookahead = 0`; one for a search that
    /// learns from each result (`tpe`, `gp`: a trial held ahead is asked
    /// without the results of those it waits behind, so the deeper an
    /// agent holds, the more of the study is asked blind); else as many as
    /// an agent may announce.
    pub fn ahead_per_slot(&self) -> u32 {
        match (self.lookahead, self.strategy.learns_from_results()) {
            (false, _) => 0,
            (true, true) => 1,
            (true, false) => tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT,
        }
    }

    /// How many of its trials an agent may hold ahead in all, whatever its
    /// slots: one for a search that learns from each result (`tpe`, `gp`;
    /// a trial is asked when a slot is about to start it, the
    /// one held hiding the round trip, not one per slot asked blind many
    /// results ahead); no bound for the others.
    pub fn ahead_per_agent(&self) -> Option<u32> {
        self.strategy.learns_from_results().then_some(1)
    }

    /// The keys of the study file in which `self` and `newer` differ
    /// (`budget`, `hyper`, `[objective]`...), in the file's order; the name,
    /// where it was read from and its text are not compared.
    pub fn differences(&self, newer: &Study) -> Vec<&'static str> {
        let pairs: [(&'static str, bool); 23] = [
            ("command", self.command != newer.command),
            ("env", self.env != newer.env),
            ("resume", self.resume != newer.resume),
            ("resume_prefix", self.resume_prefix != newer.resume_prefix),
            ("timeout", self.timeout_s != newer.timeout_s),
            ("repeats", self.repeats != newer.repeats),
            ("max_attempts", self.max_attempts != newer.max_attempts),
            ("lookahead", self.lookahead != newer.lookahead),
            ("gpus", self.gpus != newer.gpus),
            ("[objective]", self.objective != newer.objective),
            ("[budget]", self.budget != newer.budget),
            ("[strategy]", self.strategy != newer.strategy),
            ("[selector]", self.selector != newer.selector),
            ("[hyper]", self.hyper != newer.hyper),
            ("[system]", self.system != newer.system),
            ("[pipeline]", self.pipeline != newer.pipeline),
            ("[early_stopping]", self.early_stopping != newer.early_stopping),
            ("[stability]", self.stability != newer.stability),
            ("[reuse]", self.reuse != newer.reuse),
            ("[[group]]", self.groups != newer.groups),
            ("[measure]", self.measure_nodes != newer.measure_nodes),
            ("[[constraint]]", self.constraints != newer.constraints),
            ("[[enqueue]]", self.enqueue != newer.enqueue),
        ];
        pairs.into_iter().filter(|(_, differs)| *differs).map(|(key, _)| key).collect()
    }

    /// Hyper-parameters no template uses (`command`, `resume`, `env`): each
    /// trial would run the same program whatever their value. System
    /// parameters are applied by the agent and never count as unused.
    pub fn unused_params(&self) -> Vec<String> {
        let templates = self.command.iter().chain(&self.resume).chain(self.env.values());
        let used: std::collections::BTreeSet<String> =
            templates.filter_map(|t| tunefleet_common::template::placeholders(t).ok()).flatten().collect();
        self.hyper.keys().filter(|name| !used.contains(*name)).cloned().collect()
    }

    /// A warning for each of [`Study::unused_params`].
    pub fn unused_param_warnings(&self) -> Vec<String> {
        self.unused_params()
            .iter()
            .map(|name| {
                format!(
                    "study {}: parameter `{name}` is used nowhere: neither `command` nor `env` (nor `resume`) has \
                     {{{name}}}, so every trial runs the same program whatever its value",
                    self.name
                )
            })
            .collect()
    }

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

    /// The program's file name (the command's first word without its directory).
    pub fn program(&self) -> &str {
        self.command.first().map_or("", |c| c.rsplit('/').next().unwrap_or(c))
    }

    /// What makes two jobs the same workload for reuse: the program's file
    /// name and the command's other arguments as the study writes them
    /// (placeholders unexpanded, so hyper-parameters' values do not count
    /// and fixed arguments, such as a data set or an epoch count, do).
    pub fn workload(&self) -> String {
        std::iter::once(self.program())
            .chain(self.command.iter().skip(1).map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A result's figures of `objective.also`, in that order (minimised):
    /// joules of a valid energy reading, seconds of wall time; NaN where not
    /// measured.
    pub fn also_figures(&self, energy_j: Option<f64>, wall_us: u64) -> Vec<f64> {
        self.objective
            .also
            .iter()
            .map(|s| match s {
                Secondary::Energy => energy_j.unwrap_or(f64::NAN),
                Secondary::WallTime => wall_us as f64 / 1e6,
            })
            .collect()
    }

    /// What early stopping judges at its rungs, and which way is better:
    /// the objective; or, for an objective counted up to a target
    /// (`to_target`: energy to accuracy), the target's metric, since the
    /// objective is measured only when a trial ends: a trial trailing at a
    /// rung on the way to the target is stopped before it spends more.
    pub fn stopping_metric(&self) -> (&str, Direction) {
        match &self.objective.to_target {
            Some(t) => {
                let way = match t.bound {
                    super::constraint::Bound::AtLeast(_) => Direction::Maximize,
                    super::constraint::Bound::AtMost(_) => Direction::Minimize,
                };
                (t.metric.as_str(), way)
            }
            None => (self.objective.metric.as_str(), self.objective.direction),
        }
    }

    /// A successful measurement's total violation of the study's
    /// constraints (`None`: it has none).
    pub fn violation(&self, m: &Measurement) -> Option<f64> {
        let base = super::constraint::violation(&self.constraints, m);
        match &self.objective.to_target {
            None => base,
            Some(t) => Some(base.unwrap_or(0.0) + super::measured::reached(m, t).err().unwrap_or(0.0)),
        }
    }

    /// A successful measurement's signed value of each constraint (at most
    /// 0 where it holds), then of its target (`to_target`, by the best
    /// value reported); `None` when it has neither. What the search's model
    /// per constraint learns from ([`Study::violation`] is their positive
    /// parts summed).
    pub fn constraint_margins(&self, m: &Measurement) -> Option<Vec<f64>> {
        if self.constraints.is_empty() && self.objective.to_target.is_none() {
            return None;
        }
        let mut out: Vec<f64> =
            self.constraints.iter().map(|c| c.margin(super::constraint::figure(m, &c.metric))).collect();
        if let Some(t) = &self.objective.to_target {
            out.push(t.margin(super::measured::best_reported(m, t)));
        }
        Some(out)
    }

    /// A successful measurement's objective value, as `objective.aggregate` says.
    pub fn objective_value(&self, m: &Measurement) -> Option<f64> {
        let metric = &self.objective.metric;
        if self.objective.to_target.is_some() || metric == "energy_time" {
            let until = self.objective.to_target.as_ref().and_then(|t| super::measured::reached(m, t).ok());
            return super::measured::measured(m, metric, self.objective.energy_time, until);
        }
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
