//! A TCP proxy a test controls: it forwards every connection to a target
//! port, and [`Proxy::cut`] ends every connection it carries at once (a
//! network that drops them, a firewall's state table flushed), while new
//! connections go through as before. [`Proxy::partition`] forwards nothing
//! more either way, ends nothing and holds new connections: a network that
//! loses every packet, where no side hears of an end.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A running proxy; it stops listening when dropped (its last connections
/// end with their peers).
#[derive(Debug)]
pub struct Proxy {
    pub port: u16,
    carried: Arc<Mutex<Vec<TcpStream>>>,
    partitioned: Arc<AtomicBool>,
}

/// Copies `from` into `to` until either ends, then ends both; once
/// `partitioned`, reads and drops, and ends nothing.
fn pump(mut from: TcpStream, mut to: TcpStream, partitioned: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) if partitioned.load(Ordering::SeqCst) => {}
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    if !partitioned.load(Ordering::SeqCst) {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
}

impl Proxy {
    /// Forwards connections on a free loopback port to `127.0.0.1:target`.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let carried: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let partitioned: Arc<AtomicBool> = Arc::default();
        let (kept, cut_off) = (Arc::clone(&carried), Arc::clone(&partitioned));
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if cut_off.load(Ordering::SeqCst) {
                    // Held open, never answered.
                    kept.lock().unwrap_or_else(|e| e.into_inner()).push(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) =
                    (client.try_clone(), server.try_clone(), client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                kept.lock().unwrap_or_else(|e| e.into_inner()).extend([c3, s3]);
                let (up, down) = (Arc::clone(&cut_off), Arc::clone(&cut_off));
                std::thread::spawn(move || pump(client, server, &up));
                std::thread::spawn(move || pump(s2, c2, &down));
            }
        });
        Proxy { port, carried, partitioned }
    }

    /// Forwards nothing more and ends nothing: every connection carried,
    /// and every one made from now on, hears nothing back.
    pub fn partition(&self) {
        self.partitioned.store(true, Ordering::SeqCst);
    }

    /// Ends every connection carried now; returns how many there were.
    pub fn cut(&self) -> usize {
        let mut carried = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        for s in carried.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let n = carried.len() / 2;
        carried.clear();
        n
    }
}
