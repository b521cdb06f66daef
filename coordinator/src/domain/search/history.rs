//! A study's search going on from the trials the store kept: the search
//! holds its history in memory between asks (its models refit on it), and
//! reads it from the store's records once, when its study starts, instead
//! of being told each stored result by its caller. Reading the store at
//! every ask, as Optuna's samplers do, would read every trial of the study
//! per ask.

use super::{Search, TrialPlan};
use crate::domain::study::Study;
use crate::domain::trial::TrialRecord;

impl Search {
    /// Goes on from `records`, `study`'s trials as the store keeps them, by
    /// trial: the trials made so far ([`Search::resume`]), and each one that
    /// succeeded with a value, told with its figures and its total
    /// violation (the store keeps the total: the search models that). The
    /// results told stop at the first gap in the trials' numbers (a store
    /// whose numbers are not dense). Returns how many were told.
    pub fn restore(&mut self, study: &Study, records: &[TrialRecord]) -> usize {
        let plans: Vec<TrialPlan> = records.iter().map(|r| r.plan.clone()).collect();
        self.resume(&plans);
        let mut told = 0;
        for (i, r) in records.iter().enumerate() {
            if r.plan.trial != i as u64 {
                break;
            }
            if let Some(value) = r.objective() {
                let also = study.also_figures(r.counted_energy(), r.wall_us().unwrap_or(0));
                self.tell_constrained(r.plan.trial, &r.plan.params, value, &also, r.violation(), None);
                told += 1;
            }
        }
        told
    }

    /// Told the results of `records`, another study's trials that `study`
    /// warm-starts from (`[warm_start]`): those with a value whose
    /// parameters lie inside `study`'s space, numbered from `first`.
    /// Returns how many were told.
    pub fn warm(&mut self, study: &Study, records: &[TrialRecord], first: u64) -> u64 {
        use tunefleet_search::warm::in_space;
        let space = study.searched();
        let mut told = 0u64;
        for r in records {
            let (Some(value), Some(params)) = (r.objective(), in_space(&space, &r.plan.params)) else { continue };
            let also = study.also_figures(r.counted_energy(), r.wall_us().unwrap_or(0));
            self.tell(first + told, &params, value, &also);
            told += 1;
        }
        told
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::study;
    use crate::domain::trial::{Outcome, StoredEnergy, TrialState};
    use tunefleet_common::params::{ParamValue, Params};

    fn tpe_study() -> Study {
        let text = r#"name = "s"
command = ["run", "{x}"]
timeout = 5
[objective]
metric = "loss"
direction = "minimize"
[budget]
trials = 20
[strategy]
kind = "tpe"
seed = 1
[hyper.x]
kind = "float"
low = 0.0
high = 1.0
"#;
        study::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    /// Trial `trial` at `x`, with a result of `value` when `success`.
    fn record(trial: u64, x: f64, result: Option<(f64, bool)>) -> TrialRecord {
        let energy = StoredEnergy { joules: None, source: None, valid: false };
        TrialRecord {
            plan: TrialPlan { trial, params: Params::from([("x".to_string(), ParamValue::Float(x))]), repeat: 0 },
            state: match result {
                Some((_, true)) => TrialState::Done,
                Some((_, false)) => TrialState::Failed,
                None => TrialState::Pending,
            },
            attempts: u32::from(result.is_some()),
            failures: 0,
            reason: None,
            agent: result.map(|_| "a".to_string()),
            result: result
                .map(|(value, success)| Outcome { success, ..Outcome::for_test("a", Some(value), 1_000, energy) }),
        }
    }

    /// A restored search learns the successful results the store kept, no
    /// failed one's figure, nothing past a gap in the numbers, and goes on
    /// numbering after every trial made.
    #[test]
    fn a_search_goes_on_from_the_stored_records() {
        let study = tpe_study();
        let records = [
            record(0, 0.1, Some((1.0, true))),
            record(1, 0.2, Some((0.5, false))),
            record(2, 0.3, None),
            record(3, 0.4, Some((2.0, true))),
            record(5, 0.6, Some((3.0, true))),
        ];
        let mut search = Search::new(&study);
        assert_eq!(search.restore(&study, &records), 2, "trials 0 and 3; 1 failed, 2 has none, 5 is past a gap");
        assert_eq!(search.observations(), 2);
        assert_eq!(search.created(), 6, "the next trial is numbered after the last one made");

        let mut warmed = Search::new(&study);
        let other = [record(0, 0.5, Some((1.0, true))), record(1, 7.0, Some((0.1, true)))];
        assert_eq!(warmed.warm(&study, &other, 1_000), 1, "the result outside the space is not told");
        assert_eq!(warmed.observations(), 1);
    }
}
