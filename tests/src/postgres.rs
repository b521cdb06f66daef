//! A real PostgreSQL server for a test: Debian's, a cluster of its own
//! made by `initdb` in a temporary directory, listening on a free port of
//! 127.0.0.1, stopped (immediately) when dropped. As root, the server runs
//! as the `postgres` user (it refuses root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A running server.
#[derive(Debug)]
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
}

/// Where Debian installs the server's programs: the newest version.
fn server_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server is not installed (scripts/needs.sh postgresql installs it)")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists())
        .collect();
    versions.sort();
    versions.pop().expect("no initdb under /usr/lib/postgresql/*/bin")
}

/// Whether this process runs as root (its effective uid, from `/proc`).
fn as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).map(str::to_string))
        .and_then(|uids| uids.split_whitespace().nth(1).map(|e| e == "0"))
        .unwrap_or(false)
}

/// `program` run as the server's user.
fn server_command(program: &Path) -> Command {
    if as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl Postgres {
    /// A fresh cluster, started; its superuser `tunefleet`, trusted on
    /// loopback (no password).
    pub fn start() -> Postgres {
        Self::start_with(None)
    }

    /// [`Postgres::start`], the superuser's password `password` (SCRAM)
    /// when given: a client without it is refused.
    pub fn start_with(password: Option<&str>) -> Postgres {
        let dir = tempfile::tempdir().expect("tempdir");
        if as_root() {
            let status = Command::new("chown").arg("postgres").arg(dir.path()).status().expect("chown");
            assert!(status.success(), "chown postgres {}", dir.path().display());
        }
        let bin = server_bin();
        let data = dir.path().join("data");
        let mut initdb = server_command(&bin.join("initdb"));
        initdb.arg("-D").arg(&data).args(["-U", "tunefleet", "--no-sync"]);
        match password {
            Some(pw) => {
                let file = dir.path().join("pw");
                std::fs::write(&file, pw).expect("password file");
                if as_root() {
                    let status = Command::new("chown").arg("postgres").arg(&file).status().expect("chown");
                    assert!(status.success());
                }
                initdb.args(["-A", "scram-sha-256"]).arg(format!("--pwfile={}", file.display()));
            }
            None => {
                initdb.args(["-A", "trust"]);
            }
        }
        let out = initdb.output().expect("initdb");
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let pg = Postgres { port: crate::free_port(), dir, bin };
        pg.start_server();
        pg
    }

    fn start_server(&self) {
        let data = self.dir.path().join("data");
        let options =
            format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", self.port, self.dir.path().display());
        let out = server_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .args(["-o", &options, "-l"])
            .arg(self.dir.path().join("log"))
            .arg("start")
            .output()
            .expect("pg_ctl start");
        assert!(out.status.success(), "pg_ctl start: {}\n{}", String::from_utf8_lossy(&out.stderr), self.log());
        let ready = self.bin.join("pg_isready");
        crate::wait_for("PostgreSQL accepting connections", Duration::from_secs(60), || {
            Command::new(&ready)
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success())
        });
    }

    /// From now on the server speaks TLS with `cert` and `key` (PEM) and
    /// refuses any connection without it; restarted to take it.
    pub fn require_tls(&self, cert: &Path, key: &Path) {
        let data = self.dir.path().join("data");
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            std::fs::copy(from, data.join(to)).expect("copy a TLS file");
            if as_root() {
                let status = Command::new("chown").arg("postgres").arg(data.join(to)).status().expect("chown");
                assert!(status.success());
            }
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(data.join("server.key"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let conf = data.join("postgresql.conf");
        let mut text = std::fs::read_to_string(&conf).expect("postgresql.conf");
        text.push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, text).expect("postgresql.conf");
        let hba = data.join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        let text = text.replace("\nhost ", "\nhostssl ") + "hostnossl all all 0.0.0.0/0 reject\n";
        std::fs::write(&hba, text).expect("pg_hba.conf");
        self.restart();
    }

    /// Stops the server at once (as a crash would) and starts it again.
    pub fn restart(&self) {
        self.stop();
        self.start_server();
    }

    fn stop(&self) {
        let _ = server_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }

    /// A store URL on this server: database `postgres`, schema `schema`.
    pub fn store(&self, schema: &str) -> String {
        format!("postgres://tunefleet@127.0.0.1:{}/postgres?schema={schema}", self.port)
    }

    /// The server's log, for a failure message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The answer to `sql` (one value per line), through `psql`.
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "tunefleet", "-d", "postgres"])
            .args(["-At", "-c", sql])
            .output()
            .expect("psql");
        assert!(out.status.success(), "psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

/// A session of `psql` holding a table locked in a transaction of its
/// own ([`Postgres::lock`]) until [`Locked::release`], its drop, or its
/// deadline: a test whose code waits on the lock for good ends.
#[derive(Debug)]
pub struct Locked {
    psql: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    release: Option<std::sync::mpsc::Sender<()>>,
    deadline: Option<std::thread::JoinHandle<bool>>,
}

impl Postgres {
    /// Locks `table` (every mode, reads too) in a session of its own, named
    /// `locker` on the server, for at most `at_most`; returns once the lock
    /// is held.
    pub fn lock(&self, table: &str, at_most: Duration) -> Locked {
        use std::io::{BufRead, Write};
        use std::process::Stdio;
        let port = self.port.to_string();
        let psql_args =
            ["-h", "127.0.0.1", "-p", &port, "-U", "tunefleet", "-d", "postgres", "-At", "-v", "ON_ERROR_STOP=1"];
        let mut psql = Command::new("psql")
            .args(psql_args)
            .env("PGAPPNAME", "locker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("psql");
        let mut stdin = psql.stdin.take().expect("stdin");
        writeln!(stdin, "BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE; SELECT 'locked';").expect("to psql");
        let mut lines = std::io::BufReader::new(psql.stdout.take().expect("stdout")).lines();
        let said = lines.find(|l| matches!(l.as_deref(), Ok("locked")));
        assert!(said.is_some(), "psql did not lock {table}");
        let (release, released) = std::sync::mpsc::channel::<()>();
        let args: Vec<String> = psql_args.iter().map(|a| a.to_string()).collect();
        let deadline = std::thread::spawn(move || {
            let expired = matches!(released.recv_timeout(at_most), Err(std::sync::mpsc::RecvTimeoutError::Timeout));
            if expired {
                let end = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'locker'";
                let _ = Command::new("psql").args(&args).args(["-c", end]).output();
            }
            expired
        });
        Locked { psql, stdin: Some(stdin), release: Some(release), deadline: Some(deadline) }
    }
}

impl Locked {
    /// Ends the lock's transaction and the session: whether it was held
    /// until now (its deadline had not ended it).
    pub fn release(mut self) -> bool {
        self.end()
    }

    fn end(&mut self) -> bool {
        use std::io::Write;
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        let expired = self.deadline.take().is_some_and(|d| d.join().unwrap_or(true));
        if let Some(mut stdin) = self.stdin.take() {
            let _ = writeln!(stdin, "ROLLBACK;");
        }
        let _ = self.psql.wait();
        !expired
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        self.end();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
