//! Clusters of workload profiles (k-means, linfa-clustering): what a new job
//! is compared with to decide whether it is a job seen before.
//!
//! Pure: profiles in, a [`ClusterModel`] out; the store keeps models and the engine
//! decides with them ([`crate::domain::reuse`]).
//!
//! * **Features.** [`WINDOW_FEATURES`]: what an agent knows at the end of
//!   a first window, less what describes the machine rather than the job
//!   (the scaling signature is known only after probing, so it describes a
//!   cluster but does not place a job in one). A feature enters the model when at least
//!   half of the profiles measured it; a missing value is
//!   never read as zero: for fitting it takes the feature's mean (0 after
//!   scaling), and distances use only what the job measured.
//! * **Scaling.** Each feature is centred and divided by its standard
//!   deviation over the profiles, so no feature's unit dominates, but by
//!   at least [`SCALE_FLOOR`]: the features are log10 rates and ratios, and
//!   a feature that only jitters (every job has the same resident set, give
//!   or take 5 %) must not be blown up into the largest difference there is.
//! * **Distance.** Root mean square over the features a profile has, in
//!   those standard deviations: independent of how many features were
//!   measured (a phone without counters and an x86 node with them compare
//!   on the same scale).
//! * **k.** Chosen by the silhouette (Rousseeuw 1987) of fits with k = 2 to
//!   [`FitOptions::max_k`] on a deterministic sample of at most
//!   [`FitOptions::sample`] profiles; when no k reaches
//!   [`FitOptions::min_silhouette`] (0.25: "no substantial structure" in
//!   Kaufman and Rousseeuw's scale) or no k separates every pair of
//!   centroids by [`FitOptions::min_separation`] (one scaled unit: noise
//!   alone also splits with a good silhouette) there is one cluster. The sample's
//!   centroids then seed one k-means run over every profile: k-means++ with
//!   [`FitOptions::runs`] restarts on the sample, one refinement on all, so a
//!   refit over 100,000 profiles stays well under a second (measured in
//!   BENCHMARKS.md) where linfa's default 10 full runs took 7 s.
//! * **Radius.** A cluster's radius is the 90th percentile of its members'
//!   distances to its centroid: [`crate::domain::reuse`] accepts a job within a
//!   multiple of it.

use serde::{Deserialize, Serialize};
use tunefleet_common::profile::{Profile, FEATURES, PROFILE_VERSION, WINDOW_FEATURES};

/// How models are fitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitOptions {
    /// The largest k tried.
    pub max_k: usize,
    /// Profiles k is chosen on (a deterministic stride sample of them all).
    pub sample: usize,
    /// k-means++ restarts per k on the sample.
    pub runs: usize,
    /// Below this best silhouette, one cluster.
    pub min_silhouette: f64,
    /// The least Euclidean distance (scaled units) between two centroids
    /// of an accepted k.
    pub min_separation: f64,
}

/// The least a feature is divided by when scaled (see the module doc).
pub const SCALE_FLOOR: f64 = 0.25;

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions { max_k: 8, sample: 1_000, runs: 3, min_silhouette: 0.25, min_separation: 1.0 }
    }
}

/// Profiles of one device class, clustered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterModel {
    /// The profile version it was fitted on; others are not compared.
    pub version: u16,
    /// Indices into [`FEATURES`] the model uses.
    pub features: Vec<usize>,
    /// Mean and standard deviation of each used feature.
    pub mean: Vec<f64>,
    pub scale: Vec<f64>,
    /// Centroids in scaled units, one row per cluster.
    pub centroids: Vec<Vec<f64>>,
    /// The 90th percentile of each cluster's members' distances to it.
    pub radius: Vec<f64>,
    pub sizes: Vec<usize>,
    /// The silhouette of the chosen k on the sample (`None` for one cluster).
    pub silhouette: Option<f64>,
}

/// Why no model could be fitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error("no profiles of version {PROFILE_VERSION}")]
    Empty,
    #[error("k-means failed: {0}")]
    KMeans(String),
}

/// A model and the cluster of each profile it was fitted on (in input
/// order; profiles of another version are `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub model: ClusterModel,
    pub clusters: Vec<Option<usize>>,
}

/// A profile's place in a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placement {
    pub cluster: usize,
    pub distance: f64,
    /// Features the distance was taken over.
    pub shared: usize,
}

fn rms(a: &[Option<f64>], b: &[f64]) -> Option<(f64, usize)> {
    let mut sum = 0.0;
    let mut n = 0;
    for (x, y) in a.iter().zip(b) {
        if let Some(x) = x {
            sum += (x - y) * (x - y);
            n += 1;
        }
    }
    (n > 0).then(|| ((sum / n as f64).sqrt(), n))
}

fn dense_rms(a: &[f64], b: &[f64]) -> f64 {
    let sum: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    (sum / a.len().max(1) as f64).sqrt()
}

impl ClusterModel {
    /// `profile` in the model's scaled units, feature by feature (`None`
    /// where it measured nothing); `None` for another profile version.
    pub fn scaled(&self, profile: &Profile) -> Option<Vec<Option<f64>>> {
        if profile.version != self.version {
            return None;
        }
        Some(
            self.features
                .iter()
                .enumerate()
                .map(|(j, &f)| {
                    let v = profile.values.get(f).copied().flatten()?;
                    v.is_finite().then(|| (v - self.mean[j]) / self.scale[j])
                })
                .collect(),
        )
    }

    /// The nearest cluster to `profile` and its distance; `None` when the
    /// versions differ or it shares no feature with the model.
    pub fn place(&self, profile: &Profile) -> Option<Placement> {
        let x = self.scaled(profile)?;
        self.centroids
            .iter()
            .enumerate()
            .filter_map(|(c, centroid)| {
                rms(&x, centroid).map(|(d, shared)| Placement { cluster: c, distance: d, shared })
            })
            .min_by(|a, b| a.distance.total_cmp(&b.distance))
    }

    /// The distance between two profiles in the model's scaled units,
    /// over the features both measured; `None` when they share none.
    pub fn distance(&self, a: &Profile, b: &Profile) -> Option<f64> {
        let (x, y) = (self.scaled(a)?, self.scaled(b)?);
        let (mut sum, mut n) = (0.0, 0usize);
        for (u, v) in x.iter().zip(&y) {
            if let (Some(u), Some(v)) = (u, v) {
                sum += (u - v) * (u - v);
                n += 1;
            }
        }
        (n > 0).then(|| (sum / n as f64).sqrt())
    }

    pub fn k(&self) -> usize {
        self.centroids.len()
    }

    /// The names of the features used.
    pub fn feature_names(&self) -> Vec<&'static str> {
        self.features.iter().filter_map(|&f| FEATURES.get(f).copied()).collect()
    }
}

/// Every `n / want`-th index of `0..n` (all when `n <= want`): the same
/// sample for the same input.
fn stride_sample(n: usize, want: usize) -> Vec<usize> {
    if n <= want {
        return (0..n).collect();
    }
    (0..want).map(|i| i * n / want).collect()
}

/// The least Euclidean distance between two of `centroids`.
fn separation(centroids: &[Vec<f64>]) -> f64 {
    let mut least = f64::INFINITY;
    for (i, a) in centroids.iter().enumerate() {
        for b in &centroids[i + 1..] {
            least = least.min(a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt());
        }
    }
    least
}

/// The mean silhouette of `points` with `labels` (O(n^2): on the sample).
pub fn silhouette(points: &[Vec<f64>], labels: &[usize], k: usize) -> Option<f64> {
    if k < 2 || points.len() < 3 {
        return None;
    }
    let mut total = 0.0;
    for (i, p) in points.iter().enumerate() {
        let mut sum = vec![0.0; k];
        let mut count = vec![0usize; k];
        for (j, q) in points.iter().enumerate() {
            if i != j {
                let d: f64 = p.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum::<f64>().sqrt();
                sum[labels[j]] += d;
                count[labels[j]] += 1;
            }
        }
        let own = labels[i];
        if count[own] == 0 {
            continue; // a singleton's silhouette is 0
        }
        let a = sum[own] / count[own] as f64;
        let b = (0..k)
            .filter(|&c| c != own && count[c] > 0)
            .map(|c| sum[c] / count[c] as f64)
            .fold(f64::INFINITY, f64::min);
        if b.is_finite() {
            let s = (b - a) / a.max(b);
            if s.is_finite() {
                total += s;
            }
        }
    }
    Some(total / points.len() as f64)
}

fn kmeans(
    points: &[Vec<f64>],
    k: usize,
    init: Option<&[Vec<f64>]>,
    runs: usize,
) -> Result<(Vec<Vec<f64>>, Vec<usize>), FitError> {
    use linfa::traits::{Fit, Predict};
    use linfa_clustering::{KMeans, KMeansInit};
    let d = points.first().map_or(0, Vec::len);
    let flat: Vec<f64> = points.iter().flatten().copied().collect();
    let records =
        ndarray::Array2::from_shape_vec((points.len(), d), flat).map_err(|e| FitError::KMeans(e.to_string()))?;
    let data = linfa::DatasetBase::from(records);
    let params = match init {
        Some(c) => {
            let flat: Vec<f64> = c.iter().flatten().copied().collect();
            let init =
                ndarray::Array2::from_shape_vec((c.len(), d), flat).map_err(|e| FitError::KMeans(e.to_string()))?;
            KMeans::params(k).init_method(KMeansInit::Precomputed(init)).n_runs(1)
        }
        None => KMeans::params(k).init_method(KMeansInit::KMeansPlusPlus).n_runs(runs.max(1)),
    };
    let model = params.max_n_iterations(100).tolerance(1e-4).fit(&data).map_err(|e| FitError::KMeans(e.to_string()))?;
    let labels = model.predict(&data).to_vec();
    let centroids = model.centroids().rows().into_iter().map(|r| r.to_vec()).collect();
    Ok((centroids, labels))
}

/// Fits a model to `profiles` (those of the current profile version).
pub fn fit(profiles: &[Profile], opts: &FitOptions) -> Result<Fitted, FitError> {
    let current: Vec<(usize, &Profile)> =
        profiles.iter().enumerate().filter(|(_, p)| p.version == PROFILE_VERSION).collect();
    if current.is_empty() {
        return Err(FitError::Empty);
    }
    let value = |p: &Profile, f: usize| p.values.get(f).copied().flatten().filter(|v| v.is_finite());
    let (mut features, mut mean, mut scale) = (Vec::new(), Vec::new(), Vec::new());
    for f in WINDOW_FEATURES {
        let vs: Vec<f64> = current.iter().filter_map(|(_, p)| value(p, f)).collect();
        if vs.len() * 2 < current.len() || vs.is_empty() {
            continue;
        }
        let m = vs.iter().sum::<f64>() / vs.len() as f64;
        let sd = (vs.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / vs.len() as f64).sqrt();
        // A feature every known job shares still tells a new job apart.
        features.push(f);
        mean.push(m);
        scale.push(sd.max(SCALE_FLOOR));
    }
    let mut model = ClusterModel {
        version: PROFILE_VERSION,
        features,
        mean,
        scale,
        centroids: Vec::new(),
        radius: Vec::new(),
        sizes: Vec::new(),
        silhouette: None,
    };
    let points: Vec<Vec<f64>> = current
        .iter()
        .map(|(_, p)| model.scaled(p).unwrap_or_default().into_iter().map(|v| v.unwrap_or(0.0)).collect())
        .collect();
    let d = model.features.len();
    // Nothing varies (one job, or identical profiles): one cluster at the mean.
    let (centroids, labels) = if d == 0 {
        (vec![Vec::new()], vec![0; points.len()])
    } else {
        let sample_idx = stride_sample(points.len(), opts.sample);
        let sample: Vec<Vec<f64>> = sample_idx.iter().map(|&i| points[i].clone()).collect();
        let mut best: Option<(f64, Vec<Vec<f64>>, usize)> = None;
        for k in 2..=opts.max_k.min(sample.len().saturating_sub(1)) {
            let (centroids, labels) = kmeans(&sample, k, None, opts.runs)?;
            if separation(&centroids) < opts.min_separation {
                continue;
            }
            if let Some(s) = silhouette(&sample, &labels, k) {
                if best.as_ref().is_none_or(|b| s > b.0) {
                    best = Some((s, centroids, k));
                }
            }
        }
        match best.filter(|b| b.0 >= opts.min_silhouette) {
            Some((s, seeds, k)) => {
                model.silhouette = Some(s);
                kmeans(&points, k, Some(&seeds), 1)?
            }
            None => kmeans(&points, 1, None, 1)?,
        }
    };
    let k = centroids.len();
    let mut dists: Vec<Vec<f64>> = vec![Vec::new(); k];
    for (p, &c) in points.iter().zip(&labels) {
        dists[c].push(dense_rms(p, &centroids[c]));
    }
    model.sizes = dists.iter().map(Vec::len).collect();
    model.radius = dists
        .iter_mut()
        .map(|ds| {
            ds.sort_by(f64::total_cmp);
            if ds.is_empty() {
                0.0
            } else {
                ds[((ds.len() - 1) as f64 * 0.9).round() as usize]
            }
        })
        .collect();
    model.centroids = centroids;
    let mut clusters = vec![None; profiles.len()];
    for ((i, _), c) in current.iter().zip(labels) {
        clusters[*i] = Some(c);
    }
    Ok(Fitted { model, clusters })
}

/// The first two principal components of `points` (rows), by power
/// iteration on their covariance: for drawing clusters in a plane.
pub fn principal_plane(points: &[Vec<f64>]) -> Vec<[f64; 2]> {
    let n = points.len();
    let d = points.first().map_or(0, Vec::len);
    if n == 0 || d == 0 {
        return vec![[0.0, 0.0]; n];
    }
    let mean: Vec<f64> = (0..d).map(|j| points.iter().map(|p| p[j]).sum::<f64>() / n as f64).collect();
    let centred: Vec<Vec<f64>> = points.iter().map(|p| p.iter().zip(&mean).map(|(x, m)| x - m).collect()).collect();
    let mut cov = vec![vec![0.0; d]; d];
    for p in &centred {
        for i in 0..d {
            for j in 0..d {
                cov[i][j] += p[i] * p[j] / n as f64;
            }
        }
    }
    let mut components: Vec<Vec<f64>> = Vec::new();
    for c in 0..2.min(d) {
        // A fixed start that is not orthogonal to typical components.
        let mut v: Vec<f64> = (0..d).map(|j| 1.0 + (j + c) as f64 * 0.1).collect();
        for _ in 0..200 {
            let mut w: Vec<f64> = (0..d).map(|i| (0..d).map(|j| cov[i][j] * v[j]).sum()).collect();
            for u in &components {
                let dot: f64 = w.iter().zip(u).map(|(a, b)| a * b).sum();
                w.iter_mut().zip(u).for_each(|(a, b)| *a -= dot * b);
            }
            let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm < 1e-12 {
                break;
            }
            v = w.into_iter().map(|x| x / norm).collect();
        }
        components.push(v);
    }
    centred
        .iter()
        .map(|p| {
            let proj = |c: usize| components.get(c).map_or(0.0, |u| p.iter().zip(u).map(|(a, b)| a * b).sum());
            [proj(0), proj(1)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile of kind `kind` (0, 1, 2) with a little deterministic noise.
    fn profile(kind: usize, i: usize) -> Profile {
        let mut p = Profile::empty();
        let noise = ((i * 7919) % 100) as f64 / 1000.0;
        let (busy, io, threads) = [(1.9, 0.5, 1.0), (0.9, 0.2, 0.0), (0.2, 4.0, 0.0)][kind];
        p.set("cpus_busy", Some(busy + noise));
        p.set("log_io_kib_per_s", Some(io + noise));
        p.set("log2_threads", Some(threads));
        p.set("log_rss_mib", Some(1.0 + noise));
        p
    }

    #[test]
    fn three_kinds_make_three_clusters_and_each_lands_in_its_own() {
        let profiles: Vec<Profile> = (0..60).map(|i| profile(i % 3, i)).collect();
        let fitted = fit(&profiles, &FitOptions::default()).expect("fits");
        assert_eq!(fitted.model.k(), 3, "{:?}", fitted.model);
        assert!(fitted.model.silhouette.is_some_and(|s| s > 0.7));
        // Members of one kind share a cluster, kinds do not.
        let of_kind = |k: usize| fitted.clusters[k].expect("current version");
        for (i, c) in fitted.clusters.iter().enumerate() {
            assert_eq!(*c, Some(of_kind(i % 3)));
        }
        assert_ne!(of_kind(0), of_kind(1));
        assert_ne!(of_kind(1), of_kind(2));
        let p = fitted.model.place(&profile(2, 1000)).expect("placed");
        assert_eq!(p.cluster, of_kind(2));
        assert!(p.distance <= fitted.model.radius[p.cluster] * 2.0 + 0.1, "{p:?} {:?}", fitted.model.radius);
        assert_eq!(fitted.model.sizes.iter().sum::<usize>(), 60);
    }

    #[test]
    fn a_missing_feature_is_left_out_of_the_distance_not_read_as_zero() {
        let profiles: Vec<Profile> = (0..30).map(|i| profile(i % 3, i)).collect();
        let model = fit(&profiles, &FitOptions::default()).expect("fits").model;
        let mut io_only = Profile::empty();
        io_only.set("log_io_kib_per_s", Some(4.0));
        let p = model.place(&io_only).expect("shares one feature");
        assert_eq!(p.shared, 1);
        assert_eq!(Some(p.cluster), model.place(&profile(2, 5)).map(|q| q.cluster));
        // Nothing in common, or another version: no placement.
        assert_eq!(model.place(&Profile::empty()), None);
        let mut old = profile(0, 1);
        old.version = PROFILE_VERSION - 1;
        assert_eq!(model.place(&old), None);
    }

    #[test]
    fn one_kind_is_one_cluster_and_identical_profiles_fit() {
        let same: Vec<Profile> = (0..5).map(|_| profile(1, 0)).collect();
        let fitted = fit(&same, &FitOptions::default()).expect("fits");
        assert_eq!(fitted.model.k(), 1);
        assert_eq!(
            fitted.model.features.len(),
            3,
            "shared features still tell a new job apart (threads is no window feature)"
        );
        assert_eq!(fitted.model.radius, vec![0.0]);
        let same = fitted.model.place(&profile(1, 0)).expect("placed");
        assert_eq!(same.distance, 0.0);
        assert!(fitted.model.place(&profile(0, 0)).expect("placed").distance > 2.0, "another kind is far");
        let one = fit(&[profile(0, 3)], &FitOptions::default()).expect("one profile fits");
        assert_eq!(one.model.k(), 1);
        assert_eq!(fit(&[], &FitOptions::default()).map(|f| f.model), Err(FitError::Empty));
        let noisy: Vec<Profile> = (0..40).map(|i| profile(0, i)).collect();
        assert_eq!(fit(&noisy, &FitOptions::default()).expect("fits").model.k(), 1, "noise alone is no structure");
    }

    #[test]
    fn silhouette_of_separated_and_of_mixed_labels() {
        let pts: Vec<Vec<f64>> = vec![vec![0.0], vec![0.1], vec![10.0], vec![10.1]];
        let good = silhouette(&pts, &[0, 0, 1, 1], 2).expect("defined");
        let bad = silhouette(&pts, &[0, 1, 0, 1], 2).expect("defined");
        assert!(good > 0.9 && bad < 0.0, "{good} {bad}");
        assert_eq!(silhouette(&pts, &[0, 0, 0, 0], 1), None);
    }

    #[test]
    fn the_principal_plane_keeps_the_widest_spread_first() {
        let pts: Vec<Vec<f64>> = (0..20).map(|i| vec![i as f64, (i % 2) as f64 * 0.1, 0.0]).collect();
        let plane = principal_plane(&pts);
        let spread = |c: usize| {
            let m = plane.iter().map(|p| p[c]).sum::<f64>() / 20.0;
            plane.iter().map(|p| (p[c] - m).powi(2)).sum::<f64>()
        };
        assert!(spread(0) > 100.0 * spread(1), "{} {}", spread(0), spread(1));
        assert!((spread(0) - 665.0).abs() < 1.0, "all of x's variance: {}", spread(0));
    }
}
