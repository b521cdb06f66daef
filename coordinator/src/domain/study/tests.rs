//! Tests of study files: parsing, validation messages and the model's rules.

use std::path::Path;

use tunefleet_common::measurement::{EnergySourceKind, Measurement, SegmentRole};
use tunefleet_common::message::Select;
use tunefleet_common::params::ParamValue;

use super::*;

const EXAMPLE: &str = r#"name = "train-example"
command = ["tunefleet-train", "--lr", "{lr}", "--batch-size", "{batch_size}", "--epochs", "6"]
env = { TUNEFLEET_SEED = "{trial}" }
timeout = 120
repeats = 1
max_attempts = 3

[objective]
metric = "accuracy"
direction = "maximize"

[budget]
trials = 12

[strategy]
kind = "random"
seed = 7

[selector]
arch = ["x86_64", "aarch64"]
tags = { pool = "demo" }

[hyper.lr]
kind = "log_float"
low = 0.01
high = 1.0
grid = 4

[hyper.batch_size]
kind = "categorical"
values = [16, 64, 256]

[system.threads]
kind = "int"
low = 1
high = 2
step = 1
"#;

fn err(text: &str) -> StudyError {
    parse(text, "study.toml").expect_err("should be refused")
}

#[test]
fn resume_prefix_is_a_plain_prefix_and_needs_resume() {
    let with = |extra: &str| edited("timeout = 120", &format!("timeout = 120\n{extra}"));
    let ok = parse(&with("resume = [\"--resume\", \"{checkpoint}\"]\nresume_prefix = \"s3://bucket/ckpt/\""), "s.toml")
        .expect("parses");
    assert_eq!(ok.resume_prefix.as_deref(), Some("s3://bucket/ckpt/"));
    assert_eq!(parse(EXAMPLE, "s.toml").expect("parses").resume_prefix, None);
    assert!(err(&with("resume_prefix = \"s3://b/\"")).to_string().contains("needs resume"));
    let dash = err(&with("resume = [\"{checkpoint}\"]\nresume_prefix = \"--x\""));
    assert!(dash.to_string().contains("resume_prefix"), "{dash}");
    assert!(err(&with("resume = [\"{checkpoint}\"]\nresume_prefix = \"a\\nb\"")).to_string().contains("control"));
}

/// The example with `from` replaced by `to` (which must occur once).
fn edited(from: &str, to: &str) -> String {
    assert_eq!(EXAMPLE.matches(from).count(), 1, "{from:?} must occur once");
    EXAMPLE.replace(from, to)
}

fn line_of(e: &StudyError) -> usize {
    e.location().map(|l| l.line).unwrap_or_else(|| panic!("no location in {e}"))
}

#[test]
fn parses_the_documented_example() {
    let s = parse(EXAMPLE, "study.toml").expect("example parses");
    assert_eq!(s.name, "train-example");
    assert_eq!(s.command.len(), 7);
    assert_eq!(s.env.get("TUNEFLEET_SEED").map(String::as_str), Some("{trial}"));
    assert_eq!((s.timeout_s, s.repeats, s.max_attempts, s.budget), (120, 1, 3, 12));
    assert_eq!(
        s.objective,
        Objective {
            metric: "accuracy".into(),
            direction: Direction::Maximize,
            also: vec![],
            aggregate: Aggregate::Final,
            energy_time: None,
            to_target: None,
        }
    );
    let multi = parse(
        &edited("direction = \"maximize\"", "direction = \"maximize\"\nalso = [\"energy\", \"wall_time\"]"),
        "s.toml",
    )
    .expect("multi-objective parses");
    assert_eq!(multi.objective.also, vec![Secondary::Energy, Secondary::WallTime]);
    let e = parse(&edited("direction = \"maximize\"", "direction = \"maximize\"\nalso = [\"power\"]"), "s.toml")
        .expect_err("unknown secondary");
    assert!(e.to_string().contains("power"), "{e}");
    assert_eq!(s.strategy, Strategy::Random { seed: 7 });
    assert_eq!(s.selector.arch, vec!["x86_64", "aarch64"]);
    assert_eq!(s.selector.tags.get("pool").map(String::as_str), Some("demo"));
    assert_eq!(s.hyper["lr"], ParamSpec::LogFloat { low: 0.01, high: 1.0, grid: 4 });
    assert_eq!(
        s.hyper["batch_size"],
        ParamSpec::Categorical { values: vec![ParamValue::Int(16), ParamValue::Int(64), ParamValue::Int(256)] }
    );
    assert_eq!(s.system[&SystemParam::Threads], ParamSpec::Int { low: 1, high: 2, step: 1 });
    assert_eq!(s.source, EXAMPLE);
    let names: Vec<&str> = s.parameters().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["batch_size", "lr", "threads"]);
    let json = serde_json::to_value(&s).expect("serialises");
    assert_eq!(json["hyper"]["lr"]["kind"], "log_float");
    assert_eq!(json["system"]["threads"]["kind"], "int");
}

#[test]
fn pipelined_mode_is_checked_before_anything_runs() {
    let with = |p: &str| format!("{EXAMPLE}\n[pipeline]\n{p}\n");
    let s = parse(&with("mode = \"pipelined\"\ncontrol = true\nwindow = { epochs = 2, warmup = 1 }\nselect = { max_slowdown = 0.1 }"), "s.toml")
        .expect("parses");
    let p = s.pipeline.clone().expect("pipelined");
    assert_eq!(
        (p.window, p.warmup, p.select, p.probe),
        (2, 1, Select::MaxSlowdown { permille: 100 }, ProbeOrder::OneAtATime)
    );
    assert_eq!(s.searched().len(), 2, "system parameters are probed, not searched");
    assert_eq!(
        parse(&with("mode = \"pipelined\"\ncontrol = true\nselect = { cost = 0.25 }"), "s.toml")
            .expect("parses")
            .pipeline
            .map(|p| p.select),
        Some(Select::Cost { eta_permille: 250 })
    );
    let e = parse(&with("mode = \"pipelined\""), "s.toml").expect_err("threads without the control channel");
    assert!(e.to_string().contains("control channel"), "{e}");
    let e = parse(&with("mode = \"pipelined\"\ncontrol = true\nwindow = { steps = 50 }"), "s.toml").expect_err("steps");
    assert!(e.to_string().contains("steps"), "{e}");
    let e = parse(&with("mode = \"pipelined\"\ncontrol = true\nselect = { cost = 2 }"), "s.toml").expect_err("eta > 1");
    assert!(e.to_string().contains("pipeline.select"), "{e}");
    let e = parse(&with("mode = \"pipelined\"\ncontrol = true\nprobe = \"sometimes\""), "s.toml").expect_err("probe");
    assert!(e.to_string().contains("one-at-a-time"), "{e}");
    let sequential = parse(&with("mode = \"sequential\""), "s.toml").expect("parses");
    assert_eq!(sequential.pipeline, None);
    assert_eq!(sequential.searched().len(), 3);
}

#[test]
fn a_system_parameter_the_command_reads_at_start_is_not_probed_inside_a_trial() {
    let study = |command: &str, env: &str| {
        format!(
            "name = \"spark\"\ncommand = {command}\n{env}\n[objective]\nmetric = \"wall_time\"\ndirection = \"minimize\"\n[budget]\ntrials = 4\n[strategy]\nkind = \"grid\"\n\
             [hyper.partitions]\nkind = \"categorical\"\nvalues = [4, 8]\n[system.cores]\nkind = \"int\"\nlow = 1\nhigh = 2\n\
             [pipeline]\nmode = \"pipelined\"\n"
        )
    };
    let spark = r#"["spark-submit", "--executor-cores", "{cores}", "job.py", "{partitions}"]"#;
    let e = parse(&study(spark, ""), "s.toml").expect_err("executor cores are read when spark-submit starts");
    assert!(e.to_string().contains("command[2]: {cores} is read when the process starts"), "{e}");
    let e = parse(&study(r#"["make"]"#, "env = { MAKEFLAGS = \"-j{cores}\" }"), "s.toml").expect_err("env too");
    assert!(e.to_string().contains("env.MAKEFLAGS"), "{e}");
    // Cores left to the agent (CPU affinity, changed live): probed.
    assert!(parse(&study(r#"["job", "{partitions}"]"#, ""), "s.toml").is_ok());
    // Resume arguments are read at start too.
    let resumed = study(r#"["job", "{partitions}"]"#, r#"resume = ["--from", "{checkpoint}", "-j{cores}"]"#);
    let e = parse(&resumed, "s.toml").expect_err("resume");
    assert!(e.to_string().contains("resume[2]: {cores}"), "{e}");
    // Threads with the control channel: the first value from the placeholder, the rest live.
    let threads = study(r#"["job", "--threads", "{threads}"]"#, "")
        .replace("[pipeline]", "[system.threads]\nkind = \"int\"\nlow = 1\nhigh = 2\n[pipeline]")
        .replace("mode = \"pipelined\"", "mode = \"pipelined\"\ncontrol = true");
    assert!(parse(&threads, "s.toml").is_ok(), "{:?}", parse(&threads, "s.toml").err());
    // One value of cores: nothing probed, the placeholder is fine.
    let one = study(spark, "").replace(
        "[system.cores]\nkind = \"int\"\nlow = 1\nhigh = 2",
        "[system.cores]\nkind = \"categorical\"\nvalues = [2]",
    );
    assert!(parse(&one, "s.toml").is_ok(), "{:?}", parse(&one, "s.toml").err());
    // Sequential: a trial per value, read at start as it should be.
    let sequential = study(spark, "").replace("mode = \"pipelined\"", "mode = \"sequential\"");
    assert!(parse(&sequential, "s.toml").is_ok());
}

#[test]
fn a_pipelined_study_warms_up_one_unit_unless_it_says_otherwise() {
    let with = |pipeline: &str| edited("[system.threads]", &format!("[pipeline]\n{pipeline}\n\n[system.threads]"));
    let s = parse(&with("mode = \"pipelined\"\ncontrol = true"), "s.toml").expect("parses");
    assert_eq!(s.pipeline.map(|p| p.warmup), Some(1), "start-up is never a probe window");
    let s = parse(&with("mode = \"pipelined\"\ncontrol = true\nwindow = { epochs = 1, warmup = 0 }"), "s.toml")
        .expect("parses");
    assert_eq!(s.pipeline.map(|p| p.warmup), Some(0), "an explicit 0 is kept");
}

#[test]
fn kept_mean_of_a_measured_objective_is_refused() {
    for metric in ["wall_time", "cpu_time", "energy"] {
        let text = edited("direction = \"maximize\"", "direction = \"maximize\"\naggregate = \"kept_mean\"");
        let text = text.replace("metric = \"accuracy\"", &format!("metric = \"{metric}\""));
        let e = err(&text);
        assert!(e.to_string().contains("kept_mean averages a metric the workload reports"), "{metric}: {e}");
    }
}

#[test]
fn kept_mean_reads_the_epochs_of_the_kept_configuration() {
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, EpochMetrics, ExitOutcome, Segment};
    let text = edited("direction = \"maximize\"", "direction = \"maximize\"\naggregate = \"kept_mean\"");
    let s = parse(&text, "s.toml").expect("parses");
    assert_eq!(s.objective.aggregate, Aggregate::KeptMean);
    let epochs = [10.0, 1.0, 2.0, 6.0, 8.0];
    let mut m = Measurement {
        epochs: epochs
            .iter()
            .enumerate()
            .map(|(i, v)| EpochMetrics {
                epoch: i as u32 + 1,
                elapsed_us: 0,
                metrics: [("accuracy".to_string(), *v)].into(),
                checkpoint: None,
            })
            .collect(),
        final_metrics: [("accuracy".to_string(), 8.0)].into(),
        ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    };
    assert_eq!(s.objective_value(&m), Some(17.0 / 4.0), "every epoch but the first");
    m.segments.push(Segment {
        role: SegmentRole::Selected,
        system: Default::default(),
        cpus: vec![],
        first_epoch: 4,
        last_epoch: 5,
        steps: 0,
        start_us: 0,
        wall_us: 1,
        energy_j: None,
        cpu_us: None,
        unit_median_us: None,
        unit_spread: None,
        margin: None,
    });
    assert_eq!(s.objective_value(&m), Some(7.0), "the Selected segment's epochs");
    let final_only = parse(EXAMPLE, "s.toml").expect("parses");
    assert_eq!(final_only.objective_value(&m), Some(8.0));
}

#[test]
fn selector_energy_names_a_known_source() {
    let e = err(&edited("tags = { pool = \"demo\" }", "tags = { pool = \"demo\" }\nenergy = [\"nuclear\"]"));
    assert!(e.to_string().contains("selector.energy"), "{e}");
    assert!(e.to_string().contains("rapl, hwmon, battery, estimated, external"), "{e}");
    let s = parse(
        &edited("tags = { pool = \"demo\" }", "tags = { pool = \"demo\" }\nenergy = [\"rapl\", \"battery\"]"),
        "s.toml",
    )
    .expect("parses");
    assert_eq!(s.selector.energy, vec![EnergySourceKind::Rapl, EnergySourceKind::Battery]);
}

#[test]
fn a_sequential_pipeline_refuses_the_keys_it_would_ignore() {
    let plain = format!("{EXAMPLE}\n[pipeline]\nmode = \"sequential\"\n");
    assert_eq!(parse(&plain, "study.toml").expect("parses").pipeline, None);
    let typo = format!("{EXAMPLE}\n[pipeline]\nmode = \"sequential\"\nprobe = \"bogus\"\n");
    assert!(err(&typo).to_string().contains("apply to mode = \"pipelined\" only"));
}

#[test]
fn groups_run_as_studies_of_their_own_with_narrowed_selectors_and_budgets() {
    let text = format!(
        "{EXAMPLE}\n[[group]]\nname = \"phones\"\nbudget = 4\nselector = {{ arch = [\"aarch64\"], tags = {{ kind = \"phone\" }}, energy = [\"battery\"] }}\n\
         [[group]]\nname = \"x86\"\nselector = {{ arch = [\"x86_64\"], min_cores = 8 }}\n"
    );
    let s = parse(&text, "study.toml").expect("groups parse");
    let parts = s.expand();
    let names: Vec<&str> = parts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["train-example-phones", "train-example-x86"]);
    assert_eq!((parts[0].budget, parts[1].budget), (4, 12), "a group without a budget has the study's");
    assert_eq!(parts[0].selector.arch, vec!["aarch64"]);
    let tags: Vec<(&str, &str)> = parts[0].selector.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(tags, vec![("kind", "phone"), ("pool", "demo")], "the study's tags and the group's");
    assert_eq!(parts[0].selector.energy, vec![EnergySourceKind::Battery]);
    assert_eq!((parts[1].selector.arch.clone(), parts[1].selector.min_cores), (vec!["x86_64".to_string()], Some(8)));
    assert!(parts.iter().all(|p| p.groups.is_empty() && p.source == s.source), "each keeps the whole file");
    assert_eq!(parse(EXAMPLE, "study.toml").expect("parses").expand().len(), 1);

    let twice = format!("{EXAMPLE}\n[[group]]\nname = \"a\"\n[[group]]\nname = \"a\"\n");
    assert!(err(&twice).to_string().contains("listed twice"));
    let bad = format!("{EXAMPLE}\n[[group]]\nname = \"Phones!\"\n");
    assert!(err(&bad).to_string().contains("not a valid study name"));
    let energy = format!("{EXAMPLE}\n[[group]]\nname = \"p\"\nselector = {{ energy = [\"solar\"] }}\n");
    assert!(err(&energy).to_string().contains("group.selector.energy"));
}

#[test]
fn stability_needs_repeats_and_a_positive_spread() {
    let with = |repeats: u32, st: &str| {
        format!("{}\n[stability]\n{st}\n", edited("repeats = 1", &format!("repeats = {repeats}")))
    };
    let s = parse(&with(3, "spread = 0.05\nmax_repeats = 8"), "s.toml").expect("parses");
    assert_eq!(s.stability, Some(Stability { spread: 0.05, max_repeats: 8 }));
    assert!(err(&with(1, "spread = 0.05")).to_string().contains("at least two runs"));
    assert!(err(&with(3, "spread = 0")).to_string().contains("above 0"));
    assert!(err(&with(3, "spread = 0.1\nmax_repeats = 2")).to_string().contains("below repeats"));
}

#[test]
fn defaults_apply() {
    let text = r#"name = "d"
command = ["run", "{x}"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = 3
[strategy]
kind = "grid"
[hyper.x]
kind = "float"
low = 0
high = 1
"#;
    let s = parse(text, "d.toml").expect("parses");
    assert_eq!((s.timeout_s, s.repeats, s.max_attempts), (DEFAULT_TIMEOUT_S, 1, DEFAULT_MAX_ATTEMPTS));
    assert!(s.lookahead, "trials may be held ahead unless a study says not");
    assert_eq!(s.strategy, Strategy::Grid);
    let most = tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT;
    assert_eq!(s.ahead_per_slot(), most);
    let with = |strategy, lookahead| Study { strategy, lookahead, ..s.clone() }.ahead_per_slot();
    assert_eq!(with(Strategy::Random { seed: 1 }, true), most);
    assert_eq!(with(Strategy::Tpe { seed: 1 }, true), 1, "a model asks as few as it can blind");
    assert_eq!(with(Strategy::Gp { seed: 1 }, true), 1);
    assert_eq!(with(Strategy::Tpe { seed: 1 }, false), 0);
    assert_eq!(with(Strategy::Grid, false), 0);
    assert_eq!(s.hyper["x"], ParamSpec::Float { low: 0.0, high: 1.0, grid: DEFAULT_GRID_POINTS });
    assert_eq!(s.selector, Selector::default());
    assert!(s.env.is_empty());
    let text = text.replace("kind = \"grid\"", "kind = \"random\"");
    assert_eq!(parse(&text, "d.toml").expect("parses").strategy, Strategy::Random { seed: 0 });
}

#[test]
fn unknown_keys_are_refused_with_their_line() {
    let e = err(&edited("repeats = 1", "repeats = 1\nrepeat = 2"));
    assert_eq!(line_of(&e), 6, "{e}");
    assert!(e.to_string().starts_with("study.toml:6:"), "{e}");
    assert!(e.to_string().contains("repeat"), "{e}");

    let e = err(&edited("grid = 4", "grid = 4\nlog = true"));
    assert_eq!(line_of(&e), 28, "{e}");
    let e = err(&edited("direction = \"maximize\"", "direction = \"maximize\"\ngoal = 1"));
    assert_eq!(line_of(&e), 11, "{e}");
}

#[test]
fn low_not_below_high_names_line_and_values() {
    let e = err(&edited("low = 0.01", "low = 2"));
    assert_eq!(line_of(&e), 25, "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("study.toml:25:"), "{msg}");
    assert!(msg.contains("hyper.lr: low (2) must be below high (1)"), "{msg}");
}

#[test]
fn missing_and_mistyped_keys() {
    let e = err(&edited("metric = \"accuracy\"\n", ""));
    assert!(e.to_string().contains("metric"), "{e}");
    assert!(e.location().is_some(), "{e}");
    let e = err(&edited("timeout = 120", "timeout = \"2m\""));
    assert_eq!(line_of(&e), 4, "{e}");
    let e = err(&edited("direction = \"maximize\"", "direction = \"up\""));
    assert_eq!(line_of(&e), 10, "{e}");
    let e = err(&edited("kind = \"random\"", "kind = \"annealing\""));
    assert_eq!(line_of(&e), 16, "{e}");
    let e = err(&edited("values = [16, 64, 256]", "values = [16, true]"));
    assert_eq!(line_of(&e), 31, "{e}");
    let e = err(&edited("values = [16, 64, 256]", "values = [16, 64, 16]"));
    assert!(e.to_string().contains("duplicate value 16"), "{e}");
    let e = err(&edited("low = 1\n", "low = 1.5\n"));
    assert!(e.to_string().contains("system.threads: low must be an integer"), "{e}");
    let e = err(&edited("kind = \"log_float\"", "kind = \"int\""));
    assert!(e.to_string().contains("`grid` does not apply to kind int"), "{e}");
}

#[test]
fn semantic_errors_are_refused() {
    let cases: &[(&str, &str, &str)] = &[
        ("values = [16, 64, 256]", "values = []", "must not be empty"),
        ("low = 0.01", "low = 0.0", "log_float needs low > 0"),
        ("[system.threads]", "[system.swap]", "unknown system parameter"),
        ("trials = 12", "trials = 0", "budget.trials: must be at least 1"),
        ("trials = 12", "trials = 10000001", "budget.trials: at most"),
        ("timeout = 120", "timeout = 0", "timeout: must be at least 1"),
        ("max_attempts = 3", "max_attempts = 0", "max_attempts: must be at least 1"),
        ("max_attempts = 3", "max_attempts = 3\nlookahead = 2", "lookahead: 2: 1 (trials may wait"),
        ("name = \"train-example\"", "name = \"Train Example\"", "not a valid study name"),
        ("\"--epochs\", \"6\"]", "\"--epochs\", \"{epochs}\"]", "placeholder {epochs} names neither"),
        ("\"{trial}\" }", "\"{seed}\" }", "env.TUNEFLEET_SEED: placeholder {seed}"),
        ("\"--epochs\", \"6\"]", "\"--epochs\", \"{oops\"]", "unclosed"),
        ("[hyper.batch_size]", "[hyper.threads]", "also defined in [hyper]"),
        ("low = 1\n", "low = 0\n", "system parameter values must be >= 1"),
        ("step = 1", "step = 0", "step must be >= 1"),
        ("grid = 4", "grid = 1", "grid must be at least 2"),
        ("seed = 7", "seed = -1", "must not be negative"),
        ("[hyper.batch_size]", "[hyper.trial]", "builtin placeholder name"),
        ("[hyper.batch_size]", "[hyper.2x]", "invalid parameter name"),
    ];
    for (from, to, want) in cases {
        let e = err(&edited(from, to));
        assert!(e.to_string().contains(want), "{from} -> {to}: got {e}, want {want:?}");
        assert!(e.location().is_some(), "{from} -> {to}: no location in {e}");
    }
}

#[test]
fn command_must_name_a_program() {
    let e = err(&edited(
        "command = [\"tunefleet-train\", \"--lr\", \"{lr}\", \"--batch-size\", \"{batch_size}\", \"--epochs\", \"6\"]",
        "command = []",
    ));
    assert_eq!(line_of(&e), 2, "{e}");
    assert!(e.to_string().contains("command"), "{e}");
}

#[test]
fn empty_search_space_is_refused() {
    let text = r#"name = "e"
command = ["run"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = 1
[strategy]
kind = "grid"
"#;
    assert!(err(text).to_string().contains("search space is empty"));
    let e = err(&format!("{text}[hyper]\n"));
    assert!(e.to_string().contains("search space is empty"), "{e}");
}

#[test]
fn system_params_must_be_whole_and_positive() {
    let e = err(&edited("[system.threads]\nkind = \"int\"", "[system.threads]\nkind = \"float\""));
    assert!(e.to_string().contains("whole numbers"), "{e}");
    let text = edited(
        "[system.threads]\nkind = \"int\"\nlow = 1\nhigh = 2\nstep = 1",
        "[system.memory]\nkind = \"categorical\"\nvalues = [512, 0]",
    );
    let e = err(&text);
    assert!(e.to_string().contains("integers >= 1"), "{e}");
}

#[test]
fn budget_below_repeats_is_refused() {
    let e = err(&edited("repeats = 1", "repeats = 20"));
    assert!(e.to_string().contains("less than repeats"), "{e}");
}

#[test]
fn location_counts_lines_and_characters() {
    let text = "a\nbé c\n";
    assert_eq!(Location::of_offset(text, 0), Location { line: 1, column: 1 });
    assert_eq!(Location::of_offset(text, 2), Location { line: 2, column: 1 });
    // 'c' is at byte 6 ("b" 1 byte, "é" 2 bytes, " " 1 byte), character 4.
    assert_eq!(Location::of_offset(text, 6), Location { line: 2, column: 4 });
    assert_eq!(Location::of_offset(text, 999), Location { line: 3, column: 1 });
}

#[test]
fn load_reports_missing_files_with_their_path() {
    let e = load(Path::new("/nonexistent/study.toml")).expect_err("missing");
    assert!(e.to_string().starts_with("/nonexistent/study.toml:"), "{e}");
}

#[test]
fn early_stopping_in_a_pipelined_study_judges_only_after_every_probe_window() {
    // Threads 1..2: two configurations; windows of 2 epochs after 1 of
    // warm-up, and up to 2 x 2 windows again: probing may take 13 epochs.
    let with = |grace: u32| {
        format!(
            "{EXAMPLE}\n[pipeline]\nmode = \"pipelined\"\ncontrol = true\nwindow = {{ epochs = 2, warmup = 1 }}\n\
             [early_stopping]\nkind = \"asha\"\ngrace = {grace}\n"
        )
    };
    let e = parse(&with(13), "s.toml").expect_err("a rung inside the probing");
    assert!(e.to_string().contains("set grace = 14 or more"), "{e}");
    let s = parse(&with(14), "s.toml").expect("every rung after the probing");
    assert_eq!(s.early_stopping.map(|e| e.grace), Some(14));
    // Windows of steps: the probing's end in epochs is not known.
    let steps = EXAMPLE.replace("[system.threads]", "[system.cores]")
        + "\n[pipeline]\nmode = \"pipelined\"\nwindow = { steps = 50 }\n[early_stopping]\nkind = \"asha\"\ngrace = 50\n";
    let e = parse(&steps, "s.toml").expect_err("steps");
    assert!(e.to_string().contains("windows of steps"), "{e}");
    // A plain study keeps any grace.
    let plain = format!("{EXAMPLE}\n[early_stopping]\nkind = \"asha\"\ngrace = 1\n");
    assert!(parse(&plain, "s.toml").is_ok());
}

/// `[[constraint]]` entries, each a metric and one finite bound;
/// changing them is a new study (they decide what is ranked first).
#[test]
fn constraints_take_a_metric_and_one_finite_bound() {
    let with = |extra: &str| format!("{EXAMPLE}\n{extra}");
    let two = with(
        "[[constraint]]\nmetric = \"accuracy\"\nat_least = 0.97\n\n[[constraint]]\nmetric = \"energy\"\nat_most = 50.0\n",
    );
    let study = parse(&two, "s.toml").expect("parses");
    assert_eq!(
        study.constraints,
        vec![
            Constraint { metric: "accuracy".into(), bound: Bound::AtLeast(0.97) },
            Constraint { metric: "energy".into(), bound: Bound::AtMost(50.0) },
        ]
    );
    assert!(parse(EXAMPLE, "s.toml").expect("parses").constraints.is_empty());
    let both = err(&with("[[constraint]]\nmetric = \"a\"\nat_most = 1.0\nat_least = 0.0\n"));
    assert!(both.to_string().contains("one of at_most and at_least"), "{both}");
    assert!(err(&with("[[constraint]]\nmetric = \"a\"\n")).to_string().contains("one of at_most and at_least"));
    assert!(err(&with("[[constraint]]\nmetric = \"a\"\nat_most = nan\n")).to_string().contains("finite"));
    assert!(err(&with("[[constraint]]\nmetric = \"a b\"\nat_most = 1.0\n")).to_string().contains("no metric name"));
    assert!(err(&with("[[constraint]]\nmetric = \"a\"\nbelow = 1.0\n")).to_string().contains("below"));
    let base = parse(EXAMPLE, "s.toml").expect("parses");
    assert_eq!(base.differences(&study), vec!["[[constraint]]"]);
    assert!(!diff::continues(&base, &study), "a study under other constraints ranks otherwise: a new study");
}

/// `metric = "energy_time"` with its knob and power, and
/// `to_target` on a measured metric; each refused where it means nothing.
#[test]
fn energy_time_and_to_target_are_checked() {
    let objective = |extra: &str| edited("metric = \"accuracy\"\ndirection = \"maximize\"", extra);
    let et = parse(
        &objective("metric = \"energy_time\"\ndirection = \"minimize\"\neta = 0.5\nmax_power_w = 250.0"),
        "s.toml",
    )
    .expect("parses");
    assert_eq!(et.objective.energy_time, Some(measured::EnergyTime { eta: 0.5, max_power_w: 250.0 }));
    let refused = |extra: &str, want: &str| {
        let e = err(&objective(extra));
        assert!(e.to_string().contains(want), "{extra}: {e}");
    };
    refused("metric = \"energy_time\"\ndirection = \"minimize\"\neta = 0.5", "needs eta");
    refused("metric = \"energy_time\"\ndirection = \"minimize\"\neta = 1.5\nmax_power_w = 1.0", "0 to 1");
    refused("metric = \"energy_time\"\ndirection = \"maximize\"\neta = 0.5\nmax_power_w = 1.0", "minimize");
    refused("metric = \"accuracy\"\ndirection = \"maximize\"\neta = 0.5", "for metric = \"energy_time\"");
    refused(
        "metric = \"energy_time\"\ndirection = \"minimize\"\neta = 0.5\nmax_power_w = 1.0\naggregate = \"kept_mean\"",
        "measured once",
    );
    let target = "to_target = { metric = \"accuracy\", at_least = 0.97 }";
    let to = parse(&objective(&format!("metric = \"energy\"\ndirection = \"minimize\"\n{target}")), "s.toml")
        .expect("parses");
    assert_eq!(to.objective.to_target, Some(Constraint { metric: "accuracy".into(), bound: Bound::AtLeast(0.97) }));
    refused(&format!("metric = \"accuracy\"\ndirection = \"maximize\"\n{target}"), "direction");
    refused(&format!("metric = \"loss\"\ndirection = \"minimize\"\n{target}"), "measured metric");
}

/// Each constraint's signed value, then the target's by the best value
/// reported: at most 0 where it holds; their positive parts sum to the
/// violation; a figure never reported misses without end.
#[test]
fn constraint_margins_are_signed_and_sum_to_the_violation() {
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, EpochMetrics, ExitOutcome, Measurement};
    let text = r#"name = "m"
command = ["x", "{a}"]
[objective]
metric = "wall_time"
direction = "minimize"
to_target = { metric = "accuracy", at_least = 0.9 }
[[constraint]]
metric = "latency_ms"
at_most = 5.0
[[constraint]]
metric = "accuracy"
at_least = 0.97
[budget]
trials = 2
[strategy]
kind = "grid"
[hyper.a]
kind = "int"
low = 1
high = 2
"#;
    let s = parse(text, "m.toml").expect("parses");
    let mut m = Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""));
    m.epochs = [0.8, 0.95, 0.93]
        .iter()
        .enumerate()
        .map(|(i, a)| EpochMetrics {
            epoch: i as u32 + 1,
            elapsed_us: 1,
            metrics: [("accuracy".to_string(), *a)].into(),
            checkpoint: None,
        })
        .collect();
    m.final_metrics = [("accuracy".to_string(), 0.93), ("latency_ms".to_string(), 7.0)].into();
    let margins = s.constraint_margins(&m).expect("constrained");
    assert_eq!(margins.len(), 3);
    assert!((margins[0] - 2.0).abs() < 1e-12, "latency 7 against at most 5: {margins:?}");
    assert!((margins[1] - 0.04).abs() < 1e-12, "final accuracy 0.93 against 0.97: {margins:?}");
    assert!((margins[2] + 0.05).abs() < 1e-12, "the best epoch 0.95 is 0.05 inside 0.9: {margins:?}");
    let positive: f64 = margins.iter().map(|v| v.max(0.0)).sum();
    assert!((positive - s.violation(&m).expect("violation")).abs() < 1e-12);
    m.final_metrics.remove("latency_ms");
    assert_eq!(s.constraint_margins(&m).expect("constrained")[0], f64::INFINITY);
    let plain = parse(EXAMPLE, "s.toml").expect("parses");
    assert_eq!(plain.constraint_margins(&m), None);
}
