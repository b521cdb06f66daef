//! Commands that read results from the store: `status`, `studies`, `best`,
//! `profiles`, `report` and `export`. Each asks its module for data
//! ([`crate::query::status`], [`crate::query::best`], [`crate::query::profiles`]) and prints it
//! as text ([`super::view`]) or JSON.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::args::{Format, ProfilesAction, StudiesAction};
use super::error::{CliError, Result};
use super::output::{emit, emit_json, open_existing, unix_now_ms, watch_text};
use super::view;
use crate::query::export::{export as export_study, ExportFormat};
use crate::query::status::StudyStatus;
use crate::store::{LifecycleError, Store};

/// `tunefleet status`: once, or every second until `shutdown` (redrawn on
/// a terminal, a line per change otherwise).
pub async fn status(
    path: &Path,
    study: Option<&str>,
    watch: bool,
    json: bool,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let look = || -> Result<Vec<StudyStatus>> {
        let rows = crate::query::status::snapshot(&open_existing(path)?, study, unix_now_ms())?;
        if rows.is_empty() {
            if let Some(s) = study {
                return Err(CliError::refused(format!("no study {s:?} in {}", path.display())));
            }
        }
        Ok(rows)
    };
    let show = move |rows: &[StudyStatus]| -> Result<String> {
        Ok(if json { format!("{}\n", serde_json::to_string(rows)?) } else { view::status(rows) })
    };
    if !watch {
        return emit(&show(&look()?)?);
    }
    // Each look after the first gets the pace over the looks of the last
    // half minute (a steady figure, not the last second's).
    let started = Instant::now();
    let mut pacer = crate::query::status::Pacer::default();
    let next = move || -> Result<String> {
        let mut now = look()?;
        pacer.look(started.elapsed().as_secs_f64(), &mut now);
        show(&now)
    };
    watch_text(next, json, shutdown).await
}

/// `tunefleet studies`: the studies in the store.
pub fn studies(path: &Path, action: Option<StudiesAction>, json: bool) -> Result<()> {
    let Some(action) = action else { return list_studies(path, json) };
    if !crate::store::exists(path) {
        return Err(CliError::refused(format!("no store at {} (give --store PATH)", path.display())));
    }
    let study = match &action {
        StudiesAction::Rename { old, .. } => old,
        StudiesAction::Delete { study } => study,
    };
    // A coordinator running the study holds it in memory: it would write
    // under the old name again. Every running coordinator holds the store's
    // running lock, however long it has been stalled; asked first, as one
    // stalled inside a write would keep the store itself locked.
    let lock = crate::store::RunLock::alone(path).map_err(CliError::file("locking the store", path))?;
    if lock.is_none() {
        return Err(CliError::refused(format!(
            "a coordinator is running on {} (it holds the store's running lock): stop it (Ctrl-C, or `tunefleet \
             cancel {study}` for the service) first",
            path.display()
        )));
    }
    let mut store = Store::open(path).map_err(CliError::open_store(path))?;
    let running = crate::query::status::snapshot(&store, Some(study), unix_now_ms())?;
    if running.iter().any(|s| s.coordinator_running && s.state == "running") {
        return Err(CliError::refused(format!(
            "study {study:?} is running on a coordinator of this store: stop it (Ctrl-C, or `tunefleet cancel \
             {study}` for the service) first"
        )));
    }
    let mut batch = store.batch()?;
    let text = match &action {
        StudiesAction::Rename { old, new } => {
            batch.rename_study(old, new).map_err(lifecycle_error)?;
            format!("study {old} is now {new}; {old} is free for a new study file\n")
        }
        StudiesAction::Delete { study } => {
            let trials = batch.delete_study(study).map_err(lifecycle_error)?;
            format!("study {study} deleted ({trials} trials and everything stored of them)\n")
        }
    };
    batch.commit()?;
    emit(&text)
}

fn lifecycle_error(e: LifecycleError) -> CliError {
    match e {
        LifecycleError::Store(e) => e.into(),
        e => CliError::refused(e.to_string()),
    }
}

fn list_studies(path: &Path, json: bool) -> Result<()> {
    let store = open_existing(path)?;
    if json {
        return emit_json(&store.studies()?);
    }
    let mut out = String::new();
    for st in store.studies()? {
        writeln!(out, "{:<24} {:<9} {}/{} done, {} failed", st.name, st.state, st.done, st.total, st.failed)?;
    }
    emit(&out)
}

/// `tunefleet best`: the view `ask` of `study`.
pub fn best(path: &Path, study: &str, n: usize, ask: crate::query::best::BestAsk, json: bool) -> Result<()> {
    let store = open_existing(path)?;
    let found = crate::query::best::view(&store, study, n, ask)?;
    if json {
        emit_json(&found)
    } else {
        emit(&view::best(&found)?)
    }
}

/// `tunefleet profiles [decisions|classify|forget]`.
pub fn profiles(path: &Path, action: Option<ProfilesAction>, json: bool) -> Result<()> {
    let text = match action {
        None => {
            let store = open_existing(path)?;
            let views = crate::query::profiles::classes(&store)?;
            if json {
                serde_json::to_string_pretty(&views)?
            } else {
                view::classes(&views)
            }
        }
        Some(ProfilesAction::Decisions { study }) => {
            let rows = open_existing(path)?.decisions(study.as_deref())?;
            if json {
                serde_json::to_string_pretty(&rows)?
            } else {
                view::decisions(&rows)
            }
        }
        Some(ProfilesAction::Classify { study, trial }) => {
            let c = crate::query::profiles::classify(&open_existing(path)?, &study, trial)?;
            if json {
                serde_json::to_string_pretty(&c)?
            } else {
                view::classified(&c)
            }
        }
        Some(ProfilesAction::Forget { agent }) => {
            if !crate::store::exists(path) {
                return Err(CliError::refused(format!("no store at {} (give --store PATH)", path.display())));
            }
            let mut store = Store::open(path).map_err(CliError::open_store(path))?;
            let forgotten = crate::query::profiles::forget(&mut store, &agent, unix_now_ms())?;
            if json {
                serde_json::to_string_pretty(&forgotten)?
            } else {
                view::forgotten(&agent, &forgotten)
            }
        }
    };
    emit(&text)?;
    if json {
        emit("\n")?;
    }
    Ok(())
}

/// `tunefleet report`: the HTML report of `study` into `output`.
pub fn report(path: &Path, study: &str, output: &Path, n: usize) -> Result<()> {
    let store = open_existing(path)?;
    let options = crate::report::Options { best: n, ..crate::report::Options::default() };
    let bytes = crate::report::write(&store, study, options, output)?;
    // Scripts and tests read this line.
    println!("report: {} ({bytes} bytes)", output.display());
    Ok(())
}

/// `tunefleet export`: every trial of `study`, to `output` or stdout.
pub fn export(path: &Path, study: &str, format: Format, output: Option<PathBuf>) -> Result<()> {
    let store = open_existing(path)?;
    let write = |out: &mut dyn std::io::Write| -> Result<()> {
        let mut out = out;
        match format {
            Format::Csv => export_study(&store, study, ExportFormat::Csv, &mut out)?,
            Format::Json => export_study(&store, study, ExportFormat::Json, &mut out)?,
            Format::Optuna => crate::query::optuna::export(&store, study, &mut out)?,
        }
        Ok(())
    };
    match output {
        Some(path) => {
            // An export holds the studies' env (secrets, often): its owner's alone.
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)
                .map_err(CliError::file("creating", &path))?;
            write(&mut f)
        }
        None => write(&mut std::io::stdout().lock()),
    }
}
