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
            // `man` looks for section 1 pages in a man1 folder under each
            // MANPATH entry: the pages go there unless DIR is one already.
            let section = dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("man") && n.len() > 3);
            let dir = if section { dir } else { dir.join("man1") };
            for path in manual::write_pages(cmd, &dir)? {
                println!("{}", path.display());
            }
            if let Some(hint) = manpath_hint(&dir, std::env::var("MANPATH").ok().as_deref()) {
                eprintln!("{hint}");
            }
            Ok(())
        }
    }
}

/// How to make `man` find pages written into `dir` (a `man1` folder; its
/// parent goes on `MANPATH`), unless `manpath` (the variable) has it already.
fn manpath_hint(dir: &std::path::Path, manpath: Option<&str>) -> Option<String> {
    let base = match dir.file_name().and_then(|n| n.to_str()) {
        Some(n) if n.starts_with("man") && n.len() > 3 => dir.parent().unwrap_or(dir),
        _ => dir,
    };
    let base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    let listed = manpath.unwrap_or_default().split(':').any(|p| std::path::Path::new(p) == base);
    (!listed).then(|| {
        format!(
            "note: for `man tunefleet-run` and the others to find these pages, put {} on MANPATH: \
             export MANPATH=\"{}:$MANPATH\" (a trailing ':' keeps the system's pages)",
            base.display(),
            base.display(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manpath_hint_names_the_folder_above_man1_unless_it_is_listed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let man1 = dir.path().join("man1");
        std::fs::create_dir_all(&man1).expect("mkdir");
        let base = std::fs::canonicalize(dir.path()).expect("canonical");
        let hint = manpath_hint(&man1, None).expect("a hint");
        assert!(hint.contains(&format!("export MANPATH=\"{}:$MANPATH\"", base.display())), "{hint}");
        let listed = format!("/usr/share/man:{}", base.display());
        assert_eq!(manpath_hint(&man1, Some(&listed)), None);
    }

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
