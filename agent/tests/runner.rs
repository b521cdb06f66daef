//! The real runner on real commands: the exec wrapper is the built
//! `tunefleet-agent` binary, workloads are `sh` scripts.

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tunefleet_agent::counters::{HARDWARE_EVENTS, SOFTWARE_EVENTS};
use tunefleet_agent::cpus::{allowed_cpus, choose_cpus};
use tunefleet_agent::runner::{run_trial, RunnerConfig, TrialHandle, TrialRun, MAX_EPOCHS};
use tunefleet_common::measurement::{EnergySourceKind, ExitOutcome, Measurement, MemoryLimit};
use tunefleet_common::message::TrialSpec;
use tunefleet_common::params::SystemParams;

fn config() -> RunnerConfig {
    RunnerConfig::new(PathBuf::from(env!("CARGO_BIN_EXE_tunefleet-agent")))
}

fn spec(argv: &[&str]) -> TrialSpec {
    TrialSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![],
        system: SystemParams::default(),
        timeout_ms: 60_000,
        probe: None,
        gpus: 0,
    }
}

fn sh(script: &str) -> TrialSpec {
    spec(&["sh", "-c", script])
}

async fn run(spec: TrialSpec, cpus: Vec<u32>) -> Measurement {
    let run = TrialRun { spec, cpus, label: "test".into(), gpus: vec![] };
    run_trial(&config(), &run, None, TrialHandle::new().1).await
}

#[tokio::test]
async fn epoch_lines_become_metrics_in_order() {
    let script = r#"
        for i in 1 2 3; do echo "TUNEFLEET epoch=$i loss=0.$i"; done
        echo '{"event":"epoch","epoch":4,"loss":0.05}'
        echo 'some log line'
        echo 'an error line' >&2
    "#;
    let (tx, mut rx) = mpsc::channel(16);
    let run = TrialRun { spec: sh(script), cpus: vec![], label: "t".into(), gpus: vec![] };
    let m = run_trial(&config(), &run, Some(tx), TrialHandle::new().1).await;
    assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    let epochs: Vec<u32> = m.epochs.iter().map(|e| e.epoch).collect();
    assert_eq!(epochs, vec![1, 2, 3, 4]);
    assert_eq!(m.epochs[1].metrics.get("loss"), Some(&0.2));
    assert!(m.epochs.windows(2).all(|w| w[0].elapsed_us <= w[1].elapsed_us));
    // No final line: the last epoch's metrics are final.
    assert_eq!(m.final_metrics.get("loss"), Some(&0.05));
    assert!(m.log_tail.contains("some log line") && m.log_tail.contains("an error line"), "{}", m.log_tail);
    assert!(!m.log_tail.contains("TUNEFLEET"));
    let mut progressed = Vec::new();
    while let Ok(e) = rx.try_recv() {
        assert_eq!(e.profile, None, "no probe plan, no window profile");
        progressed.push(e.metrics.epoch);
    }
    assert_eq!(progressed, vec![1, 2, 3, 4]);
    assert!(m.wall_us > 0);
    assert_eq!(m.energy.source, EnergySourceKind::Estimated);
}

#[tokio::test]
async fn final_line_wins() {
    let m = run(sh("echo 'TUNEFLEET epoch=1 accuracy=0.5'; echo 'TUNEFLEET final accuracy=0.93'"), vec![]).await;
    assert_eq!(m.final_metrics.get("accuracy"), Some(&0.93));
}

#[tokio::test]
async fn exit_codes_and_signals() {
    assert_eq!(run(spec(&["true"]), vec![]).await.exit, ExitOutcome::Exited(0));
    assert_eq!(run(spec(&["false"]), vec![]).await.exit, ExitOutcome::Exited(1));
    assert_eq!(run(sh("exit 3"), vec![]).await.exit, ExitOutcome::Exited(3));
    assert_eq!(run(sh("kill -9 $$"), vec![]).await.exit, ExitOutcome::Signaled(9));
}

#[tokio::test]
async fn missing_program_is_a_spawn_failure() {
    let m = run(spec(&["/nonexistent/tunefleet-test-program"]), vec![]).await;
    match &m.exit {
        ExitOutcome::SpawnFailed(reason) => assert!(reason.contains("nonexistent"), "{reason}"),
        other => panic!("expected SpawnFailed, got {other:?}"),
    }
    assert!(m.counters.is_empty());
    // A plain exit status 127 from the workload is not a spawn failure.
    assert_eq!(run(sh("exit 127"), vec![]).await.exit, ExitOutcome::Exited(127));
    let empty = run(spec(&[]), vec![]).await;
    assert!(matches!(empty.exit, ExitOutcome::SpawnFailed(_)));
}

fn process_gone(pid: &str) -> bool {
    // Gone, or a zombie waiting for an init that does not reap.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("grandchild.pid");
    let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
    let mut s = sh(&script);
    s.timeout_ms = 300;
    let started = std::time::Instant::now();
    let m = run(s, vec![]).await;
    assert_eq!(m.exit, ExitOutcome::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert!(m.wall_us >= 300_000, "wall {}", m.wall_us);
    let pid = std::fs::read_to_string(&pidfile).expect("grandchild pid written");
    let pid = pid.trim();
    // The kill is synchronous, but the kernel finishes tearing down a killed
    // process asynchronously: wait for it under a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !process_gone(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(process_gone(pid), "grandchild {pid} survived");
}

#[tokio::test]
async fn sigterm_ignored_means_sigkill_after_grace() {
    let mut s = sh("trap '' TERM; sleep 30");
    s.timeout_ms = 200;
    let started = std::time::Instant::now();
    let m = run(s, vec![]).await;
    assert_eq!(m.exit, ExitOutcome::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    // Timeout (200 ms) plus the default SIGTERM grace (500 ms) at least.
    assert!(m.wall_us >= 700_000, "wall {}", m.wall_us);
}

#[tokio::test]
async fn cancel_stops_the_trial() {
    let (handle, control) = TrialHandle::new();
    let run = TrialRun { spec: sh("sleep 30"), cpus: vec![], label: "c".into(), gpus: vec![] };
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        handle.cancel();
    });
    let m = run_trial(&config(), &run, None, control).await;
    assert_eq!(m.exit, ExitOutcome::Cancelled);
    assert!(m.wall_us < 10_000_000);
}

#[tokio::test]
async fn a_trial_sigtermed_as_its_agent_stops_is_cancelled_and_one_sigtermed_alone_fails() {
    for agent_stops in [true, false] {
        let (stopping, rx) = tokio::sync::watch::channel(false);
        let mut cfg = config();
        cfg.agent_stopping = Some(rx);
        let run = TrialRun { spec: sh("kill -TERM $$"), cpus: vec![], label: "t".into(), gpus: vec![] };
        // The agent's own SIGTERM comes a moment after its trial's (a batch
        // scheduler signals a job's processes one after the other).
        let agent = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if agent_stops {
                stopping.send_replace(true);
            }
            stopping
        });
        let m = run_trial(&cfg, &run, None, TrialHandle::new().1).await;
        let expected = if agent_stops { ExitOutcome::Cancelled } else { ExitOutcome::Signaled(15) };
        assert_eq!(m.exit, expected, "agent stops: {agent_stops}");
        drop(agent.await);
    }
}

#[tokio::test]
async fn what_the_agent_says_disturbed_a_trial_is_in_its_measurement() {
    use tunefleet_agent::runner::Control;
    let (handle, control) = TrialHandle::new();
    let mut cfg = config();
    cfg.interference_threshold = 0.25;
    handle.send(Control::ForeignLoad(0.1));
    handle.send(Control::ForeignLoad(0.7));
    handle.send(Control::Conditions(vec!["device charging".into()]));
    let run = TrialRun { spec: sh("sleep 0.2"), cpus: vec![], label: "i".into(), gpus: vec![] };
    let m = run_trial(&cfg, &run, None, control).await;
    assert_eq!(m.exit, ExitOutcome::Exited(0));
    assert_eq!(m.interference.len(), 2, "{:?}", m.interference);
    assert!(m.interference[0].contains("reached 0.70"), "{:?}", m.interference);
    assert_eq!(m.interference[1], "device charging");
    let (_, quiet) = TrialHandle::new();
    assert!(run_trial(&cfg, &run, None, quiet).await.interference.is_empty(), "nothing said: nothing flagged");
}

#[tokio::test]
async fn dropping_the_handle_leaves_the_trial_running() {
    let (handle, control) = TrialHandle::new();
    drop(handle);
    let run =
        TrialRun { spec: sh("sleep 0.2; echo 'TUNEFLEET final v=3'"), cpus: vec![], label: "d".into(), gpus: vec![] };
    let m = run_trial(&config(), &run, None, control).await;
    assert_eq!(m.exit, ExitOutcome::Exited(0));
    assert_eq!(m.final_metrics.get("v"), Some(&3.0));
}

#[tokio::test]
async fn one_core_really_pins() {
    let allowed = allowed_cpus();
    let cpus = choose_cpus(&allowed, &[], 1);
    assert_eq!(cpus.len(), 1);
    let mut s = spec(&["grep", "Cpus_allowed_list", "/proc/self/status"]);
    s.system.cores = Some(1);
    let m = run(s, cpus.clone()).await;
    assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    assert_eq!(m.limits.cpus, cpus);
    let line = m.log_tail.lines().find(|l| l.starts_with("Cpus_allowed_list")).expect("grep printed the line");
    assert_eq!(line.split_whitespace().nth(1), Some(cpus[0].to_string().as_str()), "{line}");
}

#[tokio::test]
async fn memory_limit_makes_a_big_allocation_fail() {
    // The shell keeps a 200 MB string in memory.
    let script = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}";
    let mut limited = sh(script);
    limited.system.memory_mib = Some(64);
    let m = run(limited, vec![]).await;
    assert_eq!(m.limits.memory, MemoryLimit::Rlimit { bytes: 64 << 20 }, "no cgroup v2 in the default config");
    assert_ne!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    assert!(!m.log_tail.contains("200000000"), "{}", m.log_tail);

    let free = run(sh(script), vec![]).await;
    assert_eq!(free.exit, ExitOutcome::Exited(0), "{}", free.log_tail);
    assert!(free.log_tail.contains("200000000"), "{}", free.log_tail);
    assert_eq!(free.limits.memory, MemoryLimit::None);
    assert!(free.max_rss_kib > 100_000, "peak rss {} KiB", free.max_rss_kib);
}

#[tokio::test]
async fn threads_set_the_thread_variables() {
    let mut s =
        sh("echo $OMP_NUM_THREADS $MKL_NUM_THREADS $OPENBLAS_NUM_THREADS $RAYON_NUM_THREADS $TUNEFLEET_THREADS $MINE");
    s.system.threads = Some(3);
    s.env = vec![("MINE".into(), "mine".into())];
    let m = run(s, vec![]).await;
    assert_eq!(m.limits.threads, Some(3));
    assert!(m.log_tail.contains("3 3 3 3 3 mine"), "{}", m.log_tail);
}

#[tokio::test]
async fn counters_measure_a_busy_loop() {
    let m = run(sh("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"), vec![]).await;
    assert_eq!(m.exit, ExitOutcome::Exited(0));
    assert!(m.user_us + m.sys_us > 0, "cpu time");
    assert!(m.energy.joules > 0.0);
    let task_clock = m.counters.iter().find(|c| c.event.starts_with("task-clock")).expect("task-clock measured");
    assert!(task_clock.value > 0 && task_clock.time_enabled_ns > 0);
    for event in SOFTWARE_EVENTS.iter().chain(HARDWARE_EVENTS.iter()) {
        let measured = m.counters.iter().filter(|c| c.event.trim_end_matches(":u") == *event).count();
        let missing: Vec<_> = m.counters_missing.iter().filter(|c| c.event == *event).collect();
        assert_eq!(measured + missing.len(), 1, "{event} is either measured or missing");
        assert!(missing.iter().all(|c| !c.reason.is_empty()), "{event} missing without a reason");
    }
}

/// Runs only where the kernel exposes no hardware counters (like the CI
/// machine); elsewhere the general test above covers both cases.
#[tokio::test]
async fn hardware_counters_missing_here_have_a_reason() {
    let m = run(spec(&["true"]), vec![]).await;
    if m.counters.iter().any(|c| c.kind == tunefleet_common::measurement::CounterKind::Hardware) {
        return;
    }
    for event in HARDWARE_EVENTS {
        let missing = m.counters_missing.iter().find(|c| c.event == event).expect("listed as missing");
        let errnos = ["ENOENT", "EOPNOTSUPP", "ENOSYS", "ENODEV", "EACCES"];
        assert!(errnos.iter().any(|e| missing.reason.contains(e)), "{}", missing.reason);
    }
}

#[tokio::test]
async fn output_flood_stays_bounded() {
    let script = "head -c 20000000 /dev/zero | tr '\\0' x; echo; yes 'a log line' | head -n 200000; \
                  seq 1 3000 | sed 's/.*/TUNEFLEET epoch=& loss=1/'";
    let m = run(sh(script), vec![]).await;
    assert_eq!(m.exit, ExitOutcome::Exited(0));
    assert!(m.log_tail.len() <= 8 * 1024, "tail {} bytes", m.log_tail.len());
    assert!(m.log_tail.lines().count() <= 50);
    assert_eq!(m.epochs.len(), MAX_EPOCHS);
    assert!(m.log_tail.contains("not kept"), "{}", m.log_tail);
}

/// The `/proc` scan for the peak RSS ran on the agent's only
/// runtime thread, which also drives MQTT: a slow `/proc` stalled both. Here
/// reading `/proc` blocks for good (a FIFO no one writes), and the trial
/// must still end on a current-thread runtime.
#[test]
fn regression_a_blocking_proc_scan_does_not_stall_the_runtime() {
    let proc_root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(proc_root.path().join("1")).expect("mkdir");
    let fifo = proc_root.path().join("1").join("stat");
    rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, rustix::fs::Mode::RUSR, 0).expect("mkfifo");
    let mut cfg = config();
    cfg.proc_root = proc_root.path().to_path_buf();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let run =
            TrialRun { spec: sh("echo TUNEFLEET final loss=0.5"), cpus: vec![], label: "blocked".into(), gpus: vec![] };
        let m = rt.block_on(run_trial(&cfg, &run, None, TrialHandle::new().1));
        let _ = done.send(m);
    });
    let m = finished.recv_timeout(Duration::from_secs(30)).expect("the trial ends while /proc blocks");
    assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    assert_eq!(m.final_metrics.get("loss"), Some(&0.5));
    assert_eq!(m.max_rss_kib, 0, "no sample could be taken");
    // Let the sampling thread go, if it got as far as the fifo (a trial
    // started directly may end before its first sample): a writer that
    // does not wait for a reader.
    use std::os::unix::fs::OpenOptionsExt;
    let nonblock = rustix::fs::OFlags::NONBLOCK.bits() as i32;
    let _ = std::fs::OpenOptions::new().write(true).custom_flags(nonblock).open(&fifo);
}

/// A configuration sent to a running trial (the coordinator's
/// Reconfigure) re-pins it live and starts a segment of its own.
#[tokio::test]
async fn a_reconfigured_trial_is_re_pinned_while_it_runs() {
    if allowed_cpus().len() < 2 {
        eprintln!("skipped: needs 2 CPUs");
        return;
    }
    // The workload waits until it runs on one CPU: only the live change ends it.
    let script = r#"
        echo "TUNEFLEET epoch=1 cpus=$(nproc)"
        while [ "$(nproc)" != 1 ]; do sleep 0.01; done
        echo "TUNEFLEET epoch=2 cpus=$(nproc)"
    "#;
    let mut s = sh(script);
    s.timeout_ms = 30_000;
    let (tx, mut rx) = mpsc::channel(16);
    let (handle, control) = TrialHandle::new();
    let run = TrialRun { spec: s, cpus: vec![], label: "reconf".into(), gpus: vec![] };
    let cfg = config();
    let trial = run_trial(&cfg, &run, Some(tx), control);
    let steer = async {
        let first = rx.recv().await.expect("epoch 1");
        assert_eq!(first.metrics.metrics.get("cpus"), Some(&(allowed_cpus().len() as f64)));
        let one = SystemParams { cores: Some(1), ..SystemParams::default() };
        let role = tunefleet_common::measurement::SegmentRole::Reconfigured;
        assert!(handle.send(tunefleet_agent::runner::Control::Apply(one, role)));
    };
    let (m, ()) = tokio::join!(trial, steer);
    assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    assert_eq!(m.epochs[1].metrics.get("cpus"), Some(&1.0));
    let roles: Vec<_> = m.segments.iter().map(|s| (s.role, s.cpus.len())).collect();
    use tunefleet_common::measurement::SegmentRole;
    assert_eq!(roles, vec![(SegmentRole::Initial, 0), (SegmentRole::Reconfigured, 1)], "{:?}", m.segments);
    assert_eq!(m.segments[1].system.cores, Some(1));
}

/// A pipelined trial profiles its first window (counters and
/// `/proc`), sends the profile with the next epoch's progress and keeps it
/// in the measurement; a configuration reused from similar jobs ends the
/// probing in a `Reused` segment.
#[tokio::test]
async fn the_first_window_is_profiled_and_a_reused_configuration_ends_probing() {
    use tunefleet_common::measurement::SegmentRole;
    use tunefleet_common::message::{ProbePlan, Select, WindowUnit};
    // Each epoch reads and writes a little through syscalls; epoch 3 waits
    // for the test's go (a marker file), so the reuse lands before probing
    // ends; epoch 2 waits until the test has the warm-up's progress (the
    // first window's counts are taken from then: under load the agent
    // could read the warm-up's line after epoch 2's reading, and see none).
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    let window = dir.path().join("window");
    let script = format!(
        r#"
        for i in 1 2 3 4 5; do
            if [ $i = 2 ]; then while [ ! -e {window} ]; do sleep 0.01; done; fi
            head -c 65536 /dev/zero > /dev/null
            if [ $i = 3 ]; then while [ ! -e {go} ]; do sleep 0.01; done; fi
            echo "TUNEFLEET epoch=$i loss=0.$i"
        done
    "#,
        go = go.display(),
        window = window.display()
    );
    let mut s = sh(&script);
    s.timeout_ms = 30_000;
    let configs = vec![
        SystemParams { threads: Some(1), ..SystemParams::default() },
        SystemParams { threads: Some(2), ..SystemParams::default() },
        SystemParams { threads: Some(3), ..SystemParams::default() },
    ];
    s.system = configs[0].clone();
    s.probe = Some(ProbePlan {
        configs: configs.clone(),
        window: 1,
        warmup: 1,
        unit: WindowUnit::Epochs,
        select: Select::Time,
        control: false,
        from_best: false,
    });
    let (tx, mut rx) = mpsc::channel(16);
    let (handle, control) = TrialHandle::new();
    let run = TrialRun { spec: s, cpus: vec![], label: "profiled".into(), gpus: vec![] };
    let cfg = config();
    let trial = run_trial(&cfg, &run, Some(tx), control);
    let reused = SystemParams { threads: Some(3), ..SystemParams::default() };
    let steer = async {
        let warmup = rx.recv().await.expect("epoch 1");
        assert_eq!(warmup.metrics.epoch, 1);
        assert!(warmup.profile.is_none(), "the warm-up (the start-up) is not what a job is recognised by");
        std::fs::write(&window, b"").expect("window");
        let first = rx.recv().await.expect("epoch 2");
        assert_eq!(first.metrics.epoch, 2);
        let wp = first.profile.expect("the first probe window closed at epoch 2: its profile comes with it");
        assert_eq!(wp.system, configs[0]);
        assert_eq!(wp.epochs, 1);
        assert!(wp.profile.get("log2_threads").is_some(), "{:?}", wp.profile);
        assert!(wp.profile.get("log_io_kib_per_s").is_some_and(|v| v > 0.0), "{:?}", wp.profile);
        assert!(wp.profile.get("cpus_busy").is_some(), "task-clock is a software counter");
        assert!(handle.send(tunefleet_agent::runner::Control::Apply(reused.clone(), SegmentRole::Reused)));
        // The change is applied at once; then epoch 3 may end.
        std::fs::write(&go, b"").expect("go");
        let mut later = Vec::new();
        while let Some(r) = rx.recv().await {
            later.push(r.profile.is_some());
        }
        assert!(later.iter().all(|p| !p), "the profile is sent once");
        wp.profile
    };
    let (m, sent) = tokio::join!(trial, steer);
    assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    let kept = m.window_profile.as_ref().expect("the measurement keeps the window profile");
    assert_eq!(kept.profile, sent);
    let roles: Vec<_> = m.segments.iter().map(|s| s.role).collect();
    assert_eq!(roles, vec![SegmentRole::Warmup, SegmentRole::Probe, SegmentRole::Reused], "{:?}", m.segments);
    assert_eq!(m.segments[1].system, configs[0], "the first probe window: the base every job ran");
    assert_eq!(m.segments[2].system, reused);
    assert_eq!(m.segments[2].last_epoch, 5);
}

fn task_clock_ns(m: &Measurement) -> u64 {
    m.counters.iter().find(|c| c.event.starts_with("task-clock")).map_or(0, |c| c.value)
}

/// A trial without a memory limit is started directly (one exec)
/// by a thread whose counters the workload inherits. They count its whole
/// tree (here the busy loop runs in a grandchild) about as the exec
/// wrapper's counters do, and two trials started at once count only their
/// own processes.
#[tokio::test]
async fn direct_and_wrapped_starts_count_the_same_tree_and_only_it() {
    let busy = "sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done'";
    let direct = run(sh(busy), vec![]).await;
    let mut wrapped_cfg = config();
    wrapped_cfg.always_wrap = true;
    let run_wrapped = TrialRun { spec: sh(busy), cpus: vec![], label: "wrapped".into(), gpus: vec![] };
    let wrapped = run_trial(&wrapped_cfg, &run_wrapped, None, TrialHandle::new().1).await;
    for m in [&direct, &wrapped] {
        assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    }
    let (d, w) = (task_clock_ns(&direct), task_clock_ns(&wrapped));
    if d == 0 && w == 0 {
        eprintln!("skipped: no task-clock counter here");
        return;
    }
    // task-clock counts the grandchild's loop: at least most of the CPU
    // time the workload's leader and the children it waited for used.
    let cpu_ns = (direct.user_us + direct.sys_us) * 1000;
    assert!(d as f64 >= 0.5 * cpu_ns as f64, "direct task-clock {d} ns against {cpu_ns} ns of CPU time");
    let ratio = d as f64 / w as f64;
    assert!((0.33..3.0).contains(&ratio), "direct {d} ns, wrapped {w} ns");

    // Side by side: a busy trial and an idle one started together.
    let cfg = config();
    let (busy_run, idle_run) = (
        TrialRun { spec: sh(busy), cpus: vec![], label: "busy".into(), gpus: vec![] },
        TrialRun { spec: spec(&["sleep", "0.3"]), cpus: vec![], label: "idle".into(), gpus: vec![] },
    );
    let (b, i) = tokio::join!(
        run_trial(&cfg, &busy_run, None, TrialHandle::new().1),
        run_trial(&cfg, &idle_run, None, TrialHandle::new().1)
    );
    let (b, i) = (task_clock_ns(&b), task_clock_ns(&i));
    assert!(i * 10 < b, "the idle trial counted {i} ns, the busy one {b} ns");
}

/// A process that escaped the trial's group (`setsid`) keeps its output pipe
/// open: the trial still ends one output grace after its exit, and the
/// task reading that pipe is stopped with it rather than left waiting.
#[tokio::test]
async fn output_held_open_by_an_escaped_process_ends_with_the_grace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("escaped.pid");
    let script = format!("echo before; setsid sh -c 'echo $$ > {}; exec sleep 30' & sleep 0.2", pidfile.display());
    let mut cfg = config();
    cfg.output_grace = Duration::from_millis(300);
    let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let started = std::time::Instant::now();
    let run = TrialRun { spec: sh(&script), cpus: vec![], label: "escaped".into(), gpus: vec![] };
    let m = run_trial(&cfg, &run, None, TrialHandle::new().1).await;
    let took = started.elapsed();
    let pid = std::fs::read_to_string(&pidfile).expect("the escaped process wrote its pid");
    let kill_escaped = || {
        let _ = std::process::Command::new("kill").arg(pid.trim()).status();
    };
    assert_eq!(m.exit, ExitOutcome::Exited(0), "{}", m.log_tail);
    assert!(m.log_tail.contains("before"), "{}", m.log_tail);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    // Aborted tasks are released on the runtime's next turns.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while tokio::runtime::Handle::current().metrics().num_alive_tasks() > tasks {
        if std::time::Instant::now() > deadline {
            kill_escaped();
            panic!("a reader task outlived its trial");
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Still holding the pipe until now.
    kill_escaped();
}
