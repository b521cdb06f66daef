//! A VictoriaMetrics server for tests and benchmarks: Debian's
//! `victoria-metrics` on a loopback port, with its own storage directory. It
//! takes the influxdb2 client's `/api/v2/write` (ignoring org, bucket and
//! token) and gives samples back through `/api/v1/export` at once (its query
//! API lags by seconds).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{wait_for, Proc};

/// A VictoriaMetrics server, stopped (killed) when dropped.
pub struct Victoria {
    proc: Option<Proc>,
    pub port: u16,
    data: PathBuf,
}

impl Victoria {
    /// Starts a server on `port` storing into `data`; waits until it answers.
    pub fn start(data: &Path, port: u16) -> Victoria {
        let mut v = Victoria { proc: None, port, data: data.to_path_buf() };
        v.restart();
        v
    }

    /// Starts the stopped server again on the same port and storage.
    pub fn restart(&mut self) {
        assert!(self.proc.is_none(), "already running");
        if Command::new("victoria-metrics").arg("-version").output().is_err() {
            panic!("victoria-metrics is not installed: apt-get install victoria-metrics (scripts/test.sh does)");
        }
        let mut cmd = Command::new("victoria-metrics");
        cmd.arg(format!("-storageDataPath={}", self.data.display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{}", self.port))
            .arg("-loggerLevel=ERROR");
        self.proc = Some(Proc::spawn("victoria-metrics", cmd));
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
