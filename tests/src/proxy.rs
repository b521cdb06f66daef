//! A TCP proxy a test controls: it forwards every connection to a target
//! port, and [`Proxy::cut`] ends every connection it carries at once (a
//! network that drops them, a firewall's state table flushed), while new
//! connections go through as before.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// A running proxy; it stops listening when dropped (its last connections
/// end with their peers).
#[derive(Debug)]
pub struct Proxy {
    pub port: u16,
    carried: Arc<Mutex<Vec<TcpStream>>>,
}

/// Copies `from` into `to` until either ends, then ends both.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

impl Proxy {
    /// Forwards connections on a free loopback port to `127.0.0.1:target`.
    pub fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let carried: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let kept = Arc::clone(&carried);
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else { continue };
                let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) =
                    (client.try_clone(), server.try_clone(), client.try_clone(), server.try_clone())
                else {
                    continue;
                };
                kept.lock().unwrap_or_else(|e| e.into_inner()).extend([c3, s3]);
                std::thread::spawn(move || pump(client, server));
                std::thread::spawn(move || pump(s2, c2));
            }
        });
        Proxy { port, carried }
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
