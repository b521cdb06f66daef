//! Load from outside the agent's trials on the real `/proc`: a busy loop
//! pinned to the agent's CPU is foreign until it is registered as a trial,
//! and a trial the runner runs is never foreign, not even in the sample
//! that covers its end. The agent's CPU set is one CPU (the last this
//! process may use); the tests need 2 CPUs so the rest of the machine keeps
//! one. Another process busy on that CPU meanwhile (a build) is foreign
//! load too: a sample is judged against the trial's own CPU time over its
//! interval (read from `/proc`), so the checks hold on a busy machine, and
//! the conditions are waited for, under a deadline, rather than expected of
//! one sample.

use std::path::Path;
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::os::unix::process::CommandExt;
use tunefleet_agent::cpus::allowed_cpus;
use tunefleet_agent::energy::{Estimate, EstimateModel};
use tunefleet_agent::foreign::{read_members, TrialRegistry};
use tunefleet_agent::procfs::Members;
use tunefleet_agent::runner::{run_trial, RunnerConfig, TrialHandle, TrialRun};
use tunefleet_agent::telemetry::TelemetrySampler;
use tunefleet_common::measurement::{ExitOutcome, Telemetry};
use tunefleet_common::message::TrialSpec;
use tunefleet_common::params::SystemParams;

/// Between telemetry samples (the agent's default is 1 s).
const INTERVAL: Duration = Duration::from_millis(500);
const BUSY_LOOP: &str = "while :; do :; done";

/// The tests load the same CPU: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The agent's CPU: the last this process may use; none (skip) on one CPU.
fn agent_cpu() -> Option<u32> {
    let allowed = allowed_cpus();
    if allowed.len() < 2 {
        eprintln!("skipped: needs 2 CPUs, this process may use {allowed:?}");
        return None;
    }
    allowed.last().copied()
}

/// A busy loop in a process group of its own, killed when dropped.
struct Burner(Child);

impl Burner {
    fn pinned_to(cpu: u32) -> Burner {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", BUSY_LOOP]).process_group(0);
        let burner = Burner(cmd.spawn().expect("spawn sh"));
        let pinned = tunefleet_agent::live::set_affinity(Path::new("/proc"), &burner.members(), &[cpu]);
        assert_eq!(pinned.expect("pin the burner"), 1);
        burner
    }

    fn members(&self) -> Members {
        Members::Group(i32::try_from(self.0.id()).expect("a pid"))
    }
}

impl Drop for Burner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sampler(cpu: u32, registry: &TrialRegistry) -> TelemetrySampler {
    TelemetrySampler::new(Path::new("/proc"), &Estimate::default(), EstimateModel::default())
        .with_cpus(vec![cpu])
        .with_trials(registry.clone())
}

/// Samples every [`INTERVAL`] until a sample satisfies `ok`; panics with
/// the samples seen when `within` passes first.
fn wait_for(
    sampler: &mut TelemetrySampler,
    within: Duration,
    what: &str,
    ok: impl Fn(&Telemetry) -> bool,
) -> Telemetry {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        std::thread::sleep(INTERVAL);
        let t = sampler.sample(0);
        if ok(&t) {
            return t;
        }
        seen.push((t.cpu_utilisation, t.foreign_cpu));
    }
    panic!("no sample in {within:?} where {what}; (utilisation, foreign) seen: {seen:?}");
}

fn foreign(t: &Telemetry) -> f64 {
    t.foreign_cpu.expect("the trials are known: foreign load is told apart")
}

/// CPU time is counted in ticks of 1/100 s (`USER_HZ` on Linux).
const TICKS_PER_S: f64 = 100.0;

/// Slack for rounding between the trial's ticks and the sampler's.
const SLACK: f64 = 0.15;

/// Whether sample `t` leaves out the trials' own CPU time, `share` of its
/// interval: what it calls foreign is at most what the CPU did besides the
/// trials. On an idle machine that is about 0; on a busy one it is the
/// other processes' share, and counting the trial as foreign would exceed
/// it by `share`. Only a sample where the CPU was busy and the trials had
/// a share well above the slack says anything.
fn clean(t: &Telemetry, share: f64) -> bool {
    t.cpu_utilisation > 0.5 && share > SLACK + 0.1 && foreign(t) <= (t.cpu_utilisation - share).max(0.0) + SLACK
}

/// The share of `t`'s interval that `ticks` CPU ticks are.
fn share_of(ticks: u64, t: &Telemetry) -> f64 {
    ticks as f64 / TICKS_PER_S / (f64::from(t.interval_ms.max(1)) / 1e3)
}

/// Waits for a sample where the agent's CPU is busy, the trials of
/// `registry` had a good share of it, and none of theirs was counted as
/// foreign ([`clean`]); prints it.
fn wait_until_busy_and_clean(sampler: &mut TelemetrySampler, registry: &TrialRegistry, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    let mut before = trial_ticks(registry);
    while Instant::now() < deadline {
        std::thread::sleep(INTERVAL);
        let t = sampler.sample(0);
        let after = trial_ticks(registry);
        let share = share_of(after.saturating_sub(before), &t);
        before = after;
        if clean(&t, share) {
            eprintln!(
                "{what}: foreign_cpu {:.3} (utilisation {:.3}, the trial's share {share:.3})",
                foreign(&t),
                t.cpu_utilisation
            );
            return;
        }
        seen.push((t.cpu_utilisation, foreign(&t), share));
    }
    panic!("no sample in 30 s where {what} was busy and none of its CPU time foreign; (utilisation, foreign, trial's share) seen: {seen:?}");
}

#[test]
fn an_unregistered_burner_is_foreign_a_registered_one_is_not() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cpu) = agent_cpu() else { return };
    let registry = TrialRegistry::default();
    let mut sampler = sampler(cpu, &registry);
    let burner = Burner::pinned_to(cpu);

    let started = Instant::now();
    let loaded = wait_for(&mut sampler, Duration::from_secs(15), "foreign > 0.5", |t| foreign(t) > 0.5);
    eprintln!(
        "unregistered burner on CPU {cpu}: foreign_cpu {:.3} (utilisation {:.3}) after {:?}",
        foreign(&loaded),
        loaded.cpu_utilisation,
        started.elapsed()
    );
    assert_eq!(loaded.per_cpu.len(), 1, "only the agent's CPU");

    let trial = registry.register(burner.members());
    // The first sample counts the burner's CPU time since it started, more
    // than the interval: it says nothing. The next ones must say "not foreign"
    // while the CPU stays busy.
    let _ = sampler.sample(0);
    wait_until_busy_and_clean(&mut sampler, &registry, &format!("registered burner on CPU {cpu}"));
    drop(trial);
    sampler.finish();
}

/// CPU ticks the registered (running) trials' processes used so far.
fn trial_ticks(registry: &TrialRegistry) -> u64 {
    registry
        .take_snapshot()
        .iter()
        .filter(|r| r.ended.is_none())
        .flat_map(|r| read_members(Path::new("/proc"), &r.members))
        .map(|p| p.own)
        .sum()
}

#[test]
fn a_trial_run_by_the_runner_is_not_foreign_even_in_the_sample_of_its_end() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(cpu) = agent_cpu() else { return };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    runtime.block_on(trial_ends_cleanly(cpu));
}

async fn trial_ends_cleanly(cpu: u32) {
    let registry = TrialRegistry::default();
    let mut cfg = RunnerConfig::new(env!("CARGO_BIN_EXE_tunefleet-agent").into());
    cfg.trials = registry.clone();
    let spec = TrialSpec {
        argv: ["sh", "-c", BUSY_LOOP].map(String::from).to_vec(),
        env: vec![],
        system: SystemParams { cores: Some(1), ..SystemParams::default() },
        timeout_ms: 120_000,
        probe: None,
        gpus: 0,
    };
    let mut tails = Vec::new();
    // A run whose end falls in a sample where something else also loaded
    // the CPU proves nothing either way: up to three runs.
    for attempt in 0..3 {
        let mut sampler = sampler(cpu, &registry);
        let (handle, control) = TrialHandle::new();
        let run = TrialRun { spec: spec.clone(), cpus: vec![cpu], label: format!("foreign-{attempt}"), gpus: vec![] };
        let cfg = cfg.clone();
        let trial = tokio::spawn(async move { run_trial(&cfg, &run, None, control).await });
        let registered = registry.clone();
        let mut sampler = tokio::task::spawn_blocking(move || {
            wait_until_busy_and_clean(&mut sampler, &registered, &format!("trial on CPU {cpu}"));
            sampler
        })
        .await
        .expect("the sampling thread");
        // One more sample, then the trial burns at least 50 ticks before it
        // is cancelled: the sample after its end covers that tail.
        let _ = sampler.sample(0);
        let base = trial_ticks(&registry);
        let deadline = Instant::now() + Duration::from_secs(20);
        while trial_ticks(&registry) < base + 50 {
            assert!(Instant::now() < deadline, "the trial burnt no CPU");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // What the trial burnt since that sample, all of it inside the
        // interval of the sample that covers its end.
        let burnt = trial_ticks(&registry).saturating_sub(base);
        assert!(handle.cancel());
        let measurement = trial.await.expect("the trial task");
        assert_eq!(measurement.exit, ExitOutcome::Cancelled);
        assert_eq!(registry.running(), 0, "the runner ended the registration");
        let tail = sampler.sample(0);
        let share = share_of(burnt, &tail);
        tails.push((tail.cpu_utilisation, foreign(&tail), share));
        sampler.finish();
        eprintln!(
            "sample covering the trial's end: foreign_cpu {:.3} (utilisation {:.3})",
            foreign(&tail),
            tail.cpu_utilisation
        );
        if clean(&tail, share) {
            return;
        }
    }
    panic!(
        "the end of a trial counted as load from outside in every run: (utilisation, foreign, trial's share) {tails:?}"
    );
}
