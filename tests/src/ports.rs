//! Ports of the servers tests start, without picking a port and letting it
//! go for another process to bind. A server that can listen on port 0 is
//! given port 0, and the port the OS chose is read back from the kernel's
//! list of the process's listening sockets ([`listening_ports`]); that list
//! also tells whether a server given a port really holds it. A test that
//! needs a server that is down holds a [`ClosedPort`].

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};

/// The TCP ports on which process `pid` listens: the inodes of its sockets
/// (`/proc/PID/fd`) found among the listening sockets of its network
/// namespace (`/proc/PID/net/tcp` and `tcp6`). Empty when the process is gone
/// or its descriptors cannot be read.
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let inodes: HashSet<u64> = fds
        .flatten()
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.path()).ok()?;
            target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let mut ports: Vec<u16> = ["tcp", "tcp6"]
        .iter()
        .flat_map(|table| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
            text.lines().skip(1).filter_map(listening_row).collect::<Vec<_>>()
        })
        .filter(|(_, inode)| inodes.contains(inode))
        .map(|(port, _)| port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// `(local port, inode)` of a `/proc/net/tcp` row in state LISTEN (`0A`):
/// `sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...`,
/// addresses as `HEXIP:HEXPORT`.
fn listening_row(line: &str) -> Option<(u16, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(3) != Some(&"0A") {
        return None;
    }
    let port = u16::from_str_radix(fields.get(1)?.rsplit_once(':')?.1, 16).ok()?;
    let inode = fields.get(9)?.parse().ok()?;
    Some((port, inode))
}

/// A loopback port where nothing listens, so connections are refused, and
/// that no other process can bind while this lives: a socket bound to it
/// that never listens (and without `SO_REUSEADDR`, so binding it again is
/// refused too). For tests of a client whose server is down.
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).expect("bind a loopback port");
        let port = socket.local_addr().expect("bound address").port();
        ClosedPort { _socket: socket, port }
    }
}

impl Default for ClosedPort {
    fn default() -> Self {
        ClosedPort::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn reads_listening_rows_and_skips_the_rest() {
        let listen =
            "   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1";
        assert_eq!(listening_row(listen), Some((8080, 4242)));
        let established = "   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000 0 0 4243 1";
        assert_eq!(listening_row(established), None);
        assert_eq!(listening_row("  sl  local_address rem_address   st tx_queue rx_queue"), None);
    }

    #[test]
    fn finds_the_port_of_a_listener_of_this_process() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(listening_ports(std::process::id()).contains(&port));
        assert_eq!(listening_ports(u32::MAX), Vec::<u16>::new(), "no such process");
    }

    #[test]
    fn a_closed_port_refuses_connections_and_cannot_be_bound() {
        let closed = ClosedPort::new();
        let refused = TcpStream::connect(("127.0.0.1", closed.port)).expect_err("nothing listens");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
        TcpListener::bind(("127.0.0.1", closed.port)).expect_err("the port is held");
    }
}
