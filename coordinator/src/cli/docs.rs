//! `tunefleet completions` and `tunefleet man`: the program's clap
//! definition ([`Cli`], or the agent's) handed to [`crate::cli::manual`].

use std::path::PathBuf;

use clap::CommandFactory;

use super::args::Cli;
use super::error::Result;
use super::output::emit_bytes;
use crate::cli::manual::{self, Shell};

/// Whose command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// `tunefleet`.
    Coordinator,
    /// `tunefleet-agent`.
    Agent,
}

impl Program {
    /// The program's clap command, as its `main` parses it.
    pub fn command(self) -> clap::Command {
        match self {
            Program::Coordinator => Cli::command(),
            Program::Agent => tunefleet_common::agent_cli::Cli::command(),
        }
    }

    /// `tunefleet` or, with `--agent`, `tunefleet-agent`.
    fn of(agent: bool) -> Self {
        if agent {
            Program::Agent
        } else {
            Program::Coordinator
        }
    }
}

/// `tunefleet completions SHELL [--agent]`.
pub fn completions(shell: Shell, agent: bool) -> Result<()> {
    emit_bytes(&manual::completions(Program::of(agent).command(), shell))
}

/// `tunefleet man [-o DIR] [--agent]`: the main page, or every page into DIR.
pub fn man(output: Option<PathBuf>, agent: bool) -> Result<()> {
    let cmd = Program::of(agent).command();
    match output {
        None => emit_bytes(&manual::page(cmd)),
        Some(dir) => {
            for path in manual::write_pages(cmd, &dir)? {
                println!("{}", path.display());
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_subcommand_of_tunefleet() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = manual::write_pages(Program::Coordinator.command(), dir.path()).expect("writes");
        let names: Vec<String> =
            files.iter().filter_map(|f| f.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        assert_eq!(names[0], "tunefleet.1");
        for name in ["tunefleet-run.1", "tunefleet-agents.1", "tunefleet-agents-trust.1", "tunefleet-man.1"] {
            assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
        }
        let zsh = String::from_utf8(manual::completions(Program::Coordinator.command(), Shell::Zsh)).expect("utf-8");
        assert!(zsh.starts_with("#compdef tunefleet"), "{zsh}");
    }
}
