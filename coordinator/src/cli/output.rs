//! How commands write what they print: to stdout, quietly ending when the
//! reader went away (`| head`); as JSON for `--json`; again every second for
//! `--watch`. And the store a reading command opens, which must exist.

use std::path::Path;
use std::time::Duration;

use super::error::{CliError, Result};
use crate::store::Store;

/// Writes a command's output to stdout; a reader that went away (`| head`) ends it quietly.
pub fn emit(text: &str) -> Result<()> {
    emit_bytes(text.as_bytes())
}

/// [`emit`] for bytes (a completion script, a man page).
pub fn emit_bytes(bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// [`emit`] of `value` as JSON (`--json`): pretty, ending with a newline.
pub fn emit_json(value: &impl serde::Serialize) -> Result<()> {
    emit(&format!("{}\n", serde_json::to_string_pretty(value)?))
}

/// The store at `path`, read-only; an error when there is none.
pub fn open_existing(path: &Path) -> Result<Store> {
    if !crate::store::exists(path) {
        return Err(CliError::refused(format!("no store at {} (give --store PATH)", path.display())));
    }
    Ok(Store::open_read_only(path)?)
}

/// Shows `next()` now and every second until `shutdown`: redrawn on a
/// terminal, printed again when it changed otherwise (CI, systemd).
pub async fn watch_text(
    mut next: impl FnMut() -> Result<String>,
    json: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    use std::io::IsTerminal as _;
    let terminal = std::io::stdout().is_terminal() && !json;
    tokio::pin!(shutdown);
    let mut shown = String::new();
    loop {
        let text = next()?;
        if terminal {
            emit(&format!("\x1b[2J\x1b[H{text}"))?;
        } else if text != shown {
            emit(&text)?;
        }
        shown = text;
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
