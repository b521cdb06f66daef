//! Blocking work of a trial (its output readers, its memory sampler) on
//! the runtime's pool of blocking threads, reused from one trial to the
//! next: a short trial does not pay for creating and ending three threads.
//! Outside a runtime, a thread of its own.

/// Runs `f` on a blocking thread: one of the current runtime's pool, or a
/// new thread named `name` when there is no runtime.
pub fn run(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            drop(runtime.spawn_blocking(f));
            Ok(())
        }
        Err(_) => std::thread::Builder::new().name(name.into()).stack_size(256 << 10).spawn(f).map(drop),
    }
}
