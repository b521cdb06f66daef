//! GPUs as a resource. Real coordinator and agent processes on
//! the embedded broker; the agent loads a stand-in NVML built here from
//! `agent/tests/nvml/standin.c` (two GPUs: one with an energy counter
//! that advances at 300 W, one without, drawing 150 W), through the same
//! path as the driver's library. A study asks one GPU per trial; the agent
//! has three slots: never two trials on one GPU, each trial told its own
//! in `CUDA_VISIBLE_DEVICES`, and its energy its CPU share plus its GPU's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tunefleet_tests::*;

#[path = "../../agent/tests/nvml/mod.rs"]
mod nvml;

/// A study of `trials` trials of one GPU each ([`sleep_study`]'s, its
/// command a script that logs when it starts and ends and what
/// `CUDA_VISIBLE_DEVICES` said, sleeping between).
fn gpu_study(dir: &Path, trials: u32, log: &Path) -> PathBuf {
    let script = dir.join("trial.sh");
    std::fs::write(
        &script,
        "log=\"$1\"\n\
         echo \"start $2 ${CUDA_VISIBLE_DEVICES-unset} $(date +%s%N)\" >> \"$log\"\n\
         sleep 0.6\n\
         echo \"end $2 ${CUDA_VISIBLE_DEVICES-unset} $(date +%s%N)\" >> \"$log\"\n\
         echo '{\"event\":\"final\",\"v\":'\"$2\"'}'\n",
    )
    .expect("script");
    let path = sleep_study(dir, "gpus", trials, 0.6);
    let text = std::fs::read_to_string(&path).expect("study");
    let command = format!("command = [\"sh\", \"{}\", \"{}\", \"{{v}}\"]\ngpus = 1", script.display(), log.display());
    let text: String = text
        .lines()
        .map(|l| if l.starts_with("command = ") { command.clone() } else { l.to_string() } + "\n")
        .collect();
    assert!(text.contains("gpus = 1\n") && text.contains("trial.sh"), "{text}");
    std::fs::write(&path, text).expect("study");
    path
}

#[test]
fn each_trial_gets_a_gpu_of_its_own_and_its_energy_counts_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let lib = nvml::standin(dir.path());
    nvml::fixture(&lib, "H200 GPU-aaaa rate:300000 300000\nH200 GPU-bbbb - 150000\n");
    let log = dir.path().join("trials.log");
    let trials = 6;
    let study = gpu_study(dir.path(), trials, &log);
    let store = dir.path().join("s.db");
    let root = unique_root("gpus");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &[]);
    let name = format!("{root}-agent");
    let lib_arg = lib.display().to_string();
    let agent = start_agent(&url, &name, &root, &["--slots", "3", "--nvml-lib", &lib_arg]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done")), "{out}");
    drop(agent);
    assert_agents_spools_empty(&[&name]);

    // Each trial saw one GPU; no GPU ran two trials at once; both were used.
    let text = std::fs::read_to_string(&log).expect("log");
    let mut spans: BTreeMap<String, Vec<(String, u128, u128)>> = BTreeMap::new();
    let mut starts: BTreeMap<String, (String, u128)> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 4, "one GPU named per trial: {line:?}");
        let (what, trial, gpu, at) = (f[0], f[1].to_string(), f[2].to_string(), f[3].parse::<u128>().expect("ns"));
        assert!(gpu == "GPU-aaaa" || gpu == "GPU-bbbb", "{line:?}");
        match what {
            "start" => {
                starts.insert(trial, (gpu, at));
            }
            _ => {
                let (g, from) = starts.remove(&trial).expect("started");
                assert_eq!(g, gpu);
                spans.entry(gpu).or_default().push((trial, from, at));
            }
        }
    }
    assert_eq!(spans.values().map(Vec::len).sum::<usize>(), trials as usize, "{text}");
    assert_eq!(spans.len(), 2, "both GPUs used: {text}");
    for (gpu, list) in &mut spans {
        list.sort_by_key(|s| s.1);
        for w in list.windows(2) {
            assert!(w[0].2 <= w[1].1, "{gpu} ran trials {} and {} at once:\n{text}", w[0].0, w[1].0);
        }
    }

    // Each result: one GPU reading, of the GPU it ran on; the trial's
    // energy is its CPU share and its GPU's, the GPU's apart.
    let rows: Vec<(i64, f64, Option<f64>, i64, String)> = query(
        &store,
        "SELECT trial, energy_j, gpu_energy_j, wall_us, measurement FROM results WHERE study = 'gpus' ORDER BY trial",
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
    );
    assert_eq!(rows.len(), trials as usize);
    for (trial, energy, gpu, wall_us, json) in rows {
        let m: serde_json::Value = serde_json::from_str(&json).expect("measurement");
        let readings = m["gpus"].as_array().expect("gpus");
        assert_eq!(readings.len(), 1, "trial {trial}: {readings:?}");
        let r = &readings[0];
        assert_eq!(r["valid"], true, "trial {trial}: {r}");
        let gpu = gpu.expect("a GPU part");
        let cpu = m["energy"]["joules"].as_f64().expect("cpu joules");
        assert!((energy - (cpu + gpu)).abs() < 1e-6, "trial {trial}: {energy} = {cpu} + {gpu}");
        let watts = gpu / (wall_us as f64 / 1e6);
        let (expected, method) = match r["uuid"].as_str() {
            Some("GPU-aaaa") => (300.0, "counter"),
            Some("GPU-bbbb") => (150.0, "power_integrated"),
            other => panic!("trial {trial} on {other:?}"),
        };
        assert_eq!(r["method"], method, "trial {trial}");
        assert!((watts / expected - 1.0).abs() < 0.15, "trial {trial}: {watts:.1} W from its GPU, expected {expected}");
    }
}

/// The GPUs of the named agent's row in the store, as the coordinator recorded them.
fn recorded_gpus(store: &Path, name: &str) -> usize {
    let info: Vec<String> = query(store, &format!("SELECT info FROM agents WHERE name = '{name}'"), |r| r.get(0));
    let info: serde_json::Value = serde_json::from_str(info.first().expect("agent row")).expect("json");
    info["gpus"].as_array().map_or(0, Vec::len)
}

#[test]
fn regression_gpus_are_granted_not_claimed() {
    use tunefleet_common::message::{AgentInfo, AgentMessage, CoordinatorMessage, GpuDevice, WorkRequest};
    use tunefleet_tests::member::{Answer, Member};
    let dir = tempfile::tempdir().expect("tmp");
    let lib = nvml::standin(dir.path());
    nvml::fixture(&lib, "H200 GPU-aaaa rate:300000 300000\nH200 GPU-bbbb - 150000\n");
    let log = dir.path().join("trials.log");
    let trials = 12;
    let study = gpu_study(dir.path(), trials, &log);
    let store = dir.path().join("s.db");
    let root = unique_root("gpugrant");
    let (mut coord, url) = start_coordinator(&study, &store, &root, &["--max-gpus-per-agent", "3"]);
    let port: u16 = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    // A member claiming 64 GPUs under a token that grants 2, another under the fleet's token (cap 3).
    let claims = AgentInfo {
        slots: 64,
        lookahead: 0,
        gpus: (0..64)
            .map(|index| GpuDevice { index, uuid: format!("GPU-fake-{index}"), name: "fake".into() })
            .collect(),
        ..AgentInfo::minimal("x", 0)
    };
    let granted: tunefleet_common::auth::JoinToken =
        create_join_token(&store, &["--gpus", "2", "--lookahead", "0"]).parse().expect("token");
    let fleet: tunefleet_common::auth::JoinToken = join_token_of(&root).expect("token").parse().expect("token");
    let mut taken = Vec::new();
    for (name, token) in [("hoarder-g", &granted), ("hoarder-f", &fleet)] {
        let mut member = Member::connect(port, &root, name);
        assert!(matches!(member.hello(claims.clone(), Some(token)), Answer::Welcome), "{name}");
        member.send(&AgentMessage::Request(WorkRequest { seq: 1, free: 64, ahead: 0, running: vec![], held: vec![] }));
        let got = member.receive(Duration::from_secs(2));
        taken.push(got.iter().filter(|m| matches!(m, CoordinatorMessage::Assign(_))).count());
        assert_eq!(recorded_gpus(&store, name), taken.last().copied().unwrap_or(0), "{name}");
        member.go_offline();
        member.disconnect();
    }
    assert_eq!(taken, [2, 3], "the token's grant, then the fleet's cap: not the 64 claimed");
    // An honest agent with two GPUs runs the study, the trials the members dropped included.
    let name = format!("{root}-honest");
    let lib_arg = lib.display().to_string();
    let agent = start_agent(&url, &name, &root, &["--slots", "2", "--nvml-lib", &lib_arg]);
    let status = coord.wait_exit(Duration::from_secs(120));
    let out = coord.rest_of_stdout().join("\n");
    assert!(status.success(), "{out}");
    assert!(out.contains(&format!("{trials}/{trials} trials done, 0 failed")), "{out}");
    drop(agent);
    assert_agents_spools_empty(&[&name]);
}
