//! What the page and its API read of an HTTP request's head.

/// The value of the header `name` (any case) in a request's head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The token of an `Authorization: Bearer` header.
pub fn bearer(head: &str) -> Option<&str> {
    header(head, "authorization").and_then(|v| v.strip_prefix("Bearer ")).map(str::trim)
}
