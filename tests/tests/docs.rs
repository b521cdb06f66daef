//! The documentation, run with the real programs.
//!
//! * Every ```sh block of docs/QUICKSTART.md, docs/TROUBLESHOOTING.md,
//!   docs/STUDY.md, README.md and docs/DEPLOY.md is split into simple
//!   commands. Each `tunefleet` and `tunefleet-agent` command line must be
//!   accepted by the program's own parser: it is run with the same arguments
//!   and `--help` (before a `--`), which prints the help unless a subcommand,
//!   flag or value is unknown (exit status 2). Every repository path a
//!   command names must exist, and every example study or campaign it names
//!   must load. In the three guides any other program must be one this file
//!   knows ([`KNOWN_PROGRAMS`]), so a misspelt program fails too.
//! * Inline `tunefleet ...` spans in README.md and docs/*.md: each flag they
//!   name exists on the (sub)command they name.
//! * docs/QUICKSTART.md, sections 2, 3, 5 and 6, run as written in a scratch
//!   directory ([`QuickStart`]): commands that keep running (a coordinator, an
//!   agent, `status --watch`) start in the background, as in another
//!   terminal; the coordinator's broker gets a port the OS chooses, and the
//!   agents' `mqtt://127.0.0.1:1883` (where the documented coordinator
//!   listens) becomes that address; the section ends with Ctrl-C (SIGINT) to
//!   what still runs. Every command must succeed, every line of the
//!   section's ```text blocks must match what the programs printed (numbers
//!   may differ), and every agent's spool must be empty.
//! * docs/STUDY.md: every ```toml example passes `tunefleet check` (a
//!   campaign, `campaign::parse`); an example whose first line starts with
//!   `# invalid` is refused with exactly the ```text block after it. Every
//!   key the parser accepts (asked by giving it an unknown one) is
//!   documented and used in a valid example, and every key the reference
//!   tables name is one the parser accepts.
//! * docs/TROUBLESHOOTING.md: every message its ```text blocks quote is
//!   provoked for real, section by section (`…` stands for any text).
//! * Every relative link in README.md, BENCHMARKS.md and docs/*.md leads to
//!   a file, and to a heading of it when it names one.
//!
//! Not run, only parsed: QUICKSTART.md sections 1 (packages, toolchain,
//! clone, build: cargo built these binaries) and 4 (a second machine), and
//! the fixes in TROUBLESHOOTING.md that need root, systemd or another machine.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunefleet_tests::ports::ClosedPort;
use tunefleet_tests::*;

const QUICKSTART: &str = "docs/QUICKSTART.md";
const TROUBLESHOOTING: &str = "docs/TROUBLESHOOTING.md";
const STUDY: &str = "docs/STUDY.md";

/// Programs the guides may name besides Tunefleet's and the repository's scripts.
const KNOWN_PROGRAMS: &[&str] = &[
    "apt-get", "curl", "sh", ".", "git", "cd", "cargo", "export", "echo", "chmod", "grep", "cut", "scp", "ss", "rm",
    "find", "groupadd", "usermod", "python3", "pip",
];

/// Top-level study keys that are not tables (no keys of their own to ask about).
const SCALAR_KEYS: [&str; 10] =
    ["name", "command", "env", "resume", "resume_prefix", "timeout", "repeats", "max_attempts", "lookahead", "gpus"];

const LONG: Duration = Duration::from_secs(120);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

fn doc(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

// ---------------------------------------------------------------------------
// Markdown.

/// A fenced block: its language, text, first line (1-based) and `## ` section.
#[derive(Debug, Clone)]
struct Block {
    lang: String,
    text: String,
    line: usize,
    section: String,
}

fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut section = String::new();
    let mut open: Option<Block> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some(b), None) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, Some(lang)) => {
                open =
                    Some(Block { lang: lang.trim().into(), text: String::new(), line: i + 1, section: section.clone() })
            }
            (None, None) => {
                if let Some(h) = line.strip_prefix("## ") {
                    section = h.trim().to_string();
                }
            }
        }
    }
    out
}

fn blocks_of(markdown: &str, lang: &str) -> Vec<Block> {
    blocks(markdown).into_iter().filter(|b| b.lang == lang).collect()
}

/// Inline code spans outside fenced blocks, with their line.
fn inline_spans(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    // Spans may run over a line break: join each paragraph.
    let mut para = String::new();
    let mut para_line = 0;
    for (i, line) in markdown.lines().chain(std::iter::once("")).enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if line.trim().is_empty() {
            for (k, span) in para.split('`').enumerate() {
                if k % 2 == 1 {
                    out.push((para_line, span.split_whitespace().collect::<Vec<_>>().join(" ")));
                }
            }
            para.clear();
            continue;
        }
        if para.is_empty() {
            para_line = i + 1;
        }
        para.push_str(line);
        para.push(' ');
    }
    out
}

// ---------------------------------------------------------------------------
// Shell.

/// One simple command of a ```sh block: its words, quotes removed, with
/// comments, redirections and `$(...)` kept out of the way.
#[derive(Debug, Clone)]
struct ShellCommand {
    words: Vec<String>,
    line: usize,
}

#[derive(Default)]
struct Lexer {
    commands: Vec<ShellCommand>,
    words: Vec<String>,
    word: Option<String>,
    /// The next word is a redirection's target.
    redirect: bool,
    line: usize,
    first: usize,
}

impl Lexer {
    /// Starts a word (an empty one for `''`).
    fn start(&mut self) -> &mut String {
        if self.word.is_none() && self.words.is_empty() {
            self.first = self.line;
        }
        self.word.get_or_insert_with(String::new)
    }

    fn push(&mut self, c: char) {
        self.start().push(c);
    }

    fn end_word(&mut self) {
        if let Some(w) = self.word.take() {
            if !std::mem::take(&mut self.redirect) {
                self.words.push(w);
            }
        }
    }

    fn end_command(&mut self) {
        self.end_word();
        if !self.words.is_empty() {
            self.commands.push(ShellCommand { words: std::mem::take(&mut self.words), line: self.first });
        }
    }
}

fn shell_commands(block: &Block) -> Vec<ShellCommand> {
    let chars: Vec<char> = block.text.chars().collect();
    let mut lx = Lexer { line: block.line + 1, ..Lexer::default() };
    let mut i = 0;
    let at = |k: usize| chars.get(k).copied();
    while let Some(c) = at(i) {
        i += 1;
        match c {
            '\\' if at(i) == Some('\n') => {
                i += 1;
                lx.line += 1;
            }
            '\\' => {
                lx.push(at(i).unwrap_or('\\'));
                i += 1;
            }
            '\'' => {
                lx.start();
                while let Some(q) = at(i).filter(|q| *q != '\'') {
                    lx.push(q);
                    i += 1;
                }
                i += 1;
            }
            '"' => {
                lx.start();
                while let Some(q) = at(i).filter(|q| *q != '"') {
                    i += 1;
                    match (q, at(i)) {
                        ('\\', Some(e @ ('"' | '\\' | '$'))) => {
                            lx.push(e);
                            i += 1;
                        }
                        _ => lx.push(q),
                    }
                }
                i += 1;
            }
            '$' if at(i) == Some('(') => {
                lx.push('$');
                let mut depth = 0;
                while let Some(q) = at(i) {
                    lx.push(q);
                    i += 1;
                    depth += match q {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        break;
                    }
                }
            }
            '#' if lx.word.is_none() => {
                while at(i).is_some_and(|q| q != '\n') {
                    i += 1;
                }
            }
            ' ' | '\t' => lx.end_word(),
            '\n' => {
                lx.end_command();
                lx.line += 1;
            }
            ';' | '&' | '|' | '(' | ')' => {
                lx.end_command();
                if matches!((c, at(i)), ('&', Some('&')) | ('|', Some('|'))) {
                    i += 1;
                }
            }
            '>' | '<' => {
                // A file descriptor before it (`2>`) is part of the redirection.
                if lx.word.as_deref().is_some_and(|w| w.chars().all(|d| d.is_ascii_digit())) {
                    lx.word = None;
                }
                lx.end_word();
                if at(i) == Some('>') {
                    i += 1;
                }
                if at(i) == Some('&') {
                    while at(i).is_some_and(|q| q == '&' || q == '-' || q.is_ascii_digit()) {
                        i += 1;
                    }
                } else {
                    lx.redirect = true;
                }
            }
            c => lx.push(c),
        }
    }
    lx.end_command();
    lx.commands
}

/// The words from the program on: without `sudo`, `nohup`, `VAR=value`
/// assignments, shell keywords, or an emulator in front of the program.
fn from_program(words: &[String]) -> &[String] {
    let mut w = words;
    while let Some(first) = w.first() {
        let assignment = first
            .split_once('=')
            .is_some_and(|(k, _)| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        let wrapper = ["sudo", "nohup", "exec", "do", "then", "else"].contains(&first.as_str())
            || first.starts_with("qemu-")
            || assignment;
        if !wrapper {
            break;
        }
        w = &w[1..];
    }
    w
}

/// `tunefleet` or `tunefleet-agent` when `word` names one (a path or not).
fn tunefleet_program(word: &str) -> Option<&'static str> {
    match word.rsplit('/').next() {
        Some("tunefleet") => Some("tunefleet"),
        Some("tunefleet-agent") => Some("tunefleet-agent"),
        _ => None,
    }
}

/// The value of `flag` (`--flag VALUE` or `--flag=VALUE`).
fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if a == flag {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix(flag).and_then(|v| v.strip_prefix('='))
        }
    })
}

/// The first argument that is not a flag: the subcommand, when there is one.
fn subcommand(args: &[String]) -> Option<&str> {
    args.first().map(String::as_str).filter(|a| !a.starts_with('-'))
}

/// Runs `program ARGS --help`: `Err` with clap's complaint when the parser refuses.
fn parser_accepts(program: &str, args: &[String]) -> Result<(), String> {
    let mut args = args.to_vec();
    let before = args.iter().position(|a| a == "--").unwrap_or(args.len());
    args.insert(before, "--help".into());
    let mut cmd = tf(program, &repo(), &[]);
    cmd.args(&args);
    let (code, _, err) = run(cmd);
    if code == Some(0) {
        Ok(())
    } else {
        Err(err.lines().next().unwrap_or("").to_string())
    }
}

/// Checks the commands of the ```sh blocks of `path`; problems are added to `problems`.
fn check_shell_blocks(path: &str, strict: bool, problems: &mut Vec<String>) -> usize {
    let mut checked = 0;
    for block in blocks_of(&doc(path), "sh") {
        for cmd in shell_commands(&block) {
            let words = from_program(&cmd.words);
            let Some(first) = words.first() else { continue };
            let place = format!("{path}:{}: `{}`", cmd.line, cmd.words.join(" "));
            for w in words.iter().filter(|w| names_repository_path(w)) {
                if !repo().join(w).exists() {
                    problems.push(format!("{place}: {w} is not in the repository"));
                }
            }
            match tunefleet_program(first) {
                Some(program) => {
                    checked += 1;
                    if let Err(e) = parser_accepts(program, &words[1..]) {
                        problems.push(format!("{place}: {e}"));
                    }
                    if let Err(e) = example_loads(program, &words[1..]) {
                        problems.push(format!("{place}: {e}"));
                    }
                }
                None if !strict => {}
                None if KNOWN_PROGRAMS.contains(&first.as_str()) => {}
                None if first.contains('/') && repo().join(first).is_file() => {}
                None => problems.push(format!("{place}: unknown program {first}")),
            }
        }
    }
    checked
}

fn names_repository_path(word: &str) -> bool {
    ["examples/", "scripts/", "systemd/", "cross/", "docs/"].iter().any(|d| word.starts_with(d))
        && !word.contains(['$', '*', '%'])
}

/// A study or campaign of the repository that a command runs must load.
fn example_loads(program: &str, args: &[String]) -> Result<(), String> {
    let (Some(sub), Some(file)) = (subcommand(args), args.get(1)) else { return Ok(()) };
    if program != "tunefleet" || !names_repository_path(file) {
        return Ok(());
    }
    let path = repo().join(file);
    match sub {
        "check" | "run" | "submit" => {
            let (code, _, err) = run(tf("tunefleet", &repo(), &["check", &path.display().to_string()]));
            if code == Some(0) {
                Ok(())
            } else {
                Err(err)
            }
        }
        "campaign" => tunefleet_coordinator::domain::campaign::load(&path).map(|_| ()).map_err(|e| e.to_string()),
        _ => Ok(()),
    }
}

#[test]
fn every_command_line_in_the_docs_is_accepted_by_the_real_programs() {
    let mut problems = Vec::new();
    for path in [QUICKSTART, TROUBLESHOOTING, STUDY] {
        let n = check_shell_blocks(path, true, &mut problems);
        assert!(n >= 2, "{path}: only {n} tunefleet commands found: is the block parser broken?");
    }
    for path in ["README.md", "docs/DEPLOY.md"] {
        check_shell_blocks(path, false, &mut problems);
    }
    assert!(problems.is_empty(), "commands the programs refuse:\n{}", problems.join("\n"));
}

#[test]
fn the_shell_splitter_sees_what_a_shell_would() {
    let block = Block {
        lang: "sh".into(),
        text: "sudo A=1 tunefleet run x.toml --listen 0.0.0.0:1883 \\\n  --store 'a b.db' 2>&1 | tee log # note\n\
               echo \"k:$(openssl rand -hex 16)\" > users && target/release/tunefleet-agent --name n &\n"
            .into(),
        line: 10,
        section: String::new(),
    };
    let cmds = shell_commands(&block);
    let words: Vec<Vec<String>> = cmds.iter().map(|c| from_program(&c.words).to_vec()).collect();
    assert_eq!(words[0], ["tunefleet", "run", "x.toml", "--listen", "0.0.0.0:1883", "--store", "a b.db"]);
    assert_eq!(words[1], ["tee", "log"]);
    assert_eq!(words[2], ["echo", "k:$(openssl rand -hex 16)"]);
    assert_eq!(words[3], ["target/release/tunefleet-agent", "--name", "n"]);
    assert_eq!(cmds.iter().map(|c| c.line).collect::<Vec<_>>(), [11, 12, 13, 13]);
    assert_eq!(tunefleet_program(&words[3][0]), Some("tunefleet-agent"));
    assert!(parser_accepts("tunefleet", &words[0][1..]).is_ok());
    let refused = parser_accepts("tunefleet", &["run".into(), "x.toml".into(), "--lisen".into(), "a".into()]);
    assert!(refused.is_err_and(|e| e.contains("--lisen")));
}

// ---------------------------------------------------------------------------
// Flags named in inline code.

/// Helps of (sub)commands, asked once each.
#[derive(Default)]
struct Helps(HashMap<Vec<String>, Option<String>>);

impl Helps {
    /// `program path... --help`, when it succeeds.
    fn get(&mut self, path: &[String]) -> Option<String> {
        self.0
            .entry(path.to_vec())
            .or_insert_with(|| {
                let mut c = Command::new(bin(&path[0]));
                c.args(&path[1..]).arg("--help");
                let (code, out, _) = run(c);
                (code == Some(0)).then_some(out)
            })
            .clone()
    }

    /// The longest run of subcommands `words` starts with, from the program.
    fn command_path(&mut self, program: &str, words: &[&str]) -> Vec<String> {
        let mut path = vec![program.to_string()];
        for w in words {
            if !w.chars().all(|c| c.is_ascii_lowercase() || c == '-') || w.starts_with('-') {
                break;
            }
            let mut next = path.clone();
            next.push(w.to_string());
            let usage = format!("Usage: {}", next.join(" "));
            if !self.get(&next).is_some_and(|h| h.lines().any(|l| l.starts_with(&usage))) {
                break;
            }
            path = next;
        }
        path
    }
}

/// `--flag` and `-f` words of a span, without brackets, values and punctuation.
fn flags_in(words: &[&str]) -> Vec<String> {
    words
        .iter()
        .filter_map(|w| {
            let w = w.trim_start_matches(['[', '(']);
            let (dashes, rest) =
                if let Some(r) = w.strip_prefix("--") { ("--", r) } else { ("-", w.strip_prefix('-')?) };
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            let short_ok = dashes == "--" || (name.len() == 1 && name.chars().all(|c| c.is_ascii_alphabetic()));
            (!name.is_empty() && short_ok).then(|| format!("{dashes}{name}"))
        })
        .collect()
}

fn help_has_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let after = help[i + flag.len()..].chars().next();
        let before = help[..i].chars().next_back();
        !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            && !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

#[test]
fn every_flag_named_in_inline_code_exists() {
    let mut files = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut helps = Helps::default();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for (line, span) in inline_spans(&text) {
            let words: Vec<&str> = span.split_whitespace().collect();
            let Some(program) = words.first().and_then(|w| tunefleet_program(w)).filter(|_| words.len() > 1) else {
                continue;
            };
            let path = helps.command_path(program, &words[1..]);
            let help = helps.get(&path).unwrap_or_default();
            for flag in flags_in(&words[1..]) {
                checked += 1;
                if !help_has_flag(&help, &flag) {
                    problems.push(format!("{}:{line}: `{span}`: {} has no {flag}", file.display(), path.join(" ")));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} flags found in inline code");
    assert!(problems.is_empty(), "flags the programs do not have:\n{}", problems.join("\n"));
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, blanks as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in markdown.lines() {
        fenced ^= line.trim_start().starts_with("```");
        if let Some(h) = line.strip_prefix('#').filter(|_| !fenced) {
            out.insert(slug(h.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_link_between_the_docs_leads_somewhere() {
    let mut files = vec![repo().join("README.md"), repo().join("BENCHMARKS.md")];
    files.extend(
        std::fs::read_dir(repo().join("docs"))
            .expect("docs/")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        for (i, line) in text.lines().enumerate() {
            for link in line.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
                if link.contains("://") || link.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
                let target = if path.is_empty() { file.clone() } else { file.parent().expect("dir").join(path) };
                let place = format!("{}:{}: ({link})", file.display(), i + 1);
                match std::fs::read_to_string(&target) {
                    Err(_) if !target.exists() => problems.push(format!("{place}: no such file")),
                    Ok(t) if !anchor.is_empty() && !anchors(&t).contains(anchor) => {
                        problems.push(format!("{place}: no such heading"))
                    }
                    _ => {}
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} links found");
    assert!(problems.is_empty(), "links leading nowhere:\n{}", problems.join("\n"));
    assert_eq!(
        slug(" The agent cannot read RAPL (energy is `estimated`)"),
        "the-agent-cannot-read-rapl-energy-is-estimated"
    );
}

// ---------------------------------------------------------------------------
// Output compared with what the docs quote.

/// Numbers (and long hexadecimal keys) as `#`, blanks collapsed.
fn normalise(line: &str) -> String {
    let chars: Vec<char> = line.trim().chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let hex = chars[i..].iter().take_while(|c| c.is_ascii_digit() || ('a'..='f').contains(*c)).count();
        if hex >= 16 {
            out.push('#');
            i += hex;
        } else if chars[i].is_ascii_digit() {
            while i < chars.len()
                && (chars[i].is_ascii_digit()
                    || (chars[i] == '.' && chars.get(i + 1).is_some_and(|c| c.is_ascii_digit())))
            {
                i += 1;
            }
            out.push('#');
        } else if chars[i].is_whitespace() {
            while i < chars.len() && chars[i].is_whitespace() {
                i += 1;
            }
            out.push(' ');
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// True when `real` is the line `quoted` shows: the same but for numbers,
/// with `…` standing for any text.
fn matches_quote(quoted: &str, real: &str) -> bool {
    let (quoted, real) = (normalise(quoted), normalise(real));
    let parts: Vec<&str> = quoted.split('…').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return quoted == real;
    }
    if !real.starts_with(first) || !real.ends_with(last) {
        return false;
    }
    let mut at = first.len();
    for part in &parts[1..parts.len() - 1] {
        match real[at..].find(part) {
            Some(k) => at += k + part.len(),
            None => return false,
        }
    }
    real.len() - last.len() >= at
}

#[test]
fn quotes_match_real_lines_but_for_numbers_and_ellipses() {
    let real = "2026-11-23T17:28:14.052483Z  WARN tunefleet_agent::transport: broker connection failed \
                error=I/O: Connection refused (os error 111) retry_in_ms=72";
    assert!(matches_quote("… WARN tunefleet_agent::transport: broker connection failed error=I/O: Connection refused (os error 111) retry_in_ms=…", real));
    assert!(!matches_quote(
        "… WARN tunefleet_agent::transport: broker connection failed error=I/O: No route to host …",
        real
    ));
    assert!(matches_quote("study demo: 12/12 trials done, 0 failed", "study demo: 3/4 trials done, 1 failed"));
    assert!(!matches_quote("study demo: 12/12 trials done", "study demo: 12/12 trials done, 0 failed"));
    assert!(matches_quote(
        "key … pinned",
        "key 9cccb53b5dfb4cdfa786e28f41c14b6b99a5214a301ea0e4ec34b9c1589cf4b1 pinned"
    ));
    assert!(!matches_quote("a … a", "a"), "the parts may not overlap");
}

/// Every line of the ```text blocks of `section` of TROUBLESHOOTING.md matches a line of `output`.
fn check_quotes(path: &str, section: &str, output: &[String]) {
    let quotes: Vec<Block> = blocks_of(&doc(path), "text").into_iter().filter(|b| b.section == section).collect();
    assert!(!quotes.is_empty(), "{path}: no section {section:?} quoting messages");
    for b in &quotes {
        for quoted in b.text.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                output.iter().any(|real| matches_quote(quoted, real)),
                "{path}:{}: `{quoted}` is not what the programs printed:\n{}",
                b.line,
                output.join("\n")
            );
        }
    }
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_string).collect()
}

fn log_lines(path: &Path) -> Vec<String> {
    lines(&std::fs::read_to_string(path).unwrap_or_default())
}

fn wait_for_log(path: &Path, needle: &str) {
    wait_for(&format!("{needle:?} in {}", path.display()), LONG, || {
        std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
    });
}

/// A Tunefleet program run from `dir`, with the test's state home and binaries.
fn tf(program: &str, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin(program));
    c.args(args).current_dir(dir).env("PATH", path_with_bins()).env("XDG_STATE_HOME", state_home());
    c
}

/// A join token of the coordinator whose store is `join.db` in `dir`, as an
/// installed agent has one.
fn joined(dir: &Path) -> String {
    let (code, token, err) = run(tf("tunefleet", dir, &["token", "create", "--store", "join.db"]));
    assert_eq!(code, Some(0), "{err}");
    token.trim().to_string()
}

/// Waits for a coordinator's `broker: URL` line; the URL.
fn broker_url(p: &mut Proc) -> String {
    p.wait_line(LONG, |l| l.starts_with("broker: ")).trim_start_matches("broker: ").trim().to_string()
}

/// Starts `cmd` in the background, its standard error in `log`.
fn spawn_logged(name: &str, mut cmd: Command, log: &Path) -> Proc {
    cmd.stderr(std::fs::File::create(log).expect("log file"));
    Proc::spawn(name, cmd)
}

/// Runs a command to the end; its exit status and every line it printed.
fn run_lines(cmd: Command) -> (Option<i32>, Vec<String>) {
    let (code, out, err) = run(cmd);
    (code, lines(&format!("{out}{err}")))
}

// ---------------------------------------------------------------------------
// The quick start, run.

/// What runs in the background, as in another terminal.
enum Kind {
    /// `tunefleet run` or `campaign`: ends by itself.
    Run,
    /// `tunefleet serve`, with its store.
    Service(PathBuf),
    Agent,
    Watch,
}

struct Terminal {
    proc: Proc,
    kind: Kind,
    log: PathBuf,
    seen: Vec<String>,
}

impl Terminal {
    /// Reads standard output until a line satisfies `pred`, keeping every line.
    fn wait_line(&mut self, pred: impl Fn(&str) -> bool) -> String {
        let seen = RefCell::new(Vec::new());
        let line = self.proc.wait_line(LONG, |l| {
            seen.borrow_mut().push(l.to_string());
            pred(l)
        });
        self.seen.extend(seen.into_inner());
        line
    }

    /// Waits for the exit; everything it printed. It must end well.
    fn finish(mut self) -> Vec<String> {
        let status = self.proc.wait_exit(LONG);
        let mut all = self.seen;
        all.extend(self.proc.rest_of_stdout());
        all.extend(log_lines(&self.log));
        assert!(status.success(), "{} exited with {status:?}:\n{}", self.proc.name, all.join("\n"));
        all
    }
}

/// A scratch directory where the quick start's commands run as written.
struct QuickStart {
    dir: tempfile::TempDir,
    terminals: Vec<Terminal>,
    /// Lines printed in this section.
    output: Vec<String>,
    /// Where the latest coordinator's broker listens, and where the docs say it does.
    broker: Option<(String, String)>,
    agents: Vec<String>,
    logs: usize,
    /// Every study summary line printed so far (`study NAME: ...`).
    summaries: Vec<String>,
}

impl QuickStart {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        // The commands run from the repository's directory.
        std::os::unix::fs::symlink(repo().join("examples"), dir.path().join("examples")).expect("symlink");
        QuickStart {
            dir,
            terminals: Vec::new(),
            output: Vec::new(),
            broker: None,
            agents: Vec::new(),
            logs: 0,
            summaries: Vec::new(),
        }
    }

    fn log(&mut self, name: &str) -> PathBuf {
        self.logs += 1;
        self.dir.path().join(format!("{}-{name}.log", self.logs))
    }

    fn section(&mut self, markdown: &str, title: &str) {
        let section: Vec<Block> = blocks(markdown).into_iter().filter(|b| b.section == title).collect();
        assert!(section.iter().any(|b| b.lang == "sh"), "{QUICKSTART}: no commands in section {title:?}");
        for b in &section {
            match b.lang.as_str() {
                "sh" => shell_commands(b).iter().for_each(|c| self.execute(c)),
                "toml" => {
                    // The first line names the file: `# first.toml: ...`.
                    let name = b
                        .text
                        .lines()
                        .next()
                        .and_then(|l| l.strip_prefix("# "))
                        .and_then(|l| l.split([':', ' ']).next().filter(|n| n.ends_with(".toml")));
                    let name = name.unwrap_or_else(|| panic!("{QUICKSTART}:{}: name the file on line 1", b.line));
                    std::fs::write(self.dir.path().join(name), &b.text).expect("write the study");
                }
                "python" => {
                    // The first line names the file: `# follow.py: ...`.
                    let name =
                        b.text.lines().next().and_then(|l| l.strip_prefix("# ")).and_then(|l| l.split(':').next());
                    let name = name
                        .filter(|n| n.ends_with(".py"))
                        .unwrap_or_else(|| panic!("{QUICKSTART}:{}: name the file on line 1", b.line));
                    std::fs::write(self.dir.path().join(name), &b.text).expect("write the script");
                }
                _ => {}
            }
        }
        self.end_section();
        for b in section.iter().filter(|b| b.lang == "text") {
            for quoted in b.text.lines().filter(|l| !l.trim().is_empty()) {
                assert!(
                    self.output.iter().any(|real| matches_quote(quoted, real)),
                    "{QUICKSTART}:{}: `{quoted}` is not what the programs printed:\n{}",
                    b.line,
                    self.output.join("\n")
                );
            }
        }
        for l in &self.output {
            check_summary(l);
        }
        self.summaries.extend(self.output.iter().filter(|l| l.starts_with("study ")).cloned());
        self.output.clear();
    }

    fn execute(&mut self, cmd: &ShellCommand) {
        let words = from_program(&cmd.words);
        let place = format!("{QUICKSTART}:{}: `{}`", cmd.line, cmd.words.join(" "));
        if self.python(words, &place) {
            return;
        }
        let Some(program) = words.first().and_then(|w| tunefleet_program(w)) else {
            // Section 1 put the binaries on the PATH; the test's PATH has them.
            assert!(words.first().is_some_and(|w| w == "export") && words[1].starts_with("PATH="), "{place}: not run");
            return;
        };
        let args: Vec<String> = words[1..].to_vec();
        match (program, subcommand(&args)) {
            ("tunefleet", Some("run" | "campaign" | "serve")) => self.coordinator(&args, &place),
            ("tunefleet", Some("status")) if args.iter().any(|a| a == "--watch") => {
                let log = self.log("watch");
                let mut t = Terminal {
                    proc: spawn_logged("watch", self.command(program, &args), &log),
                    kind: Kind::Watch,
                    log,
                    seen: Vec::new(),
                };
                let first = t.wait_line(|_| true);
                assert!(first.contains(" running: ") || first.contains(" finished: "), "{place}: {first}");
                self.terminals.push(t);
            }
            ("tunefleet-agent", None) => self.agent(&args, &place),
            _ => self.foreground(program, &args, &place),
        }
    }

    /// Section 6's Python: the virtual environment is the test's own
    /// (scripts/needs.sh `python-package`, which has the extras), the
    /// package is installed into it as `pip install ./python` does, and
    /// `python3 ...` runs to its end with it. False for any other command.
    fn python(&mut self, words: &[String], place: &str) -> bool {
        let venv = std::env::var_os("PYTHON_VENV").map_or_else(|| repo().join("target/python-venv"), PathBuf::from);
        match words.first().map(String::as_str) {
            Some("python3") if words.get(1).is_some_and(|w| w == "-m") => {
                assert_eq!(words.get(2).map(String::as_str), Some("venv"), "{place}: only `python3 -m venv` is known");
            }
            Some(".") => assert!(words.get(1).is_some_and(|w| w.ends_with("/bin/activate")), "{place}: not run"),
            Some("pip") => {
                assert!(words.get(2).is_some_and(|w| w.starts_with("./python")), "{place}: installs the package");
                let mut pip = Command::new(venv.join("bin/pip"));
                pip.args(["install", "--quiet", "--no-deps", "--no-build-isolation", "--force-reinstall"])
                    .args(["--disable-pip-version-check", "./python"])
                    .current_dir(repo());
                let (code, out, err) = run(pip);
                assert_eq!(code, Some(0), "{place}: {out}\n{err}");
            }
            Some("python3") => {
                self.finish_runs();
                let mut python = Command::new(venv.join("bin/python"));
                python.args(&words[1..]).current_dir(self.dir.path());
                python.env("PATH", path_with_bins()).env("XDG_STATE_HOME", state_home());
                let log = self.log("python");
                let t = Terminal { proc: spawn_logged("python", python, &log), kind: Kind::Run, log, seen: Vec::new() };
                self.output.extend(t.finish());
            }
            _ => return false,
        }
        true
    }

    fn command(&self, program: &str, args: &[String]) -> Command {
        let mut c = tf(program, self.dir.path(), &[]);
        c.args(args);
        c
    }

    /// A coordinator, on a port the OS chooses.
    fn coordinator(&mut self, args: &[String], place: &str) {
        let mut args = args.to_vec();
        let listen = match args.iter().position(|a| a == "--listen") {
            Some(i) => args.drain(i..i + 2).nth(1).unwrap_or_default(),
            None => "127.0.0.1:1883".into(),
        };
        args.extend(["--listen".into(), "127.0.0.1:0".into()]);
        let serve = subcommand(&args) == Some("serve");
        if serve && !args.iter().any(|a| a == "--page") {
            // Its page and API on a free port: api.json says which.
            args.extend(["--page".into(), "127.0.0.1:0".into()]);
        }
        let kind = if serve {
            Kind::Service(self.dir.path().join(flag_value(&args, "--store").unwrap_or("tunefleet.db")))
        } else {
            Kind::Run
        };
        let log = self.log("coordinator");
        let proc = spawn_logged("coordinator", self.command("tunefleet", &args), &log);
        let mut t = Terminal { proc, kind, log, seen: Vec::new() };
        let url = t.wait_line(|l| l.starts_with("broker: ")).trim_start_matches("broker: ").trim().to_string();
        if serve {
            let control = t.seen.iter().find_map(|l| l.strip_prefix("control: ")).map(str::trim);
            let socket = self.dir.path().join(control.unwrap_or_else(|| panic!("{place}: no control socket")));
            wait_for("the control socket", LONG, || socket.exists());
        }
        self.broker = Some((url, format!("mqtt://{listen}")));
        self.terminals.push(t);
    }

    fn agent(&mut self, args: &[String], place: &str) {
        let (url, documented) = self.broker.clone().unwrap_or_else(|| panic!("{place}: no coordinator started before"));
        assert_eq!(
            flag_value(args, "--broker"),
            Some(documented.as_str()),
            "{place}: not where the coordinator listens"
        );
        let args: Vec<String> = args.iter().map(|a| if *a == documented { url.clone() } else { a.clone() }).collect();
        let name = flag_value(&args, "--name").unwrap_or_else(|| panic!("{place}: name the agent")).to_string();
        let log = self.log(&name);
        let proc = spawn_logged(&name, self.command("tunefleet-agent", &args), &log);
        self.agents.push(name);
        self.terminals.push(Terminal { proc, kind: Kind::Agent, log, seen: Vec::new() });
    }

    /// A command run to its end, after the studies `run` started have ended.
    fn foreground(&mut self, program: &str, args: &[String], place: &str) {
        self.finish_runs();
        if let (Some("cancel"), Some(study)) = (subcommand(args), args.get(1)) {
            // As a person would, cancel once the study runs something.
            let store = self.dir.path().join(flag_value(args, "--store").unwrap_or("tunefleet.db"));
            wait_for("the study to cancel running a trial", LONG, || {
                self.status(&store).iter().any(|r| r["study"] == study.as_str() && r["running"].as_u64() > Some(0))
            });
        }
        let log = self.log("command");
        let t = Terminal {
            proc: spawn_logged(program, self.command(program, args), &log),
            kind: Kind::Run,
            log,
            seen: Vec::new(),
        };
        let out = t.finish();
        let stdout = out.join("\n");
        let file = |flag: &str| flag_value(args, flag).map(|f| self.dir.path().join(f));
        match subcommand(args) {
            Some("report") => {
                let html = std::fs::read_to_string(file("-o").expect("report -o FILE")).expect("the report");
                assert!(html.contains("<svg"), "{place}: no chart in the report");
            }
            Some("export") if file("-o").is_some() => {
                let csv = std::fs::read_to_string(file("-o").expect("-o")).expect("the export");
                assert!(csv.lines().count() > 1, "{place}: nothing exported");
            }
            Some("best") => assert!(stdout.trim_start().starts_with("trial"), "{place}: {stdout}"),
            Some("check") => assert!(stdout.contains(" trials"), "{place}: {stdout}"),
            Some("submit") => assert!(stdout.contains("submitted"), "{place}: {stdout}"),
            Some("cancel") => {
                assert!(stdout.contains("cancelled") && !stdout.contains(": 0 running"), "{place}: {stdout}")
            }
            Some("demo") => assert!(stdout.contains("trials done"), "{place}: {stdout}"),
            _ => {}
        }
        self.output.extend(out);
    }

    /// `tunefleet status --json` of the store at `store` (nothing while it cannot be read).
    fn status(&self, store: &Path) -> Vec<serde_json::Value> {
        let args = ["status".into(), "--json".into(), "--store".into(), store.display().to_string()];
        let (code, out, _) = run(self.command("tunefleet", &args));
        (code == Some(0)).then(|| serde_json::from_str(&out).ok()).flatten().unwrap_or_default()
    }

    /// Waits for every `tunefleet run` to end by itself.
    fn finish_runs(&mut self) {
        let (runs, rest): (Vec<Terminal>, Vec<Terminal>) =
            std::mem::take(&mut self.terminals).into_iter().partition(|t| matches!(t.kind, Kind::Run));
        self.terminals = rest;
        for t in runs {
            self.output.extend(t.finish());
        }
    }

    /// The studies end, then Ctrl-C to what still runs: each stops cleanly.
    fn end_section(&mut self) {
        self.finish_runs();
        for t in &self.terminals {
            if let Kind::Service(store) = &t.kind {
                wait_for("every study the service runs to finish", LONG, || {
                    let rows = self.status(store);
                    !rows.is_empty() && rows.iter().all(|r| r["state"] == "finished")
                });
            }
        }
        let order = |t: &Terminal| match t.kind {
            Kind::Watch => 0,
            Kind::Agent => 1,
            _ => 2,
        };
        let mut terminals = std::mem::take(&mut self.terminals);
        terminals.sort_by_key(order);
        for t in terminals {
            t.proc.signal("INT");
            self.output.extend(t.finish());
        }
        let names: Vec<&str> = self.agents.iter().map(String::as_str).collect();
        assert_agents_spools_empty(&names);
        self.agents.clear();
    }
}

/// A coordinator's summary `study NAME: D/T trials done, F failed...`:
/// every trial done, none failed, unless some were stopped on purpose.
fn check_summary(line: &str) {
    let Some(rest) = line.strip_prefix("study ") else { return };
    let Some((_, figures)) = rest.split_once(": ") else { return };
    let Some((counts, tail)) = figures.split_once(" trials done, ") else { return };
    if tail.contains("stopped") {
        return;
    }
    let (done, total) = counts.split_once('/').expect("D/T");
    assert_eq!(done, total, "{line}");
    assert!(tail.starts_with("0 failed"), "{line}");
}

#[test]
fn quick_start_runs_as_written() {
    let markdown = doc(QUICKSTART);
    let sections: Vec<String> = blocks(&markdown).into_iter().map(|b| b.section).collect();
    let mut qs = QuickStart::new();
    let run_sections = [
        "2. The demo",
        "3. A study of your own, one coordinator and one agent",
        "5. The coordinator as a service",
        "6. From Python",
    ];
    for title in run_sections {
        assert!(sections.iter().any(|s| s == title), "{QUICKSTART}: no section {title:?}");
        qs.section(&markdown, title);
    }
    for b in blocks_of(&markdown, "text") {
        assert!(
            run_sections.contains(&b.section.as_str()),
            "{QUICKSTART}:{}: output quoted in a section not run",
            b.line
        );
    }
    assert!(qs.dir.path().join("first.html").exists());
    // The same counts in `run`'s summary, `status` and the report.
    let summary = qs.summaries.iter().find(|l| l.starts_with("study first: ")).expect("run's summary of first");
    let counts = summary.trim_start_matches("study first: ").split(" trials done").next().expect("counts");
    // Section 3 ends by renaming the study `first-1` (its name freed for a changed file).
    let (code, status, err) = run(tf("tunefleet", qs.dir.path(), &["status", "first-1", "--store", "first.db"]));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        status.starts_with(&format!("first-1 finished: {counts} done, 0 running, 0 held ahead, 0 pending, 0 failed")),
        "{summary}\n{status}"
    );
    let html = std::fs::read_to_string(qs.dir.path().join("first.html")).expect("the report");
    assert!(
        html.contains(&format!("<span id=\"counts\">{counts} done, 0 running, 0 held ahead, 0 pending, 0 failed")),
        "{summary}"
    );
}

// ---------------------------------------------------------------------------
// The study reference.

/// The valid study examples of STUDY.md (not campaigns), in order.
fn study_examples(markdown: &str) -> Vec<Block> {
    blocks_of(markdown, "toml")
        .into_iter()
        .filter(|b| !b.text.starts_with("# invalid") && !b.text.contains("[[workload]]"))
        .collect()
}

/// The text block right after the block at `line`.
fn quoted_after(markdown: &str, line: usize) -> Block {
    let all = blocks(markdown);
    let next = all.iter().position(|b| b.line == line).and_then(|i| all.get(i + 1));
    next.filter(|b| b.lang == "text").cloned().unwrap_or_else(|| panic!("{STUDY}:{line}: no ```text message after it"))
}

#[test]
fn study_examples_pass_check_and_invalid_ones_are_refused_as_quoted() {
    let markdown = doc(STUDY);
    let dir = tempfile::tempdir().expect("tempdir");
    let campaigns = dir.path().join("campaigns");
    std::fs::create_dir(&campaigns).expect("mkdir");
    std::os::unix::fs::symlink(repo().join("examples/studies"), dir.path().join("studies")).expect("symlink");
    let (mut valid, mut invalid, mut campaign_examples) = (0, 0, 0);
    for b in blocks_of(&markdown, "toml") {
        let place = format!("{STUDY}:{}", b.line);
        let is_campaign = b.text.contains("[[workload]]");
        if b.text.starts_with("# invalid") {
            invalid += 1;
            // `tunefleet check study.toml`, or `tunefleet campaign campaign.toml`.
            let (file, args): (&str, &[&str]) = if is_campaign {
                ("campaign.toml", &["campaign", "campaign.toml", "--store", "c.db", "--listen", "127.0.0.1:0"])
            } else {
                ("study.toml", &["check", "study.toml"])
            };
            std::fs::write(campaigns.join(file), &b.text).expect("write");
            let (code, out, err) = run(tf("tunefleet", &campaigns, args));
            assert_eq!(code, Some(if is_campaign { 1 } else { 2 }), "{place}: not refused: {out}{err}");
            assert_eq!(err.trim(), quoted_after(&markdown, b.line).text.trim(), "{place}: another message");
        } else if is_campaign {
            campaign_examples += 1;
            let c =
                tunefleet_coordinator::domain::campaign::parse(&b.text, "c.toml", &repo().join("examples/campaigns"))
                    .unwrap_or_else(|e| panic!("{place}: {e}"));
            assert_eq!(c.studies.len(), b.text.matches("[[workload]]").count(), "{place}");
        } else {
            valid += 1;
            std::fs::write(dir.path().join("example.toml"), &b.text).expect("write");
            let (code, out, err) = run(tf("tunefleet", dir.path(), &["check", "example.toml"]));
            assert_eq!(code, Some(0), "{place}: {err}");
            assert!(out.contains(" trials"), "{place}: {out}");
            workload_flags_exist(&b.text, &place);
        }
    }
    assert!(valid >= 5 && invalid >= 3 && campaign_examples >= 1, "{valid} {invalid} {campaign_examples}");
}

/// The bundled workloads have every flag an example gives them.
fn workload_flags_exist(text: &str, place: &str) {
    let study = tunefleet_coordinator::domain::study::parse(text, place).expect("parses");
    let program = &study.command[0];
    if !program.starts_with("tunefleet-") {
        return;
    }
    let (code, help, _) = run(tf(program, Path::new("."), &["--help"]));
    assert_eq!(code, Some(0), "{place}: {program}");
    for flag in study.command.iter().chain(&study.resume).filter(|a| a.starts_with("--")) {
        assert!(help_has_flag(&help, flag), "{place}: {program} has no {flag}");
    }
}

/// The keys the parser accepts in a table, as it lists them when refusing `zzz_unknown`.
fn accepted_keys(study: &str) -> BTreeSet<String> {
    let e = tunefleet_coordinator::domain::study::parse(study, "probe.toml").expect_err("an unknown key is refused");
    let message = e.to_string();
    let expected = message.split_once("expected").map(|(_, l)| l).unwrap_or_else(|| panic!("{message}"));
    expected.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// Every key of every table the parser knows, by table.
fn parser_keys(minimal: &str) -> Vec<(String, BTreeSet<String>)> {
    let unknown = "zzz_unknown = 1\n";
    let with = |table: &str| minimal.replacen(&format!("{table}\n"), &format!("{table}\n{unknown}"), 1);
    let cores = "[system.cores]\nkind = \"int\"\nlow = 1\nhigh = 2\n";
    let pipelined = format!("{minimal}{cores}[pipeline]\nmode = \"pipelined\"\n");
    let top = accepted_keys(&format!("{unknown}{minimal}"));
    let mut out = vec![("top level".to_string(), top.clone())];
    for key in &top {
        let probe = match key.as_str() {
            k if SCALAR_KEYS.contains(&k) => continue,
            "objective" | "budget" | "strategy" => with(&format!("[{key}]")),
            "hyper" => with("[hyper.n]"),
            "system" => format!("{minimal}{cores}{unknown}"),
            "selector" | "reuse" => format!("{pipelined}[{key}]\n{unknown}"),
            "pipeline" => format!("{pipelined}{unknown}"),
            "early_stopping" => format!("{minimal}[early_stopping]\nkind = \"asha\"\n{unknown}"),
            "stability" => format!("{minimal}[stability]\nspread = 0.1\n{unknown}"),
            "group" => format!("{minimal}[[group]]\nname = \"g\"\n{unknown}"),
            "measure" => format!("{minimal}[measure]\n{unknown}"),
            "warm_start" => format!("{minimal}[warm_start]\n{unknown}"),
            "constraint" => format!("{minimal}[[constraint]]\nmetric = \"m\"\n{unknown}"),
            // Its keys are the study's parameter names: none is unknown.
            "enqueue" => continue,
            other => panic!("the parser takes a new table `{other}`: document it in {STUDY} and add it here"),
        };
        out.push((key.clone(), accepted_keys(&probe)));
    }
    let window = format!("{pipelined}window = {{ zzz_unknown = 1 }}\n");
    out.push(("pipeline.window".into(), accepted_keys(&window)));
    let nodes = format!("{minimal}[measure]\nnodes = {{ zzz_unknown = 1 }}\n");
    out.push(("measure.nodes".into(), accepted_keys(&nodes)));
    out
}

#[test]
fn every_key_the_parser_takes_is_documented_and_used_in_an_example() {
    let markdown = doc(STUDY);
    let examples = study_examples(&markdown);
    // The minimal example, with its tables one per line, probes the parser.
    let minimal = &examples.first().expect("a first example").text;
    let tables = parser_keys(minimal);
    let mut known = BTreeSet::new();
    for (table, keys) in &tables {
        assert!(!keys.is_empty(), "no keys found for {table}");
        for key in keys {
            known.insert(key.clone());
            let documented = [format!("`{key}`"), format!("`[{key}"), format!("`[[{key}")];
            assert!(documented.iter().any(|d| markdown.contains(d)), "{STUDY}: {table} key `{key}` is not documented");
            let used = examples.iter().any(|e| {
                e.text.lines().any(|l| {
                    let l = l.trim_start().trim_start_matches('[');
                    l.starts_with(&format!("{key} "))
                        || l.starts_with(&format!("{key}]"))
                        || l.starts_with(&format!("{key}."))
                }) || e.text.contains(&format!("{{ {key} ="))
                    || e.text.contains(&format!(", {key} ="))
            });
            assert!(used, "{STUDY}: no valid example uses {table} key `{key}`");
        }
    }
    // And the reference tables name no key the parser does not take.
    let mut section = String::new();
    let mut in_key_table = false;
    for line in markdown.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.to_string();
        }
        if line.starts_with("| key |") {
            in_key_table = !section.starts_with("Campaign");
            continue;
        }
        if !line.starts_with('|') {
            in_key_table = false;
            continue;
        }
        let first_cell = line.split('|').nth(1).unwrap_or_default();
        for key in first_cell.split('`').skip(1).step_by(2).filter(|_| in_key_table && !first_cell.contains("---")) {
            assert!(
                known.contains(key),
                "{STUDY}: the table of {section:?} names `{key}`, which the parser does not take"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// Troubleshooting: every quoted message, provoked.

const SECTIONS: [&str; 9] = [
    "The agent cannot read RAPL (energy is `estimated`)",
    "The agent cannot reach the broker",
    "Port 1883 is already in use",
    "TLS mistakes",
    "An agent is not admitted, or a pinned key changed",
    "A study file is refused",
    "`tunefleet serve`, `submit` and `cancel`",
    "A result was kept aside by the agent",
    "A trial failed, or is not ranked",
];

#[test]
fn every_troubleshooting_section_that_quotes_messages_is_reproduced_here() {
    let quoting: BTreeSet<String> = blocks_of(&doc(TROUBLESHOOTING), "text").into_iter().map(|b| b.section).collect();
    assert_eq!(quoting, SECTIONS.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
}

/// The minimal study of STUDY.md (four short trials of `sh`), written to `dir/NAME.toml`.
fn sleep_study_file(dir: &Path, name: &str) -> PathBuf {
    let text = study_examples(&doc(STUDY)).remove(0).text.replace("name = \"sleep\"", &format!("name = \"{name}\""));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write");
    path
}

fn euid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn rapl_without_permission() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let sys = dir.path().join("sys");
    let zone = sys.join("powercap/intel-rapl:0");
    std::fs::create_dir_all(&zone).expect("mkdir");
    for d in ["hwmon", "power_supply", "state"] {
        std::fs::create_dir_all(sys.join(d)).expect("mkdir");
    }
    std::fs::write(zone.join("name"), "package-0\n").expect("write");
    std::fs::write(zone.join("max_energy_range_uj"), "262143328850\n").expect("write");
    std::fs::write(zone.join("energy_uj"), "123456\n").expect("write");
    for d in [dir.path(), &sys, &zone] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::set_permissions(sys.join("state"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::set_permissions(zone.join("energy_uj"), std::fs::Permissions::from_mode(0o000)).expect("chmod");
    let root = |d: &str| sys.join(d).display().to_string();
    let (powercap, hwmon, power_supply, state) = (root("powercap"), root("hwmon"), root("power_supply"), root("state"));
    let energy = ["--powercap-root", &powercap, "--hwmon-root", &hwmon, "--power-supply-root", &power_supply];
    // Not as root, who reads anything: as `nobody` when the test is root.
    let agent = |args: &[&str]| {
        let mut c = if euid() == Some(0) {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(bin("tunefleet-agent"));
            c
        } else {
            Command::new(bin("tunefleet-agent"))
        };
        c.args(args).args(energy).current_dir(dir.path());
        c
    };
    let (code, mut output) = run_lines(agent(&["probe"]));
    assert_eq!(code, Some(0), "{output:?}");
    assert!(output.iter().any(|l| l.trim() == "selected: estimated"), "{output:?}");
    let closed = ClosedPort::new();
    let log = dir.path().join("agent.log");
    let url = format!("mqtt://127.0.0.1:{}", closed.port);
    let _agent = spawn_logged("rapl-1", agent(&["--broker", &url, "--name", "rapl-1", "--state-dir", &state]), &log);
    wait_for_log(&log, "energy source present but unusable");
    output.extend(log_lines(&log));
    check_quotes(TROUBLESHOOTING, SECTIONS[0], &output);
    assert_spools_empty(&[sys.join("state")]);
}

#[test]
fn broker_unreachable_and_port_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let closed = ClosedPort::new();
    let url = format!("mqtt://127.0.0.1:{}", closed.port);
    let (agent_log, coordinator_log) = (dir.path().join("agent.log"), dir.path().join("coordinator.log"));
    let study = sleep_study_file(dir.path(), "unreachable");
    let mut far = tf("tunefleet-agent", dir.path(), &["--broker", &url, "--name", "far-1"]);
    far.env("TUNEFLEET_JOIN", joined(dir.path()));
    let agent = spawn_logged("far-1", far, &agent_log);
    let study_arg = study.display().to_string();
    let coordinator = spawn_logged(
        "coordinator",
        tf("tunefleet", dir.path(), &["run", &study_arg, "--broker", &url, "--store", "u.db", "--quiet"]),
        &coordinator_log,
    );
    wait_for_log(&agent_log, "broker connection failed");
    wait_for_log(&coordinator_log, "lost the broker");
    drop((agent, coordinator));
    let mut output = log_lines(&agent_log);
    output.extend(log_lines(&coordinator_log));
    check_quotes(TROUBLESHOOTING, SECTIONS[1], &output);

    // Something else listens where the embedded broker would.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let listen = taken.local_addr().expect("addr").to_string();
    let (code, output) =
        run_lines(tf("tunefleet", dir.path(), &["run", &study_arg, "--store", "p.db", "--listen", &listen, "--quiet"]));
    assert_eq!(code, Some(1), "{output:?}");
    check_quotes(TROUBLESHOOTING, SECTIONS[2], &output);
    assert_agents_spools_empty(&["far-1"]);
}

#[test]
fn tls_mistakes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = repo().join("scripts/fleet-certs.sh");
    for (certs, clients) in [("certs", "node-1"), ("other", "node-1")] {
        let status =
            Command::new("bash").arg(&script).arg(dir.path().join(certs)).args(["127.0.0.1", clients]).status();
        assert!(status.expect("bash").success(), "fleet-certs.sh");
    }
    let file = |f: &str| dir.path().join(f).display().to_string();
    // Two TLS brokers with the certificate for 127.0.0.1: one there, one where the name is wrong.
    let mut coordinators = Vec::new();
    let mut urls = Vec::new();
    for (i, listen) in ["127.0.0.1:0", "127.0.0.2:0"].into_iter().enumerate() {
        let store = format!("tls-{i}.db");
        let (cert, key, ca) = (file("certs/broker.pem"), file("certs/broker.key"), file("certs/ca.pem"));
        let args = [
            "serve",
            "--store",
            &store,
            "--listen",
            listen,
            "--broker-cert",
            &cert,
            "--broker-key",
            &key,
            "--broker-client-ca",
            &ca,
        ];
        let mut p =
            spawn_logged("coordinator", tf("tunefleet", dir.path(), &args), &dir.path().join(format!("c{i}.log")));
        let url = broker_url(&mut p);
        assert!(url.starts_with("mqtts://"), "{url}");
        urls.push(url);
        coordinators.push(p);
    }
    let (ca, other_ca) = (file("certs/ca.pem"), file("other/ca.pem"));
    let (cert, key) = (file("certs/node-1.pem"), file("certs/node-1.key"));
    let (other_cert, other_key) = (file("other/node-1.pem"), file("other/node-1.key"));
    let mut output = Vec::new();
    for args in [vec!["--name", "t-0"], vec!["--name", "t-0", "--ca", &ca, "--cert", &cert]] {
        let (code, out) =
            run_lines(tf("tunefleet-agent", dir.path(), &[&["--broker", urls[0].as_str()][..], &args].concat()));
        assert_eq!(code, Some(2), "{out:?}");
        output.extend(out);
    }
    let plain = urls[0].replace("mqtts://", "mqtt://");
    let agents: [(&str, &str, Vec<&str>); 5] = [
        ("t-ca", urls[0].as_str(), vec!["--ca", &other_ca, "--cert", &cert, "--key", &key]),
        ("t-name", urls[1].as_str(), vec!["--ca", &ca, "--cert", &cert, "--key", &key]),
        ("t-nocert", urls[0].as_str(), vec!["--ca", &ca]),
        ("t-othercert", urls[0].as_str(), vec!["--ca", &ca, "--cert", &other_cert, "--key", &other_key]),
        ("t-plain", plain.as_str(), vec![]),
    ];
    let mut running = Vec::new();
    for (name, url, args) in &agents {
        let log = dir.path().join(format!("{name}.log"));
        let mut cmd = tf("tunefleet-agent", dir.path(), &[&["--broker", url, "--name", name][..], args].concat());
        cmd.env("TUNEFLEET_JOIN", joined(dir.path()));
        running.push((spawn_logged(name, cmd, &log), log));
    }
    for (_, log) in &running {
        wait_for_log(log, "broker connection failed");
        output.extend(log_lines(log));
    }
    check_quotes(TROUBLESHOOTING, SECTIONS[3], &output);
    drop(running);
    for c in &coordinators {
        c.signal("TERM");
    }
    for mut c in coordinators {
        assert!(c.wait_exit(LONG).success());
    }
    assert_agents_spools_empty(&agents.iter().map(|(n, _, _)| *n).collect::<Vec<_>>());
}

#[test]
fn a_pinned_key_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let key_of = |state: &Path| -> String {
        let state = state.display().to_string();
        let (code, out, err) = run(tf("tunefleet-agent", d, &["key", "--state-dir", &state]));
        assert_eq!(code, Some(0), "{err}");
        out.trim().to_string()
    };
    let (first, second, third) = (d.join("first"), d.join("second"), d.join("third"));
    // The store pinned node-7's first key; node-7 comes back re-installed.
    let (code, _, err) = run(tf("tunefleet", d, &["agents", "trust", "node-7", &key_of(&first), "--store", "k.db"]));
    assert_eq!(code, Some(0), "{err}");
    let log = d.join("coordinator.log");
    let (code, token, err) = run(tf("tunefleet", d, &["token", "create", "--store", "k.db"]));
    assert_eq!(code, Some(0), "{err}");
    let mut service =
        spawn_logged("coordinator", tf("tunefleet", d, &["serve", "--store", "k.db", "--listen", "127.0.0.1:0"]), &log);
    let url = broker_url(&mut service);
    // Agents join with a token, as installed; `bare` starts one without (it has a pin).
    let agent = |name: &str, state: &Path, extra: &[&str]| {
        let s = state.display().to_string();
        let flags: Vec<&str> = extra.iter().copied().filter(|a| *a != "bare").collect();
        let mut cmd = tf(
            "tunefleet-agent",
            d,
            &[&["--broker", url.as_str(), "--name", name, "--state-dir", &s][..], &flags].concat(),
        );
        if !extra.contains(&"bare") {
            cmd.env("TUNEFLEET_JOIN", token.trim());
        }
        spawn_logged(name, cmd, &d.join(format!("{name}.log")))
    };
    let welcomed = |name: &str| {
        let (_, out, _) = run(tf("tunefleet", d, &["agents", "--store", "k.db"]));
        out.lines().any(|l| l.starts_with(&format!("{name} ")))
    };
    // No token and no key: the agent does not start.
    let fresh = d.join("fresh").display().to_string();
    let (code, mut output) =
        run_lines(tf("tunefleet-agent", d, &["--broker", url.as_str(), "--name", "node-10", "--state-dir", &fresh]));
    assert_ne!(code, Some(0), "{output:?}");
    // The coordinator's key but no token: refused by the coordinator.
    let (code, coordinator_key, err) = run(tf("tunefleet", d, &["key"]));
    assert_eq!(code, Some(0), "{err}");
    let tokenless = agent("node-10", &d.join("fresh"), &["bare", "--coordinator-key", coordinator_key.trim()]);
    wait_for_log(&log, "does not know");
    // The agent hears why on its own side.
    wait_for_log(&d.join("node-10.log"), "refused this agent");
    output.extend(log_lines(&d.join("node-10.log")));
    drop(tokenless);
    let _node7 = agent("node-7", &second, &[]);
    wait_for_log(&log, "is pinned for that name");
    wait_for_log(&d.join("node-7.log"), "refused this agent");
    output.extend(log_lines(&log));
    output.extend(log_lines(&d.join("node-7.log")));
    let new_key = key_of(&second);
    assert!(!welcomed("node-7"), "refused, node-7 is not among the store's agents");
    let (code, out) = run_lines(tf("tunefleet", d, &["agents", "trust", "node-7", &new_key, "--store", "k.db"]));
    assert_eq!(code, Some(0), "{out:?}");
    output.extend(out);
    wait_for("node-7 welcomed with its new key", LONG, || welcomed("node-7"));

    // An agent that pinned another coordinator's key.
    std::fs::create_dir_all(&third).expect("mkdir");
    std::fs::write(third.join("coordinator.pub"), format!("{new_key}\n")).expect("pin another key");
    let ignoring = agent("node-9", &third, &["bare"]);
    wait_for_log(&d.join("node-9.log"), "coordinator status ignored");
    output.extend(log_lines(&d.join("node-9.log")));
    drop(ignoring);
    let _pinned = agent("node-9", &third, &["--coordinator-key", coordinator_key.trim()]);
    wait_for("node-9 welcomed once given the coordinator's key", LONG, || welcomed("node-9"));
    check_quotes(TROUBLESHOOTING, SECTIONS[4], &output);
    service.signal("TERM");
    assert!(service.wait_exit(LONG).success());
    assert_spools_empty(&[second, third]);
}

#[test]
fn study_file_errors() {
    let markdown = doc(STUDY);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut output = Vec::new();
    for b in blocks_of(&markdown, "toml").iter().filter(|b| b.text.starts_with("# invalid:")) {
        std::fs::write(dir.path().join("study.toml"), &b.text).expect("write");
        let (code, out) = run_lines(tf("tunefleet", dir.path(), &["check", "study.toml"]));
        assert_eq!(code, Some(2));
        output.extend(out);
    }
    // The store has run "sleep"; a changed file under the same name is refused.
    let study = sleep_study_file(dir.path(), "sleep").display().to_string();
    let root = unique_root("docs-study");
    let (mut first, url) = start_coordinator(Path::new(&study), &dir.path().join("s.db"), &root, &[]);
    let _agent = start_agent(&url, "sleepy", &root, &[]);
    assert!(first.wait_exit(LONG).success());
    let changed = std::fs::read_to_string(&study).expect("read").replace("trials = 4", "trials = 3");
    std::fs::write(&study, changed).expect("write");
    let (code, out) =
        run_lines(tf("tunefleet", dir.path(), &["run", &study, "--store", "s.db", "--listen", "127.0.0.1:0"]));
    assert_eq!(code, Some(2), "{out:?}");
    output.extend(out);
    check_quotes(TROUBLESHOOTING, SECTIONS[5], &output);
    assert_agents_spools_empty(&["sleepy"]);
}

#[test]
fn service_control_socket_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let study = sleep_study_file(d, "first").display().to_string();
    let mut output = Vec::new();
    let mut refused = |args: &[&str]| {
        let (code, out) = run_lines(tf("tunefleet", d, args));
        assert_ne!(code, Some(0), "{args:?}: {out:?}");
        output.extend(out);
    };
    refused(&["submit", &study, "--store", "fleet.db"]);
    let open = d.join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::set_permissions(&open, <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777))
        .expect("chmod");
    refused(&["serve", "--store", "fleet.db", "--listen", "127.0.0.1:0", "--control", "open/control.sock"]);
    let serve = ["serve", "--store", "fleet.db", "--listen", "127.0.0.1:0"];
    let mut service = spawn_logged("service", tf("tunefleet", d, &serve), &d.join("service.log"));
    broker_url(&mut service);
    wait_for("the control socket", LONG, || d.join("fleet.control/control.sock").exists());
    refused(&serve);
    let (code, _, err) = run(tf("tunefleet", d, &["submit", &study, "--store", "fleet.db"]));
    assert_eq!(code, Some(0), "{err}");
    refused(&["submit", &study, "--store", "fleet.db"]);
    refused(&["cancel", "firts", "--store", "fleet.db"]);
    check_quotes(TROUBLESHOOTING, SECTIONS[6], &output);
    service.signal("TERM");
    assert!(service.wait_exit(LONG).success());
}

#[test]
fn a_result_is_kept_aside_listed_requeued_and_delivered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let started = d.join("started");
    // One trial that says when it runs and takes long enough to lose its coordinator.
    let other = d.join("other.toml");
    std::fs::write(
        &other,
        format!(
            "name = \"other\"\ncommand = [\"sh\", \"-c\", \"touch {}; sleep 2; echo TUNEFLEET final v={{v}}\"]\n\
             [objective]\nmetric = \"v\"\ndirection = \"maximize\"\n[budget]\ntrials = 1\n[strategy]\nkind = \"grid\"\n\
             [hyper.v]\nkind = \"categorical\"\nvalues = [1]\n",
            started.display()
        ),
    )
    .expect("write");
    let mine = sleep_study_file(d, "mine").display().to_string();
    let other = other.display().to_string();
    let coordinator = |study: &str, store: &str, listen: &str| {
        let args = ["run", study, "--store", store, "--listen", listen, "--quiet"];
        let mut p = spawn_logged("coordinator", tf("tunefleet", d, &args), &d.join(format!("{store}.log")));
        let url = broker_url(&mut p);
        (p, url)
    };
    let agent_log = d.join("node-8.log");
    let (code, token, err) = run(tf("tunefleet", d, &["token", "create", "--store", "a.db"]));
    assert_eq!(code, Some(0), "{err}");
    let node8 = |url: &str| {
        let mut cmd = tf("tunefleet-agent", d, &["--broker", url, "--name", "node-8"]);
        cmd.env("TUNEFLEET_JOIN", token.trim());
        spawn_logged("node-8", cmd, &agent_log)
    };
    let (a, url) = coordinator(&other, "a.db", "127.0.0.1:0");
    let listen = url.trim_start_matches("mqtt://").to_string();
    let agent = node8(&url);
    wait_for("the trial running", LONG, || started.exists());
    a.signal("KILL");
    drop(a);
    wait_for("the result in the spool", LONG, || !spool(&agent_state_dir("node-8")).is_empty());
    // Another coordinator on that address, running another study, refuses
    // it. Its store knows node-8's key: the operator registered it.
    let (code, key, err) = run(tf("tunefleet-agent", d, &["key", "--name", "node-8"]));
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = run(tf("tunefleet", d, &["agents", "trust", "node-8", key.trim(), "--store", "b.db"]));
    assert_eq!(code, Some(0), "{err}");
    let (mut b, _) = coordinator(&mine, "b.db", &listen);
    assert!(b.wait_exit(LONG).success());
    wait_for_log(&agent_log, "kept aside");
    agent.signal("INT");
    let mut agent = agent;
    assert!(agent.wait_exit(LONG).success());
    let mut output = log_lines(&agent_log);
    for args in [["spool", "--name", "node-8"].as_slice(), &["spool", "requeue", "--name", "node-8"]] {
        let (code, out) = run_lines(tf("tunefleet-agent", d, args));
        assert_eq!(code, Some(0), "{out:?}");
        output.extend(out);
    }
    check_quotes(TROUBLESHOOTING, SECTIONS[7], &output);
    // Delivered to the coordinator of its study, as the fix says.
    let (mut a, _) = coordinator(&other, "a.db", &listen);
    let _agent = node8(&url);
    assert!(a.wait_exit(LONG).success());
    let summary = a.rest_of_stdout().join("\n");
    assert!(summary.contains("1/1 trials done"), "{summary}");
    assert_agents_spools_empty(&["node-8"]);
}

/// A study `name` of `trials` grid trials over `param` running `command`
/// (a TOML array), one attempt each, maximising `score`.
fn failing_study(dir: &Path, name: &str, command: &str, param: &str, trials: u32) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        "name = \"{name}\"\ncommand = {command}\ntimeout = 60\nmax_attempts = 1\n[objective]\nmetric = \"score\"\n\
         direction = \"maximize\"\n[budget]\ntrials = {trials}\n[strategy]\nkind = \"grid\"\n\
         [hyper.{param}]\nkind = \"int\"\nlow = 1\nhigh = {trials}\n"
    );
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn failed_and_unranked_trials() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let mut output = Vec::new();
    // A workload whose import fails (with `torch` installed or not: the
    // module path is emptied first), on a real coordinator and agent.
    let crash = r#"["python3", "-c", "import sys; sys.path.clear(); import torch", "{x}"]"#;
    let crash = failing_study(d, "crash", crash, "x", 3);
    let root = unique_root("docs-crash");
    let log = d.join("crash.log");
    let (mut coord, url) = start_coordinator_logged(&crash, &d.join("s.db"), &root, &[], Some(&log));
    let agent = start_agent(&url, "crashy", &root, &[]);
    let status = coord.wait_exit(LONG);
    output.extend(coord.rest_of_stdout());
    output.extend(lines(&std::fs::read_to_string(&log).expect("log")));
    assert_eq!(status.code(), Some(4), "{output:?}");
    let (code, out) = run_lines(tf("tunefleet", d, &["best", "crash", "--store", "s.db"]));
    assert_eq!(code, Some(1), "{out:?}");
    output.extend(out);
    // A workload that prints `acc` where the study expects `score`.
    let acc = failing_study(d, "acc", r#"["sh", "-c", "echo TUNEFLEET final acc=0.{x}"]"#, "x", 2);
    let acc_log = d.join("acc.log");
    let (mut coord, _) = start_coordinator_logged(
        &acc,
        &d.join("s.db"),
        &root,
        &["--listen", url.trim_start_matches("mqtt://")],
        Some(&acc_log),
    );
    let status = coord.wait_exit(LONG);
    output.extend(coord.rest_of_stdout());
    output.extend(lines(&std::fs::read_to_string(&acc_log).expect("log")));
    assert_eq!(status.code(), Some(5), "nothing ranked: {output:?}");
    // A parameter nothing uses.
    let unused = failing_study(d, "crash-unused", r#"["true"]"#, "lr", 2);
    let (code, out, err) = run(tf("tunefleet", d, &["check", unused.to_str().expect("utf-8")]));
    assert_eq!(code, Some(0), "{err}");
    output.extend(lines(&format!("{out}{err}").replace("study crash-unused", "study crash")));
    check_quotes(TROUBLESHOOTING, SECTIONS[8], &output);
    drop(agent);
    assert_agents_spools_empty(&["crashy"]);
}
