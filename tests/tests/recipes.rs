//! The fleet recipes of docs/DEPLOY.md and docs/TROUBLESHOOTING.md
//! run as written. The Kubernetes Job's container command and the AWS Batch
//! job definition's are read from the docs and run as the platform would run
//! them: their environment resolved (the pod's name, the Service's URL, the
//! Secret; Batch's environment, secrets and array index), the image's files
//! where the image has them. The token lines are the docs' own. Only what
//! the platform provides is the test's: the broker's address, the secrets'
//! values, the container's /tmp.

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tunefleet_tests::*;

fn doc(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text of section `heading` (a `#` line, exactly) up to the next heading.
fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let start = text.find(&format!("\n{heading}\n")).unwrap_or_else(|| panic!("no section {heading:?}"));
    let body = &text[start + heading.len() + 2..];
    let end = body.find("\n#").unwrap_or(body.len());
    &body[..end]
}

/// The fenced code blocks of `lang` in `text`.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let open = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(&open) {
        let body = &rest[i + open.len()..];
        let end = body.find("```").expect("a closed block");
        out.push(body[..end].to_string());
        rest = &body[end..];
    }
    out
}

/// The arguments of the `$(tunefleet token create ...)` in `line`.
fn token_command(line: &str) -> Vec<String> {
    let start = line.find("$(tunefleet token create").expect("a token line") + 2;
    let end = start + line[start..].find(')').expect("closed");
    line[start..end].split_whitespace().skip(2).map(str::to_string).collect()
}

/// A study of 4 trials for agents tagged `pool`, each sleeping 0.2 s.
fn pool_study(dir: &Path, pool: &str) -> PathBuf {
    let text = format!(
        "name = \"{pool}-study\"\ncommand = [\"sh\", \"-c\", \"sleep 0.2; echo TUNEFLEET final v={{v}}\"]\n\
         timeout = 60\n[objective]\nmetric = \"v\"\ndirection = \"maximize\"\n[budget]\ntrials = 4\n\
         [strategy]\nkind = \"grid\"\n[hyper.v]\nkind = \"int\"\nlow = 1\nhigh = 4\n\
         [selector]\ntags = {{ pool = \"{pool}\" }}\n"
    );
    let path = dir.join(format!("{pool}.toml"));
    std::fs::write(&path, text).expect("study");
    path
}

/// The operator's shell on the coordinator's machine: the default store
/// (`tunefleet.db` in `dir`) and the test's state home.
fn operator(dir: &Path, program: &str) -> Command {
    let mut cmd = Command::new(bin(program));
    cmd.current_dir(dir).env("XDG_STATE_HOME", state_home()).env_remove("TUNEFLEET_STORE");
    cmd
}

/// Runs the docs' `tunefleet token create ...` (from `line`) in `dir`.
fn token_from_docs(dir: &Path, line: &str) -> String {
    let out = operator(dir, "tunefleet").arg("token").args(token_command(line)).output().expect("token create runs");
    assert!(out.status.success(), "{line}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A coordinator on the default store in `dir`, with `extra` flags; its URL.
fn coordinator(dir: &Path, study: &Path, extra: &[&str]) -> (Proc, String) {
    let mut cmd = operator(dir, "tunefleet");
    cmd.arg("run").arg(study).arg("--quiet").args(extra);
    if !extra.contains(&"--broker") {
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    cmd.env("TUNEFLEET_PASSWORD", "coordinator-password");
    let mut p = Proc::spawn("coordinator", cmd);
    let line = p.wait_line(Duration::from_secs(30), |l| l.starts_with("broker: "));
    (p, line.trim_start_matches("broker: ").trim().to_string())
}

/// A container running `argv` with exactly `env` (and a PATH with the
/// image's programs); its /tmp is `tmp`.
fn container(argv: &[String], env: &[(String, String)], tmp: &Path) -> Proc {
    let argv: Vec<String> =
        argv.iter().map(|a| a.replace("/tmp/tunefleet", &format!("{}/tunefleet", tmp.display()))).collect();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).env_clear().env("PATH", path_with_bins()).env("HOME", tmp);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Proc::spawn("container", cmd)
}

/// Waits for the coordinator's study to end, then stops each container as
/// its platform would (SIGTERM): each exits 0 with its spool empty.
fn study_ends_and_containers_drain(mut coord: Proc, containers: Vec<(Proc, PathBuf)>, store: &Path) {
    let status = coord.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{:?}", coord.rest_of_stdout());
    let done = query(store, "SELECT COUNT(*) FROM results WHERE success = 1", |r| r.get::<_, i64>(0));
    assert_eq!(done, vec![4]);
    for (mut c, state) in containers {
        c.signal("TERM");
        assert!(c.wait_exit(Duration::from_secs(30)).success(), "the agent drains and exits 0");
        assert_spools_empty(&[state]);
    }
}

#[test]
fn the_kubernetes_jobs_container_joins_with_its_secret_and_runs_trials() {
    let deploy = doc("DEPLOY.md");
    let k8s = section(&deploy, "### Kubernetes Job");
    let secret_line = blocks(k8s, "sh").into_iter().find(|b| b.contains("kubectl create secret")).expect("secret line");
    let yaml = blocks(k8s, "yaml").remove(0);
    // The container's command, a YAML flow sequence (JSON here).
    let command_line = yaml.lines().find(|l| l.trim_start().starts_with("command:")).expect("command");
    let argv: Vec<String> =
        serde_json::from_str(command_line.trim_start().trim_start_matches("command:").trim()).expect("argv");
    let dir = tempfile::tempdir().expect("tmp");
    let study = pool_study(dir.path(), "k8s");
    let (coord, url) = coordinator(dir.path(), &study, &[]);
    let token = token_from_docs(dir.path(), &secret_line);
    // The env the kubelet resolves, in the YAML's order.
    let mut containers = Vec::new();
    for pod in ["tunefleet-workers-0-x7k2p", "tunefleet-workers-1-q9w4m"] {
        let mut env = Vec::new();
        let mut name = None;
        for line in yaml.lines().map(str::trim) {
            if let Some(n) = line.strip_prefix("- name: ") {
                name = Some(n.to_string());
            } else if let (Some(n), Some(v)) = (name.as_ref(), line.strip_prefix("value: ")) {
                // The Service's DNS name is the test's broker.
                let v = if v.starts_with("mqtt://tunefleet-coordinator") { url.clone() } else { v.to_string() };
                env.push((n.clone(), v));
            } else if let (Some(n), Some(from)) = (name.as_ref(), line.strip_prefix("valueFrom: ")) {
                let v = if from.contains("fieldPath: metadata.name") {
                    pod.to_string()
                } else if from.contains("secretKeyRef: { name: tunefleet-join, key: token }") {
                    token.clone()
                } else {
                    panic!("a valueFrom this test cannot resolve: {from}")
                };
                env.push((n.clone(), v));
            }
        }
        assert!(env.iter().any(|(k, _)| k == "TUNEFLEET_JOIN"), "the Secret reaches the container: {env:?}");
        let tmp = dir.path().join(pod);
        std::fs::create_dir_all(&tmp).expect("the container's /tmp");
        containers.push((container(&argv, &env, &tmp), tmp.join("tunefleet")));
    }
    let store = dir.path().join("tunefleet.db");
    study_ends_and_containers_drain(coord, containers, &store);
    let agents = query(&store, "SELECT name FROM agents ORDER BY name", |r| r.get::<_, String>(0));
    assert_eq!(agents, ["tunefleet-workers-0-x7k2p", "tunefleet-workers-1-q9w4m"], "named after their pods");
}

#[test]
fn the_aws_batch_job_definitions_command_joins_over_tls_with_its_secrets() {
    let deploy = doc("DEPLOY.md");
    let batch = section(&deploy, "### AWS Batch");
    let secret_line =
        blocks(batch, "sh").into_iter().find(|b| b.contains("aws secretsmanager create-secret")).expect("secret line");
    let job: serde_json::Value = serde_json::from_str(&blocks(batch, "json").remove(0)).expect("job definition");
    let props = &job["containerProperties"];
    let argv: Vec<String> = serde_json::from_value(props["command"].clone()).expect("command");
    let dir = tempfile::tempdir().expect("tmp");
    // The image's CA file, and the broker's certificate for localhost.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fleet-certs.sh");
    let certs = dir.path().join("certs");
    let out = Command::new("bash").arg(&script).arg(&certs).arg("localhost").output().expect("fleet-certs.sh");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ca = certs.join("ca.pem").display().to_string();
    let argv: Vec<String> = argv.iter().map(|a| a.replace("/etc/tunefleet/ca.pem", &ca)).collect();
    // An external broker with server-only TLS and logins, as the docs
    // advise for Batch: mosquitto, with the job definition's user.
    use std::os::unix::fs::PermissionsExt;
    let readable = std::fs::Permissions::from_mode(0o644);
    std::fs::set_permissions(certs.join("broker.key"), readable.clone()).expect("chmod");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let passwords = dir.path().join("passwords");
    for (user, password) in [("batch", "from-secrets-manager"), ("coordinator", "coordinator-password")] {
        let mut cmd = Command::new("mosquitto_passwd");
        cmd.arg("-b");
        if !passwords.exists() {
            cmd.arg("-c");
        }
        let out = cmd.arg(&passwords).args([user, password]).output().expect("mosquitto_passwd");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::set_permissions(&passwords, readable).expect("chmod");
    let options = format!(
        "allow_anonymous false\npassword_file {}\ncertfile {1}/broker.pem\nkeyfile {1}/broker.key\n",
        passwords.display(),
        certs.display()
    );
    let mosquitto = tunefleet_tests::mosquitto::Mosquitto::start(dir.path(), &options);
    let broker = format!("mqtts://localhost:{}", mosquitto.port);
    let study = pool_study(dir.path(), "batch");
    let (coord, _) = coordinator(dir.path(), &study, &["--broker", &broker, "--ca", &ca, "--username", "coordinator"]);
    let token = token_from_docs(dir.path(), &secret_line);
    let mut containers = Vec::new();
    for index in ["0", "1"] {
        let mut env: Vec<(String, String)> = Vec::new();
        for e in props["environment"].as_array().expect("environment") {
            let (k, v) = (e["name"].as_str().expect("name"), e["value"].as_str().expect("value"));
            // The broker's address is the test's (its certificate names localhost).
            let v = if k == "TUNEFLEET_BROKER" { broker.clone() } else { v.to_string() };
            env.push((k.to_string(), v));
        }
        for s in props["secrets"].as_array().expect("secrets") {
            let k = s["name"].as_str().expect("name");
            let v = match s["valueFrom"].as_str().expect("arn") {
                arn if arn.ends_with(":secret:tunefleet-batch") => "from-secrets-manager".to_string(),
                arn if arn.ends_with(":secret:tunefleet-join") => token.clone(),
                arn => panic!("a secret this test cannot resolve: {arn}"),
            };
            env.push((k.to_string(), v));
        }
        // What Batch sets in an array child.
        env.push(("AWS_BATCH_JOB_ID".into(), format!("6f0e2c1a-9d3b-4e5f-8a7b-1c2d3e4f5a6b:{index}")));
        env.push(("AWS_BATCH_JOB_ARRAY_INDEX".into(), index.into()));
        env.push(("AWS_BATCH_JOB_ATTEMPT".into(), "1".into()));
        let tmp = dir.path().join(format!("child-{index}"));
        std::fs::create_dir_all(&tmp).expect("the container's /tmp");
        containers.push((container(&argv, &env, &tmp), tmp.join("tunefleet")));
    }
    let store = dir.path().join("tunefleet.db");
    study_ends_and_containers_drain(coord, containers, &store);
    let agents = query(&store, "SELECT name FROM agents ORDER BY name", |r| r.get::<_, String>(0));
    let parent = "batch-6f0e2c1a-9d3b-4e5f-8a7b-1c2d3e4f5a6b";
    assert_eq!(agents, [format!("{parent}-0-1"), format!("{parent}-1-1")], "one name per array child and attempt");
}

#[test]
fn the_troubleshooting_probe_line_is_admitted_and_leaves_when_idle() {
    let text = doc("TROUBLESHOOTING.md");
    let line = text.lines().find(|l| l.contains("--name probe-1")).expect("the probe line").to_string();
    let dir = tempfile::tempdir().expect("tmp");
    // No trial for the probe: it only checks the way to the broker.
    let study = pool_study(dir.path(), "nobody");
    let (mut coord, url) = coordinator(dir.path(), &study, &[]);
    let port = url.rsplit(':').next().expect("port");
    // As written, on the coordinator's machine; the port is the test's.
    let line = line.replace("127.0.0.1:1883", &format!("127.0.0.1:{port}"));
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &line]).current_dir(dir.path()).env("PATH", path_with_bins());
    cmd.env("XDG_STATE_HOME", state_home()).env_remove("TUNEFLEET_STORE").env_remove("TUNEFLEET_JOIN");
    let mut probe = Proc::spawn("probe", cmd);
    let state = agent_state_dir("probe-1");
    assert!(probe.wait_exit(Duration::from_secs(40)).success(), "admitted, idle, gone");
    let agents = query(&dir.path().join("tunefleet.db"), "SELECT name FROM agents", |r| r.get::<_, String>(0));
    assert_eq!(agents, ["probe-1"], "the probe was admitted");
    coord.signal("INT");
    let _ = coord.wait_exit(Duration::from_secs(30));
    assert_spools_empty(&[state]);
}
