//! How a planned trial becomes the [`TrialSpec`] an agent executes: its
//! command and environment rendered from the study's templates, its system
//! parameters and probe plan.

use tunefleet_common::message::{ProbePlan, TrialRef, TrialSpec};
use tunefleet_common::params::ParamValue;
use tunefleet_common::template::{self, TemplateError};

use super::probe::{probe_plan, system_params};
use super::TrialPlan;
use crate::domain::study::{Study, SystemParam};

/// The concrete command, environment, system parameters and timeout of one
/// attempt of a planned trial.
pub fn render(study: &Study, plan: &TrialPlan, trial: &TrialRef) -> Result<TrialSpec, TemplateError> {
    render_resumed(study, probe_plan(study).as_ref(), plan, trial, None)
}

/// [`render`] with the study's probe plan computed once by the caller
/// ([`probe_plan`]), for an attempt that may go on from `checkpoint` (the
/// epoch and the reference its workload reported): the study's `resume`
/// arguments are then appended. Without a `resume` template the trial
/// starts over.
pub fn render_resumed(
    study: &Study,
    probe: Option<&ProbePlan>,
    plan: &TrialPlan,
    trial: &TrialRef,
    checkpoint: Option<&(u32, String)>,
) -> Result<TrialSpec, TemplateError> {
    let mut values = plan.params.clone();
    values.insert("study".into(), ParamValue::Text(study.name.clone()));
    values.insert("trial".into(), ParamValue::Int(clamp_i64(trial.trial)));
    values.insert("attempt".into(), ParamValue::Int(i64::from(trial.attempt)));
    values.insert("repeat".into(), ParamValue::Int(i64::from(plan.repeat)));
    let probe = probe.cloned();
    if let Some(first) = probe.as_ref().and_then(|p| p.configs.first()) {
        // The placeholders of system parameters render their default.
        for (param, value) in [
            (SystemParam::Cores, first.cores.map(u64::from)),
            (SystemParam::Threads, first.threads.map(u64::from)),
            (SystemParam::Memory, first.memory_mib),
        ] {
            if let Some(v) = value {
                values.insert(param.as_str().into(), ParamValue::Int(clamp_i64(v)));
            }
        }
    }
    let mut argv = study.command.iter().map(|arg| template::render(arg, &values)).collect::<Result<Vec<_>, _>>()?;
    if let Some((epoch, reference)) = checkpoint.filter(|_| !study.resume.is_empty()) {
        let mut with = values.clone();
        with.insert("checkpoint".into(), ParamValue::Text(reference.clone()));
        with.insert("checkpoint_epoch".into(), ParamValue::Int(i64::from(*epoch)));
        for arg in &study.resume {
            argv.push(template::render(arg, &with)?);
        }
    }
    let env = study
        .env
        .iter()
        .map(|(k, v)| Ok((k.clone(), template::render(v, &values)?)))
        .collect::<Result<Vec<_>, TemplateError>>()?;
    let system = match probe.as_ref().and_then(|p| p.configs.first()) {
        Some(first) => first.clone(),
        None => system_params(&plan.params),
    };
    Ok(TrialSpec { argv, env, system, timeout_ms: study.timeout_ms(), probe, gpus: study.gpus })
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
