//! CPU placement: which CPUs a trial is pinned to. The choice is a pure
//! function of the CPUs the agent may use and those busy with other trials.

use rustix::thread::{sched_getaffinity, CpuSet};

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
    fn allowed_cpus_is_not_empty() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }
}
