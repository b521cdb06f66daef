//! `tunefleet serve`'s live page in a real headless Chromium: the
//! fleet and a study a real agent ran, with the numbers `status --json` and
//! `agents --json` give; a screenshot kept as an artifact; beyond loopback
//! only with a token.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunefleet_tests::*;

fn cli(store: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(args).arg("--store").arg(store).env("XDG_STATE_HOME", state_home());
    run(cmd)
}

fn json(store: &Path, args: &[&str]) -> serde_json::Value {
    let (code, out, err) = cli(store, args);
    assert_eq!(code, Some(0), "{err}");
    serde_json::from_str(&out).expect("json")
}

/// `GET path` on `addr` (`127.0.0.1:PORT`): status code and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let (code, _, body) = get_with(addr, path, "");
    (code, body)
}

/// `GET path` with `headers` (each line ending in CRLF): status code, head and body.
fn get_with(addr: &str, path: &str, headers: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}\r\n").expect("request");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("response");
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").map(|(h, b)| (h.to_string(), b.to_string())).unwrap_or_default();
    (code, head, body)
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("artifact dir");
    dir
}

/// `tunefleet serve` with `extra` flags: the process, its page's URL and its broker's.
fn serve(store: &Path, root: &str, extra: &[&str]) -> (Proc, String, String) {
    let (service, broker) = start_service(store, root, extra);
    (service, api_access(store).0, broker)
}

/// The text of the element with `id` in `dom` (its first text).
fn by_id<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the page"));
    let rest = &dom[at..];
    let start = rest.find('>').expect("tag end") + 1;
    let end = rest[start..].find('<').expect("text end");
    &rest[start..start + end]
}

#[test]
fn the_live_page_shows_the_fleet_and_the_studies_as_status_does() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("page.db");
    let root = unique_root("page");
    let (mut service, url, broker) = serve(&store, &root, &["--page", "127.0.0.1:0"]);
    let addr = url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let agents = ["page-a", "page-b"];
    let _procs: Vec<Proc> = agents.iter().map(|n| start_agent(&broker, n, &root, &[])).collect();
    let study = sleep_study(dir.path(), "paged", 6, 0.1);
    let (code, _, err) = cli(&store, &["submit", study.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    wait_for("the study to finish", Duration::from_secs(60), || {
        json(&store, &["status", "--json"])[0]["done"].as_u64() == Some(6)
    });
    // An agent that trusts the coordinator but has no token: refused, told why, listed on the page.
    let (code, key, err) = {
        let mut cmd = Command::new(bin("tunefleet"));
        cmd.arg("key").env("XDG_STATE_HOME", state_home());
        run(cmd)
    };
    assert_eq!(code, Some(0), "{err}");
    let _stranger = start_agent(&broker, "page-stranger", &root, &["--coordinator-key", key.trim()]);
    wait_for("the stranger refused", Duration::from_secs(30), || {
        let (code, body) = get(&addr, "/status.json");
        code == 200 && body.contains("\"name\": \"page-stranger\"")
    });
    wait_for("both agents online", Duration::from_secs(30), || {
        json(&store, &["agents", "--json"])
            .as_array()
            .is_some_and(|a| a.iter().filter(|r| r["online"] == true).count() == 2)
    });

    // The page Chromium builds has the numbers status --json has.
    let status = json(&store, &["status", "--json"]);
    let dom = chromium::dump_dom_url(&url, Duration::from_secs(60));
    assert!(dom.success, "chromium failed:\n{}", dom.stderr);
    assert_eq!(dom.console_lines(), Vec::<&str>::new());
    let row_at = dom.stdout.find("data-study=\"paged\"").expect("the study's row");
    let row = &dom.stdout[row_at..row_at + dom.stdout[row_at..].find("</tr>").expect("row end")];
    assert!(row.contains(&format!("<td class=\"n done\">{}</td>", status[0]["done"])), "{row}");
    assert!(row.contains(&format!("<td class=\"n failed\">{}</td>", status[0]["failed"])), "{row}");
    let best = &status[0]["best"];
    assert!(row.contains(&format!("v={:.6} (trial {})", best[0].as_f64().expect("best"), best[1])), "{row}");
    assert_eq!(by_id(&dom.stdout, "agents-online"), "2");
    let refused_at = dom.stdout.find("data-refused=\"page-stranger\"").expect("the refused agent's row");
    let refused = &dom.stdout[refused_at..refused_at + dom.stdout[refused_at..].find("</tr>").expect("row end")];
    assert!(
        refused.contains("join token") || refused.contains("not enrolled") || refused.contains("unknown"),
        "{refused}"
    );
    for a in agents {
        assert!(dom.stdout.contains(&format!("data-agent=\"{a}\"><td>{a}</td><td class=\"online\">online</td>")));
    }
    // The study's history: every trial a dot, the best so far a line.
    let fig_at = dom.stdout.find("data-history=\"paged\"").expect("the study's history");
    let fig = &dom.stdout[fig_at..fig_at + dom.stdout[fig_at..].find("</figure>").expect("figure end")];
    assert!(fig.contains("v of 6 trials") && fig.contains("id=\"history-0\""), "{fig}");
    let dots = fig.split("class=\"dot\" d=\"").nth(1).and_then(|d| d.split('"').next()).expect("the dots");
    assert_eq!(dots.matches("h0").count(), 6, "a dot per trial: {dots}");
    assert!(fig.contains("class=\"best\""), "{fig}");
    // status.json is the same snapshot.
    let (code, body) = get(&addr, "/status.json");
    assert_eq!(code, 200);
    let live: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(live["studies"][0]["done"], status[0]["done"]);
    assert_eq!(live["agents"].as_array().map(Vec::len), Some(2));
    // The study's report, linked from the page.
    let (code, body) = get(&addr, "/report/paged");
    assert_eq!(code, 200);
    assert!(body.contains("<title>") && body.contains("paged"));
    assert_eq!(get(&addr, "/nothing").0, 404);

    let png = artifacts().join("live-page.png");
    let _ = std::fs::remove_file(&png);
    let shot = chromium::screenshot_url(&url, &png, (1280, 900), Duration::from_secs(60));
    assert!(shot.success, "chromium failed:\n{}", shot.stderr);
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(bytes.len() > 10_000, "a page of tables, not a blank one: {} bytes", bytes.len());
    eprintln!("live page screenshot: {} ({} bytes)", png.display(), bytes.len());

    // The page as a browser holds it, then the service stops: the page
    // says so, with the time of its last update, instead of going on
    // showing the fleet as it was (before, the failed fetch was swallowed).
    let (code, held) = get(&addr, "/");
    assert_eq!(code, 200);
    assert!(held.contains("id=\"updated\""), "a last-updated time");
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    let page = dir.path().join("held.html");
    std::fs::write(&page, &held).expect("page");
    let dom = chromium::dump_dom_after(&page, 5_000, Duration::from_secs(60));
    assert!(dom.success, "chromium failed:\n{}", dom.stderr);
    let at = dom.stdout.find("id=\"stale\"").expect("the banner");
    let banner = &dom.stdout[at..at + dom.stdout[at..].find("</p>").expect("banner end")];
    assert!(!banner.contains("hidden") && banner.contains("Not updated since"), "{banner}");
    let png = artifacts().join("live-page-stale.png");
    let shot = chromium::screenshot_after(&page, &png, (1280, 600), 5_000, Duration::from_secs(60));
    assert!(shot.success, "chromium failed:\n{}", shot.stderr);
    assert_agents_spools_empty(&agents);
}

#[test]
fn beyond_loopback_the_page_asks_for_its_token() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("token.db");
    let (code, _, err) = cli(&store, &["serve", "--listen", "127.0.0.1:0", "--page", "0.0.0.0:0"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--page-token-file"), "{err}");

    let token_file = dir.path().join("page.token");
    std::fs::write(&token_file, "a-token-of-enough-length\n").expect("token");
    let root = unique_root("page-token");
    let (mut service, url, _) =
        serve(&store, &root, &["--page", "0.0.0.0:0", "--page-token-file", token_file.to_str().expect("utf-8")]);
    let port = url.rsplit(':').next().expect("port").trim_end_matches('/');
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(get(&addr, "/status.json").0, 401);
    assert_eq!(get(&addr, "/status.json?token=wrong-token-of-enough").0, 401);
    let (code, head, body) = get_with(&addr, "/?token=a-token-of-enough-length", "");
    assert_eq!(code, 200);
    assert!(
        head.contains("Set-Cookie: tunefleet_page=a-token-of-enough-length; HttpOnly; SameSite=Strict"),
        "the token is kept in a cookie: {head}"
    );
    assert!(!body.contains("a-token-of-enough-length"), "no link carries the token");
    let cookie = "Cookie: tunefleet_page=a-token-of-enough-length\r\n";
    assert_eq!(get_with(&addr, "/status.json", cookie).0, 200, "the cookie opens the page");
    assert_eq!(get_with(&addr, "/status.json", "Cookie: tunefleet_page=a-token-of-enough-lengtX\r\n").0, 401);
    let bearer = "Authorization: Bearer a-token-of-enough-length\r\n";
    assert_eq!(get_with(&addr, "/status.json", bearer).0, 200);
    // The embedded broker's counters, as Prometheus text.
    assert_eq!(get(&addr, "/metrics").0, 401, "behind the token too");
    let (code, _, metrics) = get_with(&addr, "/metrics", cookie);
    assert_eq!(code, 200);
    assert!(metrics.contains("tunefleet_broker_embedded 1"), "{metrics}");
    let connections = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tunefleet_broker_connections "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("a connections gauge");
    assert!(connections >= 1, "the coordinator's own connection at least: {metrics}");
    assert!(metrics.contains("# TYPE tunefleet_broker_dropped_total counter"), "{metrics}");
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
}

/// A study over a float, an int and a choice, minimising a loss it reports
/// epoch by epoch, with energy as a second objective.
const VIEWS_STUDY: &str = r#"name = "views"
command = ["awk", "-v", "x={x}", "-v", "n={n}", "-v", "k={kind}", 'BEGIN {{ b = (k == "slow") ? 1 : 0; for (e = 1; e <= 3; e++) printf "{{\"event\":\"epoch\",\"epoch\":%d,\"loss\":%.6f}}\n", e, (x - 0.3) ^ 2 + n / 10 + b + 1 / e; printf "{{\"event\":\"final\",\"loss\":%.6f}}\n", (x - 0.3) ^ 2 + n / 10 + b; print "trained on " k }}']
timeout = 60
[objective]
metric = "loss"
direction = "minimize"
also = ["energy"]
[budget]
trials = 16
[strategy]
kind = "random"
seed = 3
[hyper.x]
kind = "float"
low = 0.0
high = 1.0
[hyper.n]
kind = "int"
low = 1
high = 4
[hyper.kind]
kind = "categorical"
values = ["fast", "slow"]
"#;

/// The `data-NAME="..."` attribute's value in `html` after `from`.
fn attr<'a>(html: &'a str, from: &str, name: &str) -> &'a str {
    let at = html.find(from).unwrap_or_else(|| panic!("no {from}"));
    let rest = &html[at..];
    let start = rest.find(&format!("{name}=\"")).unwrap_or_else(|| panic!("no {name} after {from}")) + name.len() + 2;
    &rest[start..start + rest[start..].find('"').expect("attribute end")]
}

#[test]
fn a_study_s_views_draw_export_s_numbers_in_chromium() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("views.db");
    let root = unique_root("views");
    let (mut service, url, broker) = serve(&store, &root, &["--page", "127.0.0.1:0"]);
    let _agent = start_agent(&broker, "views-a", &root, &[]);
    let study = dir.path().join("views.toml");
    std::fs::write(&study, VIEWS_STUDY).expect("study");
    let (code, _, err) = cli(&store, &["submit", study.to_str().expect("utf-8")]);
    assert_eq!(code, Some(0), "{err}");
    wait_for("the study to finish", Duration::from_secs(90), || {
        json(&store, &["status", "--json"])[0]["done"].as_u64() == Some(16)
    });
    let export = json(&store, &["export", "views", "--format", "json"]);
    let trials = export.as_array().expect("trials");
    assert_eq!(trials.len(), 16);

    let dom = chromium::dump_dom_url(&format!("{url}study/views"), Duration::from_secs(60));
    assert!(dom.success, "chromium failed:\n{}", dom.stderr);
    assert_eq!(dom.console_lines(), Vec::<&str>::new());
    let html = &dom.stdout;
    for id in ["history", "importance", "slice", "parallel", "contour", "curves", "pareto", "trials"] {
        assert!(html.contains(&format!("<section id=\"view-{id}\">")), "view {id} missing");
    }
    // Every number as export has it: each trial's objective in the table,
    // a dot or a line per trial in every plot, the best by the one rule.
    let table = &html[html.find("<table id=\"trials\">").expect("the trial table")..];
    for t in trials {
        let at = table.find(&format!("<tr data-trial=\"{}\">", t["trial"])).expect("a row a trial");
        let cell = table[at..].split("<td class=\"n objective\">").nth(1).and_then(|c| c.split('<').next());
        assert_eq!(cell.and_then(|c| c.parse::<f64>().ok()), t["objective"].as_f64(), "trial {}", t["trial"]);
    }
    for (from, what) in [("data-slice=\"x\"", "x"), ("data-slice=\"kind\"", "kind"), ("id=\"contour\"", "contour")] {
        assert_eq!(attr(html, from, "data-points"), "16", "{what}");
    }
    let history = &html[html.find("id=\"view-history\"").expect("history")..];
    let dots = history.split("class=\"dot\" d=\"").nth(1).and_then(|d| d.split('"').next()).expect("dots");
    assert_eq!(dots.matches("h0").count(), 16);
    assert_eq!(html.matches("class=\"pc\"").count(), 16, "a line a trial");
    assert_eq!(html.matches("class=\"curve\"").count(), 16, "a learning curve a trial");
    assert!(html.contains("class=\"bar\" data-name=\"x\""), "x matters: it has a bar");
    let best = trials.iter().find(|t| t["rank"] == 1).expect("a best trial");
    assert_eq!(by_id(html, "best-value").parse::<f64>().ok(), best["objective"].as_f64());
    // The front of loss and energy, as export's numbers make it.
    let points: Vec<(u64, f64, f64)> = trials
        .iter()
        .filter(|t| t["energy_valid"] == true)
        .map(|t| {
            (
                t["trial"].as_u64().expect("trial"),
                t["energy_j"].as_f64().expect("J"),
                t["objective"].as_f64().expect("loss"),
            )
        })
        .collect();
    let mut front: Vec<u64> = points
        .iter()
        .filter(|p| !points.iter().any(|q| q.1 <= p.1 && q.2 <= p.2 && (q.1 < p.1 || q.2 < p.2)))
        .map(|p| p.0)
        .collect();
    let mut drawn: Vec<u64> =
        attr(html, "data-front=\"energy\"", "data-front-trials").split(' ').filter_map(|t| t.parse().ok()).collect();
    front.sort_unstable();
    drawn.sort_unstable();
    assert!(!front.is_empty());
    assert_eq!(drawn, front);

    // The best trial's detail, opened from the table.
    let detail_url = format!("{url}study/views/trial/{}", best["trial"]);
    assert!(table.contains(&format!("href=\"/study/views/trial/{}\"", best["trial"])));
    let detail = chromium::dump_dom_url(&detail_url, Duration::from_secs(60));
    assert!(detail.success, "chromium failed:\n{}", detail.stderr);
    let d = &detail.stdout;
    assert_eq!(by_id(d, "trial-objective").parse::<f64>().ok(), best["objective"].as_f64());
    assert_eq!(Some(by_id(d, "energy-source")), best["energy_source"].as_str());
    assert_eq!(by_id(d, "energy-j").parse::<f64>().ok(), best["measurement"]["energy"]["joules"].as_f64());
    let kind = best["params"]["kind"].as_str().expect("kind");
    assert_eq!(by_id(d, "log-tail").trim(), format!("trained on {kind}"), "{d}");
    assert!(d.contains(&format!("<tr><th>kind</th><td>{kind}</td></tr>")), "{d}");

    // Screenshots: the views at 1400 px and on a phone, a trial's detail.
    for (name, target, size) in [
        ("study-views-1400.png", format!("{url}study/views"), (1400, 4200)),
        ("study-views-phone.png", format!("{url}study/views"), (390, 7000)),
        ("study-trial.png", detail_url.clone(), (1400, 1400)),
    ] {
        let png = artifacts().join(name);
        let _ = std::fs::remove_file(&png);
        let shot = chromium::screenshot_url(&target, &png, size, Duration::from_secs(60));
        assert!(shot.success, "chromium failed:\n{}", shot.stderr);
        let bytes = std::fs::read(&png).expect("screenshot written");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 20_000, "{name}: {} bytes", bytes.len());
        eprintln!("{name}: {} ({} bytes)", png.display(), bytes.len());
    }
    assert_eq!(get(url.trim_start_matches("http://").trim_end_matches('/'), "/study/nope").0, 404);
    service.signal("TERM");
    assert!(service.wait_exit(Duration::from_secs(30)).success());
    assert_agents_spools_empty(&["views-a"]);
}
