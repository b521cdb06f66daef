//! `tunefleet store copy FROM TO`: a store moved between backends.

use std::path::Path;

use super::error::CliError;
use crate::store::{Store, TableCopy};

/// Copies store `from` into the empty store `to` and shows what each
/// table holds on both sides; an error when a table's digests differ.
pub fn copy(from: &Path, to: &Path, json: bool) -> Result<(), CliError> {
    if !crate::store::exists(from) {
        return Err(CliError::refused(format!("no store at {}", from.display())));
    }
    let source = Store::open_read_only(from).map_err(CliError::open_store(from))?;
    let mut target = Store::open(to).map_err(CliError::open_store(to))?;
    let copies = crate::store::copy(&source, &mut target)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&copies).map_err(|e| CliError::refused(e.to_string()))?);
    } else {
        for TableCopy { table, rows, digest_from, digest_to } in &copies {
            let same = if digest_from == digest_to { "equal" } else { "DIFFERENT" };
            println!("{table:<20} {rows:>9} rows  {digest_from} {digest_to}  {same}");
        }
    }
    let differ: Vec<&str> = copies.iter().filter(|c| c.digest_from != c.digest_to).map(|c| c.table.as_str()).collect();
    if !differ.is_empty() {
        return Err(CliError::refused(format!("the copy differs from {} in {}", from.display(), differ.join(", "))));
    }
    let rows: u64 = copies.iter().map(|c| c.rows).sum();
    eprintln!("copied {rows} rows in {} tables from {} to {}", copies.len(), from.display(), to.display());
    Ok(())
}
