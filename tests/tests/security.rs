//! No one in: logins, mutual TLS (embedded broker and Mosquitto with
//! `require_certificate true`), forged session tokens and random bytes on every
//! topic while a study runs. Certificates come from scripts/fleet-certs.sh,
//! the same script the docs give users.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tunefleet_common::auth::{self, Sealed, UpFrame};
use tunefleet_common::measurement::*;
use tunefleet_common::message::*;
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_tests::mosquitto::Mosquitto;
use tunefleet_tests::mqtt::{NoMessage, TestClient};
use tunefleet_tests::*;

fn certs(dir: &Path, clients: &[&str]) -> PathBuf {
    let out = dir.join("certs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet-certs.sh");
    let status = Command::new("bash").arg(script).arg(&out).arg("127.0.0.1").args(clients).status().expect("script");
    assert!(status.success());
    out
}

fn results(store: &Path) -> Vec<(i64, String, f64)> {
    let c = Connection::open(store).expect("store");
    let mut st = c.prepare("SELECT trial, agent, objective FROM results ORDER BY trial").expect("prepare");
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).expect("query").map(|r| r.expect("row")).collect()
}

fn known_agents(store: &Path) -> Vec<String> {
    let c = Connection::open(store).expect("store");
    let mut st = c.prepare("SELECT name FROM agents ORDER BY name").expect("prepare");
    st.query_map([], |r| r.get(0)).expect("query").map(|r| r.expect("row")).collect()
}

fn agent_with(url: &str, name: &str, root: &str, args: &[&str], password: Option<&str>) -> Proc {
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.args(["--broker", url, "--name", name, "--root", root]).args(args).env("PATH", path_with_bins());
    cmd.env("XDG_STATE_HOME", state_home());
    match join_token_of(root) {
        Some(token) if !args.contains(&"--coordinator-key") => cmd.env("TUNEFLEET_JOIN", token),
        _ => cmd.env_remove("TUNEFLEET_JOIN"),
    };
    match password {
        Some(p) => cmd.env("TUNEFLEET_PASSWORD", p),
        None => cmd.env_remove("TUNEFLEET_PASSWORD"),
    };
    Proc::spawn(name, cmd)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// `tunefleet run STUDY` on a port the OS chooses, its log (standard error)
/// in `log`; the process and the broker URL it printed.
fn coordinator_logged(study: &Path, store: &Path, root: &str, log: &Path, extra: &[&str]) -> (Proc, String) {
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["run", s(study), "--store", s(store), "--root", root, "--quiet"])
        .args(extra)
        .env("XDG_STATE_HOME", state_home())
        .stderr(std::fs::File::create(log).expect("log file"));
    let mut coord = Proc::spawn("coordinator", cmd);
    let url = coord.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    (coord, url.trim_start_matches("broker: ").trim().to_string())
}

/// An open external broker (Mosquitto, anonymous clients allowed), where
/// any client may publish and subscribe on any topic: what stands between
/// an attacker and the fleet is the coordinator's and agents' own checks.
/// (The embedded broker's grants keep these attackers out before that:
/// tests/tests/broker.rs.)
fn open_broker(dir: &Path) -> (Mosquitto, String) {
    let m = Mosquitto::start(dir, tunefleet_tests::mosquitto::FLEET_OPTIONS);
    let url = m.url();
    (m, url)
}

/// Makes `study`'s trials only for agents tagged `pool=POOL`.
fn only_pool(study: &Path, pool: &str) {
    let text =
        std::fs::read_to_string(study).expect("study") + &format!("[selector]\ntags = {{ pool = \"{pool}\" }}\n");
    std::fs::write(study, text).expect("study");
}

#[test]
fn embedded_broker_with_logins_and_mutual_tls_lets_only_the_fleet_in() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = certs(dir.path(), &["good", "nologin"]);
    let users = dir.path().join("users");
    std::fs::write(&users, "# fleet logins\ngood:right-password\nnologin:other\n").expect("users");
    let store = dir.path().join("s.db");
    let root = unique_root("mtls");
    let tls = [
        "--broker-users",
        s(&users),
        "--broker-cert",
        &format!("{}/broker.pem", s(&c)),
        "--broker-key",
        &format!("{}/broker.key", s(&c)),
        "--broker-client-ca",
        &format!("{}/ca.pem", s(&c)),
        "--listen",
        "127.0.0.1:0",
    ];
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "sec", 4, 0.15), &store, &root, &tls);
    assert!(url.starts_with("mqtts://"), "{url}");
    let ca = format!("{}/ca.pem", s(&c));
    let client = |n: &str| [format!("{}/{n}.pem", s(&c)), format!("{}/{n}.key", s(&c))];
    let [good_cert, good_key] = client("good");
    let good_args = ["--ca", &ca, "--cert", &good_cert, "--key", &good_key, "--username", "good"];
    // Wrong password, valid certificate.
    let _wrong = agent_with(&url, "wrong-password", &root, &good_args, Some("guess"));
    // Right login, no client certificate.
    let _nocert = agent_with(&url, "no-cert", &root, &["--ca", &ca, "--username", "good"], Some("right-password"));
    // Plain MQTT to a TLS port.
    let _plain = agent_with(
        &url.replace("mqtts://", "mqtt://"),
        "plain",
        &root,
        &["--username", "good"],
        Some("right-password"),
    );
    let _good = agent_with(&url, "good", &root, &good_args, Some("right-password"));
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    let rows = results(&store);
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|(_, agent, _)| agent == "good"), "{rows:?}");
    assert_eq!(known_agents(&store), ["good"], "no one else got in");
    assert_agents_spools_empty(&["good"]);
}

#[test]
fn agent_and_coordinator_through_mosquitto_requiring_client_certificates() {
    let dir = tempfile::tempdir().expect("tmp");
    let c = certs(dir.path(), &["coordinator", "edge-1"]);
    // Started as root, mosquitto drops to its own user, which must read the key.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(c.join("broker.key"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let options = format!(
        "allow_anonymous true\nmax_queued_messages 0\nset_tcp_nodelay true\n\
         cafile {0}/ca.pem\ncertfile {0}/broker.pem\nkeyfile {0}/broker.key\nrequire_certificate true\n",
        s(&c)
    );
    let mosquitto = Mosquitto::start(dir.path(), &options);
    let url = format!("mqtts://127.0.0.1:{}", mosquitto.port);
    let store = dir.path().join("s.db");
    let root = unique_root("mosq-tls");
    let ca = format!("{}/ca.pem", s(&c));
    let (cc, ck) = (format!("{}/coordinator.pem", s(&c)), format!("{}/coordinator.key", s(&c)));
    let (mut coord, _) = start_coordinator(
        &sleep_study(dir.path(), "mtls", 3, 0.15),
        &store,
        &root,
        &["--broker", &url, "--ca", &ca, "--cert", &cc, "--key", &ck],
    );
    let (ac, ak) = (format!("{}/edge-1.pem", s(&c)), format!("{}/edge-1.key", s(&c)));
    let _edge = agent_with(&url, "edge-1", &root, &["--ca", &ca, "--cert", &ac, "--key", &ak], None);
    let _anon = agent_with(&url, "anon", &root, &["--ca", &ca], None);
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success());
    let rows = results(&store);
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|(_, a, _)| a == "edge-1"));
    assert_eq!(known_agents(&store), ["edge-1"]);
    assert_agents_spools_empty(&["edge-1"]);
}

/// A result in an agent's name, sealed with a session key the forger made up.
fn forged_result(trial: u64, token: u64) -> Vec<u8> {
    let msg = AgentMessage::Result(TrialResult {
        trial: TrialRef { study: "hostile".into(), study_id: 7, trial, attempt: 1 },
        measurement: Measurement {
            wall_us: 1,
            final_metrics: [("v".to_string(), 1e9)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        },
    });
    let body = tunefleet_common::encode(&msg).expect("enc");
    let sealed = Sealed { token, seq: token % 1000, body };
    tunefleet_common::encode(&UpFrame::Sealed(sealed)).expect("enc")
}

#[test]
fn forged_tokens_and_random_bytes_on_every_topic_are_refused_while_a_study_completes() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("hostile");
    let trials = 12;
    let (_broker, open) = open_broker(dir.path());
    let (mut coord, url) =
        start_coordinator(&sleep_study(dir.path(), "hostile", trials, 0.15), &store, &root, &["--broker", &open]);
    let port = port_of(&url);
    let names = ["h-agent-1", "h-agent-2"];
    let _agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &[])).collect();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let sent = rt.block_on(async {
        let client = TestClient::connect(port, "mallory").await.expect("mallory connects");
        let topics = Topics::new(&root).expect("root");
        let mut topics_all: Vec<String> = names
            .iter()
            .flat_map(|n| AgentTopic::ALL.iter().map(|k| topics.agent(n, *k)).collect::<Vec<_>>())
            .collect();
        topics_all.push(topics.coordinator_status());
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut sent = 0u32;
        for round in 0..40u32 {
            for t in &topics_all {
                let len = (next() % 300) as usize;
                let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                if round % 5 == 0 && !bytes.is_empty() {
                    bytes[0] = tunefleet_common::PROTOCOL_VERSION; // right version, garbage body
                }
                if client.publish(t.clone(), bytes, false).await.is_ok() {
                    sent += 1;
                }
            }
            // An oversized payload, and results with forged tokens in the agents' names.
            let big = vec![tunefleet_common::PROTOCOL_VERSION; tunefleet_common::MAX_MESSAGE_BYTES + 10];
            let _ = client.publish(topics.agent(names[0], AgentTopic::Result), big, false).await;
            for trial in 0..trials as u64 {
                let forged = forged_result(trial, next());
                let t = topics.agent(names[(trial % 2) as usize], AgentTopic::Result);
                let _ = client.publish(t, forged, false).await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = client.disconnect().await;
        sent
    });
    assert!(sent > 400, "the flood was sent ({sent})");
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    assert!(refused_count(&out, "malformed messages") > 0, "the flood was counted: {out}");
    assert!(refused_count(&out, "unauthenticated messages") > 0, "forged results were refused: {out}");
    let rows = results(&store);
    assert_eq!(rows.len(), trials as usize);
    for (i, (trial, agent, v)) in rows.iter().enumerate() {
        assert_eq!((*trial, *v), (i as i64, (i + 1) as f64), "no forged value stored");
        assert!(names.contains(&agent.as_str()));
    }
    assert_agents_spools_empty(&names);
}

/// What a fleet member (a client with its own key and a real session, as a
/// stolen phone would have) can try against the others.
#[test]
fn a_fleet_member_cannot_command_impersonate_or_release_other_agents() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("member");
    let trials = 8;
    let marker = dir.path().join("forged-command-ran");
    let (_broker, open) = open_broker(dir.path());
    let (mut coord, url) = start_coordinator(
        &sleep_study(dir.path(), "member", trials, 0.4),
        &store,
        &root,
        &["--max-agents", "4", "--broker", &open],
    );
    let port = port_of(&url);
    let names = ["v-agent-1", "v-agent-2"];
    let topics = Topics::new(&root).expect("root");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");

    // Mallory connects first and listens to everything the victims publish.
    let mut client = rt.block_on(async {
        let mut client = TestClient::connect(port, "mallory-client").await.expect("mallory connects");
        client
            .subscribe(&[format!("{}/v2/up/+/+", root), topics.coordinator_status(), topics.to_agent("mallory")])
            .await;
        client
    });
    let agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &[])).collect();

    /// Publishes `payload` on `topic` as it is, or fails the test.
    async fn publish(client: &TestClient, topic: String, payload: Vec<u8>) {
        client.publish(topic, payload, false).await.expect("publish");
    }
    rt.block_on(async {
        // Collect: the coordinator's signed status, one Hello and one sealed Request of v-agent-1.
        let (mut status, mut hello, mut request) = (None, None, None);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while status.is_none() || hello.is_none() || request.is_none() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let (topic, payload) = client.next_message(left).await.expect("the victims' traffic in time");
            if topic == topics.coordinator_status() {
                let signed: auth::Signed = tunefleet_common::decode(&payload).expect("signed status");
                status = Some(auth::open_status(&signed).expect("verifies"));
            } else if topic == topics.agent(names[0], AgentTopic::Hello) {
                hello = Some(payload);
            } else if topic == topics.agent(names[0], AgentTopic::Request) {
                request = Some(payload);
            }
        }
        let status = status.expect("status");

        // Mallory's own, legitimate session: a key enrolled with the fleet's
        // join token (a member), a signed Hello, a Welcome.
        let token: auth::JoinToken = join_token_of(&root).expect("a token").parse().expect("token");
        let me = auth::Identity::generate().expect("key").0;
        let info = AgentInfo::minimal("mallory", 666);
        let (_, will_hash) = auth::new_will(666).expect("will");
        let proof = token.prove(&me.public(), "mallory").expect("proof");
        let (signed, pending) = auth::hello(&me, info, status.instance, 1, will_hash, Some(proof)).expect("hello");
        publish(
            &client,
            topics.agent("mallory", AgentTopic::Hello),
            tunefleet_common::encode(&UpFrame::Hello(signed)).expect("enc"),
        )
        .await;
        let mut session = loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let (topic, payload) = client.next_message(left).await.expect("welcome");
            if topic == topics.agent("mallory", AgentTopic::Welcome) {
                let Ok(auth::DownFrame::Welcome(w)) = tunefleet_common::decode(&payload) else { continue };
                break pending.finish("mallory", &status.key, &w).expect("mallory is a fleet member");
            }
        };

        // 1. Work for a victim, sealed with Mallory's own session keys, and in the old plain format.
        let touch = CoordinatorMessage::Assign(Assignment {
            trial: TrialRef { study: "member".into(), study_id: 7, trial: 0, attempt: 99 },
            request_seq: 1,
            spec: TrialSpec {
                argv: vec!["touch".into(), marker.display().to_string()],
                env: vec![],
                system: SystemParams::default(),
                timeout_ms: 10_000,
                probe: None,
                gpus: 0,
            },
        });
        let cancel = CoordinatorMessage::Cancel(Cancel {
            trial: TrialRef { study: "member".into(), study_id: 7, trial: 0, attempt: 1 },
            reason: "mallory".into(),
        });
        for victim in names {
            for msg in [&touch, &cancel] {
                let kind = AgentTopic::of_coordinator_message(msg);
                let body = tunefleet_common::encode(msg).expect("enc");
                let sealed = session.seal(kind, body.clone()).expect("seal");
                publish(
                    &client,
                    topics.agent(victim, kind),
                    tunefleet_common::encode(&auth::DownFrame::Sealed(sealed)).expect("enc"),
                )
                .await;
                publish(&client, topics.agent(victim, kind), body).await;
            }
        }
        // 2. A result and an offline status in a victim's name, with Mallory's keys; a forged will.
        for trial in 0..trials as u64 {
            let result = AgentMessage::Result(TrialResult {
                trial: TrialRef { study: "member".into(), study_id: 7, trial, attempt: 1 },
                measurement: Measurement {
                    final_metrics: [("v".to_string(), 1e9)].into(),
                    ..Measurement::unmeasured(
                        ExitOutcome::Exited(0),
                        EnergyReading::none(EnergySourceKind::Estimated, ""),
                    )
                },
            });
            let sealed =
                session.seal(AgentTopic::Result, tunefleet_common::encode(&result).expect("enc")).expect("seal");
            publish(
                &client,
                topics.agent(names[0], AgentTopic::Result),
                tunefleet_common::encode(&UpFrame::Sealed(sealed)).expect("enc"),
            )
            .await;
        }
        let offline = AgentMessage::Status(AgentStatus { online: false, instance: 1 });
        let sealed = session.seal(AgentTopic::Status, tunefleet_common::encode(&offline).expect("enc")).expect("seal");
        publish(
            &client,
            topics.agent(names[1], AgentTopic::Status),
            tunefleet_common::encode(&UpFrame::Sealed(sealed)).expect("enc"),
        )
        .await;
        let (fake_will, _) = auth::new_will(1).expect("will");
        for victim in names {
            publish(
                &client,
                topics.agent(victim, AgentTopic::Status),
                tunefleet_common::encode(&UpFrame::Will(fake_will.clone())).expect("enc"),
            )
            .await;
        }
        // 3. Replays: v-agent-1's captured Hello and Request.
        publish(&client, topics.agent(names[0], AgentTopic::Hello), hello.expect("hello")).await;
        publish(&client, topics.agent(names[0], AgentTopic::Request), request.expect("request")).await;
        // 4. A flood of Hellos under new names, each with a key of its own
        // and the fleet's token (Mallory holds it).
        for i in 0..40 {
            let id = auth::Identity::generate().expect("key").0;
            let name = format!("flood-{i}");
            let info = AgentInfo::minimal(&name, i);
            let proof = token.prove(&id.public(), &name).expect("proof");
            let (signed, _) = auth::hello(&id, info, status.instance, 1, [0; 32], Some(proof)).expect("hello");
            publish(
                &client,
                topics.agent(&format!("flood-{i}"), AgentTopic::Hello),
                tunefleet_common::encode(&UpFrame::Hello(signed)).expect("enc"),
            )
            .await;
        }
        client.disconnect().await.expect("disconnect queued");
        // The broker has read everything queued before the DISCONNECT.
        assert!(client.wait_closed(Duration::from_secs(10)).await, "flushed in time");
    });
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    assert!(
        refused_count(&out, "unauthenticated messages") >= trials as u64 + 2,
        "forged results, status and the replayed request: {out}"
    );
    // 40 flooders + the replayed Hello; the bound (4: two victims, Mallory, one flooder) stops the rest.
    assert!(refused_count(&out, "Hellos refused") >= 40, "{out}");
    assert!(refused_count(&out, "forged Last Wills") >= 2, "{out}");
    assert!(!out.contains("requeued:"), "no lease was released by a forgery: {out}");
    assert!(!marker.exists(), "a forged assignment ran");
    let rows = results(&store);
    assert_eq!(rows.len(), trials as usize);
    for (i, (trial, agent, v)) in rows.iter().enumerate() {
        assert_eq!((*trial, *v), (i as i64, (i + 1) as f64), "no forged value stored");
        assert!(names.contains(&agent.as_str()), "{agent}");
    }
    let pinned: i64 = Connection::open(&store)
        .expect("store")
        .query_row("SELECT COUNT(*) FROM agent_keys", [], |r| r.get(0))
        .expect("count");
    assert_eq!(pinned, 4, "the bound on agents held");
    let attempts: i64 = Connection::open(&store)
        .expect("store")
        .query_row("SELECT COUNT(*) FROM attempts", [], |r| r.get(0))
        .expect("count");
    assert_eq!(attempts, i64::from(trials), "one attempt per trial: the forged Cancels stopped nothing");
    drop(agents);
    assert_agents_spools_empty(&names);
}

#[test]
fn a_reinstalled_agent_with_a_new_key_is_refused_until_trusted() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("rekey");
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "one", 2, 0.1), &store, &root, &[]);
    let agent = start_agent(&url, "k-agent", &root, &["--state-dir", s(&first)]);
    assert!(coord.wait_exit(Duration::from_secs(60)).success());
    drop(agent);
    let pinned = |store: &Path| -> Vec<u8> {
        Connection::open(store)
            .expect("store")
            .query_row("SELECT key FROM agent_keys WHERE name = 'k-agent'", [], |r| r.get(0))
            .expect("pinned")
    };
    let key_of = |state: &Path| -> String {
        let out = Command::new(bin("tunefleet-agent")).args(["key", "--state-dir", s(state)]).output().expect("runs");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let old_key = key_of(&first);
    assert_eq!(auth::hex(&pinned(&store)), old_key, "pinned on first use");

    // Same name, a fresh install (new state directory, new key): refused,
    // with the command that accepts it in the coordinator's log.
    let log = dir.path().join("coordinator.log");
    let embedded = ["--listen", "127.0.0.1:0"];
    let (mut coord, url) = coordinator_logged(&sleep_study(dir.path(), "two", 2, 0.1), &store, &root, &log, &embedded);
    let _agent = start_agent(&url, "k-agent", &root, &["--state-dir", s(&second)]);
    let new_key = key_of(&second);
    assert_ne!(new_key, old_key);
    wait_for("the changed key to be refused", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains(&format!("tunefleet agents trust k-agent {new_key}")))
    });
    // The operator accepts the re-installed agent; its next Hello is welcomed.
    let out = Command::new(bin("tunefleet"))
        .args(["agents", "trust", "k-agent", &new_key, "--store"])
        .arg(&store)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("replacing {old_key}")));
    assert!(coord.wait_exit(Duration::from_secs(60)).success());
    let summary = coord.rest_of_stdout().join("\n");
    assert!(summary.contains("2/2 trials done"), "{summary}");
    let refused = summary.lines().find(|l| l.starts_with("refused:")).unwrap_or_default();
    assert!(!refused.contains(" 0 Hellos refused") && refused.contains("Hellos refused"), "{summary}");
    assert_eq!(auth::hex(&pinned(&store)), new_key);
    assert_spools_empty(&[first, second]);
}

/// A fleet member with a broker login runs a
/// coordinator of its own on the fleet's broker and topic root, and its
/// signed, retained status reaches a newly installed agent first. The agent
/// was given a join token for the real coordinator: it pins neither the
/// member's key nor runs anything of the member's, and works for the real
/// coordinator once it comes.
#[test]
fn regression_a_members_own_coordinator_cannot_capture_a_new_agent() {
    let dir = tempfile::tempdir().expect("tmp");
    let mosquitto = Mosquitto::start(dir.path(), "allow_anonymous true");
    let url = mosquitto.url();
    let root = unique_root("capture");
    let store = dir.path().join("real.db");
    let marker = dir.path().join("PWNED");
    // The member's coordinator: a key of its own (another state home), the
    // fleet's broker and root, and a study that would leave a mark.
    let evil_state = dir.path().join("evil-state");
    let evil_study = dir.path().join("evil.toml");
    std::fs::write(
        &evil_study,
        format!(
            "name = \"evil\"\ncommand = [\"touch\", \"{}\"]\ntimeout = 10\n[objective]\nmetric = \"v\"\ndirection = \"maximize\"\n\
             [budget]\ntrials = 2\n[strategy]\nkind = \"grid\"\n[hyper.v]\nkind = \"int\"\nlow = 1\nhigh = 2\n",
            marker.display()
        ),
    )
    .expect("evil study");
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.arg("run").arg(&evil_study).arg("--store").arg(dir.path().join("evil.db"));
    cmd.args(["--root", &root, "--quiet", "--broker", &url, "--open-enrolment"]).env("XDG_STATE_HOME", &evil_state);
    let mut evil = Proc::spawn("evil-coordinator", cmd);
    evil.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    // A new agent, installed as the quick start says: a join token for the real coordinator.
    join_root(&root, &store);
    let state = dir.path().join("agent-state");
    let log = dir.path().join("agent.log");
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.args(["--broker", &url, "--name", "new-agent", "--root", &root, "--state-dir", s(&state)]);
    cmd.env("TUNEFLEET_JOIN", join_token_of(&root).expect("token")).env("PATH", path_with_bins());
    cmd.stderr(std::fs::File::create(&log).expect("log"));
    let _agent = Proc::spawn("new-agent", cmd);
    wait_for("the member's status to reach the agent", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("neither this agent's join token nor its pin names"))
            || state.join("coordinator.pub").exists()
    });
    assert!(!state.join("coordinator.pub").exists(), "the member's key was pinned");
    // The real coordinator starts on the same broker: the agent pins it from its token and works.
    let (mut real, _) = start_coordinator(&sleep_study(dir.path(), "real", 2, 0.1), &store, &root, &["--broker", &url]);
    assert!(real.wait_exit(Duration::from_secs(60)).success());
    let out = real.rest_of_stdout().join("\n");
    assert!(out.contains("2/2 trials done"), "{out}");
    let real_key =
        Command::new(bin("tunefleet")).args(["key"]).env("XDG_STATE_HOME", state_home()).output().expect("key");
    let pinned = std::fs::read_to_string(state.join("coordinator.pub")).expect("pinned");
    assert_eq!(pinned.trim(), String::from_utf8_lossy(&real_key.stdout).trim(), "the real coordinator is pinned");
    assert!(!marker.exists(), "the member's coordinator made the agent run its command");
    let evil_agents = known_agents(&dir.path().join("evil.db"));
    assert!(evil_agents.is_empty(), "the agent said Hello to the member's coordinator: {evil_agents:?}");
    drop(evil);
    assert_spools_empty(&[state]);
}

/// An agent with a key the coordinator does not know and no join token is
/// refused, with the two ways in named in the coordinator's log; a revoked
/// token admits no one; a valid one admits the agent, with the tags it grants.
#[test]
fn new_agents_join_only_with_a_valid_token_that_grants_its_tags() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("tokens");
    let log = dir.path().join("coordinator.log");
    let study = sleep_study(dir.path(), "tok", 2, 0.1);
    // Trials only for agents in pool "granted": a tag only the token gives.
    only_pool(&study, "granted");
    let revoked = create_join_token(&store, &["--tag", "pool=granted"]);
    let tunefleet = |args: &[&str]| {
        let out = Command::new(bin("tunefleet"))
            .args(args)
            .arg("--store")
            .arg(&store)
            .env("XDG_STATE_HOME", state_home())
            .output()
            .expect("runs");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let listed = tunefleet(&["token", "list"]);
    let id = listed.split_whitespace().next().expect("an id").to_string();
    assert!(!listed.contains(revoked.split('.').next_back().expect("secret")), "the secret is listed: {listed}");
    assert!(tunefleet(&["token", "revoke", &id]).contains("revoked 1"));
    let good = create_join_token(&store, &["--tag", "pool=granted"]);
    let (mut coord, url) = coordinator_logged(&study, &store, &root, &log, &["--listen", "127.0.0.1:0"]);
    let key = Command::new(bin("tunefleet")).arg("key").env("XDG_STATE_HOME", state_home()).output().expect("key");
    let coordinator_key = String::from_utf8_lossy(&key.stdout).into_owned();
    // No token (the coordinator's key given, so the agent trusts it): refused.
    let bare =
        agent_with(&url, "bare", &root, &["--coordinator-key", coordinator_key.trim(), "--tag", "pool=granted"], None);
    wait_for("the tokenless agent to be refused", Duration::from_secs(30), || {
        std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("\"bare\" presents a key this coordinator does not know"))
    });
    // The revoked token: refused.
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.args(["--broker", &url, "--name", "late", "--root", &root]).env("TUNEFLEET_JOIN", &revoked);
    cmd.env("XDG_STATE_HOME", state_home()).env("PATH", path_with_bins());
    let late = Proc::spawn("late", cmd);
    wait_for("the revoked token to be refused", Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("was revoked"))
    });
    // The valid token: admitted, and its tag makes the study's trials its.
    let mut cmd = Command::new(bin("tunefleet-agent"));
    cmd.args(["--broker", &url, "--name", "member", "--root", &root]).env("TUNEFLEET_JOIN", &good);
    cmd.env("XDG_STATE_HOME", state_home()).env("PATH", path_with_bins());
    let member = Proc::spawn("member", cmd);
    assert!(coord.wait_exit(Duration::from_secs(60)).success());
    let rows = results(&store);
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|(_, agent, _)| agent == "member"), "{rows:?}");
    assert_eq!(known_agents(&store), vec!["member".to_string()], "no other agent was admitted");
    assert!(tunefleet(&["token", "list"]).contains("1 used"));
    drop((bare, late, member));
    assert_agents_spools_empty(&["member"]);
}

/// An agent's Hello captured off the broker, replayed
/// after the agent has restarted, opened a session that replaced the real
/// one, released its trial and had its frames refused. Now an agent process
/// has an instance above every earlier one and the coordinator keeps the
/// last per agent in its store (no window of remembered instances; the unit
/// test `regression_an_old_hello_is_a_replay_however_many_restarts_ago`
/// goes 40 restarts back): the replay is refused, and the restarted agent
/// completes the study.
#[test]
fn regression_a_hello_replayed_after_the_agent_restarted_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("replay");
    let log = dir.path().join("coordinator.log");
    join_root(&root, &store);
    let study = sleep_study(dir.path(), "replay", 12, 0.3);
    only_pool(&study, "work");
    let (_broker, open) = open_broker(dir.path());
    let (mut coord, url) = coordinator_logged(&study, &store, &root, &log, &["--broker", &open]);
    let port = port_of(&url);
    // The attacker listens to the victim's Hellos.
    let hello_topic = Topics::new(&root).expect("root").agent("victim", AgentTopic::Hello);
    let mut mallory = Mallory::connect(port, &root, "replayer", std::slice::from_ref(&hello_topic));
    let state = dir.path().join("victim-state");
    // Trials only for pool=work: the restarts (pool=idle) hold none, the last process runs them all.
    let start = |pool: &str| start_agent(&url, "victim", &root, &["--state-dir", s(&state), "--tag", pool]);
    let instance_of = |payload: &[u8]| -> u64 {
        let Ok(UpFrame::Hello(signed)) = tunefleet_common::decode::<UpFrame>(payload) else { panic!("not a Hello") };
        auth::peek_hello(&signed).expect("a Hello").info.instance
    };
    // The first process's Hello, captured; then 18 restarts (SIGKILL, as a
    // crash): more than the 16 earlier instances the coordinator once remembered.
    let mut agent = start("pool=idle");
    let captured = mallory.frame_on(&hello_topic, Duration::from_secs(30));
    let mut instances = vec![instance_of(&captured)];
    for i in 0..18 {
        agent.signal("KILL");
        agent.wait_exit(Duration::from_secs(10));
        agent = start(if i == 17 { "pool=work" } else { "pool=idle" });
        let hello = mallory.frame_on(&hello_topic, Duration::from_secs(30));
        instances.push(instance_of(&hello));
    }
    assert!(instances.windows(2).all(|w| w[1] > w[0]), "instances grow across restarts: {instances:?}");
    // The replay (her event loop runs on a thread of its own).
    mallory.publish(hello_topic.clone(), captured);
    let refused = || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Hello refused: replayed Hello"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !refused() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(refused(), "the replay was not refused: {}", std::fs::read_to_string(&log).unwrap_or_default());
    assert!(coord.wait_exit(Duration::from_secs(90)).success());
    let summary = coord.rest_of_stdout().join("\n");
    assert!(summary.contains("12/12 trials done"), "{summary}");
    assert!(!summary.contains("requeued:"), "the replay released the victim's trial: {summary}");
    drop(agent);
    assert_spools_empty(&[state]);
}

/// A broker user who connects with the client id an
/// agent had (`tf-agent-{name}`) took its connection over: the broker
/// dropped the agent, its genuine Will fired and its trials were queued
/// again. Agent client ids now end in random hex.
#[test]
fn regression_a_broker_user_with_the_agents_predictable_client_id_does_not_drop_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("clientid");
    let trials = 6;
    let (_broker, open) = open_broker(dir.path());
    let (mut coord, url) =
        start_coordinator(&sleep_study(dir.path(), "clientid", trials, 0.5), &store, &root, &["--broker", &open]);
    let port = port_of(&url);
    let victim = "cid-victim";
    let agent = start_agent(&url, victim, &root, &["--slots", "1"]);
    let attempts = || -> i64 {
        Connection::open(&store)
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM attempts", [], |r| r.get(0)))
            .unwrap_or(0)
    };
    wait_for("the victim's first attempt", Duration::from_secs(30), || attempts() > 0);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let mut connected = 0;
    rt.block_on(async {
        // Three times, while trials run: connect as `tf-agent-{victim}` and stay a while.
        for _ in 0..3 {
            let Ok(mut impostor) = TestClient::connect(port, &format!("tf-agent-{victim}")).await else { continue };
            connected += 1;
            // Held 800 ms, unless the broker closes it first.
            impostor.wait_closed(Duration::from_millis(800)).await;
            let _ = impostor.disconnect().await;
            impostor.wait_closed(Duration::from_secs(10)).await;
        }
    });
    assert!(connected > 0, "the impostor's connections were accepted");
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    assert!(!out.contains("requeued:"), "no lease was released: {out}");
    assert_eq!(attempts(), i64::from(trials), "one attempt per trial: the victim was never dropped");
    drop(agent);
    assert_agents_spools_empty(&[victim]);
}

/// Mallory, a fleet member: an MQTT client of her own that speaks the
/// protocol with her own key, enrolled with the fleet's join token. Her
/// event loop runs on a runtime thread of its own, so she stays connected
/// while the test waits on processes.
struct Mallory {
    rt: tokio::runtime::Runtime,
    client: TestClient,
    topics: Topics,
    token: auth::JoinToken,
    name: String,
    me: auth::Identity,
    status: CoordinatorStatus,
    session: Option<auth::Session>,
}

impl Mallory {
    /// Connects to the broker on `port` and subscribes to the coordinator's
    /// status, her own down topic and `watch`; returns once the
    /// coordinator's signed status has arrived.
    fn connect(port: u16, root: &str, name: &str, watch: &[String]) -> Mallory {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
        let topics = Topics::new(root).expect("root");
        let mut filters = vec![topics.coordinator_status(), topics.to_agent(name)];
        filters.extend_from_slice(watch);
        let mut client = rt.block_on(async {
            let mut client =
                TestClient::connect(port, &format!("{name}-{}", std::process::id())).await.expect("connects");
            client.subscribe(&filters).await;
            client
        });
        let status_topic = topics.coordinator_status();
        let status = rt.block_on(async {
            loop {
                let (topic, payload) =
                    client.next_message(Duration::from_secs(30)).await.expect("the coordinator's status in time");
                if topic == status_topic {
                    let signed: auth::Signed = tunefleet_common::decode(&payload).expect("signed status");
                    break auth::open_status(&signed).expect("verifies");
                }
            }
        });
        let token = join_token_of(root).expect("a token").parse().expect("token");
        let me = auth::Identity::generate().expect("key").0;
        Mallory { rt, client, topics, token, name: name.to_string(), me, status, session: None }
    }

    /// A signed Hello under `name` with the key `id`, proving the fleet's join token.
    fn hello(&self, id: &auth::Identity, info: AgentInfo, seq: u64) -> (auth::Signed, auth::PendingHello) {
        let proof = self.token.prove(&id.public(), &info.agent).expect("proof");
        auth::hello(id, info, self.status.instance, seq, [0; 32], Some(proof)).expect("hello")
    }

    fn publish(&self, topic: String, payload: Vec<u8>) {
        self.rt.block_on(self.client.publish(topic, payload, false)).expect("publish");
    }

    /// The next frame on `topic` (others are dropped), within `within`.
    fn frame_on(&mut self, topic: &str, within: Duration) -> Vec<u8> {
        let client = &mut self.client;
        self.rt.block_on(async {
            let deadline = tokio::time::Instant::now() + within;
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match client.next_message(left).await {
                    Ok((t, payload)) if t == topic => break payload,
                    Ok(_) => {}
                    Err(NoMessage::TimedOut) => panic!("nothing on {topic} within {within:?}"),
                    Err(NoMessage::Closed) => panic!("the broker went away (did the coordinator exit?) before {topic}"),
                }
            }
        })
    }

    /// Her Hello number `seq` of process instance 666, and the Welcome: a session.
    fn join(&mut self, seq: u64) {
        let (signed, pending) = self.hello(&self.me, AgentInfo::minimal(&self.name, 666), seq);
        let hello = tunefleet_common::encode(&UpFrame::Hello(signed)).expect("enc");
        self.publish(self.topics.agent(&self.name, AgentTopic::Hello), hello);
        let welcome_topic = self.topics.agent(&self.name, AgentTopic::Welcome);
        let session = loop {
            let payload = self.frame_on(&welcome_topic, Duration::from_secs(30));
            if let Ok(auth::DownFrame::Welcome(w)) = tunefleet_common::decode(&payload) {
                if pending.answers(&w) {
                    break pending.finish(&self.name, &self.status.key, &w).expect("mallory is a fleet member");
                }
            }
        };
        self.session = Some(session);
    }

    /// Seals `msg` in her session and publishes it on its topic.
    fn send(&mut self, msg: &AgentMessage) {
        let (kind, payload) = self.session.as_mut().expect("joined").seal_agent(msg).expect("seal");
        self.publish(self.topics.agent(&self.name, kind), payload);
    }

    /// The next message of `kind` the coordinator seals for her.
    fn receive(&mut self, kind: AgentTopic) -> CoordinatorMessage {
        let payload = self.frame_on(&self.topics.agent(&self.name, kind), Duration::from_secs(30));
        let Ok(auth::DownFrame::Sealed(sealed)) = tunefleet_common::decode(&payload) else { panic!("not sealed") };
        self.session.as_mut().expect("joined").open_coordinator(kind, &sealed).expect("opens")
    }
}

/// The count of `what` in a summary's `refused:` line (0 when absent).
fn refused_count(summary: &str, what: &str) -> u64 {
    let line = summary.lines().find(|l| l.starts_with("refused: ")).unwrap_or_default();
    line.trim_start_matches("refused: ")
        .split(", ")
        .find(|p| p.ends_with(what))
        .and_then(|p| p.split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A study whose command records its arguments (one a line, in
/// `dir/argv-TRIAL-ATTEMPT`) and reports `v` = trial + 1; an attempt that
/// goes on from a checkpoint gets `--resume CHECKPOINT`, under `/ckpt/`.
fn recording_resume_study(dir: &Path, name: &str, trials: u32) -> PathBuf {
    let script = dir.join("record.sh");
    let body = format!(
        "printf '%s\\n' \"$@\" > {}/argv-$1-$2\nsleep 0.2\necho \"{{\\\"event\\\":\\\"final\\\",\\\"v\\\":$3}}\"\n",
        dir.display()
    );
    std::fs::write(&script, body).expect("script");
    let text = format!(
        "name = \"{name}\"\ncommand = [\"sh\", \"{}\", \"{{trial}}\", \"{{attempt}}\", \"{{v}}\"]\n\
         resume = [\"--resume\", \"{{checkpoint}}\"]\nresume_prefix = \"/ckpt/\"\ntimeout = 60\nmax_attempts = 5\n\
         [objective]\nmetric = \"v\"\ndirection = \"maximize\"\n[budget]\ntrials = {trials}\n\
         [strategy]\nkind = \"grid\"\n[hyper.v]\nkind = \"int\"\nlow = 1\nhigh = {trials}\n",
        script.display()
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("study");
    path
}

/// Two attacks by a welcomed member on a real assignment.
/// First: a result whose segment starts at 2^63 + 5 µs failed the
/// store's conversion, the error left the engine, and the coordinator
/// exited on every restart (the agent re-sent it). Second: a checkpoint
/// was kept unchecked and appended to the next attempt's command, so another
/// agent ran `--resume "--output=…\n\x1b[31mFORGED…"`. Now the result is
/// answered `Refused` naming the field, and the study goes on; malformed
/// checkpoints are refused and counted, one outside `resume_prefix` is not
/// kept, and the next attempt resumes from the one good checkpoint as one
/// argument.
#[test]
fn regression_a_members_unstorable_result_and_forged_checkpoints_are_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("poison");
    let trials = 6;
    let (_broker, open) = open_broker(dir.path());
    let (mut coord, url) =
        start_coordinator(&recording_resume_study(dir.path(), "poison", trials), &store, &root, &["--broker", &open]);
    let port = port_of(&url);
    let mut mallory = Mallory::connect(port, &root, "mallory", &[]);
    mallory.join(1);
    mallory.send(&AgentMessage::Request(WorkRequest { seq: 1, free: 1, ahead: 0, running: vec![], held: vec![] }));
    let CoordinatorMessage::Assign(assigned) = mallory.receive(AgentTopic::Assign) else { panic!("an Assign") };
    let trial = assigned.trial;
    let forged = "--output=/home/victim/.bashrc\n\x1b[31mFORGED";
    let checkpoints = [
        "/ckpt/mallory-e1".to_string(),
        forged.to_string(),
        format!("/ckpt/{}", "A".repeat(100_000)),
        "--output=/home/victim/.bashrc".to_string(),
        "/home/victim/.bashrc".to_string(),
    ];
    for (epoch, checkpoint) in (1..).zip(&checkpoints) {
        mallory.send(&AgentMessage::Progress(Progress {
            trial: trial.clone(),
            epoch,
            elapsed_us: u64::from(epoch) * 1000,
            metrics: Metrics::new(),
            checkpoint: Some(checkpoint.clone()),
            profile: None,
        }));
    }
    let segment = Segment {
        role: SegmentRole::Initial,
        system: SystemParams::default(),
        cpus: vec![],
        first_epoch: 1,
        last_epoch: 1,
        steps: 0,
        start_us: 9223372036854775813,
        wall_us: 1,
        energy_j: None,
        cpu_us: None,
        unit_median_us: None,
        unit_spread: None,
        margin: None,
    };
    mallory.send(&AgentMessage::Result(TrialResult {
        trial: trial.clone(),
        measurement: Measurement {
            final_metrics: [("v".to_string(), 1e9)].into(),
            segments: vec![segment],
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        },
    }));
    let CoordinatorMessage::Ack(ack) = mallory.receive(AgentTopic::Ack) else { panic!("an Ack") };
    assert_eq!(ack.trial, trial);
    assert!(
        matches!(&ack.outcome, AckOutcome::Refused(why) if why.contains("measurement.segments[0].start_us")),
        "finding 2: the unstorable result is refused, naming its field: {:?}",
        ack.outcome
    );
    assert!(matches!(coord.child.try_wait(), Ok(None)), "finding 2: the coordinator exited on the result");
    // She gives the trial back: it is queued again at once, for the real agents.
    mallory.send(&AgentMessage::Refuse(Refusal { trial: trial.clone(), reason: "busy".into() }));
    mallory.send(&AgentMessage::Status(AgentStatus { online: false, instance: 666 }));
    let names = ["p-agent-1", "p-agent-2"];
    let agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &[])).collect();
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "finding 2: the coordinator failed: {out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "finding 2: {out}");
    let rows = results(&store);
    let stored: Vec<(i64, f64)> = rows.iter().map(|(t, _, v)| (*t, *v)).collect();
    let expected: Vec<(i64, f64)> = (0..i64::from(trials)).map(|t| (t, (t + 1) as f64)).collect();
    assert_eq!(stored, expected, "finding 2: one result per trial, none of Mallory's");
    assert!(rows.iter().all(|(_, agent, _)| names.contains(&agent.as_str())), "finding 2: {rows:?}");
    // Finding 6: three checkpoints out of bounds refused with their
    // message, one outside resume_prefix not kept; the result above is the
    // fourth message out of bounds.
    assert_eq!(refused_count(&out, "messages with values out of bounds"), 4, "finding 6: {out}");
    assert_eq!(refused_count(&out, "checkpoints outside resume_prefix"), 1, "finding 6: {out}");
    let kept: Vec<Option<String>> = {
        let c = Connection::open(&store).expect("store");
        let mut st = c.prepare("SELECT checkpoint FROM progress ORDER BY epoch").expect("prepare");
        st.query_map([], |r| r.get(0)).expect("query").map(|r| r.expect("row")).collect()
    };
    assert_eq!(
        kept,
        [Some("/ckpt/mallory-e1".to_string()), None],
        "finding 6: only the good checkpoint reached the store"
    );
    // Every attempt's arguments: the trial Mallory gave back resumed from
    // the good checkpoint, one argument; nothing forged reached a command.
    let mut resumed = Vec::new();
    for entry in std::fs::read_dir(dir.path()).expect("dir").flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if let Some(run) = file.strip_prefix("argv-") {
            let args = std::fs::read_to_string(entry.path()).expect("argv");
            let args: Vec<String> = args.lines().map(str::to_string).collect();
            assert!(
                !args.iter().any(|a| a.contains("bashrc") || a.contains("FORGED") || a.starts_with("--output")),
                "finding 6: a forged checkpoint reached attempt {run}'s command: {args:?}"
            );
            if args.iter().any(|a| a == "--resume") {
                resumed.push((run.to_string(), args[3..].to_vec()));
            }
        }
    }
    assert_eq!(
        resumed,
        [(format!("{}-2", trial.trial), vec!["--resume".to_string(), "/ckpt/mallory-e1".to_string()])],
        "finding 6: the next attempt goes on from the good checkpoint, as one argument"
    );
    drop(agents);
    assert_agents_spools_empty(&names);
}

/// The one Hello rate limit ran before any check, so
/// 20,000 4-byte Hellos a second (`[version, Hello, empty body, empty
/// signature]`, each under a new name) spent it and kept a new agent out
/// for the whole flood (68 s). Now a Hello is checked cheapest first and
/// junk spends no budget. Mallory floods `up/<random name>/hello` at
/// 20,000 a second (three in four are 4-byte Hellos that decode, one in
/// four 4 random bytes) for at least 3 s, and until a new real agent
/// started 1 s in has been welcomed (25 s at most). Paced, because her
/// client sends 20,000 unpaced in about 150 ms, less than one of the
/// agent's 3-second Hello retries. It must be welcomed within 10 s (it
/// takes about 0.1 s; 10 s leaves room for a lost Hello and two retries on
/// a loaded machine), where the old limit (200 a second, shared) let about
/// one Hello in a hundred through.
#[test]
fn regression_a_flood_of_junk_hellos_does_not_keep_a_new_agent_out() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("junk");
    // Four trials of a second: the study outlasts the flood.
    let (_broker, open) = open_broker(dir.path());
    let (mut coord, url) =
        start_coordinator(&sleep_study(dir.path(), "junk", 4, 1.0), &store, &root, &["--broker", &open]);
    let port = port_of(&url);
    let newcomer = "newcomer";
    let topics = Topics::new(&root).expect("root");
    let welcome = topics.agent(newcomer, AgentTopic::Welcome);
    // One client watches for the newcomer's Welcome, another floods.
    let mut eye = Mallory::connect(port, &root, "mallory-eye", std::slice::from_ref(&welcome));
    let mallory = Mallory::connect(port, &root, "mallory", &[]);
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut hellos, mut random) = (0u64, 0u64);
    let mut agent: Option<(Proc, Instant)> = None;
    let mut welcomed: Option<(Duration, u64)> = None;
    let flood = Instant::now();
    mallory.rt.block_on(async {
        // 200 every 10 ms: 20,000 a second.
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let going = |welcomed: bool| {
            let t = flood.elapsed();
            t < Duration::from_secs(25) && (t < Duration::from_secs(3) || !welcomed)
        };
        while going(welcomed.is_some()) {
            tick.tick().await;
            for _ in 0..200 {
                let name = format!("j{:x}", next());
                let payload = if (hellos + random) % 4 == 3 {
                    random += 1;
                    next().to_le_bytes()[..4].to_vec()
                } else {
                    hellos += 1;
                    vec![tunefleet_common::PROTOCOL_VERSION, 0, 0, 0]
                };
                let topic = topics.agent(&name, AgentTopic::Hello);
                mallory.client.publish_at_most_once(topic, payload).await.expect("publish");
            }
            if agent.is_none() && flood.elapsed() >= Duration::from_secs(1) {
                agent = Some((start_agent(&url, newcomer, &root, &[]), Instant::now()));
            }
            if let (None, Some((_, started))) = (welcomed, &agent) {
                while let Some((topic, payload)) = eye.client.try_message() {
                    let frame = tunefleet_common::decode::<auth::DownFrame>(&payload);
                    if topic == welcome && matches!(frame, Ok(auth::DownFrame::Welcome(_))) {
                        welcomed = Some((started.elapsed(), hellos + random));
                    }
                }
            }
        }
    });
    let flood_time = flood.elapsed();
    let sent = hellos + random;
    eprintln!(
        "finding 4: {sent} junk Hellos in {flood_time:?} ({:.0}/s); the new agent welcomed (after, junk sent by \
         then) {welcomed:?}",
        sent as f64 / flood_time.as_secs_f64()
    );
    assert!(sent >= 50_000, "finding 4: the flood was sent ({sent})");
    let (welcomed, by_then) = welcomed.expect("finding 4: the new agent was not welcomed while the flood went on");
    assert!(by_then < sent, "finding 4: the flood was under way when the agent was welcomed");
    assert!(welcomed < Duration::from_secs(10), "finding 4: the new agent waited {welcomed:?} for its Welcome");
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("4/4 trials done"), "finding 4: the new agent completed the study: {out}");
    assert_eq!(refused_count(&out, "Hellos refused"), hellos, "finding 4: each 4-byte Hello refused: {out}");
    assert_eq!(refused_count(&out, "malformed messages"), random, "finding 4: the random bytes counted: {out}");
    assert_eq!(refused_count(&out, "Hellos over the rate limit"), 0, "finding 4: junk spent no budget: {out}");
    drop((agent, eye));
    assert_agents_spools_empty(&[newcomer]);
}

/// A line of `/proc/PID/status`, in KiB (`VmRSS`, `VmHWM`).
fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).expect("field");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("kib")
}

/// The store's bytes on disk: the database and its write-ahead log.
fn store_bytes(store: &Path) -> u64 {
    let wal = store.with_extension("db-wal");
    [store, wal.as_path()].iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum()
}

/// A Hello's `AgentInfo` was stored as sent, so 400
/// Hellos with fresh keys and ~1 MB of tags took the coordinator from 13 MB
/// to 903 MB RSS and the store to half a gigabyte, with every name pinned
/// for good. Mallory sends 50 Hellos under new names, each with a key of
/// its own, the fleet's join token proved, and ~900 KB of tags, so only the
/// bounds can stop them: no name is pinned, the store grows by less than
/// 4 MB and the coordinator's RSS by less than 50 MB (storing them would
/// take about 45 MB each way), and the refusals are counted. The broker is
/// a Mosquitto of its own, so the RSS is the coordinator's alone: the
/// embedded broker keeps what it routes in its commit log (4 segments of
/// 64 MiB), which these Hellos grow by about 75 MB whatever the coordinator
/// does with them.
#[test]
fn regression_large_hellos_pin_no_name_and_grow_neither_memory_nor_the_store() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("large");
    let mosquitto = Mosquitto::start(dir.path(), tunefleet_tests::mosquitto::FLEET_OPTIONS);
    let url = mosquitto.url();
    let (mut coord, _) =
        start_coordinator(&sleep_study(dir.path(), "large", 2, 0.1), &store, &root, &["--broker", &url]);
    let port = mosquitto.port;
    let mut mallory = Mallory::connect(port, &root, "mallory", &[]);
    mallory.join(1);
    let pid = coord.child.id();
    let (rss_before, store_before) = (proc_kib(pid, "VmRSS"), store_bytes(&store));
    let squatters = 50;
    for i in 0..squatters {
        let id = auth::Identity::generate().expect("key").0;
        let name = format!("squat-{i}");
        let mut info = AgentInfo::minimal(&name, 1);
        info.tags = (0..900).map(|t| (format!("t{t:03}"), "x".repeat(1000))).collect();
        let (signed, _) = mallory.hello(&id, info, 1);
        let payload = tunefleet_common::encode(&UpFrame::Hello(signed)).expect("enc");
        assert!((900_000..tunefleet_common::MAX_MESSAGE_BYTES).contains(&payload.len()), "{}", payload.len());
        mallory.publish(mallory.topics.agent(&name, AgentTopic::Hello), payload);
    }
    // Her own next Hello comes after them on her connection: once it is
    // welcomed, the coordinator has handled every large one.
    mallory.join(2);
    let (rss_after, store_after) = (proc_kib(pid, "VmRSS"), store_bytes(&store));
    let hwm = proc_kib(pid, "VmHWM");
    eprintln!(
        "finding 5: coordinator RSS {rss_before} -> {rss_after} KiB (peak {hwm} KiB), store {store_before} -> \
         {store_after} bytes"
    );
    mallory.send(&AgentMessage::Status(AgentStatus { online: false, instance: 666 }));
    let agent = start_agent(&url, "honest", &root, &[]);
    let status = coord.wait_exit(Duration::from_secs(60));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains("2/2 trials done"), "{out}");
    let names = |table: &str| -> Vec<String> {
        let c = Connection::open(&store).expect("store");
        let mut st = c.prepare(&format!("SELECT name FROM {table} ORDER BY name")).expect("prepare");
        st.query_map([], |r| r.get(0)).expect("query").map(|r| r.expect("row")).collect()
    };
    assert_eq!(names("agent_keys"), ["honest", "mallory"], "finding 5: a squatter's name was pinned");
    assert_eq!(names("agents"), ["honest", "mallory"], "finding 5: a squatter's info was stored");
    assert!(
        store_after.saturating_sub(store_before) < 4 << 20,
        "finding 5: the store grew from {store_before} to {store_after} bytes"
    );
    assert!(
        rss_after.saturating_sub(rss_before) < 50 << 10,
        "finding 5: the coordinator's RSS grew from {rss_before} to {rss_after} KiB"
    );
    assert_eq!(refused_count(&out, "Hellos refused"), squatters, "finding 5: each large Hello refused: {out}");
    drop(agent);
    assert_agents_spools_empty(&["honest"]);
}
