//! Figures, from a store a real campaign wrote
//! (`scripts/bench-profiles.sh` runs it and then this):
//!
//! * `accuracy STORE [SVG]`: k-means over every profile of the store's
//!   largest device class, each cluster named after its most common
//!   workload; the confusion matrix and accuracy, the leave-one-out reuse
//!   decisions (each job against a model fitted without it), and the two
//!   principal components as an SVG coloured by workload.
//! * `refit STORE N`: N profiles made from the store's (each a real
//!   profile with its features jittered by 5 % of their spread), fitted
//!   the way the coordinator refits (k chosen on a sample, one run over all)
//!   and, side by side, with linfa's defaults (10 k-means++ runs over all,
//!   for the same k).
//! * `kinds STORE`: reuse on kinds it did not learn from. Leave one kind
//!   (study) out: a model fitted on the other kinds' jobs, and every job
//!   of the left-out kind decides against it with the profile alone
//!   (`across_workloads`: the identity rule would refuse it trivially): a
//!   reuse is a false reuse. Then recurring jobs of kinds seen: each job
//!   against a model fitted on all the others (its own kind's included),
//!   with the default rule (only its own workload decides) and with the
//!   profile alone: a reuse is what a recurring job should get.
//! * `compare STORE FRESH RECURRING`: tuning time and energy (everything a
//!   trial ran before its kept configuration) of a fresh pipelined study
//!   against the same job run again with reuse, and the kept configuration's
//!   time per epoch in each.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use tunefleet_common::profile::Profile;
use tunefleet_coordinator::domain::cluster::{self, FitOptions};
use tunefleet_coordinator::domain::reuse::{self, Record};
use tunefleet_coordinator::store::Store;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    match args.first().map(String::as_str) {
        Some("accuracy") if args.len() >= 2 => accuracy(&args[1], args.get(2).map(String::as_str)),
        Some("refit") if args.len() == 3 => refit(&args[1], args[2].parse()?),
        Some("compare") if args.len() == 4 => compare(&args[1], &args[2], &args[3]),
        Some("kinds") if args.len() == 2 => kinds(&args[1]),
        _ => {
            eprintln!(
                "usage: profiles accuracy STORE [SVG] | refit STORE N | kinds STORE | compare STORE FRESH RECURRING"
            );
            Ok(())
        }
    }
}

/// The records of the class with the most.
fn largest_class(store: &str) -> anyhow::Result<Vec<Record>> {
    let store = Store::open_read_only(std::path::Path::new(store))?;
    let mut by: BTreeMap<String, Vec<Record>> = BTreeMap::new();
    for r in store.profile_records()? {
        by.entry(r.class.clone()).or_default().push(r);
    }
    let (class, records) = by.into_iter().max_by_key(|(_, v)| v.len()).ok_or_else(|| anyhow::anyhow!("no profiles"))?;
    println!("device class {class}: {} profiles", records.len());
    Ok(records)
}

fn accuracy(store: &str, svg: Option<&str>) -> anyhow::Result<()> {
    let records = largest_class(store)?;
    let profiles: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
    let fitted = cluster::fit(&profiles, &FitOptions::default())?;
    let kinds: Vec<String> =
        records.iter().map(|r| r.workload.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let k = fitted.model.k();
    // Each cluster is named after the workload most of its members are.
    let mut counts = vec![vec![0usize; kinds.len()]; k];
    for (r, c) in records.iter().zip(&fitted.clusters) {
        if let (Some(c), Some(w)) = (c, kinds.iter().position(|w| *w == r.workload)) {
            counts[*c][w] += 1;
        }
    }
    let name: Vec<usize> =
        counts.iter().map(|row| row.iter().enumerate().max_by_key(|(_, n)| **n).map_or(0, |(i, _)| i)).collect();
    let mut confusion = vec![vec![0usize; kinds.len()]; kinds.len()];
    for (r, c) in records.iter().zip(&fitted.clusters) {
        if let (Some(c), Some(w)) = (c, kinds.iter().position(|w| *w == r.workload)) {
            confusion[w][name[*c]] += 1;
        }
    }
    let right: usize = (0..kinds.len()).map(|i| confusion[i][i]).sum();
    let total: usize = confusion.iter().flatten().sum();
    println!(
        "k = {k} (silhouette {}), features: {}",
        fitted.model.silhouette.map_or("-".into(), |s| format!("{s:.2}")),
        fitted.model.feature_names().join(", ")
    );
    println!("confusion matrix (rows: workload, columns: the workload its cluster is named after):");
    println!("| workload | {} |", kinds.join(" | "));
    println!("|---|{}", "---|".repeat(kinds.len()));
    for (i, w) in kinds.iter().enumerate() {
        let cells: Vec<String> = confusion[i].iter().map(|n| n.to_string()).collect();
        println!("| {w} | {} |", cells.join(" | "));
    }
    println!("accuracy: {right}/{total} = {:.1} %", 100.0 * right as f64 / total.max(1) as f64);

    // Leave one out: would the job reuse, and from a cluster of its own kind?
    // The profile distance alone decides here (what this bench measures), as
    // with `[reuse] across_workloads = true`.
    let policy = tunefleet_coordinator::domain::study::ReusePolicy {
        across_workloads: true,
        ..tunefleet_coordinator::domain::study::ReusePolicy::default()
    };
    let (mut reused_own, mut reused_other, mut probed) = (0, 0, 0);
    for i in 0..records.len() {
        let rest: Vec<Record> = records.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, r)| r.clone()).collect();
        let ps: Vec<Profile> = rest.iter().map(|r| r.profile.clone()).collect();
        let model = cluster::fit(&ps, &FitOptions::default())?.model;
        let placed: Vec<Option<usize>> = rest.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
        let d = reuse::decide(
            &policy,
            Some(&model),
            &rest,
            &placed,
            &reuse::ProfiledJob {
                profile: &records[i].profile,
                group: &records[i].group,
                identity: &records[i].identity,
            },
            tunefleet_common::message::Select::Time,
        );
        match d {
            reuse::ReuseDecision::Reuse { cluster, .. } => {
                let own = rest.iter().zip(&placed).filter(|(_, p)| **p == Some(cluster));
                let same = own.clone().filter(|(r, _)| r.workload == records[i].workload).count();
                if same * 2 > own.count() {
                    reused_own += 1;
                } else {
                    reused_other += 1;
                }
            }
            reuse::ReuseDecision::Probe { .. } => probed += 1,
        }
    }
    println!(
        "leave one out ({} jobs): {reused_own} reuse a configuration of their own kind, {reused_other} of another kind, {probed} probe",
        records.len()
    );
    if let Some(path) = svg {
        let points: Vec<Vec<f64>> = profiles
            .iter()
            .map(|p| fitted.model.scaled(p).unwrap_or_default().into_iter().map(|v| v.unwrap_or(0.0)).collect())
            .collect();
        let plane = cluster::principal_plane(&points);
        std::fs::write(path, plane_svg(&plane, &records, &kinds))?;
        println!("wrote {path}");
    }
    Ok(())
}

/// Would `job` reuse against a model fitted on `known`?
fn reuses(
    known: &[&Record],
    job: &Record,
    policy: &tunefleet_coordinator::domain::study::ReusePolicy,
) -> anyhow::Result<bool> {
    let rest: Vec<Record> = known.iter().map(|r| (*r).clone()).collect();
    let profiles: Vec<Profile> = rest.iter().map(|r| r.profile.clone()).collect();
    let model = cluster::fit(&profiles, &FitOptions::default())?.model;
    let placed: Vec<Option<usize>> = rest.iter().map(|r| model.place(&r.profile).map(|p| p.cluster)).collect();
    let d = reuse::decide(
        policy,
        Some(&model),
        &rest,
        &placed,
        &reuse::ProfiledJob { profile: &job.profile, group: &job.group, identity: &job.identity },
        tunefleet_common::message::Select::Time,
    );
    Ok(matches!(d, reuse::ReuseDecision::Reuse { .. }))
}

fn kinds(store: &str) -> anyhow::Result<()> {
    use tunefleet_coordinator::domain::study::ReusePolicy;
    let records = largest_class(store)?;
    let kinds: Vec<String> =
        records.iter().map(|r| r.study.clone()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let across = ReusePolicy { across_workloads: true, ..ReusePolicy::default() };
    let default = ReusePolicy::default();
    println!("| kind (study) | jobs | unseen: false reuses (default rule) | unseen: false reuses (profile alone) | recurring: reuses (default rule) | recurring: reuses (profile alone) |");
    println!("|---|---|---|---|---|---|");
    let (mut false_reuse, mut false_default, mut unseen, mut own, mut any, mut seen) = (0, 0, 0, 0, 0, 0);
    for kind in &kinds {
        let jobs: Vec<&Record> = records.iter().filter(|r| &r.study == kind).collect();
        let others: Vec<&Record> = records.iter().filter(|r| &r.study != kind).collect();
        let (mut f, mut fd, mut o, mut a) = (0, 0, 0, 0);
        for job in &jobs {
            f += usize::from(reuses(&others, job, &across)?);
            fd += usize::from(reuses(&others, job, &default)?);
            let all_but: Vec<&Record> =
                records.iter().filter(|r| !(r.study == job.study && r.trial == job.trial)).collect();
            o += usize::from(reuses(&all_but, job, &default)?);
            a += usize::from(reuses(&all_but, job, &across)?);
        }
        let n = jobs.len();
        println!("| {kind} | {n} | {fd} of {n} | {f} of {n} | {o} of {n} | {a} of {n} |");
        (false_reuse, false_default, unseen) = (false_reuse + f, false_default + fd, unseen + n);
        (own, any, seen) = (own + o, any + a, seen + n);
    }
    let pct = |a: usize, b: usize| 100.0 * a as f64 / b.max(1) as f64;
    println!(
        "false reuse (unseen kinds): {false_default} of {unseen} = {:.1} % (default rule), {false_reuse} of {unseen} = {:.1} % (profile alone); recurring reuse: {own} of {seen} = {:.1} % (default rule), {any} of {seen} = {:.1} % (profile alone)",
        pct(false_default, unseen),
        pct(false_reuse, unseen),
        pct(own, seen),
        pct(any, seen)
    );
    Ok(())
}

/// The profiles on their two principal components, coloured by workload.
fn plane_svg(plane: &[[f64; 2]], records: &[Record], kinds: &[String]) -> String {
    const W: f64 = 560.0;
    const H: f64 = 400.0;
    const PAD: f64 = 40.0;
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for p in plane {
        x0 = x0.min(p[0]);
        x1 = x1.max(p[0]);
        y0 = y0.min(p[1]);
        y1 = y1.max(p[1]);
    }
    let sx = |x: f64| PAD + (x - x0) / (x1 - x0).max(1e-9) * (W - 2.0 * PAD - 120.0);
    let sy = |y: f64| H - PAD - (y - y0) / (y1 - y0).max(1e-9) * (H - 2.0 * PAD);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="{W}" height="{H}" fill="white"/><text x="{PAD}" y="20">Workload profiles (first window), two principal components</text><text x="{}" y="{}">PC 1</text><text x="8" y="{}">PC 2</text>"#,
        W / 2.0 - 60.0,
        H - 10.0,
        H / 2.0
    );
    for (p, r) in plane.iter().zip(records) {
        let c = kinds.iter().position(|k| *k == r.workload).unwrap_or(0) % colours.len();
        let _ = write!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="4" fill="{}" fill-opacity="0.7"/>"#,
            sx(p[0]),
            sy(p[1]),
            colours[c]
        );
    }
    for (i, k) in kinds.iter().enumerate() {
        let y = PAD + 20.0 * i as f64;
        let _ = write!(
            s,
            r#"<circle cx="{}" cy="{y}" r="5" fill="{}"/><text x="{}" y="{}">{k}</text>"#,
            W - 130.0,
            colours[i % colours.len()],
            W - 120.0,
            y + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

fn refit(store: &str, n: usize) -> anyhow::Result<()> {
    let records = largest_class(store)?;
    let base: Vec<Profile> = records.iter().map(|r| r.profile.clone()).collect();
    // Spread of each feature, to jitter by 5 % of it.
    let width = base.first().map_or(0, |p| p.values.len());
    let spread: Vec<f64> = (0..width)
        .map(|f| {
            let vs: Vec<f64> = base.iter().filter_map(|p| p.values.get(f).copied().flatten()).collect();
            let m = vs.iter().sum::<f64>() / vs.len().max(1) as f64;
            (vs.iter().map(|v| (v - m).powi(2)).sum::<f64>() / vs.len().max(1) as f64).sqrt()
        })
        .collect();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut noise = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    };
    let profiles: Vec<Profile> = (0..n)
        .map(|i| {
            let mut p = base[i % base.len()].clone();
            for (f, v) in p.values.iter_mut().enumerate() {
                if let Some(v) = v {
                    *v += noise() * 0.1 * spread[f];
                }
            }
            p
        })
        .collect();
    let start = Instant::now();
    let fitted = cluster::fit(&profiles, &FitOptions::default())?;
    let ours = start.elapsed();
    println!(
        "refit over {n} profiles ({} features): {:.3} s, k = {}",
        fitted.model.features.len(),
        ours.as_secs_f64(),
        fitted.model.k()
    );
    // linfa's defaults for the same k, over every profile.
    use linfa::traits::Fit;
    let d = fitted.model.features.len();
    let flat: Vec<f64> = profiles
        .iter()
        .flat_map(|p| fitted.model.scaled(p).unwrap_or_default().into_iter().map(|v| v.unwrap_or(0.0)))
        .collect();
    let data = linfa::DatasetBase::from(ndarray::Array2::from_shape_vec((n, d), flat)?);
    let start = Instant::now();
    let _ = linfa_clustering::KMeans::params(fitted.model.k()).fit(&data)?;
    let default = start.elapsed();
    println!(
        "linfa's defaults (10 runs over all, k given): {:.3} s; ratio ours / defaults = {:.2}",
        default.as_secs_f64(),
        ours.as_secs_f64() / default.as_secs_f64()
    );
    Ok(())
}

/// `(tuning wall s, tuning J, kept config us per unit, trials)` of a study's segments.
fn tuning(store: &Store, study: &str) -> anyhow::Result<(f64, f64, f64, usize, f64)> {
    let results = store.results(study)?;
    let (mut wall, mut joules, mut kept, mut n, mut total) = (0.0, 0.0, 0.0, 0, 0.0);
    for r in &results {
        let Some(m) = r.result.as_ref().and_then(|o| o.measurement()).transpose()? else { continue };
        let segs = &m.segments;
        let Some(last) = segs.last() else { continue };
        for s in &segs[..segs.len() - 1] {
            wall += s.wall_us as f64 / 1e6;
            joules += s.energy_j.unwrap_or(0.0);
        }
        kept += last.us_per_unit();
        total += m.wall_us as f64 / 1e6;
        n += 1;
    }
    Ok((wall, joules, kept / n.max(1) as f64, n, total))
}

fn compare(store: &str, fresh: &str, recurring: &str) -> anyhow::Result<()> {
    let store = Store::open_read_only(std::path::Path::new(store))?;
    let (fw, fj, fk, fnn, ft) = tuning(&store, fresh)?;
    let (rw, rj, rk, rn, rt) = tuning(&store, recurring)?;
    println!(
        "| | trials | tuning time (s) | tuning energy (J) | kept configuration, ms per epoch | whole trials (s) |"
    );
    println!("|---|---|---|---|---|---|");
    println!("| fresh pipelined search | {fnn} | {fw:.2} | {fj:.1} | {:.1} | {ft:.2} |", fk / 1e3);
    println!("| recurring job (reuse) | {rn} | {rw:.2} | {rj:.1} | {:.1} | {rt:.2} |", rk / 1e3);
    println!(
        "ratios fresh / recurring: tuning time {:.2}x, tuning energy {:.2}x; kept configuration {:+.1} % time per epoch",
        fw / rw.max(1e-9),
        fj / rj.max(1e-9),
        (rk / fk - 1.0) * 100.0
    );
    Ok(())
}
