//! The embedded broker under attack, with a real coordinator and real
//! agents: a client that subscribes to everything and reads nothing, one
//! that reads everything, and clients of other MQTT versions.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tunefleet_tests::mqtt::TestClient;
use tunefleet_tests::*;

/// [`sleep_study`]'s study (0.1 s a trial) whose argv and env carry `marker`.
fn marked_study(dir: &Path, name: &str, trials: u32, marker: &str) -> std::path::PathBuf {
    let path = sleep_study(dir, name, trials, 0.1);
    let text = std::fs::read_to_string(&path).expect("study");
    let (command, rest) = text.split_once('\n').and_then(|(_, r)| r.split_once('\n')).expect("name, command");
    let marked = format!(
        "name = \"{name}\"\n{}, \"{marker}-argv\"]\nenv = {{ DB_PASSWORD = \"{marker}-env\" }}\n{rest}",
        command.strip_suffix(']').expect("a command list")
    );
    assert_eq!(marked.matches(marker).count(), 2, "argv and env carry the marker: {marked}");
    std::fs::write(&path, marked).expect("study");
    path
}

/// MQTT 3.1.1 CONNECT (clean session, keep-alive 60 s) for `id`, logging
/// in as `user` with `password`.
fn connect_packet(id: &str, user: &str, password: &str) -> Vec<u8> {
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 4, 0xc2, 0, 60];
    for field in [id, user, password] {
        body.extend_from_slice(&(field.len() as u16).to_be_bytes());
        body.extend_from_slice(field.as_bytes());
    }
    framed(0x10, &body)
}

/// The users file of an attacked run: the reading tool, the silent one
/// (granted everything: the worst an operator's tool can be), and the
/// password the fleet's agents carry.
fn users_file(dir: &Path, name: &str, root: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.users"));
    let text = format!("reader:read-pw:{root}/#\nsilent:silent-pw:#\nfleet:{FLEET_PASSWORD}\n");
    std::fs::write(&path, text).expect("users file");
    path
}

/// What the fleet's agents carry to join a broker with a users file.
const FLEET_PASSWORD: &str = "fleet-pw";

/// A packet: its first byte, the remaining length, the body.
fn framed(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![first];
    let mut len = body.len();
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// SUBSCRIBE to `filter` at QoS 1.
fn subscribe_packet(filter: &str) -> Vec<u8> {
    let mut body = vec![0, 1];
    body.extend_from_slice(&(filter.len() as u16).to_be_bytes());
    body.extend_from_slice(filter.as_bytes());
    body.push(1);
    framed(0x82, &body)
}

/// A QoS 0 PUBLISH of `payload` to `topic`.
fn publish_packet(topic: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = (topic.len() as u16).to_be_bytes().to_vec();
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(payload);
    framed(0x30, &body)
}

/// Until `stop`: connects, subscribes to `#` at QoS 1, publishes enough
/// junk to fill its own queue, then reads nothing; connects again when
/// the broker closes it. Counts in `filled` the connections whose junk
/// went out; returns how many connections it made.
fn silent_wildcard_subscriber(
    port: u16,
    stop: Arc<AtomicBool>,
    filled: Arc<AtomicU64>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut connections = 0;
        let junk = vec![0x5a; 60 * 1024];
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { continue };
            connections += 1;
            let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
            let _ = s.write_all(&connect_packet(&format!("silent-{connections}"), "silent", "silent-pw"));
            let _ = s.write_all(&subscribe_packet("#"));
            // 20 MiB of its own junk, more than any queue of its holds.
            for i in 0..340 {
                if stop.load(Ordering::Relaxed) || s.write_all(&publish_packet(&format!("junk/{i}"), &junk)).is_err() {
                    break;
                }
            }
            filled.fetch_add(1, Ordering::Relaxed);
            // Reads nothing; waits until the broker gives up on it (its
            // socket errors or reads end-of-file once the writes failed).
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let mut byte = [0u8; 1];
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                match s.write(&[0xc0, 0x00]) {
                    // A PINGREQ now and then: alive, but never reading.
                    Ok(_) => {}
                    Err(_) => break,
                }
                if matches!(s.peek(&mut byte), Ok(0)) {
                    break;
                }
            }
        }
        connections
    })
}

/// Until `stop`: `n` connections, each a stranger (a key of its own, not
/// enrolled) subscribed to its own topics and publishing `mib` MiB on its
/// Hello topic at QoS 0, reading nothing; each connects again when the
/// broker closes it. Counts in `filled` the connections whose junk went out.
fn queue_fillers(
    port: u16,
    root: &str,
    n: usize,
    mib: usize,
    stop: Arc<AtomicBool>,
    filled: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<u64>> {
    (0..n)
        .map(|i| {
            let (stop, filled, root) = (stop.clone(), filled.clone(), root.to_string());
            std::thread::spawn(move || {
                let mut connections = 0;
                let junk = vec![0xa5; 1 << 20];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { continue };
                    connections += 1;
                    let name = format!("filler-{i}-{connections}");
                    let topic = format!("{root}/v2/up/{name}/hello");
                    let _ = s.set_write_timeout(Some(Duration::from_millis(500)));
                    let _ = s.write_all(&connect_packet(&name, &name, &stranger_login(&name, None)));
                    let _ = s.write_all(&subscribe_packet(&format!("{root}/v2/down/{name}/+")));
                    for _ in 0..mib {
                        if stop.load(Ordering::Relaxed) || s.write_all(&publish_packet(&topic, &junk)).is_err() {
                            break;
                        }
                    }
                    filled.fetch_add(1, Ordering::Relaxed);
                    // Holds its connection, reading nothing, until the broker closes it or the test ends.
                    let mut byte = [0u8; 1];
                    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                    while !stop.load(Ordering::Relaxed) && !matches!(s.peek(&mut byte), Ok(0)) {
                        if s.write(&[0xc0, 0x00]).is_err() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
                connections
            })
        })
        .collect()
}

/// Who attacks a run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Attack {
    None,
    /// One `#` subscriber reading nothing.
    Silent,
    /// 80 connections filling queues of their own.
    Fill,
}

/// What one run of the marked study saw.
struct Run {
    /// The coordinator's peak resident set (VmHWM), in MiB.
    peak_mib: u64,
    secs: f64,
    /// Topics on which the marker was read in clear.
    leaked: Vec<String>,
    /// Bytes of the fleet's traffic the reading client saw.
    fleet_bytes: usize,
    /// Connections the silent subscriber made (0: no attack).
    silent_connections: u64,
}

/// Runs the marked study with two agents and a client reading everything
/// under the study's root, under `attack`, set up before the agents join.
fn marked_run(dir: &Path, name: &str, trials: u32, attack: Attack) -> Run {
    let store = dir.join(format!("{name}.db"));
    let root = unique_root(name);
    let marker = format!("tf-secret-{:08x}", std::process::id());
    let study = marked_study(dir, name, trials, &marker);
    let users = users_file(dir, name, &root);
    let (mut coord, url) = start_coordinator(&study, &store, &root, &["--broker-users", &users.to_string_lossy()]);
    let port = port_of(&url);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let login = Some(("reader", "read-pw"));
    let mut reader = rt.block_on(TestClient::connect_as(port, "reader", login)).expect("reader connects");
    rt.block_on(reader.subscribe(&[format!("{root}/#")]));
    let stop = Arc::new(AtomicBool::new(false));
    let filled = Arc::new(AtomicU64::new(0));
    let attackers = match attack {
        Attack::None => Vec::new(),
        Attack::Silent => vec![silent_wildcard_subscriber(port, stop.clone(), filled.clone())],
        Attack::Fill => queue_fillers(port, &root, 80, 12, stop.clone(), filled.clone()),
    };
    let want = attackers.len() as u64;
    let full = || filled.load(Ordering::Relaxed) >= want;
    wait_for("the attackers' queues filled", Duration::from_secs(120), full);
    let agents = [format!("{root}-a1"), format!("{root}-a2")];
    let with_login = |n: &String| {
        let mut agent = Command::new(bin("tunefleet-agent"));
        agent.env("TUNEFLEET_PASSWORD", FLEET_PASSWORD);
        start_agent_with(agent, &url, n, &root, &["--slots", "2", "--username", "fleet"])
    };
    let _a: Vec<Proc> = agents.iter().map(with_login).collect();
    let started = Instant::now();
    let (mut leaked, mut fleet_bytes, mut peak_mib) = (Vec::new(), 0, 0);
    while coord.child.try_wait().expect("coordinator").is_none() {
        peak_mib = peak_mib.max(proc_kib(coord.child.id(), "VmHWM") / 1024);
        assert!(started.elapsed() < Duration::from_secs(240), "{name}: the study did not finish");
        if let Ok((topic, payload)) = rt.block_on(reader.next_message(Duration::from_millis(100))) {
            fleet_bytes += payload.len();
            if payload.windows(marker.len()).any(|w| w == marker.as_bytes()) {
                leaked.push(topic);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let silent_connections = attackers.into_iter().map(|t| t.join().expect("attacker thread")).sum();
    assert_eq!(coord.wait_exit(Duration::from_secs(10)).code(), Some(0), "{name}: the study completed");
    let done: Vec<i64> = query(&store, "SELECT trial FROM results WHERE success = 1", |r| r.get(0));
    assert_eq!(done.len(), trials as usize, "{name}: every trial done");
    assert_agents_spools_empty(&agents.iter().map(String::as_str).collect::<Vec<_>>());
    Run { peak_mib, secs, leaked, fleet_bytes, silent_connections }
}

#[test]
fn a_silent_wildcard_subscriber_neither_stalls_the_fleet_nor_reads_it() {
    let _alone = one_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let trials = 200;
    let quiet = marked_run(dir.path(), "quiet", trials, Attack::None);
    let attacked = marked_run(dir.path(), "attacked", trials, Attack::Silent);
    eprintln!(
        "{trials} trials: {:.1} s unattacked, {:.1} s beside a silent # subscriber ({} connections of it): {:.2}x \
         the trials/s; the reader saw {} and {} bytes of the fleet's",
        quiet.secs,
        attacked.secs,
        attacked.silent_connections,
        quiet.secs / attacked.secs,
        quiet.fleet_bytes,
        attacked.fleet_bytes
    );
    assert!(attacked.silent_connections >= 1);
    // Before, every publish to the silent subscriber waited on its full
    // queue: 4x the time here, the fleet still 12-14 s of every 23 s in
    // a longer run. The bound leaves room for the attacker's own CPU.
    assert!(
        attacked.secs < 2.0 * quiet.secs + 3.0,
        "{:.1} s under attack against {:.1} s: the silent subscriber held the fleet up",
        attacked.secs,
        quiet.secs
    );
    for run in [&quiet, &attacked] {
        assert!(run.fleet_bytes > 10_000, "the reader saw the fleet's traffic ({} bytes)", run.fleet_bytes);
        assert!(run.leaked.is_empty(), "argv or env read in clear on {:?}", run.leaked);
    }
}

#[test]
fn eighty_connections_filling_their_queues_leave_the_coordinator_small_and_the_fleet_going() {
    let _alone = one_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let trials = 200;
    let quiet = marked_run(dir.path(), "calm", trials, Attack::None);
    let filled = marked_run(dir.path(), "filled", trials, Attack::Fill);
    eprintln!(
        "{trials} trials: {:.1} s and peak RSS {} MiB unattacked; {:.1} s and {} MiB beside 80 connections that \
         each queued 12 MiB for themselves ({} connections in all): {:.2}x the trials/s",
        quiet.secs,
        quiet.peak_mib,
        filled.secs,
        filled.peak_mib,
        filled.silent_connections,
        quiet.secs / filled.secs
    );
    // Before, each connection could queue 16 MiB for itself: 80 of them
    // took the coordinator past 1 GiB and its unit's MemoryMax.
    assert!(filled.peak_mib < 512, "the coordinator grew to {} MiB", filled.peak_mib);
    assert!(filled.secs < 2.0 * quiet.secs + 5.0, "{:.1} s against {:.1} s", filled.secs, quiet.secs);
}

#[test]
fn eleven_hundred_idle_logins_under_a_soft_limit_of_1024_keep_no_agent_out() {
    let _alone = one_at_a_time();
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("idle");
    let study = sleep_study(dir.path(), "idle", 4, 0.1);
    join_root(&root, &store);
    // systemd's default soft limit, under a hard one that allows more.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "ulimit -Sn 1024 && exec \"$0\" \"$@\""])
        .arg(bin("tunefleet"))
        .arg("run")
        .arg(&study)
        .arg("--store")
        .arg(&store)
        .args(["--root", &root, "--quiet", "--listen", "127.0.0.1:0"])
        .env("XDG_STATE_HOME", state_home());
    let mut coord = Proc::spawn("coordinator", cmd);
    let url = coord.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let url = url.trim_start_matches("broker: ").trim().to_string();
    let port = port_of(&url);
    let mut idle = Vec::new();
    for i in 0..1_100 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        let name = format!("idle-{i}");
        s.write_all(&connect_packet(&name, &name, &stranger_login(&name, None))).expect("connect packet");
        idle.push(s);
    }
    // Each login answered: the broker holds them all.
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let mut connack = [0u8; 4];
        s.read_exact(&mut connack).expect("a CONNACK");
        assert_eq!(connack, [0x20, 0x02, 0x00, 0x00], "accepted");
    }
    let name = format!("{root}-late");
    let started = Instant::now();
    let _agent = start_agent(&url, &name, &root, &[]);
    assert!(coord.wait_exit(Duration::from_secs(60)).success(), "the study finished");
    let took = started.elapsed();
    eprintln!("with 1,100 idle logins held, a new agent finished a 4-trial study in {} ms", took.as_millis());
    // Before, the 1,100 logins took every descriptor: the agent was never welcomed.
    assert!(took < Duration::from_secs(15), "{} ms", took.as_millis());
    drop(idle);
    assert_agents_spools_empty(&[&name]);
}

#[test]
fn mqtt5_and_mqtt31_clients_hear_a_refusal_and_the_coordinator_logs_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let log = dir.path().join("coordinator.log");
    let root = unique_root("v5");
    let study = sleep_study(dir.path(), "v5", 2, 0.1);
    let (coord, url) = start_coordinator_logged(&study, &store, &root, &[], Some(&log));
    let port = port_of(&url);
    // MQTT 5 (as `mosquitto_sub -V mqttv5` sends it) and MQTT 3.1 ("MQIsdp", level 3).
    let v5 = framed(0x10, &[0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60, 0, 0, 2, b'v', b'5']);
    let v31 = framed(0x10, &[0, 6, b'M', b'Q', b'I', b's', b'd', b'p', 3, 0x02, 0, 60, 0, 3, b'v', b'3', b'1']);
    for (connect, want) in [(v5, vec![0x20u8, 0x03, 0x00, 0x84, 0x00]), (v31, vec![0x20, 0x02, 0x00, 0x01])] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        s.write_all(&connect).expect("write");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("answered and closed");
        assert_eq!(got, want, "the CONNACK its specification asks for");
    }
    wait_for("the refusals in the log", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.contains("MQTT protocol level 5") && text.contains("MQTT protocol level 3")
    });
    coord.signal("KILL");
}

#[test]
fn strangers_members_and_operators_reach_only_what_they_were_granted() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("acl");
    let victim = format!("{root}-v");
    let users = dir.path().join("users");
    let watched = format!("{root}/v2/up/{victim}/+");
    std::fs::write(&users, format!("watch:watch-pw:{watched}\nfleet:{FLEET_PASSWORD}\n")).expect("users");
    let study = sleep_study(dir.path(), "acl", 8, 1.0);
    let (mut coord, url) = start_coordinator(&study, &store, &root, &["--broker-users", &users.to_string_lossy()]);
    let port = port_of(&url);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let mut watch = rt.block_on(TestClient::connect_as(port, "watch", Some(("watch", "watch-pw")))).expect("watch");
    rt.block_on(watch.subscribe(std::slice::from_ref(&watched)));
    assert_eq!(rt.block_on(watch.try_subscribe(&[format!("{root}/#")])), [false], "an operator reads its grant only");
    let mut agent = Command::new(bin("tunefleet-agent"));
    agent.env("TUNEFLEET_PASSWORD", FLEET_PASSWORD);
    let _agent = start_agent_with(agent, &url, &victim, &root, &["--username", "fleet"]);
    // The victim is online: its traffic reaches the watching tool.
    rt.block_on(watch.next_message(Duration::from_secs(30))).expect("the victim's traffic");

    // No login, a password that proves no key, a stranger without the fleet's password: refused.
    assert!(rt.block_on(TestClient::connect(port, "anon")).is_err(), "no login");
    assert!(
        rt.block_on(TestClient::connect_as(port, "pw", Some(("fleet", FLEET_PASSWORD)))).is_err(),
        "a bare password"
    );
    let bare = stranger_login("mallory", None);
    assert!(rt.block_on(TestClient::connect_as(port, "m0", Some(("mallory", &bare)))).is_err(), "no fleet password");
    let login = |name: &str| stranger_login(name, Some(("fleet", FLEET_PASSWORD)));
    // A stranger under a new name: its own topics only.
    let mallory = login("mallory");
    let mut m = rt.block_on(TestClient::connect_as(port, "m1", Some(("mallory", &mallory)))).expect("a stranger");
    let filters = [
        "#".to_string(),
        format!("{root}/v2/down/{victim}/+"),
        format!("{root}/v2/up/+/+"),
        format!("{root}/v2/down/mallory/+"),
        format!("{root}/v2/coordinator/status"),
    ];
    assert_eq!(rt.block_on(m.try_subscribe(&filters)), [false, false, false, true, true]);
    // Under the victim's name with a key of its own: a forged result and a
    // forged retained status go nowhere.
    let marker = format!("forged-{}", std::process::id()).into_bytes();
    let imp_login = login(&victim);
    let imp = rt.block_on(TestClient::connect_as(port, "imp", Some((&victim, &imp_login)))).expect("a stranger");
    for kind in ["result", "status", "request"] {
        rt.block_on(imp.publish(format!("{root}/v2/up/{victim}/{kind}"), marker.clone(), kind == "status"))
            .expect("queued");
    }
    // What the broker refused and denied, counted where an operator looks.
    let s = store.to_str().expect("utf-8");
    let counted = |key: &str| -> u64 {
        let (_, out, _) = tunefleet(&["status", "--json", "--store", s]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v[0]["broker"][key].as_u64().unwrap_or(0)
    };
    let shown = || tunefleet(&["status", "--json", "--store", s]).1;
    wait_for("the denials in status --json", Duration::from_secs(20), || counted("denied_total") >= 6);
    eprintln!("status --json: {}", shown());
    assert!(counted("refused_login_total") >= 3, "the three refused logins");
    let (_, out, _) = tunefleet(&["status", "--store", s]);
    assert!(out.contains("broker: ") && out.contains("stranger"), "{out}");
    assert!(coord.wait_exit(Duration::from_secs(120)).success(), "the study finished");
    let mut seen = 0;
    while let Ok((topic, payload)) = rt.block_on(watch.next_message(Duration::from_millis(300))) {
        seen += 1;
        assert!(!payload.windows(marker.len()).any(|w| w == marker), "a forgery on {topic} got through");
    }
    eprintln!("the watching tool saw {seen} more of the victim's messages, no forgery");
    assert_agents_spools_empty(&[&victim]);
    let done: Vec<i64> = query(&store, "SELECT trial FROM results WHERE success = 1", |r| r.get(0));
    assert_eq!(done.len(), 8);
}
