//! What a fleet member may take is what the operator granted,
//! and a refused agent hears why. Real coordinator and agent processes on
//! the embedded broker; the member is a protocol client written here
//! ([`tunefleet_tests::member`]), as a stolen phone would be.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tunefleet_common::message::{AgentInfo, AgentMessage, CoordinatorMessage, WorkRequest};
use tunefleet_tests::member::{Answer, Member};
use tunefleet_tests::*;

/// `trials` trials that sleep 20 ms and report `v`; two attempts each.
fn short_study(dir: &Path, name: &str, trials: u32) -> std::path::PathBuf {
    let path = sleep_study(dir, name, trials, 0.02);
    let text = std::fs::read_to_string(&path).expect("study").replace("max_attempts = 5", "max_attempts = 2");
    assert!(text.contains("max_attempts = 2"), "{text}");
    std::fs::write(&path, text).expect("study");
    path
}

/// Finding 1: a member announcing the most slots and lookahead took 296 of
/// 300 pending trials, and going offline twice failed 290 of them for good.
/// Now it gets what it was granted (the fleet's cap), never more than its
/// share while others ask, loses held trials without failing them, and
/// is given fewer each time it drops them.
#[test]
fn regression_a_member_claiming_every_slot_and_going_offline_fails_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("greedy");
    let trials = 300u32;
    let started = Instant::now();
    let (mut coord, url) = start_coordinator(&short_study(dir.path(), "greedy", trials), &store, &root, &[]);
    let token: tunefleet_common::auth::JoinToken = join_token_of(&root).expect("token").parse().expect("token");
    let mut member = Member::connect(port_of(&url), &root, "phone-m");
    let honest = [format!("{root}-h1"), format!("{root}-h2")];
    let agents: Vec<Proc> = honest.iter().map(|n| start_agent(&url, n, &root, &[])).collect();

    let greedy = AgentInfo { slots: 1024, lookahead: 4096, ..AgentInfo::minimal("x", 0) };
    let (mut rounds, mut taken, mut seq) = (0u32, 0usize, 0u64);
    let done = || -> i64 {
        query(&store, "SELECT COUNT(*) FROM trials WHERE state = 'done' OR state = 'failed'", |r| r.get(0))
            .first()
            .copied()
            .unwrap_or(0)
    };
    while done() < i64::from(trials) {
        assert!(started.elapsed() < Duration::from_secs(240), "the study did not end: {} done", done());
        let enrol = (rounds == 0).then_some(&token);
        assert!(matches!(member.hello(greedy.clone(), enrol), Answer::Welcome), "round {rounds}");
        seq += 1;
        member.send(&AgentMessage::Request(WorkRequest {
            seq,
            free: 1024,
            ahead: 4096,
            running: vec![],
            held: vec![],
        }));
        let got = member.receive(Duration::from_millis(300));
        taken += got.iter().filter(|m| matches!(m, CoordinatorMessage::Assign(_))).count();
        member.go_offline();
        rounds += 1;
    }
    member.disconnect();
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    let failed: Vec<i64> = query(&store, "SELECT COUNT(*) FROM trials WHERE state = 'failed'", |r| r.get(0));
    assert_eq!(failed, [0], "no trial failed: {out}");
    let by_honest: Vec<i64> = query(
        &store,
        &format!("SELECT COUNT(*) FROM results WHERE agent IN ('{}', '{}')", honest[0], honest[1]),
        |r| r.get(0),
    );
    assert_eq!(by_honest, [i64::from(trials)], "the honest agents ran every trial");
    // It was given what the fleet's cap allows at most (64 slots, 256 ahead),
    // and fewer with every loss.
    let lost: Vec<i64> = query(&store, "SELECT lost_held FROM agent_enrolment WHERE name = 'phone-m'", |r| r.get(0));
    // (Assignments still on their way when it went offline are lost too.)
    let lost = lost.first().copied().unwrap_or(0);
    assert!(lost > 0 && lost as usize >= taken, "{lost} lost, {taken} taken");
    let agents_out = tunefleet(&["agents", "--store", &store.display().to_string()]);
    let line = agents_out.1.lines().find(|l| l.starts_with("phone-m")).unwrap_or_default().to_string();
    assert!(line.split_whitespace().any(|w| w == lost.to_string()), "the operator sees what it lost: {line}");
    eprintln!(
        "measured: {rounds} offline rounds, the member was given {taken} trials in all, {} s for {trials} trials",
        started.elapsed().as_secs_f64()
    );
    drop(agents);
    assert_agents_spools_empty(&honest.iter().map(String::as_str).collect::<Vec<_>>());
}

/// A token's grant caps what its agents are given, whatever they announce.
#[test]
fn a_tokens_grant_caps_the_slots_an_agent_is_given() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("grant");
    let (mut coord, url) = start_coordinator(&short_study(dir.path(), "grant", 40), &store, &root, &[]);
    let token: tunefleet_common::auth::JoinToken =
        create_join_token(&store, &["--slots", "2", "--lookahead", "1"]).parse().expect("token");
    let mut member = Member::connect(port_of(&url), &root, "phone-g");
    let claims = AgentInfo { slots: 512, lookahead: 2048, ..AgentInfo::minimal("x", 0) };
    assert!(matches!(member.hello(claims, Some(&token)), Answer::Welcome));
    member.send(&AgentMessage::Request(WorkRequest { seq: 1, free: 512, ahead: 2048, running: vec![], held: vec![] }));
    let got = member.receive(Duration::from_secs(2));
    let assigned = got.iter().filter(|m| matches!(m, CoordinatorMessage::Assign(_))).count();
    assert_eq!(assigned, 3, "two slots and one held ahead: {got:?}");
    let slots: Vec<String> = query(&store, "SELECT info FROM agents WHERE name = 'phone-g'", |r| r.get(0));
    assert!(slots.first().is_some_and(|i| i.contains("\"slots\":2")), "{slots:?}");
    member.go_offline();
    member.disconnect();
    let agent = start_agent(&url, &format!("{root}-a"), &root, &[]);
    assert!(coord.wait_exit(Duration::from_secs(120)).success());
    drop(agent);
    assert_agents_spools_empty(&[&format!("{root}-a")]);
}

/// Starts a real agent with `args` and waits until it says it was refused
/// (then stops it, when it goes on asking): whether it exited and how, its
/// log, and how long it took.
fn refused_agent(url: &str, name: &str, root: &str, log: &Path, args: &[&str]) -> (Option<i32>, String, Duration) {
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.args(["--broker", url, "--name", name, "--root", root]).args(args);
    cmd.env("XDG_STATE_HOME", state_home()).env_remove("TUNEFLEET_JOIN").env("RUST_LOG", "info");
    cmd.stderr(std::fs::File::create(log).expect("log"));
    let started = Instant::now();
    let mut p = Proc::spawn(name, cmd);
    let told = |text: &str| text.contains("the coordinator refused this agent");
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(status) = p.child.try_wait().expect("try_wait") {
            return (status.code(), std::fs::read_to_string(log).unwrap_or_default(), started.elapsed());
        }
        if told(&text) {
            // Told: it exits now where asking again cannot help, or goes on asking.
            let took = started.elapsed();
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Some(status) = p.child.try_wait().expect("try_wait") {
                    return (status.code(), std::fs::read_to_string(log).unwrap_or_default(), took);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            return (None, std::fs::read_to_string(log).unwrap_or_default(), took);
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{name} was not told in 20 s:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A refused agent logged `connected`, `coordinator status online=true`
/// and idled for ever, while only the coordinator's log said why. Now it
/// is told, signed, and stops where asking again cannot help (a dead
/// token); where the operator can still let it in, it says why and asks on.
#[test]
fn regression_a_refused_agent_says_why_on_its_own_side_and_stops() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("refused");
    // Its trials wait for the last agent (tagged): the coordinator outlives the refusals.
    let study = short_study(dir.path(), "refused", 4);
    let text = std::fs::read_to_string(&study).expect("study") + "[selector]\ntags = { pool = \"last\" }\n";
    std::fs::write(&study, text).expect("study");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let store_arg = store.display().to_string();
    let key = tunefleet(&["key"]).1.trim().to_string();
    assert_eq!(key.len(), 64, "{key}");
    let revoked = create_join_token(&store, &[]);
    let list = tunefleet(&["token", "list", "--json", "--store", &store_arg]).1;
    let newest: Vec<serde_json::Value> = serde_json::from_str(&list).expect("json");
    let id = newest[0]["id"].as_str().expect("id").to_string();
    assert_eq!(tunefleet(&["token", "revoke", &id, "--store", &store_arg]).0, Some(0));
    let once = tunefleet(&["token", "create", "--uses", "1", "--store", &store_arg]).1.trim().to_string();
    let first_log = dir.path().join("one.log");
    let mut first_cmd = Command::new(bin("tunefleet-agent"));
    first_cmd.stderr(std::fs::File::create(&first_log).expect("log"));
    let first = start_agent_with(first_cmd, &url, &format!("{root}-one"), &root, &["--join", &once]);
    wait_for("the first agent enrolled", Duration::from_secs(30), || {
        let n: Vec<String> = query(&store, "SELECT name FROM agents", |r| r.get(0));
        n.contains(&format!("{root}-one"))
    });
    let fleet_token = join_token_of(&root).expect("token");
    // (what, flags, what it is told, whether it stops: a dead token cannot
    // help, an unknown key or a taken name can once the operator acts).
    let cases: [(&str, Vec<&str>, &str, bool); 4] = [
        ("no token", vec!["--coordinator-key", &key], "tunefleet token create", false),
        ("revoked", vec!["--join", &revoked], "was revoked", true),
        ("used up", vec!["--join", &once], "has no uses left", true),
        // Another machine under a name that is taken (its own key).
        ("name taken", vec!["--join", &fleet_token], "give each agent its own --name", false),
    ];
    for (i, (what, args, says, stops)) in cases.iter().enumerate() {
        let name = if *what == "name taken" { format!("{root}-one") } else { format!("{root}-r{i}") };
        // Its own key: a state directory of its own.
        let state = dir.path().join(format!("state-{i}"));
        let mut args = args.clone();
        let state_arg = state.display().to_string();
        args.extend(["--state-dir", &state_arg]);
        let log = dir.path().join(format!("agent-{i}.log"));
        let (code, text, took) = refused_agent(&url, &name, &root, &log, &args);
        if *stops {
            assert!(code.is_some_and(|c| c != 0), "{what}: exits non-zero ({code:?})\n{text}");
        } else {
            assert_eq!(code, None, "{what}: goes on asking\n{text}");
        }
        assert!(text.contains("refused this agent") && text.contains(says), "{what}: {text}");
        assert!(took < Duration::from_secs(10), "{what}: told in {took:?}");
        eprintln!("measured: {what}: told in {:.2} s (stopped: {stops})", took.as_secs_f64());
    }
    // The agent that holds the name is told too.
    wait_for("the name's holder told", Duration::from_secs(10), || {
        std::fs::read_to_string(&first_log)
            .is_ok_and(|t| t.contains("another machine tried to join under this agent's name"))
    });
    let agent = start_agent(&url, &format!("{root}-two"), &root, &["--tag", "pool=last"]);
    assert!(coord.wait_exit(Duration::from_secs(120)).success());
    drop((first, agent));
    assert_agents_spools_empty(&[&format!("{root}-one"), &format!("{root}-two")]);
}

/// Anyone on the broker could overwrite the retained coordinator
/// status; a restarting agent then ignored it (its signature fails) and
/// waited for the next refresh, about 27 s. The coordinator now puts its
/// own back at once. On an open external broker (the embedded one keeps
/// the coordinator's status topic to the coordinator:
/// `strangers_members_and_operators_reach_only_what_they_were_granted`).
#[test]
#[cfg_attr(not(feature = "full"), ignore = "needs Mosquitto: the full tier (scripts/test.sh)")]
fn regression_an_overwritten_retained_status_is_put_back_at_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("retained");
    let broker = tunefleet_tests::mosquitto::Mosquitto::start(dir.path(), tunefleet_tests::mosquitto::FLEET_OPTIONS);
    let open = ["--broker", &broker.url()];
    let (mut coord, url) = start_coordinator(&short_study(dir.path(), "retained", 4), &store, &root, &open);
    let mut member = Member::connect(port_of(&url), &root, "vandal");
    let topic = tunefleet_common::topic::Topics::new(&root).expect("root").coordinator_status();
    member.publish_raw(&topic, b"not a status".to_vec(), true);
    member.disconnect();
    let name = format!("{root}-a");
    let started = Instant::now();
    let agent = start_agent(&url, &name, &root, &[]);
    wait_for("the agent welcomed despite the forged status", Duration::from_secs(10), || {
        let n: Vec<String> = query(&store, "SELECT name FROM agents WHERE online = 1", |r| r.get(0));
        n.contains(&name)
    });
    eprintln!(
        "measured: welcomed {:.2} s after start, the status overwritten just before",
        started.elapsed().as_secs_f64()
    );
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("malformed messages") || out.contains("refused:"), "the overwrite was counted: {out}");
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}

/// Finding 2: progress rows had no bound (one per epoch number, an epoch a
/// u32): 1,000 in-bounds messages added 82 MiB to the store in 6 s. Now an
/// attempt keeps at most 4,096 epochs and 1 MiB of progress.
#[test]
fn regression_a_member_cannot_fill_the_store_with_progress() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("progress");
    let (mut coord, url) = start_coordinator(&short_study(dir.path(), "progress", 4), &store, &root, &[]);
    let token: tunefleet_common::auth::JoinToken = join_token_of(&root).expect("token").parse().expect("token");
    let mut member = Member::connect(port_of(&url), &root, "phone-p");
    assert!(matches!(member.hello(AgentInfo::minimal("x", 0), Some(&token)), Answer::Welcome));
    member.send(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let trial = member
        .receive(Duration::from_secs(5))
        .into_iter()
        .find_map(|m| match m {
            CoordinatorMessage::Assign(a) => Some(a.trial),
            _ => None,
        })
        .expect("an assignment");
    // 1,000 epochs of 256 metrics with long names: about 55 MiB unbounded.
    let metrics: tunefleet_common::measurement::Metrics =
        (0..256).map(|i| (format!("{}{i:03}", "m".repeat(200)), i as f64)).collect();
    for epoch in 0..1_000u32 {
        member.send(&AgentMessage::Progress(tunefleet_common::message::Progress {
            trial: trial.clone(),
            epoch,
            elapsed_us: u64::from(epoch),
            metrics: metrics.clone(),
            checkpoint: None,
            profile: None,
        }));
    }
    member.receive(Duration::from_millis(500));
    member.go_offline();
    member.disconnect();
    let agent = start_agent(&url, &format!("{root}-a"), &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    let rows: Vec<i64> = query(&store, "SELECT COUNT(*) FROM progress", |r| r.get(0));
    let bytes: Vec<i64> = query(&store, "SELECT COALESCE(SUM(length(metrics)), 0) FROM progress", |r| r.get(0));
    eprintln!("measured: {} progress rows, {} bytes of metrics kept of 1,000 epochs sent", rows[0], bytes[0]);
    assert!(bytes[0] < 2 << 20, "at most about 1 MiB of progress kept: {} bytes in {} rows", bytes[0], rows[0]);
    assert!(out.contains("epochs past an attempt's bound"), "the rest counted: {out}");
    drop(agent);
    assert_agents_spools_empty(&[&format!("{root}-a")]);
}

/// Finding 6: `--allow-command '/dir/*'` admitted `/dir/../../../../bin/sh`.
/// A real agent now refuses it (and the trial runs nowhere it may not).
/// Runs a one-trial study of `command` (a TOML array) and `env` lines
/// under an agent started with `--allow-command DIR/*`, where DIR is
/// `dir/bench`; waits for the agent to refuse it and returns its log.
fn refused_by_allow_command(dir: &Path, test: &str, command: &str, env: &str) -> String {
    let store = dir.join("s.db");
    let root = unique_root(test);
    let study = dir.join(format!("{test}.toml"));
    let text = format!(
        "name = \"{test}\"\ncommand = {command}\n{env}timeout = 60\n\
         [objective]\nmetric = \"v\"\ndirection = \"maximize\"\n[budget]\ntrials = 1\n[strategy]\nkind = \"grid\"\n\
         [hyper.v]\nkind = \"categorical\"\nvalues = [1]\n"
    );
    std::fs::write(&study, text).expect("study");
    let (_coord, url) = start_coordinator(&study, &store, &root, &[]);
    let log = dir.join("agent.log");
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.stderr(std::fs::File::create(&log).expect("log"));
    let pattern = format!("{}/*", dir.join("bench").display());
    let name = format!("{root}-a");
    let agent = start_agent_with(cmd, &url, &name, &root, &["--allow-command", &pattern]);
    wait_for("the assignment refused", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains("assignment refused by --allow-command"))
    });
    drop(agent);
    assert_agents_spools_empty(&[&name]);
    std::fs::read_to_string(&log).unwrap_or_default()
}

#[test]
fn regression_allow_command_refuses_a_path_that_climbs_out_of_its_directory() {
    let dir = tempfile::tempdir().expect("tmp");
    let allowed = dir.path().join("bench");
    std::fs::create_dir_all(&allowed).expect("dir");
    let marker = dir.path().join("escaped");
    let climbing = format!("{}/../../../../../../bin/sh", allowed.display());
    let command = format!("[{climbing:?}, \"-c\", \"touch {} ; echo TUNEFLEET final v={{v}}\"]", marker.display());
    let text = refused_by_allow_command(dir.path(), "allow", &command, "");
    assert!(text.contains("has a . or .. component"), "{text}");
    assert!(!marker.exists(), "the command ran");
}

#[test]
fn regression_allow_command_refuses_an_env_that_makes_the_allowed_program_run_more() {
    let dir = tempfile::tempdir().expect("tmp");
    let allowed = dir.path().join("bench");
    std::fs::create_dir_all(&allowed).expect("dir");
    let script = allowed.join("run.sh");
    std::fs::write(&script, "#!/bin/bash\necho TUNEFLEET final v=1\n").expect("script");
    let exec: std::fs::Permissions = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&script, exec).expect("chmod");
    let marker = dir.path().join("escaped");
    // bash expands BASH_ENV before it sources it: the substitution runs as the agent's user.
    let command = format!("[{:?}]", script.display().to_string());
    let env = format!("env = {{ BASH_ENV = \"$(touch {})\" }}\n", marker.display());
    let text = refused_by_allow_command(dir.path(), "allowenv", &command, &env);
    assert!(text.contains("BASH_ENV") && text.contains("--allow-env BASH_ENV"), "{text}");
    assert!(!marker.exists(), "BASH_ENV ran as the agent's user");
}

#[test]
fn regression_one_token_file_is_not_a_fleet_of_sybils() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("sybil");
    let (mut coord, url) = start_coordinator(&short_study(dir.path(), "sybil", 10), &store, &root, &[]);
    // A token made with no --uses: it admits a stated number of names, not any number.
    let store_arg = store.display().to_string();
    let (code, text, err) = tunefleet(&["token", "create", "--store", &store_arg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("admits 10 new agent name(s)"), "the uses are said when it is made: {err}");
    let token: tunefleet_common::auth::JoinToken = text.trim().parse().expect("token");
    let (mut welcomed, mut refused) = (0, 0);
    for i in 0..25 {
        let mut member = Member::connect(port_of(&url), &root, &format!("sybil-{i}"));
        match member.hello(AgentInfo { slots: 64, ..AgentInfo::minimal("x", 0) }, Some(&token)) {
            Answer::Welcome => {
                welcomed += 1;
                member.go_offline();
            }
            Answer::Refused(_) => refused += 1,
        }
        member.disconnect();
    }
    assert_eq!((welcomed, refused), (10, 15), "the token's uses, then refusals");
    // An honest agent with another token is admitted and runs the study.
    let name = format!("{root}-honest");
    let agent = start_agent(&url, &name, &root, &[]);
    assert!(coord.wait_exit(Duration::from_secs(120)).success());
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}

/// Capacity per token, not only per name. A token
/// made with `--total-slots 4` admits many names, but together they are
/// given 4 slots: the first name online takes them, the next ones are
/// given what is left (none), whatever they announce; an honest agent with
/// another token is admitted and runs the study.
#[test]
fn a_tokens_names_share_the_slots_it_grants_in_all() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("shared");
    let trials = 12u32;
    let (mut coord, url) = start_coordinator(&short_study(dir.path(), "shared", trials), &store, &root, &[]);
    let s = store.display().to_string();
    let (code, text, err) =
        tunefleet(&["token", "create", "--store", &s, "--uses", "20", "--slots", "4", "--total-slots", "4"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("slots in all <= 4"), "the grant is said: {err}");
    let token: tunefleet_common::auth::JoinToken = text.trim().parse().expect("token");
    let announced = AgentInfo { slots: 4, lookahead: 0, ..AgentInfo::minimal("x", 0) };
    let mut given = Vec::new();
    let mut members = Vec::new();
    for i in 0..3 {
        let mut m = Member::connect(port_of(&url), &root, &format!("{root}-sybil-{i}"));
        assert!(matches!(m.hello(announced.clone(), Some(&token)), Answer::Welcome), "name {i} admitted");
        m.send(&AgentMessage::Request(WorkRequest { seq: 1, free: 4, ahead: 0, running: vec![], held: vec![] }));
        let got = m.receive(Duration::from_millis(500));
        given.push(got.iter().filter(|m| matches!(m, CoordinatorMessage::Assign(_))).count());
        members.push(m);
    }
    assert_eq!(given, [4, 0, 0], "the token's 4 slots in all, taken by the first name online");
    for m in &mut members {
        m.go_offline();
        m.receive(Duration::from_millis(100));
    }
    // An honest agent with the fleet's own token runs everything.
    let honest = format!("{root}-honest");
    let agent = start_agent(&url, &honest, &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    let by_honest: Vec<i64> =
        query(&store, &format!("SELECT COUNT(*) FROM results WHERE agent = '{honest}'"), |r| r.get(0));
    assert_eq!(by_honest, [i64::from(trials)], "{out}");
    drop(agent);
    assert_agents_spools_empty(&[&honest]);
}

/// Trials held ahead were counted as running (`4 of
/// 2 slots busy`). Now `status`, `agents` and the page count them apart:
/// an agent of 1 slot runs 1 and holds the next ones ahead.
#[test]
fn trials_held_ahead_are_counted_apart_from_running_ones() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("held");
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "held", 4, 1.5), &store, &root, &[]);
    let name = format!("{root}-one");
    let agent = start_agent(&url, &name, &root, &["--slots", "1"]);
    let s = store.display().to_string();
    let json = |args: &[&str]| -> serde_json::Value {
        let (_, out, _) = tunefleet(&[args, &["--store", &s]].concat());
        serde_json::from_str(&out).unwrap_or_default()
    };
    wait_for("a trial running and one held ahead", Duration::from_secs(60), || {
        let st = json(&["status", "--json"]);
        st[0]["running"] == 1 && st[0]["held"].as_u64().unwrap_or(0) >= 1
    });
    let agents = json(&["agents", "--json"]);
    let me = agents.as_array().and_then(|a| a.iter().find(|r| r["name"] == name.as_str())).expect("the agent");
    assert_eq!(me["running"].as_array().map(Vec::len), Some(1), "{me}");
    assert!(me["held"].as_array().is_some_and(|h| !h.is_empty()), "{me}");
    let (_, text, _) = tunefleet(&["status", "--store", &s]);
    assert!(text.contains("1 running, ") && text.contains(" held ahead"), "{text}");
    assert!(coord.wait_exit(Duration::from_secs(120)).success());
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}
