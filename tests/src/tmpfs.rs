//! A tmpfs mounted for a test's life (root only: CI runs as root).

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `size` mounted at `dir` for the test's life.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `dir`; `None` (and a SKIPPED line) where it cannot.
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir.to_path_buf())),
            Ok(o) => {
                eprintln!(
                    "SKIPPED: cannot mount a tmpfs (root only; CI runs as root): {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run mount: {e}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
