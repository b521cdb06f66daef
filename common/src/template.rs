//! Command templates: `{name}` is replaced by the parameter `name`, `{{` and
//! `}}` stand for literal braces. An unknown name is an error, never an empty
//! string, so a typo in a study file is caught when the study is loaded.

use crate::params::Params;

/// What is wrong with a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unknown placeholder {{{name}}} in {template:?}")]
    Unknown { name: String, template: String },
    #[error("unclosed '{{' in {template:?}")]
    Unclosed { template: String },
    #[error("stray '}}' in {template:?} (write '}}}}' for a literal brace)")]
    Stray { template: String },
}

enum Piece<'a> {
    Text(&'a str),
    Brace(char),
    Name(&'a str),
}

fn pieces(template: &str) -> Result<Vec<Piece<'_>>, TemplateError> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push(Piece::Text(&rest[..i]));
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            out.push(Piece::Brace('{'));
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            out.push(Piece::Brace('}'));
            rest = after;
        } else if tail.starts_with('}') {
            return Err(TemplateError::Stray { template: template.into() });
        } else {
            let end = tail.find('}').ok_or_else(|| TemplateError::Unclosed { template: template.into() })?;
            out.push(Piece::Name(tail[1..end].trim()));
            rest = &tail[end + 1..];
        }
    }
    out.push(Piece::Text(rest));
    Ok(out)
}

/// The placeholder names a template uses, in order of appearance.
pub fn placeholders(template: &str) -> Result<Vec<String>, TemplateError> {
    Ok(pieces(template)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Name(n) => Some(n.to_string()),
            _ => None,
        })
        .collect())
}

/// Substitutes `params` into `template`.
pub fn render(template: &str, params: &Params) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(template.len() + 16);
    for piece in pieces(template)? {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Brace(c) => out.push(c),
            Piece::Name(n) => {
                let v = params
                    .get(n)
                    .ok_or_else(|| TemplateError::Unknown { name: n.to_string(), template: template.into() })?;
                out.push_str(&v.to_string());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ParamValue;

    fn params() -> Params {
        let mut p = Params::new();
        p.insert("lr".into(), ParamValue::Float(0.05));
        p.insert("batch".into(), ParamValue::Int(32));
        p.insert("opt".into(), ParamValue::Text("sgd".into()));
        p
    }

    #[test]
    fn substitutes_and_escapes() {
        assert_eq!(render("--lr={lr} -b {batch} {opt}", &params()).as_deref(), Ok("--lr=0.05 -b 32 sgd"));
        assert_eq!(render("{{literal}} {{{batch}}}", &params()).as_deref(), Ok("{literal} {32}"));
        assert_eq!(placeholders("{a}-{ b }").expect("parses"), vec!["a", "b"]);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = render("--x {nope}", &params()).expect_err("unknown");
        assert!(e.to_string().contains("{nope}"), "{e}");
        assert!(matches!(render("{lr", &params()), Err(TemplateError::Unclosed { .. })));
        assert!(matches!(render("lr}", &params()), Err(TemplateError::Stray { .. })));
    }
}
