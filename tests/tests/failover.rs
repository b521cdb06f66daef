//! Coordinators that fail over: two `tunefleet serve` processes on one
//! PostgreSQL store (a cluster of the test's own) and one Mosquitto
//! broker, real agents. One is active, the other waits as a standby; the
//! active killed, the standby takes over and the study ends with every
//! trial once; the active stopped past its lease, the standby takes over,
//! and the stopped one, resumed, writes nothing and steps down (exit 7);
//! the active cut off from the server by a network that loses every
//! packet, it steps down once its lease went a term unrenewed and agents
//! follow the standby.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tunefleet_tests::mosquitto::{Mosquitto, FLEET_OPTIONS};
use tunefleet_tests::postgres::Postgres;
use tunefleet_tests::*;

/// `tunefleet serve` on `store` meeting agents as `meet` says (`--broker
/// URL`, or `--listen ADDR` for its embedded broker), its control socket
/// in `dir/NAME/`, its log in `dir/NAME.log`; the lease `lease` seconds.
fn serve(dir: &Path, name: &str, store: &str, meet: &[&str], root: &str, lease: u32) -> (Proc, PathBuf) {
    let log = dir.join(format!("{name}.log"));
    let control = dir.join(name).join("control.sock");
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.arg("serve")
        .args(meet)
        .args(["--root", root, "--page", "off", "--store", store])
        .arg("--control")
        .arg(&control)
        .args(["--lease-seconds", &lease.to_string()])
        .env("XDG_STATE_HOME", state_home())
        .stderr(std::fs::File::create(&log).expect("log file"));
    (Proc::spawn(name, cmd), log)
}

fn text(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Whether the service logging to `log` holds the lease.
fn active(log: &Path) -> bool {
    text(log).contains("active: this coordinator holds the lease")
}

/// Submits `study` to the service whose control socket is `dir/NAME/`.
fn submit(dir: &Path, name: &str, store: &str, study: &Path) {
    let control = dir.join(name).join("control.sock");
    wait_for("the control socket", Duration::from_secs(30), || control.exists());
    let mut c = Command::new(bin("tunefleet"));
    c.arg("submit").arg(study).args(["--store", store]).arg("--control").arg(&control);
    c.env("XDG_STATE_HOME", state_home());
    let (code, out, err) = run(c);
    assert_eq!(code, Some(0), "{out}\n{err}");
}

fn count(pg: &Postgres, sql: &str) -> u64 {
    pg.query(sql).parse().unwrap_or(0)
}

/// Two agents of four slots on `broker` (a list: tried in turn).
fn agents(broker: &str, root: &str) -> (Vec<Proc>, Vec<String>) {
    let names = vec![format!("{root}-a"), format!("{root}-b")];
    let procs = names.iter().map(|n| start_agent(broker, n, root, &["--slots", "4"])).collect();
    (procs, names)
}

/// A PostgreSQL server, a Mosquitto broker and a store on them (schema
/// `schema`), agents on `root` joining with a token for it; the first
/// service started on it and active, the second a standby, both with
/// leases of `lease` seconds.
struct Pair {
    pg: Postgres,
    dir: tempfile::TempDir,
    _mosquitto: Mosquitto,
    broker: String,
    store: String,
    root: String,
    first: (Proc, PathBuf),
    second: (Proc, PathBuf),
}

fn pair(schema: &str, lease: u32) -> Pair {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mosquitto = Mosquitto::start(dir.path(), FLEET_OPTIONS);
    let broker = mosquitto.url();
    let store = pg.store(schema);
    let root = unique_root(&format!("failover-{schema}"));
    join_root(&root, Path::new(&store));
    let mut first = serve(dir.path(), "first", &store, &["--broker", &broker], &root, lease);
    first.0.wait_line(Duration::from_secs(60), |l| l.starts_with("broker: "));
    assert!(active(&first.1), "{}", text(&first.1));
    let second = serve(dir.path(), "second", &store, &["--broker", &broker], &root, lease);
    wait_for("the second service waiting as a standby", Duration::from_secs(30), || {
        text(&second.1).contains("standby: another coordinator is active")
    });
    Pair { pg, dir, _mosquitto: mosquitto, broker, store, root, first, second }
}

#[test]
fn the_active_killed_mid_study_the_standby_takes_over_and_every_trial_runs_once() {
    let Pair { pg, dir, broker, store, root, first, second, _mosquitto } = pair("killed", 15);
    let ((first, _), (mut second, second_log)) = (first, second);
    let study = sleep_study(dir.path(), "killed", 300, 0.2);
    submit(dir.path(), "first", &store, &study);
    let (procs, names) = agents(&broker, &root);
    wait_for("a third of the trials stored", Duration::from_secs(180), || {
        count(&pg, "SELECT COUNT(*) FROM killed.results") >= 100
    });
    assert!(!active(&second_log), "one active at a time");
    first.signal("KILL");
    let killed = Instant::now();
    let before = count(&pg, "SELECT COUNT(*) FROM killed.results");
    wait_for("the standby to take over", Duration::from_secs(30), || active(&second_log));
    let took_over = killed.elapsed();
    wait_for("a result stored by the new active", Duration::from_secs(60), || {
        count(&pg, "SELECT COUNT(*) FROM killed.results") > before
    });
    let flowing = killed.elapsed();
    wait_for("every trial done", Duration::from_secs(300), || {
        count(&pg, "SELECT COUNT(*) FROM killed.trials WHERE state = 'done'") == 300
    });
    eprintln!(
        "takeover: active {:.2} s after the kill, results flowing again {:.2} s after it",
        took_over.as_secs_f64(),
        flowing.as_secs_f64()
    );
    assert!(took_over < Duration::from_secs(15), "the standby took {took_over:?}");
    assert_eq!(count(&pg, "SELECT COUNT(*) FROM killed.results"), 300, "one result per trial");
    assert_eq!(count(&pg, "SELECT COUNT(*) FROM killed.trials WHERE state = 'failed'"), 0);
    assert_eq!(count(&pg, "SELECT epoch FROM killed.coordinator_lease"), 2, "one takeover");
    // The dead service's socket answers no more: `submit` reaches the
    // active one through the store.
    let after = sleep_study(dir.path(), "after", 6, 0.1);
    submit(dir.path(), "first", &store, &after);
    wait_for("the study submitted after the takeover done", Duration::from_secs(120), || {
        count(&pg, "SELECT COUNT(*) FROM killed.trials WHERE study = 'after' AND state = 'done'") == 6
    });
    second.signal("TERM");
    let status = second.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "{status:?}\n{}", text(&second_log));
    drop(procs);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn an_active_stopped_past_its_lease_writes_nothing_after_the_takeover_and_steps_down() {
    let Pair { pg, dir, broker, store, root, first, second, _mosquitto } = pair("stalled", 3);
    let ((mut first, first_log), (mut second, second_log)) = (first, second);
    let study = sleep_study(dir.path(), "stalled", 80, 0.3);
    submit(dir.path(), "first", &store, &study);
    // Every statement that writes a study's rows notes who wrote it, under
    // which lease epoch (the trigger runs inside the writer's transaction).
    wait_for("the store's tables", Duration::from_secs(30), || {
        count(
            &pg,
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'stalled' AND table_name = 'results'",
        ) == 1
    });
    pg.query(
        "CREATE TABLE stalled.writers (app TEXT, epoch BIGINT);
         CREATE FUNCTION stalled.note_writer() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
           INSERT INTO stalled.writers SELECT current_setting('application_name'), (SELECT epoch FROM stalled.coordinator_lease WHERE id = 1);
           RETURN NULL; END $$;
         CREATE TRIGGER w_results AFTER INSERT OR UPDATE OR DELETE ON stalled.results FOR EACH STATEMENT EXECUTE FUNCTION stalled.note_writer();
         CREATE TRIGGER w_trials AFTER INSERT OR UPDATE OR DELETE ON stalled.trials FOR EACH STATEMENT EXECUTE FUNCTION stalled.note_writer();
         CREATE TRIGGER w_attempts AFTER INSERT OR UPDATE OR DELETE ON stalled.attempts FOR EACH STATEMENT EXECUTE FUNCTION stalled.note_writer();",
    );
    let (procs, names) = agents(&broker, &root);
    wait_for("some trials stored", Duration::from_secs(120), || {
        count(&pg, "SELECT COUNT(*) FROM stalled.results") >= 10
    });
    let first_app = format!(":{}:", first.child.id());
    first.signal("STOP");
    wait_for("the standby to take over the stopped active", Duration::from_secs(60), || active(&second_log));
    assert!(text(&second_log).contains("lease expired"), "{}", text(&second_log));
    let writes_before = count(&pg, &format!("SELECT COUNT(*) FROM stalled.writers WHERE app LIKE '%{first_app}%'"));
    assert!(writes_before > 0, "the first service's writes are noted");
    first.signal("CONT");
    let status = first.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(7), "it steps down: {status:?}\n{}", text(&first_log));
    assert!(text(&first_log).contains("steps down"), "{}", text(&first_log));
    wait_for("every trial done", Duration::from_secs(300), || {
        count(&pg, "SELECT COUNT(*) FROM stalled.trials WHERE state = 'done'") == 80
    });
    let late =
        count(&pg, &format!("SELECT COUNT(*) FROM stalled.writers WHERE app LIKE '%{first_app}%' AND epoch <> 1"));
    assert_eq!(late, 0, "a write of the stepped-down service landed after the takeover");
    let after = count(&pg, &format!("SELECT COUNT(*) FROM stalled.writers WHERE app LIKE '%{first_app}%'"));
    assert_eq!(after, writes_before, "nothing it wrote after it was resumed landed");
    assert!(count(&pg, "SELECT COUNT(*) FROM stalled.writers WHERE epoch = 2") > 0, "the new active wrote");
    assert_eq!(count(&pg, "SELECT COUNT(*) FROM stalled.results"), 80, "one result per trial");
    second.signal("TERM");
    assert!(second.wait_exit(Duration::from_secs(60)).success(), "{}", text(&second_log));
    drop(procs);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
}

/// Two services with embedded brokers on the store of `pg` in schema
/// `schema`: the first reaches it at `first_store` and is active, a study
/// of `trials` submitted to it; the second reaches it directly and waits
/// as a standby; two agents given both brokers ran 10 of the trials.
struct Embedded {
    _dir: tempfile::TempDir,
    first: (Proc, PathBuf),
    second: (Proc, PathBuf),
    agents: (Vec<Proc>, Vec<String>),
}

fn embedded_pair(pg: &Postgres, schema: &str, first_store: &str, trials: u32, lease: u32) -> Embedded {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = pg.store(schema);
    let root = unique_root(&format!("failover-{schema}"));
    join_root(&root, Path::new(&store));
    let (a, b) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let mut first = serve(dir.path(), "first", first_store, &["--listen", &a], &root, lease);
    first.0.wait_line(Duration::from_secs(60), |l| l.starts_with("broker: "));
    let second = serve(dir.path(), "second", &store, &["--listen", &b], &root, lease);
    wait_for("the second service waiting as a standby", Duration::from_secs(30), || {
        text(&second.1).contains("standby: another coordinator is active")
    });
    let study = sleep_study(dir.path(), schema, trials, 0.3);
    submit(dir.path(), "first", &store, &study);
    let agents = agents(&format!("mqtt://{a},mqtt://{b}"), &root);
    wait_for("some trials stored", Duration::from_secs(120), || {
        count(pg, &format!("SELECT COUNT(*) FROM {schema}.results")) >= 10
    });
    Embedded { _dir: dir, first, second, agents }
}

/// Each service with its embedded broker (the standby's listens only
/// once it is active): agents given both brokers follow the active one.
#[test]
fn with_embedded_brokers_agents_follow_the_active_through_their_broker_list() {
    let pg = Postgres::start();
    let Embedded { first, second, agents: (procs, names), _dir } =
        embedded_pair(&pg, "embedded", &pg.store("embedded"), 120, 15);
    let ((first, _), (mut second, second_log)) = (first, second);
    first.signal("KILL");
    let before = count(&pg, "SELECT COUNT(*) FROM embedded.results");
    assert!(before < 120, "the study ended before the kill");
    wait_for("every trial done on the new active", Duration::from_secs(180), || {
        count(&pg, "SELECT COUNT(*) FROM embedded.trials WHERE state = 'done'") == 120
    });
    assert!(active(&second_log), "{}", text(&second_log));
    assert_eq!(count(&pg, "SELECT COUNT(*) FROM embedded.results"), 120, "one result per trial");
    second.signal("TERM");
    assert!(second.wait_exit(Duration::from_secs(60)).success(), "{}", text(&second_log));
    drop(procs);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
}

/// The active cut off from the store's server by a network that loses
/// every packet, where neither side hears of an end: its statements and
/// renewals wait for answers that never come. Once its lease went a whole
/// term unrenewed it steps down (exit 7), its embedded broker closing with
/// it, so agents given both brokers go to the standby, which took over.
#[test]
fn an_active_cut_off_from_its_database_steps_down_and_agents_follow_the_standby() {
    let pg = Postgres::start();
    let proxy = tunefleet_tests::proxy::Proxy::start(pg.port);
    let through = format!("postgres://tunefleet@127.0.0.1:{}/postgres?schema=partitioned", proxy.port);
    let Embedded { first, second, agents: (procs, names), _dir } = embedded_pair(&pg, "partitioned", &through, 300, 3);
    let ((mut first, first_log), (mut second, second_log)) = (first, second);
    // Renewals that land keep it active, term after term.
    let expires = || count(&pg, "SELECT expires_ms FROM partitioned.coordinator_lease");
    let first_expiry = expires();
    wait_for("the lease renewed through two terms", Duration::from_secs(60), || expires() >= first_expiry + 6000);
    assert!(first.child.try_wait().expect("its state").is_none(), "stepped down:\n{}", text(&first_log));
    assert_eq!(count(&pg, "SELECT epoch FROM partitioned.coordinator_lease"), 1);
    proxy.partition();
    let cut = Instant::now();
    let before = count(&pg, "SELECT COUNT(*) FROM partitioned.results");
    assert!(before < 300, "the study ended before the partition");
    let status = first.wait_exit(Duration::from_secs(60));
    let stepped = cut.elapsed();
    assert_eq!(status.code(), Some(7), "it steps down: {status:?}\n{}", text(&first_log));
    // Its last renewal that landed was sent at most a renewal (a third of
    // the 3 s lease) before the partition: not sooner than the rest.
    assert!(stepped >= Duration::from_millis(1500), "stepped down {stepped:?} after the partition");
    assert!(text(&first_log).contains("was not renewed for"), "{}", text(&first_log));
    wait_for("every trial done on the new active", Duration::from_secs(300), || {
        count(&pg, "SELECT COUNT(*) FROM partitioned.trials WHERE state = 'done'") == 300
    });
    let done = cut.elapsed();
    eprintln!(
        "partition: {before} results stored; the active stepped down {:.2} s after it, every trial done {:.2} s \
         after it",
        stepped.as_secs_f64(),
        done.as_secs_f64()
    );
    assert!(active(&second_log), "{}", text(&second_log));
    assert_eq!(count(&pg, "SELECT epoch FROM partitioned.coordinator_lease"), 2, "one takeover");
    assert_eq!(count(&pg, "SELECT COUNT(*) FROM partitioned.results"), 300, "one result per trial");
    assert_eq!(count(&pg, "SELECT COUNT(*) FROM partitioned.trials WHERE state = 'failed'"), 0);
    second.signal("TERM");
    assert!(second.wait_exit(Duration::from_secs(60)).success(), "{}", text(&second_log));
    drop(procs);
    assert_agents_spools_empty(&names.iter().map(String::as_str).collect::<Vec<_>>());
}

/// The store in schema `schema` of `pg` (its URL, opened) and its lease,
/// taken by a test (60 s, epoch 1 on).
fn leased(
    pg: &Postgres,
    schema: &str,
) -> (String, tunefleet_coordinator::store::Store, tunefleet_coordinator::store::Lease) {
    use tunefleet_coordinator::store::{Candidate, LeaseTry, Store};
    let url = pg.store(schema);
    let store = Store::open(Path::new(&url)).expect("store");
    match Candidate::connect(Path::new(&url)).and_then(|c| c.try_acquire("tunefleet fence-test", 60_000, 1)) {
        Ok(LeaseTry::Active(lease)) => (url, store, lease),
        other => panic!("not active: {other:?}"),
    }
}

/// The fence itself, on the store's own connection: a write transaction
/// begun after the lease's epoch moved on is refused (nothing it would
/// write can land), and one begun before holds the takeover back until
/// it ends.
#[test]
fn a_write_begun_after_a_takeover_is_refused_and_one_begun_before_holds_it_back() {
    use tunefleet_coordinator::store::StoreError;
    let pg = Postgres::start();
    let (_, mut store, lease) = leased(&pg, "fenced");
    store.fence(lease.epoch);
    let takeover = "UPDATE fenced.coordinator_lease SET epoch = epoch + 1, holder = 'another'";
    std::thread::scope(|s| {
        let batch = store.batch().expect("a write while the epoch is this one's");
        let other = s.spawn(|| pg.query(takeover));
        wait_for("the takeover waiting for the open transaction", Duration::from_secs(30), || {
            count(&pg, "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'") == 1
        });
        batch.commit().expect("it commits: it began before the takeover");
        other.join().expect("the takeover");
    });
    assert_eq!(count(&pg, "SELECT epoch FROM fenced.coordinator_lease"), lease.epoch as u64 + 1);
    match store.batch() {
        Err(e @ StoreError::SteppedDown { .. }) => assert!(e.to_string().contains("steps down"), "{e}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a write began after the takeover"),
    };
}

/// The fence of a transaction begun while the one before commits (a
/// table both write locked by another session): its lease check goes with
/// its writes and is judged before its `COMMIT` is sent. The lease taken
/// over meanwhile, it lands nothing and steps down; the one before, begun
/// before the fence was set, lands.
#[test]
fn a_write_built_while_the_one_before_commits_is_fenced_before_it_lands() {
    use tunefleet_coordinator::store::{Store, StoreError};
    let pg = Postgres::start();
    let (url, mut store, lease) = leased(&pg, "inflight");
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    // A beat first: its statement is prepared before the table is locked.
    let mut b = store.batch().expect("batch");
    b.beat(1, 500, false, None, "{}").expect("beat");
    b.commit().expect("committed");
    let locked = pg.lock("inflight.heartbeat", Duration::from_secs(60));
    let mut b = store.batch().expect("batch");
    b.beat(1, 1000, false, None, "{}").expect("beat");
    let mut first = b.commit_pipelined().expect("sent");
    store.fence(lease.epoch);
    pg.query("UPDATE inflight.coordinator_lease SET epoch = epoch + 1, holder = 'another'");
    let mut b = store.batch().expect("begun while the first commits: its check goes with its writes");
    b.beat(1, 2000, false, None, "{}").expect("beat");
    let mut second = b.commit_pipelined().expect("sent");
    assert!(locked.release(), "the second transaction waited for the first to commit");
    rt.block_on(first.landed()).expect("the first lands: begun before the fence");
    match rt.block_on(second.landed()) {
        Err(e @ StoreError::SteppedDown { .. }) => assert!(e.to_string().contains("steps down"), "{e}"),
        other => panic!("not refused for the lease: {other:?}"),
    }
    assert_eq!(count(&pg, "SELECT beat_ms FROM inflight.heartbeat"), 1000, "nothing of the second landed");
    // A read of such a transaction answered with the failed check (an
    // error its caller may put aside): the transaction is over, and its
    // commit lands nothing.
    let mut store = Store::open(Path::new(&url)).expect("store");
    let mut b = store.batch().expect("batch");
    b.beat(1, 2500, false, None, "{}").expect("beat");
    b.commit().expect("committed");
    let locked = pg.lock("inflight.heartbeat", Duration::from_secs(60));
    let mut b = store.batch().expect("batch");
    b.beat(1, 3000, false, None, "{}").expect("beat");
    let mut first = b.commit_pipelined().expect("sent");
    store.fence(lease.epoch);
    let mut b = store.batch().expect("begun while the first commits");
    b.beat(1, 4000, false, None, "{}").expect("beat");
    assert!(locked.release(), "the transaction waited for the one before to commit");
    let read = b.agent_key("nobody").expect_err("the lease's check answers the read");
    assert!(read.to_string().contains("steps down"), "{read}");
    b.beat(1, 5000, false, None, "{}").expect("a write deferred");
    let commit = b.commit().expect_err("the transaction ended with its check").to_string();
    assert!(commit.contains("steps down"), "{commit}");
    rt.block_on(first.landed()).expect("the first lands");
    assert_eq!(count(&pg, "SELECT beat_ms FROM inflight.heartbeat"), 3000, "nothing of the fenced one landed");
}

#[test]
fn two_services_started_at_once_one_is_active() {
    let pg = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let mosquitto = Mosquitto::start(dir.path(), FLEET_OPTIONS);
    let broker = mosquitto.url();
    let store = pg.store("twins");
    let root = unique_root("failover-twins");
    let (mut one, one_log) = serve(dir.path(), "one", &store, &["--broker", &broker], &root, 15);
    let (mut two, two_log) = serve(dir.path(), "two", &store, &["--broker", &broker], &root, 15);
    let settled = || {
        let (a, b) = (text(&one_log), text(&two_log));
        (a.contains("active: this") || b.contains("active: this"))
            && (a.contains("standby: ") || b.contains("standby: "))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !settled() {
        assert!(Instant::now() < deadline, "not settled in 60 s:\n{}\n{}", text(&one_log), text(&two_log));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(active(&one_log) != active(&two_log), "exactly one active:\n{}\n{}", text(&one_log), text(&two_log));
    assert_eq!(count(&pg, "SELECT epoch FROM twins.coordinator_lease"), 1);
    one.signal("TERM");
    two.signal("TERM");
    assert!(one.wait_exit(Duration::from_secs(60)).success(), "{}", text(&one_log));
    assert!(two.wait_exit(Duration::from_secs(60)).success(), "{}", text(&two_log));
}
