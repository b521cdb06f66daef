//! The one ranking rule every view uses (the run's summary, `status`,
//! `tunefleet best`, the report, the service): results are grouped by
//! configuration (the same hyper-parameters); configurations are ranked by
//! the mean objective of their runs, in the study's direction; a tie goes
//! to the configuration with more runs, then to the one whose first run
//! came first. Within a configuration its runs are listed best first (a tie
//! to the lower trial). A study that never repeats a configuration ranks
//! trials by their own value, which is the same rule with one run each.
//!
//! With `[[constraint]]`s, each run has a violation (0: feasible; see
//! [`crate::domain::study::constraint`]) and a configuration the mean of
//! its runs': feasible configurations (every run feasible) come first by
//! the rule above, the others after them by their violation, least first
//! (a tie by the rule above). Optuna ranks constrained trials so.
//!
//! [`Standings`] keeps the rule up to date one result at a time (the
//! engine); [`rank`] applies it to a whole list at once (the store's
//! readers). Both answer the same way for the same results.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::study::Direction;

/// Where a configuration stands: the mean of its runs and how many.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub mean: f64,
    pub runs: u32,
    /// The mean violation of its runs' constraints (0: feasible).
    pub violation: f64,
    /// The trial of its best run (a tie to the lower trial).
    pub best_trial: u64,
    /// Its first run (the lowest trial): the last tie-breaker.
    first_trial: u64,
}

/// Which of two configurations ranks first by the rule (`Less`: `a`).
fn compare(dir: Direction, a: &Standing, b: &Standing) -> Ordering {
    if a.violation != b.violation && (a.violation > 0.0 || b.violation > 0.0) {
        return a.violation.total_cmp(&b.violation);
    }
    if dir.better(a.mean, b.mean) {
        Ordering::Less
    } else if dir.better(b.mean, a.mean) {
        Ordering::Greater
    } else {
        b.runs.cmp(&a.runs).then(a.first_trial.cmp(&b.first_trial))
    }
}

/// Which of two runs of one configuration is listed first (`Less`: `a`).
fn compare_runs(dir: Direction, a: (u64, f64), b: (u64, f64)) -> Ordering {
    if dir.better(a.1, b.1) {
        Ordering::Less
    } else if dir.better(b.1, a.1) {
        Ordering::Greater
    } else {
        a.0.cmp(&b.0)
    }
}

#[derive(Debug, Clone, Copy)]
struct Tally {
    sum: f64,
    runs: u32,
    violation: f64,
    best: (u64, f64),
    first_trial: u64,
}

impl Tally {
    fn standing(&self) -> Standing {
        Standing {
            mean: self.sum / f64::from(self.runs.max(1)),
            runs: self.runs,
            violation: self.violation / f64::from(self.runs.max(1)),
            best_trial: self.best.0,
            first_trial: self.first_trial,
        }
    }
}

/// The rule kept up to date as results come, one at a time: the leading
/// configuration at any moment, in O(1) per result except when the leader
/// itself gets another run (then every configuration is looked at once).
#[derive(Debug, Clone)]
pub struct Standings {
    dir: Direction,
    tallies: HashMap<String, Tally>,
    leader: Option<String>,
}

impl Standings {
    pub fn new(dir: Direction) -> Self {
        Standings { dir, tallies: HashMap::new(), leader: None }
    }

    /// Counts the result `value` of `trial`, a run of configuration `config`
    /// (its hyper-parameters as canonical text), missing its constraints
    /// by `violation` (0: feasible). Non-finite values are not ranked.
    pub fn record(&mut self, config: &str, trial: u64, value: f64, violation: f64) {
        if !value.is_finite() {
            return;
        }
        let dir = self.dir;
        let tally = self.tallies.entry(config.to_string()).or_insert(Tally {
            sum: 0.0,
            runs: 0,
            violation: 0.0,
            best: (trial, value),
            first_trial: trial,
        });
        tally.sum += value;
        tally.runs += 1;
        tally.violation += violation.max(0.0);
        if compare_runs(dir, (trial, value), tally.best) == Ordering::Less {
            tally.best = (trial, value);
        }
        tally.first_trial = tally.first_trial.min(trial);
        let mine = tally.standing();
        match self.leader.as_deref() {
            // The leader changed: it may have fallen behind any other.
            Some(l) if l == config => self.leader = self.rescan(),
            Some(l) => {
                let ahead = self.tallies.get(l).map(Tally::standing);
                if ahead.is_none_or(|ahead| compare(dir, &mine, &ahead) == Ordering::Less) {
                    self.leader = Some(config.to_string());
                }
            }
            None => self.leader = Some(config.to_string()),
        }
    }

    fn rescan(&self) -> Option<String> {
        self.tallies.iter().min_by(|a, b| compare(self.dir, &a.1.standing(), &b.1.standing())).map(|(k, _)| k.clone())
    }

    /// The leading configuration and where it stands.
    pub fn leader(&self) -> Option<(&str, Standing)> {
        let key = self.leader.as_deref()?;
        self.tallies.get(key).map(|t| (key, t.standing()))
    }

    /// Where `config` stands (`None` before its first ranked run).
    pub fn of(&self, config: &str) -> Option<Standing> {
        self.tallies.get(config).map(Tally::standing)
    }
}

/// The results `(config, trial, value, violation)` in the rule's order:
/// the index of each in `results`, with where its configuration stands.
/// Non-finite values are left out.
pub fn rank(dir: Direction, results: &[(String, u64, f64, f64)]) -> Vec<(usize, Standing)> {
    let mut standings = Standings::new(dir);
    for (config, trial, value, violation) in results {
        standings.record(config, *trial, *value, *violation);
    }
    let mut order: Vec<(usize, Standing)> = results
        .iter()
        .enumerate()
        .filter_map(|(i, (config, ..))| standings.of(config).map(|s| (i, s)))
        .filter(|(i, _)| results[*i].2.is_finite())
        .collect();
    order.sort_by(|(i, a), (j, b)| {
        compare(dir, a, b)
            .then_with(|| compare_runs(dir, (results[*i].1, results[*i].2), (results[*j].1, results[*j].2)))
    });
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(config: &str, trial: u64, value: f64) -> (String, u64, f64, f64) {
        (config.to_string(), trial, value, 0.0)
    }

    #[test]
    fn a_lucky_single_run_does_not_beat_a_better_mean() {
        // Maximised: "a" ran once and scored 50; "b" ran four times, mean 40.
        // "a"'s configuration, run again, scored 10: its mean is 30.
        let results =
            vec![r("a", 0, 50.0), r("b", 1, 41.0), r("b", 2, 39.0), r("a", 3, 10.0), r("b", 4, 40.0), r("b", 5, 40.0)];
        let order = rank(Direction::Maximize, &results);
        let first = order[0];
        assert_eq!(results[first.0].0, "b", "the better mean leads");
        assert_eq!((first.1.mean, first.1.runs, first.1.best_trial), (40.0, 4, 1));
        assert_eq!(results[first.0].1, 1, "the configuration's best run is listed first");
        let trials: Vec<u64> = order.iter().map(|(i, _)| results[*i].1).collect();
        assert_eq!(trials, vec![1, 4, 5, 2, 0, 3]);
    }

    #[test]
    fn the_incremental_leader_is_the_batch_ranks_first() {
        // Values from a fixed generator, with configurations repeated at random.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for dir in [Direction::Minimize, Direction::Maximize] {
            let mut standings = Standings::new(dir);
            let mut results = Vec::new();
            for trial in 0..400 {
                let config = format!("c{}", next() % 40);
                let value = (next() % 1000) as f64 / 10.0;
                // Some configurations infeasible, by a violation of their own.
                let violation = if next() % 3 == 0 { (next() % 50) as f64 / 10.0 } else { 0.0 };
                standings.record(&config, trial, value, violation);
                results.push((config.clone(), trial, value, violation));
                let order = rank(dir, &results);
                let (key, s) = standings.leader().expect("a leader");
                assert_eq!(key, results[order[0].0].0, "trial {trial}");
                assert_eq!(s, order[0].1);
            }
        }
    }

    #[test]
    fn ties_go_to_more_runs_then_to_the_earlier_configuration() {
        let results = vec![r("a", 0, 5.0), r("b", 1, 4.0), r("b", 2, 6.0), r("c", 3, 5.0)];
        let order = rank(Direction::Minimize, &results);
        let configs: Vec<&str> = order.iter().map(|(i, _)| results[*i].0.as_str()).collect();
        assert_eq!(configs, vec!["b", "b", "a", "c"]);
    }

    #[test]
    fn non_finite_values_are_not_ranked() {
        let results = vec![r("a", 0, f64::NAN), r("b", 1, 3.0), r("a", 2, 1.0)];
        let order = rank(Direction::Minimize, &results);
        let trials: Vec<u64> = order.iter().map(|(i, _)| results[*i].1).collect();
        assert_eq!(trials, vec![2, 1]);
        assert_eq!(order[0].1.runs, 1);
    }

    #[test]
    fn feasible_configurations_rank_first_and_the_others_by_their_violation() {
        // Minimised: "a" is best by value but infeasible; "b" feasible; "c"
        // infeasible by less than "a"; "d" feasible in one run, not the other.
        let results = vec![
            ("a".to_string(), 0, 1.0, 2.0),
            ("b".to_string(), 1, 5.0, 0.0),
            ("c".to_string(), 2, 9.0, 0.5),
            ("d".to_string(), 3, 2.0, 0.0),
            ("d".to_string(), 4, 2.0, 3.0),
            ("e".to_string(), 5, 7.0, 0.0),
        ];
        let order = rank(Direction::Minimize, &results);
        let configs: Vec<&str> = order.iter().map(|(i, _)| results[*i].0.as_str()).collect();
        assert_eq!(configs, vec!["b", "e", "c", "d", "d", "a"]);
        assert_eq!(order[0].1.violation, 0.0);
        assert_eq!(order[2].1.violation, 0.5);
        assert_eq!(order[3].1.violation, 1.5, "a configuration's violation is its runs' mean");
    }
}
