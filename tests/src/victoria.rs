//! A VictoriaMetrics server for tests and benchmarks: Debian's
//! `victoria-metrics` on a loopback port the OS chose for it (see `ports`),
//! with its own storage directory. It takes the influxdb2 client's
//! `/api/v2/write` (ignoring org, bucket and token) and gives samples back
//! through `/api/v1/export` at once (its query API lags by seconds).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ports::listening_ports;
use crate::{wait_for, Proc};

/// A VictoriaMetrics server, stopped (killed) when dropped.
pub struct Victoria {
    proc: Option<Proc>,
    pub port: u16,
    data: PathBuf,
}

impl Victoria {
    /// Starts a server storing into `data` on a port the OS chooses for it
    /// (it is given port 0; its log says `:0`, the kernel says the port);
    /// waits until it answers.
    pub fn start(data: &Path) -> Victoria {
        let mut v = Victoria { proc: None, port: 0, data: data.to_path_buf() };
        let p = v.launch().unwrap_or_else(|status| panic!("victoria-metrics exited with {status} on port 0"));
        let ports = listening_ports(p.child.id());
        v.port = match ports[..] {
            [port] => port,
            _ => panic!("victoria-metrics listens on {ports:?}: expected its one HTTP port"),
        };
        v.proc = Some(p);
        v.wait_healthy();
        v
    }

    /// Starts the stopped server again on the same port (its clients know
    /// it) and storage. The port was free while it was stopped: another
    /// process may hold it for a while (an outgoing connection's local
    /// port), so this retries for 30 s before failing.
    pub fn restart(&mut self) {
        assert!(self.proc.is_none(), "already running");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.launch() {
                Ok(p) => {
                    self.proc = Some(p);
                    break;
                }
                // It logs why on stderr (the test's output); a taken port is the one reason to retry,
                // and the deadline ends a retry for another one.
                Err(status) => assert!(
                    Instant::now() < deadline,
                    "victoria-metrics kept exiting ({status}) on port {}: taken by another process while \
                     it was stopped?",
                    self.port
                ),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.wait_healthy();
    }

    /// Starts victoria-metrics on `self.port` (0: the OS chooses) and waits
    /// until it listens, or returns how it exited (a taken port ends it).
    fn launch(&self) -> Result<Proc, std::process::ExitStatus> {
        if Command::new("victoria-metrics").arg("-version").output().is_err() {
            panic!("victoria-metrics is not installed: apt-get install victoria-metrics (scripts/test.sh does)");
        }
        let mut cmd = Command::new("victoria-metrics");
        cmd.arg(format!("-storageDataPath={}", self.data.display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{}", self.port))
            .arg("-loggerLevel=ERROR");
        let mut p = Proc::spawn("victoria-metrics", cmd);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ports = listening_ports(p.child.id());
            if !ports.is_empty() && (self.port == 0 || ports.contains(&self.port)) {
                return Ok(p);
            }
            if let Some(status) = p.child.try_wait().expect("try_wait") {
                return Err(status);
            }
            assert!(Instant::now() < deadline, "victoria-metrics did not listen within 20 s");
            // Waiting on a condition (its socket exists) that no event announces.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_healthy(&self) {
        let port = self.port;
        wait_for("victoria-metrics to answer /health", Duration::from_secs(20), || {
            http_get(port, "/health").is_some_and(|(status, _)| status == 200)
        });
    }

    /// A clean stop (SIGTERM), so what it took is on disk for the restart.
    pub fn stop(&mut self) {
        let mut p = self.proc.take().expect("running");
        p.signal("TERM");
        let status = p.wait_exit(Duration::from_secs(30));
        assert!(status.success(), "victoria-metrics stopped with {status}");
    }

    /// The base URL for the influxdb2 client.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every tunefleet sample the server holds.
    pub fn export(&self) -> Vec<Series> {
        let query = "/api/v1/export?match%5B%5D=%7B__name__%3D~%22tunefleet_.%2A%22%7D";
        let (status, body) = http_get(self.port, query).expect("export answers");
        assert_eq!(status, 200, "export: {body}");
        body.lines().filter(|l| !l.trim().is_empty()).map(Series::parse).collect()
    }
}

/// A plain HTTP/1.0 GET on loopback: (status, body), or None when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

/// One exported series: its labels (the metric name under `__name__`) and samples.
#[derive(Debug)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub values: Vec<f64>,
    pub timestamps: Vec<i64>,
}

impl Series {
    pub fn parse(line: &str) -> Series {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let labels = v["metric"]
            .as_object()
            .expect("metric")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        let values = v["values"].as_array().expect("values").iter().map(|x| x.as_f64().expect("number")).collect();
        let timestamps =
            v["timestamps"].as_array().expect("timestamps").iter().map(|x| x.as_i64().expect("ts")).collect();
        Series { labels, values, timestamps }
    }

    pub fn name(&self) -> &str {
        self.labels.get("__name__").map_or("", String::as_str)
    }

    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map_or("", String::as_str)
    }
}
