//! Study files: the TOML description of a tuning study, parsed and validated
//! before anything starts.
//!
//! Every problem is reported with the file name, line and column it refers
//! to (`study.toml:14:7: hyper.lr: low (2) must be below high (1)`). Unknown
//! keys are refused everywhere, so a typo never silently falls back to a
//! default. The parsed [`Study`] keeps the original text in
//! [`Study::source`], so the store can record it and a resumed study can be
//! compared with the one that was started.
//!
//! `model` holds the types, `diff` what differs between two files, `raw` the file as written (serde mirrors with
//! spans), `validate` the check from one to the other, `error` what it
//! reports. Which agents a
//! [`Selector`] admits is a scheduling rule: [`crate::domain::select`].

use std::path::Path;

pub mod constraint;
pub mod diff;
mod error;
mod gpus;
pub mod measured;
pub mod model;
mod raw;
pub mod stored;
mod validate;

pub use constraint::{Bound, Constraint};
pub use error::{Location, StudyError};
pub use gpus::readings_of_given_gpus;
pub use model::*;
pub use stored::{opening, Opening, StoredStudy};
pub use validate::{valid_param_name, valid_study_name};

/// Reads and validates the study file at `path`.
pub fn load(path: &Path) -> Result<Study, StudyError> {
    let text = std::fs::read_to_string(path).map_err(|source| StudyError::Read { path: path.to_path_buf(), source })?;
    parse(&text, &path.display().to_string())
}

/// Parses and validates study text; `origin` names it in error messages.
pub fn parse(text: &str, origin: &str) -> Result<Study, StudyError> {
    let ctx = validate::FileCheck { origin, text };
    let raw: raw::RawStudy = toml::from_str(text).map_err(|e| ctx.toml(&e))?;
    ctx.validate(raw)
}

/// The study named `name` in a file's `text` (the file itself, or one of
/// its `[[group]]` studies): how a study the store kept is read back.
pub fn named(text: &str, origin: &str, name: &str) -> Option<Study> {
    let file = parse(text, origin).ok()?;
    if file.name == name {
        return Some(file);
    }
    file.expand().into_iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests;
