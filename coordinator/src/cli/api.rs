//! `tunefleet serve`'s HTTP JSON API, on the live page's listener
//! (`python/`'s `tunefleet.Client` speaks it; docs/API.md lists every
//! endpoint and error):
//!
//! * `GET /api/v1/studies`: every study as `status --json` has it;
//! * `GET /api/v1/studies/NAME`: one, with its strategy and search space;
//! * `GET /api/v1/studies/NAME/trials`: its trials as `export --format json`;
//! * `POST /api/v1/studies`: submit (`{"toml": TEXT}` or `{"study": {...}}`);
//! * `POST /api/v1/studies/NAME/cancel`, `.../enqueue` (`{"params": {...}}`);
//! * `POST /api/v1/studies/NAME/ask`: a trial to fill, for a study whose
//!   `[strategy] kind = "external"`: its space and how many more it takes;
//! * `POST /api/v1/studies/NAME/tell` (`{"params": {...}}`): the filled
//!   trial, answered with the trial numbers it became.
//!
//! Reads follow the page's rules (open on loopback, the page's token
//! beyond it). Writes run studies, so they always need a token in an
//! `Authorization: Bearer` header (never a cookie or a link, so another
//! site in the user's browser cannot forge one): the page's token, or the
//! one `serve` writes with its address to `api.json` beside its control
//! socket (mode 0600, in the socket's private directory). Writes go to
//! the service as `tunefleet submit` and `cancel` do.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::domain::study::ParamSpec;
use crate::runtime::control::{self, Answer, Ask, ControlError};
use crate::store::Store;

/// The largest request body (a study file).
pub const MAX_BODY: usize = 1 << 20;

/// What the API needs of its service.
#[derive(Debug, Clone)]
pub struct ApiContext {
    pub store: PathBuf,
    pub control: PathBuf,
    /// The token writes need (`api.json`'s).
    pub write_token: String,
    /// The page's token, which writes take too.
    pub page_token: Option<String>,
}

/// An answer: status and JSON body.
pub type Reply = (u16, String);

fn reply(status: u16, body: Value) -> Reply {
    (status, serde_json::to_string_pretty(&body).unwrap_or_else(|_| "{}".into()))
}

fn error(status: u16, message: impl std::fmt::Display) -> Reply {
    reply(status, json!({ "error": message.to_string() }))
}

/// Where the service whose control socket is `control` writes its API's
/// address and token: `api.json` beside the socket.
pub fn access_path(control: &Path) -> PathBuf {
    control.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).join("api.json")
}

/// Writes `{"url": ..., "token": ...}` to `api.json` beside the control
/// socket (mode 0600; the directory is the socket's private one).
pub fn write_access(control: &Path, url: &str, token: &str) -> std::io::Result<PathBuf> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = access_path(control);
    let dir = path.parent().unwrap_or(Path::new("."));
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let _ = std::fs::remove_file(&path);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    file.write_all(json!({ "url": url, "token": token }).to_string().as_bytes())?;
    Ok(path)
}

/// Whether `head` carries a token that opens writes.
fn may_write(head: &str, ctx: &ApiContext) -> bool {
    let Some(given) = super::http::bearer(head) else { return false };
    std::iter::once(ctx.write_token.as_str())
        .chain(ctx.page_token.as_deref())
        .any(|t| tunefleet_broker::same_secret(given.as_bytes(), t.as_bytes()))
}

/// Answers one API request (`path` under `/api/v1/`).
pub async fn route(method: &str, path: &str, head: &str, body: &[u8], ctx: &ApiContext) -> Reply {
    let Some(rest) = path.strip_prefix("/api/v1/studies") else {
        return error(404, format!("no endpoint {path}: see docs/API.md"));
    };
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    if let Some(name) = parts.first().filter(|n| !crate::domain::study::valid_study_name(n)) {
        return error(404, format!("no study {name:?}: a study's name is [a-z0-9_-]{{1,64}}"));
    }
    match method {
        "GET" => {
            let (store, parts) = (ctx.store.clone(), parts.iter().map(|p| p.to_string()).collect::<Vec<_>>());
            tokio::task::spawn_blocking(move || read(&store, &parts))
                .await
                .unwrap_or_else(|_| error(500, "the API failed"))
        }
        "POST" if !may_write(head, ctx) => error(
            401,
            "writes need the API's token in an Authorization: Bearer header (api.json beside the control socket, \
             or the page's token)",
        ),
        "POST" => {
            let body: Value = match body {
                [] => json!({}),
                b => match serde_json::from_slice(b) {
                    Ok(v) => v,
                    Err(e) => return error(400, format!("the body is not JSON: {e}")),
                },
            };
            write(&parts, &body, ctx).await
        }
        _ => error(405, "GET reads, POST writes"),
    }
}

/// A read: the store read only, as `status` and `export` read it.
fn read(store: &Path, parts: &[String]) -> Reply {
    let db = match Store::open_read_only(store) {
        Ok(db) => db,
        Err(e) => return error(500, format!("cannot read the store: {e}")),
    };
    let now = super::output::unix_now_ms();
    let result = match parts {
        [] => crate::query::status::snapshot(&db, None, now).map(|s| json!(s)).map_err(|e| error(500, e)),
        [name] => describe(&db, name, now),
        [name, t] if t == "trials" => match crate::query::export::json(&db, name) {
            Ok(rows) => Ok(Value::Array(rows)),
            Err(crate::store::StoreError::UnknownStudy(_)) => Err(error(404, format!("no study {name:?}"))),
            Err(e) => Err(error(500, e)),
        },
        _ => Err(error(404, "no such endpoint: see docs/API.md")),
    };
    match result {
        Ok(v) => reply(200, v),
        Err(r) => r,
    }
}

/// One study: its status, strategy, objective and space.
fn describe(db: &Store, name: &str, now: u64) -> Result<Value, Reply> {
    let status = crate::query::status::snapshot(db, Some(name), now).map_err(|e| error(500, e))?;
    let Some(status) = status.into_iter().next() else { return Err(error(404, format!("no study {name:?}"))) };
    let study = db.stored(name).map_err(|e| error(500, e))?.and_then(|s| s.study());
    let Some(study) = study else { return Err(error(404, format!("no study {name:?}"))) };
    let created = db.trials(name).map_err(|e| error(500, e))?.len() as u64;
    Ok(json!({
        "status": status,
        "strategy": strategy_name(&study.strategy),
        "metric": study.objective.metric,
        "direction": study.objective.direction,
        "also": study.objective.also,
        "repeats": study.repeats.max(1),
        "budget": study.budget,
        "created": created,
        "space": space(&study),
    }))
}

fn strategy_name(s: &crate::domain::study::Strategy) -> &'static str {
    use crate::domain::study::Strategy;
    match s {
        Strategy::Grid => "grid",
        Strategy::Random { .. } => "random",
        Strategy::Tpe { .. } => "tpe",
        Strategy::Gp { .. } => "gp",
        Strategy::External => "external",
    }
}

/// The searched parameters as the study file writes them.
fn space(study: &crate::domain::study::Study) -> Value {
    let value = |v: &tunefleet_common::params::ParamValue| crate::store::param_value_json(v);
    let params: serde_json::Map<String, Value> = study
        .searched()
        .into_iter()
        .map(|(name, spec)| {
            let described = match spec {
                ParamSpec::Categorical { values } => {
                    json!({ "kind": "categorical", "values": values.iter().map(value).collect::<Vec<_>>() })
                }
                ParamSpec::Int { low, high, step } => json!({ "kind": "int", "low": low, "high": high, "step": step }),
                ParamSpec::Float { low, high, .. } => json!({ "kind": "float", "low": low, "high": high }),
                ParamSpec::LogFloat { low, high, .. } => json!({ "kind": "log_float", "low": low, "high": high }),
            };
            (name, described)
        })
        .collect();
    Value::Object(params)
}

/// A write: to the service, as `submit`, `cancel` and `enqueue` send it.
async fn write(parts: &[&str], body: &Value, ctx: &ApiContext) -> Reply {
    let ask = match parts {
        [] => match submitted_text(body) {
            Ok(text) => Ask::Submit { study: text, origin: "the API".into() },
            Err(r) => return r,
        },
        [name, "cancel"] => Ask::Cancel { study: name.to_string() },
        [name, "enqueue"] | [name, "tell"] => {
            let params = match toml_params(body) {
                Ok(p) => p,
                Err(r) => return r,
            };
            match parts[1] {
                "tell" => Ask::Tell { study: name.to_string(), params },
                _ => Ask::Enqueue { study: name.to_string(), params },
            }
        }
        [name, "ask"] => return ask_trial(ctx, name).await,
        _ => return error(404, "no such endpoint: see docs/API.md"),
    };
    answered(control::ask_active(&ctx.control, &ctx.store, &ask).await)
}

fn answered(answer: Result<Answer, ControlError>) -> Reply {
    match answer {
        Ok(Answer::Ok { message }) => reply(200, json!({ "message": message })),
        Ok(Answer::Created { message, trials }) => reply(200, json!({ "message": message, "trials": trials })),
        Ok(Answer::Error { message }) if message.contains("not running") || message.contains("no study") => {
            error(404, message)
        }
        Ok(Answer::Error { message }) => error(409, message),
        Err(e @ ControlError::NotRunning { .. }) => error(503, e),
        Err(e) => error(502, e),
    }
}

/// The study file of a submit: `{"toml": TEXT}`, or `{"study": TABLE}` written as TOML.
fn submitted_text(body: &Value) -> Result<String, Reply> {
    if let Some(text) = body.get("toml").and_then(Value::as_str) {
        return Ok(text.to_string());
    }
    match body.get("study") {
        Some(study @ Value::Object(_)) => {
            toml::to_string(study).map_err(|e| error(400, format!("the study cannot be written as TOML: {e}")))
        }
        _ => Err(error(400, "submit takes {\"toml\": \"...\"} or {\"study\": {...}}")),
    }
}

/// `{"params": {NAME: VALUE}}` as (name, value as TOML).
fn toml_params(body: &Value) -> Result<Vec<(String, String)>, Reply> {
    let Some(params) = body.get("params").and_then(Value::as_object) else {
        return Err(error(400, "give {\"params\": {\"NAME\": VALUE, ...}}"));
    };
    let mut out = Vec::with_capacity(params.len());
    for (name, value) in params {
        if !crate::domain::study::valid_param_name(name) {
            return Err(error(400, format!("{name:?} is not a parameter's name")));
        }
        let text = match value {
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::String(s) => toml::Value::String(s.clone()).to_string(),
            other => return Err(error(400, format!("{name}: a number, a boolean or a string, not {other}"))),
        };
        out.push((name.clone(), text));
    }
    Ok(out)
}

/// A trial to fill for an external study: its space and how many
/// configurations it still takes (409 when none, or not external).
async fn ask_trial(ctx: &ApiContext, name: &str) -> Reply {
    let (store, name) = (ctx.store.clone(), name.to_string());
    let described = tokio::task::spawn_blocking(move || {
        let db = Store::open_read_only(&store).map_err(|e| error(500, format!("cannot read the store: {e}")))?;
        describe(&db, &name, super::output::unix_now_ms()).map(|d| (name, d))
    })
    .await
    .unwrap_or_else(|_| Err(error(500, "the API failed")));
    let (name, d) = match described {
        Ok(d) => d,
        Err(r) => return r,
    };
    if d["strategy"] != "external" {
        return error(
            409,
            format!("study {name} chooses its own configurations ([strategy] kind = {})", d["strategy"]),
        );
    }
    // `"told": true`: nothing more to ask, the sampler's loop ends.
    let told = |message: String| reply(409, json!({ "error": message, "told": true }));
    let state = d["status"]["state"].as_str().unwrap_or_default();
    if state != "running" {
        return told(format!("study {name} is {state}: it takes no configuration"));
    }
    let repeats = d["repeats"].as_u64().unwrap_or(1).max(1);
    let configs = d["budget"].as_u64().unwrap_or(0) / repeats;
    let left = configs.saturating_sub(d["created"].as_u64().unwrap_or(0) / repeats);
    if left == 0 {
        return told(format!("study {name} has every configuration its budget takes"));
    }
    reply(200, json!({ "study": name, "space": d["space"], "left": left, "params": {} }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_written_as_toml_values() {
        let body = json!({ "params": { "lr": 0.01, "n": 3, "opt": "a\"b'c", "on": true } });
        let p = toml_params(&body).expect("params");
        let text: String = p.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        let back: toml::Value = toml::from_str(&text).expect("TOML");
        assert_eq!(back["lr"].as_float(), Some(0.01));
        assert_eq!(back["n"].as_integer(), Some(3));
        assert_eq!(back["on"].as_bool(), Some(true));
        assert_eq!(back["opt"].as_str(), Some("a\"b'c"), "{text}");
        assert_eq!(toml_params(&json!({ "params": { "x": [1] } })).err().map(|r| r.0), Some(400));
        assert_eq!(toml_params(&json!({ "params": { "a b": 1 } })).err().map(|r| r.0), Some(400));
        assert_eq!(toml_params(&json!({})).err().map(|r| r.0), Some(400));
    }

    #[test]
    fn a_study_is_submitted_as_its_text_or_a_table() {
        assert_eq!(submitted_text(&json!({ "toml": "name = \"a\"" })).ok().as_deref(), Some("name = \"a\""));
        let table = json!({ "name": "a", "budget": { "trials": 4 } });
        let text = submitted_text(&json!({ "study": table })).expect("toml");
        let back: toml::Value = toml::from_str(&text).expect("parses");
        assert_eq!(back["budget"]["trials"].as_integer(), Some(4));
        assert_eq!(submitted_text(&json!({ "file": 1 })).err().map(|r| r.0), Some(400));
    }

    #[test]
    fn writes_need_a_bearer_token() {
        let ctx = ApiContext {
            store: "s.db".into(),
            control: "s.control/control.sock".into(),
            write_token: "w".repeat(32),
            page_token: Some("p".repeat(16)),
        };
        let head = |h: &str| format!("POST /api/v1/studies HTTP/1.1\r\n{h}\r\n");
        assert!(may_write(&head(&format!("Authorization: Bearer {}", "w".repeat(32))), &ctx));
        assert!(may_write(&head(&format!("authorization: Bearer {}", "p".repeat(16))), &ctx));
        assert!(!may_write(&head(&format!("Authorization: Bearer {}", "x".repeat(32))), &ctx));
        assert!(!may_write(&head(&format!("Cookie: tunefleet_page={}", "p".repeat(16))), &ctx), "never a cookie");
        assert!(!may_write(&head(""), &ctx));
    }

    #[test]
    fn errors_answer_with_their_status() {
        let r = answered(Ok(Answer::Error { message: "study x is not running on this service".into() }));
        assert_eq!(r.0, 404);
        assert_eq!(answered(Ok(Answer::Error { message: "study x has created all its trials".into() })).0, 409);
        let r = answered(Ok(Answer::Created { message: "told".into(), trials: vec![4, 5] }));
        assert_eq!(
            (r.0, serde_json::from_str::<Value>(&r.1).ok().map(|v| v["trials"].clone())),
            (200, Some(json!([4, 5])))
        );
        assert_eq!(answered(Err(ControlError::NotRunning { path: "x".into() })).0, 503);
    }
}
