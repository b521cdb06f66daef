//! `--allow-command`: a second lock for owners who want one. With patterns
//! given, an assignment runs only if its program (`argv[0]`, as the study
//! wrote it) matches one of them (shell-style globs, through the `glob`
//! crate: `tunefleet-*`, `/opt/bench/bin/*`); authentication decides who
//! may send work, this decides what work may run.

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

    /// Issue 35, finding 6: `/dir/*` admitted `/dir/../../../../bin/sh`.
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
