//! The cost of one `gp` ask at 100, 300 and 1,000 told trials,
//! with 0 and 4 trials in flight: a study of 6 floats (hartmann6's space)
//! told random configurations, then `ASKS` asks timed one by one, each
//! after one more trial is told, as in a study (median, smallest and
//! largest, after the first, whose hyper-parameters fit is timed alone).
//! Every ask the `gp` search makes between two refits of its
//! hyper-parameters costs what the median says.
//!
//! Usage: `gp_ask_cost [ASKS]`; `GP_REFIT_FROM=1000000` fits the
//! hyper-parameters at every ask, as the first gp did; `GP_ASK_TOLD=1000`
//! times only that count (comma-separated counts).

use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tunefleet_common::params::{ParamValue, Params};
use tunefleet_search::gp::{Gp, GpSettings};
use tunefleet_search::space::{Direction, ParamSpec};
use tunefleet_search::{Outcome, Sampler};

fn main() {
    let asks: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let space: Vec<(String, ParamSpec)> =
        (0..6).map(|i| (format!("x{i}"), ParamSpec::Float { low: 0.0, high: 1.0, grid: 2 })).collect();
    // GP_ASK_TOLD: other told counts (comma-separated), e.g. one to profile.
    let tolds: Vec<u64> = std::env::var("GP_ASK_TOLD")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![100, 300, 1000]);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for told in tolds {
        for in_flight in [0usize, 4] {
            let mut settings = GpSettings::default();
            if let Some(from) = std::env::var("GP_REFIT_FROM").ok().and_then(|v| v.parse().ok()) {
                settings.refit_from = from;
            }
            if let Some(points) = std::env::var("GP_MODEL_POINTS").ok().and_then(|v| v.parse().ok()) {
                settings.model_points = points;
            }
            let mut gp = Gp::new(space.clone(), Direction::Minimize, 1, 7, settings);
            let tell = |gp: &mut Gp, t: u64, rng: &mut ChaCha8Rng| {
                let p: Params = space.iter().map(|(n, _)| (n.clone(), ParamValue::Float(rng.random()))).collect();
                let v: f64 = space.iter().map(|(n, _)| (p[n].as_f64().unwrap_or(0.0) - 0.3).powi(2)).sum();
                gp.tell(t, &p, Outcome::Complete(v));
            };
            for t in 0..told {
                tell(&mut gp, t, &mut rng);
            }
            let running: Vec<(u64, Params)> = (0..in_flight as u64)
                .map(|k| {
                    (1_000_000 + k, space.iter().map(|(n, _)| (n.clone(), ParamValue::Float(rng.random()))).collect())
                })
                .collect();
            let view: Vec<(u64, &Params)> = running.iter().map(|(t, p)| (*t, p)).collect();
            let mut times = Vec::new();
            for k in 0..=asks as u64 {
                if k > 0 {
                    tell(&mut gp, told + k, &mut rng);
                }
                let started = Instant::now();
                let _ = gp.ask(told + 100 + k, &view);
                times.push(started.elapsed().as_secs_f64() * 1e3);
            }
            let first = times.remove(0);
            times.sort_by(f64::total_cmp);
            println!(
                "told {told:>5}, in flight {in_flight}: first ask (fits) {first:7.1} ms, then median {:6.1} ms, range {:6.1} to {:6.1} ms",
                times[times.len() / 2],
                times[0],
                times[times.len() - 1]
            );
        }
    }
}
