//! The crates' layout stays as the house wants it: no import
//! circle between the modules of a crate, and no source file over
//! [`MAX_LINES`] lines before its tests.
//!
//! A module is a file. Module `A` imports module `B` when `A` names a path
//! that resolves to `B`'s file: `crate::x::y…`, `super::…`, `self::…`, or a
//! path that starts with one of `A`'s own child modules (`child::f()`), in
//! `use` lines and in expressions alike. Not counted:
//!
//! * anything under `#[cfg(test)]` (a test module's `use super::*` is how a
//!   test reaches what it tests, not a layer's dependency);
//! * comments, doc comments and string literals (a doc link is not an import);
//! * a parent's `mod child;` declarations, and a parent's `pub use` of an
//!   item of its own descendants (`pub use start::RunnerConfig;`) that the
//!   parent's code does not name again: that is the parent being its
//!   children's façade, the children's items seen from outside, and no use
//!   of them by the parent itself. A parent calling into a child (through
//!   a re-exported name too), or a child naming `super::…`, counts;
//! * the binaries' roots (`main.rs`, `src/bin/`), crates of their own that
//!   see the library from outside.
//!
//! No function of the product code of `common`, `agent` and `coordinator`
//! has more than [`MAX_FN_LINES`] lines unless its doc comment says why in a
//! line with `Long because` (test code does not count).
//!
//! The coordinator is being restructured while these checks are new; its
//! remaining circles, oversized files and long functions are listed in
//! [`ALLOWED_CIRCLES`], [`ALLOWED_OVERSIZED`] and [`ALLOWED_LONG`] (printed
//! by the tests: the to-do list). The tests fail on anything not listed, and
//! on a listed item that is no longer a problem, so the lists only shrink.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most lines a source file may have before its first top-level `#[cfg(test)]`.
const MAX_LINES: usize = 800;

/// Crates whose module graph is checked, relative to the workspace root.
const CRATES: [&str; 7] = ["common", "broker", "search", "agent", "coordinator", "examples/workloads", "tests"];

/// Import circles still to break, each as its modules' files, sorted
/// (none: the last, gp's files naming `Gp` through `super::`, was broken
/// by the unit cube they now take, `search/src/gp/cube.rs`).
const ALLOWED_CIRCLES: &[&[&str]] = &[];

/// Files still over [`MAX_LINES`] lines before their tests.
const ALLOWED_OVERSIZED: &[&str] = &[];

/// One crate's module files: path under `src/` → source text.
type Tree = BTreeMap<String, String>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    Ident(usize, usize),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `text` that matter for paths: identifiers (keywords
/// included), `::` and single punctuation; comments, strings, chars,
/// lifetimes and numbers are dropped.
fn lex(text: &str) -> Vec<Tok> {
    lex_at(text).into_iter().map(|(_, t)| t).collect()
}

/// [`lex`]'s tokens, each with the byte offset it starts at.
fn lex_at(text: &str) -> Vec<(usize, Tok)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0usize;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && raw_string_end(b, i + 1).is_some() {
            i = raw_string_end(b, i + 1).unwrap_or(b.len());
        } else if c == b'b' && b.get(i + 1) == Some(&b'r') && raw_string_end(b, i + 2).is_some() {
            i = raw_string_end(b, i + 2).unwrap_or(b.len());
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == b'\'' {
            // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
            if b.get(i + 1) == Some(&b'\\') {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                // A lifetime or a multi-byte char: skip the quote, the
                // name is lexed (and harmless) as an identifier.
                let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + ch) == Some(&b'\'') {
                    i += 2 + ch;
                } else {
                    i += 1;
                }
            }
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((start, Tok::Ident(start, i)));
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                if b[i] == b'.' && !b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    break;
                }
                i += 1;
            }
        } else if c == b':' && b.get(i + 1) == Some(&b':') {
            out.push((i, Tok::Sep));
            i += 2;
        } else {
            if !c.is_ascii_whitespace() {
                out.push((i, Tok::Punct(char::from(c))));
            }
            i += 1;
        }
    }
    out
}

/// Where a raw string starting at `b[i]` (`#`s then `"`) ends, if it is one.
fn raw_string_end(b: &[u8], mut i: usize) -> Option<usize> {
    let mut hashes = 0;
    while b.get(i) == Some(&b'#') {
        hashes += 1;
        i += 1;
    }
    if b.get(i) != Some(&b'"') {
        return None;
    }
    i += 1;
    while i < b.len() {
        if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&h| h == b'#').count() == hashes {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(b.len())
}

/// The module path of a file under `src/` (`runner/mod.rs` → `runner`,
/// `lib.rs` → the root), or none for a binary's root.
fn module_of(file: &str) -> Option<Vec<String>> {
    if file == "main.rs" || file.starts_with("bin/") {
        return None;
    }
    let stem = file.strip_suffix(".rs")?;
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    Some(parts)
}

/// A path as written: its segments and, when it sits in a `pub use`, the
/// name it is re-exported under (none for a glob).
struct Named {
    segments: Vec<String>,
    reexport: Option<Option<String>>,
}

/// What a file names outside its `#[cfg(test)]` items.
struct Names {
    /// Each path, with the inline module (`mod imp { … }`) it was named in,
    /// relative to the file.
    paths: Vec<(Vec<String>, Named)>,
    /// How often each identifier occurs.
    idents: BTreeMap<String, usize>,
}

/// The paths and identifiers a file names outside `#[cfg(test)]` items.
fn names(text: &str) -> Names {
    let toks = lex(text);
    let word = |t: Tok| match t {
        Tok::Ident(s, e) => Some(&text[s..e]),
        _ => None,
    };
    let mut out = Vec::new();
    let mut idents: BTreeMap<String, usize> = BTreeMap::new();
    // Inline modules open, with the brace depth their body starts at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        if let Some(w) = word(toks[i]) {
            *idents.entry(w.to_string()).or_default() += 1;
        }
        match toks[i] {
            Tok::Punct('#') if is_cfg_test(&toks, i, &word) => {
                i = skip_item(&toks, skip_attribute(&toks, i));
                continue;
            }
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            Tok::Ident(..) if word(toks[i]) == Some("mod") => {
                if let (Some(name), Some(Tok::Punct('{'))) = (toks.get(i + 1).and_then(|t| word(*t)), toks.get(i + 2)) {
                    inline.push((name.to_string(), depth + 1));
                    depth += 1;
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(..) if word(toks[i]) == Some("use") => {
                let public = i > 0 && visibility_before(&toks, i, &word);
                let mut trees = Vec::new();
                let end = use_tree(&toks, i + 1, &word, Vec::new(), &mut trees);
                for t in &toks[i + 1..end] {
                    if let Some(w) = word(*t) {
                        *idents.entry(w.to_string()).or_default() += 1;
                    }
                }
                let at: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                out.extend(
                    trees
                        .into_iter()
                        .map(|(segments, name)| (at.clone(), Named { segments, reexport: public.then_some(name) })),
                );
                i = end;
                continue;
            }
            Tok::Ident(..) => {
                let previous_is_sep = i > 0 && toks[i - 1] == Tok::Sep;
                if !previous_is_sep && toks.get(i + 1) == Some(&Tok::Sep) {
                    let mut segments = Vec::new();
                    let mut j = i;
                    while let Some(w) = toks.get(j).and_then(|t| word(*t)) {
                        segments.push(w.to_string());
                        if toks.get(j + 1) != Some(&Tok::Sep) {
                            break;
                        }
                        j += 2;
                    }
                    for w in &segments[1..] {
                        *idents.entry(w.clone()).or_default() += 1;
                    }
                    let at = inline.iter().map(|(n, _)| n.clone()).collect();
                    out.push((at, Named { segments, reexport: None }));
                    i = j + 1;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    Names { paths: out, idents }
}

/// Whether the `use` at `i` is preceded by `pub` (or `pub(…)`).
fn visibility_before<'a>(toks: &[Tok], i: usize, word: &impl Fn(Tok) -> Option<&'a str>) -> bool {
    match toks[i - 1] {
        Tok::Ident(..) => word(toks[i - 1]) == Some("pub"),
        Tok::Punct(')') => toks[..i].iter().rev().take(6).any(|t| word(*t) == Some("pub")),
        _ => false,
    }
}

/// Whether the attribute at `i` (`#`) is `#[cfg(test)]`.
fn is_cfg_test<'a>(toks: &[Tok], i: usize, word: &impl Fn(Tok) -> Option<&'a str>) -> bool {
    matches!(
        (
            toks.get(i + 1),
            toks.get(i + 2).and_then(|t| word(*t)),
            toks.get(i + 3),
            toks.get(i + 4).and_then(|t| word(*t)),
            toks.get(i + 5),
            toks.get(i + 6)
        ),
        (
            Some(Tok::Punct('[')),
            Some("cfg"),
            Some(Tok::Punct('(')),
            Some("test"),
            Some(Tok::Punct(')')),
            Some(Tok::Punct(']'))
        )
    )
}

/// The token after the attribute starting at `i` (`#[ … ]`).
fn skip_attribute(toks: &[Tok], i: usize) -> usize {
    let mut depth = 0usize;
    let mut j = i + 1;
    while j < toks.len() {
        match toks[j] {
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            _ => {}
        }
        j += 1;
    }
    j
}

/// The token after the item starting at `i`: through its `;` or its
/// balanced `{ … }`, whichever comes first at the top level.
fn skip_item(toks: &[Tok], mut i: usize) -> usize {
    // Further attributes of the same item.
    while toks.get(i) == Some(&Tok::Punct('#')) {
        i = skip_attribute(toks, i);
    }
    let mut depth = 0usize;
    while i < toks.len() {
        match toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Parses the use tree at `i` under `prefix`, adding each leaf path to
/// `out` with the name it brings in (its last segment or its `as` alias;
/// none for a glob; `self` in a group is the group's own path); returns
/// the token after the tree (after the `;` at the top level).
fn use_tree<'a>(
    toks: &[Tok],
    mut i: usize,
    word: &impl Fn(Tok) -> Option<&'a str>,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut path = prefix;
    let mut alias: Option<String> = None;
    loop {
        match toks.get(i) {
            Some(Tok::Sep) => i += 1,
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Punct('}')) => {
                            i += 1;
                            break;
                        }
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        Some(_) => i = use_tree(toks, i, word, path.clone(), out),
                    }
                }
                if toks.get(i) == Some(&Tok::Punct(';')) {
                    i += 1;
                }
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push((path, None));
                return i + 1 + usize::from(toks.get(i + 1) == Some(&Tok::Punct(';')));
            }
            Some(t) if word(*t).is_some() => {
                let w = word(*t).unwrap_or_default();
                if w == "as" {
                    alias = toks.get(i + 1).and_then(|t| word(*t)).map(str::to_string);
                    i += 2;
                    continue;
                }
                if w == "self" && !path.is_empty() {
                    i += 1;
                    continue;
                }
                path.push(w.to_string());
                i += 1;
            }
            Some(Tok::Punct(';')) => {
                let name = alias.or_else(|| path.last().cloned());
                out.push((path, name));
                return i + 1;
            }
            // `,` or `}` of an enclosing group: this leaf ends here.
            Some(_) | None => {
                let name = alias.or_else(|| path.last().cloned());
                out.push((path, name));
                return i;
            }
        }
    }
}

/// The module graph of one crate: each module file → the module files it
/// imports (never itself).
fn graph(tree: &Tree) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeMap<Vec<String>, String> =
        tree.keys().filter_map(|f| module_of(f).map(|m| (m, f.clone()))).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, text) in tree {
        let Some(here) = module_of(file) else { continue };
        let targets = edges.entry(file.clone()).or_default();
        let Names { paths, idents } = names(text);
        for (inline, named) in paths {
            let mut at = here.clone();
            at.extend(inline);
            let Some(absolute) = resolve(&at, &named.segments, &modules) else { continue };
            // The longest prefix that is a module file.
            let target = (0..=absolute.len()).rev().find_map(|n| modules.get(&absolute[..n]));
            let Some(target) = target else { continue };
            let is_descendant = module_of(target).is_some_and(|t| t.len() > here.len() && t.starts_with(&here));
            // A façade's re-export, unless the file names the item again.
            let facade = match &named.reexport {
                Some(Some(name)) => idents.get(name).copied().unwrap_or(0) <= 1,
                Some(None) => true,
                None => false,
            };
            if target == file || (facade && is_descendant) {
                continue;
            }
            targets.insert(target.clone());
        }
    }
    edges
}

/// `segments` named in module `at`, as a path from the crate root; none
/// when it leads outside the crate (another crate, `std`, a local name).
fn resolve(at: &[String], segments: &[String], modules: &BTreeMap<Vec<String>, String>) -> Option<Vec<String>> {
    let first = segments.first()?;
    let mut base: Vec<String> = at.to_vec();
    let rest = match first.as_str() {
        "crate" => {
            base.clear();
            &segments[1..]
        }
        "self" => &segments[1..],
        "super" => {
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            rest
        }
        // A child module of this one, named without `self::`.
        name => {
            let mut child = at.to_vec();
            child.push(name.to_string());
            if !modules.contains_key(&child) || segments.len() < 2 {
                return None;
            }
            segments
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        let edges = s.edges;
        for w in edges.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(lw));
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low[v];
                s.low.insert(v, lv.min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found.sort();
    s.found
}

/// Lines before the first top-level `#[cfg(test)]` (all of them without
/// one): a `#[cfg(test)]` inside an item (a switch in a function, a test
/// field) does not end the product code, so no file hides its lines behind one.
fn lines_before_tests(text: &str) -> usize {
    text.lines().take_while(|l| !l.starts_with("#[cfg(test)]")).count()
}

/// The files that are test code: a file its parent declares under
/// `#[cfg(test)]` (`#[cfg(test)] mod tests;`), and the files under it.
fn test_only(tree: &Tree) -> BTreeSet<String> {
    let modules: BTreeMap<Vec<String>, String> =
        tree.keys().filter_map(|f| module_of(f).map(|m| (m, f.clone()))).collect();
    let mut declared: BTreeSet<Vec<String>> = BTreeSet::new();
    for (file, text) in tree {
        let Some(here) = module_of(file) else { continue };
        let toks = lex(text);
        let word = |t: Tok| match t {
            Tok::Ident(s, e) => Some(&text[s..e]),
            _ => None,
        };
        for i in 0..toks.len() {
            if toks[i] != Tok::Punct('#') || !is_cfg_test(&toks, i, &word) {
                continue;
            }
            let mut j = skip_attribute(&toks, i);
            while toks.get(j) == Some(&Tok::Punct('#')) {
                j = skip_attribute(&toks, j);
            }
            if toks.get(j).and_then(|t| word(*t)) == Some("pub") {
                j += 1;
            }
            if let (Some("mod"), Some(name), Some(Tok::Punct(';'))) =
                (toks.get(j).and_then(|t| word(*t)), toks.get(j + 1).and_then(|t| word(*t)), toks.get(j + 2))
            {
                let mut m = here.clone();
                m.push(name.to_string());
                declared.insert(m);
            }
        }
    }
    modules.into_iter().filter(|(m, _)| declared.iter().any(|d| m.starts_with(d))).map(|(_, f)| f).collect()
}

/// Every `.rs` file under `dir`, as path relative to `dir` → text.
fn read_tree(dir: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let rel = path.strip_prefix(dir).unwrap_or(&path).to_string_lossy().replace('\\', "/");
                tree.insert(rel, text);
            }
        }
    }
    tree
}

/// What is wrong, judged against what is allowed: each circle and oversized
/// file not allowed, and each allowed one that is gone.
fn judge(
    circles: &[Vec<String>],
    oversized: &[(String, usize)],
    allowed_circles: &[&[&str]],
    allowed_oversized: &[&str],
) -> Vec<String> {
    let allowed_c: BTreeSet<Vec<String>> =
        allowed_circles.iter().map(|c| c.iter().map(|s| s.to_string()).collect()).collect();
    let found_c: BTreeSet<Vec<String>> = circles.iter().cloned().collect();
    let mut problems = Vec::new();
    for c in found_c.difference(&allowed_c) {
        problems.push(format!("import circle: {}", c.join(" → ")));
    }
    for c in allowed_c.difference(&found_c) {
        problems.push(format!("allowed circle no longer found (remove it from ALLOWED_CIRCLES): {}", c.join(", ")));
    }
    problems.extend(judge_listed(
        oversized,
        allowed_oversized,
        |f, n| format!("{f}: {n} lines before its tests (at most {MAX_LINES})"),
        |f| format!("{f}: no longer oversized (remove it from ALLOWED_OVERSIZED)"),
    ));
    problems
}

/// What is wrong with the items `found` (each with its lines) judged
/// against a list of those `allowed` for now that may only shrink: each
/// not allowed (said by `unlisted`), and each allowed one no longer found
/// (said by `gone`).
fn judge_listed(
    found: &[(String, usize)],
    allowed: &[&str],
    unlisted: impl Fn(&str, usize) -> String,
    gone: impl Fn(&str) -> String,
) -> Vec<String> {
    let allowed: BTreeSet<&str> = allowed.iter().copied().collect();
    let names: BTreeSet<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
    let mut problems: Vec<String> =
        found.iter().filter(|(f, _)| !allowed.contains(f.as_str())).map(|(f, n)| unlisted(f, *n)).collect();
    problems.extend(allowed.difference(&names).map(|f| gone(f)));
    problems
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

#[test]
fn no_import_circle_and_no_oversized_file() {
    let root = workspace();
    let mut found_circles = Vec::new();
    let mut oversized = Vec::new();
    for krate in CRATES {
        let src = root.join(krate).join("src");
        if !src.is_dir() {
            continue;
        }
        let tree = read_tree(&src);
        assert!(tree.contains_key("lib.rs") || tree.contains_key("main.rs"), "{}: no crate root", src.display());
        for c in circles(&graph(&tree)) {
            found_circles.push(c.iter().map(|m| format!("{krate}/src/{m}")).collect::<Vec<_>>());
        }
        let tests = test_only(&tree);
        for (file, text) in tree.iter().filter(|(f, _)| !tests.contains(*f)) {
            let n = lines_before_tests(text);
            if n > MAX_LINES {
                oversized.push((format!("{krate}/src/{file}"), n));
            }
        }
    }
    found_circles.sort();
    oversized.sort();
    println!(
        "To do: {} circles and {} oversized files allowed for now",
        ALLOWED_CIRCLES.len(),
        ALLOWED_OVERSIZED.len()
    );
    for c in ALLOWED_CIRCLES {
        println!("  circle: {}", c.join(" → "));
    }
    for f in ALLOWED_OVERSIZED {
        println!("  oversized: {f}");
    }
    let problems = judge(&found_circles, &oversized, ALLOWED_CIRCLES, ALLOWED_OVERSIZED);
    let current_circles: Vec<String> = found_circles
        .iter()
        .map(|c| format!("    &[{}],", c.iter().map(|m| format!("{m:?}")).collect::<Vec<_>>().join(", ")))
        .collect();
    let current_oversized: Vec<String> = oversized.iter().map(|(f, n)| format!("    {f:?}, // {n} lines")).collect();
    assert!(
        problems.is_empty(),
        "the layout check failed:\n  {}\n\nwhat is found now:\nconst ALLOWED_CIRCLES: &[&[&str]] = &[\n{}\n];\nconst ALLOWED_OVERSIZED: &[&str] = &[\n{}\n];",
        problems.join("\n  "),
        current_circles.join("\n"),
        current_oversized.join("\n"),
    );
}

/// The coordinator's layers, lowest first ([`upward`]): a file may import
/// only from its own layer and the ones before it. The crate root and
/// `main.rs` stand above them all.
const LAYERS: [&str; 5] = ["domain/", "store/", "runtime/", "query/ report/", "cli/"];

/// The engine decides and stores; the transport, the control socket and
/// the InfluxDB sink are I/O around it and import the engine, never the
/// reverse: no file of the engine's folder uses them (its async
/// shell, which sends and takes requests, is `runtime/shell.rs`, beside it).
const ENGINE: &str = "runtime/engine/";
const AROUND_THE_ENGINE: [&str; 3] = ["runtime/transport.rs", "runtime/control.rs", "runtime/sink/"];

/// The layer of a coordinator file, by its folder.
fn layer(file: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.split(' ').any(|prefix| file.starts_with(prefix)))
}

/// Each import of the coordinator's `edges` that goes up a layer, or from
/// the engine to what is around it, as `from → to`.
fn upward(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for (from, targets) in edges {
        for to in targets {
            let up = matches!((layer(from), layer(to)), (Some(a), Some(b)) if b > a);
            let out_of_engine = from.starts_with(ENGINE) && AROUND_THE_ENGINE.iter().any(|a| to.starts_with(a));
            if up || out_of_engine {
                found.push(format!("{from} → {to}"));
            }
        }
    }
    found
}

#[test]
fn the_coordinators_layers_import_only_downwards() {
    let src = workspace().join("coordinator/src");
    let tree = read_tree(&src);
    // Test code wires the real parts together.
    let tests = test_only(&tree);
    let edges: BTreeMap<String, BTreeSet<String>> =
        graph(&tree).into_iter().filter(|(f, _)| !tests.contains(f)).collect();
    let found = upward(&edges);
    assert!(found.is_empty(), "imports that go up a layer or out of the engine:\n  {}", found.join("\n  "));
}

/// Most lines a function may have (its `fn` line to its closing brace)
/// without a line of its doc comment that starts to say why: `Long because`.
const MAX_FN_LINES: usize = 100;

/// The crates whose product code is held to [`MAX_FN_LINES`].
const LONG_FN_CRATES: [&str; 5] = ["common", "broker", "search", "agent", "coordinator"];

/// Functions still over [`MAX_FN_LINES`] lines without a reason, as
/// `path::name` (none left: the list only shrinks).
const ALLOWED_LONG: &[&str] = &[];

/// Each function of `text` outside `#[cfg(test)]` items over `max` lines
/// whose doc comment has no line containing `Long because`: its name and
/// its lines.
fn long_functions(text: &str, max: usize) -> Vec<(String, usize)> {
    let at = lex_at(text);
    let toks: Vec<Tok> = at.iter().map(|(_, t)| *t).collect();
    let word = |t: Tok| match t {
        Tok::Ident(s, e) => Some(&text[s..e]),
        _ => None,
    };
    let line_of = |offset: usize| text[..offset].matches('\n').count();
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == Tok::Punct('#') && is_cfg_test(&toks, i, &word) {
            i = skip_item(&toks, skip_attribute(&toks, i));
            continue;
        }
        let name = toks.get(i + 1).and_then(|t| word(*t));
        if let (Some("fn"), Some(name)) = (word(toks[i]), name) {
            if let Some(body) = fn_body(&toks, i + 2) {
                let (first, last) = (line_of(at[i].0), line_of(at[skip_item(&toks, body) - 1].0));
                let n = last - first + 1;
                if n > max && !doc_says_why(&lines, first) {
                    found.push((name.to_string(), n));
                }
            }
        }
        i += 1;
    }
    found
}

/// The `{` that opens the body of the function whose signature starts at
/// `i`, or none for a declaration without one (`fn f();` in a trait). A `;`
/// inside brackets (`-> [u8; 4]`) does not end the signature.
fn fn_body(toks: &[Tok], mut i: usize) -> Option<usize> {
    let mut depth = 0usize;
    while let Some(t) = toks.get(i) {
        match t {
            Tok::Punct('(' | '[') => depth += 1,
            Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
            Tok::Punct('{') if depth == 0 => return Some(i),
            Tok::Punct(';') if depth == 0 => return None,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether the doc comment above line `fn_line` (through the item's
/// attributes) has a line containing `Long because`.
fn doc_says_why(lines: &[&str], fn_line: usize) -> bool {
    lines[..fn_line]
        .iter()
        .rev()
        .map(|l| l.trim_start())
        .take_while(|l| l.starts_with("///") || l.starts_with("#["))
        .any(|l| l.starts_with("///") && l.contains("Long because"))
}

/// What is wrong with the long functions `found` (`path::name`, lines),
/// judged against `allowed`: each not allowed, and each allowed one that is
/// no longer long.
fn judge_long(found: &[(String, usize)], allowed: &[&str]) -> Vec<String> {
    judge_listed(
        found,
        allowed,
        |f, n| format!("{f}: {n} lines (at most {MAX_FN_LINES} without a `Long because` line in its doc comment)"),
        |f| format!("{f}: no longer long (remove it from ALLOWED_LONG)"),
    )
}

#[test]
fn no_long_function_without_a_reason() {
    let root = workspace();
    let mut found = Vec::new();
    for krate in LONG_FN_CRATES {
        let tree = read_tree(&root.join(krate).join("src"));
        assert!(!tree.is_empty(), "{krate}/src: no source");
        let tests = test_only(&tree);
        for (file, text) in tree.iter().filter(|(f, _)| !tests.contains(*f)) {
            for (name, n) in long_functions(text, MAX_FN_LINES) {
                found.push((format!("{krate}/src/{file}::{name}"), n));
            }
        }
    }
    found.sort();
    found.dedup_by(|a, b| a.0 == b.0);
    println!("To do: {} long functions allowed for now", ALLOWED_LONG.len());
    for f in ALLOWED_LONG {
        println!("  long: {f}");
    }
    let problems = judge_long(&found, ALLOWED_LONG);
    let current: Vec<String> = found.iter().map(|(f, n)| format!("    {f:?}, // {n} lines")).collect();
    assert!(
        problems.is_empty(),
        "long functions:\n  {}\n\nwhat is found now:\nconst ALLOWED_LONG: &[&str] = &[\n{}\n];",
        problems.join("\n  "),
        current.join("\n"),
    );
}

/// Lines of `text`'s product code (before its first top-level
/// `#[cfg(test)]`) where a `#[cfg(test)]` or `#[cfg(not(test))]` switches a
/// statement inside a function: a test's path through product code that
/// the shipped binary never takes. A test-only item (a helper method) is
/// not a switch.
fn test_switches(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().take(lines_before_tests(text)).collect();
    let item = |l: &str| {
        let l = l.trim_start();
        let l = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub(super) ")).unwrap_or(l);
        let l = l.strip_prefix("pub ").unwrap_or(l);
        [
            "fn ",
            "const ",
            "async fn ",
            "mod ",
            "use ",
            "impl",
            "struct ",
            "enum ",
            "type ",
            "static ",
            "trait ",
            "#[",
            "///",
            "//",
        ]
        .iter()
        .any(|k| l.starts_with(k))
    };
    let mut found = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim();
        if (t == "#[cfg(test)]" || t == "#[cfg(not(test))]") && l.starts_with(' ') {
            let next = lines[i + 1..].iter().find(|n| !n.trim().starts_with("#[") && !n.trim().starts_with("//"));
            if next.is_some_and(|n| !item(n)) {
                found.push(i + 1);
            }
        }
    }
    found
}

/// No product function takes a test-only path: a yardstick the tests
/// check against is a setting or a type of its own, not a `#[cfg(test)]`
/// switch inside a hot path.
#[test]
fn no_test_switch_inside_a_product_function() {
    let root = workspace();
    let mut found = Vec::new();
    for krate in CRATES {
        let tree = read_tree(&root.join(krate).join("src"));
        let tests = test_only(&tree);
        for (file, text) in tree.iter().filter(|(f, _)| !tests.contains(*f)) {
            for line in test_switches(text) {
                found.push(format!("{krate}/src/{file}:{line}"));
            }
        }
    }
    assert!(found.is_empty(), "test switches inside product functions: {found:?}");
}

/// The store's queries are written once, against its seam
/// (`store/sql/`): no product file of the coordinator outside that folder
/// names a database library, so a backend is a file there, not a copy of
/// the store.
#[test]
fn only_the_stores_seam_names_a_database_library() {
    let src = workspace().join("coordinator/src");
    let tree = read_tree(&src);
    let tests = test_only(&tree);
    let naming: Vec<&String> = tree
        .iter()
        .filter(|(f, _)| !tests.contains(*f) && !f.starts_with("store/sql/"))
        .filter(|(_, text)| text.lines().take(lines_before_tests(text)).any(|l| l.contains("rusqlite")))
        .map(|(f, _)| f)
        .collect();
    assert!(tree.contains_key("store/sql/mod.rs"), "the seam is where this test looks");
    assert!(naming.is_empty(), "files outside store/sql/ name rusqlite: {naming:?}");
}

/// Every file or folder that docs/ARCHITECTURE.md names in backquotes
/// (`engine/gate.rs`, `sink/`) is one of the workspace's: the page says
/// where things are, and a test holds it to it.
#[test]
fn the_architecture_page_names_only_paths_that_exist() {
    let root = workspace();
    let mut known: BTreeSet<String> = BTreeSet::new();
    for krate in CRATES.iter().chain(&["tests/tests"]) {
        let dir = root.join(krate);
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&d) else { continue };
            for e in entries.flatten() {
                let path = e.path();
                let rel = path.strip_prefix(&root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
                if path.is_dir() {
                    known.insert(format!("{rel}/"));
                    stack.push(path);
                } else {
                    known.insert(rel);
                }
            }
        }
    }
    let text = std::fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap_or_else(|e| panic!("{e}"));
    let cited: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.contains(' ') && (t.ends_with(".rs") || (t.ends_with('/') && t.len() > 1)))
        .collect();
    assert!(cited.len() > 20, "the page cites paths: {cited:?}");
    let missing: Vec<&&str> =
        cited.iter().filter(|c| !known.iter().any(|k| k == *c || k.ends_with(&format!("/{c}")))).collect();
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md names paths that do not exist: {missing:?}");
}

#[cfg(test)]
mod checks {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> Tree {
        files.iter().map(|(f, t)| (f.to_string(), t.to_string())).collect()
    }

    fn circles_of(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        circles(&graph(&tree(files)))
    }

    #[test]
    fn a_use_line_and_an_expression_path_make_a_circle() {
        let found = circles_of(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
            ("a.rs", "use crate::b::Thing;\npub fn f() {}\n"),
            ("b.rs", "pub struct Thing;\nfn g() { crate::a::f(); crate::c::h(); }\n"),
            ("c.rs", "pub fn h() {}\n"),
        ]);
        assert_eq!(found, vec![vec!["a.rs".to_string(), "b.rs".to_string()]]);
    }

    #[test]
    fn super_self_groups_and_child_paths_resolve_to_files() {
        let found = circles_of(&[
            ("lib.rs", "pub mod run;\n"),
            ("run/mod.rs", "mod start;\nmod control;\npub fn go() { start::spawn(); }\n"),
            ("run/start.rs", "use super::{control::{self, Handle}, go};\npub fn spawn() {}\n"),
            ("run/control.rs", "pub struct Handle;\n"),
        ]);
        assert_eq!(found, vec![vec!["run/mod.rs".to_string(), "run/start.rs".to_string()]]);
        let edges = graph(&tree(&[
            ("lib.rs", "pub mod run;\n"),
            ("run/mod.rs", "mod start;\nmod control;\n"),
            ("run/start.rs", "use super::control::{self};\nfn f() { self::g(); }\nfn g() {}\n"),
            ("run/control.rs", "pub struct Handle;\n"),
        ]));
        assert_eq!(edges["run/start.rs"], BTreeSet::from(["run/control.rs".to_string()]));
    }

    #[test]
    fn tests_comments_strings_and_facade_reexports_do_not_count() {
        let found = circles_of(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub use a::Thing;\n"),
            (
                "a.rs",
                "//! See [`crate::b::g`].\npub struct Thing;\n/* crate::b::g() */\nconst S: &str = \"crate::b::g\";\n\
                 const R: &str = r#\"crate::b::g\"#;\nconst C: char = '\"';\n\
                 #[cfg(test)]\nmod tests {\n    use crate::b::g;\n}\n",
            ),
            ("b.rs", "use crate::a::Thing;\npub fn g() {}\n#[cfg(test)]\nuse crate::a::Other;\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
        // The same façade calling into its child is a dependency.
        let found =
            circles_of(&[("lib.rs", "pub mod a;\nfn f() { a::g(); }\n"), ("a.rs", "pub fn g() { crate::h(); }\n")]);
        assert_eq!(found, vec![vec!["a.rs".to_string(), "lib.rs".to_string()]]);
        // So is a façade using what it re-exports.
        let found = circles_of(&[
            ("lib.rs", "pub mod a;\npub use a::{g as go, Thing};\nfn f() { go(); }\n"),
            ("a.rs", "pub struct Thing;\npub fn g() { crate::h(); }\n"),
        ]);
        assert_eq!(found, vec![vec!["a.rs".to_string(), "lib.rs".to_string()]]);
    }

    #[test]
    fn inline_modules_resolve_super_from_where_they_are() {
        // `super` inside `mod imp { … }` is the file's own module: no edge.
        let edges = graph(&tree(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            ("a.rs", "mod imp {\n    use super::X;\n    fn f() { super::super::b::g(); }\n}\npub struct X;\n"),
            ("b.rs", "pub fn g() {}\n"),
        ]));
        assert_eq!(edges["a.rs"], BTreeSet::from(["b.rs".to_string()]));
    }

    #[test]
    fn a_file_over_the_limit_before_its_tests_is_oversized() {
        let body = |n: usize| "fn f() {}\n".repeat(n);
        assert_eq!(lines_before_tests(&body(MAX_LINES)), MAX_LINES);
        let long_tests = format!("{}#[cfg(test)]\nmod tests {{\n{}}}\n", body(MAX_LINES), body(500));
        assert_eq!(lines_before_tests(&long_tests), MAX_LINES, "tests do not count");
        assert_eq!(lines_before_tests(&body(MAX_LINES + 1)), MAX_LINES + 1);
        // A switch inside a function is no place for the product code to end (gp.rs hid 255 lines so).
        let switch = format!("fn g() {{\n    #[cfg(test)]\n    let x = 1;\n}}\n{}", body(MAX_LINES));
        assert_eq!(lines_before_tests(&switch), MAX_LINES + 4, "an indented cfg(test) does not count");
        // Through the whole check, on a temp tree on disk.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("big")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(src.join("lib.rs"), "pub mod big;\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(src.join("big/mod.rs"), body(MAX_LINES + 1)).unwrap_or_else(|e| panic!("{e}"));
        let tree = read_tree(&src);
        let oversized: Vec<(String, usize)> =
            tree.iter().map(|(f, t)| (f.clone(), lines_before_tests(t))).filter(|(_, n)| *n > MAX_LINES).collect();
        assert_eq!(oversized, vec![("big/mod.rs".to_string(), MAX_LINES + 1)]);
        assert_eq!(judge(&[], &oversized, &[], &[]).len(), 1);
        let statement = "fn g() {\n    #[cfg(test)]\n    let x = 1;\n}\n";
        assert_eq!(test_switches(statement), vec![2], "a switched statement is found");
        let helper = "impl A {\n    #[cfg(test)]\n    pub fn only_in_tests(&self) {}\n}\n";
        assert!(test_switches(helper).is_empty(), "a test-only method is an item, not a switch");
    }

    #[test]
    fn a_file_declared_under_cfg_test_is_test_code() {
        let found = test_only(&tree(&[
            ("lib.rs", "pub mod engine;\nmod plain;\n"),
            ("engine/mod.rs", "mod core;\n#[cfg(test)]\nmod tests;\n"),
            ("engine/core.rs", "pub fn f() {}\n"),
            ("engine/tests.rs", "mod rig;\n"),
            ("engine/tests/rig.rs", "fn r() {}\n"),
            ("plain.rs", "#[cfg(test)]\nmod tests {\n}\n"),
        ]));
        assert_eq!(found, BTreeSet::from(["engine/tests.rs".to_string(), "engine/tests/rig.rs".to_string()]));
    }

    #[test]
    fn an_upward_import_and_the_engine_reaching_out_are_found() {
        let edges = graph(&tree(&[
            ("lib.rs", "pub mod domain;\npub mod store;\npub mod runtime;\n"),
            ("domain/mod.rs", "pub fn d() {}\n"),
            ("store/mod.rs", "use crate::domain::d;\nuse crate::runtime::auth::Known;\n"),
            ("runtime/mod.rs", "pub mod auth;\npub mod engine;\npub mod shell;\npub mod transport;\n"),
            ("runtime/shell.rs", "use crate::runtime::engine::Inbound;\nuse crate::runtime::transport::Wire;\n"),
            ("runtime/auth.rs", "pub struct Known;\n"),
            ("runtime/transport.rs", "pub use crate::runtime::engine::Inbound as In;\nfn f(_: In) {}\n"),
            ("runtime/engine/mod.rs", "mod core;\nuse crate::runtime::transport::Wire;\npub enum Inbound {}\n"),
            ("runtime/engine/core.rs", "fn f() { crate::runtime::transport::send(); }\n"),
        ]));
        assert_eq!(
            upward(&edges),
            vec![
                "runtime/engine/core.rs → runtime/transport.rs".to_string(),
                "runtime/engine/mod.rs → runtime/transport.rs".to_string(),
                "store/mod.rs → runtime/auth.rs".to_string()
            ],
            "the shell beside the engine may send; no file of the engine may"
        );
    }

    #[test]
    fn a_long_function_is_found_unless_its_doc_says_why_or_it_is_test_code() {
        let body =
            |name: &str, n: usize| format!("fn {name}() -> [u8; 2] {{\n{}    [0; 2]\n}}\n", "    f();\n".repeat(n));
        let text = format!(
            "/// Plain.\n{}\n/// Parses it.\n///\n/// Long because one match of many arms reads best whole.\n#[inline]\n{}\n\
             {}\ntrait T {{\n    fn declared(&self);\n}}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            body("long", MAX_FN_LINES),
            body("reasoned", MAX_FN_LINES),
            body("short", MAX_FN_LINES - 3),
            body("in_tests", MAX_FN_LINES),
        );
        assert_eq!(long_functions(&text, MAX_FN_LINES), vec![("long".to_string(), MAX_FN_LINES + 3)]);
        // The whole check on a temp tree: a test-only file does not count.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
        let src = dir.path().join("src");
        std::fs::create_dir_all(&src).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(src.join("lib.rs"), format!("pub mod a;\n#[cfg(test)]\nmod tests;\n{}", body("root", 0)))
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(src.join("a.rs"), body("big", MAX_FN_LINES)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(src.join("tests.rs"), body("helper", MAX_FN_LINES)).unwrap_or_else(|e| panic!("{e}"));
        let tree = read_tree(&src);
        let tests = test_only(&tree);
        let found: Vec<(String, usize)> = tree
            .iter()
            .filter(|(f, _)| !tests.contains(*f))
            .flat_map(|(f, t)| long_functions(t, MAX_FN_LINES).into_iter().map(move |(n, l)| (format!("{f}::{n}"), l)))
            .collect();
        assert_eq!(found, vec![("a.rs::big".to_string(), MAX_FN_LINES + 3)]);
        assert!(judge_long(&found, &["a.rs::big"]).is_empty());
        assert_eq!(judge_long(&found, &[]).len(), 1, "unlisted");
        let gone = judge_long(&[], &["a.rs::big"]);
        assert!(gone.len() == 1 && gone[0].contains("remove it"), "{gone:?}");
    }

    #[test]
    fn the_allowlist_only_shrinks() {
        let circles = [vec!["x/src/a.rs".to_string(), "x/src/b.rs".to_string()]];
        let big = [("x/src/c.rs".to_string(), MAX_LINES + 5)];
        let allowed_c: &[&[&str]] = &[&["x/src/a.rs", "x/src/b.rs"]];
        assert!(judge(&circles, &big, allowed_c, &["x/src/c.rs"]).is_empty());
        let unlisted = judge(&circles, &big, &[], &[]);
        assert_eq!(unlisted.len(), 2, "{unlisted:?}");
        let gone = judge(&[], &[], allowed_c, &["x/src/c.rs"]);
        assert_eq!(gone.len(), 2, "{gone:?}");
        assert!(gone.iter().all(|p| p.contains("remove it")), "{gone:?}");
    }
}
