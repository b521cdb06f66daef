//! A study as the store keeps it: its file's text, which only this layer
//! reads back ([`StoredStudy::study`]), and what opening a study over it
//! does ([`opening`]): the store keeps text and never parses it.

use super::{diff, named, Study};

/// A study as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredStudy {
    /// Its name in the store now.
    pub name: String,
    /// The text of the file it was created (or last continued) from.
    pub text: String,
    /// Its name inside that file (a renamed study's old name; a
    /// `[[group]]` study's own).
    pub in_file: String,
}

impl StoredStudy {
    /// The study read back from its text, under its name in the store;
    /// `None` for a file this program no longer reads.
    pub fn study(&self) -> Option<Study> {
        let origin = format!("study {:?} in the store", self.name);
        named(&self.text, &origin, &self.in_file).map(|mut s| {
            s.name.clone_from(&self.name);
            s
        })
    }
}

/// What opening a study over the one the store holds under its name does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opening {
    /// None is stored: a new study.
    Create,
    /// The same study (the same text, or texts that read as the same
    /// study): its rows are kept as they are.
    Resume,
    /// A change that lets the study go on ([`diff::continues`]): the store
    /// keeps the new file and records each change (`key: old -> new`).
    Continue { changes: Vec<String> },
    /// A change that would make what ran and what runs next two studies:
    /// refused, with the values that differ.
    Refuse { keys: String },
}

/// What opening `new` does over `stored` (the study of its name in the
/// store, if any).
pub fn opening(stored: Option<&StoredStudy>, new: &Study) -> Opening {
    let Some(stored) = stored else { return Opening::Create };
    if stored.text == new.source {
        return Opening::Resume;
    }
    // The stored file read back once: the keys that differ, with their values.
    let Some(old) = named(&stored.text, &new.origin, &stored.in_file) else {
        return Opening::Refuse { keys: "the whole file (the stored one no longer reads)".to_string() };
    };
    let keys = old.differences(new);
    if keys.is_empty() {
        return Opening::Resume;
    }
    let changes = diff::value_differences(&stored.text, &new.source, &keys);
    // How trials are run and given out, or a larger budget: the study goes
    // on (as Optuna's `optimize` does with more trials).
    match diff::continues(&old, new) {
        true => Opening::Continue { changes },
        false => Opening::Refuse { keys: changes.join("; ") },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(budget: u32, seed: u32) -> String {
        format!(
            "name = \"s\"\ncommand = [\"true\"]\n[objective]\nmetric = \"wall_time\"\ndirection = \"minimize\"\n\
             [strategy]\nkind = \"random\"\nseed = {seed}\n[budget]\ntrials = {budget}\n\
             [hyper.x]\nkind = \"float\"\nlow = 0.0\nhigh = 1.0\n"
        )
    }

    fn stored(text: &str) -> StoredStudy {
        StoredStudy { name: "s".into(), text: text.into(), in_file: "s".into() }
    }

    #[test]
    fn a_study_opens_as_created_resumed_continued_or_refused() {
        let first = super::super::parse(&text(10, 1), "s.toml").expect("study");
        assert_eq!(opening(None, &first), Opening::Create);
        assert_eq!(opening(Some(&stored(&text(10, 1))), &first), Opening::Resume);
        // The same study written differently reads as the same.
        assert_eq!(opening(Some(&stored(&format!("# a comment\n{}", text(10, 1)))), &first), Opening::Resume);
        let bigger = super::super::parse(&text(20, 1), "s.toml").expect("study");
        match opening(Some(&stored(&text(10, 1))), &bigger) {
            Opening::Continue { changes } => assert_eq!(changes, ["budget.trials: 10 -> 20"]),
            other => panic!("a larger budget continues: {other:?}"),
        }
        let reseeded = super::super::parse(&text(10, 2), "s.toml").expect("study");
        match opening(Some(&stored(&text(10, 1))), &reseeded) {
            Opening::Refuse { keys } => assert!(keys.contains("strategy.seed: 1 -> 2"), "{keys}"),
            other => panic!("another seed is another study: {other:?}"),
        }
        let unreadable = opening(Some(&stored("not = [a study")), &first);
        assert!(
            matches!(unreadable, Opening::Refuse { ref keys } if keys.contains("no longer reads")),
            "{unreadable:?}"
        );
    }

    #[test]
    fn a_stored_study_reads_back_under_its_name_in_the_store() {
        let renamed = StoredStudy { name: "s-1".into(), text: text(10, 1), in_file: "s".into() };
        assert_eq!(renamed.study().expect("reads").name, "s-1");
        assert!(StoredStudy { in_file: "other".into(), ..renamed.clone() }.study().is_none());
        assert!(StoredStudy { text: "x = [".into(), ..renamed }.study().is_none());
    }
}
