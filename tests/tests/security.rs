//! No one in: logins, mutual TLS (embedded broker and Mosquitto with
//! `require_certificate true`), forged session tokens and random bytes on every
//! topic while a study runs. Certificates come from scripts/fleet-certs.sh,
//! the same script the docs give users.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rumqttc::{AsyncClient, MqttOptions, QoS};
use rusqlite::Connection;
use tunefleet_common::auth::{Sealed, UpFrame};
use tunefleet_common::measurement::*;
use tunefleet_common::message::*;
use tunefleet_common::topic::{AgentTopic, Topics};
use tunefleet_tests::mosquitto::Mosquitto;
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
    match password {
        Some(p) => cmd.env("TUNEFLEET_PASSWORD", p),
        None => cmd.env_remove("TUNEFLEET_PASSWORD"),
    };
    Proc::spawn(name, cmd)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
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
}

/// A result in an agent's name, sealed with a session key the forger made up.
fn forged_result(trial: u64, token: u64) -> Vec<u8> {
    let msg = AgentMessage::Result(TrialResult {
        trial: TrialRef { study: "hostile".into(), trial, attempt: 1 },
        measurement: Measurement {
            wall_us: 1,
            final_metrics: [("v".to_string(), 1e9)].into(),
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        },
    });
    let body = tunefleet_common::encode(&msg).expect("enc");
    let sealed = Sealed { token, seq: token % 1000, body, mac: [(token % 251) as u8; 32] };
    tunefleet_common::encode(&UpFrame::Sealed(sealed)).expect("enc")
}

#[test]
fn forged_tokens_and_random_bytes_on_every_topic_are_refused_while_a_study_completes() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("hostile");
    let trials = 12;
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "hostile", trials, 0.15), &store, &root, &[]);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let names = ["h-agent-1", "h-agent-2"];
    let _agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &[])).collect();

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let sent = rt.block_on(async {
        let mut opts = MqttOptions::new("mallory", "127.0.0.1", port);
        opts.set_max_packet_size(1 << 22, 1 << 22);
        let (client, mut el) = AsyncClient::new(opts, 256);
        tokio::spawn(async move { while el.poll().await.is_ok() {} });
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
                if client.publish(t.clone(), QoS::AtLeastOnce, false, bytes).await.is_ok() {
                    sent += 1;
                }
            }
            // An oversized payload, and results with forged tokens in the agents' names.
            let big = vec![tunefleet_common::PROTOCOL_VERSION; tunefleet_common::MAX_MESSAGE_BYTES + 10];
            let _ = client.publish(topics.agent(names[0], AgentTopic::Result), QoS::AtLeastOnce, false, big).await;
            for trial in 0..trials as u64 {
                let forged = forged_result(trial, next());
                let t = topics.agent(names[(trial % 2) as usize], AgentTopic::Result);
                let _ = client.publish(t, QoS::AtLeastOnce, false, forged).await;
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
    let refused = out.lines().find(|l| l.starts_with("refused:")).unwrap_or_default().to_string();
    assert!(refused.contains("malformed"), "the flood was counted: {out}");
    let bad_tokens: u64 = refused
        .split(", ")
        .find(|p| p.contains("unauthenticated"))
        .and_then(|p| p.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(bad_tokens > 0, "forged results were refused: {refused}");
    let rows = results(&store);
    assert_eq!(rows.len(), trials as usize);
    for (i, (trial, agent, v)) in rows.iter().enumerate() {
        assert_eq!((*trial, *v), (i as i64, (i + 1) as f64), "no forged value stored");
        assert!(names.contains(&agent.as_str()));
    }
}
