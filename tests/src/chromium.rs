//! Debian's `chromium`, headless, for the HTML report: load a page and dump
//! its DOM with the console logged to stderr, or take a screenshot, each
//! under a deadline and with its own profile directory.
//! `scripts/needs.sh chromium` installs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one chromium run printed, and how long it took.
#[derive(Debug)]
pub struct Run {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// The lines of stderr where the page's console said something (an
    /// error, an uncaught exception, a resource that failed to load): with
    /// `--enable-logging=stderr` chromium writes each console message as a
    /// line with `CONSOLE` in it.
    pub fn console_lines(&self) -> Vec<&str> {
        self.stderr.lines().filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught")).collect()
    }
}

/// The chromium binary, or a panic that says how to install it.
pub fn binary() -> PathBuf {
    let ok = Command::new("chromium").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    assert!(
        ok.is_ok_and(|s| s.success()),
        "chromium is missing: `scripts/test.sh --install-only` installs it (scripts/needs.sh chromium), \
         or `apt-get install chromium`"
    );
    PathBuf::from("chromium")
}

/// Runs chromium headless on `url` with `extra` flags, killing it after `timeout`.
fn run_url(page: &str, extra: &[String], timeout: Duration) -> Run {
    let profile = tempfile::tempdir().expect("profile dir");
    let out_dir = tempfile::tempdir().expect("output dir");
    let (out_path, err_path) = (out_dir.path().join("stdout"), out_dir.path().join("stderr"));
    let mut cmd = Command::new(binary());
    // Root (as in CI containers) needs --no-sandbox.
    cmd.args(["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(page)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"));
    let started = Instant::now();
    let mut child = cmd.spawn().expect("starting chromium");
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for chromium") {
            break status;
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {timeout:?} on {page}");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = started.elapsed();
    Run {
        success: status.success(),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        elapsed,
    }
}

/// `file://` and the absolute path of `page`.
fn file_url(page: &Path) -> String {
    let page = std::fs::canonicalize(page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    format!("file://{}", page.display())
}

/// Loads `page` and prints its DOM after the load event, with the console on stderr.
pub fn dump_dom(page: &Path, timeout: Duration) -> Run {
    dump_dom_url(&file_url(page), timeout)
}

/// Loads `url` (a served page) and prints its DOM after the load event.
pub fn dump_dom_url(url: &str, timeout: Duration) -> Run {
    run_url(url, &["--enable-logging=stderr".into(), "--v=0".into(), "--dump-dom".into()], timeout)
}

/// Loads `page` and prints its DOM once its scripts ran `virtual_ms` of
/// virtual time (Chromium's `--virtual-time-budget`: timers fire at once).
pub fn dump_dom_after(page: &Path, virtual_ms: u64, timeout: Duration) -> Run {
    dump_dom_url_after(&file_url(page), virtual_ms, timeout)
}

/// [`dump_dom_after`] of a served page (`url`).
pub fn dump_dom_url_after(url: &str, virtual_ms: u64, timeout: Duration) -> Run {
    let args = [
        "--enable-logging=stderr".to_string(),
        "--v=0".to_string(),
        format!("--virtual-time-budget={virtual_ms}"),
        "--dump-dom".to_string(),
    ];
    run_url(url, &args, timeout)
}

/// Loads `page` in a `width` x `height` window and saves a PNG of it at `png`.
pub fn screenshot(page: &Path, png: &Path, size: (u32, u32), timeout: Duration) -> Run {
    screenshot_url(&file_url(page), png, size, timeout)
}

/// [`screenshot`] once its scripts ran `virtual_ms` of virtual time.
pub fn screenshot_after(page: &Path, png: &Path, size: (u32, u32), virtual_ms: u64, timeout: Duration) -> Run {
    screenshot_url_after(&file_url(page), png, size, virtual_ms, timeout)
}

/// [`screenshot_after`] of a served page (`url`).
pub fn screenshot_url_after(
    url: &str,
    png: &Path,
    (width, height): (u32, u32),
    virtual_ms: u64,
    timeout: Duration,
) -> Run {
    let args = [
        "--enable-logging=stderr".to_string(),
        "--v=0".to_string(),
        "--hide-scrollbars".to_string(),
        format!("--virtual-time-budget={virtual_ms}"),
        format!("--window-size={width},{height}"),
        format!("--screenshot={}", png.display()),
    ];
    run_url(url, &args, timeout)
}

/// Loads `url` in a `width` x `height` window and saves a PNG of it at `png`.
pub fn screenshot_url(url: &str, png: &Path, (width, height): (u32, u32), timeout: Duration) -> Run {
    let args = [
        "--enable-logging=stderr".to_string(),
        "--v=0".to_string(),
        "--hide-scrollbars".to_string(),
        format!("--window-size={width},{height}"),
        format!("--screenshot={}", png.display()),
    ];
    run_url(url, &args, timeout)
}
