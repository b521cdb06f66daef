//! Candidates scored against one posterior, pruned exactly:
//! what [`super::Gp::maximise`] proposes with a score of the posterior mean
//! and variance alone (the expected improvement, the confidence bound),
//! bit for bit, without the posterior variance of most candidates.
//!
//! The variance at a point is the signal variance less the squares of its
//! solved kernel column, summed row by row: the sum over the first rows is
//! at most the whole sum (adding a square never lowers a floating-point
//! sum), so the variance left after any number of solved rows bounds the
//! exact one from above, and the score (increasing in the variance) of
//! that bound bounds the exact score. A point whose bound cannot beat the
//! best few scores found so far (what the refinement starts from) is never
//! solved further; the rows of the others are solved in stages (a quarter,
//! then all), best bound first. The means are exact for every point (one
//! kernel column each), the scores computed are the unpruned ones, and the
//! order of the kept ones is a stable sort's: the proposal is the same.

use super::cube::Cube;
use super::model::{log_ei_of, Model};
use super::refine::Refinement;
use super::settings::Paths;
use crate::linalg::{solve_lower_block, Block, COLUMNS_AT_ONCE};

/// Candidates scored in one batch (the kernel columns of a batch solved at once).
pub(super) const SCORED_AT_ONCE: usize = 256;

/// Model points below which the rows are solved in one stage.
const STAGED_FROM: usize = 32;

/// A score of a posterior's mean and variance, increasing in the variance.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rule {
    /// The log expected improvement over the incumbent.
    Ei { best: f64 },
    /// The lower confidence bound, negated: `width` deviations less the mean.
    Ucb { width: f64 },
}

impl Rule {
    /// The score at mean `mu` and variance `var`.
    pub(super) fn score(self, mu: f64, var: f64) -> f64 {
        match self {
            Rule::Ei { best } => log_ei_of(best, mu, var),
            Rule::Ucb { width } => width * var.sqrt() - mu,
        }
    }

    /// At least [`Rule::score`] at `mu` and any variance up to `var`. The
    /// confidence bound is increasing in the variance in floating point too
    /// (a square root, a product by a positive width and a difference, each
    /// rounded monotonically). The log expected improvement is increasing in
    /// exact arithmetic; as computed ([`super::log_expected_improvement`])
    /// it is within 3 / 37^2 (its asymptote past 37 deviations) and a few
    /// rounding errors of the exact value, so twice that margin, and some,
    /// makes a bound.
    pub(super) fn bound(self, mu: f64, var: f64) -> f64 {
        let s = self.score(mu, var);
        match self {
            Rule::Ei { .. } => s + EI_MARGIN + 1e-9 * s.abs(),
            Rule::Ucb { .. } => s,
        }
    }
}

/// What [`Rule::bound`] adds to the log expected improvement.
const EI_MARGIN: f64 = 0.01;

/// Points scored against a model: each one's kernel column over the model
/// points (solved in place as far as `done` rows), exact mean, and the
/// variance explained by the rows solved so far.
struct Points<'a> {
    model: &'a Model,
    n: usize,
    /// Point-major: point `j`'s column is `cols[j * n..(j + 1) * n]`.
    cols: Vec<f64>,
    mean: Vec<f64>,
    done: Vec<usize>,
    explained: Vec<f64>,
    /// Scratch block of the solves.
    block: Block,
}

impl<'a> Points<'a> {
    /// The kernel columns and posterior means of `us` (the means summed in
    /// the order of [`Model::predict_many`]: the same values).
    fn new(cube: &Cube, model: &'a Model, us: &[Vec<f64>]) -> Self {
        let n = model.x.len();
        let mut cols = SCRATCH.with(|pool| pool.borrow_mut().pop()).unwrap_or_default();
        cols.clear();
        let mut mean = Vec::with_capacity(us.len());
        let mut row = Vec::with_capacity(n);
        for u in us {
            cube.kernel_row(&model.columns, n, u, &model.theta, &mut row);
            let mut mu = 0.0;
            for (a, k) in model.alpha.iter().zip(&row) {
                mu += a * k;
            }
            mean.push(mu);
            cols.extend_from_slice(&row);
        }
        let m = us.len();
        Points {
            model,
            n,
            cols,
            mean,
            done: vec![0; m],
            explained: vec![0.0; m],
            block: vec![[0.0; COLUMNS_AT_ONCE]; n],
        }
    }

    /// An upper bound of point `j`'s posterior variance, exact once all its
    /// rows are solved (as [`Model::predict_many`] computes it).
    fn variance(&self, j: usize) -> f64 {
        (self.model.theta.signal - self.explained[j]).max(1e-12)
    }

    fn exact(&self, j: usize) -> bool {
        self.done[j] >= self.n
    }

    /// The rows of `which`'s columns solved up to row `to` (at most
    /// [`COLUMNS_AT_ONCE`] at a time, those solved as far alike), and their
    /// squares added to what each explains, in row order.
    fn advance(&mut self, which: &[usize], to: usize) {
        let n = self.n;
        let to = to.min(n);
        // (rows solved, point), grouped by the rows solved.
        let mut pending: Vec<(usize, usize)> =
            which.iter().map(|&j| (self.done[j], j)).filter(|&(from, _)| from < to).collect();
        pending.sort_unstable();
        for group in pending.chunk_by(|a, b| a.0 == b.0) {
            let from = group[0].0;
            for chunk in group.chunks(COLUMNS_AT_ONCE) {
                let chunk: Vec<usize> = chunk.iter().map(|&(_, j)| j).collect();
                for (i, row) in self.block.iter_mut().enumerate().take(to) {
                    *row = [0.0; COLUMNS_AT_ONCE];
                    for (lane, &j) in chunk.iter().enumerate() {
                        row[lane] = self.cols[j * n + i];
                    }
                }
                solve_lower_block(&self.model.chol, n, &mut self.block, from..to);
                for (lane, &j) in chunk.iter().enumerate() {
                    let mut e = self.explained[j];
                    for i in from..to {
                        let v = self.block[i][lane];
                        self.cols[j * n + i] = v;
                        e += v * v;
                    }
                    self.explained[j] = e;
                    self.done[j] = to;
                }
            }
        }
    }

    /// The rows solved before the last stage: a quarter, or all of few.
    fn first_stage(&self) -> usize {
        if self.n < STAGED_FROM {
            self.n
        } else {
            self.n / 4
        }
    }
}

thread_local! {
    /// The kernel columns' buffers of points scored before, kept for the next
    /// (megabytes at 1,000 told: taken fresh from the system, their pages
    /// cost a tenth of an ask).
    static SCRATCH: std::cell::RefCell<Vec<Vec<f64>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Buffers kept per thread.
const SCRATCH_KEPT: usize = 4;

impl Drop for Points<'_> {
    fn drop(&mut self) {
        let cols = std::mem::take(&mut self.cols);
        SCRATCH.with(|pool| {
            let mut pool = pool.borrow_mut();
            if pool.len() < SCRATCH_KEPT {
                pool.push(cols);
            }
        });
    }
}

impl Cube {
    /// The candidate of highest `score` (which scores a batch of points at
    /// once: one triangular solve for all), the best few refined, and the
    /// `incumbent` too (the told configuration of best posterior mean, where
    /// an expected improvement is measured from: BENCHMARKS.md measured it
    /// against the best few alone, BENCHMARKS.md).
    pub(super) fn maximise(
        &self,
        model: &Model,
        candidates: Vec<Vec<f64>>,
        incumbent: Option<&[f64]>,
        score: &impl Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Option<Vec<f64>> {
        let scores = candidates.chunks(SCORED_AT_ONCE).flat_map(score);
        let mut scored: Vec<(f64, Vec<f64>)> = scores.zip(candidates.iter().cloned()).collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0));
        let plan = Refinement::of(model.x.len());
        scored.truncate(plan.starts);
        if let Some(u) = incumbent {
            let own = score(&[u.to_vec()]);
            scored.push((own.first().copied().unwrap_or(f64::NEG_INFINITY), u.to_vec()));
        }
        self.refine(scored, plan, score)
    }

    /// One axis at a time from each start (a numeric axis tries a step
    /// either way, a categorical every other value), the step as `plan`
    /// says, until it is below [`refine::MIN_STEP`] or after its sweeps. The best
    /// point found.
    pub(super) fn refine(
        &self,
        mut starts: Vec<(f64, Vec<f64>)>,
        plan: Refinement,
        score: &impl Fn(&[Vec<f64>]) -> Vec<f64>,
    ) -> Option<Vec<f64>> {
        plan.run(&mut starts, self.axes.len(), |starts, alive, steps, d, moved| {
            for &c in alive {
                let tried = self.tries(&starts[c].1, d, steps[c]);
                let scores = score(&tried);
                for (v, s) in tried.into_iter().zip(scores) {
                    if s > starts[c].0 {
                        starts[c] = (s, v);
                        moved[c] = true;
                    }
                }
            }
        });
        starts.into_iter().max_by(|a, b| a.0.total_cmp(&b.0)).map(|(_, u)| u)
    }

    /// [`Cube::maximise`] with the score `rule` of `model`'s posterior: the
    /// same proposal, the variance of most candidates and refinement steps
    /// never computed (the module documentation says why it is the same).
    pub(super) fn maximise_posterior(
        &self,
        model: &Model,
        rule: Rule,
        candidates: Vec<Vec<f64>>,
        incumbent: &[f64],
    ) -> Option<Vec<f64>> {
        if self.settings.paths != Paths::Fast {
            return self.maximise(model, candidates, own_start(rule, incumbent), &|us| {
                model.predict_many(self, us).into_iter().map(|(mu, var)| rule.score(mu, var)).collect()
            });
        }
        let mut points = Points::new(self, model, &candidates);
        let plan = Refinement::of(model.x.len());
        let top = best_few(&mut points, rule, plan.starts);
        let mut starts: Vec<(f64, Vec<f64>)> = top.into_iter().map(|(s, j)| (s, candidates[j].clone())).collect();
        if let Some(u) = own_start(rule, incumbent) {
            let mut own = Points::new(self, model, &[u.to_vec()]);
            own.advance(&[0], own.n);
            starts.push((rule.score(own.mean[0], own.variance(0)), u.to_vec()));
        }
        let refined = self.refine_together(model, rule, starts, plan);
        refined.into_iter().max_by(|a, b| a.0.total_cmp(&b.0)).map(|(_, u)| u)
    }

    /// [`Cube::refine`] (a compass search) of every start, the starts side by side (each step of
    /// all of them scored together): each start's steps and result as
    /// refined alone. A step's variance is computed only where its bound
    /// beats the best score of its start so far (a step is taken only when
    /// its score is above it).
    fn refine_together(
        &self,
        model: &Model,
        rule: Rule,
        mut starts: Vec<(f64, Vec<f64>)>,
        plan: Refinement,
    ) -> Vec<(f64, Vec<f64>)> {
        plan.run(&mut starts, self.axes.len(), |starts, alive, steps, d, moved| {
            let tries: Vec<(usize, Vec<f64>)> = alive
                .iter()
                .flat_map(|&c| self.tries(&starts[c].1, d, steps[c]).into_iter().map(move |v| (c, v)))
                .collect();
            let flat: Vec<Vec<f64>> = tries.iter().map(|(_, v)| v.clone()).collect();
            let mut points = Points::new(self, model, &flat);
            let bound = |p: &Points, j: usize| rule.bound(p.mean[j], p.variance(j));
            // Not above its start's best: never taken (NaN bounds are solved).
            let hopeless = |p: &Points, j: usize| bound(p, j) <= starts[tries[j].0].0;
            let mut live: Vec<usize> = (0..flat.len()).filter(|&j| !hopeless(&points, j)).collect();
            let first = points.first_stage();
            points.advance(&live, first);
            live.retain(|&j| !hopeless(&points, j));
            points.advance(&live, points.n);
            for (j, (c, v)) in tries.into_iter().enumerate() {
                if !points.exact(j) {
                    continue;
                }
                let s = rule.score(points.mean[j], points.variance(j));
                if s > starts[c].0 {
                    starts[c] = (s, v);
                    moved[c] = true;
                }
            }
        });
        starts
    }
}

/// The incumbent as a start of the refinement under `rule`: for the expected
/// improvement, which is measured from it; a confidence bound's maximum is
/// elsewhere (the trials in flight: BENCHMARKS.md measured it neutral there).
pub(super) fn own_start(rule: Rule, incumbent: &[f64]) -> Option<&[f64]> {
    matches!(rule, Rule::Ei { .. }).then_some(incumbent)
}

/// The `k` best points by `rule` with their scores, in the order a stable
/// sort of all the scores, best first, puts them; only points whose bound
/// can still beat the `k`-th best score found so far are solved further.
fn best_few(points: &mut Points, rule: Rule, k: usize) -> Vec<(f64, usize)> {
    let m = points.mean.len();
    if k == 0 {
        return Vec::new();
    }
    let bound = |p: &Points, j: usize| rule.bound(p.mean[j], p.variance(j));
    let by_bound = |p: &Points, live: &mut Vec<usize>| {
        let b: Vec<f64> = (0..m).map(|j| bound(p, j)).collect();
        live.sort_by(|&a, &c| b[c].total_cmp(&b[a]).then(a.cmp(&c)));
    };
    let mut top: Vec<(f64, usize)> = Vec::with_capacity(k + 1);
    let mut live: Vec<usize> = (0..m).collect();
    by_bound(points, &mut live);
    // The best bounds first, solved in full: a threshold to prune against.
    let seed: Vec<usize> = live.iter().copied().take(COLUMNS_AT_ONCE.max(k)).collect();
    points.advance(&seed, points.n);
    keep(points, rule, &seed, &mut top, k);
    let beaten = |p: &Points, top: &[(f64, usize)], j: usize| top.len() == k && bound(p, j) < top[k - 1].0;
    live.retain(|&j| !points.exact(j) && !beaten(points, &top, j));
    let first = points.first_stage();
    points.advance(&live, first);
    live.retain(|&j| !beaten(points, &top, j));
    by_bound(points, &mut live);
    let mut at = 0;
    while at < live.len() {
        let mut chunk = Vec::with_capacity(COLUMNS_AT_ONCE);
        while at < live.len() && chunk.len() < COLUMNS_AT_ONCE {
            if !beaten(points, &top, live[at]) {
                chunk.push(live[at]);
            }
            at += 1;
        }
        points.advance(&chunk, points.n);
        keep(points, rule, &chunk, &mut top, k);
    }
    top
}

/// `which`'s exact scores merged into `top`, kept sorted by score (best
/// first, the lower index first among equal ones) and cut to `k`.
fn keep(points: &Points, rule: Rule, which: &[usize], top: &mut Vec<(f64, usize)>, k: usize) {
    for &j in which {
        let s = rule.score(points.mean[j], points.variance(j));
        let at = top.partition_point(|(t, i)| t.total_cmp(&s).reverse().then(i.cmp(&j)).is_lt());
        top.insert(at, (s, j));
        top.truncate(k);
    }
}
