//! What a [`super::Gp`] is built with ([`GpSettings`]) and which
//! arithmetic its asks take ([`Paths`]).

/// What stands for a running trial's unknown result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchRule {
    /// Kriging believer: its posterior mean (no uncertainty left there),
    /// then the expected improvement.
    Believer,
    /// Constant liar: the worst told value, then the expected improvement.
    LiarMax,
    /// Constant liar: the mean told value.
    LiarMean,
    /// Believer, scored by a lower confidence bound (mean less one
    /// deviation, [`UCB_WIDTH`]) instead of the expected improvement.
    /// The default ([`super::GpSettings`]).
    Ucb,
    /// The expected improvement averaged over a few joint draws of the
    /// running trials' results from the posterior (fantasies).
    Fantasy,
    /// Local penalisation: the expected improvement of the told trials'
    /// model times, for each running trial, the probability that a point
    /// lies outside the ball its posterior puts around the minimum
    /// (the model's Lipschitz constant estimated on the candidates).
    Penalise,
    /// Thompson sampling: the minimum of one joint draw of the posterior
    /// (running trials believed) over a few hundred candidates.
    Thompson,
    /// [`BatchRule::Ucb`]'s believer with a bound of two deviations with none in
    /// flight that widens with their number (`pending_width`): GP-UCB's
    /// squared width grows with the log of the evaluations made, and a
    /// running trial is one made without its feedback (GP-BUCB's
    /// hallucinated steps), so more of them ask for more exploration.
    /// Measured against [`BatchRule::Ucb`] (then two deviations wide) and not
    /// kept: worse on 4 of 10 functions at 4 in flight and 6 at 16, better
    /// on one at 4 (BENCHMARKS.md, "Not kept: a bound widened").
    UcbPending,
    /// [`BatchRule::Ucb`] inside a trust region: a box around the incumbent,
    /// its sides in proportion to the length scales, that doubles after
    /// three batches in a row improve on the best and halves after
    /// `max(4, d) / q` that do not (TuRBO's rule, q the trials in flight;
    /// the batches read from the told trials in id order, so an ask stays
    /// a function of what was told), back to its first size below 0.5^7.
    /// Measured against [`BatchRule::Ucb`] and not kept: 24 / 32 studies at 4
    /// in flight, 30 / 31 at 16 (BENCHMARKS.md, "gp's fifth round").
    Trust,
    /// Thompson sampling from a whole sample path: a draw of the prior
    /// from random Fourier features of the Matérn kernel, conditioned on
    /// the told trials and the running ones believed (pathwise, Wilson et
    /// al. 2020), minimised as the bound is (random and local candidates,
    /// then the compass refinement): not held to a few hundred points as
    /// [`BatchRule::Thompson`]'s joint draw is. Measured against
    /// [`BatchRule::Ucb`] and not kept: it explores more, 14 / 42 studies at 4
    /// in flight, 17 / 47 at 16 (BENCHMARKS.md, "gp's fifth round").
    Pathwise,
    /// The expected improvement of the batch: of the best of the running
    /// trials' results and the candidate's, over the incumbent, less what
    /// the running trials bring alone, averaged over joint draws of the
    /// running trials' results from the told trials' posterior (the
    /// q-batch expected improvement Optuna's `GPSampler` and BoTorch use
    /// for pending points, one candidate at a time). Each draw's inner
    /// expectation is exact: given the running trials' draw, the
    /// candidate's value is normal ([`QEI_DRAWS`] antithetic draws, the
    /// same for every candidate of an ask). Measured against [`BatchRule::Ucb`]
    /// and not kept: 29 / 59 studies better / worse at 4 in flight, 24 / 67
    /// at 16, at ten times the ask's cost (BENCHMARKS.md, "gp's
    /// sixth round").
    QEi,
}

impl BatchRule {
    /// Every rule, for benchmarks.
    pub const ALL: [BatchRule; 11] = [
        BatchRule::Believer,
        BatchRule::LiarMax,
        BatchRule::LiarMean,
        BatchRule::Ucb,
        BatchRule::Fantasy,
        BatchRule::Penalise,
        BatchRule::Thompson,
        BatchRule::UcbPending,
        BatchRule::Trust,
        BatchRule::Pathwise,
        BatchRule::QEi,
    ];

    /// Its name: `believer`, `liar_max`, `liar_mean`, `ucb`, `fantasy`,
    /// `penalise`, `thompson`, `ucb_pending`, `trust`, `pathwise`, `qei`.
    pub fn name(self) -> &'static str {
        match self {
            BatchRule::Believer => "believer",
            BatchRule::LiarMax => "liar_max",
            BatchRule::LiarMean => "liar_mean",
            BatchRule::Ucb => "ucb",
            BatchRule::Fantasy => "fantasy",
            BatchRule::Penalise => "penalise",
            BatchRule::Thompson => "thompson",
            BatchRule::UcbPending => "ucb_pending",
            BatchRule::Trust => "trust",
            BatchRule::Pathwise => "pathwise",
            BatchRule::QEi => "qei",
        }
    }

    /// The rule of that [`BatchRule::name`].
    pub fn from_name(name: &str) -> Option<BatchRule> {
        BatchRule::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// Settings of [`Gp`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpSettings {
    /// Trials told before the model is used; random until then. Default 10.
    pub startup: usize,
    /// Random candidates scored per ask (perturbations of the best told
    /// configurations come on top). Default 1024.
    pub candidates: usize,
    /// Likelihood evaluations when fitting the hyper-parameters. Default 200.
    pub fit_evals: usize,
    /// How an ask accounts for the trials still running ([`BatchRule`]). Default
    /// [`BatchRule::Ucb`].
    pub batch: BatchRule,
    /// Told trials up to which the hyper-parameters are fitted at every
    /// ask; past them, again each time a tenth more are told
    /// (`model::fit_point`). Default 30; `usize::MAX`: at every ask.
    pub refit_from: usize,
    /// Most told trials the model is conditioned on (beyond, the best half
    /// and an even spread of the rest of the first ones, chosen again each
    /// time a tenth of this count more are told, and the trials told
    /// since). Default 400.
    pub model_points: usize,
    /// Which arithmetic an ask takes ([`Paths`]). Default [`Paths::Fast`].
    pub paths: Paths,
}

/// Which arithmetic an ask of [`Gp`] takes. The fast paths propose what
/// the plain ones do, bit for bit; the plain ones are kept as the yardstick
/// the fast ones are checked against, never for speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Paths {
    /// Factors extended row by row from the last ask's, candidates' columns
    /// solved in blocks, and candidates whose bound cannot win left
    /// unscored.
    #[default]
    Fast,
    /// As [`Paths::Fast`], but every candidate's and refinement step's
    /// variance computed.
    Unpruned,
    /// Unpruned, and every factor computed in full, one row at a time,
    /// the candidates' columns solved all together.
    Plain,
}

impl Default for GpSettings {
    fn default() -> Self {
        GpSettings {
            startup: 10,
            candidates: 1024,
            fit_evals: 200,
            batch: BatchRule::Ucb,
            refit_from: 30,
            model_points: 400,
            paths: Paths::Fast,
        }
    }
}
