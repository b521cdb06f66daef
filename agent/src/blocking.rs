//! Short blocking work of a trial that always ends with it (its memory
//! sampler, which stops when the trial's state is dropped) on the
//! runtime's pool of blocking threads, reused from one trial to the next:
//! a short trial does not pay for creating and ending a thread. Outside a
//! runtime, a thread of its own. (The output readers keep threads of their
//! own: a reader stays blocked as long as any process holds its pipe, and
//! a runtime waits for its pool's tasks when it is dropped.)
//!
//! At most [`MAX_IN_POOL`] such tasks hold pool threads at once, so they
//! never take the threads the rest of the agent needs (waiting for a
//! trial's exit, name lookups); past the bound, each gets a thread of its
//! own.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Most tasks of this module on the runtime's pool at once (tokio's pool
/// holds 512 threads).
pub const MAX_IN_POOL: usize = 128;

static IN_POOL: AtomicUsize = AtomicUsize::new(0);

/// Gives its place in the pool back when the task ends (or unwinds).
struct Place;

impl Drop for Place {
    fn drop(&mut self) {
        IN_POOL.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Tasks of this module on the runtime's pool now.
pub fn in_pool() -> usize {
    IN_POOL.load(Ordering::Acquire)
}

/// Runs `f` on a blocking thread: one of the current runtime's pool while
/// fewer than [`MAX_IN_POOL`] are there, else (or without a runtime) a new
/// thread named `name`.
pub fn run(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        if IN_POOL.fetch_add(1, Ordering::AcqRel) < MAX_IN_POOL {
            let place = Place;
            drop(runtime.spawn_blocking(move || {
                let _place = place;
                f();
            }));
            return Ok(());
        }
        IN_POOL.fetch_sub(1, Ordering::AcqRel);
    }
    std::thread::Builder::new().name(name.into()).stack_size(256 << 10).spawn(f).map(drop)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn tasks_stuck_past_the_bound_get_threads_of_their_own() {
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = std::sync::Arc::new(std::sync::Mutex::new(release_rx));
        let (ran_tx, ran_rx) = mpsc::channel();
        // Fill the pool's share with tasks that block until released, then one more.
        for _ in 0..=MAX_IN_POOL {
            let (rx, ran) = (std::sync::Arc::clone(&release_rx), ran_tx.clone());
            run("t", move || {
                ran.send(std::thread::current().name().map(str::to_string)).expect("send");
                let _ = rx.lock().map(|r| r.recv_timeout(Duration::from_secs(30)));
            })
            .expect("started");
        }
        let mut names = Vec::new();
        for _ in 0..=MAX_IN_POOL {
            names.push(ran_rx.recv_timeout(Duration::from_secs(30)).expect("every task runs"));
        }
        assert!(in_pool() <= MAX_IN_POOL);
        // (Other tests of this process may hold places too: then more go to threads of their own.)
        assert!(names.iter().any(|n| n.as_deref() == Some("t")), "past the bound: a thread of its own");
        drop(release_tx);
    }
}
