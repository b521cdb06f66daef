//! The probe plan of a pipelined study: which system configurations a
//! trial walks through, epoch window by window.

use tunefleet_common::message::{ProbePlan, SystemParams};
use tunefleet_common::params::{ParamValue, Params};
use tunefleet_search::proposer::{Grid, Proposer};
use tunefleet_search::space::grid_values;

use crate::domain::study::{ParamSpec, ProbeOrder, Study, SystemParam};

/// The probe plan of a pipelined study's trials: the default configuration
/// (every system parameter at its largest value: what a machine gives a job
/// that asks for nothing) first, then the others in the study's order.
pub fn probe_plan(study: &Study) -> Option<ProbePlan> {
    let pipeline = study.pipeline.as_ref()?;
    let configs = probe_configs(&study.system, pipeline.probe);
    Some(ProbePlan {
        configs: configs.iter().map(system_params).collect(),
        window: pipeline.window,
        warmup: pipeline.warmup,
        unit: pipeline.unit,
        select: pipeline.select,
        control: pipeline.control,
        from_best: pipeline.probe == crate::domain::study::ProbeOrder::OneAtATime,
    })
}

/// The system configurations a pipelined trial probes, in order: the
/// default (every parameter at its largest value) first.
pub fn probe_configs(system: &std::collections::BTreeMap<SystemParam, ParamSpec>, order: ProbeOrder) -> Vec<Params> {
    let axes: Vec<(SystemParam, Vec<ParamValue>)> = system.iter().map(|(p, spec)| (*p, grid_values(spec))).collect();
    let default: Params = axes
        .iter()
        .filter_map(|(p, values)| Some((p.as_str().to_string(), values.iter().max_by_key(|v| v.as_u64())?.clone())))
        .collect();
    let mut configs = vec![default.clone()];
    match order {
        ProbeOrder::OneAtATime => {
            for (p, values) in &axes {
                for v in values {
                    if default.get(p.as_str()) != Some(v) {
                        let mut c = default.clone();
                        c.insert(p.as_str().to_string(), v.clone());
                        configs.push(c);
                    }
                }
            }
        }
        ProbeOrder::Grid => {
            let space: Vec<(String, ParamSpec)> =
                system.iter().map(|(p, spec)| (p.as_str().to_string(), spec.clone())).collect();
            let mut grid = Grid::new(&space);
            while let Some(c) = grid.ask(&[]) {
                if c != default {
                    configs.push(c);
                }
            }
        }
    }
    configs
}

/// The system parameters present in `params`.
pub fn system_params(params: &Params) -> SystemParams {
    let get = |p: SystemParam| params.get(p.as_str()).and_then(ParamValue::as_u64);
    SystemParams {
        cores: get(SystemParam::Cores).and_then(|v| u32::try_from(v).ok()),
        threads: get(SystemParam::Threads).and_then(|v| u32::try_from(v).ok()),
        memory_mib: get(SystemParam::Memory),
    }
}

/// Whether `system` lies in `study`'s own system space: every parameter
/// the study searches at one of its grid values, every other one unset
/// (what a machine gives a job that asks for nothing). A configuration
/// reused from another study must pass this.
pub fn in_space(study: &Study, system: &SystemParams) -> bool {
    let values = [
        (SystemParam::Cores, system.cores.map(u64::from)),
        (SystemParam::Threads, system.threads.map(u64::from)),
        (SystemParam::Memory, system.memory_mib),
    ];
    values.iter().all(|(param, value)| match (study.system.get(param), value) {
        (None, None) => true,
        (None, Some(_)) | (Some(_), None) => false,
        (Some(spec), Some(v)) => grid_values(spec).iter().any(|g| g.as_u64() == Some(*v)),
    })
}
