//! The job tracker: what a batch scheduler says about the jobs the launcher
//! submitted, so a job that died counts no longer and one stuck in the
//! queue is reported instead of being launched again and again.
//!
//! A [`BatchScheduler`] is data: the submit programs it follows, how the job id
//! is printed on submission, a documented query command (`{ids}` stands for
//! the comma-separated ids) that prints one line `ID STATE REASON...` per job
//! it still knows, which states are queued and which run, and a cancel
//! command. A job the query no longer lists has ended. Slurm is the one in
//! [`SCHEDULERS`] (`sbatch`, `squeue`, `scancel`; `sacct` needs slurmdbd, so
//! it is not used); another scheduler with such a query is one entry more.
//! Parsing and judging are pure; [`Query`] runs the query on its own thread
//! so the coordinator never waits for the scheduler.

use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;

/// How to follow one batch scheduler's jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchScheduler {
    pub name: &'static str,
    /// Launch templates whose program is one of these are followed.
    pub submit: &'static [&'static str],
    /// The submit command prints this, then the job id.
    pub submitted: &'static str,
    /// Prints `ID STATE REASON...` per job of `{ids}` it still knows.
    pub query: &'static str,
    /// The query failed only because it knows none of the ids (they all ended).
    pub none_known: &'static str,
    /// States of a job waiting for resources.
    pub queued: &'static [&'static str],
    /// States of a job whose agent runs (or is about to, or is ending).
    pub running: &'static [&'static str],
    /// Removes the jobs `{ids}` from the queue.
    pub cancel: &'static str,
}

/// The schedulers the launcher knows.
pub const SCHEDULERS: &[BatchScheduler] = &[BatchScheduler {
    name: "Slurm",
    submit: &["sbatch"],
    submitted: "Submitted batch job ",
    query: "squeue --noheader --jobs {ids} --format '%i %T %r'",
    none_known: "Invalid job id",
    queued: &["PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"],
    running: &["RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING", "STOPPED"],
    cancel: "scancel {ids}",
}];

/// The scheduler whose submit program `template` runs, if any: its first
/// word, after variable assignments and `exec`, by its file name.
pub fn scheduler_of(template: &str) -> Option<&'static BatchScheduler> {
    let program = template
        .split_whitespace()
        .find(|w| *w != "exec" && !(w.contains('=') && !w.starts_with('-') && !w.starts_with('/')))?;
    let program = program.rsplit('/').next().unwrap_or(program);
    SCHEDULERS.iter().find(|s| s.submit.contains(&program))
}

/// The job id the submit command printed: the word after
/// [`BatchScheduler::submitted`], or a line that is only the id (`sbatch
/// --parsable` prints `ID` or `ID;CLUSTER`).
pub fn job_id(s: &BatchScheduler, stdout: &str) -> Option<String> {
    let id = stdout.lines().find_map(|line| {
        let line = line.trim();
        match line.find(s.submitted) {
            Some(at) => line.get(at + s.submitted.len()..)?.split_whitespace().next(),
            None => line.split(';').next().filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit())),
        }
    })?;
    id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')).then(|| id.to_string())
}

/// What the scheduler says about a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Not asked yet.
    Unknown,
    /// Waits in the queue, for this reason.
    Queued(String),
    Running,
    /// Finished, failed, cancelled, or no longer known.
    Ended,
}

/// The states a query printed, by job id. An id it does not list has
/// ended; `None` when the query failed for another reason (no news).
pub fn parse_query(
    s: &BatchScheduler,
    ids: &[String],
    success: bool,
    stdout: &str,
    stderr: &str,
) -> Option<BTreeMap<String, Job>> {
    if !success && !stderr.contains(s.none_known) {
        return None;
    }
    let mut out: BTreeMap<String, Job> = ids.iter().map(|id| (id.clone(), Job::Ended)).collect();
    if !success {
        return Some(out);
    }
    for line in stdout.lines() {
        let mut words = line.split_whitespace();
        let (Some(id), Some(state)) = (words.next(), words.next()) else { continue };
        let Some(slot) = out.get_mut(id) else { continue };
        // Slurm adds a suffix to some states (`CANCELLED by 0`).
        let state = state.split(['+', ' ']).next().unwrap_or(state);
        *slot = if s.queued.contains(&state) {
            Job::Queued(words.collect::<Vec<_>>().join(" "))
        } else if s.running.contains(&state) {
            Job::Running
        } else {
            Job::Ended
        };
    }
    Some(out)
}

/// What a launch counts as now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStanding {
    /// Still one of the `--launch-max`.
    Counts,
    /// Done with: its agent came and went, or its grace ran out.
    Gone,
    /// Its job ended before its agent was ever seen: a failed launch.
    Failed,
}

/// Judges one launch: `job` is what the scheduler says (`None`: the launch
/// is not followed), `seen` whether its agent was ever connected, `up`
/// whether it is now, `age_ms` how long ago it was launched.
///
/// A followed job counts while it is queued or running however long that
/// takes (a stuck queue is reported, not answered with more jobs) and
/// stops counting when it ends, even if its agent's session has not timed
/// out yet; before the scheduler has answered, or unfollowed, a launch
/// counts while its agent is connected or, never seen, within the grace.
pub fn judge(job: Option<&Job>, seen: bool, up: bool, age_ms: u64, grace_ms: u64) -> JobStanding {
    match job {
        Some(Job::Queued(_) | Job::Running) => JobStanding::Counts,
        Some(Job::Ended) if !seen && !up => JobStanding::Failed,
        Some(Job::Ended) => JobStanding::Gone,
        Some(Job::Unknown) | None if up || (!seen && age_ms < grace_ms) => JobStanding::Counts,
        Some(Job::Unknown) | None => JobStanding::Gone,
    }
}

/// Whether a queued job is reported now: it has waited a grace, and was
/// not reported within the last grace.
pub fn report_queued(age_ms: u64, grace_ms: u64, last_report_ms: Option<u64>, now_ms: u64) -> bool {
    age_ms >= grace_ms && last_report_ms.is_none_or(|at| now_ms >= at.saturating_add(grace_ms.max(1_000)))
}

/// `template` with `{ids}` replaced by the ids joined with commas (ids are
/// checked by [`job_id`]: letters, digits, `.`, `_`, `-`).
pub fn with_ids(template: &str, ids: &[String]) -> String {
    template.replace("{ids}", &ids.join(","))
}

/// A query or cancel command running on its own thread.
#[derive(Debug)]
pub struct Query {
    pub ids: Vec<String>,
    rx: mpsc::Receiver<std::io::Result<Output>>,
}

impl Query {
    /// Runs `line` with `sh -c` on a thread of its own.
    pub fn start(line: String, ids: Vec<String>) -> Query {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let out = Command::new("sh").arg("-c").arg(&line).stdin(Stdio::null()).output();
            let _ = tx.send(out);
        });
        Query { ids, rx }
    }

    /// Its output once it has finished: `Some(Err)` when it could not run.
    pub fn done(&self) -> Option<std::io::Result<Output>> {
        match self.rx.try_recv() {
            Ok(out) => Some(out),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(std::io::Error::other("the query thread ended"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slurm() -> &'static BatchScheduler {
        scheduler_of("sbatch --wrap true").expect("sbatch is Slurm's")
    }

    #[test]
    fn the_submit_program_names_the_scheduler() {
        assert_eq!(slurm().name, "Slurm");
        assert!(scheduler_of("/usr/bin/sbatch -J {name} --wrap x").is_some());
        assert!(scheduler_of("SLURM_CONF=/x/slurm.conf exec sbatch --wrap x").is_some());
        assert!(scheduler_of("tunefleet-agent --broker {broker} --name sbatch").is_none(), "only the program counts");
        assert!(scheduler_of("kubectl create job {name}").is_none());
        assert!(scheduler_of("   ").is_none());
    }

    #[test]
    fn job_ids_are_read_as_sbatch_prints_them() {
        assert_eq!(job_id(slurm(), "Submitted batch job 42\n").as_deref(), Some("42"));
        assert_eq!(job_id(slurm(), "sbatch: warning: x\nSubmitted batch job 7 on cluster c\n").as_deref(), Some("7"));
        assert_eq!(job_id(slurm(), "1234\n").as_deref(), Some("1234"), "--parsable");
        assert_eq!(job_id(slurm(), "1234;cluster\n").as_deref(), Some("1234"), "--parsable with a cluster");
        assert_eq!(job_id(slurm(), "").as_deref(), None);
        assert_eq!(job_id(slurm(), "hello world\n").as_deref(), None);
        assert_eq!(job_id(slurm(), "Submitted batch job 1;rm -rf /\n"), None, "an id is put in a shell line");
    }

    #[test]
    fn a_query_lists_what_waits_and_what_runs_and_the_rest_ended() {
        let ids: Vec<String> = ["1", "2", "3", "4"].map(String::from).to_vec();
        let out = "1 PENDING Resources\n2 RUNNING None\n4 CANCELLED None\n9 RUNNING None\nnoise\n";
        let states = parse_query(slurm(), &ids, true, out, "").expect("an answer");
        assert_eq!(states["1"], Job::Queued("Resources".into()));
        assert_eq!(states["2"], Job::Running);
        assert_eq!(states["3"], Job::Ended, "a job the query no longer lists has ended");
        assert_eq!(states["4"], Job::Ended);
        assert!(!states.contains_key("9"), "only the ids asked about");
        let gone = parse_query(slurm(), &ids, false, "", "slurm_load_jobs error: Invalid job id specified\n");
        assert!(gone.expect("an answer").values().all(|j| *j == Job::Ended), "none known: all ended");
        let down = parse_query(slurm(), &ids, false, "", "slurm_load_jobs error: Unable to contact slurm controller");
        assert_eq!(down, None, "a scheduler that does not answer says nothing about the jobs");
    }

    #[test]
    fn a_followed_job_counts_while_queued_or_running_and_not_after() {
        let q = Job::Queued("Priority".into());
        // Queued or running: counts, past the grace too, agent seen or not.
        for job in [&q, &Job::Running] {
            assert_eq!(judge(Some(job), false, false, 10_000_000, 60_000), JobStanding::Counts);
            assert_eq!(judge(Some(job), true, false, 10, 60_000), JobStanding::Counts);
        }
        // Ended: a failure before its agent came; gone after, even while the session lingers.
        assert_eq!(judge(Some(&Job::Ended), false, false, 10, 60_000), JobStanding::Failed);
        assert_eq!(judge(Some(&Job::Ended), true, false, 10, 60_000), JobStanding::Gone);
        assert_eq!(judge(Some(&Job::Ended), true, true, 10, 60_000), JobStanding::Gone);
        // Not asked yet, or not followed: the grace rules.
        for job in [Some(&Job::Unknown), None] {
            assert_eq!(judge(job, false, false, 59_999, 60_000), JobStanding::Counts);
            assert_eq!(judge(job, false, false, 60_000, 60_000), JobStanding::Gone);
            assert_eq!(judge(job, true, true, 600_000, 60_000), JobStanding::Counts);
            assert_eq!(judge(job, true, false, 10, 60_000), JobStanding::Gone);
        }
    }

    #[test]
    fn a_stuck_job_is_reported_after_the_grace_and_again_each_grace() {
        assert!(!report_queued(59_999, 60_000, None, 59_999));
        assert!(report_queued(60_000, 60_000, None, 60_000));
        assert!(!report_queued(90_000, 60_000, Some(60_000), 90_000));
        assert!(report_queued(120_000, 60_000, Some(60_000), 120_000));
        assert_eq!(with_ids("squeue -j {ids}", &["1".into(), "22".into()]), "squeue -j 1,22");
    }
}
