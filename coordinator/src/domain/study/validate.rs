//! The check of a study file: every value of the [`super::raw`] mirror
//! validated, with the line and column of a problem, into the
//! [`super::model`] types. [`FileCheck::validate`] takes the file section
//! by section, a method each; the search space's parameters are checked in
//! `space`, the `[pipeline]` table in `pipeline`.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use toml::Spanned;
use tunefleet_common::measurement::EnergySourceKind;
use tunefleet_common::message::MAX_GPUS;
use tunefleet_common::params::{ParamValue, Params};
use tunefleet_common::template;

use super::constraint::{Bound, Constraint};
use super::error::{Location, StudyError};
use super::measured::{EnergyTime, Target};
use super::model::*;
use super::raw::*;

mod pipeline;
mod space;

/// A study's search space, checked (in `space`).
struct Space {
    hyper: BTreeMap<String, ParamSpec>,
    system: BTreeMap<SystemParam, ParamSpec>,
}

/// The study text being checked and where it came from, for messages.
pub(super) struct FileCheck<'a> {
    pub(super) origin: &'a str,
    pub(super) text: &'a str,
}

impl FileCheck<'_> {
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

    pub(super) fn toml(&self, e: &toml::de::Error) -> StudyError {
        let message = e.message().trim().to_string();
        match e.span() {
            Some(span) => self.at(span, message),
            None => self.nowhere(message),
        }
    }

    /// The study `raw` describes, its sections checked in this order (the
    /// first problem found is the one reported).
    pub(super) fn validate(&self, raw: RawStudy) -> Result<Study, StudyError> {
        let name = self.name(&raw.name)?;
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
        let lookahead = self.lookahead(raw.lookahead.as_ref())?;
        let gpus = self.gpus(raw.gpus.as_ref())?;
        let objective = self.objective(&raw.objective)?;
        let budget = self.budget(&raw.budget, repeats)?;
        let max_failures = match &raw.budget.max_failures {
            None => None,
            Some(v) => Some(u64::try_from(*v.get_ref()).map_err(|_| {
                self.at(v.span(), format!("budget.max_failures: must be 0 (never stop) or more (got {})", v.get_ref()))
            })?),
        };
        let strategy = self.strategy(&raw.strategy)?;
        let warm_start = self.warm_start(raw.warm_start.as_ref(), name, strategy)?;
        let constraints = self.constraints(raw.constraint.as_deref().unwrap_or_default())?;
        let selector = match raw.selector {
            None => Selector::default(),
            Some(s) => self.selector(s, "selector")?,
        };
        let groups = self.groups(raw.group.unwrap_or_default(), name, &selector, budget, repeats)?;
        let Space { hyper, system } = self.space(raw.hyper.as_ref(), raw.system.as_ref())?;
        let known: BTreeSet<&str> = hyper
            .keys()
            .map(String::as_str)
            .chain(system.keys().map(|s| s.as_str()))
            .chain(BUILTINS.iter().copied())
            .collect();
        let command = self.command(&raw.command, &known)?;
        let (resume, resume_prefix) = self.resume(raw.resume.as_ref(), raw.resume_prefix.as_ref(), &known)?;
        let env = self.env(raw.env.as_ref(), &known)?;
        let pipeline = match &raw.pipeline {
            Some(p) => self.pipeline(p, &system)?,
            None => None,
        };
        if let Some(p) = &pipeline {
            self.read_at_start(p, &system, &raw.command, raw.resume.as_ref(), raw.env.as_ref())?;
        }
        let early_stopping = match &raw.early_stopping {
            None => None,
            Some(e) => {
                // Counted to a target, the rungs judge the target's metric.
                let metric = match &objective.to_target {
                    Some(t) => (t.metric.as_str(), raw.objective.metric.span()),
                    None => (objective.metric.as_str(), raw.objective.metric.span()),
                };
                Some(self.early_stopping(e, metric, raw.pipeline.as_ref(), pipeline.as_ref(), &system)?)
            }
        };
        let stability = match &raw.stability {
            None => None,
            Some(st) => Some(self.stability(st, repeats)?),
        };
        let reuse = self.reuse(raw.reuse.as_ref(), &hyper, pipeline.is_some())?;
        let enqueue = self.enqueue(raw.enqueue.as_deref().unwrap_or_default(), &hyper, &system, pipeline.is_some())?;
        Ok(Study {
            name: name.to_string(),
            command,
            env,
            resume,
            resume_prefix,
            timeout_s,
            repeats,
            max_attempts,
            lookahead,
            gpus,
            objective,
            budget,
            max_failures,
            strategy,
            selector,
            hyper,
            system,
            pipeline,
            early_stopping,
            stability,
            reuse,
            groups,
            measure_nodes: raw.measure.and_then(|m| m.nodes).map(|n| n.tags),
            warm_start,
            constraints,
            enqueue,
            origin: self.origin.to_string(),
            source: self.text.to_string(),
        })
    }

    /// `name`: a valid study name.
    fn name<'r>(&self, name: &'r Spanned<String>) -> Result<&'r str, StudyError> {
        let text = name.get_ref();
        if !valid_study_name(text) {
            return Err(self.at(
                name.span(),
                format!("name: {text:?} is not a valid study name ([a-z0-9_-], 1 to {MAX_NAME_LEN} characters)"),
            ));
        }
        Ok(text)
    }

    /// `lookahead`: 1 (the default) or 0.
    fn lookahead(&self, raw: Option<&Spanned<i64>>) -> Result<bool, StudyError> {
        match raw.map(|l| (*l.get_ref(), l.span())) {
            None | Some((1, _)) => Ok(true),
            Some((0, _)) => Ok(false),
            Some((n, span)) => Err(self.at(span, format!("lookahead: {n}: 1 (trials may wait on an agent, held ready behind its busy slots; the default) or 0 (only a free slot)"))),
        }
    }

    /// `gpus`: GPUs per trial, 0 (the default) to [`tunefleet_common::message::MAX_GPUS`].
    fn gpus(&self, raw: Option<&Spanned<i64>>) -> Result<u32, StudyError> {
        match raw.map(|g| (*g.get_ref(), g.span())) {
            None => Ok(0),
            Some((n, span)) => u32::try_from(n).ok().filter(|n| *n <= MAX_GPUS).ok_or_else(|| {
                self.at(span, format!("gpus: {n}: GPUs each trial is given, 0 (the default) to {MAX_GPUS}"))
            }),
        }
    }

    /// `[objective]`: a metric, the measured figures it also minimises, and
    /// how a trial's reports become its value.
    fn objective(&self, raw: &RawObjective) -> Result<Objective, StudyError> {
        let metric = raw.metric.get_ref().trim();
        if metric.is_empty() {
            return Err(self.at(raw.metric.span(), "objective.metric: must not be empty"));
        }
        let mut also = raw.also.clone();
        also.dedup();
        if also.iter().any(|s| s.as_str() == metric) || also.len() != raw.also.len() {
            return Err(self.at(
                raw.metric.span(),
                "objective.also: each of energy and wall_time at most once, and not the metric itself",
            ));
        }
        // A measured objective is one figure for the whole trial: there are no
        // epochs of it to average over the kept configuration.
        if raw.aggregate == Aggregate::KeptMean && matches!(metric, "wall_time" | "cpu_time" | "energy" | "energy_time")
        {
            return Err(self.at(
                raw.metric.span(),
                format!(
                    "objective.aggregate: kept_mean averages a metric the workload reports epoch by epoch; {metric} is \
                     measured once for the whole trial (use aggregate = \"final\", or a metric the workload reports)"
                ),
            ));
        }
        let (energy_time, to_target) = self.measured_objective(raw, metric)?;
        Ok(Objective {
            metric: metric.to_string(),
            direction: raw.direction,
            also,
            aggregate: raw.aggregate,
            energy_time,
            to_target,
        })
    }

    /// `eta` and `max_power_w` (for `metric = "energy_time"` only, which
    /// needs both) and `to_target` (for a measured metric, minimised).
    fn measured_objective(
        &self,
        raw: &RawObjective,
        metric: &str,
    ) -> Result<(Option<EnergyTime>, Option<Target>), StudyError> {
        let measured = matches!(metric, "energy" | "wall_time" | "energy_time");
        if (metric == "energy_time" || raw.to_target.is_some()) && raw.direction != Direction::Minimize {
            return Err(self.at(raw.metric.span(), format!("objective: {metric} is a cost: direction = \"minimize\"")));
        }
        let energy_time = match (metric, &raw.eta, &raw.max_power_w) {
            ("energy_time", Some(eta), Some(power)) => {
                if !(0.0..=1.0).contains(eta.get_ref()) {
                    return Err(self.at(eta.span(), format!("objective.eta: 0 to 1 (got {})", eta.get_ref())));
                }
                if !(power.get_ref().is_finite() && *power.get_ref() > 0.0) {
                    return Err(self.at(power.span(), "objective.max_power_w: a power above 0 W"));
                }
                Some(EnergyTime { eta: *eta.get_ref(), max_power_w: *power.get_ref() })
            }
            ("energy_time", _, _) => {
                return Err(self.at(raw.metric.span(), "objective: energy_time needs eta (0 to 1) and max_power_w"));
            }
            (_, None, None) => None,
            _ => {
                return Err(
                    self.at(raw.metric.span(), "objective: eta and max_power_w are for metric = \"energy_time\"")
                )
            }
        };
        let to_target = match &raw.to_target {
            None => None,
            Some(_) if !measured => {
                return Err(self.at(
                    raw.metric.span(),
                    "objective.to_target: counts a measured metric (energy, wall_time, energy_time) up to a target",
                ));
            }
            Some(t) => self.constraints(std::slice::from_ref(t))?.pop(),
        };
        Ok((energy_time, to_target))
    }

    /// `[budget] trials`: at least one run of each repeat, at most
    /// [`MAX_BUDGET`].
    fn budget(&self, raw: &RawBudget, repeats: u32) -> Result<u64, StudyError> {
        let budget = positive(self, &raw.trials, "budget.trials")?;
        if budget > MAX_BUDGET {
            return Err(self.at(raw.trials.span(), format!("budget.trials: at most {MAX_BUDGET} (got {budget})")));
        }
        if budget < u64::from(repeats) {
            return Err(self.at(
                raw.trials.span(),
                format!("budget.trials: {budget} is less than repeats ({repeats}): no configuration could run"),
            ));
        }
        Ok(budget)
    }

    /// `[strategy]`: its kind, and a seed for those that draw.
    fn strategy(&self, raw: &RawStrategy) -> Result<Strategy, StudyError> {
        let seed = match (raw.kind, &raw.seed) {
            (RawStrategyKind::Grid | RawStrategyKind::External, Some(seed)) => {
                return Err(self.at(seed.span(), "strategy.seed: only the random, tpe and gp strategies take a seed"))
            }
            (_, None) => 0,
            (_, Some(seed)) => u64::try_from(*seed.get_ref())
                .map_err(|_| self.at(seed.span(), "strategy.seed: must not be negative"))?,
        };
        Ok(match raw.kind {
            RawStrategyKind::Grid => Strategy::Grid,
            RawStrategyKind::Random => Strategy::Random { seed },
            RawStrategyKind::Tpe => Strategy::Tpe { seed },
            RawStrategyKind::Gp => Strategy::Gp { seed },
            RawStrategyKind::External => Strategy::External,
        })
    }

    /// `[[enqueue]]`: each a configuration of searched parameters (system
    /// ones too, unless pipelined), every value inside its parameter's space.
    fn enqueue(
        &self,
        raw: &[Spanned<RawConfig>],
        hyper: &BTreeMap<String, ParamSpec>,
        system: &BTreeMap<SystemParam, ParamSpec>,
        pipelined: bool,
    ) -> Result<Vec<Params>, StudyError> {
        let mut out = Vec::with_capacity(raw.len());
        for entry in raw {
            if entry.get_ref().is_empty() {
                return Err(self.at(entry.span(), "enqueue: a configuration names at least one parameter"));
            }
            let mut params = Params::new();
            for (name, value) in entry.get_ref() {
                let spec = hyper
                    .get(name)
                    .or_else(|| {
                        (!pipelined).then(|| system.iter().find(|(p, _)| p.as_str() == name).map(|(_, s)| s)).flatten()
                    })
                    .ok_or_else(|| {
                        self.at(value.span(), format!("enqueue.{name}: not a parameter this study searches"))
                    })?;
                let v = match (value.get_ref(), spec) {
                    (toml::Value::Integer(i), ParamSpec::Float { .. } | ParamSpec::LogFloat { .. }) => {
                        ParamValue::Float(*i as f64)
                    }
                    (toml::Value::Integer(i), _) => ParamValue::Int(*i),
                    (toml::Value::Float(f), _) => ParamValue::Float(*f),
                    (toml::Value::String(s), _) => ParamValue::Text(s.clone()),
                    (other, _) => {
                        return Err(self.at(value.span(), format!("enqueue.{name}: {other} is no parameter value")))
                    }
                };
                if !spec.holds(&v) {
                    return Err(self.at(value.span(), format!("enqueue.{name}: {v} is outside its space")));
                }
                params.insert(name.clone(), v);
            }
            out.push(params);
        }
        Ok(out)
    }

    /// `[[constraint]]`: each a metric name and one finite bound.
    fn constraints(&self, raw: &[Spanned<RawConstraint>]) -> Result<Vec<Constraint>, StudyError> {
        let mut out = Vec::with_capacity(raw.len());
        for c in raw {
            let r = c.get_ref();
            let metric = r.metric.get_ref();
            if !valid_param_name(metric) {
                return Err(self.at(r.metric.span(), format!("constraint.metric: {metric:?} is no metric name")));
            }
            let bound = match (r.at_most, r.at_least) {
                (Some(b), None) if b.is_finite() => Bound::AtMost(b),
                (None, Some(b)) if b.is_finite() => Bound::AtLeast(b),
                (None, None) | (Some(_), Some(_)) => {
                    return Err(self.at(c.span(), "constraint: give one of at_most and at_least"));
                }
                _ => return Err(self.at(c.span(), "constraint: the bound must be a finite number")),
            };
            out.push(Constraint { metric: metric.clone(), bound });
        }
        Ok(out)
    }

    /// `[warm_start] studies`: valid study names, not the study's own, for
    /// a strategy that learns from results.
    fn warm_start(
        &self,
        raw: Option<&Spanned<RawWarmStart>>,
        name: &str,
        strategy: Strategy,
    ) -> Result<Vec<String>, StudyError> {
        let Some(raw) = raw else { return Ok(Vec::new()) };
        if !strategy.learns_from_results() {
            return Err(self.at(raw.span(), "warm_start: only the tpe and gp strategies learn from earlier results"));
        }
        let mut out = Vec::new();
        for s in &raw.get_ref().studies {
            let other = s.get_ref();
            if !valid_study_name(other) || other == name {
                let why = if other == name { "is this study" } else { "is no valid study name" };
                return Err(self.at(s.span(), format!("warm_start.studies: {other:?} {why}")));
            }
            if !out.contains(other) {
                out.push(other.clone());
            }
        }
        Ok(out)
    }

    /// `[[group]]`: each a study of its own (`NAME-GROUP`), with the study's
    /// selector narrowed by its own and a budget of its own or the study's.
    fn groups(
        &self,
        raw: Vec<Spanned<RawGroup>>,
        name: &str,
        selector: &Selector,
        budget: u64,
        repeats: u32,
    ) -> Result<Vec<Group>, StudyError> {
        let mut groups = Vec::new();
        for g in raw {
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
        Ok(groups)
    }

    /// `command`: a program and its arguments, placeholders naming `known`.
    fn command(&self, raw: &Spanned<Vec<Spanned<String>>>, known: &BTreeSet<&str>) -> Result<Vec<String>, StudyError> {
        if raw.get_ref().is_empty() {
            return Err(self.at(raw.span(), "command: must name a program"));
        }
        let mut command = Vec::with_capacity(raw.get_ref().len());
        for (i, arg) in raw.get_ref().iter().enumerate() {
            if i == 0 && arg.get_ref().trim().is_empty() {
                return Err(self.at(arg.span(), "command: the program must not be empty"));
            }
            self.check_template(&format!("command[{i}]"), arg, known)?;
            command.push(arg.get_ref().clone());
        }
        Ok(command)
    }

    /// `resume` (the arguments that resume from a checkpoint, which may
    /// also name the checkpoint's placeholders) and `resume_prefix`, which
    /// needs it.
    fn resume(
        &self,
        raw: Option<&Spanned<Vec<Spanned<String>>>>,
        prefix: Option<&Spanned<String>>,
        known: &BTreeSet<&str>,
    ) -> Result<(Vec<String>, Option<String>), StudyError> {
        let mut resume = Vec::new();
        if let Some(args) = raw {
            let mut with_checkpoint = known.clone();
            with_checkpoint.extend(RESUME_BUILTINS);
            for (i, arg) in args.get_ref().iter().enumerate() {
                self.check_template(&format!("resume[{i}]"), arg, &with_checkpoint)?;
                resume.push(arg.get_ref().clone());
            }
        }
        let resume_prefix = match prefix {
            None => None,
            Some(prefix) if resume.is_empty() => {
                return Err(
                    self.at(prefix.span(), "resume_prefix: needs resume (the arguments that use the checkpoint)")
                )
            }
            Some(prefix) => {
                let text = prefix.get_ref();
                if let Err(e) = crate::domain::bounds::checkpoint("resume_prefix", text) {
                    return Err(self.at(prefix.span(), e.to_string()));
                }
                Some(text.clone())
            }
        };
        Ok((resume, resume_prefix))
    }

    /// `[env]`: variables set for the workload, their values templates
    /// naming `known`.
    fn env(
        &self,
        raw: Option<&Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
        known: &BTreeSet<&str>,
    ) -> Result<BTreeMap<String, String>, StudyError> {
        let mut env = BTreeMap::new();
        let Some(table) = raw else { return Ok(env) };
        for (key, value) in table.get_ref() {
            let k = key.get_ref();
            if !valid_env_name(k) {
                return Err(self.at(key.span(), format!("env.{k}: invalid environment variable name")));
            }
            self.check_template(&format!("env.{k}"), value, known)?;
            env.insert(k.clone(), value.get_ref().clone());
        }
        Ok(env)
    }

    /// `[early_stopping]`: ASHA's reduction and grace, for an objective
    /// `metric` (with where it is written) it can compare at a rung; in a
    /// pipelined study every rung after the probe windows (`raw_pipeline`
    /// for where to point).
    fn early_stopping(
        &self,
        e: &RawEarlyStopping,
        metric: (&str, Range<usize>),
        raw_pipeline: Option<&Spanned<RawPipeline>>,
        pipeline: Option<&Pipelined>,
        system: &BTreeMap<SystemParam, ParamSpec>,
    ) -> Result<EarlyStopping, StudyError> {
        if let Some(why) = tunefleet_search::asha::refused(metric.0) {
            return Err(self.at(metric.1, why));
        }
        let reduction = match &e.reduction {
            Some(r) if *r.get_ref() < 2 => return Err(self.at(r.span(), "early_stopping.reduction: must be 2 or more")),
            Some(r) => positive_u32(self, r, "early_stopping.reduction")?,
            None => 3,
        };
        let grace = match &e.grace {
            Some(g) => positive_u32(self, g, "early_stopping.grace")?,
            None => 1,
        };
        if let Some(p) = pipeline {
            let span = match (&e.grace, raw_pipeline) {
                (Some(g), _) => g.span(),
                (None, Some(p)) => p.span(),
                (None, None) => 0..0,
            };
            self.rungs_after_probing(span, p, system, grace)?;
        }
        Ok(EarlyStopping { reduction, grace })
    }

    /// `[stability]`: the spread that makes a configuration stable over at
    /// least two repeats, and how many repeats it may take.
    fn stability(&self, st: &Spanned<RawStability>, repeats: u32) -> Result<Stability, StudyError> {
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
        Ok(Stability { spread, max_repeats })
    }
    fn selector(&self, s: RawSelector, key: &str) -> Result<Selector, StudyError> {
        let mut energy = Vec::new();
        for e in &s.energy {
            let Ok(kind) = e.get_ref().parse::<EnergySourceKind>() else {
                let names: Vec<&str> = EnergySourceKind::ALL.iter().map(|k| k.as_str()).collect();
                return Err(
                    self.at(e.span(), format!("{key}.energy: {:?} is not one of {}", e.get_ref(), names.join(", ")))
                );
            };
            energy.push(kind);
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
    ) -> Result<ReusePolicy, StudyError> {
        let mut policy = ReusePolicy::default();
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
        let non_negative = |value: Option<f64>, key: &str| match value {
            Some(v) if !(v.is_finite() && v >= 0.0) => {
                Err(self.at(raw.span(), format!("{key}: must be a number of 0 or more (got {v})")))
            }
            v => Ok(v),
        };
        if let Some(v) = non_negative(r.radius_factor, "reuse.radius_factor")? {
            policy.radius_factor = v;
        }
        if let Some(v) = non_negative(r.min_threshold, "reuse.min_threshold")? {
            policy.min_threshold = v;
        }
        policy.verify_bound = non_negative(r.verify_bound, "reuse.verify_bound")?;
        policy.across_workloads = r.across_workloads.unwrap_or(false);
        Ok(policy)
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
}

fn positive(ctx: &FileCheck<'_>, v: &Spanned<i64>, key: &str) -> Result<u64, StudyError> {
    u64::try_from(*v.get_ref())
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| ctx.at(v.span(), format!("{key}: must be at least 1 (got {})", v.get_ref())))
}

fn positive_u32(ctx: &FileCheck<'_>, v: &Spanned<i64>, key: &str) -> Result<u32, StudyError> {
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
