//! `tunefleet serve`'s HTTP JSON API with a real service and agent: a
//! study submitted, described, followed and cancelled over HTTP, writes
//! refused without the token `api.json` holds, and a study whose
//! configurations come from outside (`[strategy] kind = "external"`):
//! asked, told, run by the fleet, each told configuration once.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use tunefleet_tests::*;

const EXTERNAL: &str = r#"name = "ext"
command = ["sh", "-c", "echo '{{\"event\":\"final\",\"loss\":{x}}}'"]
timeout = 30
[objective]
metric = "loss"
direction = "minimize"
[budget]
trials = 4
[strategy]
kind = "external"
[hyper.x]
kind = "float"
low = 0.0
high = 1.0
[hyper.n]
kind = "int"
low = 1
high = 4
"#;

/// `METHOD path` with `headers` and `body`: status and JSON body.
fn http(addr: &str, method: &str, path: &str, headers: &str, body: &str) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    )
    .expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    (code, serde_json::from_str(body).unwrap_or(Value::Null))
}

struct Api {
    addr: String,
    auth: String,
}

impl Api {
    fn get(&self, path: &str) -> (u16, Value) {
        http(&self.addr, "GET", path, "", "")
    }
    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        http(&self.addr, "POST", path, &self.auth, &body.to_string())
    }
}

/// `tunefleet serve` with its page on a free port: the process, its broker, and its API as `api.json` says.
fn serve(store: &Path, root: &str) -> (Proc, String, Api) {
    let (service, broker) = start_service(store, root, &[]);
    let access = tunefleet_coordinator::runtime::control::default_path(store).with_file_name("api.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&access).expect("api.json").permissions());
    assert_eq!(mode & 0o777, 0o600, "the token is the service user's alone");
    let (url, token) = api_access(store);
    let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    (service, broker, Api { addr, auth: format!("Authorization: Bearer {token}\r\n") })
}

#[test]
fn an_outside_sampler_asks_and_tells_and_the_fleet_runs_each_configuration_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("api.db");
    let root = unique_root("api");
    let (mut service, broker, api) = serve(&store, &root);
    let _agent = start_agent(&broker, "api-a", &root, &[]);

    // Writes need the token, in a header.
    let submit = json!({ "toml": EXTERNAL });
    let (code, body) = http(&api.addr, "POST", "/api/v1/studies", "", &submit.to_string());
    assert_eq!(code, 401, "{body}");
    let (code, _) = http(&api.addr, "POST", "/api/v1/studies", "Authorization: Bearer nope\r\n", &submit.to_string());
    assert_eq!(code, 401);
    let (code, body) = api.post("/api/v1/studies", &submit);
    assert_eq!(code, 200, "{body}");

    let (code, study) = api.get("/api/v1/studies/ext");
    assert_eq!(code, 200, "{study}");
    assert_eq!(study["strategy"], "external");
    assert_eq!(study["space"]["x"], json!({ "kind": "float", "low": 0.0, "high": 1.0 }));
    assert_eq!(study["space"]["n"], json!({ "kind": "int", "low": 1, "high": 4, "step": 1 }));
    // Nothing told yet: the study says what it waits for.
    wait_for("the study to say it waits for its sampler", Duration::from_secs(15), || {
        api.get("/api/v1/studies").1[0]["waits"].as_str().is_some_and(|w| w.contains("outside sampler"))
    });

    // A configuration must set every parameter, inside its space.
    let (code, body) = api.post("/api/v1/studies/ext/tell", &json!({ "params": { "x": 0.5 } }));
    assert_eq!((code, body["error"].as_str().is_some_and(|e| e.contains("missing: n"))), (409, true), "{body}");
    let (code, body) = api.post("/api/v1/studies/ext/tell", &json!({ "params": { "x": 5.0, "n": 1 } }));
    assert_eq!(code, 409, "{body}");
    let (code, body) = api.post("/api/v1/studies/ext/tell", &json!({ "params": { "x": [1], "n": 1 } }));
    assert_eq!(code, 400, "{body}");

    let told = [(0.25, 1), (0.75, 2), (0.5, 3), (0.125, 4)];
    let mut numbers = Vec::new();
    for (i, (x, n)) in told.iter().enumerate() {
        let (code, ask) = api.post("/api/v1/studies/ext/ask", &json!({}));
        assert_eq!(code, 200, "{ask}");
        assert_eq!(ask["left"], json!(told.len() - i), "{ask}");
        assert!(ask["space"]["x"].is_object());
        let (code, answer) = api.post("/api/v1/studies/ext/tell", &json!({ "params": { "x": x, "n": n } }));
        assert_eq!(code, 200, "{answer}");
        numbers.extend(answer["trials"].as_array().expect("trials").iter().filter_map(Value::as_u64));
    }
    assert_eq!(numbers, vec![0, 1, 2, 3], "a trial a configuration, numbered as told");
    let (code, body) = api.post("/api/v1/studies/ext/ask", &json!({}));
    assert_eq!(code, 409, "the budget is told: {body}");
    let (code, body) = api.post("/api/v1/studies/ext/tell", &json!({ "params": { "x": 0.1, "n": 1 } }));
    assert_eq!(code, 409, "{body}");

    wait_for("every told trial to finish", Duration::from_secs(60), || {
        api.get("/api/v1/studies/ext").1["status"]["state"] == "finished"
    });
    let (code, trials) = api.get("/api/v1/studies/ext/trials");
    assert_eq!(code, 200);
    let trials = trials.as_array().expect("rows");
    assert_eq!(trials.len(), told.len(), "each told configuration once");
    for (t, (x, n)) in trials.iter().zip(told) {
        assert_eq!(
            (t["state"].as_str(), t["params"]["x"].as_f64(), t["params"]["n"].as_i64()),
            (Some("done"), Some(x), Some(n))
        );
        assert_eq!(t["objective"].as_f64(), Some(x), "the fleet ran what was told");
        assert!(t["energy_source"].is_string(), "metered as any trial: {t}");
    }

    // A study that chooses its own configurations is not told them; a
    // running one is cancelled over the API; errors say what is wrong.
    let own = sleep_study(dir.path(), "own", 50, 2.0);
    let text = std::fs::read_to_string(&own).expect("study");
    assert_eq!(api.post("/api/v1/studies", &json!({ "toml": text })).0, 200);
    let (code, body) = api.post("/api/v1/studies/own/tell", &json!({ "params": { "v": 1 } }));
    assert_eq!((code, body["error"].as_str().is_some_and(|e| e.contains("external"))), (409, true), "{body}");
    let (code, body) = api.post("/api/v1/studies/own/ask", &json!({}));
    assert_eq!(code, 409, "{body}");
    let (code, body) = api.post("/api/v1/studies/own/cancel", &json!({}));
    assert_eq!(code, 200, "{body}");
    wait_for("the cancelled study to end", Duration::from_secs(30), || {
        matches!(api.get("/api/v1/studies/own").1["status"]["state"].as_str(), Some("cancelled" | "finished"))
    });
    assert_eq!(api.get("/api/v1/studies/nope").0, 404);
    assert_eq!(api.get("/api/v1/studies/Bad%20Name").0, 404);
    assert_eq!(http(&api.addr, "POST", "/api/v1/studies", &api.auth, "{not json").0, 400);
    // A body over 1 MiB is refused from its declared length, unread.
    let mut s = std::net::TcpStream::connect(&api.addr).expect("connect");
    write!(s, "POST /api/v1/studies HTTP/1.1\r\nContent-Length: 4194304\r\n{}\r\n", api.auth).expect("head");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    assert!(text.starts_with("HTTP/1.1 413 "), "{text}");
    assert_eq!(http(&api.addr, "DELETE", "/api/v1/studies/ext", &api.auth, "").0, 405);
    // A name that points elsewhere (DNS rebinding) reads nothing of an open page.
    let mut s = std::net::TcpStream::connect(&api.addr).expect("connect");
    write!(s, "GET /api/v1/studies HTTP/1.1\r\nHost: rebound.example:80\r\n\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    assert!(text.starts_with("HTTP/1.1 401 "), "{text}");
    // A second service on the same store is refused before it writes its own api.json.
    let access = tunefleet_coordinator::runtime::control::default_path(&store).with_file_name("api.json");
    let before = std::fs::read_to_string(&access).expect("api.json");
    let (code, _, err) = run({
        let mut c = Command::new(bin("tunefleet"));
        c.args(["serve", "--listen", "127.0.0.1:0", "--page", "127.0.0.1:0"]).arg("--store").arg(&store);
        c.env("XDG_STATE_HOME", state_home());
        c
    });
    assert_ne!(code, Some(0), "{err}");
    assert_eq!(std::fs::read_to_string(&access).expect("api.json"), before, "the running service's address and token");
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    assert!(!access.exists(), "its token ends with the service");
    assert_agents_spools_empty(&["api-a"]);
}
