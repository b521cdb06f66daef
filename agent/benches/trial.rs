//! Benchmark: the agent's cost of one short trial, started directly (one
//! `exec`, counters inherited from the starting thread) against started
//! through the exec wrapper (the agent re-executed, held until "go", then
//! the workload's `exec`), and against bare process creation. Results go to
//! BENCHMARKS.md.
//!
//! Each round runs `TRIALS` trials of `true` one after the other through the
//! real runner (`run_trial`: counters, energy estimate, output readers, RSS
//! sampler, exit waiter), first directly, then wrapped, then `true` bare
//! (`Command::status`, the same `posix_spawn` std uses); rounds alternate so
//! that the machine's noise falls on all three. CPU time is this process's
//! (`CLOCK_PROCESS_CPUTIME_ID`: the runner's threads) plus its children's
//! (`cutime` and `cstime` of `/proc/self/stat`: the wrapper and `true`).
//!
//! `cargo bench -p tunefleet-agent --bench trial` (`TRIALS`, `ROUNDS` to
//! change the 500 trials and 5 rounds).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::time::{clock_gettime, ClockId};
use tunefleet_agent::runner::{run_trial, RunnerConfig, TrialHandle, TrialRun};
use tunefleet_common::measurement::ExitOutcome;
use tunefleet_common::message::TrialSpec;
use tunefleet_common::params::SystemParams;

fn cpu_now() -> Duration {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    let own = Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0));
    // The children's user and system time (cutime, cstime), in clock ticks.
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks: u64 = [13, 14].iter().filter_map(|&i| f.get(i).and_then(|v| v.parse::<u64>().ok())).sum();
    let hz = rustix::param::clock_ticks_per_second().max(1);
    own + Duration::from_micros(ticks * 1_000_000 / hz)
}

#[derive(Default, Clone, Copy)]
struct Tally {
    wall: Duration,
    cpu: Duration,
    trials: u32,
}

impl Tally {
    fn per_s(&self) -> f64 {
        f64::from(self.trials) / self.wall.as_secs_f64()
    }
    fn cpu_us(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / f64::from(self.trials)
    }
}

fn main() {
    let env = |k: &str, d: u32| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (trials, rounds) = (env("TRIALS", 500), env("ROUNDS", 5));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let direct = RunnerConfig::new(PathBuf::from(env!("CARGO_BIN_EXE_tunefleet-agent")));
    let wrapped = RunnerConfig { always_wrap: true, ..direct.clone() };
    let spec = TrialSpec {
        argv: vec!["true".into()],
        env: vec![],
        system: SystemParams::default(),
        timeout_ms: 60_000,
        probe: None,
        gpus: 0,
    };
    let run = TrialRun { spec, cpus: vec![], label: "bench".into(), gpus: vec![] };
    let (mut d, mut w, mut bare) = (Tally::default(), Tally::default(), Tally::default());
    let mut best = [0f64; 3];
    for _ in 0..rounds {
        for (i, cfg) in [(0, &direct), (1, &wrapped)] {
            let (t0, c0) = (Instant::now(), cpu_now());
            for _ in 0..trials {
                let m = rt.block_on(run_trial(cfg, &run, None, TrialHandle::new().1));
                assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
            }
            let t = if i == 0 { &mut d } else { &mut w };
            let round = Tally { wall: t0.elapsed(), cpu: cpu_now() - c0, trials };
            best[i] = best[i].max(round.per_s());
            t.wall += round.wall;
            t.cpu += round.cpu;
            t.trials += trials;
        }
        let (t0, c0) = (Instant::now(), cpu_now());
        for _ in 0..trials {
            assert!(Command::new("true").status().expect("true").success());
        }
        let round = Tally { wall: t0.elapsed(), cpu: cpu_now() - c0, trials };
        best[2] = best[2].max(round.per_s());
        bare.wall += round.wall;
        bare.cpu += round.cpu;
        bare.trials += trials;
    }
    println!("### One trial of `true` at a time, {rounds} rounds of {trials}, alternating\n");
    println!("| start | trials/s (all rounds) | best round | CPU per trial (µs) | trials/s relative to bare process creation |");
    println!("|---|---|---|---|---|");
    for (name, t, b) in [
        ("directly (one exec)", d, best[0]),
        ("through the exec wrapper (two)", w, best[1]),
        ("bare `true` (std Command, no measurement)", bare, best[2]),
    ] {
        println!("| {name} | {:.0} | {b:.0} | {:.0} | {:.2} |", t.per_s(), t.cpu_us(), t.per_s() / bare.per_s());
    }
    println!(
        "\ndirect / wrapped: {:.2}x the trials per second, {:.2}x the CPU per trial",
        d.per_s() / w.per_s(),
        d.cpu_us() / w.cpu_us()
    );
}
