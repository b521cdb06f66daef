//! A failed trial says why wherever a user looks (the
//! coordinator's log, the summary, `best`, the exit status), a trial
//! without the objective names the metric expected and the metrics seen,
//! and `check` warns about parameters nothing uses. Real coordinator and
//! agent processes, a real Python workload.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunefleet_tests::*;

/// A grid study of `trials` trials over `x` (1..=trials) running `command`
/// (a TOML array), one attempt each, maximising `metric`.
fn study(dir: &Path, name: &str, command: &str, metric: &str, trials: u32) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(
        &p,
        format!(
            "name = \"{name}\"\ncommand = {command}\ntimeout = 60\nmax_attempts = 1\n\
             [objective]\nmetric = \"{metric}\"\ndirection = \"maximize\"\n[budget]\ntrials = {trials}\n\
             [strategy]\nkind = \"grid\"\n[hyper.x]\nkind = \"int\"\nlow = 1\nhigh = {trials}\n"
        ),
    )
    .expect("study file");
    p
}

use tunefleet_tests::run_study_logged as run_study;

#[test]
fn a_crashing_workload_says_why_in_the_log_the_summary_best_and_the_exit_status() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let command =
        r#"["python3", "-c", "import sys; print('loading', sys.argv[1]); import tunefleet_no_such_module", "{x}"]"#;
    let study = study(dir.path(), "crash", command, "score", 3);
    let (code, out, log) = run_study(dir.path(), &study, &store, "crash");
    let cause = "exit 1, `ModuleNotFoundError: No module named 'tunefleet_no_such_module'`";
    // Nothing succeeded: exit status 4, and main says so on stderr.
    assert_eq!(code, Some(4), "{out}\n{log}");
    assert!(log.contains("study crash: no trial succeeded: 3 trials failed: exit 1"), "{log}");
    // The summary groups the three failures under their one cause.
    assert!(out.contains("0/3 trials done, 3 failed"), "{out}");
    assert!(out.contains(&format!("3 trials failed: {cause}")), "{out}");
    // The coordinator's log names each failed trial with its cause.
    assert_eq!(log.matches("trial failed").count(), 3, "{log}");
    assert!(log.lines().any(|l| l.contains("trial failed") && l.contains("No module named")), "{log}");
    // `best` says why there is nothing to rank.
    let (code, _, err) = tunefleet(&["best", "crash", "--store", store.to_str().expect("utf-8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no successful trial") && err.contains(cause), "{err}");
    // `status` and the report say it too, with the same counts as the summary.
    let (code, out, err) = tunefleet(&["status", "--store", store.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("crash finished: 0/3 done, 0 running, 0 held ahead, 0 pending, 3 failed, 0 stopped"),
        "{out}"
    );
    assert!(out.contains(&format!("3 trials failed: {cause}")), "{out}");
    let page = dir.path().join("crash.html");
    let page_arg = page.to_str().expect("utf-8");
    let (code, _, err) = tunefleet(&["report", "crash", "-o", page_arg, "--store", store.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    let html = std::fs::read_to_string(&page).expect("report");
    assert!(
        html.contains("<span id=\"counts\">0/3 done, 0 running, 0 held ahead, 0 pending, 3 failed, 0 stopped</span>"),
        "{html}"
    );
    assert!(
        html.contains("No module named &#39;tunefleet_no_such_module&#39;")
            || html.contains("No module named 'tunefleet_no_such_module'"),
        "the report says why"
    );
    // A study that does not exist: the store and its studies are named.
    let (code, _, err) = tunefleet(&["best", "nosuch", "--store", store.to_str().expect("utf-8")]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no study \"nosuch\"") && err.contains("its studies: crash"), "{err}");
}

#[test]
fn some_failures_and_nothing_ranked_exit_5_and_a_missing_objective_names_what_was_expected_and_seen() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    // Trial x=2 fails with a message; the others report `acc`, not `score`.
    let command = r#"["sh", "-c", "if [ {x} = 2 ]; then echo 'out of memory' >&2; exit 3; fi; echo 'TUNEFLEET final acc=0.{x}'"]"#;
    let study = study(dir.path(), "mixed", command, "score", 3);
    let (code, out, log) = run_study(dir.path(), &study, &store, "mixed");
    // Nothing is ranked: that is what a script must hear first.
    assert_eq!(code, Some(5), "nothing ranked\n{out}\n{log}");
    assert!(out.contains("2/3 trials done, 1 failed"), "{out}");
    assert!(out.contains("1 trial failed: exit 3, `out of memory`"), "{out}");
    assert!(out.contains("the objective `score` was expected; they reported acc"), "{out}");
    assert!(log.contains("2 trials succeeded but none reported \"score\""), "{log}");
    assert!(log.contains("trial reported no value for the objective"), "{log}");
}

#[test]
fn check_warns_about_a_parameter_nothing_uses() {
    let dir = tempfile::tempdir().expect("tmp");
    let unused = study(dir.path(), "unused", r#"["true"]"#, "score", 2);
    let (code, out, err) = tunefleet(&["check", unused.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("unused: 2 trials"), "{out}");
    assert!(err.contains("warning: study unused: parameter `x` is used nowhere"), "{err}");
    let used = study(dir.path(), "used", r#"["echo", "{x}"]"#, "score", 2);
    let (code, _, err) = tunefleet(&["check", used.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn a_wildcard_listen_prints_an_address_agents_can_dial() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = study(dir.path(), "wild", r#"["sh", "-c", "echo TUNEFLEET final score=0.{x}"]"#, "score", 2);
    let root = unique_root("wild");
    let (mut coord, url) =
        start_coordinator(&study, &store, &root, &["--listen", "0.0.0.0:0", "--broker-open-to-network"]);
    // `mqtt://0.0.0.0:PORT` is no address an agent (on another machine) can use.
    assert!(!url.contains("0.0.0.0"), "{url}");
    let name = format!("{root}-agent");
    let agent = start_agent(&url, &name, &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert_eq!(status.code(), Some(0), "{out}");
    assert!(out.contains("2/2 trials done"), "{out}");
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}

#[test]
fn a_larger_budget_continues_a_finished_study_and_anything_else_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let command = r#"["sh", "-c", "echo TUNEFLEET final score=0.{x}"]"#;
    // A random search over x in 1..=9: its budget, not its space, says how many trials.
    let first = study(dir.path(), "grow", command, "score", 9);
    let text = std::fs::read_to_string(&first).expect("read");
    let text = text.replace("trials = 9", "trials = 2").replace("kind = \"grid\"", "kind = \"random\"\nseed = 7");
    std::fs::write(&first, text).expect("write");
    let (code, out, log) = run_study(dir.path(), &first, &store, "grow");
    assert_eq!(code, Some(0), "{out}\n{log}");
    assert!(out.contains("2/2 trials done"), "{out}");
    // The same file with `trials = 4`.
    let text = std::fs::read_to_string(&first).expect("read").replace("trials = 2", "trials = 4");
    std::fs::write(&first, text).expect("write");
    let (code, out, log) = run_study(dir.path(), &first, &store, "grow2");
    assert_eq!(code, Some(0), "{out}\n{log}");
    assert!(out.contains("4/4 trials done"), "{out}");
    assert!(log.contains("study continues under its changed file") && log.contains("budget.trials: 2 -> 4"), "{log}");
    // The first two trials ran once: continued, not started over.
    let attempts = query(&store, "SELECT COUNT(*) FROM attempts WHERE study = 'grow'", |r| r.get::<_, i64>(0));
    assert_eq!(attempts, vec![4], "{out}");
    // A change of what trials compute is refused as a usage error, naming
    // each value that differs.
    let text = std::fs::read_to_string(&first)
        .expect("read")
        .replace("kind = \"random\"\nseed = 7", "kind = \"random\"\nseed = 8");
    std::fs::write(&first, text).expect("write");
    let (code, out, err) = tunefleet(&[
        "run",
        first.to_str().expect("utf-8"),
        "--store",
        store.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(err.contains("(strategy.seed: 7 -> 8)"), "{err}");
}

/// The trials of `study` in `store` that are done.
fn done(store: &Path, study: &str) -> i64 {
    query(store, &format!("SELECT COUNT(*) FROM trials WHERE study = '{study}' AND state = 'done'"), |r| r.get(0))
        .first()
        .copied()
        .unwrap_or(0)
}

#[test]
fn counts_agree_and_an_interrupted_run_says_how_to_resume() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let store_arg = store.to_str().expect("utf-8").to_string();
    let command = r#"["sh", "-c", "sleep 0.4; echo TUNEFLEET final score=0.{x}"]"#;
    // A random search of 6 trials: its budget, not the trials made so far, is the total.
    let path = study(dir.path(), "halt", command, "score", 9);
    let text = std::fs::read_to_string(&path).expect("read");
    let text = text.replace("trials = 9", "trials = 6").replace("kind = \"grid\"", "kind = \"random\"\nseed = 3");
    std::fs::write(&path, text).expect("write");
    let root = unique_root("halt");
    let log = dir.path().join("halt.log");
    let (mut coord, url) = start_coordinator_logged(&path, &store, &root, &[], Some(&log));
    let name = format!("{root}-agent");
    let agent = start_agent(&url, &name, &root, &["--slots", "1"]);
    wait_for("two trials done", Duration::from_secs(60), || done(&store, "halt") >= 2);
    // While it runs: the budget as the total, the coordinator seen.
    let (code, out, err) = tunefleet(&["status", "--store", &store_arg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("halt running: ") && out.contains("/6 done") && out.contains("1 agents online"), "{out}");
    coord.signal("INT");
    let status = coord.wait_exit(Duration::from_secs(60));
    let stdout = coord.rest_of_stdout().join("\n");
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(130), "{stdout}\n{log}");
    let finished = done(&store, "halt");
    assert!(finished < 6, "interrupted before the end: {stdout}");
    assert!(stdout.contains(&format!("study halt: {finished}/6 trials done")), "{stdout}");
    let said = format!("interrupted: study halt: {finished} of 6 trials done; run the same command to resume");
    assert!(log.contains(&said), "{log}");
    // The coordinator is gone: `status` says so, and how to go on.
    let (_, out, _) = tunefleet(&["status", "--store", &store_arg]);
    assert!(out.starts_with(&format!("halt interrupted: {finished}/6 done")), "{out}");
    assert!(out.contains("no coordinator running (last seen") && out.contains("run the same command"), "{out}");
    // The same command resumes and finishes; once more, there is nothing to do.
    let (mut coord, _) = start_coordinator(&path, &store, &root, &["--listen", url.trim_start_matches("mqtt://")]);
    assert_eq!(coord.wait_exit(Duration::from_secs(120)).code(), Some(0));
    assert!(coord.rest_of_stdout().join("\n").contains("study halt: 6/6 trials done"));
    let (mut again, _) = start_coordinator(&path, &store, &root, &[]);
    assert_eq!(again.wait_exit(Duration::from_secs(60)).code(), Some(0));
    let out = again.rest_of_stdout().join("\n");
    assert!(out.contains("study halt: 6/6 trials done, 0 failed (finished before this run: nothing to do)"), "{out}");
    let (_, out, _) = tunefleet(&["status", "--store", &store_arg]);
    assert!(out.starts_with("halt finished: 6/6 done") && !out.contains("trials/min"), "{out}");
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}

#[test]
fn an_unreachable_broker_is_reported_once_with_its_url_and_what_it_means() {
    let dir = tempfile::tempdir().expect("tmp");
    let closed = tunefleet_tests::ports::ClosedPort::new();
    let url = format!("mqtt://127.0.0.1:{}", closed.port);
    let log = dir.path().join("agent.log");
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.args(["--broker", &url, "--name", "lonely", "--trust-first-coordinator"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("TUNEFLEET_LOG", "warn,tunefleet_agent::transport=debug")
        .stderr(std::fs::File::create(&log).expect("log file"));
    let agent = Proc::spawn("lonely", cmd);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    // Several attempts fail (retried at 100 ms, doubling)...
    wait_for("four failed attempts", Duration::from_secs(30), || {
        read().matches("broker connection failed").count() >= 4
    });
    drop(agent);
    let text = read();
    // ...and one of them is a warning: the URL it tried and what a refusal means.
    let warnings: Vec<&str> =
        text.lines().filter(|l| l.contains(" WARN ") && l.contains("broker connection failed")).collect();
    assert_eq!(warnings.len(), 1, "{text}");
    assert!(warnings[0].contains(&format!("broker={url}")), "{text}");
    assert!(warnings[0].contains("nothing listens there"), "{text}");
    assert!(text.contains("broker connection failed again"), "{text}");
}

/// `text` without ANSI escape sequences (CSI `ESC [ ... letter`, and a lone `ESC x`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.peek() == Some(&'[') {
            chars.next();
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() || d == '~' {
                    break;
                }
            }
        } else {
            chars.next();
        }
    }
    out
}

#[test]
fn on_a_terminal_log_lines_print_above_the_bar_and_an_interrupted_bar_stays_where_it_was() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let study = study(dir.path(), "tty", r#"["sh", "-c", "sleep 0.3; echo TUNEFLEET final score=0.{x}"]"#, "score", 6);
    let root = unique_root("tty");
    join_root(&root, &store);
    let port = free_port();
    let typescript = dir.path().join("typescript");
    // The coordinator on a pseudo-terminal (util-linux `script`), its bar on.
    let inner = format!(
        "{} run {} --store {} --root {root} --listen 127.0.0.1:{port}",
        bin("tunefleet").display(),
        study.display(),
        store.display()
    );
    let mut script = Command::new("script");
    script.args(["-qfec", &inner]).arg(&typescript).env("XDG_STATE_HOME", state_home()).env("TERM", "xterm");
    let mut pty = Proc::spawn("pty", script);
    wait_for_port(port, Duration::from_secs(30));
    let name = format!("{root}-agent");
    let agent = start_agent(&format!("mqtt://127.0.0.1:{port}"), &name, &root, &["--slots", "1"]);
    let done = || {
        query(&store, "SELECT COUNT(*) FROM trials WHERE study = 'tty' AND state = 'done'", |r| r.get::<_, i64>(0))
            .first()
            .copied()
            .unwrap_or(0)
    };
    wait_for("two trials done", Duration::from_secs(60), || done() >= 2);
    // Ctrl-C to the coordinator itself (the child of `script`).
    // `script` runs the command through a shell, which may exec it or not.
    let under = |pid: u32| children(pid).into_iter().chain(children(pid).into_iter().flat_map(|(c, _)| children(c)));
    let coordinator = under(pty.child.id())
        .find(|(_, comm)| comm.starts_with("tunefleet"))
        .map(|(pid, _)| pid)
        .expect("the coordinator under script");
    let kill = Command::new("kill").args(["-INT", &coordinator.to_string()]).status().expect("kill");
    assert!(kill.success());
    pty.wait_exit(Duration::from_secs(60));
    let raw = std::fs::read_to_string(&typescript).expect("typescript");
    let screen = strip_ansi(&raw);
    // Every log line starts a line of its own: none glued to a bar's text.
    let logs: Vec<&str> = screen.split(['\n', '\r']).filter(|l| l.contains(" INFO ") || l.contains(" WARN ")).collect();
    assert!(!logs.is_empty(), "the coordinator logged while the bar was drawn:\n{screen}");
    for l in &logs {
        assert!(l.starts_with("20"), "a log line glued to the bar: {l:?}\n{screen}");
    }
    // The last bar drawn shows what was done, not a full bar.
    let finished = done();
    let last_bar = screen.rmatch_indices("/6 trials").next().map(|(i, _)| &screen[..i]).expect("a bar");
    let shown: String =
        last_bar.chars().rev().take_while(|c| c.is_ascii_digit()).collect::<String>().chars().rev().collect();
    assert!(
        shown.parse::<i64>().is_ok_and(|n| n < 6 && n <= finished),
        "bar at {shown}/6 with {finished} done:\n{screen}"
    );
    assert!(screen.contains("run the same command to resume"), "{screen}");
    // Resumed without a terminal: it finishes, and the agent's spool drains.
    let listen = format!("127.0.0.1:{port}");
    let (mut again, _) = start_coordinator(&study, &store, &root, &["--listen", &listen]);
    assert_eq!(again.wait_exit(Duration::from_secs(120)).code(), Some(0));
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}

/// `run` exited 0 when no trial reported the
/// objective, while "every trial crashed" exits 4: a script could not tell
/// either from success.
#[test]
fn regression_a_study_whose_trials_never_report_the_objective_exits_5() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let command = r#"["sh", "-c", "echo TUNEFLEET final other={x}"]"#;
    let study = study(dir.path(), "unranked", command, "score", 2);
    let (code, out, log) = run_study(dir.path(), &study, &store, "unranked");
    assert_eq!(code, Some(5), "{out}\n{log}");
    assert!(out.contains("2/2 trials done"), "{out}");
    assert!(log.contains("none reported \"score\": nothing is ranked"), "{log}");
}

#[test]
fn some_failures_with_the_others_ranked_exit_3() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let command = r#"["sh", "-c", "if [ {x} = 2 ]; then echo 'out of memory' >&2; exit 3; fi; echo 'TUNEFLEET final score=0.{x}'"]"#;
    let study = study(dir.path(), "ranked", command, "score", 3);
    let (code, out, log) = run_study(dir.path(), &study, &store, "ranked");
    assert_eq!(code, Some(3), "finished with failures\n{out}\n{log}");
    assert!(log.contains("finished with failures: 1 trial failed: exit 3"), "{log}");
}

/// Before, a study whose every trial failed ran its whole budget (100
/// trials of an import error). Now a run stops once its first trials all
/// failed, says why, exits 4, and the same command goes on once fixed.
#[test]
fn a_study_whose_first_trials_all_fail_stops_early_and_goes_on_once_fixed() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let data = dir.path().join("data.csv");
    let command = format!(
        r#"["sh", "-c", "if [ ! -f {} ]; then echo 'no such file: data.csv' >&2; exit 3; fi; echo '{{{{\"event\":\"final\",\"score\":'$0'}}}}'", "{{x}}"]"#,
        data.display()
    );
    let trials = 30;
    let study = study(dir.path(), "ff", &command, "score", trials);
    let (code, out, log) = run_study(dir.path(), &study, &store, "ff-1");
    assert_eq!(code, Some(4), "{out}\n{log}");
    assert!(log.contains("study ff stopped early: its first 5 trials failed and none succeeded"), "{log}");
    assert!(log.contains("no such file: data.csv"), "the cause: {log}");
    let attempted: Vec<i64> = query(&store, "SELECT COUNT(*) FROM attempts", |r| r.get(0));
    assert!(attempted[0] < 12, "{} attempts of a study whose first 5 failed", attempted[0]);
    let created: Vec<i64> = query(&store, "SELECT COUNT(*) FROM trials", |r| r.get(0));
    // Fixed (the data is there), the same command goes on and runs the rest.
    std::fs::write(&data, "x\n").expect("data");
    let (code, out, log) = run_study(dir.path(), &study, &store, "ff-2");
    assert_eq!(code, Some(3), "it finished, with the first run's failures: {out}\n{log}");
    let done: Vec<i64> = query(&store, "SELECT COUNT(*) FROM results WHERE success = 1", |r| r.get(0));
    assert_eq!(done[0], i64::from(trials) - created[0], "the trials the first run never made: {out}");
}

/// Before, a study no agent could run waited silently for ever (`0/16
/// done, 0 running, 3 pending, 1 agents online`).
#[test]
fn a_study_no_online_agent_can_run_says_what_each_lacks_within_10_s() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("waits");
    let study = sleep_study(dir.path(), "waits", 4, 0.1);
    let text = std::fs::read_to_string(&study).expect("study");
    std::fs::write(&study, format!("gpus = 1\n{text}[selector]\narch = [\"riscv64\"]\n")).expect("study");
    let log = dir.path().join("waits.log");
    let (_coord, url) = start_coordinator_logged(&study, &store, &root, &[], Some(&log));
    let name = format!("{root}-cpu");
    let _agent = start_agent(&url, &name, &root, &[]);
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("the coordinator to say why the study waits", Duration::from_secs(10), || said().contains("study waits"));
    let line = said().lines().find(|l| l.contains("study waits")).map(str::to_string).unwrap_or_default();
    assert!(line.contains(&format!("{name} lacks arch riscv64 (it is {})", std::env::consts::ARCH)), "{line}");
    assert!(line.contains("1 GPU(s) a trial (it was granted 0)"), "{line}");
    // `status` says it too, from the coordinator's heartbeat.
    let s = store.to_str().expect("utf-8");
    wait_for("status to say why the study waits", Duration::from_secs(10), || {
        tunefleet(&["status", "--store", s]).1.contains("  waits: no online agent can run its trials")
    });
    assert_agents_spools_empty(&[&name]);
}
