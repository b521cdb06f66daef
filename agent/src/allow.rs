//! `--allow-command`: a second lock for owners who want one. With patterns
//! given, an assignment runs only if its program (`argv[0]`, as the study
//! wrote it) matches one of them (shell-style globs, through the `glob`
//! crate: `tunefleet-*`, `/opt/bench/bin/*`), and its environment names
//! nothing that changes how an allowed program starts or what it loads
//! ([`LOADER_ENV`], [`LOADER_PREFIXES`]) unless the owner allows that name
//! (`--allow-env NAME`); authentication decides who may send work, this
//! decides what work may run.

/// Variables that make a shell, the dynamic loader or an interpreter run
/// or load code the program's path does not name: a shell's start-up file
/// (`BASH_ENV`, `ENV`), where programs and modules are found (`PATH`,
/// `PYTHONPATH`, `PERL5LIB`, `RUBYLIB`, `NODE_PATH`, `CLASSPATH`, ...),
/// options an interpreter reads before the program (`PERL5OPT`, `RUBYOPT`,
/// `NODE_OPTIONS`, `JAVA_TOOL_OPTIONS`, `PYTHONSTARTUP`, `PYTHONWARNINGS`,
/// ...), the shell's word splitting and prompts (`IFS`, `PS4`,
/// `PROMPT_COMMAND`, `SHELLOPTS`), glibc's loaders of modules (`GCONV_PATH`,
/// `GLIBC_TUNABLES`).
pub const LOADER_ENV: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "PATH",
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONINSPECT",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONEXECUTABLE",
    "PERL5LIB",
    "PERLLIB",
    "PERL5OPT",
    "PERL5DB",
    "RUBYLIB",
    "RUBYOPT",
    "NODE_OPTIONS",
    "NODE_PATH",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "TCLLIBPATH",
    "R_PROFILE",
    "R_PROFILE_USER",
    "R_LIBS",
    "R_LIBS_USER",
    "JULIA_LOAD_PATH",
    "JULIA_DEPOT_PATH",
    "OPENSSL_CONF",
    "SSLKEYLOGFILE",
];

/// Prefixes of such variables: the dynamic loader's (`LD_PRELOAD`,
/// `LD_LIBRARY_PATH`, `LD_AUDIT`, ...), bash's exported functions, git's,
/// Lua's module paths, glibc's allocator hooks.
pub const LOADER_PREFIXES: &[&str] = &["LD_", "DYLD_", "BASH_FUNC_", "GIT_", "LUA_", "MALLOC_"];

/// What `--allow-command` and `--allow-env` let run.
#[derive(Debug, Clone, Default)]
pub struct Allow {
    /// Programs that may run (empty: any, and any environment).
    pub commands: Vec<glob::Pattern>,
    /// Names of [`LOADER_ENV`] or [`LOADER_PREFIXES`] the owner allows anyway.
    pub env: Vec<String>,
}

impl Allow {
    /// Checks an assignment's program and environment.
    pub fn check(&self, argv: &[String], env: &[(String, String)]) -> Result<(), String> {
        allowed(&self.commands, argv)?;
        if self.commands.is_empty() {
            return Ok(());
        }
        for (name, _) in env {
            let loader = LOADER_ENV.contains(&name.as_str()) || LOADER_PREFIXES.iter().any(|p| name.starts_with(p));
            if loader && !self.env.iter().any(|n| n == name) {
                return Err(format!(
                    "the study sets {name}, which changes what an allowed program runs or loads: refused by \
                     --allow-command (the agent's owner may allow it with --allow-env {name})"
                ));
            }
        }
        Ok(())
    }
}

/// Checks `argv` against `patterns` (empty: everything is allowed).
pub fn allowed(patterns: &[glob::Pattern], argv: &[String]) -> Result<(), String> {
    if patterns.is_empty() {
        return Ok(());
    }
    let Some(program) = argv.first() else { return Err("an empty command".into()) };
    // Matched by its components: `*` never crosses a `/`, and a path that
    // climbs (`/dir/../../bin/sh`) or names `.` is refused before any
    // pattern, whatever it would match as text.
    if program.split('/').any(|c| c == ".." || c == ".") {
        return Err(format!("{program:?} has a . or .. component: refused by --allow-command"));
    }
    let options =
        glob::MatchOptions { case_sensitive: true, require_literal_separator: true, require_literal_leading_dot: true };
    if patterns.iter().any(|p| p.matches_with(program, options)) {
        Ok(())
    } else {
        Err(format!("{program:?} matches no --allow-command pattern"))
    }
}

/// Parses the `--allow-command` patterns.
pub fn parse(patterns: &[String]) -> Result<Vec<glob::Pattern>, String> {
    patterns.iter().map(|p| glob::Pattern::new(p).map_err(|e| format!("--allow-command {p:?}: {e}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_a_study_cannot_load_code_into_an_allowed_program_through_its_env() {
        let commands = parse(&["/opt/bench/*".into()]).expect("patterns");
        let allow = Allow { commands, env: vec!["PYTHONPATH".into()] };
        let run = vec!["/opt/bench/run.sh".to_string()];
        let env = |name: &str| vec![(name.to_string(), "$(id > /tmp/owned)".to_string())];
        for name in
            ["BASH_ENV", "ENV", "LD_PRELOAD", "LD_AUDIT", "PATH", "JAVA_TOOL_OPTIONS", "NODE_OPTIONS", "PERL5OPT"]
        {
            let e = allow.check(&run, &env(name)).expect_err(name);
            assert!(e.contains(name) && e.contains("--allow-env"), "{e}");
        }
        assert_eq!(allow.check(&run, &env("PYTHONPATH")), Ok(()), "allowed by name");
        assert_eq!(allow.check(&run, &env("DB_HOST")), Ok(()), "an ordinary variable");
        let open = Allow::default();
        assert_eq!(open.check(&run, &env("BASH_ENV")), Ok(()), "no --allow-command: no lock to walk past");
    }

    fn argv(p: &str) -> Vec<String> {
        vec![p.to_string(), "--x".into()]
    }

    #[test]
    fn only_matching_programs_run() {
        assert_eq!(allowed(&[], &argv("anything")), Ok(()));
        let pats = parse(&["tunefleet-*".into(), "/opt/bench/*".into()]).expect("patterns");
        assert_eq!(allowed(&pats, &argv("tunefleet-train")), Ok(()));
        assert_eq!(allowed(&pats, &argv("/opt/bench/run")), Ok(()));
        assert!(allowed(&pats, &argv("sh")).expect_err("refused").contains("\"sh\""));
        assert!(allowed(&pats, &argv("/tmp/tunefleet-train")).is_err(), "a path is matched as written");
        assert!(allowed(&pats, &[]).is_err());
        assert!(parse(&["[".into()]).is_err());
    }

    /// `/dir/*` admitted `/dir/../../../../bin/sh`.
    #[test]
    fn regression_a_pattern_matches_by_components_and_a_path_never_climbs() {
        let pats = parse(&["/opt/bench/*".into(), "tunefleet-*".into()]).expect("patterns");
        for climbing in ["/opt/bench/../../../../bin/sh", "/opt/bench/./run", "/opt/bench/sub/../run"] {
            assert!(allowed(&pats, &argv(climbing)).is_err(), "{climbing}");
        }
        assert!(allowed(&pats, &argv("/opt/bench/sub/run")).is_err(), "* stays within one component");
        assert!(allowed(&pats, &argv("tunefleet-x/../../sh")).is_err());
        assert!(allowed(&pats, &argv("/opt/bench/.hidden")).is_err(), "a leading dot is literal");
        assert_eq!(allowed(&pats, &argv("/opt/bench/run")), Ok(()));
    }
}
