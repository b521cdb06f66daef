//! How many worker threads a workload uses: the `--threads` flag, else
//! `TUNEFLEET_THREADS`, else `OMP_NUM_THREADS`, else one.
//!
//! The environment is read through a lookup function, so tests pass a map
//! instead of changing the process environment.

/// The variables consulted, in order, when no flag is given.
pub const THREAD_VARS: [&str; 2] = ["TUNEFLEET_THREADS", "OMP_NUM_THREADS"];

/// The most threads a workload accepts.
pub const MAX_THREADS: usize = 1024;

/// A thread count that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadsError {
    #[error("{var}={value:?} is not a thread count in 1..={MAX_THREADS}")]
    BadVar { var: &'static str, value: String },
}

/// The thread count: `flag` if given, else the first set variable of
/// [`THREAD_VARS`] (for `OMP_NUM_THREADS`, the outermost level of a
/// comma-separated list), else 1. An empty variable counts as unset.
pub fn resolve(flag: Option<usize>, lookup: impl Fn(&str) -> Option<String>) -> Result<usize, ThreadsError> {
    if let Some(n) = flag {
        return Ok(n);
    }
    for var in THREAD_VARS {
        let Some(value) = lookup(var) else { continue };
        let first = value.split(',').next().unwrap_or_default().trim();
        if first.is_empty() {
            continue;
        }
        return match first.parse::<usize>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
            _ => Err(ThreadsError::BadVar { var, value }),
        };
    }
    Ok(1)
}

/// [`resolve`] against the process environment.
pub fn from_env(flag: Option<usize>) -> Result<usize, ThreadsError> {
    resolve(flag, |var| std::env::var(var).ok())
}

/// The thread count a workload binary runs with: its `--threads` flag (bounded
/// to 1..=MAX_THREADS by the flag's parser), else the environment. A bad
/// environment value is reported as `{program}: {error}` with exit code 2.
pub fn for_program(program: &str, flag: Option<u64>) -> Result<usize, std::process::ExitCode> {
    let flag = flag.map(|t| usize::try_from(t).unwrap_or(MAX_THREADS));
    from_env(flag).map_err(|e| {
        eprintln!("{program}: {e}");
        std::process::ExitCode::from(2)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |var| pairs.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
    }

    #[test]
    fn flag_then_tunefleet_then_omp_then_one() {
        let both = env(&[("TUNEFLEET_THREADS", "3"), ("OMP_NUM_THREADS", "5")]);
        assert_eq!(resolve(Some(2), &both), Ok(2));
        assert_eq!(resolve(None, &both), Ok(3));
        assert_eq!(resolve(None, env(&[("OMP_NUM_THREADS", "5")])), Ok(5));
        assert_eq!(resolve(None, env(&[])), Ok(1));
    }

    #[test]
    fn omp_lists_use_the_outer_level_and_empty_means_unset() {
        assert_eq!(resolve(None, env(&[("OMP_NUM_THREADS", "4,2")])), Ok(4));
        assert_eq!(resolve(None, env(&[("TUNEFLEET_THREADS", " "), ("OMP_NUM_THREADS", "2")])), Ok(2));
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        let e = resolve(None, env(&[("TUNEFLEET_THREADS", "zero")])).expect_err("not a number");
        assert!(e.to_string().contains("TUNEFLEET_THREADS"), "{e}");
        assert!(resolve(None, env(&[("OMP_NUM_THREADS", "0")])).is_err());
        assert!(resolve(None, env(&[("OMP_NUM_THREADS", "100000")])).is_err());
    }
}
