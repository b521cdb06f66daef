//! A study after its runs: its file's text handed back as it was kept
//! ([`StoredStudy`]: the domain reads it), renamed (what ran stays readable under its
//! new name, and the old name is free for a fixed file) and deleted.

use super::sql::{params, Conn, Optional};

use super::{Batch, Result, SqlContext, Store, StoreError};
use crate::domain::study::{self, StoredStudy};

/// The name a renamed study has inside the file the store kept (a study
/// never renamed has no row: its name is its file's).
pub(super) const STUDY_NAMES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS study_names (
    name    TEXT PRIMARY KEY NOT NULL,
    in_file TEXT NOT NULL
);
";

/// Every table that holds a study's rows, and the column naming it.
const BY_STUDY: [(&str, &str); 11] = [
    ("trials", "study"),
    ("segments", "study"),
    ("attempts", "study"),
    ("results", "study"),
    ("progress", "study"),
    ("study_changes", "study"),
    ("node_measurements", "study"),
    ("profiles", "study"),
    ("reuse_decisions", "study"),
    ("study_ids", "name"),
    ("studies", "name"),
];

/// Why a study cannot be renamed or deleted.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    #[error("no study {0:?} in the store")]
    Unknown(String),
    #[error("study {0:?} exists already: choose another name")]
    Taken(String),
    #[error("{0:?} is not a study name: 1 to 64 of a-z, 0-9, '_' and '-'")]
    BadName(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Store {
    /// The study `name` as the store kept it: its file's text, under the
    /// name it has in the store now (read back by the caller:
    /// [`StoredStudy::study`]). `None` for an unknown study.
    pub fn stored(&self, name: &str) -> Result<Option<StoredStudy>> {
        stored_in(&self.conn, name)
    }
}

impl Batch<'_> {
    /// [`Store::stored`] inside the batch.
    pub fn stored(&self, name: &str) -> Result<Option<StoredStudy>> {
        stored_in(&self.tx, name)
    }
}

/// A study's text and its name in that text, in one statement (a study
/// never renamed has no row in `study_names`: its name is its file's).
fn stored_in(conn: &Conn, name: &str) -> Result<Option<StoredStudy>> {
    let context = || format!("reading study {name:?}'s file");
    conn.prepare_cached(
        "SELECT s.config, COALESCE(n.in_file, s.name) FROM studies s
         LEFT JOIN study_names n ON n.name = s.name WHERE s.name = ?1",
    )
    .ctx(context)?
    .query_row(params![name], |r| Ok(StoredStudy { name: name.to_string(), text: r.get(0)?, in_file: r.get(1)? }))
    .optional()
    .ctx(context)
}

/// The name `name`'s study has in its stored file.
fn in_file_name(conn: &Conn, name: &str) -> Result<String> {
    let context = || format!("reading the file name of study {name:?}");
    let found: Option<String> = conn
        .prepare_cached("SELECT in_file FROM study_names WHERE name = ?1")
        .ctx(context)?
        .query_row(params![name], |r| r.get(0))
        .optional()
        .ctx(context)?;
    Ok(found.unwrap_or_else(|| name.to_string()))
}

impl Batch<'_> {
    /// Renames study `old` to `new` in every table: its trials, results
    /// and measurements stay, under the new name; `old` is free again.
    pub fn rename_study(&mut self, old: &str, new: &str) -> std::result::Result<(), LifecycleError> {
        if !study::valid_study_name(new) {
            return Err(LifecycleError::BadName(new.to_string()));
        }
        if !self.study_exists(old)? {
            return Err(LifecycleError::Unknown(old.to_string()));
        }
        if self.study_exists(new)? {
            return Err(LifecycleError::Taken(new.to_string()));
        }
        let in_file = in_file_name(&self.tx, old)?;
        let context = || format!("renaming study {old:?} to {new:?}");
        for (table, column) in BY_STUDY {
            self.tx
                .write(&format!("UPDATE {table} SET {column} = ?2 WHERE {column} = ?1"), params![old, new])
                .ctx(context)?;
        }
        self.tx.write("DELETE FROM study_names WHERE name = ?1", params![old]).ctx(context)?;
        self.tx.write("INSERT INTO study_names (name, in_file) VALUES (?1, ?2)", params![new, in_file]).ctx(context)?;
        Ok(())
    }

    /// Deletes study `name` and everything stored of it; the trials it had.
    pub fn delete_study(&mut self, name: &str) -> std::result::Result<u64, LifecycleError> {
        if !self.study_exists(name)? {
            return Err(LifecycleError::Unknown(name.to_string()));
        }
        let context = || format!("deleting study {name:?}");
        let trials: i64 = self
            .tx
            .query_row("SELECT COUNT(*) FROM trials WHERE study = ?1", params![name], |r| r.get(0))
            .ctx(context)?;
        for (table, column) in BY_STUDY {
            self.tx.write(&format!("DELETE FROM {table} WHERE {column} = ?1"), params![name]).ctx(context)?;
        }
        self.tx.write("DELETE FROM study_names WHERE name = ?1", params![name]).ctx(context)?;
        Ok(u64::try_from(trials).unwrap_or(0))
    }

    fn study_exists(&self, name: &str) -> Result<bool> {
        let context = || format!("looking for study {name:?}");
        self.tx
            .query_row("SELECT COUNT(*) FROM studies WHERE name = ?1", params![name], |r| r.get::<_, i64>(0))
            .map(|n| n > 0)
            .ctx(context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn study_text(name: &str, timeout: u32) -> String {
        format!(
            "name = \"{name}\"\ncommand = [\"true\"]\ntimeout = {timeout}\n[objective]\nmetric = \"v\"\n\
             direction = \"maximize\"\n[budget]\ntrials = 2\n[strategy]\nkind = \"grid\"\n\
             [hyper.x]\nkind = \"int\"\nlow = 1\nhigh = 2\n"
        )
    }

    fn tables_naming(store: &Store, name: &str) -> Vec<&'static str> {
        BY_STUDY
            .iter()
            .filter(|(table, column)| {
                let sql = format!("SELECT COUNT(*) FROM {table} WHERE {column} = ?1");
                store.conn.query_row(&sql, params![name], |r| r.get::<_, i64>(0)).expect("count") > 0
            })
            .map(|(t, _)| *t)
            .collect()
    }

    #[test]
    fn a_renamed_study_keeps_its_rows_and_frees_its_name() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut store = Store::open(&dir.path().join("s.db")).expect("store");
        let s = study::parse(&study_text("fit", 60), "fit.toml").expect("study");
        let plan = crate::domain::search::plan(&s);
        {
            let mut b = store.batch().expect("batch");
            b.open_study(&s, &plan, &study::Opening::Create).expect("created");
            b.study_id("fit", 7).expect("id");
            b.commit().expect("commit");
        }
        let before = tables_naming(&store, "fit");
        assert!(before.contains(&"trials") && before.contains(&"studies") && before.contains(&"study_ids"));
        {
            let mut b = store.batch().expect("batch");
            assert!(matches!(b.rename_study("fit", "Fit!"), Err(LifecycleError::BadName(_))));
            assert!(matches!(b.rename_study("nope", "fit-1"), Err(LifecycleError::Unknown(_))));
            b.rename_study("fit", "fit-1").expect("renamed");
            b.commit().expect("commit");
        }
        assert!(tables_naming(&store, "fit").is_empty(), "nothing is left under the old name");
        assert_eq!(tables_naming(&store, "fit-1"), before, "every row moved");
        let back = store.stored("fit-1").expect("read").and_then(|s| s.study()).expect("parsed under its new name");
        assert_eq!((back.name.as_str(), back.timeout_s), ("fit-1", 60));
        // The old name takes a fixed file from the start.
        let fixed = study::parse(&study_text("fit", 120), "fit.toml").expect("study");
        let mut b = store.batch().expect("batch");
        // The old name is free: nothing is stored under it.
        let opening = study::opening(b.stored("fit").expect("read").as_ref(), &fixed);
        assert_eq!(b.open_study(&fixed, &plan, &opening).expect("created"), super::super::StudyOpened::Created);
        assert!(matches!(b.rename_study("fit", "fit-1"), Err(LifecycleError::Taken(_))));
        b.commit().expect("commit");
        let mut b = store.batch().expect("batch");
        assert_eq!(b.delete_study("fit-1").expect("deleted"), 2);
        b.commit().expect("commit");
        assert!(tables_naming(&store, "fit-1").is_empty(), "deleted everywhere");
        assert!(store.stored("fit-1").expect("read").is_none());
        assert_eq!(store.trials("fit").expect("trials").len(), 2, "the other study is untouched");
    }
}
