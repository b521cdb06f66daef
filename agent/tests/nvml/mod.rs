//! The stand-in NVML of the GPU tests (`standin.c` beside this file),
//! shared by the agent's tests and the whole-path ones (tests/tests/gpus.rs
//! includes this file by path).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the stand-in as `dir/libnvidia-ml.so.1` (each test its own copy:
/// its fixture, `dir/libnvidia-ml.so.1.fixture`, sits beside it).
pub fn standin(dir: &Path) -> PathBuf {
    let src = dir.join("nvml-standin.c");
    std::fs::write(&src, include_str!("standin.c")).expect("the stand-in's source");
    let lib = dir.join("libnvidia-ml.so.1");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc runs (a C compiler is part of the Rust toolchain's needs)");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

/// Writes the fixture the stand-in at `lib` reads at every call.
pub fn fixture(lib: &Path, text: &str) {
    let mut path = lib.as_os_str().to_owned();
    path.push(".fixture");
    std::fs::write(path, text).expect("fixture");
}
