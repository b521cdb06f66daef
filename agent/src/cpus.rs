//! CPU placement: which CPUs a trial is pinned to. The choice is a pure
//! function of the CPUs the agent may use and those busy with other trials.
//!
//! An agent given `--cpus` pins itself ([`pin_self`]) before its runtime
//! starts: every thread and process it starts inherits the mask, so
//! [`allowed_cpus`] then returns that set, its trials are placed in it and
//! an unpinned trial runs on it.

use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

use crate::live::{self, LiveError};

/// The CPUs the agent may use: `given` (`--cpus`), warning when this
/// process is not confined to them, or every CPU it may use.
pub fn agent_cpus(given: Option<&Vec<u32>>) -> Vec<u32> {
    match given {
        Some(set) => {
            if !allowed_cpus().iter().all(|c| set.contains(c)) {
                tracing::warn!(cpus = %live::format_cpu_list(set), "this process is not confined to its CPUs: its unpinned trials may run outside them");
            }
            set.clone()
        }
        None => allowed_cpus(),
    }
}

/// The CPUs of a `--cpus` list that the agent may not use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} not among those this process may use ({})", cpus_are(.outside), live::format_cpu_list(.allowed))]
pub struct OutsideCpus {
    pub outside: Vec<u32>,
    pub allowed: Vec<u32>,
}

fn cpus_are(cpus: &[u32]) -> String {
    match cpus {
        [one] => format!("CPU {one} is"),
        _ => format!("CPUs {} are", live::format_cpu_list(cpus)),
    }
}

/// The set `requested` (ascending, each once) when every CPU in it is
/// `allowed`; else which are not.
pub fn confine(requested: &[u32], allowed: &[u32]) -> Result<Vec<u32>, OutsideCpus> {
    let mut set = requested.to_vec();
    set.sort_unstable();
    set.dedup();
    let outside: Vec<u32> = set.iter().copied().filter(|c| !allowed.contains(c)).collect();
    if outside.is_empty() {
        Ok(set)
    } else {
        Err(OutsideCpus { outside, allowed: allowed.to_vec() })
    }
}

/// Pins the calling thread to `cpus`. Called first thing in `main`, while
/// it is the process's only thread, it confines the whole agent: threads
/// and processes inherit the mask of the thread that creates them.
pub fn pin_self(cpus: &[u32]) -> Result<(), LiveError> {
    let set = live::cpu_set(cpus)?;
    sched_setaffinity(None, &set).map_err(|source| LiveError::Affinity {
        tid: rustix::thread::gettid().as_raw_nonzero().get(),
        cpus: live::format_cpu_list(cpus),
        source,
    })
}

/// CPUs this process may run on, ascending. Falls back to `0..n` from the
/// available parallelism when the affinity mask cannot be read.
pub fn allowed_cpus() -> Vec<u32> {
    match sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).filter_map(|c| u32::try_from(c).ok()).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the CPU affinity mask; assuming CPUs 0..n");
            let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            (0..n).filter_map(|c| u32::try_from(c).ok()).collect()
        }
    }
}

/// Chooses `n` CPUs out of `allowed` for a new trial. CPUs used by the
/// fewest running trials come first (so concurrent trials get distinct CPUs
/// while there are enough), ties go to the lowest CPU number. Returns fewer
/// than `n` CPUs only when fewer are allowed. `in_use` lists the CPUs of the
/// running trials, a CPU once per trial using it.
pub fn choose_cpus(allowed: &[u32], in_use: &[u32], n: usize) -> Vec<u32> {
    let mut ranked: Vec<(usize, u32)> =
        allowed.iter().map(|&cpu| (in_use.iter().filter(|&&u| u == cpu).count(), cpu)).collect();
    ranked.sort_unstable();
    ranked.dedup_by_key(|(_, cpu)| *cpu);
    let mut chosen: Vec<u32> = ranked.into_iter().take(n).map(|(_, cpu)| cpu).collect();
    chosen.sort_unstable();
    chosen
}

/// CPUs for a trial asking for `cores` (none: not pinned, empty).
pub fn cpus_for_trial(cores: Option<u32>, allowed: &[u32], in_use: &[u32]) -> Vec<u32> {
    match cores {
        Some(n) => choose_cpus(allowed, in_use, n as usize),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_free_cpus_then_least_used() {
        let allowed = [0, 1, 2, 3];
        assert_eq!(choose_cpus(&allowed, &[], 2), vec![0, 1]);
        assert_eq!(choose_cpus(&allowed, &[0, 1], 2), vec![2, 3]);
        assert_eq!(choose_cpus(&allowed, &[0, 1, 2], 2), vec![0, 3]);
        assert_eq!(choose_cpus(&allowed, &[0, 0, 1, 2, 3], 1), vec![1]);
    }

    #[test]
    fn never_more_than_allowed() {
        assert_eq!(choose_cpus(&[4, 6], &[], 8), vec![4, 6]);
        assert_eq!(choose_cpus(&[], &[], 2), Vec::<u32>::new());
        assert_eq!(choose_cpus(&[5], &[5, 5], 1), vec![5]);
    }

    #[test]
    fn confine_to_allowed_cpus_only() {
        assert_eq!(confine(&[3, 1, 1], &[0, 1, 2, 3]), Ok(vec![1, 3]));
        let err = confine(&[1, 4, 7, 8], &[0, 1, 2, 3]).expect_err("outside");
        assert_eq!(err.outside, [4, 7, 8]);
        assert_eq!(err.to_string(), "CPUs 4,7-8 are not among those this process may use (0-3)");
    }

    #[test]
    fn pin_self_confines_the_thread_and_what_it_starts() {
        let allowed = allowed_cpus();
        let last = *allowed.last().expect("a CPU");
        let seen = std::thread::spawn(move || {
            pin_self(&[last]).expect("pin");
            let inherited = std::thread::spawn(allowed_cpus).join().expect("joins");
            (allowed_cpus(), inherited)
        })
        .join()
        .expect("joins");
        assert_eq!(seen, (vec![last], vec![last]));
        assert_eq!(allowed_cpus(), allowed, "other threads keep their mask");
        assert!(matches!(pin_self(&[]), Err(LiveError::NoCpus)));
    }

    #[test]
    fn allowed_cpus_is_not_empty() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }
}
