//! The store's SQL, written for the dialect its backends share, made
//! PostgreSQL's where SQLite's habits differ: `?N` placeholders, 64-bit
//! `INTEGER` and `REAL` columns, `INSERT OR IGNORE`, `IFNULL`,
//! `group_concat`, scalar `max` and `min`, `IS` between values, `rowid`.
//! String literals are left as they are.

use std::sync::LazyLock;

use regex::Regex;

/// A rule: what to find and what to put instead.
struct Rule(Regex, &'static str);

fn rule(pattern: &str, with: &'static str) -> Rule {
    match Regex::new(pattern) {
        Ok(re) => Rule(re, with),
        // The patterns are constants, checked by the tests below.
        Err(e) => panic!("the dialect rule {pattern:?} does not compile: {e}"),
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        rule(r"\?(\d+)", "$$$1"),
        rule(r"(?i)\bBEGIN IMMEDIATE\b", "BEGIN"),
        rule(r"(?i)\bINTEGER PRIMARY KEY AUTOINCREMENT\b", "BIGSERIAL PRIMARY KEY"),
        rule(r"(?i)\bINTEGER PRIMARY KEY\b", "BIGSERIAL PRIMARY KEY"),
        rule(r"(?i)\bINTEGER\b", "BIGINT"),
        rule(r"(?i)\bREAL\b", "DOUBLE PRECISION"),
        rule(r"(?i)\bBLOB\b", "BYTEA"),
        rule(r"(?i)\bIFNULL\(", "COALESCE("),
        rule(r"(?i)\bgroup_concat\(", "string_agg("),
        rule(r"(?i)\bhex\(substr\(([^()]*)\)\)", "encode(substr($1), 'hex')"),
        rule(r"(?i)\bmax\(([^(),]+),([^(),]+)\)", "GREATEST($1,$2)"),
        rule(r"(?i)\bmin\(([^(),]+),([^(),]+)\)", "LEAST($1,$2)"),
        rule(r"(?i)\bIS NOT\s+(NULL\b)", "IS NOT $1"),
        rule(r"(?i)\bIS NOT\s+([^N\s])", "IS DISTINCT FROM $1"),
        rule(r"(?i)\bIS\s+([^NnD\s])", "IS NOT DISTINCT FROM $1"),
        rule(r"(?i)\bLIMIT -1\b", "LIMIT ALL"),
        rule(r"\browid\b", "ctid"),
    ]
});

static OR_IGNORE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)\bINSERT OR IGNORE INTO\b").unwrap_or_else(|e| panic!("the INSERT OR IGNORE rule: {e}"))
});

/// `sql` in PostgreSQL's dialect.
pub fn translate(sql: &str) -> String {
    // String literals aside, each replaced by a mark the rules leave alone.
    let mut code = String::with_capacity(sql.len());
    let mut literals = Vec::new();
    let mut rest = sql;
    while let Some(start) = rest.find('\'') {
        code.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        // A quote inside a literal is written twice.
        let mut end = 0;
        let bytes = after.as_bytes();
        loop {
            match after[end..].find('\'') {
                Some(i) if bytes.get(end + i + 1) == Some(&b'\'') => end += i + 2,
                Some(i) => {
                    end += i;
                    break;
                }
                None => {
                    end = after.len();
                    break;
                }
            }
        }
        literals.push(format!("'{}'", &after[..end.min(after.len())]));
        code.push_str(&format!("\u{1}{}\u{1}", literals.len() - 1));
        rest = after.get(end + 1..).unwrap_or("");
    }
    code.push_str(rest);
    let mut out = code;
    for Rule(re, with) in RULES.iter() {
        out = re.replace_all(&out, *with).into_owned();
    }
    // One statement per INSERT OR IGNORE (the store never batches them).
    if OR_IGNORE.is_match(&out) {
        out = OR_IGNORE.replace_all(&out, "INSERT INTO").into_owned();
        let trimmed = out.trim_end().trim_end_matches(';').to_string();
        out = format!("{trimmed} ON CONFLICT DO NOTHING");
    }
    let mut restored = String::with_capacity(out.len());
    let mut parts = out.split('\u{1}');
    if let Some(first) = parts.next() {
        restored.push_str(first);
    }
    while let (Some(index), Some(after)) = (parts.next(), parts.next()) {
        let literal = index.parse::<usize>().ok().and_then(|i| literals.get(i));
        restored.push_str(literal.map_or("", String::as_str));
        restored.push_str(after);
    }
    restored
}

#[cfg(test)]
mod tests {
    use super::translate;

    #[test]
    fn placeholders_types_and_sqlite_habits_become_postgresqls() {
        assert_eq!(translate("SELECT a FROM t WHERE s = ?1 AND n > ?12"), "SELECT a FROM t WHERE s = $1 AND n > $12");
        assert_eq!(
            translate("CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER NOT NULL, x REAL, k BLOB)"),
            "CREATE TABLE t (id BIGSERIAL PRIMARY KEY, n BIGINT NOT NULL, x DOUBLE PRECISION, k BYTEA)"
        );
        assert_eq!(
            translate("INSERT OR IGNORE INTO k (a, b) VALUES (?1, ?2)"),
            "INSERT INTO k (a, b) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        );
        assert_eq!(translate("SET seen = MAX(seen, ?3)"), "SET seen = GREATEST(seen, $3)");
        assert_eq!(translate("SELECT MAX(trial) FROM t"), "SELECT MAX(trial) FROM t");
        assert_eq!(translate("IFNULL(LENGTH(c), 0)"), "COALESCE(LENGTH(c), 0)");
        assert_eq!(translate("lower(hex(substr(public, 1, 8)))"), "lower(encode(substr(public, 1, 8), 'hex'))");
        assert_eq!(
            translate("f.attempt IS NOT r.attempt AND x IS NOT NULL"),
            "f.attempt IS DISTINCT FROM r.attempt AND x IS NOT NULL"
        );
        assert_eq!(translate("a IS ?2 OR b IS NULL"), "a IS NOT DISTINCT FROM $2 OR b IS NULL");
        assert_eq!(translate("ORDER BY at_ms, rowid LIMIT -1 OFFSET ?1"), "ORDER BY at_ms, ctid LIMIT ALL OFFSET $1");
    }

    #[test]
    fn string_literals_are_left_as_they_are() {
        assert_eq!(
            translate("SELECT 'a ?1 INTEGER it''s' || x FROM t WHERE y = ?1"),
            "SELECT 'a ?1 INTEGER it''s' || x FROM t WHERE y = $1"
        );
        assert_eq!(translate("WHERE state = 'done' OR state = 'REAL'"), "WHERE state = 'done' OR state = 'REAL'");
    }
}
