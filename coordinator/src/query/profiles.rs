//! What `tunefleet profiles` prints: the clusters of each device class
//! with their members and configurations, every reuse decision, and where
//! a job would land and why. Rendered from the store's rows, as text or JSON.

use std::collections::BTreeMap;

use serde::Serialize;
use tunefleet_common::message::Select;

use crate::domain::cluster::ClusterModel;
use crate::domain::reuse::{self, Record, ReuseDecision};
use crate::store::{Store, StoreError};

/// Why a listing cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ProfilesError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    NotFound(String),
}

/// One cluster of one device class, for listings.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterView {
    pub class: String,
    pub cluster: usize,
    pub size: usize,
    pub radius: f64,
    /// Members by workload program, and the trials (study/trial).
    pub workloads: BTreeMap<String, usize>,
    pub members: Vec<String>,
    /// Best configuration per hyper-parameter group (by time), with its
    /// time relative to the first window and the probed jobs it came from.
    pub configurations: Vec<(String, String, f64, usize)>,
}

/// One device class's model, summarised.
#[derive(Debug, Clone, Serialize)]
pub struct ClassView {
    pub class: String,
    pub profiles: usize,
    pub fitted_on: usize,
    pub k: usize,
    pub silhouette: Option<f64>,
    pub features: Vec<&'static str>,
    pub clusters: Vec<ClusterView>,
}

/// Forgets the window profiles learnt from `agent` (`tunefleet profiles
/// forget --agent`): they leave the reuse model of their device class,
/// whose clusters are fitted again on what is left. Returns how many went,
/// by class.
pub fn forget(store: &mut Store, agent: &str, now_ms: u64) -> Result<Vec<(String, u64)>, ProfilesError> {
    let refit = |records: &[Record]| {
        let profiles: Vec<_> = records.iter().map(|r| r.profile.clone()).collect();
        crate::domain::cluster::fit(&profiles, &crate::domain::cluster::FitOptions::default()).ok().map(|f| f.model)
    };
    Ok(store.forget_agent_profiles(agent, now_ms, refit)?)
}

/// Every class's clusters, from the stored models and records.
pub fn classes(store: &Store) -> Result<Vec<ClassView>, ProfilesError> {
    let mut records: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for r in store.profile_records()? {
        records.entry(r.class.clone()).or_default().push(r);
    }
    let mut out = Vec::new();
    for (class, model, fitted_on) in store.cluster_models()? {
        let recs = records.remove(&class).unwrap_or_default();
        out.push(class_view(class, &model, usize::try_from(fitted_on).unwrap_or(usize::MAX), &recs));
    }
    Ok(out)
}

fn class_view(class: String, model: &ClusterModel, fitted_on: usize, records: &[Record]) -> ClassView {
    let placed: Vec<Option<usize>> = records.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
    let clusters = (0..model.k())
        .map(|c| {
            let members: Vec<&Record> =
                records.iter().zip(&placed).filter(|(_, p)| **p == Some(c)).map(|(r, _)| r).collect();
            let mut workloads = BTreeMap::new();
            let mut groups: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
            for r in &members {
                *workloads.entry(r.workload.clone()).or_insert(0) += 1;
                groups.entry(r.group.as_str()).or_default().push(r);
            }
            let configurations = groups
                .into_iter()
                .filter_map(|(g, rs)| {
                    reuse::recommend(rs.into_iter(), Select::Time)
                        .filter(|(_, _, from)| *from > 0)
                        .map(|(s, t, from)| (g.to_string(), reuse::system_text(&s), t, from))
                })
                .collect();
            ClusterView {
                class: class.clone(),
                cluster: c,
                size: members.len(),
                radius: model.radius.get(c).copied().unwrap_or(0.0),
                workloads,
                members: members.iter().map(|r| format!("{}/{}", r.study, r.trial)).collect(),
                configurations,
            }
        })
        .collect();
    ClassView {
        class,
        profiles: records.len(),
        fitted_on,
        k: model.k(),
        silhouette: model.silhouette,
        features: model.feature_names(),
        clusters,
    }
}

/// Where trial `trial` of `study` would land now, and why: its stored
/// first-window profile against its device class's current model.
#[derive(Debug, Clone, Serialize)]
pub struct Classified {
    pub study: String,
    pub trial: u64,
    pub class: String,
    /// Distance to every cluster, nearest first.
    pub distances: Vec<(usize, f64)>,
    pub decision: String,
}

pub fn classify(store: &Store, study: &str, trial: u64) -> Result<Classified, ProfilesError> {
    let record = store.results(study)?.into_iter().find(|r| r.plan.trial == trial);
    let (params, result) = record.and_then(|r| Some((r.plan.params, r.result?))).ok_or_else(|| {
        ProfilesError::NotFound(format!("trial {trial} of {study:?} has no result in {}", store.path()))
    })?;
    let wp = result.measurement().and_then(Result::ok).and_then(|m| m.window_profile).ok_or_else(|| {
        ProfilesError::NotFound(format!(
            "trial {trial} of {study:?} has no first-window profile (only pipelined trials of protocol 6 agents have one)"
        ))
    })?;
    let agent = store.agents()?.into_iter().find(|a| a.name == result.agent);
    let class = agent.map(|a| a.info.device_class()).ok_or_else(|| {
        ProfilesError::NotFound(format!("agent {} of trial {trial} is not in the store", result.agent))
    })?;
    let records: Vec<Record> = store
        .profile_records()?
        .into_iter()
        .filter(|r| r.class == class && !(r.study == study && r.trial == trial))
        .collect();
    let model = store.cluster_models()?.into_iter().find(|(c, ..)| *c == class).map(|(_, m, _)| m);
    let mut distances = Vec::new();
    if let (Some(m), Some(x)) = (&model, model.as_ref().and_then(|m| m.scaled(&wp.profile))) {
        for (c, centroid) in m.centroids.iter().enumerate() {
            let pairs: Vec<f64> = x.iter().zip(centroid).filter_map(|(a, b)| a.map(|a| (a - b) * (a - b))).collect();
            if !pairs.is_empty() {
                distances.push((c, (pairs.iter().sum::<f64>() / pairs.len() as f64).sqrt()));
            }
        }
    }
    distances.sort_by(|a, b| a.1.total_cmp(&b.1));
    let clusters: Vec<Option<usize>> =
        records.iter().map(|r| model.as_ref().and_then(|m| m.place(&r.profile)).map(|p| p.cluster)).collect();
    let parsed = store.stored(study)?.and_then(|s| s.study());
    let policy = parsed.as_ref().map(|s| s.reuse.clone()).unwrap_or_default();
    let identity = parsed.as_ref().map(|s| s.workload()).unwrap_or_default();
    let group = reuse::group_key(&policy.group, &params);
    let decision: ReuseDecision = reuse::decide(
        &policy,
        model.as_ref(),
        &records,
        &clusters,
        &reuse::ProfiledJob { profile: &wp.profile, group: &group, identity: &identity },
        Select::Time,
    );
    Ok(Classified { study: study.to_string(), trial, class, distances, decision: decision.reason() })
}
