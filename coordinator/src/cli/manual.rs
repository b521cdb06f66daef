//! Shell completion scripts and man pages, generated from the clap
//! definitions the programs parse (clap_complete, clap_mangen), so they
//! cannot drift from the flags: `tunefleet completions SHELL` and
//! `tunefleet man [-o DIR]`, and with `--agent` the same for
//! `tunefleet-agent`, whose definition is `tunefleet_common::agent_cli`.
//! The agent carries no generator of its own: both crates would add about
//! 116 KiB (5 %) to the small static agent (BENCHMARKS.md, "Agent footprint").
//! Each function takes the program's `clap::Command`; [`crate::cli`] says
//! which program's.

use std::path::{Path, PathBuf};

pub use clap_complete::Shell;

/// Why man pages were not written.
#[derive(Debug, thiserror::Error)]
pub enum ManualError {
    #[error("cannot create {path}: {source}")]
    Create { path: PathBuf, source: std::io::Error },
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// The completion script of the program `cmd` defines, for `shell`.
pub fn completions(mut cmd: clap::Command, shell: Shell) -> Vec<u8> {
    let name = cmd.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, name.as_str(), &mut script);
    if shell == Shell::Bash {
        return fix_hyphenated_bash(&name, &String::from_utf8_lossy(&script)).into_bytes();
    }
    script
}

/// clap_complete's bash script for a program with a hyphen in its name
/// (`tunefleet-agent`) completes nothing after a subcommand: its dispatch
/// names the state `tunefleet__agent__subcmd__measure` and the matching arm
/// `tunefleet__subcmd__agent__subcmd__measure` (clap-rs/clap#6421, open in
/// clap_complete 4.6.11). Spells the arms as the dispatch does; a no-op once
/// clap_complete does it itself.
fn fix_hyphenated_bash(name: &str, script: &str) -> String {
    const SEP: &str = "__subcmd__";
    let wrong = format!("{}{SEP}", name.replace('-', SEP));
    let right = format!("{}{SEP}", name.replace('-', "__"));
    script.replace(&wrong, &right)
}

/// The program's command, ready for its pages: built (each subcommand knows
/// its full name, `tunefleet-agents-trust`), without the `help` subcommand.
fn for_pages(cmd: clap::Command) -> clap::Command {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The main man page of the program `cmd` defines (roff, section 1).
pub fn page(cmd: clap::Command) -> Vec<u8> {
    let mut roff = Vec::new();
    // Rendering into memory: the only error would be the writer's.
    let _ = clap_mangen::Man::new(for_pages(cmd)).render(&mut roff);
    roff
}

/// Writes the main man page of the program `cmd` defines and one page per
/// subcommand, nested ones included (`tunefleet.1`, `tunefleet-run.1`,
/// `tunefleet-agents-trust.1`), into `dir`, created when missing; returns the
/// files, main page first.
pub fn write_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, ManualError> {
    std::fs::create_dir_all(dir).map_err(|source| ManualError::Create { path: dir.to_path_buf(), source })?;
    let mut written = Vec::new();
    write_tree(&for_pages(cmd), dir, &mut written)?;
    Ok(written)
}

/// Writes the page of `cmd`, then those of its subcommands.
fn write_tree(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<(), ManualError> {
    let man = clap_mangen::Man::new(cmd.clone());
    let path = dir.join(man.get_filename());
    let mut roff = Vec::new();
    let rendered = man.render(&mut roff).and_then(|()| std::fs::write(&path, roff));
    rendered.map_err(|source| ManualError::Write { path: path.clone(), source })?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// A program with a nested subcommand, as `tunefleet agents trust`.
    fn fleet() -> clap::Command {
        clap::Command::new("fleet")
            .about("Fleet: a test program")
            .subcommand(clap::Command::new("run").about("Runs"))
            .subcommand(clap::Command::new("agents").about("Agents").subcommand(clap::Command::new("trust")))
    }

    #[test]
    fn a_page_per_subcommand_with_its_full_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write_pages(fleet(), dir.path()).expect("writes");
        let names: Vec<String> =
            files.iter().filter_map(|f| f.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        assert_eq!(names[0], "fleet.1");
        for name in ["fleet-run.1", "fleet-agents.1", "fleet-agents-trust.1"] {
            assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "no page for the help subcommand: {names:?}");
        let agent = write_pages(tunefleet_common::agent_cli::Cli::command(), dir.path()).expect("writes");
        let main = std::fs::read_to_string(&agent[0]).expect("reads");
        assert!(main.contains(".TH tunefleet-agent 1"), "{main}");
        assert!(main.contains("\\fBTUNEFLEET_BROKER\\fR environment variable"), "environment variables shown: {main}");
    }

    #[test]
    fn completions_name_the_program() {
        let agent = tunefleet_common::agent_cli::Cli::command();
        let bash = String::from_utf8(completions(agent, Shell::Bash)).expect("utf-8");
        assert!(bash.contains("complete -F _tunefleet__agent -o nosort -o bashdefault -o default tunefleet-agent"));
        let zsh = String::from_utf8(completions(fleet(), Shell::Zsh)).expect("utf-8");
        assert!(zsh.starts_with("#compdef fleet"), "{zsh}");
    }
}
