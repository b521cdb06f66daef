//! Debian's mosquitto, for the tests against an external broker. It cannot
//! be given port 0 (`listener 0` means a Unix socket) and would not say which
//! port it got, so [`Mosquitto::start`] gives it a port that was free a
//! moment ago ([`free_port`]) and, when another process bound that port first
//! (mosquitto then exits: address in use), starts it again on another port.
//! It counts as started once the kernel lists the port among mosquitto's own
//! listening sockets, so a server of someone else on that port is never taken
//! for it. A restart keeps the port, which the clients know.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::ports::listening_ports;
use crate::{free_port, Proc};

/// What the Tunefleet protocol needs of a broker: no cap on queued QoS 1
/// messages (the default 1000 drops under fan-in), no Nagle, nothing
/// persisted between runs.
pub const FLEET_OPTIONS: &str = "allow_anonymous true\nmax_queued_messages 0\nmax_inflight_messages 0\n\
                                 set_tcp_nodelay true\npersistence false\n";

/// Ports tried before [`Mosquitto::start`] gives up.
const TRIES: usize = 5;

/// A running mosquitto on `127.0.0.1:port`, killed when dropped.
pub struct Mosquitto {
    proc: Option<Proc>,
    pub port: u16,
    conf: PathBuf,
    options: String,
}

/// A start found its port held by another process.
struct PortTaken;

impl Mosquitto {
    /// Starts mosquitto listening on loopback with `options` (mosquitto.conf
    /// lines, applied to that listener), its config written into `dir`;
    /// returns once it listens.
    pub fn start(dir: &Path, options: &str) -> Mosquitto {
        assert!(
            Command::new("mosquitto").arg("-h").output().is_ok(),
            "mosquitto is not installed: apt-get install mosquitto (scripts/test.sh does)"
        );
        let mut m = Mosquitto { proc: None, port: 0, conf: dir.join("mosquitto.conf"), options: options.to_string() };
        for _ in 0..TRIES {
            m.port = free_port();
            match m.launch() {
                Ok(()) => return m,
                Err(PortTaken) => eprintln!("mosquitto: port {} was taken first; trying another", m.port),
            }
        }
        panic!("mosquitto lost its port to another process {TRIES} times running");
    }

    /// `mqtt://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.child.id())
    }

    /// Kills it (SIGKILL) and waits until it is gone: the broker is down.
    pub fn kill(&mut self) {
        let mut p = self.proc.take().expect("mosquitto is running");
        p.signal("KILL");
        p.wait_exit(Duration::from_secs(10));
    }

    /// Starts it again on the same port. The port was free while it was
    /// down: another process may hold it for a while (an outgoing
    /// connection's local port), so this retries for 30 s before failing.
    pub fn restart(&mut self) {
        assert!(self.proc.is_none(), "mosquitto is already running");
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(PortTaken) = self.launch() {
            assert!(
                Instant::now() < deadline,
                "port {} was taken by another process while mosquitto was down",
                self.port
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts mosquitto on `self.port` and waits until it listens there, or
    /// exits because the port is taken.
    fn launch(&mut self) -> Result<(), PortTaken> {
        // Its log on stdout, which Proc reads, to see why it exited.
        let conf = format!("log_dest stdout\nlistener {} 127.0.0.1\n{}", self.port, self.options);
        std::fs::write(&self.conf, conf).expect("write mosquitto.conf");
        let mut c = Command::new("mosquitto");
        c.arg("-c").arg(&self.conf);
        let mut p = Proc::spawn("mosquitto", c);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if listening_ports(p.child.id()).contains(&self.port) {
                self.proc = Some(p);
                return Ok(());
            }
            if let Some(status) = p.child.try_wait().expect("try_wait") {
                let log = p.rest_of_stdout();
                if log.iter().any(|l| l.contains("Address already in use")) {
                    return Err(PortTaken);
                }
                panic!("mosquitto exited with {status} before listening on {}:\n{}", self.port, log.join("\n"));
            }
            assert!(Instant::now() < deadline, "mosquitto did not listen on port {} within 10 s", self.port);
            // Waiting on a condition (its socket exists) that no event announces.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
