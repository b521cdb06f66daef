//! The store on a real PostgreSQL server (Debian's, a cluster of the
//! test's own): a study run by real coordinator and agent processes ends
//! as it does on SQLite and every view reads it, a store copied SQLite ->
//! PostgreSQL -> SQLite is equal table by table, the server restarted mid
//! study loses nothing, and a password on the command line is refused.
#![cfg(feature = "full")]

use std::path::Path;
use std::time::Duration;

use tunefleet_tests::postgres::Postgres;
use tunefleet_tests::*;

/// A study `name` of `trials` trials of `sleep 0.1`, written in `dir` and loaded.
fn sleep_study_in(dir: &Path, name: &str, trials: u32) -> tunefleet_coordinator::domain::study::Study {
    tunefleet_coordinator::domain::study::load(&sleep_study(dir, name, trials, 0.1)).expect("study")
}

/// A measurement of a workload that exited 0 and measured nothing else.
fn exited_0() -> tunefleet_common::measurement::Measurement {
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};
    Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
}

/// A store on `pg` in schema `name` holding a study `name` of `trials`
/// trials of `sleep 0.1`, opened and committed.
fn store_with_sleep_study(pg: &Postgres, name: &str, trials: u32) -> tunefleet_coordinator::store::Store {
    use tunefleet_coordinator::domain::search;
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study_in(dir.path(), name, trials);
    let mut store = tunefleet_coordinator::store::Store::open(Path::new(&pg.store(name))).expect("the store");
    let mut b = store.batch().expect("batch");
    tunefleet_coordinator::runtime::engine::open_study_at(&mut b, &study, &search::plan(&study), 1000).expect("opened");
    b.commit().expect("committed");
    store
}

/// Trial `trial`'s first attempt in study `study`.
fn trial_ref(study: &str, trial: u64) -> tunefleet_common::message::TrialRef {
    tunefleet_common::message::TrialRef { study: study.into(), study_id: 7, trial, attempt: 1 }
}

/// Runs `study` into `store` with two agents; the coordinator's output.
fn run_two_agents(study: &Path, store: &str, test: &str) -> String {
    let root = unique_root(test);
    let (mut coord, url) = start_coordinator(study, Path::new(store), &root, &[]);
    let names = [format!("{root}-a"), format!("{root}-b")];
    let agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &[])).collect();
    let status = coord.wait_exit(Duration::from_secs(180));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    drop(agents);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
    out
}

/// The CSV export without what differs between two runs of one study
/// (times, agents, energy): trial, repeat, state, v, objective.
fn stable_columns(csv: &str) -> Vec<String> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let keep: Vec<usize> = ["trial", "repeat", "state", "v", "objective"]
        .iter()
        .map(|c| header.iter().position(|h| h == c).unwrap_or_else(|| panic!("no column {c} in {header:?}")))
        .collect();
    lines.map(|l| keep.iter().map(|&i| l.split(',').nth(i).unwrap_or("")).collect::<Vec<_>>().join(",")).collect()
}

/// Every value under an `objective` key in `json`, in order.
fn objectives_in(json: &serde_json::Value, out: &mut Vec<String>) {
    match json {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if k == "objective" {
                    out.push(v.to_string());
                } else {
                    objectives_in(v, out);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| objectives_in(v, out)),
        _ => {}
    }
}

#[test]
fn a_study_on_postgresql_ends_as_on_sqlite_and_every_view_reads_it() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study(dir.path(), "pgrid", 12, 0.1);
    let url = pg.store("lab_a");
    let out = run_two_agents(&study, &url, "pg-run");
    assert!(out.contains("12/12 trials done, 0 failed"), "{out}");
    assert_eq!(pg.query("SELECT COUNT(*) FROM lab_a.results"), "12", "the results are in the server's schema");
    let sqlite = dir.path().join("same.db");
    let sqlite_s = sqlite.to_str().expect("utf-8").to_string();
    run_two_agents(&study, &sqlite_s, "pg-sqlite");

    let on = |store: &str, args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--store", store]);
        let (code, out, err) = tunefleet(&all);
        assert_eq!(code, Some(0), "tunefleet {all:?}: {err}");
        out
    };
    let csv_pg = on(&url, &["export", "pgrid", "--format", "csv"]);
    let csv_lite = on(&sqlite_s, &["export", "pgrid", "--format", "csv"]);
    assert_eq!(stable_columns(&csv_pg), stable_columns(&csv_lite), "the same trials, states and objectives");
    assert_eq!(stable_columns(&csv_pg).len(), 12);
    let best = |store: &str| {
        let json: serde_json::Value =
            serde_json::from_str(&on(store, &["best", "pgrid", "-n", "3", "--json"])).expect("best json");
        let mut objectives = Vec::new();
        objectives_in(&json, &mut objectives);
        objectives
    };
    let ranked = best(&url);
    assert_eq!(ranked.len(), 3, "three best: {ranked:?}");
    assert_eq!(ranked, best(&sqlite_s), "best reads the same ranking");
    let status = on(&url, &["status", "pgrid"]);
    assert!(status.contains("12/12 done"), "{status}");
    assert!(on(&url, &["studies"]).contains("pgrid"));
    assert!(on(&url, &["agents"]).contains("-a "), "the agents are listed");
    let report = dir.path().join("r.html");
    on(&url, &["report", "pgrid", "-o", report.to_str().expect("utf-8")]);
    assert!(std::fs::read_to_string(&report).expect("report").contains("pgrid"));
    // Another fleet's schema on the same server sees none of it.
    let other = on(&pg.store("lab_b"), &["studies"]);
    assert!(!other.contains("pgrid"), "{other}");
}

/// A pipelined training study of `trials` trials over the rates `lrs`,
/// threads probed epoch by epoch, reuse on or off.
fn train_study(dir: &Path, name: &str, lrs: &str, trials: u32, reuse: bool) -> std::path::PathBuf {
    let text = format!(
        r#"name = "{name}"
timeout = 120
lookahead = 0
command = ["tunefleet-train", "--lr", "{{lr}}", "--epochs", "6", "--passes", "4", "--hidden", "256", "--threads", "{{threads}}"]
objective = {{ metric = "accuracy", direction = "maximize" }}
hyper.lr = {{ kind = "categorical", values = [{lrs}] }}
reuse = {{ enabled = {reuse} }}
system.threads = {{ kind = "int", low = 1, high = 2 }}
budget = {{ trials = {trials} }}
strategy = {{ kind = "grid" }}
{PIPELINE_EPOCH_WINDOWS}control = true
"#
    );
    let study = dir.join(format!("{name}.toml"));
    std::fs::write(&study, text).expect("study");
    study
}

#[test]
fn a_store_copied_sqlite_to_postgresql_and_back_is_equal() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let first = dir.path().join("first.db");
    let back = dir.path().join("back.db");
    let first_s = first.to_str().expect("utf-8").to_string();
    // The demo: energy estimates, epochs, a join token, enrolled agents.
    let (code, _, err) = tunefleet(&["demo", "--store", &first_s]);
    assert_eq!(code, Some(0), "demo: {err}");
    // Pipelined windows, profiles, a cluster model and reuse decisions: a
    // training job that teaches, then a recurring one with reuse on.
    for (name, lrs, trials, reuse) in [("learn", "0.05, 0.1", 2, false), ("recur", "0.2", 1, true)] {
        let study = train_study(dir.path(), name, lrs, trials, reuse);
        let out = run_with_one_agent(&study, &first, "pg-copy", &["--slots", "1"], Duration::from_secs(240));
        assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    }
    let url = pg.store("copied");
    let copy = |from: &str, to: &str| {
        let (code, out, err) = tunefleet(&["store", "copy", from, to, "--json"]);
        assert_eq!(code, Some(0), "store copy {from} {to}: {err}");
        let tables: serde_json::Value = serde_json::from_str(&out).expect("json");
        tables.as_array().expect("tables").clone()
    };
    let there = copy(&first_s, &url);
    let back_again = copy(&url, back.to_str().expect("utf-8"));
    assert_eq!(there, back_again, "the same rows and digests both ways");
    let rows = |t: &[serde_json::Value], table: &str| {
        t.iter().find(|c| c["table"] == table).map(|c| c["rows"].as_u64().unwrap_or(0)).unwrap_or(0)
    };
    assert_eq!(rows(&there, "results"), 15, "the demo's 12 and the training jobs' 3: {there:?}");
    assert!(rows(&there, "progress") > 0 && rows(&there, "agent_keys") > 0, "{there:?}");
    for table in ["segments", "profiles", "cluster_models", "reuse_decisions"] {
        assert!(rows(&there, table) > 0, "{table}: {there:?}");
    }
    assert!(there.iter().all(|c| c["digest_from"] == c["digest_to"]), "{there:?}");
    // What a user sees of the copies is what they saw of the original.
    let csv = |store: &str| tunefleet(&["export", "demo", "--format", "csv", "--store", store]).1;
    assert_eq!(csv(&url), csv(&first_s));
    assert_eq!(csv(back.to_str().expect("utf-8")), csv(&first_s));
    // A copy never merges into a store with rows.
    let (code, _, err) = tunefleet(&["store", "copy", &first_s, &url]);
    assert_ne!(code, Some(0));
    assert!(err.contains("already holds rows"), "{err}");
}

/// A 30-trial study on the store at `url`, whose coordinator is started
/// with its log kept.
struct Interrupted {
    schema: String,
    study: std::path::PathBuf,
    url: String,
    root: String,
    listen: String,
    log: std::path::PathBuf,
}

impl Interrupted {
    fn new(dir: &Path, name: &str, url: String) -> Interrupted {
        Interrupted {
            schema: name.to_string(),
            study: sleep_study(dir, name, 30, 0.3),
            url,
            root: unique_root(&format!("pg-{name}")),
            listen: format!("127.0.0.1:{}", free_port()),
            log: dir.join("coordinator.log"),
        }
    }

    fn start(&self) -> (Proc, String) {
        let args = ["--listen", self.listen.as_str()];
        start_coordinator_logged(&self.study, Path::new(&self.url), &self.root, &args, Some(&self.log))
    }
}

/// Two agents on `broker`, and their names.
fn two_agents(broker: &str, root: &str) -> (Vec<Proc>, [String; 2]) {
    let names = [format!("{root}-a"), format!("{root}-b")];
    (names.iter().map(|n| start_agent(broker, n, root, &[])).collect(), names)
}

/// A study of 30 trials, on a server of its own, in schema `schema`:
/// its coordinator running, reaching the server through a proxy the test
/// controls when asked, with two agents.
struct Running {
    pg: Postgres,
    proxy: Option<tunefleet_tests::proxy::Proxy>,
    run: Interrupted,
    coord: Proc,
    agents: (Vec<Proc>, [String; 2]),
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(schema: &str, through_proxy: bool) -> Running {
        let pg = Postgres::start();
        let proxy = through_proxy.then(|| tunefleet_tests::proxy::Proxy::start(pg.port));
        let port = proxy.as_ref().map_or(pg.port, |p| p.port);
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("postgres://tunefleet@127.0.0.1:{port}/postgres?schema={schema}");
        let run = Interrupted::new(dir.path(), schema, url);
        let (coord, broker) = run.start();
        let agents = two_agents(&broker, &run.root);
        Running { pg, proxy, run, coord, agents, _dir: dir }
    }

    /// How many results the study holds.
    fn stored(&self) -> u32 {
        self.pg.query(&format!("SELECT COUNT(*) FROM {}.results", self.run.schema)).parse().unwrap_or(0)
    }

    /// Ends every connection the proxy carries: how many.
    fn cut(&self) -> usize {
        self.proxy.as_ref().expect("started through a proxy").cut()
    }

    /// Waits for the coordinator to exit, which must be a success (it
    /// paused for its database rather than stop), with every trial done
    /// once, 0 failed, and every agent's spool empty; its log.
    fn every_trial_once(mut self) -> String {
        let status = self.coord.wait_exit(Duration::from_secs(240));
        let out = self.coord.rest_of_stdout().join("\n");
        let text = std::fs::read_to_string(&self.run.log).unwrap_or_default();
        assert!(status.success(), "the coordinator stopped rather than pause: {status:?}\n{out}\n{text}");
        let paused = text.matches("the store's database is unreachable: paused").count();
        let restored = text.matches("studies taken back from the store").count();
        eprintln!("the coordinator paused {paused} time(s) and took its studies back {restored} time(s)");
        assert_eq!(paused, restored, "each pause ends with the studies taken back: {text}");
        assert!(out.contains("30/30 trials done, 0 failed"), "{out}\n{text}");
        assert_eq!(self.stored(), 30, "one result per trial");
        let schema = &self.run.schema;
        assert_eq!(self.pg.query(&format!("SELECT COUNT(*) FROM {schema}.trials WHERE state = 'done'")), "30");
        let (agents, names) = self.agents;
        drop(agents);
        assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
        text
    }
}

/// The server killed and started again mid-study. A coordinator that
/// loses its database, in a turn, under a commit or between turns, pauses
/// until it answers, takes its studies back from the store (what it held
/// may be ahead of what the store kept) and goes on: it never stops, and
/// every trial is done once, 0 failed.
#[test]
fn the_server_restarted_mid_study_loses_nothing() {
    let study = Running::start("restart", false);
    wait_for("a third of the trials stored", Duration::from_secs(120), || study.stored() >= 10);
    study.pg.restart();
    study.every_trial_once();
}

/// The coordinator's connections to the server cut twice mid-study (a
/// proxy the test controls ends every connection it carries): it pauses
/// on the lost connection and goes on, never stopping, and the study ends
/// with every trial once.
#[test]
fn the_coordinators_connections_cut_mid_study_lose_nothing() {
    let study = Running::start("cut", true);
    let mut cuts = 0;
    for at in [8, 16] {
        wait_for("results stored before the cut", Duration::from_secs(120), || study.stored() >= at);
        cuts += study.cut();
    }
    assert!(cuts >= 2, "connections were carried and cut: {cuts}");
    study.every_trial_once();
}

/// The coordinator's connection cut while its writes wait on a lock
/// another session holds on the results table (in its commit, or in the
/// turn when a later message settles them): the transaction is lost with
/// its connection, and what the coordinator holds is ahead of what the
/// store kept. Its session on the server, still waiting, is ended as soon
/// as the coordinator connects again (while the lock is held), so nothing
/// of it can land later. The coordinator pauses, takes its studies back
/// from the store once the server answers, and goes on: it never stops,
/// and the study ends with every trial once.
#[test]
fn a_commit_lost_with_its_connection_pauses_and_the_studies_are_taken_back() {
    let study = Running::start("lost", true);
    wait_for("results stored before the lock", Duration::from_secs(120), || study.stored() >= 8);
    let locked = study.pg.lock("lost.results", Duration::from_secs(60));
    let waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                   AND backend_type = 'client backend' AND application_name <> 'locker'";
    let mut pid = String::new();
    wait_for("the coordinator's writes wait on the lock", Duration::from_secs(30), || {
        pid = study.pg.query(waiting).lines().next().unwrap_or_default().to_string();
        !pid.is_empty()
    });
    assert!(study.cut() >= 1, "the coordinator's connection was carried and cut");
    let there = format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {pid}");
    wait_for("the lost session ended while the lock is held", Duration::from_secs(30), || {
        study.pg.query(&there) == "0"
    });
    assert!(locked.release(), "the lock was held until the lost session ended");
    let text = study.every_trial_once();
    assert!(text.contains("the store's database is unreachable: paused"), "{text}");
    assert!(text.contains("the lost connection's session was still on the server: ended"), "{text}");
}

/// A result the coordinator judged accepted but the store does not take
/// so (a trigger the test plants gives trial 5's first attempt to another
/// name in the store alone: its memory and its store disagree): the turn
/// fails as a whole, the result is not stored and the agent keeps it; the
/// store mended and the coordinator started again, the study ends with
/// every trial once and every spool empty.
#[test]
fn a_result_the_store_does_not_take_as_judged_fails_its_turn_and_nothing_is_lost() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let run = Interrupted::new(dir.path(), "disagree", pg.store("disagree"));
    let (mut coord, broker) = run.start();
    pg.query(
        "CREATE FUNCTION disagree.elsewhere() RETURNS trigger AS $$ BEGIN \
         IF NEW.trial = 5 AND NEW.attempt = 1 THEN NEW.agent := NEW.agent || '-elsewhere'; END IF; \
         RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER elsewhere BEFORE INSERT OR UPDATE ON disagree.attempts \
         FOR EACH ROW EXECUTE FUNCTION disagree.elsewhere()",
    );
    let (agents, names) = two_agents(&broker, &run.root);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    let text = std::fs::read_to_string(&run.log).unwrap_or_default();
    assert!(!status.success(), "the turn failed: {out}\n{text}");
    assert!(text.contains("disagree/5") && text.contains("memory and its store disagree"), "{status:?}\n{out}\n{text}");
    let five = pg.query("SELECT state || ' ' || (SELECT COUNT(*) FROM disagree.results WHERE trial = 5) FROM disagree.trials WHERE trial = 5");
    assert_eq!(five, "running 0", "nothing of the failed turn was committed");
    // The operator mends the store; the coordinator starts over from it.
    pg.query("DROP TRIGGER elsewhere ON disagree.attempts; UPDATE disagree.attempts SET agent = replace(agent, '-elsewhere', '') WHERE trial = 5");
    let (mut coord, _) = run.start();
    let status = coord.wait_exit(Duration::from_secs(240));
    let out = coord.rest_of_stdout().join("\n");
    let text = std::fs::read_to_string(&run.log).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{out}\n{text}");
    assert!(out.contains("30/30 trials done, 0 failed"), "{out}\n{text}");
    assert_eq!(pg.query("SELECT COUNT(*) FROM disagree.results"), "30", "one result per trial");
    drop(agents);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
}

/// The store over TLS: a server that refuses plain connections, a study
/// run on it with its certificate verified against the fleet's CA, and a
/// CA that did not sign it refused.
#[test]
fn a_store_over_tls_is_verified_and_another_ca_is_refused() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet-certs.sh");
    let (certs, other) = (dir.path().join("certs"), dir.path().join("other"));
    for d in [&certs, &other] {
        let out = std::process::Command::new("bash").arg(&script).arg(d).arg("127.0.0.1").output().expect("certs");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    pg.require_tls(&certs.join("broker.pem"), &certs.join("broker.key"));
    let tls = |ca: &Path| format!("{}&sslmode=verify-full&sslrootcert={}", pg.store("tls"), ca.display());
    let (code, _, err) = tunefleet(&["status", "--store", &pg.store("tls")]);
    assert_ne!(code, Some(0), "the server takes no plain connection");
    assert!(err.contains("no encryption") || err.contains("pg_hba"), "{err}");
    let (code, _, err) = tunefleet(&["status", "--store", &tls(&other.join("ca.pem"))]);
    assert_ne!(code, Some(0), "another CA");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let study = sleep_study(dir.path(), "tls", 6, 0.1);
    let out =
        run_with_one_agent(&study, Path::new(&tls(&certs.join("ca.pem"))), "pg-tls", &[], Duration::from_secs(120));
    assert!(out.contains("6/6 trials done, 0 failed"), "{out}");
    let ssl = pg.query("SELECT COUNT(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND a.usename = 'tunefleet'");
    assert!(ssl.parse::<u32>().unwrap_or(0) >= 1, "this query itself comes over TLS: {ssl}");
    assert_eq!(pg.query("SELECT COUNT(*) FROM tls.results"), "6");
}

/// A coordinator running on a server's store holds the store's running
/// lock there (an advisory lock of its own connection): a rename waits
/// for it to stop, and goes through once it has.
#[test]
fn a_study_is_not_renamed_under_a_coordinator_running_on_the_server() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study(dir.path(), "held", 4, 0.1);
    let url = pg.store("locked");
    let root = unique_root("pg-lock");
    let (coord, _broker) = start_coordinator(&study, Path::new(&url), &root, &[]);
    wait_for("the study in the store", Duration::from_secs(30), || {
        tunefleet(&["studies", "--store", &url]).1.contains("held")
    });
    let (code, _, err) = tunefleet(&["studies", "rename", "held", "held-1", "--store", &url]);
    assert_ne!(code, Some(0), "renamed under a running coordinator");
    assert!(err.contains("a coordinator is running"), "{err}");
    drop(coord);
    let mut renamed = false;
    wait_for("the rename once the coordinator is gone", Duration::from_secs(30), || {
        let (code, _, _) = tunefleet(&["studies", "rename", "held", "held-1", "--store", &url]);
        renamed = code == Some(0);
        renamed
    });
    assert!(tunefleet(&["studies", "--store", &url]).1.contains("held-1"));
}

#[test]
fn a_password_in_the_store_url_is_refused_and_the_environment_gives_it() {
    let (code, _, err) = tunefleet(&["studies", "--store", "postgres://tunefleet:hunter2@127.0.0.1:1/postgres"]);
    assert_ne!(code, Some(0));
    assert!(err.contains("TUNEFLEET_STORE_PASSWORD") && !err.contains("hunter2"), "{err}");
    let pg = Postgres::start_with(Some("s3cret-pw"));
    let dir = tempfile::tempdir().expect("tempdir");
    let url = pg.store("secured");
    let studies = |env: &[(&str, &str)]| {
        let mut c = std::process::Command::new(bin("tunefleet"));
        c.args(["studies", "--store", &url]).env_remove("TUNEFLEET_STORE_PASSWORD").envs(env.iter().copied());
        c.output().expect("tunefleet")
    };
    let refused = studies(&[]);
    assert!(!refused.status.success(), "no password, no store");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("password"), "the server's refusal is told: {said}");
    assert!(studies(&[("TUNEFLEET_STORE_PASSWORD", "s3cret-pw")]).status.success(), "from the environment");
    let file = dir.path().join("pw");
    std::fs::write(&file, "s3cret-pw\n").expect("write");
    let from_file = studies(&[("TUNEFLEET_STORE_PASSWORD_FILE", file.to_str().expect("utf-8"))]);
    assert!(from_file.status.success(), "from a file: {}", String::from_utf8_lossy(&from_file.stderr));
}

/// On a server a transaction's writes are sent with the next statement
/// that needs an answer, so a write's error comes late: it is still the
/// error of the part of the batch that wrote it. A duplicate trial written
/// inside a savepoint is refused when the batch settles, not before; the
/// savepoint undoes it alone, and what the batch wrote before and after it
/// is committed once.
#[test]
fn a_write_refused_late_is_undone_with_its_savepoint_alone() {
    use tunefleet_coordinator::domain::search::TrialPlan;
    use tunefleet_coordinator::runtime::engine::open_study;
    use tunefleet_coordinator::store::Store;

    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = sleep_study(dir.path(), "late", 3, 0.1);
    let study = tunefleet_coordinator::domain::study::load(&path).expect("study");
    let url = pg.store("late");
    let mut store = Store::open(Path::new(&url)).expect("the store on the server");
    let trial = |trial: u64| TrialPlan { trial, params: Default::default(), repeat: 0 };
    let mut b = store.batch().expect("batch");
    open_study(&mut b, &study, &[trial(0), trial(1), trial(2)]).expect("created");
    b.savepoint("message").expect("savepoint");
    // Trial 0 exists: the server refuses it, but nobody has asked yet.
    b.add_trials("late", &[trial(0)]).expect("sent later, not refused now");
    let err = b.settle().expect_err("the duplicate, once the batch settles");
    assert!(err.to_string().contains("duplicate key"), "{err}");
    b.rollback_to("message").expect("undone alone");
    b.savepoint("message").expect("savepoint");
    b.add_trials("late", &[trial(7)]).expect("a new trial");
    b.settle().expect("written");
    b.release("message").expect("kept");
    b.commit().expect("committed");
    let trials: Vec<u64> = store.trials("late").expect("trials").iter().map(|t| t.plan.trial).collect();
    assert_eq!(trials, [0, 1, 2, 7], "the study's trials and the new one, once each");
    // Unsettled, a refused write fails the commit: nothing of it lands.
    let mut b = store.batch().expect("batch");
    b.add_trials("late", &[trial(8), trial(1)]).expect("sent later");
    b.commit().expect_err("the duplicate fails the commit");
    let trials = store.trials("late").expect("trials").len();
    assert_eq!(trials, 4, "trial 8 went with the refused commit");
}

/// A new store opened by several connections at once (a coordinator and
/// its broker's logins do, as it starts): every one opens it; none loses a
/// race on creating the schema's own table.
#[test]
fn connections_opening_a_new_store_at_once_all_open_it() {
    use tunefleet_coordinator::store::Store;

    let pg = Postgres::start();
    for round in 0..6 {
        let url = pg.store(&format!("race{round}"));
        let path = Path::new(&url);
        let opened: Vec<Result<(), String>> = std::thread::scope(|s| {
            let opens: Vec<_> = (0..4)
                .map(|i| {
                    s.spawn(move || match i % 2 {
                        0 => Store::open(path).map(drop).map_err(|e| e.to_string()),
                        _ => Store::open_read_only(path).map(drop).map_err(|e| e.to_string()),
                    })
                })
                .collect();
            opens.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("panicked".into()))).collect()
        });
        for result in &opened {
            // A reader may find the store not made yet; a failed race is a bug.
            if let Err(e) = result {
                assert!(!e.contains("duplicate key"), "round {round}: {e}");
            }
        }
        assert!(opened.iter().step_by(2).all(Result::is_ok), "round {round}: every writer opens it: {opened:?}");
    }
}

/// On a server an attempt's assignment and an accepted result are each one
/// statement where a file takes three: every outcome (stored, a duplicate,
/// superseded late or never handed out, a stopped trial's result, a
/// failure, a reassignment, a closed or unknown trial) answers the same
/// and leaves the same rows, digest for digest, in both.
#[test]
fn every_outcome_of_a_result_leaves_the_same_rows_on_a_server_as_in_a_file() {
    use std::collections::BTreeMap;
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};
    use tunefleet_common::message::TrialRef;
    use tunefleet_coordinator::domain::search;
    use tunefleet_coordinator::runtime::engine::open_study_at;
    use tunefleet_coordinator::store::{copy, Store};

    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study_in(dir.path(), "same", 8);
    let file = dir.path().join("same.db").display().to_string();
    let measured = |v: f64, exit: ExitOutcome| Measurement {
        wall_us: 1_500_000,
        user_us: 1_000_000,
        final_metrics: BTreeMap::from([("v".to_string(), v)]),
        energy: EnergyReading {
            joules: 12.5,
            valid: true,
            ..EnergyReading::none(EnergySourceKind::Estimated, "model")
        },
        log_tail: "the last line".into(),
        ..Measurement::unmeasured(exit, EnergyReading::none(EnergySourceKind::Estimated, ""))
    };
    let t = |trial: u64, attempt: u32| TrialRef { study: "same".into(), study_id: 7, trial, attempt };
    let mut answers = Vec::new();
    let mut digests = Vec::new();
    for url in [file.clone(), pg.store("same")] {
        let mut store = Store::open(Path::new(&url)).expect("the store");
        let mut said = Vec::new();
        let mut step = |store: &mut Store, f: &dyn Fn(&mut tunefleet_coordinator::store::Batch<'_>) -> String| {
            let mut b = store.batch().expect("batch");
            said.push(f(&mut b));
            b.commit().expect("committed");
        };
        step(&mut store, &|b| format!("{:?}", open_study_at(b, &study, &search::plan(&study), 1000)));
        let assign = |b: &mut tunefleet_coordinator::store::Batch<'_>, r: TrialRef, agent: &str, held: bool| {
            let at = 2000 + 10 * r.trial + u64::from(r.attempt);
            // A server says a trial that ended is refused when the batch settles.
            b.record_assignment_held(&r, agent, at, held).and_then(|()| b.settle()).map_err(|e| e.to_string())
        };
        let result = |b: &mut tunefleet_coordinator::store::Batch<'_>, r: TrialRef, agent: &str, exit: ExitOutcome| {
            let at = 3000 + 10 * r.trial + u64::from(r.attempt);
            let v = 0.5 + r.trial as f64;
            format!("{:?}", b.record_result(&r, agent, &measured(v, exit), Some(v), at).map_err(|e| e.to_string()))
        };
        // Stored, then the same again: a duplicate.
        step(&mut store, &|b| {
            format!("{:?} {}", assign(b, t(0, 1), "a1", false), result(b, t(0, 1), "a1", ExitOutcome::Exited(0)))
        });
        step(&mut store, &|b| result(b, t(0, 1), "a1", ExitOutcome::Exited(0)));
        step(&mut store, &|b| {
            let again = b.record_result(&t(0, 1), "a1", &measured(9.0, ExitOutcome::Exited(0)), Some(9.0), 9999);
            format!("{:?}", again.map_err(|e| e.to_string()))
        });
        // Requeued and given again: the second attempt's result counts, the first's comes late.
        step(&mut store, &|b| {
            format!(
                "{:?} {:?}",
                assign(b, t(1, 1), "a1", true),
                b.requeue_at(&t(1, 1), "lost", 2500).map_err(|e| e.to_string())
            )
        });
        step(&mut store, &|b| {
            format!("{:?} {}", assign(b, t(1, 2), "a2", false), result(b, t(1, 2), "a2", ExitOutcome::Exited(0)))
        });
        step(&mut store, &|b| result(b, t(1, 1), "a1", ExitOutcome::Exited(0)));
        // Never handed to this agent: superseded.
        step(&mut store, &|b| result(b, t(2, 1), "a3", ExitOutcome::Exited(0)));
        // Stopped early: its result is kept, the trial stays stopped.
        step(&mut store, &|b| {
            format!(
                "{:?} {:?} {}",
                assign(b, t(3, 1), "a1", false),
                b.stop_trial(&t(3, 1), "asha", 2600).map_err(|e| e.to_string()),
                result(b, t(3, 1), "a1", ExitOutcome::Exited(0))
            )
        });
        // A failure, with why.
        step(&mut store, &|b| {
            format!("{:?} {}", assign(b, t(4, 1), "a1", true), result(b, t(4, 1), "a1", ExitOutcome::Exited(3)))
        });
        // Given again while open: the first attempt is closed as reassigned.
        step(&mut store, &|b| {
            format!(
                "{:?} {:?} {}",
                assign(b, t(5, 1), "a1", false),
                assign(b, t(5, 2), "a2", false),
                result(b, t(5, 2), "a2", ExitOutcome::Exited(0))
            )
        });
        // Requeued and given again, the first attempt's result first: it
        // counts, and the second attempt, still open, is cancelled.
        step(&mut store, &|b| {
            format!(
                "{:?} {:?} {:?}",
                assign(b, t(6, 1), "a1", false),
                b.requeue_at(&t(6, 1), "lost", 2500).map_err(|e| e.to_string()),
                assign(b, t(6, 2), "a2", false)
            )
        });
        step(&mut store, &|b| result(b, t(6, 1), "a1", ExitOutcome::Exited(0)));
        // The same attempt given twice: the second agent's.
        step(&mut store, &|b| {
            format!(
                "{:?} {:?} {}",
                assign(b, t(7, 1), "a1", true),
                assign(b, t(7, 1), "a2", false),
                result(b, t(7, 1), "a2", ExitOutcome::Exited(0))
            )
        });
        // A trial that ended is not given again; an unknown one has no result.
        step(&mut store, &|b| {
            format!("{:?} {}", assign(b, t(0, 2), "a2", false), result(b, t(99, 1), "a1", ExitOutcome::Exited(0)))
        });
        // A trial that ended given again beside another write (prepared
        // before: its preparing settles nothing): the batch commits nothing
        // (a file refuses at once, a server as it commits).
        step(&mut store, &|b| {
            let beat = b.beat(1, 5000, false, None, "{}").and_then(|()| b.savepoint("aside"));
            format!("{:?}", beat.and_then(|()| b.release("aside")).map_err(|e| e.to_string()))
        });
        let mut b = store.batch().expect("batch");
        let given = b.record_assignment(&t(0, 3), "a3", 6000);
        let committed = given.and_then(|()| {
            b.beat(1, 6000, false, None, "{}")?;
            b.commit()
        });
        let refused = committed.expect_err("refused").to_string();
        assert!(refused.contains("cannot be assigned again"), "{refused}");
        let beat = store.heartbeat().expect("heartbeat").map(|h| h.at_ms);
        assert_eq!(beat, Some(5000), "{url}: nothing committed");
        // Nor is the refusal forgiven when its savepoint is rolled back.
        let mut b = store.batch().expect("batch");
        let undone = b.savepoint("aside").and_then(|()| {
            b.record_assignment(&t(0, 3), "a3", 6000)?;
            b.beat(1, 7000, false, None, "{}")?;
            b.rollback_to("aside")
        });
        let refused = undone.expect_err("refused").to_string();
        assert!(refused.contains("cannot be assigned again"), "{url}: {refused}");
        drop(b);
        // A savepoint opened after it answers it first: the refusal is
        // never taken for an error of what the savepoint holds.
        let mut b = store.batch().expect("batch");
        let opened = b.record_assignment(&t(0, 3), "a3", 6000).and_then(|()| b.savepoint("aside"));
        let refused = opened.expect_err("refused as the savepoint opens").to_string();
        assert!(refused.contains("cannot be assigned again"), "{url}: {refused}");
        drop(b);
        let mut copied = Store::open(&dir.path().join(format!("copy{}.db", digests.len()))).expect("a copy");
        let tables: Vec<String> = copy(&store, &mut copied)
            .expect("copied")
            .into_iter()
            .filter(|c| ["trials", "attempts", "results"].contains(&c.table.as_str()))
            .map(|c| format!("{} {} {}", c.table, c.rows, c.digest_from))
            .collect();
        assert_eq!(tables.len(), 3, "{tables:?}");
        answers.push(said);
        digests.push(tables);
    }
    assert_eq!(answers[0], answers[1], "the same answers");
    for want in ["Ok(Stored)", "Ok(Duplicate)", "Ok(Superseded)", "cannot be assigned again", "unknown trial same/99"] {
        assert!(answers[0].iter().any(|a| a.contains(want)), "{want} among {:#?}", answers[0]);
    }
    assert_eq!(digests[0], digests[1], "the same rows");
    let sql =
        "SELECT trial || ' ' || attempt || ' ' || agent || ': ' || IFNULL(outcome, '-') FROM attempts WHERE trial >= 6";
    let outcomes = query(Path::new(&file), sql, |r| r.get::<_, String>(0));
    for want in ["6 2 a2: cancelled: attempt 1 delivered first", "7 1 a2: exited 0"] {
        assert!(outcomes.iter().any(|o| o == want), "{want} among {outcomes:#?}");
    }
}

/// A result the engine judged accepted is sent with the next statement
/// that needs an answer (no round trip of its own): the store's answer is
/// judged as the batch commits, and one that disagrees (a result stored
/// already, an attempt never given to that agent) commits nothing, where a
/// file refuses it at once. A result the server cannot hold (a NUL in its
/// text) is refused at once, nothing of it sent, and the batch goes on.
#[test]
fn a_result_judged_accepted_is_judged_with_the_commit_and_a_disagreement_lands_nothing() {
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome, Measurement};
    use tunefleet_common::message::TrialRef;
    use tunefleet_coordinator::domain::search;
    use tunefleet_coordinator::runtime::engine::open_study_at;
    use tunefleet_coordinator::store::{Batch, Store, TrialState};

    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study_in(dir.path(), "late", 4);
    let file = dir.path().join("late.db").display().to_string();
    // A workload's last line may hold anything: its NUL never reaches a text the server keeps.
    let measured = |exit: ExitOutcome| Measurement {
        log_tail: "ready\nboom\0bang".into(),
        ..Measurement::unmeasured(exit, EnergyReading::none(EnergySourceKind::Estimated, ""))
    };
    let t = |trial: u64| TrialRef { study: "late".into(), study_id: 7, trial, attempt: 1 };
    let accept = |b: &mut Batch<'_>, trial: u64, agent: &str, exit: ExitOutcome| {
        b.record_accepted(&t(trial), agent, &measured(exit), Some(0.5), 3000 + trial)
    };
    for url in [file.clone(), pg.store("late")] {
        let server = url.starts_with("postgres");
        let mut store = Store::open(Path::new(&url)).expect("the store");
        let mut b = store.batch().expect("batch");
        open_study_at(&mut b, &study, &search::plan(&study), 1000).expect("opened");
        for trial in [0, 1, 2] {
            b.record_assignment(&t(trial), "a1", 2000).expect("given");
        }
        accept(&mut b, 0, "a1", ExitOutcome::Exited(0)).expect("the batch").expect("sent");
        b.beat(1, 4000, false, None, "{}").expect("beat");
        b.commit().expect("committed");
        // Stored already, or never given to that agent: the batch commits nothing.
        for (trial, agent, why) in [(0, "a1", "a result of the trial already"), (1, "a2", "no attempt of it given")] {
            let mut b = store.batch().expect("batch");
            let refused = match accept(&mut b, trial, agent, ExitOutcome::Exited(0)) {
                Ok(sent) => {
                    assert!(server, "{url}: a file answers at once");
                    sent.expect("sent");
                    b.beat(1, 5000, false, None, "{}").expect("beat");
                    b.commit().expect_err("refused as it commits").to_string()
                }
                Err(e) => {
                    assert!(!server, "{url}: a server answers as the batch commits: {e}");
                    drop(b);
                    e.to_string()
                }
            };
            assert!(refused.contains(why) && refused.contains("disagree"), "{url}: {refused}");
            let beat = store.heartbeat().expect("heartbeat").map(|h| h.at_ms);
            assert_eq!(beat, Some(4000), "{url}: nothing committed");
        }
        let states: Vec<TrialState> = store.trials("late").expect("trials").iter().map(|r| r.state).collect();
        assert_eq!(states[..2], [TrialState::Done, TrialState::Running], "{url}");
        // A text the server cannot hold: refused at once, nothing sent; the batch goes on.
        let mut b = store.batch().expect("batch");
        let odd = accept(&mut b, 1, "a1", ExitOutcome::SpawnFailed("no\0such".into())).expect("the batch");
        assert_eq!(odd.is_err(), server, "{url}: {odd:?}");
        if server {
            accept(&mut b, 1, "a1", ExitOutcome::Exited(0)).expect("the batch").expect("sent");
        }
        accept(&mut b, 2, "a1", ExitOutcome::Exited(1)).expect("the batch").expect("a failure, sent");
        b.beat(1, 6000, false, None, "{}").expect("beat");
        b.commit().expect("committed");
        let results = store.results("late").expect("results").len();
        assert_eq!(results, 3, "{url}: one result a trial");
        let failed = store.trials("late").expect("trials").swap_remove(2);
        assert_eq!(failed.reason.as_deref(), Some("exit 1, `boom bang`"), "{url}");
        assert_eq!(store.heartbeat().expect("heartbeat").map(|h| h.at_ms), Some(6000), "{url}");
    }
}

/// On a server a turn's assignments and accepted results are written many
/// to a statement (at most 256), rows of different trials as if at once, a
/// trial's rows in their order and never ahead of a statement asked before
/// them but the other kind's rows of other trials; a file writes each at
/// once. 604 trials end alike on both: a trial given twice in a turn keeps
/// its first attempt reassigned, a trial given among results is running,
/// a trial stopped before it is given again in the same turn refuses the
/// turn, and a refusal waiting is answered as the next savepoint opens.
#[test]
fn assignments_and_results_written_many_at_once_keep_their_order() {
    use tunefleet_common::message::TrialRef;
    use tunefleet_coordinator::domain::search;
    use tunefleet_coordinator::runtime::engine::open_study_at;
    use tunefleet_coordinator::store::{Store, TrialState};

    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study_in(dir.path(), "many", 604);
    let t = |trial: u64, attempt: u32| TrialRef { study: "many".into(), study_id: 7, trial, attempt };
    let done = exited_0();
    for url in [dir.path().join("many.db").display().to_string(), pg.store("many")] {
        let server = url.starts_with("postgres");
        let mut store = Store::open(Path::new(&url)).expect("the store");
        let mut b = store.batch().expect("batch");
        open_study_at(&mut b, &study, &search::plan(&study), 1000).expect("opened");
        for trial in 0..600 {
            b.record_assignment(&t(trial, 1), "a1", 2000 + trial).expect("given");
        }
        b.record_assignment(&t(599, 2), "a2", 2700).expect("given again");
        // Its statements prepared (a statement prepared sends what waits).
        b.stop_trial(&t(603, 1), "not needed", 2700).expect("stopped");
        b.commit().expect("committed");
        let mut b = store.batch().expect("batch");
        for trial in 0..599 {
            b.record_accepted(&t(trial, 1), "a1", &done, Some(trial as f64), 3000).expect("batch").expect("sent");
            if trial == 300 {
                // Results around an assignment of another trial.
                b.record_assignment(&t(600, 1), "a2", 3000).expect("given");
            }
        }
        b.record_accepted(&t(599, 2), "a2", &done, Some(0.5), 3000).expect("batch").expect("sent");
        b.commit().expect("committed");
        let states: Vec<TrialState> = store.trials("many").expect("trials").iter().map(|r| r.state).collect();
        assert_eq!(states[..600], [TrialState::Done; 600], "{url}");
        let rest = [TrialState::Running, TrialState::Pending, TrialState::Pending, TrialState::Stopped];
        assert_eq!(states[600..], rest, "{url}");
        assert_eq!(store.results("many").expect("results").len(), 600, "{url}");
        let twice: Vec<(u32, String, Option<String>)> = (store.attempts("many", 599).expect("attempts").into_iter())
            .map(|a| (a.attempt, a.agent, a.outcome))
            .collect();
        let ended = |s: &str| Some(s.to_string());
        assert_eq!(twice, [(1, "a1".into(), ended("reassigned")), (2, "a2".into(), ended("exited 0"))], "{url}");
        assert_eq!(store.attempts("many", 0).expect("attempts")[0].ended_ms, Some(3000), "{url}");
        // Given, stopped, given again in one turn: the second refused.
        let mut b = store.batch().expect("batch");
        b.record_assignment(&t(601, 1), "a1", 4000).expect("given");
        b.stop_trial(&t(602, 1), "enough", 4000).expect("stopped");
        let refused = match b.record_assignment(&t(602, 1), "a1", 4000) {
            Ok(()) => {
                assert!(server, "{url}: a file answers at once");
                b.commit().expect_err("refused as it commits").to_string()
            }
            Err(e) => {
                drop(b);
                e.to_string()
            }
        };
        assert!(refused.contains("stopped"), "{url}: {refused}");
        let states: Vec<TrialState> = store.trials("many").expect("trials").iter().map(|r| r.state).collect();
        assert_eq!(states[601..603], [TrialState::Pending; 2], "{url}: nothing of the turn committed");
        // A refusal waiting in a group is answered by the next savepoint's
        // opening, before the savepoint: never undone with another message.
        let mut b = store.batch().expect("batch");
        let refused = match b.record_assignment(&t(0, 2), "a1", 5000) {
            Ok(()) => {
                assert!(server, "{url}: a file answers at once");
                b.savepoint("message").expect_err("refused as the savepoint opens").to_string()
            }
            Err(e) => e.to_string(),
        };
        assert!(refused.contains("done"), "{url}: {refused}");
    }
}

/// The server's functions that write a turn's rows many at once reach
/// each row by its key, however small the tables were when the server
/// last analysed them (their plans made each run, as the writer's then
/// are) or with a plan made once on tables never analysed (the writer's
/// otherwise): no scan of `trials`, `attempts` or `results`, and no read
/// of one whole through an index.
#[test]
fn rows_written_many_at_once_are_reached_by_their_keys() {
    use tunefleet_common::message::TrialRef;
    use tunefleet_coordinator::domain::search;
    use tunefleet_coordinator::runtime::engine::open_study_at;
    use tunefleet_coordinator::store::Store;

    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study_in(dir.path(), "k", 40);
    let done = exited_0();
    let t = |trial: u64| TrialRef { study: "k".into(), study_id: 1, trial, attempt: 1 };
    for (schema, analysed) in [("keys", true), ("keys_once", false)] {
        let mut store = Store::open(Path::new(&pg.store(schema))).expect("the store");
        let mut b = store.batch().expect("batch");
        open_study_at(&mut b, &study, &search::plan(&study), 1000).expect("opened");
        for trial in 0..30 {
            b.record_assignment(&t(trial), "a1", 2000).expect("given");
        }
        for trial in 10..30 {
            b.record_accepted(&t(trial), "a1", &done, Some(0.5), 2500).expect("batch").expect("sent");
        }
        b.commit().expect("committed");
        let mode = match analysed {
            true => {
                pg.query(&format!("ANALYZE {schema}.trials, {schema}.attempts, {schema}.results"));
                "force_custom_plan"
            }
            false => "force_generic_plan",
        };
        let names = pg.query(&format!(
            "SELECT proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = '{schema}' AND proname LIKE 'tunefleet\\_%' ORDER BY proname"
        ));
        let [accept, assign] = names.lines().collect::<Vec<_>>()[..] else { panic!("two functions: {names}") };
        let answer = pg.query(&format!(
            "SET search_path TO {schema}; SET plan_cache_mode TO {mode}; BEGIN; \
             SELECT COUNT(*) FROM {assign}(ARRAY['k', 'k'], ARRAY[30, 31]::BIGINT[], ARRAY[1, 1]::BIGINT[], \
                 ARRAY['a1', 'a1'], ARRAY[3000, 3000]::BIGINT[], ARRAY[0, 0]::BIGINT[]); \
             SELECT COUNT(*) FROM {accept}(ARRAY['k'], ARRAY[0]::BIGINT[], ARRAY[1]::BIGINT[], ARRAY['a1'], \
                 ARRAY[1]::BIGINT[], ARRAY[0.5]::FLOAT8[], ARRAY[1]::BIGINT[], ARRAY[1]::BIGINT[], ARRAY[1]::BIGINT[], \
                 ARRAY[1]::BIGINT[], ARRAY['exited 0'], ARRAY[NULL]::FLOAT8[], ARRAY['estimated'], ARRAY[0]::BIGINT[], \
                 ARRAY['{{}}'], ARRAY[4000]::BIGINT[], ARRAY[NULL]::FLOAT8[], ARRAY[NULL]::FLOAT8[], \
                 ARRAY[NULL]::TEXT[], ARRAY['done'], ARRAY[NULL]::TEXT[]); \
             SELECT relname || ' ' || seq_scan || ' ' || idx_tup_fetch FROM pg_stat_xact_user_tables \
                 WHERE schemaname = '{schema}' AND relname IN ('trials', 'attempts', 'results') ORDER BY relname; \
             SELECT state FROM trials WHERE study = 'k' AND trial IN (0, 30) ORDER BY trial; ROLLBACK"
        ));
        let lines: Vec<&str> = answer.lines().collect();
        // Every row taken; trial 0 done and trial 30 running.
        assert_eq!([lines[3], lines[4], lines[8], lines[9]], ["0", "0", "done", "running"], "{schema}: {answer}");
        // No table scanned, and none read whole through an index: each
        // holds 20 rows or more, and a row reached by its key is a read or two.
        for (line, table) in lines[5..8].iter().zip(["attempts", "results", "trials"]) {
            let read: Vec<&str> = line.split(' ').collect();
            assert_eq!(read[..2], [table, "0"], "{schema}: {table} scanned: {answer}");
            let fetched: u32 = read[2].parse().expect("a count");
            assert!(fetched < 10, "{schema}, {table}: {fetched} rows read: {answer}");
        }
    }
}

/// A commit sent without waiting: while it waits on the server (a table
/// it writes locked by another session), the next transaction is begun,
/// written and sent without waiting for it (a `BEGIN` answered at once
/// would have waited behind it, for good). The first refused (a trial
/// the store does not hold given), nothing of either lands, the second
/// refused for it, and a third begun after the failure was awaited too;
/// once the store's owner says it starts over, a write lands again.
#[test]
fn a_transaction_is_built_while_the_one_before_commits_and_nothing_after_a_failed_one_lands() {
    let pg = Postgres::start();
    let mut store = store_with_sleep_study(&pg, "flight", 4);
    let t = |trial: u64| trial_ref("flight", trial);
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let attempts = || pg.query("SELECT COUNT(*) FROM flight.attempts");
    let locked = pg.lock("flight.attempts", Duration::from_secs(60));
    let mut b = store.batch().expect("batch");
    b.record_assignment(&t(0), "a1", 2000).expect("given");
    b.record_assignment(&t(99), "a1", 2000).expect("given (refused as it commits)");
    let mut first = b.commit_pipelined().expect("sent");
    let waiting =
        "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name <> 'locker'";
    wait_for("the first commit waiting on the lock", Duration::from_secs(30), || pg.query(waiting) == "1");
    let mut b = store.batch().expect("begun while the first commits");
    b.record_assignment(&t(1), "a1", 2001).expect("given");
    let mut second = b.commit_pipelined().expect("sent");
    // Had the second waited for the first, the lock's deadline ended it.
    assert!(locked.release(), "the second transaction waited for the first to commit");
    let refused = rt.block_on(first.landed()).expect_err("a trial the store does not hold").to_string();
    assert!(refused.contains("flight/99"), "{refused}");
    let after = rt.block_on(second.landed()).expect_err("built on the one that failed").to_string();
    assert!(after.contains("an earlier commit"), "{after}");
    // Whoever awaited the failure, the store's owner has not said it starts over.
    let third = store.batch().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(third.contains("an earlier commit"), "a batch after the failure: {third:?}");
    assert_eq!(attempts(), "0", "nothing of either landed");
    assert_eq!(
        pg.query("SELECT string_agg(state, ' ' ORDER BY trial) FROM flight.trials"),
        "pending pending pending pending"
    );
    store.failed_commit_seen();
    let mut b = store.batch().expect("the failure seen, a transaction again");
    b.record_assignment(&t(2), "a1", 2002).expect("given");
    b.commit().expect("committed");
    assert_eq!(attempts(), "1");
}

/// On a server a trial's changes of state (given, done) are mostly
/// heap-only: no index entry each (no index names `state`; its pages keep
/// room). With an index on `state`, none would be.
#[test]
fn a_trials_changes_of_state_on_a_server_add_no_index_entries() {
    let pg = Postgres::start();
    let t = |trial: u64| trial_ref("hot", trial);
    {
        let mut store = store_with_sleep_study(&pg, "hot", 300);
        // A turn gives 50 trials and takes the results of the 50 before.
        for turn in 0..7u64 {
            let mut b = store.batch().expect("batch");
            for trial in (turn * 50..turn * 50 + 50).filter(|&n| n < 300) {
                b.record_assignment(&t(trial), "a1", 2000 + turn).expect("given");
            }
            for trial in (turn * 50).saturating_sub(50)..turn * 50 {
                b.record_accepted(&t(trial), "a1", &exited_0(), Some(0.5), 3000 + turn).expect("batch").expect("sent");
            }
            b.commit().expect("committed");
        }
    }
    // The server counts a session's changes once it ends.
    let counts = || {
        pg.query(
            "SELECT n_tup_upd || ' ' || n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'hot.trials'::regclass",
        )
    };
    wait_for("the trials' changes counted", Duration::from_secs(30), || counts().starts_with("600 "));
    let hot: u32 = counts().split(' ').nth(1).and_then(|n| n.parse().ok()).expect("a count");
    assert!(hot >= 300, "of 600 changes of state, {hot} heap-only");
    assert_eq!(pg.query("SELECT COUNT(*) FROM hot.trials WHERE state = 'done'"), "300");
}

/// Trials are added many to a statement (32, then fewer by halves): 71
/// land in a file and on a server, each with its number, parameters and
/// repeat, pending, and nothing else.
#[test]
fn trials_added_many_at_once_land_each_as_planned() {
    use tunefleet_common::params::{ParamValue, Params};
    use tunefleet_coordinator::domain::search::TrialPlan;
    use tunefleet_coordinator::runtime::engine::open_study_at;
    use tunefleet_coordinator::store::{Store, TrialState};

    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let study = sleep_study_in(dir.path(), "many", 2);
    let plans: Vec<TrialPlan> = (0..71u64)
        .map(|trial| {
            let params = Params::from([("x".to_string(), ParamValue::Int(trial as i64 * 7 - 100))]);
            TrialPlan { trial, params, repeat: (trial % 3) as u32 }
        })
        .collect();
    for url in [dir.path().join("many.db").display().to_string(), pg.store("many")] {
        let mut store = Store::open(Path::new(&url)).expect("the store");
        let mut b = store.batch().expect("batch");
        open_study_at(&mut b, &study, &[], 1000).expect("opened");
        b.add_trials("many", &plans[..1]).expect("one");
        b.add_trials("many", &plans[1..]).expect("seventy");
        b.commit().expect("committed");
        let stored: Vec<(TrialPlan, TrialState)> =
            store.trials("many").expect("trials").into_iter().map(|r| (r.plan, r.state)).collect();
        let want: Vec<(TrialPlan, TrialState)> = plans.iter().map(|p| (p.clone(), TrialState::Pending)).collect();
        assert_eq!(stored, want, "{url}");
    }
}

/// A writer's statements are planned once for every parameter (the
/// server's planning was a third of its time a trial), a reader's each
/// run; a plan made once while the store's tables are empty still reads a
/// result by its primary key (no other index starts with its first
/// column); tables analysed while small are planned each run.
#[test]
fn a_writers_plans_made_on_empty_tables_read_results_by_their_key() {
    use tunefleet_coordinator::store::Store;

    let pg = Postgres::start();
    let url = pg.store("plans");
    let writer = Store::open(Path::new(&url)).expect("a writer");
    let reader = Store::open_read_only(Path::new(&url)).expect("a reader");
    let mode = |s: &Store| s.setting("plan_cache_mode").expect("reads the setting").expect("a server's");
    assert_eq!(mode(&writer), "force_generic_plan");
    assert_eq!(mode(&reader), "force_custom_plan");
    let plan = pg.query(
        "SET search_path TO plans; SET plan_cache_mode TO force_generic_plan; \
         PREPARE lookup(text, bigint) AS SELECT attempt FROM results WHERE study = $1 AND trial = $2; \
         EXPLAIN EXECUTE lookup('s', 1)",
    );
    assert!(plan.contains("results_pkey"), "a result read by its key: {plan}");
    // Its tables there, never analysed: still planned once.
    let writer = Store::open(Path::new(&url)).expect("a writer");
    assert_eq!(mode(&writer), "force_generic_plan");
    // Analysed while small, the tables' statistics would make a plan kept
    // for every parameter scan them whole as they grow: planned each run.
    pg.query("ANALYZE plans.trials, plans.results, plans.attempts");
    let writer = Store::open(Path::new(&url)).expect("a writer");
    assert_eq!(mode(&writer), "force_custom_plan");
}
