//! Why a command failed: every error a command meets, wrapped as it came
//! (its message and its sources unchanged), or a refusal in words. `main`
//! prints the whole chain and exits with [`CliError::exit_code`]: 2 for a
//! usage error ([`CliError::is_usage`]: a bad study file or name), 3, 4 or
//! 130 for a run that ended with failures, with nothing succeeded, or
//! interrupted ([`CliError::Ended`]), 1 otherwise.

use std::path::PathBuf;

use tunefleet_common::auth::{AuthError, KeyFileError};
use tunefleet_common::security::SecurityError;
use tunefleet_common::topic::TopicError;

use crate::cli::manual::ManualError;
use crate::domain::campaign::CampaignError;
use crate::domain::study::StudyError;
use crate::query::best::BestError;
use crate::query::profiles::ProfilesError;
use crate::report::ReportError;
use crate::runtime::broker::BrokerError;
use crate::runtime::control::ControlError;
use crate::runtime::run::RunError;
use crate::store::StoreError;

/// Why a `tunefleet` command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad study file (a usage error).
    #[error(transparent)]
    Study(#[from] StudyError),
    /// A bad topic root or agent name (a usage error).
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error(transparent)]
    Campaign(#[from] CampaignError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A study could not be exported.
    #[error(transparent)]
    Export(#[from] crate::query::export::ExportError),
    /// The store at `path` could not be opened (`what`: "opening the store").
    #[error("{what} {}", crate::store::shown(path))]
    OpenStore { what: &'static str, path: PathBuf, source: Box<StoreError> },
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    Security(#[from] SecurityError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Best(#[from] BestError),
    #[error(transparent)]
    Profiles(#[from] ProfilesError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Manual(#[from] ManualError),
    #[error(transparent)]
    KeyFile(#[from] KeyFileError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// Writing the output or JSON of a command.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Format(#[from] std::fmt::Error),
    /// A file or program a command needs, with what it was doing.
    #[error("{what} {}", path.display())]
    File { what: &'static str, path: PathBuf, source: std::io::Error },
    /// Something the demo needed from the system, with what it was doing.
    #[error("{what}")]
    System { what: &'static str, source: std::io::Error },
    #[error(transparent)]
    Path(#[from] std::env::JoinPathsError),
    #[error(transparent)]
    BrokerUrl(#[from] tunefleet_common::broker_url::BrokerUrlError),
    /// A refusal: a flag's value, an answer of the service, something missing.
    #[error("{0}")]
    Refused(String),
    /// How a run ended when it did not end with every trial a success: the
    /// exit code ([`EXIT_FAILURES`], [`EXIT_NOTHING_SUCCEEDED`],
    /// [`EXIT_NOTHING_RANKED`], [`EXIT_NOTHING_FEASIBLE`],
    /// [`EXIT_INTERRUPTED`]) and what to tell the user.
    #[error("{message}")]
    Ended { code: u8, message: String },
}

/// `run` and `campaign`: every trial final, some failed.
pub const EXIT_FAILURES: u8 = 3;
/// `run` and `campaign`: a study ended without one successful trial.
pub const EXIT_NOTHING_SUCCEEDED: u8 = 4;
/// `run` and `campaign`: trials succeeded, but none reported the study's
/// objective metric: nothing could be ranked.
pub const EXIT_NOTHING_RANKED: u8 = 5;
/// `run` and `campaign`: trials were ranked, but none meets the study's
/// `[[constraint]]`s: the best is the one that misses them least.
pub const EXIT_NOTHING_FEASIBLE: u8 = 6;
/// `serve` on a server's store: another coordinator took the lease over
/// (this one stalled or lost the server), or it could not renew the lease
/// for a whole term; it wrote nothing after the takeover. Started again
/// (systemd does), it waits as a standby.
pub use crate::runtime::failover::EXIT_STEPPED_DOWN;
/// `run` and `campaign`: stopped (Ctrl-C, SIGTERM) before every trial was
/// final; the same command resumes.
pub const EXIT_INTERRUPTED: u8 = 130;

impl CliError {
    /// True for an error in what the user gave (exit code 2).
    pub fn is_usage(&self) -> bool {
        use crate::runtime::engine::EngineError;
        use crate::runtime::run::RunError;
        // A study file that changed under a name the store has is a bad file too.
        let mismatch = |e: &StoreError| matches!(e, StoreError::ConfigMismatch { .. });
        match self {
            CliError::Study(_) | CliError::Topic(_) => true,
            CliError::Store(e) => mismatch(e),
            CliError::Run(RunError::Engine(EngineError::Store(e))) => mismatch(e),
            _ => false,
        }
    }

    /// The process's exit code for this error: 2 for a usage error, the
    /// code of how a run ended ([`CliError::Ended`]), [`EXIT_STEPPED_DOWN`]
    /// for a lost lease, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        use crate::runtime::engine::EngineError;
        use crate::runtime::run::RunError;
        match self {
            CliError::Ended { code, .. } => *code,
            e if e.is_usage() => 2,
            CliError::Run(RunError::SteppedDown(_))
            | CliError::Run(RunError::Engine(EngineError::Store(StoreError::SteppedDown { .. }))) => EXIT_STEPPED_DOWN,
            _ => 1,
        }
    }

    /// A refusal with `message`.
    pub fn refused(message: impl Into<String>) -> Self {
        CliError::Refused(message.into())
    }

    /// An error opening the store at `path`.
    pub fn open_store(path: &std::path::Path) -> impl FnOnce(StoreError) -> Self + '_ {
        move |source| CliError::OpenStore {
            what: "opening the store",
            path: path.to_path_buf(),
            source: Box::new(source),
        }
    }

    /// An I/O error of `what` on `path` (`reading`, `creating`...).
    pub fn file<'a>(what: &'static str, path: &'a std::path::Path) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| CliError::File { what, path: path.to_path_buf(), source }
    }
}

/// What a command returns.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
