//! What a [`super::Gp`] is built with ([`GpSettings`]) and which
//! arithmetic its asks take ([`Paths`]).

use super::batch::BatchRule;

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
