//! A study file's `[pipeline]`: whether its trials probe system
//! configurations inside one run, and how.

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;
use tunefleet_common::message::{probe_units_at_most, Select, WindowUnit};
use tunefleet_common::template;

use super::super::error::StudyError;
use super::super::model::*;
use super::super::raw::{PipelineMode, RawPipeline};
use super::{positive_u32, FileCheck};

/// Units of warm-up a pipelined trial runs before its first probe window
/// when the study does not say (`[pipeline] window.warmup`).
const DEFAULT_WARMUP: u32 = 1;

impl FileCheck<'_> {
    pub(super) fn pipeline(
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
    pub(super) fn read_at_start(
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

    /// Early stopping in a pipelined study: ASHA compares trials at a rung
    /// by the epoch they reported there, so every rung must come after the
    /// probe windows (during them, trials run different system
    /// configurations epoch by epoch). Only windows of epochs have a known
    /// end.
    pub(super) fn rungs_after_probing(
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
}
