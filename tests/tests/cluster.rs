//! A study across a two-node cluster of a real clustered broker: Debian's
//! ejabberd (its MQTT service, `mod_mqtt`), two Erlang nodes on loopback,
//! the coordinator logged in on one node and the agents on the other.
//!
//! Skipped (with a message on stderr) when ejabberd is not installed:
//! `apt-get install ejabberd` (scripts/test.sh does). Each test starts its
//! own cluster in a temp dir: a private epmd (Erlang's port mapper) on a port
//! that was free, nodes with their own config, spool (Mnesia) and log, MQTT
//! listeners on ports that were free, and a random Erlang cookie; it never
//! uses the system's ejabberd, its config or port 4369.
//!
//! What ejabberd 23.01 does across nodes, as these checks pin it down: live
//! QoS 1 messages (to exact and wildcard filters) and Last Wills reach
//! subscribers on the other node, but a retained message does not: each node
//! indexes retained topics in a node-local table, filled when the node starts
//! and when a retained message is published on it. A subscriber on node B is
//! sent a retained message published on node A only if its topic was
//! published retained on B before (any payload) or B started after it was
//! published. The agents wait for the coordinator's retained status, so the
//! study primes that topic on the agents' node before the coordinator starts
//! (docs/CLUSTER-BROKER.md).

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, LastWill, MqttOptions, Packet, QoS};
use rusqlite::Connection;
use tunefleet_common::topic::Topics;
use tunefleet_tests::ports::listening_ports;
use tunefleet_tests::*;

/// The XMPP domain of the test cluster: MQTT logins are `user@localhost`.
const DOMAIN: &str = "localhost";

/// Ports tried before a start gives up (another process took the port first).
const TRIES: usize = 5;

/// The directory holding Debian's ejabberd Erlang applications (for
/// `ERL_LIBS`): the one under `/usr/lib/*/` with an `ejabberd-*/ebin/ejabberd.app`.
fn ejabberd_libs() -> Option<PathBuf> {
    let arch_dirs = std::fs::read_dir("/usr/lib").ok()?;
    arch_dirs.flatten().map(|e| e.path()).find(|dir| {
        std::fs::read_dir(dir).is_ok_and(|apps| {
            apps.flatten().any(|app| {
                app.file_name().to_string_lossy().starts_with("ejabberd-")
                    && app.path().join("ebin/ejabberd.app").exists()
            })
        })
    })
}

/// One ejabberd node: an Erlang VM running ejabberd, killed when dropped.
struct Node {
    /// `tfN@localhost`.
    name: String,
    /// Its MQTT listener on 127.0.0.1.
    port: u16,
    _proc: Proc,
}

/// A private ejabberd cluster. Nodes are declared before epmd: they die first.
struct Cluster {
    nodes: Vec<Node>,
    _epmd: Proc,
    epmd_port: u16,
    dir: PathBuf,
    libs: PathBuf,
    cookie: String,
    ctl_calls: AtomicU32,
}

impl Cluster {
    /// Starts epmd and `n` nodes, joins every node to the first, and
    /// registers `logins` (user, password) in the cluster's internal auth.
    fn start(dir: &Path, libs: PathBuf, n: usize, logins: &[(&str, &str)]) -> Cluster {
        let (epmd, epmd_port) = start_epmd();
        let cookie = format!("tf{}x{}", std::process::id(), rand_nanos());
        let mut cluster = Cluster {
            nodes: Vec::new(),
            _epmd: epmd,
            epmd_port,
            dir: dir.to_path_buf(),
            libs,
            cookie,
            ctl_calls: AtomicU32::new(0),
        };
        let names: Vec<String> = (1..=n).map(|i| format!("tf{i}@localhost")).collect();
        cluster.nodes = cluster.start_nodes(&names);
        let first = cluster.nodes[0].name.clone();
        for node in &cluster.nodes[1..] {
            // Wipes the joining node's Mnesia, copies the first node's tables
            // and restarts ejabberd (not the VM) on it.
            cluster.ctl(&node.name, &["join_cluster", &first]);
        }
        for node in &cluster.nodes {
            let members = cluster.ctl(&node.name, &["list_cluster"]);
            for other in &cluster.nodes {
                assert!(
                    members.contains(&other.name),
                    "{} does not list {} in its cluster:\n{members}",
                    node.name,
                    other.name
                );
            }
        }
        for (user, password) in logins {
            cluster.ctl(&first, &["register", user, DOMAIN, password]);
        }
        // Ready: every node accepts an MQTT login (the joined nodes restarted
        // their listeners; the users were registered on the first node).
        if let Some((user, password)) = logins.first() {
            for node in &cluster.nodes {
                wait_for(&format!("an MQTT login on {}", node.name), Duration::from_secs(30), || {
                    Mqtt::connect(node.port, &format!("ready-{}", node.port), user, password, None).is_ok()
                });
            }
        }
        cluster
    }

    /// `mqtt://127.0.0.1:PORT` of node `i`.
    fn url(&self, i: usize) -> String {
        format!("mqtt://127.0.0.1:{}", self.nodes[i].port)
    }

    /// The environment every Erlang VM of this cluster runs in.
    fn erl(&self) -> Command {
        let mut c = Command::new("erl");
        c.env("ERL_LIBS", &self.libs)
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            // No ~/.erlang or ~/.erlang.cookie of the user's.
            .env("HOME", &self.dir)
            .env("ERL_CRASH_DUMP_BYTES", "0")
            .args(["-setcookie", &self.cookie, "-noinput", "-start_epmd", "false"])
            // Idle schedulers sleep instead of spinning: the tests share the machine.
            .args(["+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none"]);
        c
    }

    /// Starts nodes `names` side by side, each with an MQTT listener on a
    /// port that was free; returns once each listens there.
    fn start_nodes(&self, names: &[String]) -> Vec<Node> {
        let mut launched: Vec<(String, u16, Proc)> = names.iter().map(|n| self.launch(n)).collect();
        let mut nodes = Vec::new();
        let mut tries = 1;
        while let Some((name, port, p)) = launched.pop() {
            match listens(&name, port, p) {
                Ok(node) => nodes.push(node),
                Err(PortTaken) => {
                    tries += 1;
                    assert!(tries <= TRIES, "ejabberd node {name} lost its port to another process {TRIES} times");
                    eprintln!("{name}: port {port} was taken first; trying another");
                    launched.push(self.launch(&name));
                }
            }
        }
        nodes.sort_by(|x, y| x.name.cmp(&y.name));
        nodes
    }

    /// Starts node `name` with its MQTT listener on a port that was free.
    fn launch(&self, name: &str) -> (String, u16, Proc) {
        let short = name.split('@').next().unwrap_or(name);
        let dir = self.dir.join(short);
        let spool = dir.join("spool");
        std::fs::create_dir_all(&spool).expect("node dir");
        let port = free_port();
        let config = dir.join("ejabberd.yml");
        std::fs::write(&config, node_config(port)).expect("write ejabberd.yml");
        let mut c = self.erl();
        c.current_dir(&dir)
            .env("EJABBERD_CONFIG_PATH", &config)
            .env("EJABBERD_LOG_PATH", dir.join("ejabberd.log"))
            .env("ERL_CRASH_DUMP", dir.join("erl_crash.dump"))
            .args(["-sname", name, "-kernel", "inet_dist_use_interface", "{127,0,0,1}"])
            .args(["-mnesia", "dir", &format!("{:?}", spool.display().to_string())])
            .args(["-s", "ejabberd"]);
        (name.to_string(), port, Proc::spawn(short, c))
    }

    /// `ejabberdctl --node NODE ARGS...` without the script (which runs as
    /// the `ejabberd` user and reads /etc/ejabberd): a hidden Erlang node
    /// that calls ejabberd_ctl on NODE. Panics unless it succeeds; returns
    /// its output.
    fn ctl(&self, node: &str, args: &[&str]) -> String {
        let n = self.ctl_calls.fetch_add(1, Ordering::Relaxed);
        let mut c = self.erl();
        c.args(["-sname", &format!("tfctl{n}@localhost"), "-hidden", "-s", "ejabberd_ctl", "-extra", node]).args(args);
        let (code, out, err) = run(c);
        assert_eq!(code, Some(0), "ejabberdctl --node {node} {}: {out}{err}", args.join(" "));
        out
    }
}

/// A node's MQTT port was bound by another process before the node could.
struct PortTaken;

/// Waits until the node `p` listens on `port` (then it is up: ejabberd opens
/// its listeners last), or exits because another process holds the port.
fn listens(name: &str, port: u16, mut p: Proc) -> Result<Node, PortTaken> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if listening_ports(p.child.id()).contains(&port) {
            return Ok(Node { name: name.to_string(), port, _proc: p });
        }
        if let Some(status) = p.child.try_wait().expect("try_wait") {
            let log = p.rest_of_stdout();
            if log.iter().any(|l| l.contains("address already in use")) {
                return Err(PortTaken);
            }
            panic!("ejabberd node {name} exited with {status} before listening on {port}:\n{}", log.join("\n"));
        }
        assert!(Instant::now() < deadline, "ejabberd node {name} did not listen on port {port} within 60 s");
        // Waiting on a condition (its socket exists) that no event announces.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The ejabberd.yml of a test node: the MQTT listener alone (no XMPP, HTTP
/// or STUN ports), internal (Mnesia) logins, and mod_mqtt with the settings
/// docs/CLUSTER-BROKER.md gives: no cap on a session's queue of outgoing
/// messages (the coordinator's, under fan-in) nor on the retained messages
/// sent on subscription (one status per agent).
fn node_config(port: u16) -> String {
    format!(
        "hosts:\n  - {DOMAIN}\nloglevel: warning\nauth_method: internal\n\
         listen:\n  -\n    port: {port}\n    ip: \"127.0.0.1\"\n    module: mod_mqtt\n\
         modules:\n  mod_mqtt:\n    max_queue: unlimited\n    match_retained_limit: infinity\n"
    )
}

/// A private epmd on 127.0.0.1 and a port that was free; returns it once it listens.
fn start_epmd() -> (Proc, u16) {
    for _ in 0..TRIES {
        let port = free_port();
        let mut c = Command::new("epmd");
        c.args(["-port", &port.to_string(), "-address", "127.0.0.1"]);
        let mut p = Proc::spawn("epmd", c);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if listening_ports(p.child.id()).contains(&port) {
                return (p, port);
            }
            // epmd exits at once (status 0, nothing said) when its port is taken.
            if p.child.try_wait().expect("try_wait").is_some() {
                eprintln!("epmd: port {port} was taken first; trying another");
                break;
            }
            assert!(Instant::now() < deadline, "epmd did not listen on port {port} within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("epmd lost its port to another process {TRIES} times running");
}

fn rand_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

/// An MQTT 3.1.1 client of the test (rumqttc), its event loop on a thread.
/// Dropped, it closes its socket without a DISCONNECT: the broker then
/// publishes its Last Will.
struct Mqtt {
    client: Client,
    packets: mpsc::Receiver<Result<Packet, String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mqtt {
    /// Connects to 127.0.0.1:`port` as `user@localhost`; returns once the
    /// broker accepted the login.
    fn connect(port: u16, id: &str, user: &str, password: &str, will: Option<LastWill>) -> Result<Mqtt, String> {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        o.set_credentials(format!("{user}@{DOMAIN}"), password).set_keep_alive(Duration::from_secs(5));
        if let Some(w) = will {
            o.set_last_will(w);
        }
        let (client, mut connection) = Client::new(o, 16);
        let (tx, packets) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match connection.recv_timeout(Duration::from_millis(50)) {
                    Ok(Ok(Event::Incoming(p))) => {
                        if tx.send(Ok(p)).is_err() {
                            break;
                        }
                    }
                    Ok(Ok(Event::Outgoing(_))) | Err(rumqttc::RecvTimeoutError::Timeout) => {}
                    // No reconnecting: the test sees the error.
                    Ok(Err(e)) => {
                        let _ = tx.send(Err(e.to_string()));
                        break;
                    }
                    Err(rumqttc::RecvTimeoutError::Disconnected) => break,
                }
            }
        });
        let m = Mqtt { client, packets, stop, thread: Some(thread) };
        match m.packets.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(Packet::ConnAck(ack))) if ack.code == rumqttc::ConnectReturnCode::Success => Ok(m),
            other => Err(format!("{other:?}")),
        }
    }

    /// Waits for the next packet satisfying `want`, at most `timeout`.
    fn wait(&self, timeout: Duration, want: impl Fn(&Packet) -> bool) -> Option<Packet> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.packets.recv_timeout(left) {
                Ok(Ok(p)) if want(&p) => return Some(p),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("MQTT connection failed: {e}"),
                Err(_) => return None,
            }
        }
    }

    fn subscribe(&self, filter: &str) {
        self.client.subscribe(filter, QoS::AtLeastOnce).expect("subscribe");
        self.wait(Duration::from_secs(10), |p| matches!(p, Packet::SubAck(_))).expect("SUBACK within 10 s");
    }

    /// Publishes at QoS 1; returns once the broker acknowledged it.
    fn publish(&self, topic: &str, payload: &[u8], retain: bool) {
        self.client.publish(topic, QoS::AtLeastOnce, retain, payload.to_vec()).expect("publish");
        self.wait(Duration::from_secs(10), |p| matches!(p, Packet::PubAck(_))).expect("PUBACK within 10 s");
    }

    /// The next message (topic, payload) within `timeout`.
    fn message(&self, timeout: Duration) -> Option<(String, Vec<u8>)> {
        match self.wait(timeout, |p| matches!(p, Packet::Publish(_)))? {
            Packet::Publish(p) => Some((p.topic, p.payload.to_vec())),
            _ => None,
        }
    }
}

impl Drop for Mqtt {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The checks and the study share one cluster: its setup is most of the time.
#[test]
fn study_across_a_two_node_ejabberd_cluster() {
    let Some(libs) = ejabberd_libs() else {
        eprintln!(
            "SKIPPED: ejabberd is not installed (no /usr/lib/*/ejabberd-*/ebin/ejabberd.app): \
             apt-get install ejabberd, or scripts/test.sh"
        );
        return;
    };
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tmp");
    let logins = [("coordinator", "coordinator-secret"), ("agent", "agent-secret")];
    let cluster = Cluster::start(dir.path(), libs, 2, &logins);
    eprintln!("two-node ejabberd cluster up in {:.1} s", started.elapsed().as_secs_f64());
    let (a, b) = (cluster.nodes[0].port, cluster.nodes[1].port);
    let root = unique_root("cluster");
    // Probes log in as the agents do: a login is valid on every node.
    let login = |port: u16, id: &str, will: Option<LastWill>| {
        let (user, password) = logins[1];
        Mqtt::connect(port, &format!("{root}-{id}"), user, password, will).unwrap_or_else(|e| panic!("{id}: {e}"))
    };

    // A Last Will of a client of node B reaches a subscriber on node A.
    let will_topic = format!("{root}/probe/will");
    let watcher = login(a, "watcher", None);
    watcher.subscribe(&will_topic);
    let doomed = login(b, "doomed", Some(LastWill::new(&will_topic, "gone", QoS::AtLeastOnce, false)));
    drop(doomed);
    let will = watcher.message(Duration::from_secs(10));
    assert_eq!(will, Some((will_topic, b"gone".to_vec())), "the Last Will crossed from node B to node A");

    // A retained message published on node A is not sent to a subscriber
    // on node B (node B never indexed its topic), only on node A.
    let retained_topic = format!("{root}/probe/retained");
    login(a, "retainer", None).publish(&retained_topic, b"kept", true);
    let on_a = login(a, "late-a", None);
    on_a.subscribe(&retained_topic);
    assert_eq!(on_a.message(Duration::from_secs(10)), Some((retained_topic.clone(), b"kept".to_vec())));
    let on_b = login(b, "late-b", None);
    on_b.subscribe(&retained_topic);
    // ejabberd sends retained messages right after the SUBACK; 2 s is plenty.
    if let Some(m) = on_b.message(Duration::from_secs(2)) {
        panic!(
            "node B sent a retained message published on node A ({m:?}): this ejabberd indexes retained \
             topics cluster-wide, so the priming below and in docs/CLUSTER-BROKER.md is no longer needed"
        );
    }

    // The study: coordinator on node A, agents on node B. The coordinator's
    // retained status topic is primed on node B first (any non-empty payload,
    // which the agents ignore: it is not a signed status).
    let topics = Topics::new(&root).expect("topic root");
    login(b, "primer", None).publish(&topics.coordinator_status(), b"primed for ejabberd", true);
    let study = sleep_study(dir.path(), "cl", 8, 0.3);
    let store = dir.path().join("s.db");
    let password_file = |(user, password): (&str, &str)| {
        let f = dir.path().join(format!("{user}.password"));
        std::fs::write(&f, format!("{password}\n")).expect("password file");
        f.to_string_lossy().into_owned()
    };
    let (coordinator_password, agent_password) = (password_file(logins[0]), password_file(logins[1]));
    let study_started = Instant::now();
    let (mut coord, _) = start_coordinator(
        &study,
        &store,
        &root,
        &["--broker", &cluster.url(0), "--username", "coordinator@localhost", "--password-file", &coordinator_password],
    );
    let names = ["cl-agent-1", "cl-agent-2"];
    let login_b = ["--username", "agent@localhost", "--password-file", agent_password.as_str()];
    let _agents: Vec<Proc> = names.iter().map(|n| start_agent(&cluster.url(1), n, &root, &login_b)).collect();
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "coordinator: {status}");
    eprintln!("study across the cluster done in {:.1} s", study_started.elapsed().as_secs_f64());

    let c = Connection::open(&store).expect("store");
    let rows: Vec<(i64, f64)> = c
        .prepare("SELECT trial, objective FROM results WHERE study = 'cl' ORDER BY trial")
        .expect("prepare")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    let expected: Vec<(i64, f64)> = (0..8).map(|t| (t, (t + 1) as f64)).collect();
    assert_eq!(rows, expected, "one result per trial, each its own value");
    let agents: Vec<String> = c
        .prepare("SELECT name FROM agents ORDER BY name")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(agents, names, "both agents of node B were welcomed by the coordinator on node A");
    assert_agents_spools_empty(&names);

    // Without priming: the coordinator publishes its status again every
    // 30 s (coordinator/src/runtime/transport.rs, STATUS_REFRESH), and an agent on
    // node B that never got the retained copy sees it live and says Hello.
    let unprimed_root = format!("{root}-np");
    let study = sleep_study(dir.path(), "np", 2, 0.1);
    let store = dir.path().join("np.db");
    let unprimed_started = Instant::now();
    let (mut coord, _) = start_coordinator(
        &study,
        &store,
        &unprimed_root,
        &["--broker", &cluster.url(0), "--username", "coordinator@localhost", "--password-file", &coordinator_password],
    );
    let late = "cl-agent-unprimed";
    let _late = start_agent(&cluster.url(1), late, &unprimed_root, &login_b);
    let status = coord.wait_exit(Duration::from_secs(90));
    assert!(status.success(), "coordinator: {status}");
    eprintln!("unprimed study done in {:.1} s (status refreshed every 30 s)", unprimed_started.elapsed().as_secs_f64());
    assert_agents_spools_empty(&[late]);
    eprintln!("whole test: {:.1} s", started.elapsed().as_secs_f64());
}
