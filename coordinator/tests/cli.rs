//! The `tunefleet` binary as a user runs it: what it prints, and what it
//! logs to standard error when that is not a terminal (a file, a pipe,
//! journald): plain text, no colour codes; its `--json`, and the completion
//! scripts and man pages it generates, taken by bash and `man`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};
use tunefleet_common::message::TrialRef;
use tunefleet_coordinator::domain::{search, study};
use tunefleet_coordinator::runtime::engine::open_study;
use tunefleet_coordinator::store::Store;

fn study_text(metric: &str) -> String {
    format!(
        "name = \"plain\"\ncommand = [\"true\", \"{{x}}\"]\n[objective]\nmetric = \"{metric}\"\n\
         direction = \"minimize\"\n[budget]\ntrials = 4\n[strategy]\nkind = \"grid\"\n[hyper.x]\n\
         kind = \"int\"\nlow = 1\nhigh = 4\n"
    )
}

/// `tunefleet ARGS`: its standard output, once it succeeded.
fn tunefleet<S: AsRef<OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tunefleet"))
        .args(args)
        .env_remove("TUNEFLEET_STORE")
        .stdin(Stdio::null())
        .output()
        .expect("tunefleet runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tunefleet best plain ARGS --store PATH`: its standard output, once it succeeded.
fn best(args: &[&str], store: &Path) -> String {
    let store = ["--store".as_ref(), store.as_os_str()];
    tunefleet(["best", "plain"].iter().map(OsStr::new).chain(args.iter().map(OsStr::new)).chain(store))
}

/// `field` of each element of the JSON array `list`.
fn column(list: &serde_json::Value, field: &str) -> serde_json::Value {
    list.as_array().unwrap_or_else(|| panic!("not a list: {list}")).iter().map(|x| x[field].clone()).collect()
}

/// `tunefleet ARGS --store PATH --json`, parsed.
fn json(args: &[&str], store: &Path) -> serde_json::Value {
    let text = tunefleet(args.iter().map(OsStr::new).chain(["--json".as_ref(), "--store".as_ref(), store.as_os_str()]));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The coordinator coloured its log even into a file or journald.
#[test]
fn regression_log_into_a_pipe_has_no_ansi_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let study = dir.path().join("s.toml");
    std::fs::write(&study, study_text("wall_time")).expect("write study");
    // The embedded broker starts (and logs that at info), then the store
    // cannot be created: the run ends at once, after one log line.
    let store = dir.path().join("missing-dir").join("t.db");
    let out = Command::new(env!("CARGO_BIN_EXE_tunefleet"))
        .arg("run")
        .arg(&study)
        .args(["--listen", "127.0.0.1:0", "--quiet", "--store"])
        .arg(&store)
        .env_remove("TUNEFLEET_LOG")
        .env_remove("TUNEFLEET_STORE")
        .env_remove("TUNEFLEET_BROKER")
        .stdin(Stdio::null())
        .output()
        .expect("tunefleet runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("embedded broker listening"), "the log line must be there to be checked: {err}");
    assert!(!out.stderr.contains(&0x1b), "ANSI escape in a piped log: {err:?}");
}

/// `tunefleet best` ranked energy readings that were invalid, and
/// did not say that some trials were left out.
#[test]
fn regression_best_energy_leaves_out_invalid_readings_and_says_how_many() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let s = study::parse(&study_text("energy"), "s.toml").expect("parses");
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    open_study(&mut b, &s, &search::plan(&s)).expect("creates");
    for (trial, joules, valid) in [(0, 9.0, true), (1, 1.0, false), (2, 5.0, true), (3, 2.0, false)] {
        let energy = EnergyReading {
            joules,
            valid,
            ..EnergyReading::none(EnergySourceKind::Battery, if valid { "discharging" } else { "charging" })
        };
        let m = Measurement::unmeasured(ExitOutcome::Exited(0), energy);
        let r = TrialRef { study: "plain".into(), study_id: 7, trial, attempt: 1 };
        b.record_assignment(&r, "a1", 10).expect("assigns");
        b.record_result(&r, "a1", &m, m.objective_value("energy"), 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);

    let text = best(&["-n", "10"], &path);
    let trials: Vec<&str> = text.lines().filter(|l| l.starts_with("trial")).collect();
    assert_eq!(trials.len(), 2, "{text}");
    assert!(trials[0].starts_with("trial    2") && trials[1].starts_with("trial    0"), "{text}");
    assert!(text.contains("2 successful trials not ranked: 2 with an invalid energy reading"), "{text}");

    let v = json(&["best", "plain", "-n", "10"], &path);
    assert_eq!(v["view"], "ranked", "{v}");
    assert_eq!(column(&v["trials"], "trial"), json!([2, 0]), "{v}");
    assert_eq!(column(&v["trials"], "objective"), json!([5.0, 9.0]), "{v}");
    assert_eq!(v["unranked"], serde_json::json!({"invalid_energy": 2, "no_value": 0}), "{v}");
}

/// A multi-objective study's result is a Pareto front, and `best
/// --pareto` shows it: the trade-offs kept, the dominated and the invalid left out.
#[test]
fn best_pareto_shows_the_front_of_the_objective_against_energy_and_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let text = study_text("loss")
        .replace("direction = \"minimize\"", "direction = \"minimize\"\nalso = [\"energy\", \"wall_time\"]");
    let s = study::parse(&text, "s.toml").expect("parses");
    assert_eq!(s.objective.also.len(), 2);
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    open_study(&mut b, &s, &search::plan(&s)).expect("creates");
    // (loss, joules, seconds, valid): 0 and 1 trade loss for energy, 2 is
    // beaten by 1 everywhere, 3 would win but its energy is invalid.
    for (trial, loss, joules, secs, valid) in
        [(0, 0.1, 9.0, 2.0, true), (1, 0.3, 2.0, 1.0, true), (2, 0.4, 3.0, 1.5, true), (3, 0.05, 1.0, 0.5, false)]
    {
        let energy = EnergyReading { joules, valid, ..EnergyReading::none(EnergySourceKind::Estimated, "model") };
        let m = Measurement {
            wall_us: (secs * 1e6) as u64,
            final_metrics: [("loss".to_string(), loss)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), energy)
        };
        let r = TrialRef { study: "plain".into(), study_id: 7, trial, attempt: 1 };
        b.record_assignment(&r, "a1", 10).expect("assigns");
        b.record_result(&r, "a1", &m, m.objective_value("loss"), 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);
    let text = best(&["--pareto"], &path);
    assert!(text.contains("against energy, wall_time (minimised): 2 of 3 trials"), "{text}");
    let trials: Vec<&str> = text.lines().filter(|l| l.starts_with("trial")).collect();
    assert_eq!(trials.len(), 2, "{text}");
    assert!(trials[0].starts_with("trial    0") && trials[1].starts_with("trial    1"), "{text}");
    assert!(trials[1].contains("2.000 J") && trials[1].contains("1.000 s"), "{text}");

    let v = json(&["best", "plain", "--pareto"], &path);
    assert_eq!(
        (&v["view"], &v["considered"], &v["axes"]),
        (&"pareto".into(), &3.into(), &["energy", "wall_time"].into())
    );
    assert_eq!(column(&v["front"], "trial"), json!([0, 1]), "{v}");
    assert_eq!(column(&v["front"], "energy_j"), json!([9.0, 2.0]), "{v}");
    assert_eq!(column(&v["front"], "wall_us"), json!([2_000_000, 1_000_000]), "{v}");
}

/// In a study with constraints the front is of the results that meet them:
/// trial 2 beats every other on both axes but misses its latency bound.
#[test]
fn best_pareto_is_the_front_of_the_feasible_results() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let text = study_text("loss").replace("direction = \"minimize\"", "direction = \"minimize\"\nalso = [\"energy\"]")
        + "[[constraint]]\nmetric = \"latency_ms\"\nat_most = 5.0\n";
    let s = study::parse(&text, "s.toml").expect("parses");
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    open_study(&mut b, &s, &search::plan(&s)).expect("creates");
    for (trial, loss, joules, latency) in [(0, 0.1, 9.0, 1.0), (1, 0.3, 2.0, 1.0), (2, 0.05, 1.0, 10.0)] {
        let energy = EnergyReading { joules, valid: true, ..EnergyReading::none(EnergySourceKind::Estimated, "model") };
        let m = Measurement {
            final_metrics: [("loss".to_string(), loss), ("latency_ms".to_string(), latency)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), energy)
        };
        let r = TrialRef { study: "plain".into(), study_id: 7, trial, attempt: 1 };
        b.record_assignment(&r, "a1", 10).expect("assigns");
        let score =
            tunefleet_coordinator::store::Score { objective: Some(loss), violation: s.violation(&m), system: None };
        b.record_result(&r, "a1", &m, score, 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);
    let v = json(&["best", "plain", "--pareto"], &path);
    assert_eq!(column(&v["front"], "trial"), json!([0, 1]), "{v}");
    assert_eq!(v["considered"], 2, "{v}");
}

/// A study run on several kinds of device ranks each class apart.
#[test]
fn best_by_class_ranks_each_device_class_apart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("t.db");
    let s = study::parse(&study_text("loss"), "s.toml").expect("parses");
    let mut store = Store::open(&path).expect("store");
    let mut b = store.batch().expect("batch");
    open_study(&mut b, &s, &search::plan(&s)).expect("creates");
    let mut phone = tunefleet_common::message::AgentInfo::minimal("phone", 1);
    phone.arch = "aarch64".into();
    phone.cores = 8;
    let mut server = tunefleet_common::message::AgentInfo::minimal("server", 1);
    server.arch = "x86_64".into();
    server.cores = 64;
    b.upsert_agent(&phone, 1).expect("agent");
    b.upsert_agent(&server, 1).expect("agent");
    for (trial, agent, loss) in [(0, "phone", 0.5), (1, "server", 0.2), (2, "phone", 0.3), (3, "server", 0.4)] {
        let m = Measurement {
            final_metrics: [("loss".to_string(), loss)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, "m"))
        };
        let r = TrialRef { study: "plain".into(), study_id: 7, trial, attempt: 1 };
        b.record_assignment(&r, agent, 10).expect("assigns");
        b.record_result(&r, agent, &m, m.objective_value("loss"), 20).expect("records");
    }
    b.commit().expect("commits");
    drop(store);
    let text = best(&["--by-class", "-n", "1"], &path);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("aarch64, 8 cores") && lines[1].contains("trial    2"), "{text}");
    assert!(lines[2].starts_with("x86_64, 64 cores") && lines[3].contains("trial    1"), "{text}");

    let v = json(&["best", "plain", "--by-class", "-n", "1"], &path);
    assert_eq!(v["view"], "by_class", "{v}");
    let classes = &v["classes"];
    for (i, heading) in [lines[0], lines[2]].into_iter().enumerate() {
        assert_eq!(heading, format!("{}: 2 ranked trials", classes[i]["class"].as_str().unwrap_or("?")), "{v}");
    }
    assert_eq!(column(classes, "ranked"), json!([2, 2]), "{v}");
    assert_eq!((&classes[0]["trials"][0]["trial"], &classes[1]["trials"][0]["trial"]), (&json!(2), &json!(1)), "{v}");

    // The other listings carry what their text shows.
    let text = tunefleet(["studies".as_ref(), "--store".as_ref(), path.as_os_str()]);
    let v = json(&["studies"], &path);
    let s = &v[0];
    let field = |k: &str| s[k].as_str().map_or_else(|| s[k].to_string(), str::to_string);
    let shown: Vec<String> = text.split_whitespace().map(str::to_string).collect();
    let done = format!("{}/{}", field("done"), field("total"));
    let carried = [field("name"), field("state"), done, "done,".into(), field("failed"), "failed".into()];
    assert_eq!(shown, carried, "{v}");
    assert_eq!((v.as_array().map(Vec::len), &s["done"], &s["metric"]), (Some(1), &4.into(), &"loss".into()), "{v}");
    let text = tunefleet(["agents".as_ref(), "--store".as_ref(), path.as_os_str()]);
    let v = json(&["agents"], &path);
    let listed: Vec<&str> = text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(column(&v, "name"), json!(["phone", "server"]), "{v}");
    assert_eq!(json!(listed), column(&v, "name"), "{text}");
    assert_eq!((&v[0]["info"]["arch"], &v[0]["info"]["cores"]), (&"aarch64".into(), &8.into()), "{v}");
}

#[test]
fn version_shows_the_protocol_and_profile_versions() {
    let version = format!(
        "{} (protocol {}, profile {})",
        env!("CARGO_PKG_VERSION"),
        tunefleet_common::PROTOCOL_VERSION,
        tunefleet_common::profile::PROFILE_VERSION
    );
    assert_eq!(tunefleet(["--version"]), format!("tunefleet {version}\n"));
    assert_eq!(tunefleet(["best", "--version"]), format!("tunefleet-best {version}\n"));
}

/// Runs `script` in bash after sourcing `file`: its standard output.
fn bash(file: &Path, script: &str) -> String {
    let out = Command::new("bash")
        .args(["-c", &format!("source \"$1\" || exit 9\n{script}"), "bash"])
        .arg(file)
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What Tab offers after `words` (the last one being completed), as bash
/// asks the completion function: the command, the word, the one before.
fn complete(file: &Path, function: &str, words: &[&str]) -> Vec<String> {
    let n = words.len();
    let call = format!(
        "COMP_WORDS=({}); COMP_CWORD={}; {function} {} {} {}; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        words.join(" "),
        n - 1,
        words[0],
        words[n - 1],
        words[n - 2]
    );
    bash(file, &call).lines().filter(|l| !l.is_empty()).map(str::to_string).collect()
}

#[test]
fn bash_takes_the_generated_completion_scripts_and_completes_with_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("tunefleet");
    std::fs::write(&script, tunefleet(["completions", "bash"])).expect("writes");
    assert_eq!(
        bash(&script, "complete -p tunefleet"),
        "complete -o bashdefault -o default -o nosort -F _tunefleet tunefleet\n"
    );
    assert_eq!(complete(&script, "_tunefleet", &["tunefleet", "be"]), ["best"]);
    assert_eq!(complete(&script, "_tunefleet", &["tunefleet", "best", "s", "--pa"]), ["--pareto"]);
    assert_eq!(complete(&script, "_tunefleet", &["tunefleet", "completions", "fi"]), ["fish"]);

    let script = dir.path().join("tunefleet-agent");
    std::fs::write(&script, tunefleet(["completions", "bash", "--agent"])).expect("writes");
    assert_eq!(
        bash(&script, "complete -p tunefleet-agent"),
        "complete -o bashdefault -o default -o nosort -F _tunefleet__agent tunefleet-agent\n"
    );
    assert_eq!(complete(&script, "_tunefleet__agent", &["tunefleet-agent", "pr"]), ["probe"]);
    // A subcommand's flags too, which clap_complete alone misses for a
    // hyphenated name (clap-rs/clap#6421).
    assert_eq!(complete(&script, "_tunefleet__agent", &["tunefleet-agent", "measure", "--js"]), ["--json"]);
}

/// `man -l PAGE` as plain text (ASCII, no pager), wide enough not to wrap.
fn man(page: &Path) -> String {
    let out = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("LC_ALL", "C")
        .env("MANWIDTH", "200")
        .env_remove("MANPAGER")
        .env_remove("PAGER")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!("man does not run ({e}): `scripts/test.sh --install-only` installs it (scripts/needs.sh man)")
        });
    assert!(out.status.success(), "man -l {}: {}", page.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn man_renders_the_generated_pages_and_they_name_every_subcommand() {
    use tunefleet_coordinator::cli::Program;
    let dir = tempfile::tempdir().expect("tempdir");
    for (program, name, flags) in
        [(Program::Coordinator, "tunefleet", &[][..]), (Program::Agent, "tunefleet-agent", &["--agent"][..])]
    {
        let subcommands: Vec<String> =
            program.command().get_subcommands().map(|s| s.get_name().to_string()).filter(|s| s != "help").collect();
        assert!(subcommands.len() >= 4, "{subcommands:?}");
        let main = dir.path().join(format!("{name}.1"));
        std::fs::write(&main, tunefleet(["man"].iter().chain(flags))).expect("writes");
        let text = man(&main);
        assert!(text.contains(&format!("{name} - Tunefleet")), "NAME: {text}");
        for sub in &subcommands {
            assert!(text.contains(&format!("{name}-{sub}(1)")), "{sub} missing from the page:\n{text}");
        }
        // -o DIR: the main page and one per subcommand, each rendered.
        let pages = dir.path().join(name);
        let listed = tunefleet(
            [OsStr::new("man"), OsStr::new("-o"), pages.as_os_str()].into_iter().chain(flags.iter().map(OsStr::new)),
        );
        // In a man1 folder under DIR, where `man` looks with DIR on MANPATH.
        let section = pages.join("man1");
        let first = section.join(format!("{name}.1"));
        assert_eq!(listed.lines().next().map(Path::new), Some(first.as_path()), "the main page first: {listed}");
        let found =
            Command::new("man").args(["-w", &format!("{name}-{}", subcommands[0])]).env("MANPATH", &pages).output();
        let found = found.expect("man runs");
        assert!(
            found.status.success(),
            "man finds the pages with DIR on MANPATH: {}",
            String::from_utf8_lossy(&found.stderr)
        );
        assert!(String::from_utf8_lossy(&found.stdout).starts_with(&section.display().to_string()));
        assert_eq!(man(&first), text);
        for sub in &subcommands {
            let page = section.join(format!("{name}-{sub}.1"));
            assert!(listed.lines().any(|l| Path::new(l) == page), "{} not listed: {listed}", page.display());
            let text = man(&page);
            assert!(text.contains(&format!("{name}-{sub} - ")), "NAME of {sub}: {text}");
        }
    }
}

/// Configuration from a file, the environment and flags, in that
/// order of precedence (flags win).
#[test]
fn flags_beat_the_environment_which_beats_the_configuration_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "store = \"from-file.db\"\n").expect("write");
    let store_named = |env: Option<&str>, flag: Option<&str>| -> String {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tunefleet"));
        cmd.arg("studies").current_dir(dir.path()).env("TUNEFLEET_CONFIG", &config).env_remove("TUNEFLEET_STORE");
        cmd.env("XDG_CONFIG_HOME", dir.path());
        if let Some(e) = env {
            cmd.env("TUNEFLEET_STORE", e);
        }
        if let Some(f) = flag {
            cmd.args(["--store", f]);
        }
        let out = cmd.stdin(Stdio::null()).output().expect("runs");
        assert!(!out.status.success(), "no such store");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(store_named(None, None).contains("no store at from-file.db"));
    assert!(store_named(Some("env.db"), None).contains("no store at env.db"));
    assert!(store_named(Some("env.db"), Some("flag.db")).contains("no store at flag.db"));
    // A key that is no flag is refused with the file's name.
    std::fs::write(&config, "stroe = \"x.db\"\n").expect("write");
    let err = store_named(None, None);
    assert!(err.contains("config.toml") && err.contains("\"stroe\" is not a flag"), "{err}");
}
