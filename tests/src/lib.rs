//! Helpers for the integration tests: the built binaries, temp dirs, free
//! ports, child processes that die with the test, and waiting on conditions
//! under a deadline (never a fixed sleep).

pub mod chromium;
pub mod member;
pub mod mosquitto;
pub mod mqtt;
pub mod ports;
pub mod postgres;
pub mod proxy;
pub mod slurm;
pub mod spark;
pub mod tmpfs;
pub mod victoria;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Directory holding the workspace's built binaries (`target/debug`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/test-hash -> target/debug
    exe.parent().and_then(Path::parent).expect("target dir").to_path_buf()
}

/// Path of a workspace binary; panics with a hint when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A PATH with the workspace binaries first, so studies find the workloads.
pub fn path_with_bins() -> std::ffi::OsString {
    let old = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin_dir()).chain(std::env::split_paths(&old))).expect("PATH")
}

/// A loopback port that was free a moment ago. Any process may bind it
/// before the server it was meant for: give a server port 0 and read its
/// port back when it can listen there (`ports::listening_ports`), and use
/// this only for one that cannot, through a start that tries another port
/// when it lost that race (`mosquitto::Mosquitto::start`). For a port where
/// nothing may listen, hold a `ports::ClosedPort`.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind").port()
}

/// Polls `cond` every 20 ms until it is true or `timeout` passes.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until something accepts TCP connections on `port`.
pub fn wait_for_port(port: u16, timeout: Duration) {
    wait_for(&format!("port {port}"), timeout, || TcpStream::connect(("127.0.0.1", port)).is_ok());
}

/// The children of process `pid` as (pid, command name), read from `/proc`.
pub fn children(pid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| {
        let child: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        // "pid (comm) state ppid ...": comm may hold spaces, so split at the last ')'.
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == pid).then_some((child, comm))
    })
    .collect()
}

/// A child process killed (with its process group) when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
    lines: Option<mpsc::Receiver<String>>,
}

impl Proc {
    /// Spawns `cmd` in its own process group with stdout piped and readable line by line.
    pub fn spawn(name: &str, mut cmd: Command) -> Proc {
        use std::os::unix::process::CommandExt;
        cmd.stdout(Stdio::piped()).stdin(Stdio::null()).process_group(0);
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawning {name}: {e}"));
        let out: ChildStdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let tag = name.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                eprintln!("[{tag}] {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc { child, name: name.to_string(), lines: Some(rx) }
    }

    /// Reads stdout until a line satisfies `pred`; returns it.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let rx = self.lines.as_ref().expect("stdout reader");
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if pred(&line) => return line,
                Ok(_) => {}
                Err(_) => panic!("{}: no matching line on stdout within {timeout:?}", self.name),
            }
        }
    }

    /// All stdout lines that arrive until the process exits.
    pub fn rest_of_stdout(&mut self) -> Vec<String> {
        self.lines.take().map(|rx| rx.iter().collect()).unwrap_or_default()
    }

    /// Waits for exit under a deadline.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit within {timeout:?}", self.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal to the whole process group.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), "--", &format!("-{}", self.child.id())]).status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal("KILL");
            let _ = self.child.wait();
        }
    }
}

/// Runs a command to completion, returning (exit code, stdout, stderr).
pub fn run(mut cmd: Command) -> (Option<i32>, String, String) {
    let out = cmd.stdin(Stdio::null()).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Holds the lock of the tests (of one test binary) that must run one at
/// a time: those that load the machine on purpose, or compare a run with
/// another, would measure each other.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The port of a broker URL a coordinator printed (`mqtt://HOST:PORT`).
pub fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port")
}

/// A field of `/proc/PID/status`, in KiB (0 once the process is gone).
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:")));
    line.and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A broker login proving `identity` as `name` now, as the real agent makes
/// one per attempt, carrying `secret` (a users-file login) when given.
pub fn key_login(identity: &tunefleet_common::auth::Identity, name: &str, secret: Option<(&str, &str)>) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    tunefleet_common::auth::login_password(identity, name, u64::try_from(now).expect("ms"), secret)
}

/// A stranger's login: `name` with a proof of a fresh key of its own, not enrolled.
pub fn stranger_login(name: &str, secret: Option<(&str, &str)>) -> String {
    key_login(&tunefleet_common::auth::Identity::generate().expect("key").0, name, secret)
}

/// A unique topic root for one test, so tests sharing a broker never meet.
pub fn unique_root(test: &str) -> String {
    format!("t-{test}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    t ^ std::process::id().rotate_left(16)
}

/// Join tokens by topic root: [`start_agent`] gives an agent the token of
/// the coordinator that runs on its root, as an operator would.
static JOIN: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// Creates a join token with the real `tunefleet token create` for the
/// coordinator that keeps `store` (its key under [`state_home`]).
pub fn create_join_token(store: &Path, extra: &[&str]) -> String {
    let out = Command::new(bin("tunefleet"))
        .args(["token", "create", "--uses", "1000000", "--ttl", "2h", "--store"])
        .arg(store)
        .args(extra)
        .env("XDG_STATE_HOME", state_home())
        .output()
        .expect("tunefleet token create runs");
    assert!(out.status.success(), "token create: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Makes a join token for the coordinator of `store` and gives it to the
/// agents [`start_agent`] starts on `root` from now on; returns it.
pub fn join_root(root: &str, store: &Path) -> String {
    let token = create_join_token(store, &[]);
    let mut join = JOIN.lock().unwrap_or_else(|e| e.into_inner());
    join.retain(|(r, _)| r != root);
    join.push((root.to_string(), token.clone()));
    token
}

/// The join token of the coordinator on `root`, if one was made.
pub fn join_token_of(root: &str) -> Option<String> {
    let join = JOIN.lock().unwrap_or_else(|e| e.into_inner());
    join.iter().find(|(r, _)| r == root).map(|(_, t)| t.clone())
}

/// Starts `tunefleet serve` on `store` with `extra` flags (its page on a
/// free loopback port unless they give `--page`); agents that
/// [`start_agent`] starts on `root` join it. Returns the service and its
/// broker URL once its control socket exists (its page's URL and API token
/// are in [`api_access`]).
pub fn start_service(store: &Path, root: &str, extra: &[&str]) -> (Proc, String) {
    join_root(root, store);
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--root", root]).arg("--store").arg(store).args(extra);
    if !extra.contains(&"--page") {
        cmd.args(["--page", "127.0.0.1:0"]);
    }
    cmd.env("XDG_STATE_HOME", state_home());
    let mut service = Proc::spawn("service", cmd);
    let broker = service.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let control = tunefleet_coordinator::runtime::control::default_path(store);
    wait_for("the control socket", Duration::from_secs(30), || control.exists());
    (service, broker.trim_start_matches("broker: ").trim().to_string())
}

/// The page's URL (`http://127.0.0.1:PORT/`) and the API's write token of
/// the service on `store`, from the `api.json` it writes beside its socket.
pub fn api_access(store: &Path) -> (String, String) {
    let path = tunefleet_coordinator::runtime::control::default_path(store).with_file_name("api.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let access: serde_json::Value = serde_json::from_str(&text).expect("api.json");
    let field = |k: &str| access[k].as_str().unwrap_or_else(|| panic!("api.json has no {k}")).to_string();
    (field("url"), field("token"))
}

/// Starts `tunefleet run STUDY` with the embedded broker on a port the OS
/// chooses; returns the process and the broker URL it printed. Agents that
/// [`start_agent`] starts on `root` join with a token for it.
pub fn start_coordinator(study: &Path, store: &Path, root: &str, extra: &[&str]) -> (Proc, String) {
    start_coordinator_logged(study, store, root, extra, None)
}

/// [`start_coordinator`] with its stderr (its log, and the error `main`
/// prints when it fails) written to `log` when given.
pub fn start_coordinator_logged(
    study: &Path,
    store: &Path,
    root: &str,
    extra: &[&str],
    log: Option<&Path>,
) -> (Proc, String) {
    join_root(root, store);
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.arg("run").arg(study).arg("--store").arg(store).args(["--root", root, "--quiet"]).args(extra);
    cmd.env("XDG_STATE_HOME", state_home());
    if !extra.contains(&"--broker") && !extra.contains(&"--listen") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    if let Some(log) = log {
        cmd.stderr(std::fs::File::create(log).expect("coordinator log file"));
    }
    let mut p = Proc::spawn("coordinator", cmd);
    let line = p.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let url = line.trim_start_matches("broker: ").trim().to_string();
    (p, url)
}

/// Starts an agent process.
pub fn start_agent(url: &str, name: &str, root: &str, extra: &[&str]) -> Proc {
    start_agent_with(Command::new(bin("tunefleet-agent")), url, name, root, extra)
}

/// Starts an agent through `launcher`: an agent binary given by path, or an
/// emulator with the agent as its first argument (`qemu-aarch64-static AGENT`).
pub fn start_agent_with(mut launcher: Command, url: &str, name: &str, root: &str, extra: &[&str]) -> Proc {
    launcher.args(["--broker", url, "--name", name, "--root", root]).args(extra);
    // A PATH the launcher sets already includes the binaries (a Spark client's).
    if !launcher.get_envs().any(|(k, _)| k == "PATH") {
        launcher.env("PATH", path_with_bins());
    }
    let trusts = extra.iter().any(|a| matches!(*a, "--join" | "--join-file" | "--coordinator-key"));
    match join_token_of(root) {
        Some(token) if !trusts => launcher.env("TUNEFLEET_JOIN", token),
        _ => launcher.env_remove("TUNEFLEET_JOIN"),
    };
    // Agents spool results under the XDG state home by default: keep tests' spools out of $HOME.
    launcher.env("XDG_STATE_HOME", state_home());
    Proc::spawn(name, launcher)
}

/// The XDG state home of this test process's agents and coordinators (their
/// keys, pins and spools), so tests never touch `$HOME`.
pub fn state_home() -> PathBuf {
    std::env::temp_dir().join(format!("tunefleet-test-state-{}", std::process::id()))
}

/// The state directory of an agent started by [`start_agent`] without `--state-dir`.
pub fn agent_state_dir(name: &str) -> PathBuf {
    state_home().join("tunefleet-agent").join(name)
}

/// The results in an agent's spool awaiting an acknowledgement, by the
/// file names they have when parked (read as `tunefleet-agent spool` does).
pub fn spool(state_dir: &Path) -> Vec<String> {
    tunefleet_agent::pending::SpoolView::open(state_dir)
        .load()
        .iter()
        .map(|r| tunefleet_agent::pending::file_name(&r.trial))
        .collect()
}

/// Every test ends here: each agent's spool is empty (everything it measured
/// was acknowledged), waiting at most a few seconds for the last ack.
pub fn assert_spools_empty(state_dirs: &[PathBuf]) {
    for dir in state_dirs {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !spool(dir).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(spool(dir), Vec::<String>::new(), "results left in the spool of {}", dir.display());
    }
}

/// [`assert_spools_empty`] for agents started by [`start_agent`] under these names.
pub fn assert_agents_spools_empty(names: &[&str]) {
    assert_spools_empty(&names.iter().map(|n| agent_state_dir(n)).collect::<Vec<_>>());
}

/// Runs the study file `study` (into `store`, under `test`'s unique root)
/// with one agent started with `agent_args`, until the coordinator ends;
/// asserts it succeeded and the agent's spool is empty. Its output.
pub fn run_with_one_agent(study: &Path, store: &Path, test: &str, agent_args: &[&str], timeout: Duration) -> String {
    let root = unique_root(test);
    let (mut coord, url) = start_coordinator(study, store, &root, &[]);
    let agent_name = format!("{root}-agent");
    let agent = start_agent(&url, &agent_name, &root, agent_args);
    let status = coord.wait_exit(timeout);
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "coordinator failed: {status:?}\n{out}");
    drop(agent);
    assert_agents_spools_empty(&[&agent_name]);
    out
}

/// `tunefleet ARGS` with the tests' state home: exit code, stdout, stderr.
pub fn tunefleet(args: &[&str]) -> (Option<i32>, String, String) {
    let mut c = Command::new(bin("tunefleet"));
    c.args(args).env("XDG_STATE_HOME", state_home());
    run(c)
}

/// Runs `study` with one agent (its log in `dir`), whatever the outcome:
/// the coordinator's exit code, stdout and log; asserts the agent's spool
/// is empty.
pub fn run_study_logged(dir: &Path, study: &Path, store: &Path, test: &str) -> (Option<i32>, String, String) {
    let root = unique_root(test);
    let log = dir.join(format!("{test}.log"));
    let (mut coord, url) = start_coordinator_logged(study, store, &root, &[], Some(&log));
    let agent_name = format!("{root}-agent");
    let agent = start_agent(&url, &agent_name, &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    drop(agent);
    assert_agents_spools_empty(&[&agent_name]);
    (status.code(), out, std::fs::read_to_string(&log).unwrap_or_default())
}

/// The rows `sql` selects from the store at `store`, each mapped by `row`.
pub fn query<T>(store: &Path, sql: &str, row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>) -> Vec<T> {
    let db = rusqlite::Connection::open(store).expect("store");
    let mut stmt = db.prepare(sql).expect("prepare");
    let rows = stmt.query_map([], row).expect("query").collect::<Result<Vec<T>, _>>().expect("rows");
    rows
}

/// The `[pipeline]` section of a study whose trials probe each system
/// configuration for one epoch, after a warm-up epoch, and keep the fastest.
pub const PIPELINE_EPOCH_WINDOWS: &str = r#"[pipeline]
mode = "pipelined"
probe = "grid"
window = { epochs = 1, warmup = 1 }
select = "time"
"#;

/// A study file using the real training workload, with `trials` trials.
pub fn train_study(dir: &Path, name: &str, trials: u32, selector: &str) -> PathBuf {
    let text = format!(
        r#"name = "{name}"
command = ["tunefleet-train", "--lr", "{{lr}}", "--batch-size", "{{batch_size}}", "--epochs", "3", "--threads", "{{threads}}"]
env = {{ TUNEFLEET_TRIAL = "{{trial}}" }}
timeout = 120

[objective]
metric = "accuracy"
direction = "maximize"

[budget]
trials = {trials}

[strategy]
kind = "random"
seed = 11

{selector}

[hyper.lr]
kind = "log_float"
low = 0.02
high = 0.3

[hyper.batch_size]
kind = "categorical"
values = [32, 64]

[system.threads]
kind = "int"
low = 1
high = 2

[system.cores]
kind = "int"
low = 1
high = 2
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write study");
    path
}

/// A study of `trials` trials that each sleep `secs` and report `v` = trial + 1
/// (the objective), so every stored result can be checked against its trial.
pub fn sleep_study(dir: &Path, name: &str, trials: u32, secs: f64) -> PathBuf {
    let text = format!(
        r#"name = "{name}"
command = ["sh", "-c", "sleep {secs}; echo '{{{{\"event\":\"final\",\"v\":{{v}}}}}}'"]
timeout = 60
max_attempts = 5
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = {trials}
[strategy]
kind = "grid"
[hyper.v]
kind = "int"
low = 1
high = {trials}
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("study");
    path
}
