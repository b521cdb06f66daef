//! Why a study file was refused, and where in it: [`StudyError`] with the
//! [`Location`] (line and column) of the value at fault.

use std::path::PathBuf;

/// Where in the study file a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

impl Location {
    /// The line and column of byte offset `offset` in `text`.
    pub fn of_offset(text: &str, offset: usize) -> Self {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location { line: before.matches('\n').count() + 1, column: before[line_start..].chars().count() + 1 }
    }
}

fn fmt_location(location: &Option<Location>) -> String {
    match location {
        Some(l) => format!(":{}:{}", l.line, l.column),
        None => String::new(),
    }
}

/// Why a study file was refused.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    #[error("{}: cannot read study file", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}{}: {message}", fmt_location(location))]
    Invalid { origin: String, location: Option<Location>, message: String },
}

impl StudyError {
    /// Where the problem is, when it is about a place in the file.
    pub fn location(&self) -> Option<Location> {
        match self {
            StudyError::Read { .. } => None,
            StudyError::Invalid { location, .. } => *location,
        }
    }
}
