//! Reuse of known-good system configurations for recurring jobs (PipeTune's
//! idea, switched on and checked).
//!
//! Pure: records and a [`ClusterModel`] in, a [`ReuseDecision`] or a [`Promise`] out; the
//! engine keeps the records ([`Book`]), stores them and sends the decision.
//!
//! A pipelined trial profiles its first probe window (after its warm-up)
//! and sends the profile. The
//! decision, in this order:
//! 1. the profile is malformed (another version, wrong length, not finite):
//!    probe;
//! 2. the device class has no model yet: probe;
//! 3. the nearest cluster is farther than its threshold,
//!    `max(radius_factor * radius, min_threshold)` (radius: the 90th
//!    percentile of its members' distances; see [`crate::domain::cluster`]): probe,
//!    and the job will join the model as a kind of its own;
//! 4. no job of that cluster with the same hyper-parameter group (the
//!    values of the study's `[reuse] group` parameters, PipeTune's batch
//!    size) has been probed: probe;
//! 5. the latest record of that group in that cluster, or within the
//!    threshold of the profile in any cluster (a refit may move records),
//!    is a reuse that ran slower than promised: probe again (re-probing);
//! 6. otherwise **reuse**: the configuration with the best mean over the
//!    cluster's probed jobs, by the study's selection rule.
//!
//! Times and energies are compared *relative to the first probe window*
//! (which every pipelined trial runs under the plan's first configuration,
//! after its warm-up, reused or not), so a job on a larger data set, with
//! slower epochs, compares with its cluster, and start-up (in the warm-up)
//! counts nowhere. Windows are compared by their median unit where they
//! measured one (an outlying epoch does not move them). A reused trial is
//! verified when its result comes: its reused configuration's time
//! relative to that window must be within a bound of the cluster's record,
//! or the next such job probes. The bound is the study's `verify_bound`
//! when it sets one, else derived from the noise its own windows measured:
//! three standard errors of the measured ratio (each window's median unit
//! has a relative standard error of about `1.86 x spread / sqrt(units)`,
//! `spread` the median absolute deviation of its units over their median),
//! at least [`MIN_VERIFY_BOUND`]; [`UNMEASURED_VERIFY_BOUND`] when a window
//! was too short to measure its noise.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tunefleet_common::measurement::{Segment, SegmentRole, WindowProfile};
use tunefleet_common::message::{Select, SystemParams};
use tunefleet_common::params::Params;
use tunefleet_common::profile::{Profile, FEATURES, PROFILE_VERSION};

use crate::domain::cluster::ClusterModel;
use crate::domain::study::ReusePolicy;

/// How one configuration ran in one trial, relative to the trial's first
/// probe window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigOutcome {
    pub system: SystemParams,
    /// Time per unit / the first probe window's.
    pub rel_time: f64,
    /// Energy per unit / the first probe window's, when both have energy.
    pub rel_energy: Option<f64>,
    /// Relative standard error of `rel_time`, from the spread of the units
    /// of its windows and of the first; `None` when a window was too short.
    #[serde(default)]
    pub noise: Option<f64>,
}

/// Smallest bound a reuse is verified with when it is derived from noise.
pub const MIN_VERIFY_BOUND: f64 = 0.05;
/// The bound when the windows were too short to measure their noise.
pub const UNMEASURED_VERIFY_BOUND: f64 = 0.5;
/// Standard errors of the ratio a reused configuration may run slower.
pub const VERIFY_ERRORS: f64 = 3.0;

/// Relative standard error of a window's typical unit time (its median's,
/// from the median absolute deviation of its units); `None` without one.
fn window_error(s: &Segment) -> Option<f64> {
    let spread = s.unit_spread.filter(|v| v.is_finite() && *v >= 0.0)?;
    // MAD to a deviation (1.4826), the median's standard error (1.2533 / sqrt n).
    Some(1.4826 * 1.2533 * spread / f64::from(s.units().max(1)).sqrt())
}

/// One job the model learned from: a probed trial, or a reused one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub study: String,
    pub trial: u64,
    /// Device class ([`AgentInfo::device_class`](tunefleet_common::message::AgentInfo::device_class)).
    pub class: String,
    /// The workload's program (its command's first word).
    pub workload: String,
    /// The workload's identity ([`crate::domain::study::Study::workload`]);
    /// empty in records stored before it was kept (they match none).
    #[serde(default)]
    pub identity: String,
    pub group: String,
    /// The first-window profile, with the scaling signature when probed.
    pub profile: Profile,
    pub outcomes: Vec<ConfigOutcome>,
    /// It ran a reused configuration instead of probing.
    pub reused: bool,
    /// A reuse that ran slower than its record by more than the bound.
    pub worse: Option<String>,
    pub at_ms: u64,
}

/// The job a decision is for: its first probe window's profile, its
/// `[reuse] group` key and its workload identity.
#[derive(Debug, Clone, Copy)]
pub struct ProfiledJob<'a> {
    pub profile: &'a Profile,
    pub group: &'a str,
    pub identity: &'a str,
}

/// What to do with a job whose first window was just profiled.
#[derive(Debug, Clone, PartialEq)]
pub enum ReuseDecision {
    Reuse {
        cluster: usize,
        distance: f64,
        threshold: f64,
        system: SystemParams,
        /// The cluster's mean time of `system` relative to the first window.
        expected: f64,
        /// Probed trials it was learned from.
        from: usize,
    },
    Probe {
        cluster: Option<usize>,
        distance: Option<f64>,
        threshold: Option<f64>,
        reason: String,
    },
}

impl ReuseDecision {
    /// One line for logs, the store and `tunefleet profiles`.
    pub fn reason(&self) -> String {
        match self {
            ReuseDecision::Reuse { cluster, distance, threshold, system, expected, from } => format!(
                "reused {} from cluster {cluster}: distance {distance:.3} <= threshold {threshold:.3}; {from} probed jobs measured it at {expected:.3} x their first probe window",
                system_text(system)
            ),
            ReuseDecision::Probe { reason, .. } => reason.clone(),
        }
    }
}

pub use crate::domain::params::system_text;

/// Why a profile from an agent is not used.
pub fn check(profile: &Profile) -> Result<(), String> {
    if profile.version != PROFILE_VERSION {
        return Err(format!("profile version {} (this coordinator uses {PROFILE_VERSION})", profile.version));
    }
    if profile.values.len() != FEATURES.len() {
        return Err(format!(
            "{} profile values (version {PROFILE_VERSION} has {})",
            profile.values.len(),
            FEATURES.len()
        ));
    }
    if profile.values.iter().flatten().any(|v| !v.is_finite()) {
        return Err("a profile value is not finite".into());
    }
    Ok(())
}

/// The group key of a trial: the values of the `group` parameters, as JSON.
pub fn group_key(group: &[String], params: &Params) -> String {
    let picked: Params = group.iter().filter_map(|g| params.get(g).map(|v| (g.clone(), v.clone()))).collect();
    crate::domain::params::params_json(&picked)
}

fn per_unit_energy(s: &Segment) -> Option<f64> {
    s.energy_j.map(|e| e / f64::from(s.units().max(1)))
}

/// The trial's configurations relative to its first probe window (the
/// first segment when none is a probe), averaged over its segments of each
/// configuration (probes, the kept rest, a reused rest); `None` without a
/// base window.
pub fn outcomes(segments: &[Segment]) -> Option<Vec<ConfigOutcome>> {
    let base = segments.iter().position(|s| s.role == SegmentRole::Probe).or((!segments.is_empty()).then_some(0))?;
    let first = &segments[base];
    let base_t = first.typical_us_per_unit();
    if base_t <= 0.0 || !base_t.is_finite() {
        return None;
    }
    let base_noise = window_error(first);
    let base_e = per_unit_energy(first).filter(|e| *e > 0.0);
    // Per configuration: relative times, energies, squared errors (None: unmeasured).
    type Acc = (SystemParams, Vec<f64>, Vec<f64>, Option<f64>);
    let mut by: Vec<Acc> = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        let counts = match s.role {
            SegmentRole::Probe | SegmentRole::Selected | SegmentRole::Reused => true,
            // The warm-up holds the start-up: never a measurement of its configuration.
            SegmentRole::Warmup | SegmentRole::Cut | SegmentRole::Reconfigured | SegmentRole::Initial => false,
        };
        if !counts && i != base {
            continue;
        }
        let t = s.typical_us_per_unit() / base_t;
        let e = match (per_unit_energy(s), base_e) {
            (Some(e), Some(b)) => Some(e / b),
            _ => None,
        };
        if !t.is_finite() {
            continue;
        }
        let error2 = if i == base {
            base_noise.map(|b| b * b)
        } else {
            window_error(s).zip(base_noise).map(|(w, b)| w * w + b * b)
        };
        match by.iter_mut().find(|(sys, ..)| *sys == s.system) {
            Some((_, ts, es, errors)) => {
                ts.push(t);
                es.extend(e);
                *errors = errors.zip(error2).map(|(a, b)| a + b);
            }
            None => by.push((s.system.clone(), vec![t], e.into_iter().collect(), error2)),
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    Some(
        by.into_iter()
            .map(|(system, ts, es, errors)| ConfigOutcome {
                system,
                rel_time: mean(&ts),
                rel_energy: (!es.is_empty() && es.len() == ts.len()).then(|| mean(&es)),
                // The error of a mean of k ratios: sqrt(sum of squares) / k.
                noise: errors.map(|e2| e2.sqrt() / ts.len() as f64),
            })
            .collect(),
    )
}

/// The score `select` ranks outcomes by (lower is better); energy rules
/// use time when an outcome has no energy.
fn score(select: Select, o: &ConfigOutcome) -> f64 {
    match (select, o.rel_energy) {
        (Select::Energy | Select::MaxSlowdown { .. }, Some(e)) => e,
        (Select::Edp, Some(e)) => e * o.rel_time,
        _ => o.rel_time,
    }
}

/// The first-window profile with the scaling signature of `outcomes` added
/// (how much faster the best configuration ran than the first, and its
/// energy relative to the first's).
pub fn with_signature(window: &WindowProfile, outcomes: &[ConfigOutcome], select: Select) -> Profile {
    let mut p = window.profile.clone();
    let best = outcomes.iter().min_by(|a, b| score(select, a).total_cmp(&score(select, b)));
    if let Some(b) = best.filter(|_| outcomes.len() > 1) {
        p.set("speedup_best", (b.rel_time > 0.0).then(|| 1.0 / b.rel_time));
        p.set("energy_ratio_best", b.rel_energy);
    }
    p
}

/// The best configuration of a cluster's group: the mean outcome of each
/// configuration over `members` (probed ones first; reused ones add their
/// measurement to a configuration probes found), best by `select`.
/// Returns it, its mean relative time and how many probed jobs it came from.
pub fn recommend<'a>(members: impl Iterator<Item = &'a Record>, select: Select) -> Option<(SystemParams, f64, usize)> {
    // Per configuration: its outcomes, and how many probed jobs measured it.
    let mut by: Vec<(SystemParams, Vec<ConfigOutcome>, usize)> = Vec::new();
    let members: Vec<&Record> = members.collect();
    for r in members.iter().filter(|r| !r.reused) {
        for o in &r.outcomes {
            match by.iter_mut().find(|(s, _, _)| *s == o.system) {
                Some((_, v, n)) => {
                    v.push(o.clone());
                    *n += 1;
                }
                None => by.push((o.system.clone(), vec![o.clone()], 1)),
            }
        }
    }
    for r in members.iter().filter(|r| r.reused) {
        for o in &r.outcomes {
            if let Some((_, v, _)) = by.iter_mut().find(|(s, _, _)| *s == o.system) {
                v.push(o.clone());
            }
        }
    }
    let mean = |v: &[ConfigOutcome]| {
        let t = v.iter().map(|o| o.rel_time).sum::<f64>() / v.len() as f64;
        let es: Vec<f64> = v.iter().filter_map(|o| o.rel_energy).collect();
        let e = (es.len() == v.len()).then(|| es.iter().sum::<f64>() / es.len() as f64);
        // The mean's own error is not carried: verification bounds the reused trial's windows.
        ConfigOutcome { system: v[0].system.clone(), rel_time: t, rel_energy: e, noise: None }
    };
    by.iter()
        .filter(|(_, v, _)| !v.is_empty())
        .map(|(_, v, probed)| (mean(v), *probed))
        .min_by(|a, b| score(select, &a.0).total_cmp(&score(select, &b.0)))
        .map(|(o, probed)| (o.system, o.rel_time, probed))
}

/// Probed jobs that must have measured a configuration before it is
/// reused: one measurement is one noisy window.
pub const MIN_PROBED_JOBS: usize = 2;

/// Decides for a new job's first-window `profile` in a class whose model
/// and records are given (`records[i]` placed in `clusters[i]`).
pub fn decide(
    policy: &ReusePolicy,
    model: Option<&ClusterModel>,
    records: &[Record],
    clusters: &[Option<usize>],
    job: &ProfiledJob<'_>,
    select: Select,
) -> ReuseDecision {
    let ProfiledJob { profile, group, identity } = *job;
    let probe =
        |cluster, distance, threshold, reason: String| ReuseDecision::Probe { cluster, distance, threshold, reason };
    if let Err(why) = check(profile) {
        return probe(None, None, None, format!("probed: malformed profile ({why})"));
    }
    let Some(model) = model else {
        return probe(None, None, None, "probed: no profiles of this device class yet".into());
    };
    let Some(place) = model.place(profile) else {
        return probe(None, None, None, "probed: the profile shares no feature with the model".into());
    };
    let c = place.cluster;
    let threshold = (policy.radius_factor * model.radius.get(c).copied().unwrap_or(0.0)).max(policy.min_threshold);
    if place.distance > threshold {
        return probe(
            Some(c),
            Some(place.distance),
            Some(threshold),
            format!(
                "probed: nearest cluster {c} is at {:.3} > threshold {threshold:.3} (a new kind of job)",
                place.distance
            ),
        );
    }
    let peer = |r: &Record| {
        r.group == group
            && !r.outcomes.is_empty()
            && (policy.across_workloads || (!identity.is_empty() && r.identity == identity))
    };
    let close = |r: &Record| model.distance(profile, &r.profile).is_some_and(|d| d <= threshold);
    let in_cluster = |(r, k): &(&Record, &Option<usize>)| **k == Some(c) && peer(r);
    let latest = records.iter().zip(clusters).filter(in_cluster).map(|(r, _)| r).max_by_key(|r| r.at_ms);
    // The latest record of its cluster, and the latest as close as the
    // threshold that a refit may have placed in another cluster: either a
    // broken promise means probe again (it is not forgotten because the
    // clusters moved, nor hidden by a newer record next door).
    let near = records.iter().filter(|r| peer(r) && close(r)).max_by_key(|r| r.at_ms);
    for last in latest.into_iter().chain(near) {
        if let Some(why) = &last.worse {
            return probe(
                Some(c),
                Some(place.distance),
                Some(threshold),
                format!("probed again: {}/{} {why}", last.study, last.trial),
            );
        }
    }
    // What decides: its cluster's records, and those as close as the
    // threshold that a refit placed in another cluster (noise in two
    // profiles of one job can split them, and reuse needs two together).
    let mut members: Vec<&Record> =
        records.iter().zip(clusters).filter(|(r, k)| peer(r) && (**k == Some(c) || close(r))).map(|(r, _)| r).collect();
    members.sort_by_key(|r| r.at_ms);
    match recommend(members.into_iter(), select) {
        Some((system, expected, from)) if from >= MIN_PROBED_JOBS => {
            ReuseDecision::Reuse { cluster: c, distance: place.distance, threshold, system, expected, from }
        }
        Some((system, _, from)) => probe(
            Some(c),
            Some(place.distance),
            Some(threshold),
            format!(
                "probed: in cluster {c}, {from} probed job(s) with these hyper-parameters ({group}) measured its best \
                 configuration {}; reuse needs {MIN_PROBED_JOBS}",
                system_text(&system)
            ),
        ),
        None if policy.across_workloads => probe(
            Some(c),
            Some(place.distance),
            Some(threshold),
            format!("probed: cluster {c} has no probed job with these hyper-parameters ({group})"),
        ),
        None => probe(
            Some(c),
            Some(place.distance),
            Some(threshold),
            format!(
                "probed: cluster {c} has no probed job of this workload ({identity}) with these hyper-parameters \
                 ({group}); [reuse] across_workloads = true lets close profiles of other workloads decide"
            ),
        ),
    }
}

/// Whether a reused configuration did what its cluster promised.
#[derive(Debug, Clone, PartialEq)]
pub enum Promise {
    Kept {
        measured: f64,
        expected: f64,
    },
    Worse {
        measured: f64,
        expected: f64,
        why: String,
    },
    /// Nothing to compare (no reused segment, no first window).
    Unverified,
}

/// Checks a reused trial's `outcomes` for `system` against `expected`:
/// slower by more than `bound` (the study's), or by default than the bound
/// the windows' own noise gives (see the module documentation), is worse.
pub fn verify(outcomes: &[ConfigOutcome], system: &SystemParams, expected: f64, bound: Option<f64>) -> Promise {
    let Some(o) = outcomes.iter().find(|o| o.system == *system) else { return Promise::Unverified };
    let measured = o.rel_time;
    let (bound, from) = match (bound, o.noise) {
        (Some(b), _) => (b, "the study's".to_string()),
        (None, Some(noise)) => {
            let b = (VERIFY_ERRORS * noise).max(MIN_VERIFY_BOUND);
            (b, format!("{VERIFY_ERRORS} standard errors of its windows' noise,"))
        }
        (None, None) => (UNMEASURED_VERIFY_BOUND, "windows too short to measure noise:".to_string()),
    };
    if measured > expected * (1.0 + bound) {
        let why = format!(
            "ran the reused {} at {measured:.3} x its first probe window, {:.0} % slower than the cluster's {expected:.3} (bound: {from} {:.0} %)",
            system_text(system),
            (measured / expected - 1.0) * 100.0,
            bound * 100.0
        );
        Promise::Worse { measured, expected, why }
    } else {
        Promise::Kept { measured, expected }
    }
}

/// Every device class's records and model, as the engine keeps them.
#[derive(Debug, Default)]
pub struct Book {
    pub classes: BTreeMap<String, Class>,
}

/// One device class: its records, the model fitted on them, and where
/// each record falls in it.
#[derive(Debug, Default)]
pub struct Class {
    pub records: Vec<Record>,
    pub model: Option<ClusterModel>,
    pub clusters: Vec<Option<usize>>,
    /// Records the model was fitted on.
    pub fitted_on: usize,
}

impl Class {
    /// Places every record in the current model.
    pub fn place_all(&mut self) {
        self.clusters = self
            .records
            .iter()
            .map(|r| self.model.as_ref().and_then(|m| m.place(&r.profile)).map(|p| p.cluster))
            .collect();
    }

    /// Whether the model should be refitted: every new record while there
    /// are fewer than 100 (a refit costs next to nothing then), then when
    /// they have grown by a tenth (choosing k is quadratic in the sample:
    /// refitting at every result would put it in every turn of the engine).
    pub fn stale(&self) -> bool {
        self.stale_at(self.records.len())
    }

    /// [`Class::stale`] once the class holds `n` records.
    pub fn stale_at(&self, n: usize) -> bool {
        n > self.fitted_on && (n < 100 || n * 10 >= self.fitted_on * 11)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::cluster::{fit, FitOptions};

    fn sys(threads: u32) -> SystemParams {
        SystemParams { threads: Some(threads), ..SystemParams::default() }
    }

    fn seg(role: SegmentRole, threads: u32, wall_us: u64, epochs: u32, joules: Option<f64>) -> Segment {
        Segment {
            role,
            system: sys(threads),
            cpus: Vec::new(),
            first_epoch: 1,
            last_epoch: epochs,
            steps: 0,
            start_us: 0,
            wall_us,
            energy_j: joules,
            cpu_us: None,
            unit_median_us: None,
            unit_spread: None,
            margin: None,
        }
    }

    fn profile(kind: usize, i: usize) -> Profile {
        let mut p = Profile::empty();
        let noise = ((i * 7919) % 50) as f64 / 1000.0;
        let (busy, io) = [(1.9, 0.5), (0.2, 4.0)][kind];
        p.set("cpus_busy", Some(busy + noise));
        p.set("log_io_kib_per_s", Some(io + noise));
        p
    }

    fn record(kind: usize, i: usize, outcomes: Vec<ConfigOutcome>, reused: bool, at_ms: u64) -> Record {
        Record {
            study: "s".into(),
            trial: i as u64,
            class: "x86_64, 2 cores, estimate".into(),
            workload: "w".into(),
            identity: "w".into(),
            group: "{}".into(),
            profile: profile(kind, i),
            outcomes,
            reused,
            worse: None,
            at_ms,
        }
    }

    /// [`decide`] for a job of workload "w" (the records' own), by time.
    fn decide_w(
        policy: &ReusePolicy,
        model: Option<&ClusterModel>,
        records: &[Record],
        clusters: &[Option<usize>],
        profile: &Profile,
        group: &str,
    ) -> ReuseDecision {
        decide(policy, model, records, clusters, &ProfiledJob { profile, group, identity: "w" }, Select::Time)
    }

    fn o(threads: u32, rel_time: f64) -> ConfigOutcome {
        ConfigOutcome { system: sys(threads), rel_time, rel_energy: None, noise: None }
    }

    #[test]
    fn outcomes_are_relative_to_the_first_probe_window_and_averaged_per_configuration() {
        // Warm-up (start-up) 1 s/epoch under 1 thread; probes 1 thread 0.9 s,
        // 2 threads 0.45 s; kept 2 threads 0.36 s.
        let segments = vec![
            seg(SegmentRole::Warmup, 1, 1_000_000, 1, Some(10.0)),
            seg(SegmentRole::Probe, 1, 900_000, 1, Some(9.0)),
            seg(SegmentRole::Probe, 2, 450_000, 1, Some(6.0)),
            seg(SegmentRole::Selected, 2, 1_080_000, 3, Some(13.5)),
        ];
        let out = outcomes(&segments).expect("a first window");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].system, sys(1));
        assert!((out[0].rel_time - 1.0).abs() < 1e-9, "the base: {:?}", out[0]);
        assert!((out[1].rel_time - 0.45).abs() < 1e-9, "mean of 0.5 and 0.4: {:?}", out[1]);
        assert!((out[1].rel_energy.unwrap_or(0.0) - 0.583_333_333).abs() < 1e-6, "mean of 6/9 and 4.5/9");
        let sig = with_signature(
            &WindowProfile { system: sys(1), epochs: 1, steps: 0, wall_us: 1, profile: Profile::empty() },
            &out,
            Select::Time,
        );
        assert!((sig.get("speedup_best").unwrap_or(0.0) - 1.0 / 0.45).abs() < 1e-9);
        assert!(outcomes(&[]).is_none());
    }

    #[test]
    fn start_up_in_the_warm_up_changes_no_outcome_and_a_median_ignores_an_outlier() {
        let windows = |startup_us: u64, reused_median: u64| {
            let mut reused = seg(SegmentRole::Reused, 2, 2_000_000, 4, None);
            reused.unit_median_us = Some(reused_median);
            vec![
                seg(SegmentRole::Warmup, 1, startup_us, 1, None),
                seg(SegmentRole::Probe, 1, 1_000_000, 1, None),
                reused,
            ]
        };
        let quick = outcomes(&windows(1_100_000, 500_000)).expect("outcomes");
        let slow_start = outcomes(&windows(9_000_000, 500_000)).expect("outcomes");
        assert_eq!(quick, slow_start, "a slower start-up is no slower configuration");
        // The reused window's 2 s over 4 epochs had one slow epoch: its median unit is 0.5 s.
        assert!((quick[1].rel_time - 0.5).abs() < 1e-9, "{quick:?}");
        assert_eq!(verify(&quick, &sys(2), 0.5, None), Promise::Kept { measured: 0.5, expected: 0.5 });
    }

    #[test]
    fn the_verify_bound_follows_the_noise_the_windows_measured() {
        let with_noise = |rel_time: f64, noise: Option<f64>| ConfigOutcome { noise, ..o(2, rel_time) };
        // Quiet windows (2 % error): 10 % slower than promised is worse.
        let v = verify(&[with_noise(0.55, Some(0.02))], &sys(2), 0.5, None);
        assert!(matches!(&v, Promise::Worse { why, .. } if why.contains("standard errors")), "{v:?}");
        // Noisy windows (10 %): 20 % slower is within three errors.
        assert!(matches!(verify(&[with_noise(0.6, Some(0.1))], &sys(2), 0.5, None), Promise::Kept { .. }));
        assert!(matches!(verify(&[with_noise(0.7, Some(0.1))], &sys(2), 0.5, None), Promise::Worse { .. }));
        // Never below 5 %; too short to measure: 50 %; the study's own bound wins.
        assert!(matches!(verify(&[with_noise(0.52, Some(0.0))], &sys(2), 0.5, None), Promise::Kept { .. }));
        assert!(matches!(verify(&[with_noise(0.7, None)], &sys(2), 0.5, None), Promise::Kept { .. }));
        assert!(matches!(verify(&[with_noise(0.55, Some(0.02))], &sys(2), 0.5, Some(0.15)), Promise::Kept { .. }));
        // Outcomes carry the error of their windows.
        let mut a = seg(SegmentRole::Probe, 1, 1_000_000, 4, None);
        (a.unit_median_us, a.unit_spread) = (Some(250_000), Some(0.1));
        let mut b = seg(SegmentRole::Reused, 2, 500_000, 4, None);
        (b.unit_median_us, b.unit_spread) = (Some(125_000), Some(0.1));
        let out = outcomes(&[a, b]).expect("outcomes");
        let one: f64 = 1.4826 * 1.2533 * 0.1 / 2.0;
        assert!((out[1].noise.unwrap_or(0.0) - (2.0 * one * one).sqrt()).abs() < 1e-9, "{out:?}");
    }

    #[test]
    fn a_recurring_job_reuses_and_a_new_kind_or_an_unprobed_group_probes() {
        let records: Vec<Record> =
            (0..6).map(|i| record(0, i, vec![o(1, 1.0), o(2, 0.5 + i as f64 * 0.01)], false, i as u64)).collect();
        let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let clusters: Vec<Option<usize>> = records.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
        let policy = ReusePolicy::default();
        let d = decide_w(&policy, Some(&model), &records, &clusters, &profile(0, 99), "{}");
        match &d {
            ReuseDecision::Reuse { system, expected, from, distance, threshold, .. } => {
                assert_eq!(*system, sys(2));
                assert!((expected - 0.525).abs() < 1e-9);
                assert_eq!(*from, 6);
                assert!(distance <= threshold);
            }
            other => panic!("expected a reuse: {other:?}"),
        }
        assert!(d.reason().contains("reused threads=2 from cluster"), "{}", d.reason());
        let other_kind = decide_w(&policy, Some(&model), &records, &clusters, &profile(1, 1), "{}");
        assert!(
            matches!(&other_kind, ReuseDecision::Probe { reason, .. } if reason.contains("new kind")),
            "{other_kind:?}"
        );
        let other_group = decide_w(&policy, Some(&model), &records, &clusters, &profile(0, 1), "{\"batch\":64}");
        assert!(matches!(&other_group, ReuseDecision::Probe { reason, .. } if reason.contains("no probed job")));
        let none = decide_w(&policy, None, &[], &[], &profile(0, 1), "{}");
        assert!(matches!(&none, ReuseDecision::Probe { reason, .. } if reason.contains("no profiles")));
        let mut bad = profile(0, 1);
        bad.values.pop();
        let refused = decide_w(&policy, Some(&model), &records, &clusters, &bad, "{}");
        assert!(matches!(&refused, ReuseDecision::Probe { reason, .. } if reason.contains("malformed")));
    }

    #[test]
    fn one_probed_job_is_not_enough_to_reuse_its_best_configuration() {
        // Six jobs of one kind; only one of them measured threads=2, the best.
        let records: Vec<Record> = (0..6)
            .map(|i| {
                let outcomes = if i == 0 { vec![o(1, 1.0), o(2, 0.5)] } else { vec![o(1, 1.0)] };
                record(0, i, outcomes, false, i as u64)
            })
            .collect();
        let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let clusters: Vec<Option<usize>> = records.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 99), "{}");
        assert!(
            matches!(&d, ReuseDecision::Probe { reason, .. } if reason.contains("1 probed job(s)") && reason.contains("reuse needs 2")),
            "{d:?}"
        );
        // A second job measures it: reused, and the reason counts the two that measured it (not all six).
        let mut records = records;
        records[1].outcomes.push(o(2, 0.6));
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 99), "{}");
        assert!(matches!(&d, ReuseDecision::Reuse { system, from: 2, .. } if *system == sys(2)), "{d:?}");
        assert!(d.reason().contains("2 probed jobs measured it"), "{}", d.reason());
    }

    #[test]
    fn a_reuse_that_ran_slower_is_probed_again_until_a_new_probe() {
        let mut records: Vec<Record> =
            (0..3).map(|i| record(0, i, vec![o(1, 1.0), o(2, 0.5)], false, i as u64)).collect();
        let verdict = verify(&[o(2, 0.8)], &sys(2), 0.5, Some(0.15));
        let Promise::Worse { why, .. } = verdict else { panic!("0.8 is 60 % slower than 0.5: {verdict:?}") };
        assert!(why.contains("60 % slower"), "{why}");
        assert_eq!(verify(&[o(2, 0.55)], &sys(2), 0.5, Some(0.15)), Promise::Kept { measured: 0.55, expected: 0.5 });
        assert_eq!(verify(&[o(1, 0.55)], &sys(2), 0.5, Some(0.15)), Promise::Unverified);
        let mut reused = record(0, 10, vec![o(2, 0.8)], true, 10);
        reused.worse = Some(why);
        records.push(reused);
        let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let clusters: Vec<Option<usize>> = records.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 5), "{}");
        assert!(matches!(&d, ReuseDecision::Probe { reason, .. } if reason.starts_with("probed again: s/10")), "{d:?}");
        // A new probe says threads=1 is now the better one: learned, reused.
        records.push(record(0, 11, vec![o(1, 1.0), o(2, 3.0)], false, 11));
        let clusters: Vec<Option<usize>> = records.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 5), "{}");
        assert!(matches!(&d, ReuseDecision::Reuse { system, .. } if *system == sys(1)), "{d:?}");
    }

    #[test]
    fn two_probed_jobs_that_a_refit_split_between_clusters_still_decide_together() {
        // Two probes of one kind of job, both at threads=2, that noise put
        // in two clusters; the next job is close to both: reused, from two.
        let records: Vec<Record> = (0..2).map(|i| record(0, i, vec![o(1, 1.0), o(2, 0.5)], false, i as u64)).collect();
        let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let own = model.place(&profile(0, 5)).expect("placed").cluster;
        let clusters = vec![Some(own), Some(own + 1)];
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 5), "{}");
        assert!(matches!(&d, ReuseDecision::Reuse { system, from: 2, .. } if *system == sys(2)), "{d:?}");
    }

    #[test]
    fn a_broken_promise_is_not_forgotten_when_a_refit_moves_it_to_another_cluster() {
        let mut records: Vec<Record> =
            (0..3).map(|i| record(0, i, vec![o(1, 1.0), o(2, 0.5)], false, i as u64)).collect();
        let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let mut reused = record(0, 10, vec![o(2, 0.8)], true, 10);
        reused.worse = Some("ran slower".into());
        records.push(reused);
        // The refit put the broken promise in a cluster of its own; the job is near it.
        let clusters = vec![Some(0), Some(0), Some(0), Some(1)];
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 5), "{}");
        assert!(matches!(&d, ReuseDecision::Probe { reason, .. } if reason.starts_with("probed again: s/10")), "{d:?}");
        // A newer record next door that kept its promise does not hide
        // this cluster's broken one.
        let mut next_door = record(0, 12, vec![o(1, 1.0), o(2, 0.5)], false, 12);
        next_door.profile = profile(0, 6);
        let (mut with, placed) = (records.clone(), vec![Some(0), Some(0), Some(0), Some(0), Some(1)]);
        with.push(next_door);
        let d = decide_w(&ReusePolicy::default(), Some(&model), &with, &placed, &profile(0, 5), "{}");
        assert!(matches!(&d, ReuseDecision::Probe { reason, .. } if reason.starts_with("probed again: s/10")), "{d:?}");
        // A broken promise of another kind of job, far from this one: not its concern.
        records[3].profile = profile(1, 10);
        let d = decide_w(&ReusePolicy::default(), Some(&model), &records, &clusters, &profile(0, 5), "{}");
        assert!(matches!(&d, ReuseDecision::Reuse { system, .. } if *system == sys(2)), "{d:?}");
    }

    #[test]
    fn only_jobs_of_the_same_workload_decide_unless_the_study_opts_in() {
        let records: Vec<Record> = (0..4).map(|i| record(0, i, vec![o(1, 1.0), o(2, 0.5)], false, i as u64)).collect();
        let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let clusters: Vec<Option<usize>> = records.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
        let other = "w --data big.csv";
        let d = decide(
            &ReusePolicy::default(),
            Some(&model),
            &records,
            &clusters,
            &ProfiledJob { profile: &profile(0, 9), group: "{}", identity: other },
            Select::Time,
        );
        assert!(
            matches!(&d, ReuseDecision::Probe { reason, .. } if reason.contains("no probed job of this workload")),
            "{d:?}"
        );
        let across = ReusePolicy { across_workloads: true, ..ReusePolicy::default() };
        let d = decide(
            &across,
            Some(&model),
            &records,
            &clusters,
            &ProfiledJob { profile: &profile(0, 9), group: "{}", identity: other },
            Select::Time,
        );
        assert!(matches!(&d, ReuseDecision::Reuse { system, .. } if *system == sys(2)), "{d:?}");
    }

    #[test]
    fn group_keys_pick_the_named_parameters() {
        use tunefleet_common::params::ParamValue;
        let params: Params =
            [("batch".to_string(), ParamValue::Int(64)), ("lr".to_string(), ParamValue::Float(0.1))].into();
        assert_eq!(group_key(&["batch".into()], &params), "{\"batch\":64}");
        assert_eq!(group_key(&[], &params), "{}");
    }

    #[test]
    fn refits_follow_the_records() {
        let mut c = Class::default();
        assert!(!c.stale());
        c.records.push(record(0, 0, vec![], false, 0));
        assert!(c.stale());
        c.fitted_on = 1;
        assert!(!c.stale());
        c.fitted_on = 2000;
        c.records = (0..2100).map(|i| record(0, i, vec![], false, 0)).collect();
        assert!(!c.stale(), "5 % more: not yet");
        c.records.extend((0..100).map(|i| record(0, i, vec![], false, 0)));
        assert!(c.stale(), "10 % more");
    }
}
