//! The exec wrapper: `tunefleet-agent __exec [--cpus 0,1] [--rlimit-as BYTES] -- argv...`.
//!
//! The agent starts this tiny program (itself, re-executed) in a new process
//! group with a pipe on its standard input, opens perf counters on it and
//! moves it into a cgroup, then writes one byte: "go". The wrapper then pins
//! itself to the CPUs, applies `RLIMIT_AS`, replaces standard input with
//! `/dev/null` (or, with `--keep-stdin`, leaves the pipe to the workload as
//! its control channel) and execs the workload, which therefore is measured from its
//! first instruction. When the pipe closes without a byte, the agent gave up:
//! the wrapper exits with [`EXIT_NO_GO`].
//!
//! When the limits cannot be applied or the exec fails, the wrapper prints
//! one line `tunefleet-exec-failed: REASON` on standard error and exits with
//! [`EXIT_EXEC_FAILED`]; the runner recognises that pair as a spawn failure.
//!
//! `main.rs` dispatches to [`main`] before any runtime or logging exists.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use rustix::process::{setrlimit, Resource, Rlimit};
use rustix::thread::{sched_setaffinity, CpuSet};

/// The hidden subcommand.
pub const SUBCOMMAND: &str = "__exec";
/// Prefix of the stderr line reporting a failed start.
pub const EXEC_FAILED_MARKER: &str = "tunefleet-exec-failed: ";
/// Exit status when the workload could not be started.
pub const EXIT_EXEC_FAILED: i32 = 127;
/// Exit status when the agent closed the pipe without saying go.
pub const EXIT_NO_GO: i32 = 125;
/// Exit status for a malformed wrapper command line.
pub const EXIT_USAGE: i32 = 2;

/// What the wrapper does before exec.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExecPlan {
    /// CPUs to pin to; empty means no pinning.
    pub cpus: Vec<u32>,
    /// `RLIMIT_AS` in bytes.
    pub rlimit_as: Option<u64>,
    /// Leave standard input (the agent's pipe) to the workload: the
    /// control channel of a pipelined trial (docs/PROTOCOL.md).
    pub keep_stdin: bool,
    pub argv: Vec<OsString>,
}

impl ExecPlan {
    /// The wrapper's arguments, starting with the subcommand.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args = vec![OsString::from(SUBCOMMAND)];
        if !self.cpus.is_empty() {
            let list: Vec<String> = self.cpus.iter().map(u32::to_string).collect();
            args.push("--cpus".into());
            args.push(list.join(",").into());
        }
        if let Some(bytes) = self.rlimit_as {
            args.push("--rlimit-as".into());
            args.push(bytes.to_string().into());
        }
        if self.keep_stdin {
            args.push("--keep-stdin".into());
        }
        args.push("--".into());
        args.extend(self.argv.iter().cloned());
        args
    }

    /// Parses the arguments after the subcommand.
    pub fn parse(args: &[OsString]) -> Result<Self, String> {
        let mut plan = ExecPlan::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| -> Result<String, String> {
                it.next().and_then(|v| v.to_str()).map(str::to_string).ok_or_else(|| format!("{name} needs a value"))
            };
            match arg.to_str() {
                Some("--") => {
                    plan.argv = it.cloned().collect();
                    if plan.argv.is_empty() {
                        return Err("no program after --".into());
                    }
                    return Ok(plan);
                }
                Some("--cpus") => {
                    let list = value("--cpus")?;
                    plan.cpus = list
                        .split(',')
                        .map(|c| c.parse::<u32>().map_err(|_| format!("bad CPU number {c:?}")))
                        .collect::<Result<_, _>>()?;
                }
                Some("--keep-stdin") => plan.keep_stdin = true,
                Some("--rlimit-as") => {
                    let v = value("--rlimit-as")?;
                    plan.rlimit_as = Some(v.parse().map_err(|_| format!("bad --rlimit-as {v:?}"))?);
                }
                _ => return Err(format!("unexpected argument {:?}", arg.to_string_lossy())),
            }
        }
        Err("missing -- before the program".into())
    }
}

fn fail(reason: &str) -> i32 {
    // Best effort: if stderr is gone there is nobody to tell.
    let _ = writeln!(std::io::stderr(), "{EXEC_FAILED_MARKER}{reason}");
    EXIT_EXEC_FAILED
}

/// Pins the calling thread (and so what it starts from now on) to `cpus`;
/// an empty list leaves it as it is.
pub fn pin_current_thread(cpus: &[u32]) -> Result<(), String> {
    if cpus.is_empty() {
        return Ok(());
    }
    let mut set = CpuSet::new();
    for &cpu in cpus {
        let idx = cpu as usize;
        if idx >= CpuSet::MAX_CPU {
            return Err(format!("CPU {cpu} is beyond the CPU set size"));
        }
        set.set(idx);
    }
    sched_setaffinity(None, &set).map_err(|e| format!("cannot pin to CPUs {cpus:?}: {e}"))
}

/// Applies the plan's limits to this process.
fn apply(plan: &ExecPlan) -> Result<(), String> {
    pin_current_thread(&plan.cpus)?;
    if let Some(bytes) = plan.rlimit_as {
        // The soft limit only: the hard one stays as inherited, so a probe
        // of a pipelined trial may raise the limit later (live::set_memory_rlimit).
        let hard = rustix::process::getrlimit(Resource::As).maximum;
        setrlimit(Resource::As, Rlimit { current: Some(bytes), maximum: hard })
            .map_err(|e| format!("cannot set RLIMIT_AS to {bytes} bytes: {e}"))?;
    }
    Ok(())
}

/// The wrapper's entry point; `args` are the arguments after the subcommand.
/// Returns only on failure, with the exit status to use.
pub fn main(args: &[OsString]) -> i32 {
    let plan = match ExecPlan::parse(args) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "tunefleet-agent {SUBCOMMAND}: {e}");
            return EXIT_USAGE;
        }
    };
    // One byte straight from the pipe (no buffering): whatever the agent
    // writes later is the workload's to read.
    let mut go = [0u8; 1];
    match rustix::io::read(std::io::stdin(), &mut go) {
        Ok(1) => {}
        _ => return EXIT_NO_GO,
    }
    if let Err(e) = apply(&plan) {
        return fail(&e);
    }
    // argv is non-empty: `ExecPlan::parse` refuses an empty program.
    let Some((program, rest)) = plan.argv.split_first() else {
        return fail("empty argv");
    };
    let stdin = if plan.keep_stdin { Stdio::inherit() } else { Stdio::null() };
    let err = Command::new(program).args(rest).stdin(stdin).exec();
    fail(&format!("cannot execute {:?}: {err}", OsStr::new(program)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip() {
        let plan = ExecPlan {
            cpus: vec![0, 3],
            rlimit_as: Some(1 << 30),
            keep_stdin: true,
            argv: vec!["sh".into(), "--cpus".into()],
        };
        let args = plan.to_args();
        assert_eq!(args[0], SUBCOMMAND);
        assert_eq!(ExecPlan::parse(&args[1..]), Ok(plan));
        let bare = ExecPlan { argv: vec!["true".into()], ..ExecPlan::default() };
        assert_eq!(ExecPlan::parse(&bare.to_args()[1..]), Ok(bare));
    }

    #[test]
    fn refuses_malformed_args() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(ExecPlan::parse(&os(&["--"])).is_err());
        assert!(ExecPlan::parse(&os(&["true"])).is_err());
        assert!(ExecPlan::parse(&os(&["--cpus", "a", "--", "true"])).is_err());
        assert!(ExecPlan::parse(&os(&["--rlimit-as"])).is_err());
    }
}
