//! No one in: logins, mutual TLS (embedded broker and Mosquitto with
//! `require_certificate true`), forged session tokens and random bytes on every
//! topic while a study runs. Certificates come from scripts/fleet-certs.sh,
//! the same script the docs give users.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rumqttc::{AsyncClient, MqttOptions, QoS};
use rusqlite::Connection;
use tunefleet_common::auth::{self, Sealed, UpFrame};
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
    let (mut coord, url) =
        start_coordinator(&sleep_study(dir.path(), "member", trials, 0.4), &store, &root, &["--max-agents", "4"]);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let names = ["v-agent-1", "v-agent-2"];
    let topics = Topics::new(&root).expect("root");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");

    // Mallory connects first and listens to everything the victims publish.
    let (client, mut frames, mut flushed) = rt.block_on(async {
        let mut opts = MqttOptions::new("mallory-client", "127.0.0.1", port);
        opts.set_max_packet_size(1 << 22, 1 << 22);
        let (client, mut el) = AsyncClient::new(opts, 1024);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(String, Vec<u8>)>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (flushed_tx, flushed) = tokio::sync::oneshot::channel();
        let sub = client.clone();
        let filters = [format!("{}/v2/up/+/+", root), topics.coordinator_status(), topics.to_agent("mallory")];
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut flushed_tx = Some(flushed_tx);
            let mut acks = 0;
            while let Ok(ev) = el.poll().await {
                match ev {
                    rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_)) => {
                        for f in &filters {
                            let _ = sub.subscribe(f.clone(), QoS::AtLeastOnce).await;
                        }
                    }
                    rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)) => {
                        acks += 1;
                        if acks == filters.len() {
                            if let Some(r) = ready.take() {
                                let _ = r.send(());
                            }
                        }
                    }
                    rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) => {
                        let _ = tx.send((p.topic.clone(), p.payload.to_vec()));
                    }
                    // Everything queued before the DISCONNECT has been written.
                    rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect) => {
                        if let Some(f) = flushed_tx.take() {
                            let _ = f.send(());
                        }
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx).await.expect("subscribed").expect("ready");
        (client, rx, flushed)
    });
    let agents: Vec<Proc> = names.iter().map(|n| start_agent(&url, n, &root, &[])).collect();

    rt.block_on(async {
        let publish = |topic: String, payload: Vec<u8>| {
            let c = client.clone();
            async move { c.publish(topic, QoS::AtLeastOnce, false, payload).await.expect("publish") }
        };
        // Collect: the coordinator's signed status, one Hello and one sealed Request of v-agent-1.
        let (mut status, mut hello, mut request) = (None, None, None);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while status.is_none() || hello.is_none() || request.is_none() {
            let (topic, payload) = tokio::time::timeout_at(deadline, frames.recv())
                .await
                .expect("the victims' traffic in time")
                .expect("frames");
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
            topics.agent("mallory", AgentTopic::Hello),
            tunefleet_common::encode(&UpFrame::Hello(signed)).expect("enc"),
        )
        .await;
        let mut session = loop {
            let (topic, payload) = tokio::time::timeout_at(deadline, frames.recv()).await.expect("welcome").expect("f");
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
                let sealed = session.seal(kind, body.clone());
                publish(
                    topics.agent(victim, kind),
                    tunefleet_common::encode(&auth::DownFrame::Sealed(sealed)).expect("enc"),
                )
                .await;
                publish(topics.agent(victim, kind), body).await;
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
            let sealed = session.seal(AgentTopic::Result, tunefleet_common::encode(&result).expect("enc"));
            publish(
                topics.agent(names[0], AgentTopic::Result),
                tunefleet_common::encode(&UpFrame::Sealed(sealed)).expect("enc"),
            )
            .await;
        }
        let offline = AgentMessage::Status(AgentStatus { online: false, instance: 1 });
        let sealed = session.seal(AgentTopic::Status, tunefleet_common::encode(&offline).expect("enc"));
        publish(
            topics.agent(names[1], AgentTopic::Status),
            tunefleet_common::encode(&UpFrame::Sealed(sealed)).expect("enc"),
        )
        .await;
        let (fake_will, _) = auth::new_will(1).expect("will");
        for victim in names {
            publish(
                topics.agent(victim, AgentTopic::Status),
                tunefleet_common::encode(&UpFrame::Will(fake_will.clone())).expect("enc"),
            )
            .await;
        }
        // 3. Replays: v-agent-1's captured Hello and Request.
        publish(topics.agent(names[0], AgentTopic::Hello), hello.expect("hello")).await;
        publish(topics.agent(names[0], AgentTopic::Request), request.expect("request")).await;
        // 4. A flood of Hellos under new names, each with a key of its own
        // and the fleet's token (Mallory holds it).
        for i in 0..40 {
            let id = auth::Identity::generate().expect("key").0;
            let name = format!("flood-{i}");
            let info = AgentInfo::minimal(&name, i);
            let proof = token.prove(&id.public(), &name).expect("proof");
            let (signed, _) = auth::hello(&id, info, status.instance, 1, [0; 32], Some(proof)).expect("hello");
            publish(
                topics.agent(&format!("flood-{i}"), AgentTopic::Hello),
                tunefleet_common::encode(&UpFrame::Hello(signed)).expect("enc"),
            )
            .await;
        }
        client.disconnect().await.expect("disconnect queued");
        tokio::time::timeout(Duration::from_secs(10), &mut flushed).await.expect("flushed in time").expect("flushed");
    });
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    let refused = out.lines().find(|l| l.starts_with("refused:")).unwrap_or_default().to_string();
    let count = |what: &str| -> u64 {
        refused
            .split(", ")
            .find(|p| p.contains(what))
            .and_then(|p| p.trim_start_matches("refused: ").split(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    assert!(
        count("unauthenticated") >= trials as u64 + 2,
        "forged results, status and the replayed request: {refused}"
    );
    // 40 flooders + the replayed Hello; the bound (4: two victims, Mallory, one flooder) stops the rest.
    assert!(count("Hellos refused") >= 40, "{refused}");
    assert!(count("forged Last Wills") >= 2, "{refused}");
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
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["run", s(&sleep_study(dir.path(), "two", 2, 0.1)), "--store", s(&store), "--root", &root, "--quiet"])
        .args(["--listen", "127.0.0.1:0"])
        .env("XDG_STATE_HOME", state_home())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut coord = Proc::spawn("coordinator", cmd);
    let url = coord.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let url = url.trim_start_matches("broker: ").trim().to_string();
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

/// Issue 20, finding 1: a fleet member with a broker login runs a
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
    let text = std::fs::read_to_string(&study).expect("study") + "[selector]\ntags = { pool = \"granted\" }\n";
    std::fs::write(&study, text).expect("study");
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
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["run", s(&study), "--store", s(&store), "--root", &root, "--quiet", "--listen", "127.0.0.1:0"])
        .env("XDG_STATE_HOME", state_home())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut coord = Proc::spawn("coordinator", cmd);
    let url = coord.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let url = url.trim_start_matches("broker: ").trim().to_string();
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

/// Issue 20, finding 3: an agent's Hello captured off the broker, replayed
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
    let text = std::fs::read_to_string(&study).expect("study") + "[selector]\ntags = { pool = \"work\" }\n";
    std::fs::write(&study, text).expect("study");
    let mut cmd = Command::new(bin("tunefleet"));
    cmd.args(["run", s(&study), "--store", s(&store), "--root", &root])
        .args(["--quiet", "--listen", "127.0.0.1:0"])
        .env("XDG_STATE_HOME", state_home())
        .stderr(std::fs::File::create(&log).expect("log file"));
    let mut coord = Proc::spawn("coordinator", cmd);
    let url = coord.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    let url = url.trim_start_matches("broker: ").trim().to_string();
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let topics = Topics::new(&root).expect("root");
    let hello_topic = topics.agent("victim", AgentTopic::Hello);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let (client, mut hellos) = rt.block_on(async {
        let (client, mut el) = AsyncClient::new(MqttOptions::new("replayer", "127.0.0.1", port), 64);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let sub = client.clone();
        let topic = hello_topic.clone();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            while let Ok(ev) = el.poll().await {
                match ev {
                    rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_)) => {
                        let _ = sub.subscribe(topic.clone(), QoS::AtLeastOnce).await;
                    }
                    rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_)) => {
                        if let Some(r) = ready.take() {
                            let _ = r.send(());
                        }
                    }
                    rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)) => {
                        let _ = tx.send(p.payload.to_vec());
                    }
                    _ => {}
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx).await.expect("subscribed").expect("ready");
        (client, rx)
    });
    let state = dir.path().join("victim-state");
    // Trials only for pool=work: the restarts (pool=idle) hold none, the last process runs them all.
    let start = |pool: &str| start_agent(&url, "victim", &root, &["--state-dir", s(&state), "--tag", pool]);
    let next_hello = |hellos: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>| -> Vec<u8> {
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), hellos.recv()).await })
            .expect("a Hello in time")
            .expect("hellos")
    };
    let instance_of = |payload: &[u8]| -> u64 {
        let Ok(UpFrame::Hello(signed)) = tunefleet_common::decode::<UpFrame>(payload) else { panic!("not a Hello") };
        auth::peek_hello(&signed).expect("a Hello").info.instance
    };
    // The first process's Hello, captured; then 18 restarts (SIGKILL, as a
    // crash): more than the 16 earlier instances the coordinator once remembered.
    let mut agent = start("pool=idle");
    let captured = next_hello(&mut hellos);
    let mut instances = vec![instance_of(&captured)];
    for i in 0..18 {
        agent.signal("KILL");
        agent.wait_exit(Duration::from_secs(10));
        agent = start(if i == 17 { "pool=work" } else { "pool=idle" });
        let hello = next_hello(&mut hellos);
        instances.push(instance_of(&hello));
    }
    assert!(instances.windows(2).all(|w| w[1] > w[0]), "instances grow across restarts: {instances:?}");
    // The replay, and the client's event loop kept running (on this
    // runtime) until the coordinator has refused it.
    let refused = || std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Hello refused: replayed Hello"));
    rt.block_on(async {
        client.publish(hello_topic.clone(), QoS::AtLeastOnce, false, captured).await.expect("replay");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !refused() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    assert!(refused(), "the replay was not refused: {}", std::fs::read_to_string(&log).unwrap_or_default());
    assert!(coord.wait_exit(Duration::from_secs(90)).success());
    let summary = coord.rest_of_stdout().join("\n");
    assert!(summary.contains("12/12 trials done"), "{summary}");
    assert!(!summary.contains("requeued:"), "the replay released the victim's trial: {summary}");
    drop(agent);
    assert_spools_empty(&[state]);
}

/// Issue 20, finding 7: a broker user who connects with the client id an
/// agent had (`tf-agent-{name}`) took its connection over: the broker
/// dropped the agent, its genuine Will fired and its trials were queued
/// again. Agent client ids now end in random hex.
#[test]
fn regression_a_broker_user_with_the_agents_predictable_client_id_does_not_drop_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("s.db");
    let root = unique_root("clientid");
    let trials = 6;
    let (mut coord, url) = start_coordinator(&sleep_study(dir.path(), "clientid", trials, 0.5), &store, &root, &[]);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
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
            let opts = MqttOptions::new(format!("tf-agent-{victim}"), "127.0.0.1", port);
            let (client, mut el) = AsyncClient::new(opts, 16);
            let hold = async {
                while let Ok(ev) = el.poll().await {
                    if matches!(ev, rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) {
                        connected += 1;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_millis(800), hold).await;
            let _ = client.try_disconnect();
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
