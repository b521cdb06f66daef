//! A spot check of the search benchmark with real processes: a
//! `kind = "tpe"` (or, with `SPOT_KIND=gp`, `kind = "gp"`) study of the
//! Branin function run by `tunefleet run` and one agent, each trial an
//! `awk` process reporting the value. Ignored by default (about 30 s a
//! seed); `scripts/bench-search.sh` names how to run it and BENCHMARKS.md
//! holds what it printed:
//!
//!   SPOT_KIND=gp SPOT_SEEDS=3 SPOT_SLOTS=1 cargo test -p tunefleet-tests --test search_spot -- --ignored --nocapture

// The full tier: this file needs installs (scripts/needs.sh) or minutes;
// `cargo test --workspace` leaves it out, scripts/test.sh runs it.
#![cfg(feature = "full")]

use std::time::Duration;

use tunefleet_tests::*;

const BRANIN_MIN: f64 = 0.397_887_357_729_738;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore]
fn tpe_on_branin_with_real_processes() {
    let (seeds, slots, budget) = (env_number("SPOT_SEEDS", 3), env_number("SPOT_SLOTS", 1), 50);
    let kind = std::env::var("SPOT_KIND").unwrap_or_else(|_| "tpe".into());
    for seed in 0..seeds {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = format!(
            r#"name = "spot"
command = ["awk", "-v", "x1={{x1}}", "-v", "x2={{x2}}", "BEGIN {{{{ pi = atan2(0, -1); b = 5.1 / (4 * pi * pi); c = 5 / pi; t = 1 / (8 * pi); printf \"TUNEFLEET epoch=1 v=%.17g\\n\", (x2 - b * x1 * x1 + c * x1 - 6) ^ 2 + 10 * (1 - t) * cos(x1) + 10 }}}}"]
timeout = 30
[objective]
metric = "v"
direction = "minimize"
[budget]
trials = {budget}
[strategy]
kind = "{kind}"
seed = {seed}
[hyper.x1]
kind = "float"
low = -5
high = 10
[hyper.x2]
kind = "float"
low = 0
high = 15
"#
        );
        let study = dir.path().join("spot.toml");
        std::fs::write(&study, text).expect("study");
        let store = dir.path().join("store.db");
        let slots = slots.to_string();
        let out = run_with_one_agent(&study, &store, "spot", &["--slots", &slots], Duration::from_secs(600));
        let values: Vec<f64> = query(
            &store,
            "SELECT objective FROM results WHERE study = 'spot' AND objective IS NOT NULL ORDER BY trial",
            |r| r.get(0),
        );
        assert_eq!(values.len(), budget as usize, "{out}");
        let best = values.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(best.is_finite() && best >= BRANIN_MIN - 1e-9, "{best}");
        // The summary's count of the trials in flight at each ask.
        let depth = out.lines().find(|l| l.starts_with("search: ")).unwrap_or("search: not printed");
        println!(
            "{{\"side\":\"tunefleet-{kind}-real\",\"fn\":\"branin\",\"seed\":{seed},\"workers\":{slots},\"regret50\":{},\"depth\":{depth:?}}}",
            best - BRANIN_MIN
        );
    }
}
