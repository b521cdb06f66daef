//! The coordinator's configuration file: defaults for any flag, by its long
//! name, for every command that has that flag.
//!
//! Precedence, highest first: a flag on the command line; its environment
//! variable (`TUNEFLEET_STORE`, ... as `--help` shows); the configuration
//! file; the built-in default. The file is the one `--config PATH` names,
//! else `TUNEFLEET_CONFIG`, else `$XDG_CONFIG_HOME/tunefleet/config.toml`
//! (`~/.config/tunefleet/config.toml`) when it exists. It is TOML, one key per
//! flag (`-` or `_` alike), strings, numbers, booleans (for switches) or
//! arrays (for repeated flags):
//!
//! ```toml
//! store = "/var/lib/tunefleet/fleet.db"
//! listen = "0.0.0.0:1883"
//! root = "lab"
//! launcher = "sbatch --wrap 'tunefleet-agent --broker {broker} --name {name}'"
//! launch-max = 8
//! ```
//!
//! A key that is no flag of any command is an error (a typo never goes
//! unnoticed). The file's values become the flags' defaults, so clap's own
//! order (command line, then environment, then default) gives the
//! precedence above; `--help` shows them as defaults.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches};

use crate::cli::Cli;

/// Why the configuration file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("configuration file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error(transparent)]
    Clap(#[from] clap::Error),
}

/// The file named by `--config` in `args`, by `env_config`, or the default
/// one when it exists.
pub fn find(args: &[OsString], env_config: Option<OsString>, config_home: Option<PathBuf>) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    if let Some(p) = env_config.filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    config_home.map(|h| h.join("tunefleet").join("config.toml")).filter(|p| p.exists())
}

/// A TOML value as the flag values clap would take.
fn values(v: &toml::Value) -> Option<Vec<String>> {
    match v {
        toml::Value::String(s) => Some(vec![s.clone()]),
        toml::Value::Integer(i) => Some(vec![i.to_string()]),
        toml::Value::Float(f) => Some(vec![f.to_string()]),
        toml::Value::Boolean(b) => Some(vec![b.to_string()]),
        toml::Value::Array(a) => a.iter().map(|x| values(x).and_then(|v| v.into_iter().next())).collect(),
        _ => None,
    }
}

/// `cmd` and its subcommands with the defaults of `table` applied; the
/// keys used are added to `used`.
fn apply(mut cmd: clap::Command, table: &toml::Table, used: &mut std::collections::BTreeSet<String>) -> clap::Command {
    let ids: Vec<(String, String)> =
        cmd.get_arguments().filter_map(|a| a.get_long().map(|l| (a.get_id().to_string(), l.to_string()))).collect();
    for (id, long) in ids {
        let hit = table.iter().find(|(k, _)| k.replace('_', "-") == long);
        if let Some((key, value)) = hit {
            if let Some(vals) = values(value) {
                used.insert(key.clone());
                cmd = cmd.mut_arg(id, |a| a.default_values(vals));
            }
        }
    }
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for name in subs {
        let sub = cmd.find_subcommand(&name).cloned();
        if let Some(sub) = sub {
            let applied = apply(sub, table, used);
            cmd = cmd.mut_subcommand(name, |_| applied);
        }
    }
    cmd
}

/// Reads the file at `path` (a TOML table of flag defaults).
pub fn read(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    text.parse::<toml::Table>().map_err(|e| ConfigError::Invalid { path: path.into(), message: e.to_string() })
}

/// Parses `args` with the defaults of `table` (from `path`, for messages).
pub fn parse_with(args: Vec<OsString>, table: &toml::Table, path: &Path) -> Result<Cli, ConfigError> {
    let mut used = std::collections::BTreeSet::new();
    let cmd = apply(Cli::command(), table, &mut used);
    if let Some(unknown) = table.keys().find(|k| !used.contains(*k) && k.as_str() != "config") {
        return Err(ConfigError::Invalid {
            path: path.into(),
            message: format!(
                "{unknown:?} is not a flag of any tunefleet command (keys are long flag names, like store or listen)"
            ),
        });
    }
    let matches = cmd.try_get_matches_from(args)?;
    Ok(Cli::from_arg_matches(&matches)?)
}

/// The command line of this process, with the configuration file's defaults.
pub fn parse() -> Result<Cli, ConfigError> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let home = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    match find(&args, std::env::var_os("TUNEFLEET_CONFIG"), home) {
        Some(path) => parse_with(args, &read(&path)?, &path),
        None => Ok(Cli::from_arg_matches(&Cli::command().try_get_matches_from(args)?)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    fn table(text: &str) -> toml::Table {
        text.parse().expect("toml")
    }

    #[test]
    fn the_file_is_found_by_flag_then_environment_then_home() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(find(&args(&["tunefleet", "--config", "a.toml", "studies"]), None, None), Some("a.toml".into()));
        assert_eq!(
            find(&args(&["tunefleet", "studies", "--config=b.toml"]), Some("c".into()), None),
            Some("b.toml".into())
        );
        assert_eq!(find(&args(&["tunefleet", "studies"]), Some("c.toml".into()), None), Some("c.toml".into()));
        assert_eq!(find(&args(&["tunefleet", "studies"]), None, Some(dir.path().into())), None, "no file, no config");
        std::fs::create_dir_all(dir.path().join("tunefleet")).expect("mkdir");
        std::fs::write(dir.path().join("tunefleet/config.toml"), "").expect("write");
        assert_eq!(
            find(&args(&["tunefleet", "studies"]), None, Some(dir.path().into())),
            Some(dir.path().join("tunefleet/config.toml"))
        );
    }

    #[test]
    fn file_values_are_defaults_that_flags_override() {
        let t = table("store = \"from-file.db\"\nlisten = \"0.0.0.0:1999\"\nlaunch_max = 7\n");
        let p = Path::new("c.toml");
        let cli = parse_with(args(&["tunefleet", "studies"]), &t, p).expect("parses");
        let Command::Studies { store, .. } = cli.command else { panic!("studies") };
        assert_eq!(store.store, PathBuf::from("from-file.db"));
        let cli = parse_with(args(&["tunefleet", "studies", "--store", "flag.db"]), &t, p).expect("parses");
        let Command::Studies { store, .. } = cli.command else { panic!("studies") };
        assert_eq!(store.store, PathBuf::from("flag.db"), "a flag beats the file");
        let cli = parse_with(args(&["tunefleet", "run", "s.toml"]), &t, p).expect("parses");
        let Command::Run(run) = cli.command else { panic!("run") };
        assert_eq!(run.broker.listen.to_string(), "0.0.0.0:1999");
        assert_eq!(run.broker.launch.launch_max, 7, "`_` and `-` alike");
    }

    #[test]
    fn unknown_keys_and_bad_values_are_errors() {
        let p = Path::new("c.toml");
        let e = parse_with(args(&["tunefleet", "studies"]), &table("stroe = \"x\""), p).expect_err("a typo");
        assert!(e.to_string().contains("\"stroe\" is not a flag"), "{e}");
        let e = parse_with(args(&["tunefleet", "run", "s.toml"]), &table("listen = \"nowhere\""), p).expect_err("bad");
        assert!(matches!(e, ConfigError::Clap(_)), "{e}");
    }
}
