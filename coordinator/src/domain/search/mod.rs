//! The search: which configurations a study runs, chosen as the study goes,
//! and how a trial becomes the [`TrialSpec`] an agent executes.
//!
//! Five names, one role each:
//!
//! * [`Strategy`] (`domain::study::model`): what the study file chose
//!   (grid, random, tpe, gp, with its seed), and the one place that says
//!   whether it learns from results ([`Strategy::learns_from_results`]);
//! * `RawStrategyKind` (`domain::study::raw`): the `[strategy] kind` value
//!   as written, which the study check turns into a [`Strategy`];
//! * [`Search`]: one study's search as the engine sees it: its budget, its
//!   repeats and the trials created so far. The engine asks it for the next
//!   trials when agents have room for them ([`Search::next_trials`]) and
//!   tells it each result ([`Search::tell`]);
//! * [`Proposer`] (the `tunefleet-search` crate): what is behind a
//!   [`Search`], proposing one configuration at a time: [`Grid`] walks the
//!   cartesian product, [`Random`] samples with a seed, and a sampler
//!   proposes for the strategies that learn;
//! * a sampler (`tunefleet_search::Sampler`): a model of the objective
//!   built from the results it is told ([`tpe::Tpe`], [`gp::Gp`]), asked with the trials
//!   still running.
//!
//! Trials are numbered in the order they are created.
//!
//! Each configuration is run `repeats` times as consecutive trial ids; the
//! budget counts trials, repeats included, and only whole configurations are
//! created (`budget / repeats` of them).
//!
//! Grid and random are pure functions of the study (and its seed), so a
//! resumed study re-creates exactly the same trials: [`Search::resume`]
//! replays the configurations already in the store.

use tunefleet_common::params::Params;

use crate::domain::study::{Strategy, Study};

mod history;
mod probe;
mod spec;
mod stability;

pub use probe::{in_space, probe_configs, probe_plan, system_params};
pub use spec::{render, render_resumed};
pub use stability::spread;
use tunefleet_search::proposer::{sampled, Grid, Proposer, Random};
use tunefleet_search::{gp, tpe, AskDepth, Outcome};

/// One trial: a configuration and which repetition of it this is.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialPlan {
    pub trial: u64,
    pub params: Params,
    pub repeat: u32,
}

/// A study's search: its proposer, its budget and the trials created so far.
#[derive(Debug)]
pub struct Search {
    proposer: Box<dyn Proposer>,
    /// The study's strategy learns from results
    /// ([`Strategy::learns_from_results`]): its proposer is told of the
    /// trials running at each ask.
    learns: bool,
    repeats: u32,
    /// Configurations still to create.
    configs_left: u64,
    /// Trials created so far (the next trial id).
    created: u64,
    exhausted: bool,
    /// Trials in flight at each ask of a strategy that reads them.
    depth: AskDepth,
    /// `[[enqueue]]` configurations not created yet, first in line: each
    /// overlays the proposer's ask (what it leaves out is the proposer's).
    enqueued: std::collections::VecDeque<Params>,
    /// `kind = "external"`: only told configurations are created, and
    /// none told yet is a wait, not the end.
    external: bool,
}

/// The proposer of an external study: nothing of its own, each told
/// configuration overlays its empty ask.
#[derive(Debug)]
struct Told;

impl Proposer for Told {
    fn ask(&mut self, _running: &[(u64, &Params)]) -> Option<Params> {
        Some(Params::new())
    }
}

impl Search {
    /// The search of a study that has created no trial yet.
    pub fn new(study: &Study) -> Self {
        let space = study.searched();
        let (direction, objectives) = (study.objective.direction, 1 + study.objective.also.len());
        let proposer: Box<dyn Proposer> = match study.strategy {
            Strategy::Grid => Box::new(Grid::new(&space)),
            Strategy::Random { seed } => Box::new(Random::new(&space, seed)),
            Strategy::Tpe { seed } => {
                sampled(tpe::Tpe::new(space, direction, seed, tpe::TpeSettings::default()).with_objectives(objectives))
            }
            Strategy::Gp { seed } => {
                sampled(gp::Gp::new(space, direction, objectives, seed, gp::GpSettings::default()))
            }
            Strategy::External => Box::new(Told),
        };
        let repeats = study.repeats.max(1);
        let mut configs_left = study.budget / u64::from(repeats);
        if study.strategy == Strategy::Grid {
            configs_left = configs_left.min(grid_size(study));
        }
        Search {
            proposer,
            learns: study.strategy.learns_from_results(),
            repeats,
            configs_left,
            created: 0,
            exhausted: false,
            depth: AskDepth::default(),
            enqueued: study.enqueue.iter().cloned().collect(),
            external: study.strategy == Strategy::External,
        }
    }

    /// A configuration an outside sampler chose (`[strategy] kind =
    /// "external"`), created after those told before it.
    pub fn tell_configuration(&mut self, params: Params) {
        self.enqueued.push_back(params);
    }

    /// Whether its configurations come from outside (`kind = "external"`).
    pub fn external(&self) -> bool {
        self.external
    }

    /// `params` tried before anything else not created yet (`tunefleet
    /// enqueue` into a running study), overlaying the proposer's ask.
    pub fn enqueue_first(&mut self, params: Params) {
        self.enqueued.push_front(params);
    }

    /// Configurations still to create (the budget left, in configurations).
    pub fn configs_left(&self) -> u64 {
        self.configs_left
    }

    /// Replays the trials a study created before (in trial order, as read
    /// from the store), so the next trial continues where they ended.
    /// Values are told separately ([`Search::tell`]).
    pub fn resume(&mut self, existing: &[TrialPlan]) {
        for plan in existing {
            if plan.repeat == 0 {
                self.configs_left = self.configs_left.saturating_sub(1);
                if self.proposer.ask(&[]).is_none() {
                    self.exhausted = true;
                }
            }
            self.created = self.created.max(plan.trial.saturating_add(1));
        }
        // Enqueued configurations a trial already ran are not created again.
        let ran = |e: &Params| existing.iter().any(|p| e.iter().all(|(k, v)| p.params.get(k) == Some(v)));
        self.enqueued.retain(|e| !ran(e));
        if self.configs_left == 0 {
            self.exhausted = true;
        }
    }

    /// The trials of the next configuration (its repeats), numbered from
    /// [`Search::created`]; `None` once the budget is spent or the proposer
    /// has nothing more. As if no trial were running: see
    /// [`Search::next_trials_while`].
    pub fn next_trials(&mut self) -> Option<Vec<TrialPlan>> {
        self.next_trials_while(&[])
    }

    /// [`Search::next_trials`] while the trials in `running` (trial number,
    /// configuration: created and not finished) run: TPE's constant liar
    /// counts them as bad results, so parallel asks spread out.
    pub fn next_trials_while(&mut self, running: &[(u64, &Params)]) -> Option<Vec<TrialPlan>> {
        if self.exhausted || self.configs_left == 0 {
            self.exhausted = true;
            return None;
        }
        if self.external && self.enqueued.is_empty() {
            // Waits for the outside sampler.
            return None;
        }
        let Some(mut params) = self.proposer.ask(running) else {
            self.exhausted = true;
            return None;
        };
        if let Some(first) = self.enqueued.pop_front() {
            params.extend(first);
        }
        if self.learns {
            self.depth.record(running.len());
        }
        self.configs_left -= 1;
        let first = self.created;
        self.created += u64::from(self.repeats);
        Some(
            (0..self.repeats)
                .map(|repeat| TrialPlan { trial: first + u64::from(repeat), params: params.clone(), repeat })
                .collect(),
        )
    }

    /// Results the search has learnt from: complete and pruned trials told
    /// to a TPE search; 0 for grid and random, which do not learn.
    pub fn observations(&self) -> usize {
        self.proposer.observations()
    }

    /// The trials in flight at each ask of a strategy that reads them (gp,
    /// tpe): how much of the study it chose without the results.
    pub fn ask_depth(&self) -> &AskDepth {
        &self.depth
    }

    /// Whether [`Search::next_trials_while`] reads the running trials
    /// (TPE's constant liar): when the study's strategy learns from results
    /// ([`Strategy::learns_from_results`]); when not, the caller passes none.
    pub fn reads_running(&self) -> bool {
        self.learns
    }

    /// One more run of `params` (a configuration not yet stable), numbered
    /// after every trial created so far.
    pub fn extra_repeat(&mut self, params: &Params, repeat: u32) -> TrialPlan {
        let plan = TrialPlan { trial: self.created, params: params.clone(), repeat };
        self.created += 1;
        plan
    }

    /// Trial `trial` (run with `params`) finished with this objective
    /// value and these figures of the study's `[objective] also` (in that
    /// order, minimised; NaN where not validly measured); ignored when the
    /// value is not finite (a failed trial, as Optuna counts it).
    pub fn tell(&mut self, trial: u64, params: &Params, value: f64, also: &[f64]) {
        if value.is_finite() {
            self.proposer.tell_values(trial, params, value, also);
        }
    }

    /// [`Search::tell`] with how far the trial misses the study's
    /// constraints (`None`: it has none): `tpe` splits feasible trials
    /// from the others as Optuna's constrained TPE does.
    ///
    /// `margins`: each constraint's signed value (at most 0 where it
    /// holds, [`crate::domain::study::Study::constraint_margins`]), for `gp`'s
    /// model per constraint; `None` where only the total is known (a study
    /// resumed from the store).
    pub fn tell_constrained(
        &mut self,
        trial: u64,
        params: &Params,
        value: f64,
        also: &[f64],
        violation: Option<f64>,
        margins: Option<&[f64]>,
    ) {
        self.tell(trial, params, value, also);
        if let (Some(v), true) = (violation, value.is_finite()) {
            self.proposer.tell_violation(trial, v);
            if let Some(m) = margins {
                self.proposer.tell_margins(trial, m);
            }
        }
    }

    /// Trial `trial` (run with `params`) was stopped early after reporting
    /// `value` of the objective at `epoch`, its last report: the model learns
    /// where early stopping cut (a NaN is the worst value).
    pub fn tell_pruned(&mut self, trial: u64, params: &Params, epoch: u32, value: f64) {
        self.proposer.tell(trial, params, Outcome::Pruned { epoch, value });
    }

    /// True once no more trials will be created.
    pub fn exhausted(&self) -> bool {
        self.exhausted || self.configs_left == 0
    }

    /// Trials the study will have when its search is exhausted, as far as
    /// known now (for progress displays).
    pub fn planned(&self) -> u64 {
        self.created.saturating_add(self.configs_left.saturating_mul(u64::from(self.repeats)))
    }

    /// Trials created so far.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// Whether the study's choices depend on results (so the trials cannot
    /// be listed before the study runs): its strategy says
    /// ([`Strategy::learns_from_results`]).
    pub fn adaptive(study: &Study) -> bool {
        study.strategy.learns_from_results()
    }
}

/// Every trial a non-adaptive study creates, in order (what `check` lists;
/// the engine creates the same trials one configuration at a time).
pub fn plan(study: &Study) -> Vec<TrialPlan> {
    let mut search = Search::new(study);
    let mut out = Vec::new();
    while let Some(trials) = search.next_trials() {
        out.extend(trials);
    }
    out
}

/// Number of configurations of the full grid (saturating).
pub fn grid_size(study: &Study) -> u64 {
    study.searched().iter().fold(1u64, |acc, (_, spec)| acc.saturating_mul(spec.grid_len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::study;
    use crate::domain::study::ParamSpec;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use tunefleet_common::message::{SystemParams, TrialRef};
    use tunefleet_common::params::ParamValue;
    use tunefleet_common::template::TemplateError;
    use tunefleet_search::space::{grid_value, grid_values};
    use tunefleet_search::{sample, warm};

    fn study(space: &str, strategy: &str, budget: u64, repeats: u32) -> Study {
        let text = format!(
            r#"name = "s"
command = ["run", "--study={{study}}", "--trial={{trial}}", "--attempt={{attempt}}", "--repeat={{repeat}}", "{{a}}"]
env = {{ SEED = "{{trial}}-{{repeat}}" }}
timeout = 5
repeats = {repeats}
[objective]
metric = "loss"
direction = "minimize"
[budget]
trials = {budget}
[strategy]
{strategy}
{space}"#
        );
        study::parse(&text, "test.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    const SPACE: &str = r#"
[hyper.a]
kind = "categorical"
values = ["x", "y"]
[hyper.b]
kind = "int"
low = 1
high = 7
step = 3
[system.threads]
kind = "int"
low = 1
high = 2
"#;

    fn f(v: &ParamValue) -> f64 {
        v.as_f64().expect("numeric")
    }

    /// `[[enqueue]]` configurations come first, in order, each
    /// overlaying the strategy's ask; a resumed search skips those already
    /// run, and a study going on with more of them tries the new ones.
    #[test]
    fn enqueued_configurations_come_first_and_are_never_run_twice() {
        let enqueue = "[[enqueue]]\na = \"y\"\nb = 7\nthreads = 2\n\n[[enqueue]]\nb = 4\n";
        let s = study(&format!("{SPACE}\n{enqueue}"), "kind = \"random\"\nseed = 3", 10, 1);
        assert_eq!(s.enqueue.len(), 2);
        let mut search = Search::new(&s);
        let first = search.next_trials().expect("a trial").remove(0);
        let want: Params = [
            ("a".to_string(), ParamValue::Text("y".into())),
            ("b".to_string(), ParamValue::Int(7)),
            ("threads".to_string(), ParamValue::Int(2)),
        ]
        .into();
        assert_eq!(first.params, want, "the first enqueued, whole");
        let second = search.next_trials().expect("a trial").remove(0);
        assert_eq!(second.params["b"], ParamValue::Int(4), "the second, b as given");
        assert!(second.params.contains_key("a") && second.params.contains_key("threads"), "the rest the strategy's");
        // Resumed after the first: the second is next, the first not again.
        let mut resumed = Search::new(&s);
        resumed.resume(std::slice::from_ref(&first));
        assert_eq!(resumed.next_trials().expect("a trial")[0].params["b"], ParamValue::Int(4));
        // Both ran: the strategy alone from then on, and as the cold search would have.
        let mut resumed = Search::new(&s);
        resumed.resume(&[first, second]);
        let third = resumed.next_trials().expect("a trial").remove(0);
        assert_eq!(third.params, search.next_trials().expect("a trial").remove(0).params);
        // Outside the space, or a parameter it does not search: refused.
        for (bad, why) in [("b = 5", "outside its space"), ("c = 1", "not a parameter"), ("a = \"z\"", "outside")] {
            let text = format!("{SPACE}\n[[enqueue]]\n{bad}\n");
            let e = std::panic::catch_unwind(|| study(&text, "kind = \"random\"", 10, 1)).expect_err("refused");
            let message = e.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(message.contains(why), "{bad}: {message}");
        }
        let more = study(&format!("{SPACE}\n{enqueue}[[enqueue]]\nb = 1\n"), "kind = \"random\"\nseed = 3", 10, 1);
        assert!(crate::domain::study::diff::continues(&s, &more), "more enqueued: the study goes on");
    }

    #[test]
    fn a_warm_started_search_asks_near_the_best_it_was_told_where_a_cold_one_draws() {
        // `a` minimises (x - 0.3)^2 on [0, 1]: twelve earlier results, spread.
        let space = "[hyper.a]\nkind = \"float\"\nlow = 0.0\nhigh = 1.0\n";
        let s = study(space, "kind = \"gp\"\nseed = 7", 20, 1);
        let first = |search: &mut Search| f(&search.next_trials().expect("a trial")[0].params["a"]);
        let cold = first(&mut Search::new(&s));
        let mut warm = Search::new(&s);
        for i in 0..12u64 {
            let x = (i as f64 + 0.5) / 12.0;
            let params: Params = [("a".to_string(), ParamValue::Float(x))].into();
            warm.tell(warm::WARM_ID_BASE + i, &params, (x - 0.3).powi(2), &[]);
        }
        let warm = first(&mut warm);
        assert!((warm - 0.3).abs() < 0.08, "the warm search's first ask, {warm}, is near 0.3");
        assert!((cold - warm).abs() > 1e-9, "a cold one with the same seed draws another ({cold})");
    }

    #[test]
    fn a_configuration_is_in_a_studys_space_only_on_its_own_axes_and_values() {
        // SPACE searches threads in 1..=2 and no cores or memory.
        let s = study(SPACE, "kind = \"grid\"", 10, 1);
        let sys = |cores: Option<u32>, threads: Option<u32>| SystemParams { cores, threads, memory_mib: None };
        assert!(in_space(&s, &sys(None, Some(2))));
        assert!(!in_space(&s, &sys(None, Some(3))), "a value outside the axis");
        assert!(!in_space(&s, &sys(Some(1), Some(1))), "an axis the study does not search");
        assert!(!in_space(&s, &sys(None, None)), "the study's axis left unset");
    }

    #[test]
    fn only_a_strategy_that_reads_the_running_trials_asks_for_them() {
        // The engine lists a study's unfinished trials for each ask only when
        // the strategy reads them: for grid and random that scan made the
        // cost per trial grow with the study (quadratic over a study).
        assert!(!Search::new(&study(SPACE, "kind = \"grid\"", 10, 1)).reads_running());
        assert!(!Search::new(&study(SPACE, "kind = \"random\"\nseed = 1", 10, 1)).reads_running());
        assert!(Search::new(&study(SPACE, "kind = \"tpe\"\nseed = 1", 10, 1)).reads_running());
    }

    #[test]
    fn grid_is_the_cartesian_product_in_stable_order() {
        let s = study(SPACE, "kind = \"grid\"", 100, 1);
        assert_eq!(grid_size(&s), 2 * 3 * 2);
        let p = plan(&s);
        assert_eq!(p.len(), 12);
        let row =
            |t: &TrialPlan| (t.params["a"].to_string(), t.params["b"].to_string(), t.params["threads"].to_string());
        let rows: Vec<_> = p.iter().map(row).collect();
        let s3 = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(rows[0], s3("x", "1", "1"));
        assert_eq!(rows[1], s3("x", "1", "2"));
        assert_eq!(rows[2], s3("x", "4", "1"));
        assert_eq!(rows[5], s3("x", "7", "2"));
        assert_eq!(rows[6], s3("y", "1", "1"));
        assert_eq!(rows[11], s3("y", "7", "2"));
        assert!(p.iter().enumerate().all(|(i, t)| t.trial == i as u64 && t.repeat == 0));
        // Every configuration exactly once.
        let mut unique = rows.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 12);
    }

    #[test]
    fn grid_is_truncated_to_the_budget_and_repeats_count() {
        let s = study(SPACE, "kind = \"grid\"", 5, 1);
        assert_eq!(plan(&s).len(), 5);
        let s = study(SPACE, "kind = \"grid\"", 7, 3);
        let p = plan(&s);
        // Two whole configurations of three repeats each.
        assert_eq!(p.len(), 6);
        assert_eq!(p.iter().map(|t| t.repeat).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(p.iter().map(|t| t.trial).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(p[0].params, p[2].params);
        assert_ne!(p[2].params, p[3].params);
    }

    #[test]
    fn float_grids_are_linear_and_log_grids_geometric() {
        assert_eq!(
            grid_values(&ParamSpec::Float { low: 0.0, high: 1.0, grid: 5 }).iter().map(f).collect::<Vec<_>>(),
            vec![0.0, 0.25, 0.5, 0.75, 1.0]
        );
        let log: Vec<f64> =
            grid_values(&ParamSpec::LogFloat { low: 0.001, high: 1.0, grid: 4 }).iter().map(f).collect();
        assert_eq!(log.len(), 4);
        assert_eq!((log[0], log[3]), (0.001, 1.0));
        assert!((log[1] - 0.01).abs() < 1e-12 && (log[2] - 0.1).abs() < 1e-12, "{log:?}");
        assert_eq!(
            grid_values(&ParamSpec::Int { low: -2, high: 3, step: 2 }),
            vec![ParamValue::Int(-2), ParamValue::Int(0), ParamValue::Int(2)]
        );
    }

    #[test]
    fn huge_int_ranges_are_not_materialised() {
        let spec = ParamSpec::Int { low: i64::MIN, high: i64::MAX, step: 1 };
        assert_eq!(spec.grid_len(), u64::MAX);
        assert_eq!(grid_value(&spec, 0), ParamValue::Int(i64::MIN));
        assert_eq!(grid_value(&spec, u64::MAX), ParamValue::Int(i64::MAX));
        let text = "[hyper.a]\nkind = \"int\"\nlow = -9223372036854775808\nhigh = 9223372036854775807\n";
        let p = plan(&study(&format!("{text}[hyper.b]\nkind = \"int\"\nlow = 0\nhigh = 1\n"), "kind = \"grid\"", 3, 1));
        let a: Vec<_> = p.iter().map(|t| (t.params["a"].clone(), t.params["b"].clone())).collect();
        let min = ParamValue::Int(i64::MIN);
        assert_eq!(
            a,
            vec![
                (min.clone(), ParamValue::Int(0)),
                (min, ParamValue::Int(1)),
                (ParamValue::Int(i64::MIN + 1), ParamValue::Int(0))
            ]
        );
    }

    #[test]
    fn random_is_deterministic_per_seed() {
        let space = "[hyper.a]\nkind = \"float\"\nlow = -1\nhigh = 1\n";
        let a = plan(&study(space, "kind = \"random\"\nseed = 7", 20, 1));
        let b = plan(&study(space, "kind = \"random\"\nseed = 7", 20, 1));
        let c = plan(&study(space, "kind = \"random\"\nseed = 8", 20, 1));
        assert_eq!(a.len(), 20);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn random_respects_ranges_lattices_and_log_scale() {
        let space = r#"
[hyper.a]
kind = "categorical"
values = ["x", "y", "z"]
[hyper.lr]
kind = "log_float"
low = 0.0001
high = 1.0
[hyper.m]
kind = "float"
low = 2.5
high = 3.5
[hyper.n]
kind = "int"
low = -5
high = 6
step = 4
"#;
        let p = plan(&study(space, "kind = \"random\"\nseed = 3", 2000, 1));
        assert_eq!(p.len(), 2000);
        let mut below_1e2 = 0;
        let mut seen_n = std::collections::BTreeSet::new();
        for t in &p {
            let lr = f(&t.params["lr"]);
            assert!((0.0001..=1.0).contains(&lr), "{lr}");
            if lr < 0.01 {
                below_1e2 += 1;
            }
            let m = f(&t.params["m"]);
            assert!((2.5..=3.5).contains(&m), "{m}");
            let ParamValue::Int(n) = t.params["n"] else { panic!("n is an int") };
            assert!([-5, -1, 3].contains(&n), "{n} off the lattice");
            seen_n.insert(n);
            assert!(["x", "y", "z"].contains(&t.params["a"].to_string().as_str()));
        }
        assert_eq!(seen_n.len(), 3);
        // Log-uniform on [1e-4, 1]: half of the mass lies below 1e-2 (uniform would give 1%).
        assert!((800..1200).contains(&below_1e2), "{below_1e2} of 2000 below 0.01");
    }

    #[test]
    fn random_repeats_share_a_configuration() {
        let p = plan(&study(SPACE, "kind = \"random\"\nseed = 1", 9, 3));
        assert_eq!(p.len(), 9);
        for chunk in p.chunks(3) {
            assert!(chunk.iter().all(|t| t.params == chunk[0].params));
            assert_eq!(chunk.iter().map(|t| t.repeat).collect::<Vec<_>>(), vec![0, 1, 2]);
        }
    }

    #[test]
    fn render_substitutes_params_and_builtins() {
        let mem = "[hyper.a]\nkind = \"categorical\"\nvalues = [\"x\"]\n\
                   [system.cores]\nkind = \"int\"\nlow = 1\nhigh = 2\n\
                   [system.memory]\nkind = \"categorical\"\nvalues = [256]\n";
        let s = study(mem, "kind = \"grid\"", 4, 2);
        let p = plan(&s);
        let t = &p[3];
        let r = TrialRef { study: "s".into(), study_id: 7, trial: t.trial, attempt: 2 };
        let spec = render(&s, t, &r).expect("renders");
        assert_eq!(spec.argv, vec!["run", "--study=s", "--trial=3", "--attempt=2", "--repeat=1", "x"]);
        assert_eq!(spec.env, vec![("SEED".to_string(), "3-1".to_string())]);
        assert_eq!(spec.system, SystemParams { cores: Some(2), threads: None, memory_mib: Some(256) });
        assert_eq!(spec.timeout_ms, 5000);
    }

    proptest::proptest! {
        #[test]
        fn samples_stay_in_range_and_on_the_lattice(
            seed in proptest::prelude::any::<u64>(),
            low in -1_000_000i64..1_000_000,
            span in 1i64..1_000_000,
            step in 1i64..1000,
            flow in -1e6f64..1e6,
            fspan in 1e-9f64..1e6,
            lexp in -12i32..3,
            ldec in 1i32..12,
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let int = ParamSpec::Int { low, high: low + span, step };
            let float = ParamSpec::Float { low: flow, high: flow + fspan, grid: 3 };
            let (llow, lhigh) = (10f64.powi(lexp), 10f64.powi(lexp + ldec));
            let log = ParamSpec::LogFloat { low: llow, high: lhigh, grid: 3 };
            for _ in 0..16 {
                let ParamValue::Int(i) = sample(&int, &mut rng) else { panic!("int") };
                proptest::prop_assert!(i >= low && i <= low + span && (i - low) % step == 0, "{i}");
                let x = f(&sample(&float, &mut rng));
                proptest::prop_assert!(x >= flow && x <= flow + fspan, "{x}");
                let y = f(&sample(&log, &mut rng));
                proptest::prop_assert!(y >= llow && y <= lhigh, "{y}");
            }
            for v in grid_values(&int) {
                let ParamValue::Int(i) = v else { panic!("int") };
                proptest::prop_assert!(i >= low && i <= low + span && (i - low) % step == 0);
            }
        }
    }

    #[test]
    fn a_resumed_search_creates_the_trials_an_uninterrupted_one_would() {
        for strategy in ["kind = \"grid\"", "kind = \"random\"\nseed = 4"] {
            let s = study(SPACE, strategy, 11, 2);
            let all = plan(&s);
            assert_eq!(all.len(), 10, "{strategy}: five whole configurations of two");
            for cut in [0, 2, 4, 10] {
                let mut search = Search::new(&s);
                search.resume(&all[..cut]);
                let mut rest = Vec::new();
                while let Some(trials) = search.next_trials() {
                    rest.extend(trials);
                }
                assert_eq!(rest, all[cut..].to_vec(), "{strategy}, resumed after {cut} trials");
                assert!(search.exhausted());
            }
        }
    }

    #[test]
    fn trials_are_created_one_configuration_at_a_time() {
        let s = study(SPACE, "kind = \"grid\"", 100, 3);
        let mut search = Search::new(&s);
        assert_eq!(search.planned(), 36);
        let first = search.next_trials().expect("a configuration");
        assert_eq!(first.iter().map(|t| (t.trial, t.repeat)).collect::<Vec<_>>(), vec![(0, 0), (1, 1), (2, 2)]);
        assert_eq!(search.created(), 3);
        assert!(!search.exhausted());
        let mut n = 1;
        while search.next_trials().is_some() {
            n += 1;
        }
        assert_eq!(n, 12, "the whole grid, no more");
        assert!(search.exhausted());
    }

    const PIPELINED: &str = r#"
[hyper.a]
kind = "categorical"
values = ["x", "y"]
[system.cores]
kind = "int"
low = 1
high = 2
[system.threads]
kind = "categorical"
values = [1, 2]
[pipeline]
mode = "pipelined"
control = true
"#;

    #[test]
    fn pipelined_studies_search_hyper_parameters_and_probe_system_ones_inside_trials() {
        let s = study(PIPELINED, "kind = \"grid\"", 100, 1);
        let p = plan(&s);
        assert_eq!(p.len(), 2, "one trial per hyper-parameter configuration");
        assert!(p.iter().all(|t| !t.params.contains_key("cores")));
        let sys = |c, t| SystemParams { cores: Some(c), threads: Some(t), memory_mib: None };
        let probe = probe_plan(&s).expect("pipelined");
        assert_eq!(probe.configs, vec![sys(2, 2), sys(1, 2), sys(2, 1)], "default first, one factor at a time");
        assert_eq!((probe.window, probe.warmup, probe.control), (1, 1, true), "one unit of warm-up by default");
        let r = TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 1 };
        let spec = render(&s, &p[0], &r).expect("renders");
        assert_eq!(spec.system, sys(2, 2), "a trial starts under the default");
        assert_eq!(spec.probe, Some(probe));
        let grid = PIPELINED.replace("control = true", "control = true\nprobe = \"grid\"");
        let probe = probe_plan(&study(&grid, "kind = \"grid\"", 100, 1)).expect("pipelined");
        assert_eq!(probe.configs, vec![sys(2, 2), sys(1, 1), sys(1, 2), sys(2, 1)]);
        // What `check` counts to place early stopping's rungs is what is probed.
        for text in [PIPELINED.to_string(), grid.clone()] {
            let s = study(&text, "kind = \"grid\"", 100, 1);
            let pipelined = s.pipeline.clone().expect("pipelined");
            let probe = probe_plan(&s).expect("pipelined");
            assert_eq!(pipelined.configurations(&s.system), probe.configs.len() as u64);
        }
        let sequential = format!("{}mode = \"sequential\"\n", &PIPELINED[..PIPELINED.find("mode = ").unwrap_or(0)]);
        let s = study(&sequential, "kind = \"grid\"", 100, 1);
        assert_eq!(plan(&s).len(), 8, "sequential: every hyper x system combination is a trial");
        assert_eq!(probe_plan(&s), None);
    }

    /// "learns from results" was decided in three places; now the
    /// strategy says it, and what the search is built as agrees.
    #[test]
    fn whether_a_strategy_learns_is_one_fact_the_search_agrees_with() {
        let space =
            "[hyper.a]\nkind = \"categorical\"\nvalues = [\"only\"]\n[hyper.x]\nkind = \"float\"\nlow = 0\nhigh = 1\n";
        for (kind, learns) in [
            ("kind = \"grid\"", false),
            ("kind = \"random\"\nseed = 1", false),
            ("kind = \"tpe\"\nseed = 1", true),
            ("kind = \"gp\"\nseed = 1", true),
        ] {
            let s = study(space, kind, 10, 1);
            assert_eq!(s.strategy.learns_from_results(), learns, "{kind}");
            assert_eq!(Search::adaptive(&s), learns, "{kind}");
            assert_eq!(Search::new(&s).reads_running(), learns, "{kind}: told of running trials");
        }
    }

    #[test]
    fn tpe_learns_from_what_it_is_told_through_the_search() {
        // Minimise (x - 0.8)^2 over [0, 1]: after its random start-up TPE
        // samples near 0.8 more often than uniform sampling would.
        let space =
            "[hyper.a]\nkind = \"categorical\"\nvalues = [\"only\"]\n[hyper.x]\nkind = \"float\"\nlow = 0\nhigh = 1\n";
        let s = study(space, "kind = \"tpe\"\nseed = 3", 60, 1);
        assert!(Search::adaptive(&s));
        let mut search = Search::new(&s);
        let mut near = 0;
        let mut n = 0;
        while let Some(trials) = search.next_trials() {
            for t in trials {
                let x = f(&t.params["x"]);
                assert!((0.0..=1.0).contains(&x));
                if n >= 20 && (x - 0.8).abs() < 0.1 {
                    near += 1;
                }
                n += 1;
                search.tell(t.trial, &t.params, (x - 0.8) * (x - 0.8), &[]);
            }
        }
        assert_eq!(n, 60);
        // Uniform: 20 % of the 40 later draws (8) within 0.1 of 0.8.
        assert!(near >= 16, "{near} of 40 TPE draws near the optimum");
    }

    #[test]
    fn the_trials_in_flight_at_each_ask_are_counted_for_adaptive_searches_only() {
        let space =
            "[hyper.a]\nkind = \"categorical\"\nvalues = [\"only\"]\n[hyper.x]\nkind = \"float\"\nlow = 0\nhigh = 1\n";
        let mut search = Search::new(&study(space, "kind = \"tpe\"\nseed = 5", 10, 1));
        let mut running: Vec<TrialPlan> = Vec::new();
        for _ in 0..5 {
            let refs: Vec<(u64, &Params)> = running.iter().map(|t| (t.trial, &t.params)).collect();
            running.extend(search.next_trials_while(&refs).expect("budget left"));
        }
        let depth = search.ask_depth();
        assert_eq!((depth.asks(), depth.median(), depth.max()), (5, Some(2), Some(4)), "0 1 2 3 4 in flight");
        let mut random = Search::new(&study(space, "kind = \"random\"\nseed = 5", 10, 1));
        let _ = random.next_trials_while(&[]);
        assert_eq!(random.ask_depth().asks(), 0, "a search that reads no running trial");
    }

    #[test]
    fn parallel_tpe_asks_see_the_running_trials() {
        // Thirty trials told, then four asked at once, each while the ones
        // before it run: the liar makes them four distinct configurations,
        // and the same running set gives the same asks.
        let space = "[hyper.a]\nkind = \"categorical\"\nvalues = [\"only\"]\n\
                     [hyper.x]\nkind = \"float\"\nlow = 0\nhigh = 1\n[hyper.n]\nkind = \"int\"\nlow = 0\nhigh = 3\n";
        let s = study(space, "kind = \"tpe\"\nseed = 5", 40, 1);
        let asks = |liar: bool| {
            let mut search = Search::new(&s);
            for _ in 0..30 {
                let t = search.next_trials().expect("budget left").remove(0);
                let v = (f(&t.params["x"]) - 0.8).powi(2) + f(&t.params["n"]);
                search.tell(t.trial, &t.params, v, &[]);
            }
            let mut running: Vec<TrialPlan> = Vec::new();
            for _ in 0..4 {
                let refs: Vec<(u64, &Params)> = running.iter().map(|t| (t.trial, &t.params)).collect();
                running.extend(search.next_trials_while(if liar { &refs } else { &[] }).expect("budget left"));
            }
            running
        };
        let batch = asks(true);
        assert_eq!(batch.iter().map(|t| t.trial).collect::<Vec<_>>(), vec![30, 31, 32, 33]);
        for (i, a) in batch.iter().enumerate() {
            for b in &batch[i + 1..] {
                assert_ne!(a.params, b.params);
            }
        }
        assert_eq!(asks(true), batch);
        // The running trials reach the model: the first ask (none running)
        // is the same either way, the later ones are not.
        let plain = asks(false);
        assert_eq!(plain[0], batch[0]);
        assert_ne!(plain[1..], batch[1..]);
    }

    #[test]
    fn early_stopping_on_a_measured_objective_is_refused() {
        let text = |metric: &str| {
            format!(
                "name = \"s\"\ncommand = [\"run\"]\n[objective]\nmetric = \"{metric}\"\ndirection = \"minimize\"\n\
                 [budget]\ntrials = 4\n[strategy]\nkind = \"random\"\n[hyper.a]\nkind = \"float\"\nlow = 0\nhigh = 1\n\
                 [early_stopping]\nkind = \"asha\"\n"
            )
        };
        assert!(study::parse(&text("loss"), "s.toml").is_ok());
        for metric in ["wall_time", "energy", "cpu_time"] {
            let e = study::parse(&text(metric), "s.toml").map(|_| ()).expect_err("refused");
            assert!(e.to_string().contains("ASHA has nothing to judge"), "{metric}: {e}");
        }
    }

    #[test]
    fn spread_is_the_coefficient_of_variation() {
        assert_eq!(spread(&[1.0]), None);
        assert_eq!(spread(&[2.0, 2.0, 2.0]), Some(0.0));
        let s = spread(&[9.0, 11.0]).expect("two values");
        assert!((s - 2f64.sqrt() / 10.0).abs() < 1e-12, "{s}");
        assert_eq!(spread(&[-1.0, 1.0]), Some(2f64.sqrt()), "mean 0: the standard deviation");
    }

    #[test]
    fn a_resumed_attempt_gets_the_resume_arguments_with_its_checkpoint() {
        let mut s = study(SPACE, "kind = \"grid\"", 1, 1);
        let p = plan(&s);
        let r = TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 2 };
        let ckpt = (3, "/ckpt/epoch-3".to_string());
        let plain = render_resumed(&s, None, &p[0], &r, Some(&ckpt)).expect("renders");
        assert_eq!(plain.argv, render(&s, &p[0], &r).expect("renders").argv, "no resume template: starts over");
        s.resume = vec!["--resume".into(), "{checkpoint}".into(), "--from={checkpoint_epoch}".into()];
        let resumed = render_resumed(&s, None, &p[0], &r, Some(&ckpt)).expect("renders");
        assert_eq!(resumed.argv[resumed.argv.len() - 3..], ["--resume", "/ckpt/epoch-3", "--from=3"]);
        assert_eq!(render_resumed(&s, None, &p[0], &r, None).expect("renders").argv.len(), resumed.argv.len() - 3);
    }

    #[test]
    fn render_reports_unknown_placeholders() {
        let mut s = study(SPACE, "kind = \"grid\"", 1, 1);
        s.command.push("{nope}".into());
        let p = plan(&s);
        let r = TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 1 };
        assert!(matches!(render(&s, &p[0], &r), Err(TemplateError::Unknown { name, .. }) if name == "nope"));
    }
}
