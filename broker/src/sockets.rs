//! This process's own sockets, as `/proc/self/fd` lists them: how the
//! rumqttd engine finds the listener it bound, and how the tests find the
//! sockets the broker accepted.

use std::net::SocketAddr;

use rustix::net::{SocketAddrAny, SocketAddrV4, SocketAddrV6};

/// `(fd number, socket inode)` for every socket this process holds.
pub(crate) fn socket_fds() -> Vec<(i32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    dir.flatten()
        .filter_map(|entry| {
            let fd: i32 = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            let ino = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()?;
            Some((fd, ino))
        })
        .collect()
}

pub(crate) fn to_std(addr: &SocketAddrAny) -> Option<SocketAddr> {
    if let Ok(v4) = SocketAddrV4::try_from(addr.clone()) {
        return Some(SocketAddr::V4(v4));
    }
    SocketAddrV6::try_from(addr.clone()).ok().map(SocketAddr::V6)
}
