//! Launchers: the coordinator starts its own agents (Lorien's master
//! submitted its workers to AWS Batch itself).
//!
//! `--launcher TEMPLATE` is a command run with `sh -c` to start one agent
//! somewhere: `aws batch submit-job ...`, `kubectl create job ...`,
//! `sbatch ...`, `ssh host ...`, or a local `tunefleet-agent ...`. In it,
//! `{broker}` is the URL agents use, `{name}` a new agent name (random:
//! `launched-` and 12 hex digits), `{root}` the topic root and
//! `{coordinator_key}` the coordinator's public key (for the agent's
//! `--coordinator-key`, so it trusts no other); each is also in the
//! command's environment (`TUNEFLEET_BROKER`, `TUNEFLEET_AGENT_NAME`,
//! `TUNEFLEET_ROOT`, `TUNEFLEET_COORDINATOR_KEY`), and a broker password
//! the coordinator has (`TUNEFLEET_PASSWORD`) passes through. The join token
//! is only in the environment (`TUNEFLEET_JOIN`, which the agent reads):
//! each launch batch gets a token of its own, with one use per agent it
//! launches and admitting only their names, valid a day; `{join}` is the
//! shell text `"$TUNEFLEET_JOIN"`, so the line the coordinator logs and
//! runs never holds it. The template is read once: a value is shell-quoted
//! and never expanded again; braces that are not one of these placeholders
//! are left as they are. The agent it starts should exit when idle
//! (`tunefleet-agent --exit-when-idle=60s`).
//!
//! While any study has work, the coordinator keeps up to `--launch-max`
//! launched agents: an agent counts from its launch until it has been seen
//! and gone again and the process launched has exited, or, never seen, for
//! `--launch-grace` (a batch queue may take a while). A launch whose command fails before its agent is seen
//! counts as a failure, and launching backs off (doubling from 1 s, at
//! most 5 minutes) until an agent comes up. Deciding is pure
//! ([`Launcher::plan`], [`jobs::judge`]); running the command is
//! [`Launcher::tick`].
//!
//! When the template submits to a batch scheduler the launcher knows
//! ([`jobs::SCHEDULERS`]: Slurm's `sbatch`), it follows the jobs: it reads
//! the job id the submit command prints and asks the scheduler every few
//! seconds (`squeue`), so a job counts while it waits in the queue or runs
//! and no longer once it ended (one that ended before its agent connected
//! is a failed launch); a job still queued after `--launch-grace` is
//! reported with the scheduler's reason, and keeps its place instead of
//! being answered with more jobs. Jobs still queued when no study has work
//! (or the coordinator stops) are cancelled (`scancel`).

pub mod jobs;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use jobs::{BatchScheduler, Job, JobStanding, Query};

/// How often the scheduler is asked about the launched jobs.
const QUERY_EVERY_MS: u64 = 2_000;

/// `--launcher` and its bounds.
#[derive(Debug, Clone, clap::Args)]
pub struct LaunchArgs {
    /// Start agents with this shell command template ({broker}, {name},
    /// {root}, {coordinator_key}; the join token is in TUNEFLEET_JOIN) while studies have work;
    /// see docs/DEPLOY.md "Launchers".
    #[arg(long, value_name = "TEMPLATE")]
    pub launcher: Option<String>,
    /// Launched agents at most at once.
    #[arg(long, default_value_t = 2, value_name = "N")]
    pub launch_max: u32,
    /// How long a launched agent that has not connected yet still counts.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub launch_grace: Duration,
}

/// Parses `500ms`, `90s`, `5m`, `24h`, `7d` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.find(|c: char| !c.is_ascii_digit()).map_or((s, "s"), |i| (&s[..i], &s[i..]));
    let n: u64 = n.parse().map_err(|_| format!("not a duration: {s:?} (like 90s or 5m)"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        "d" => Ok(Duration::from_secs(n.saturating_mul(86_400))),
        _ => Err(format!("not a duration: {s:?} (like 90s, 5m, 24h or 7d)")),
    }
}

/// What the template's placeholders stand for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub broker: String,
    pub root: String,
    pub coordinator_key: String,
    /// Launched agents are named `{prefix}-{12 random hex digits}`.
    pub prefix: String,
}

/// What `{join}` becomes: the token stays in the environment.
const JOIN_TEXT: &str = "\"$TUNEFLEET_JOIN\"";

/// `value` quoted for `sh`.
fn quoted(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The command line for agent `name`, in one pass over the template: a
/// value is never read again, so a value that contains `{name}` stays as
/// it is. Anything in braces that is not a placeholder (a shell's
/// `${VAR}` or `{a,b}`) is left alone.
pub fn render(template: &str, cx: &Context, name: &str) -> String {
    let value = |key: &str| match key {
        "broker" => Some(cx.broker.as_str()),
        "name" => Some(name),
        "root" => Some(cx.root.as_str()),
        "coordinator_key" => Some(cx.coordinator_key.as_str()),
        "join" => Some(JOIN_TEXT),
        _ => None,
    };
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let (before, from) = rest.split_at(open);
        out.push_str(before);
        let found = from.find('}').and_then(|close| Some((value(from.get(1..close)?)?, close)));
        match found {
            Some((v, close)) => {
                if v == JOIN_TEXT {
                    out.push_str(v);
                } else {
                    out.push_str(&quoted(v));
                }
                rest = from.get(close + 1..).unwrap_or_default();
            }
            None => {
                out.push('{');
                rest = from.get(1..).unwrap_or_default();
            }
        }
    }
    out.push_str(rest);
    out
}

/// The lines a launch command prints, read by a thread of its own.
#[derive(Debug)]
struct Printed {
    lines: std::sync::mpsc::Receiver<String>,
    text: String,
}

impl Printed {
    /// Reads `out` on a thread of its own, line by line.
    fn read(out: std::process::ChildStdout) -> Printed {
        use std::io::BufRead;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Printed { lines, text: String::new() }
    }

    /// Takes in what has been printed so far; whether more may come.
    fn drain(&mut self) -> bool {
        loop {
            match self.lines.try_recv() {
                Ok(line) => {
                    self.text.push_str(&line);
                    self.text.push('\n');
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return true,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }
}

#[derive(Debug)]
struct Launch {
    at_ms: u64,
    seen: bool,
    /// The launch command, until it has been reaped.
    child: Option<Child>,
    /// Whether the launch command exited with success, once it exited.
    exit_ok: Option<bool>,
    /// What it prints, while the launcher follows its job (the job id).
    printed: Option<Printed>,
    /// The scheduler's job id, when the launch is followed.
    job_id: Option<String>,
    /// What the scheduler said last (`None`: not followed).
    job: Option<Job>,
    /// When a job stuck in the queue was last reported.
    reported_ms: Option<u64>,
}

/// The launcher's state.
#[derive(Debug)]
pub struct Launcher {
    template: String,
    cx: Context,
    max: u32,
    grace_ms: u64,
    next: u64,
    launches: BTreeMap<String, Launch>,
    failures: u32,
    not_before_ms: u64,
    /// The batch scheduler the template submits to, when it is one the launcher follows.
    scheduler: Option<&'static BatchScheduler>,
    /// The scheduler query in flight.
    query: Option<Query>,
    last_query_ms: Option<u64>,
    /// Launches started, and launch commands (or jobs) that failed.
    pub started: u64,
    pub failed: u64,
}

impl Launcher {
    pub fn new(args: &LaunchArgs, cx: Context) -> Option<Launcher> {
        let template = args.launcher.clone()?;
        let scheduler = jobs::scheduler_of(&template);
        if let Some(s) = scheduler {
            tracing::info!(scheduler = s.name, query = s.query, "following the launched jobs");
        }
        Some(Launcher {
            template,
            scheduler,
            query: None,
            last_query_ms: None,
            cx,
            max: args.launch_max,
            grace_ms: u64::try_from(args.launch_grace.as_millis()).unwrap_or(u64::MAX),
            next: 0,
            launches: BTreeMap::new(),
            failures: 0,
            not_before_ms: 0,
            started: 0,
            failed: 0,
        })
    }

    /// How many agents to launch now: up to `max` counted ones while
    /// `work` (some study is not finished), none during a back-off.
    pub fn plan(max: u32, counted: usize, work: bool, backing_off: bool) -> usize {
        if !work || backing_off {
            return 0;
        }
        (max as usize).saturating_sub(counted)
    }

    /// Launched agents that still count (see the module doc), given which
    /// agents are connected now.
    fn count(&mut self, now_ms: u64, online: &dyn Fn(&str) -> bool) -> usize {
        self.ask_scheduler(now_ms);
        let grace = self.grace_ms;
        let scheduler = self.scheduler;
        let mut failed = 0;
        self.launches.retain(|name, l| {
            if let Some(child) = l.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        l.exit_ok = Some(status.success());
                        l.child = None;
                        if !status.success() && !l.seen && !online(name) {
                            tracing::warn!(agent = %name, %status, "launch command failed");
                            failed += 1;
                            return false;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(agent = %name, error = %e, "cannot wait for a launch command"),
                }
            }
            // What the submit command printed, read by a thread of its own:
            // a command whose child keeps its output open never blocks this
            // loop (a read to the end would wait for that child).
            if let (Some(s), Some(p)) = (scheduler, l.printed.as_mut()) {
                let open = p.drain();
                if l.job_id.is_none() {
                    if let Some(id) = jobs::job_id(s, &p.text) {
                        tracing::info!(agent = %name, job = %id, scheduler = s.name, "submitted");
                        l.job_id = Some(id);
                        l.job = Some(Job::Unknown);
                    }
                }
                if !open && l.exit_ok.is_some() {
                    if l.job_id.is_none() && l.exit_ok == Some(true) {
                        tracing::warn!(agent = %name, printed = %p.text.trim(), "no job id in what the submit command printed: not followed");
                    }
                    l.printed = None;
                }
            }
            let up = online(name);
            if up && !l.seen {
                l.seen = true;
            }
            let age_ms = now_ms.saturating_sub(l.at_ms);
            if let Some(Job::Queued(reason)) = &l.job {
                if jobs::report_queued(age_ms, grace, l.reported_ms, now_ms) {
                    l.reported_ms = Some(now_ms);
                    tracing::warn!(
                        agent = %name,
                        job = l.job_id.as_deref().unwrap_or_default(),
                        reason = %reason,
                        waited_s = age_ms / 1_000,
                        "a launched job still waits in the scheduler's queue: it keeps its place, no other is launched for it"
                    );
                }
            }
            match jobs::judge(l.job.as_ref(), l.seen, up, age_ms, grace) {
                JobStanding::Counts => true,
                // Seen and gone from the fleet, but the process launched
                // still runs (an agent that said it is offline and is still
                // exiting): it holds its place until it has exited.
                JobStanding::Gone => l.seen && l.child.is_some(),
                JobStanding::Failed => {
                    tracing::warn!(agent = %name, job = l.job_id.as_deref().unwrap_or_default(), "the launched job ended before its agent connected");
                    failed += 1;
                    false
                }
            }
        });
        if failed > 0 {
            self.failed += failed;
            self.failures = self.failures.saturating_add(failed as u32);
            let backoff = 1_000u64.saturating_mul(1 << self.failures.min(9)).min(300_000);
            self.not_before_ms = now_ms + backoff;
        } else if self.launches.values().any(|l| l.seen) {
            self.failures = 0;
        }
        self.launches.len()
    }

    /// Reads the scheduler's answer when it has come, and asks again every
    /// [`QUERY_EVERY_MS`] while jobs are followed.
    fn ask_scheduler(&mut self, now_ms: u64) {
        let Some(s) = self.scheduler else { return };
        if let Some(q) = &self.query {
            let Some(out) = q.done() else { return };
            let states = match out {
                Ok(o) => jobs::parse_query(
                    s,
                    &q.ids,
                    o.status.success(),
                    &String::from_utf8_lossy(&o.stdout),
                    &String::from_utf8_lossy(&o.stderr),
                ),
                Err(e) => {
                    tracing::warn!(error = %e, query = s.query, "cannot ask the scheduler about the launched jobs");
                    None
                }
            };
            self.query = None;
            let Some(states) = states else { return };
            for l in self.launches.values_mut() {
                if let Some(state) = l.job_id.as_ref().and_then(|id| states.get(id)) {
                    l.job = Some(state.clone());
                }
            }
        }
        if self.last_query_ms.is_some_and(|at| now_ms < at.saturating_add(QUERY_EVERY_MS)) {
            return;
        }
        let ids: Vec<String> = self.launches.values().filter_map(|l| l.job_id.clone()).collect();
        if ids.is_empty() {
            return;
        }
        self.last_query_ms = Some(now_ms);
        self.query = Some(Query::start(jobs::with_ids(s.query, &ids), ids));
    }

    /// Cancels the followed jobs that still wait in the queue (no study
    /// needs them); they no longer count. Returns the cancel command's line.
    fn cancel_queued(&mut self) -> Option<String> {
        let s = self.scheduler?;
        let queued: Vec<String> = self
            .launches
            .iter()
            .filter(|(_, l)| !l.seen && matches!(l.job, Some(Job::Queued(_))))
            .map(|(name, _)| name.clone())
            .collect();
        let ids: Vec<String> = queued.iter().filter_map(|n| self.launches.remove(n).and_then(|l| l.job_id)).collect();
        if ids.is_empty() {
            return None;
        }
        tracing::info!(jobs = %ids.join(","), "no study has work: cancelling the launched jobs still queued");
        Some(jobs::with_ids(s.cancel, &ids))
    }

    /// Launches what [`Launcher::plan`] says, at `now_ms` (engine clock),
    /// with a join token `mint` makes for the batch's names (none: nothing
    /// is launched, and launching backs off).
    pub fn tick(
        &mut self,
        now_ms: u64,
        work: bool,
        online: &dyn Fn(&str) -> bool,
        mint: &mut dyn FnMut(&[String]) -> Option<String>,
    ) {
        let counted = self.count(now_ms, online);
        if !work {
            if let Some(line) = self.cancel_queued() {
                // Nothing waits for its answer: the jobs no longer count.
                drop(Query::start(line, Vec::new()));
            }
        }
        let n = Self::plan(self.max, counted, work, now_ms < self.not_before_ms);
        if n == 0 {
            return;
        }
        // Names nobody can guess (a member cannot enrol them first), bound to this batch's token.
        let names: Vec<String> =
            (0..n).map(|_| format!("{}-{:012x}", self.cx.prefix, rand::random::<u64>() >> 16)).collect();
        let Some(join) = mint(&names) else {
            self.failed += 1;
            self.failures = self.failures.saturating_add(1);
            self.not_before_ms = now_ms + 1_000u64.saturating_mul(1 << self.failures.min(9)).min(300_000);
            return;
        };
        for name in names {
            self.next += 1;
            let line = render(&self.template, &self.cx, &name);
            let mut cmd = Command::new("sh");
            cmd.arg("-c").arg(&line).stdin(Stdio::null());
            if self.scheduler.is_some() {
                // The submit command prints the job id (and exits at once).
                cmd.stdout(Stdio::piped());
            }
            cmd.env("TUNEFLEET_BROKER", &self.cx.broker)
                .env("TUNEFLEET_AGENT_NAME", &name)
                .env("TUNEFLEET_ROOT", &self.cx.root)
                .env("TUNEFLEET_COORDINATOR_KEY", &self.cx.coordinator_key)
                .env(tunefleet_common::security::JOIN_ENV, &join);
            match cmd.spawn() {
                Ok(mut child) => {
                    let printed = child.stdout.take().map(Printed::read);
                    tracing::info!(agent = %name, command = %line, "launching an agent");
                    self.started += 1;
                    let launch = Launch {
                        at_ms: now_ms,
                        seen: false,
                        child: Some(child),
                        exit_ok: None,
                        printed,
                        job_id: None,
                        job: None,
                        reported_ms: None,
                    };
                    self.launches.insert(name, launch);
                }
                Err(e) => {
                    tracing::warn!(agent = %name, error = %e, "cannot run the launcher");
                    self.failed += 1;
                    self.failures = self.failures.saturating_add(1);
                    self.not_before_ms = now_ms + 1_000u64.saturating_mul(1 << self.failures.min(9)).min(300_000);
                    break;
                }
            }
        }
    }
}

impl Launcher {
    /// The names of the agents launched that still count.
    pub fn names(&self) -> Vec<String> {
        self.launches.keys().cloned().collect()
    }

    /// The ids of the jobs followed (read from what the submit commands printed).
    pub fn jobs(&self) -> Vec<String> {
        self.launches.values().filter_map(|l| l.job_id.clone()).collect()
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // Jobs still queued would start agents for studies that are over.
        if let Some(line) = self.cancel_queued() {
            let _ = Command::new("sh").arg("-c").arg(&line).stdin(Stdio::null()).status();
        }
        // Reap what has exited; the rest (local agents) drain on their own.
        for l in self.launches.values_mut() {
            if let Some(c) = l.child.as_mut() {
                let _ = c.try_wait();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx() -> Context {
        Context {
            broker: "mqtt://10.0.0.1:1883".into(),
            root: "tunefleet".into(),
            coordinator_key: "ab".repeat(32),
            prefix: "launched".into(),
        }
    }

    fn mint(_: &[String]) -> Option<String> {
        Some("a-token".into())
    }

    #[test]
    fn regression_a_value_containing_a_placeholder_is_not_expanded_again() {
        let cx = Context { broker: "mqtt://h:1/{name}".into(), root: "r{coordinator_key}{broker}".into(), ..cx() };
        assert_eq!(
            render("a {broker} {root} {join} {name}", &cx, "n-1"),
            "a 'mqtt://h:1/{name}' 'r{coordinator_key}{broker}' \"$TUNEFLEET_JOIN\" 'n-1'",
            "each value is put in once, as it is; the token stays in the environment"
        );
        // Unknown placeholders, shell braces and a lone brace stay.
        assert_eq!(
            render("{nope} ${TUNEFLEET_AGENT_NAME##*-} {a,b} { {name", &cx, "n"),
            "{nope} ${TUNEFLEET_AGENT_NAME##*-} {a,b} { {name"
        );
        assert_eq!(render("{name}{name}}", &cx, "x"), "'x''x'}");
    }

    #[test]
    fn templates_get_quoted_values() {
        let line =
            render("tunefleet-agent --broker {broker} --name {name} --coordinator-key {coordinator_key}", &cx(), "a-1");
        assert_eq!(
            line,
            format!(
                "tunefleet-agent --broker 'mqtt://10.0.0.1:1883' --name 'a-1' --coordinator-key '{}'",
                "ab".repeat(32)
            )
        );
        let evil = Context { root: "x'; rm -rf /; '".into(), ..cx() };
        assert_eq!(render("echo {root}", &evil, "n"), r"echo 'x'\''; rm -rf /; '\'''");
    }

    #[test]
    fn plans_keep_the_bound_while_there_is_work() {
        assert_eq!(Launcher::plan(3, 0, true, false), 3);
        assert_eq!(Launcher::plan(3, 2, true, false), 1);
        assert_eq!(Launcher::plan(3, 5, true, false), 0);
        assert_eq!(Launcher::plan(3, 0, false, false), 0, "no work, no agents");
        assert_eq!(Launcher::plan(3, 0, true, true), 0, "backing off");
    }

    #[test]
    fn a_failing_launcher_backs_off_and_a_slow_one_counts_within_its_grace() {
        let args = LaunchArgs { launcher: Some("exit 3".into()), launch_max: 2, launch_grace: Duration::from_secs(60) };
        let mut l = Launcher::new(&args, cx()).expect("a launcher");
        let never = |_: &str| false;
        l.tick(0, true, &never, &mut mint);
        assert_eq!(l.started, 2);
        // Wait for both commands to fail.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while l.failed < 2 && std::time::Instant::now() < deadline {
            l.tick(10, true, &never, &mut mint);
            std::thread::yield_now();
        }
        assert_eq!(l.failed, 2);
        let started = l.started;
        l.tick(20, true, &never, &mut mint);
        assert_eq!(l.started, started, "backing off after failures");

        let slow = LaunchArgs { launcher: Some("true".into()), launch_max: 1, launch_grace: Duration::from_secs(5) };
        let mut l = Launcher::new(&slow, cx()).expect("a launcher");
        l.tick(0, true, &never, &mut mint);
        l.tick(1_000, true, &never, &mut mint);
        assert_eq!(l.started, 1, "a submitted agent that has not connected counts within the grace");
        l.tick(6_000, true, &never, &mut mint);
        assert_eq!(l.started, 2, "after the grace it no longer counts: another is launched");
        let names = l.names();
        assert_eq!(names.len(), 1, "the first no longer counts: {names:?}");
        let second = names[0].clone();
        assert!(second.starts_with("launched-") && second.len() == "launched-".len() + 12, "{second}");
        let up = |n: &str| n == second;
        l.tick(7_000, true, &up, &mut mint);
        l.tick(70_000, true, &up, &mut mint);
        assert_eq!(l.started, 2, "a connected agent counts however long it runs");
        l.tick(71_000, false, &never, &mut mint);
        assert_eq!(l.started, 2, "no work: nothing launched");
        assert!(Launcher::new(&LaunchArgs { launcher: None, ..slow }, cx()).is_none());
    }

    /// A launch command that exited while a child kept
    /// its output open froze the whole coordinator for 15 s (the launcher
    /// read that output to its end).
    #[test]
    fn regression_a_submit_command_whose_child_keeps_its_output_never_blocks_a_tick() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let sbatch = dir.path().join("sbatch");
        std::fs::write(&sbatch, "#!/bin/sh\necho 'Submitted batch job 42'\nsleep 5 &\nexit 0\n").expect("write");
        std::fs::set_permissions(&sbatch, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let template = format!("{} --wrap true", sbatch.display());
        let args = LaunchArgs { launcher: Some(template), launch_max: 1, launch_grace: Duration::from_secs(60) };
        let mut l = Launcher::new(&args, cx()).expect("a launcher");
        let deadline = std::time::Instant::now() + Duration::from_secs(4);
        let mut slowest = Duration::ZERO;
        let mut now_ms = 0;
        while l.jobs().is_empty() && std::time::Instant::now() < deadline {
            let t = std::time::Instant::now();
            l.tick(now_ms, true, &|_| false, &mut mint);
            slowest = slowest.max(t.elapsed());
            now_ms += 10;
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(l.jobs(), vec!["42".to_string()], "the job id read while its child still holds the output");
        // The old read-to-end waited for the 5 s child; a busy machine stays well under 3 s.
        assert!(slowest < Duration::from_secs(3), "a tick took {slowest:?}");
    }

    /// An agent that said it is offline still holds its place while its
    /// process exits (the fleet test saw three agents at once with
    /// `--launch-max 2` when the offline status outran the exit).
    #[test]
    fn a_launched_agent_gone_offline_counts_until_its_process_exits() {
        let args =
            LaunchArgs { launcher: Some("sleep 1".into()), launch_max: 1, launch_grace: Duration::from_secs(60) };
        let mut l = Launcher::new(&args, cx()).expect("a launcher");
        l.tick(0, true, &|_| false, &mut mint);
        assert_eq!(l.started, 1);
        let name = l.names()[0].clone();
        l.tick(10, true, &|n: &str| n == name, &mut mint);
        // Offline now, its process still running: no other is launched.
        l.tick(20, true, &|_| false, &mut mint);
        assert_eq!(l.started, 1, "the exiting agent still counts");
        // Once it has exited, its place is free.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut now_ms = 30;
        while l.started < 2 {
            assert!(std::time::Instant::now() < deadline, "no launch after the first agent's process exited");
            l.tick(now_ms, true, &|_| false, &mut mint);
            now_ms += 10;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Launched agents' names were predictable
    /// (a member enrolled them first), and one launch token lived a day.
    #[test]
    fn regression_each_batch_gets_a_token_for_its_random_names_and_none_launches_without() {
        let args = LaunchArgs { launcher: Some("true".into()), launch_max: 3, launch_grace: Duration::from_secs(60) };
        let mut l = Launcher::new(&args, cx()).expect("a launcher");
        let mut batches: Vec<Vec<String>> = Vec::new();
        let mut record = |names: &[String]| {
            batches.push(names.to_vec());
            Some("t".to_string())
        };
        l.tick(0, true, &|_| false, &mut record);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].len(), 3, "one token for the batch, one name per agent");
        let mut unique = batches[0].clone();
        unique.dedup();
        assert_eq!(unique.len(), 3);
        assert_eq!(l.names().len(), 3);
        let mut refuse = |_: &[String]| None;
        let mut l = Launcher::new(&args, cx()).expect("a launcher");
        l.tick(0, true, &|_| false, &mut refuse);
        assert_eq!((l.started, l.failed), (0, 1), "no token, no launch");
    }
}
