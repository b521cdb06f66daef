//! The search space of a study file: its `[hyper.NAME]` and
//! `[system.NAME]` parameters, each checked by its kind.

use std::collections::BTreeMap;

use toml::Spanned;
use tunefleet_common::params::ParamValue;

use super::super::error::StudyError;
use super::super::model::*;
use super::super::raw::{ParamKind, RawParam};
use super::{valid_param_name, FileCheck, Space};

/// A `[hyper]` or `[system]` table as written: each parameter by name.
pub(super) type RawParams = Spanned<BTreeMap<Spanned<String>, Spanned<RawParam>>>;

impl FileCheck<'_> {
    /// The search space: `[hyper.NAME]` and `[system.NAME]` parameters, at
    /// least one of them, no name in both.
    pub(super) fn space(&self, hyper: Option<&RawParams>, system: Option<&RawParams>) -> Result<Space, StudyError> {
        let hyper_params = self.hyper(hyper)?;
        let system_params = self.system(system, &hyper_params)?;
        if hyper_params.is_empty() && system_params.is_empty() {
            let span = hyper.or(system).map(|t| t.span());
            let message = "the search space is empty: define at least one [hyper.NAME] or [system.NAME] parameter";
            return Err(match span {
                Some(span) => self.at(span, message),
                None => self.nowhere(message),
            });
        }
        Ok(Space { hyper: hyper_params, system: system_params })
    }

    /// `[hyper.NAME]`: the workload's own parameters, named as templates
    /// can refer to them.
    fn hyper(&self, raw: Option<&RawParams>) -> Result<BTreeMap<String, ParamSpec>, StudyError> {
        let mut hyper = BTreeMap::new();
        let Some(table) = raw else { return Ok(hyper) };
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
        }
        Ok(hyper)
    }

    /// `[system.NAME]`: what the agent applies (cores, threads, memory),
    /// none of them also a hyper-parameter.
    fn system(
        &self,
        raw: Option<&RawParams>,
        hyper: &BTreeMap<String, ParamSpec>,
    ) -> Result<BTreeMap<SystemParam, ParamSpec>, StudyError> {
        let mut system = BTreeMap::new();
        let Some(table) = raw else { return Ok(system) };
        for (key, param) in table.get_ref() {
            let pname = key.get_ref();
            let path = format!("system.{pname}");
            let Some(which) = SystemParam::parse(pname) else {
                return Err(self
                    .at(key.span(), format!("{path}: unknown system parameter (expected cores, threads or memory)")));
            };
            if hyper.contains_key(pname) {
                return Err(self.at(key.span(), format!("{path}: {pname:?} is also defined in [hyper]")));
            }
            system.insert(which, self.param(&path, param, true)?);
        }
        Ok(system)
    }

    /// One `[hyper.NAME]` or `[system.NAME]` parameter at `path`: its kind
    /// and the keys that kind takes (a system parameter's values are whole
    /// numbers of 1 or more).
    fn param(&self, path: &str, param: &Spanned<RawParam>, is_system: bool) -> Result<ParamSpec, StudyError> {
        let p = param.get_ref();
        let kind = *p.kind.get_ref();
        if is_system && matches!(kind, ParamKind::Float | ParamKind::LogFloat) {
            return Err(self.at(
                p.kind.span(),
                format!("{path}: system parameters take whole numbers: use kind int or categorical"),
            ));
        }
        match kind {
            ParamKind::Categorical => self.categorical(path, param, is_system),
            ParamKind::Int => self.int_range(path, param, is_system),
            ParamKind::Float | ParamKind::LogFloat => self.float_range(path, param),
        }
    }

    /// A key given that the parameter's kind does not take.
    fn refuse_key<T>(
        &self,
        path: &str,
        p: &RawParam,
        present: Option<&Spanned<T>>,
        key: &str,
    ) -> Result<(), StudyError> {
        match present {
            Some(v) => {
                Err(self.at(v.span(), format!("{path}: `{key}` does not apply to kind {}", p.kind.get_ref().as_str())))
            }
            None => Ok(()),
        }
    }

    /// The `low` and `high` a range of kind `what` requires.
    fn low_high<'p>(
        &self,
        path: &str,
        param: &'p Spanned<RawParam>,
        what: &str,
    ) -> Result<(&'p Spanned<toml::Value>, &'p Spanned<toml::Value>), StudyError> {
        let p = param.get_ref();
        let low = p
            .low
            .as_ref()
            .ok_or_else(|| self.at(param.span(), format!("{path}: missing `low` (required for kind {what})")))?;
        let high = p
            .high
            .as_ref()
            .ok_or_else(|| self.at(param.span(), format!("{path}: missing `high` (required for kind {what})")))?;
        Ok((low, high))
    }

    /// `kind = "categorical"`: a non-empty list of distinct values.
    fn categorical(&self, path: &str, param: &Spanned<RawParam>, is_system: bool) -> Result<ParamSpec, StudyError> {
        let p = param.get_ref();
        self.refuse_key(path, p, p.low.as_ref(), "low")?;
        self.refuse_key(path, p, p.high.as_ref(), "high")?;
        self.refuse_key(path, p, p.step.as_ref(), "step")?;
        self.refuse_key(path, p, p.grid.as_ref(), "grid")?;
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
                        format!("{path}: values must be integers, finite floats or strings, not {}", other.type_str()),
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

    /// `kind = "int"`: `low` below `high`, a `step` of 1 or more.
    fn int_range(&self, path: &str, param: &Spanned<RawParam>, is_system: bool) -> Result<ParamSpec, StudyError> {
        let p = param.get_ref();
        self.refuse_key(path, p, p.values.as_ref(), "values")?;
        self.refuse_key(path, p, p.grid.as_ref(), "grid")?;
        let (low, high) = self.low_high(path, param, "int")?;
        let lo = self.int(path, "low", low)?;
        let hi = self.int(path, "high", high)?;
        if lo >= hi {
            return Err(self.at(low.span(), format!("{path}: low ({lo}) must be below high ({hi})")));
        }
        if is_system && lo < 1 {
            return Err(self.at(low.span(), format!("{path}: system parameter values must be >= 1 (low is {lo})")));
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

    /// `kind = "float"` or `"log_float"` (`low` above 0): `low` below
    /// `high`, `grid` points of 2 or more for the grid strategy.
    fn float_range(&self, path: &str, param: &Spanned<RawParam>) -> Result<ParamSpec, StudyError> {
        let p = param.get_ref();
        let kind = *p.kind.get_ref();
        self.refuse_key(path, p, p.values.as_ref(), "values")?;
        self.refuse_key(path, p, p.step.as_ref(), "step")?;
        let (low, high) = self.low_high(path, param, kind.as_str())?;
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
