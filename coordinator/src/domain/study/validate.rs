//! The check of a study file: every value of the [`super::raw`] mirror
//! validated, with the line and column of a problem, into the
//! [`super::model`] types.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use toml::Spanned;
use tunefleet_common::measurement::EnergySourceKind;
use tunefleet_common::message::{probe_units_at_most, Select, WindowUnit};
use tunefleet_common::params::ParamValue;
use tunefleet_common::template;

use super::error::{Location, StudyError};
use super::model::*;
use super::raw::*;

/// Units of warm-up a pipelined trial runs before its first probe window
/// when the study does not say (`[pipeline] window.warmup`).
pub const DEFAULT_WARMUP: u32 = 1;

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

    pub(super) fn validate(&self, raw: RawStudy) -> Result<Study, StudyError> {
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
        let lookahead = match raw.lookahead.as_ref().map(|l| (*l.get_ref(), l.span())) {
            None | Some((1, _)) => true,
            Some((0, _)) => false,
            Some((n, span)) => {
                return Err(self.at(span, format!("lookahead: {n}: 1 (trials may wait on an agent, held ready behind its busy slots; the default) or 0 (only a free slot)")));
            }
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
        // A measured objective is one figure for the whole trial: there are no
        // epochs of it to average over the kept configuration.
        if raw.objective.aggregate == Aggregate::KeptMean && matches!(metric, "wall_time" | "cpu_time" | "energy") {
            return Err(self.at(
                raw.objective.metric.span(),
                format!(
                    "objective.aggregate: kept_mean averages a metric the workload reports epoch by epoch; {metric} is \
                     measured once for the whole trial (use aggregate = \"final\", or a metric the workload reports)"
                ),
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
                return Err(self.at(seed.span(), "strategy.seed: only the random, tpe and gp strategies take a seed"))
            }
            (StrategyKind::Grid, None) => Strategy::Grid,
            (kind, seed) => {
                let s = match seed {
                    None => 0,
                    Some(seed) => u64::try_from(*seed.get_ref())
                        .map_err(|_| self.at(seed.span(), "strategy.seed: must not be negative"))?,
                };
                match kind {
                    StrategyKind::Random => Strategy::Random { seed: s },
                    StrategyKind::Tpe => Strategy::Tpe { seed: s },
                    StrategyKind::Gp => Strategy::Gp { seed: s },
                    StrategyKind::Grid => Strategy::Grid,
                }
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
                if let Err(e) = crate::domain::bounds::checkpoint("resume_prefix", text) {
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
        if let Some(p) = &pipeline {
            self.read_at_start(p, &system, &raw.command, raw.resume.as_ref(), raw.env.as_ref())?;
        }

        let early_stopping = match &raw.early_stopping {
            None => None,
            Some(e) => {
                if let Some(why) = crate::domain::search::asha::refused(&objective.metric) {
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
                if let Some(p) = &pipeline {
                    let span = match (&e.grace, &raw.pipeline) {
                        (Some(g), _) => g.span(),
                        (None, Some(p)) => p.span(),
                        (None, None) => 0..0,
                    };
                    self.rungs_after_probing(span, p, &system, grace)?;
                }
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
            lookahead,
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
            measure_nodes: raw.measure.and_then(|m| m.nodes).map(|n| n.tags),
            origin: self.origin.to_string(),
            source: self.text.to_string(),
        })
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
        // One unit of warm-up by default: the first epoch (or step) carries
        // the process's start-up and cold caches, never a probe window.
        let (mut window, mut warmup, mut unit) = (1, DEFAULT_WARMUP, WindowUnit::Epochs);
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

    /// A pipelined study's system parameter that the command or its
    /// environment reads through a placeholder is read once, when the
    /// process starts (an executor's cores in `spark-submit
    /// --executor-cores {cores}`, `make -j{cores}`): a window inside the
    /// running trial cannot change it, and would measure another
    /// configuration than it records. Refused, but for threads with the
    /// control channel (the first value from the placeholder, the rest
    /// live).
    fn read_at_start(
        &self,
        p: &Pipelined,
        system: &BTreeMap<SystemParam, ParamSpec>,
        command: &Spanned<Vec<Spanned<String>>>,
        resume: Option<&Spanned<Vec<Spanned<String>>>>,
        env: Option<&Spanned<BTreeMap<Spanned<String>, Spanned<String>>>>,
    ) -> Result<(), StudyError> {
        let args = command.get_ref().iter().enumerate().map(|(i, a)| (format!("command[{i}]"), a));
        let resume =
            resume.iter().flat_map(|r| r.get_ref().iter().enumerate().map(|(i, a)| (format!("resume[{i}]"), a)));
        let env = env.iter().flat_map(|t| t.get_ref().iter().map(|(k, v)| (format!("env.{}", k.get_ref()), v)));
        for (what, arg) in args.chain(resume).chain(env) {
            let names = template::placeholders(arg.get_ref()).unwrap_or_default();
            for (param, spec) in system {
                // One value: nothing is probed.
                let probed = spec.grid_len() > 1;
                if !probed
                    || (*param == SystemParam::Threads && p.control)
                    || !names.iter().any(|n| n == param.as_str())
                {
                    continue;
                }
                return Err(self.at(
                    arg.span(),
                    format!(
                        "{what}: {{{param}}} is read when the process starts, so pipelined probe windows inside a \
                         running trial cannot change it (each window would run the first value and record \
                         another); use mode = \"sequential\" (a trial per value), or leave it to the agent (cores: CPU \
                         affinity, changed live; threads: the control channel)"
                    ),
                ));
            }
        }
        Ok(())
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

    /// Early stopping in a pipelined study: ASHA compares trials at a rung
    /// by the epoch they reported there, so every rung must come after the
    /// probe windows (during them, trials run different system
    /// configurations epoch by epoch). Only windows of epochs have a known
    /// end.
    fn rungs_after_probing(
        &self,
        span: Range<usize>,
        p: &Pipelined,
        system: &BTreeMap<SystemParam, ParamSpec>,
        grace: u32,
    ) -> Result<(), StudyError> {
        if p.unit == WindowUnit::Steps {
            return Err(self.at(
                span,
                "early_stopping: not with probe windows of steps in a pipelined study: how many epochs the \
                 probing takes is not known in advance, so a rung could compare epochs run under different \
                 system configurations; use window = { epochs = N }",
            ));
        }
        let configurations = p.configurations(system);
        let probing = probe_units_at_most(configurations, p.window, p.warmup);
        if u64::from(grace) <= probing {
            return Err(self.at(
                span,
                format!(
                    "early_stopping.grace: in a pipelined study every rung must come after the probe windows \
                     (up to epoch {probing}: {} of warm-up, then windows of {} under {} configurations and up \
                     to {} more to tell the two best apart), where each trial runs the configuration it \
                     kept; set grace = {} or more",
                    p.warmup,
                    p.window,
                    configurations,
                    2 * tunefleet_common::message::MAX_REPROBES,
                    probing + 1
                ),
            ));
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
