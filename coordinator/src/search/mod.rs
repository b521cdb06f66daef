//! Search strategies: which parameter configurations a study runs, and how a
//! planned trial becomes the [`TrialSpec`] an agent executes.
//!
//! Everything here is pure: the plan depends only on the study (and its seed),
//! so a resumed study plans exactly the same trials.
//!
//! Each configuration is run `repeats` times as consecutive trial ids; the
//! budget counts trials, repeats included, and only whole configurations are
//! planned (`budget / repeats` of them).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tunefleet_common::message::{SystemParams, TrialRef, TrialSpec};
use tunefleet_common::params::{ParamValue, Params};
use tunefleet_common::template::{self, TemplateError};

use crate::study::{ParamSpec, Strategy, Study, SystemParam};

pub mod tpe;

/// One planned trial: a configuration and which repetition of it this is.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialPlan {
    pub trial: u64,
    pub params: Params,
    pub repeat: u32,
}

/// The trials of `study`, with ids `0..n`.
pub fn plan(study: &Study) -> Vec<TrialPlan> {
    let repeats = study.repeats.max(1);
    let wanted = study.budget / u64::from(repeats);
    let configs = match study.strategy {
        Strategy::Grid => grid(study, wanted),
        Strategy::Random { seed } => random(study, wanted, seed),
    };
    let mut out = Vec::with_capacity(configs.len().saturating_mul(repeats as usize));
    for params in configs {
        for repeat in 0..repeats {
            out.push(TrialPlan { trial: out.len() as u64, params: params.clone(), repeat });
        }
    }
    out
}

/// How many values the grid strategy takes for one parameter.
pub fn grid_len(spec: &ParamSpec) -> u64 {
    match spec {
        ParamSpec::Categorical { values } => values.len() as u64,
        ParamSpec::Int { low, high, step } => {
            // i128: no overflow for any i64 bounds; at least 1 when low <= high.
            let points = (i128::from(*high) - i128::from(*low)).max(-1) / i128::from((*step).max(1)) + 1;
            u64::try_from(points).unwrap_or(u64::MAX)
        }
        ParamSpec::Float { grid, .. } | ParamSpec::LogFloat { grid, .. } => u64::from((*grid).max(2)),
    }
}

/// The `i`-th grid value of one parameter (`i < grid_len(spec)`): ints
/// stepped from `low`, floats linear and log_floats geometric between `low`
/// and `high` (both included), categorical values in file order.
pub fn grid_value(spec: &ParamSpec, i: u64) -> ParamValue {
    match spec {
        ParamSpec::Categorical { values } => {
            values[usize::try_from(i).unwrap_or(usize::MAX).min(values.len().saturating_sub(1))].clone()
        }
        ParamSpec::Int { low, high, step } => {
            let v = i128::from(*low) + i128::from(i) * i128::from((*step).max(1));
            // Clamped to high, so the value fits in i64.
            ParamValue::Int(v.min(i128::from(*high)) as i64)
        }
        ParamSpec::Float { low, high, grid } => {
            let n = u64::from((*grid).max(2));
            ParamValue::Float(if i + 1 >= n { *high } else { low + (high - low) * i as f64 / (n - 1) as f64 })
        }
        ParamSpec::LogFloat { low, high, grid } => {
            let n = u64::from((*grid).max(2));
            let (a, b) = (low.ln(), high.ln());
            ParamValue::Float(match i {
                0 => *low,
                i if i + 1 >= n => *high,
                i => (a + (b - a) * i as f64 / (n - 1) as f64).exp(),
            })
        }
    }
}

/// Every grid value of one parameter, in order (see [`grid_value`]).
pub fn grid_values(spec: &ParamSpec) -> Vec<ParamValue> {
    (0..grid_len(spec)).map(|i| grid_value(spec, i)).collect()
}

/// Number of configurations of the full grid (saturating).
pub fn grid_size(study: &Study) -> u64 {
    study.parameters().fold(1u64, |acc, (_, spec)| acc.saturating_mul(grid_len(spec)))
}

/// The first `limit` configurations of the cartesian product, the last
/// parameter varying fastest.
fn grid(study: &Study, limit: u64) -> Vec<Params> {
    let axes: Vec<(&str, &ParamSpec, u64)> =
        study.parameters().map(|(name, spec)| (name, spec, grid_len(spec))).collect();
    let n = grid_size(study).min(limit);
    let mut out = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    let mut index = vec![0u64; axes.len()];
    for _ in 0..n {
        out.push(
            axes.iter().zip(&index).map(|((name, spec, _), &i)| (name.to_string(), grid_value(spec, i))).collect(),
        );
        // Advance the odometer.
        for (pos, (_, _, len)) in axes.iter().enumerate().rev() {
            index[pos] += 1;
            if index[pos] < *len {
                break;
            }
            index[pos] = 0;
        }
    }
    out
}

/// `count` configurations sampled with ChaCha8 seeded by `seed`.
fn random(study: &Study, count: u64, seed: u64) -> Vec<Params> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| study.parameters().map(|(name, spec)| (name.to_string(), sample(spec, &mut rng))).collect())
        .collect()
}

/// One value of `spec` drawn from `rng`.
pub fn sample(spec: &ParamSpec, rng: &mut impl Rng) -> ParamValue {
    match spec {
        ParamSpec::Categorical { values } => values[rng.random_range(0..values.len())].clone(),
        ParamSpec::Int { low, high, step } => {
            let step = (*step).max(1);
            // Points on the lattice low, low + step, ... <= high (computed in i128: no overflow).
            let points = (i128::from(*high) - i128::from(*low)) / i128::from(step) + 1;
            let k = rng.random_range(0..points);
            // In range by construction: low + k * step <= high.
            ParamValue::Int((i128::from(*low) + k * i128::from(step)) as i64)
        }
        ParamSpec::Float { low, high, .. } => {
            let u: f64 = rng.random();
            ParamValue::Float((low + (high - low) * u).clamp(*low, *high))
        }
        ParamSpec::LogFloat { low, high, .. } => {
            let u: f64 = rng.random();
            let (a, b) = (low.ln(), high.ln());
            ParamValue::Float((a + (b - a) * u).exp().clamp(*low, *high))
        }
    }
}

/// The concrete command, environment, system parameters and timeout of one
/// attempt of a planned trial.
pub fn render(study: &Study, plan: &TrialPlan, trial: &TrialRef) -> Result<TrialSpec, TemplateError> {
    let mut values = plan.params.clone();
    values.insert("study".into(), ParamValue::Text(study.name.clone()));
    values.insert("trial".into(), ParamValue::Int(clamp_i64(trial.trial)));
    values.insert("attempt".into(), ParamValue::Int(i64::from(trial.attempt)));
    values.insert("repeat".into(), ParamValue::Int(i64::from(plan.repeat)));
    let argv = study.command.iter().map(|arg| template::render(arg, &values)).collect::<Result<Vec<_>, _>>()?;
    let env = study
        .env
        .iter()
        .map(|(k, v)| Ok((k.clone(), template::render(v, &values)?)))
        .collect::<Result<Vec<_>, TemplateError>>()?;
    Ok(TrialSpec { argv, env, system: system_params(&plan.params), timeout_ms: study.timeout_ms() })
}

/// The system parameters present in `params`.
pub fn system_params(params: &Params) -> SystemParams {
    let get = |p: SystemParam| params.get(p.as_str()).and_then(ParamValue::as_u64);
    SystemParams {
        cores: get(SystemParam::Cores).and_then(|v| u32::try_from(v).ok()),
        threads: get(SystemParam::Threads).and_then(|v| u32::try_from(v).ok()),
        memory_mib: get(SystemParam::Memory),
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study;

    fn study(space: &str, strategy: &str, budget: u64, repeats: u32) -> Study {
        let text = format!(
            r#"name = "s"
command = ["run", "--study={{study}}", "--trial={{trial}}", "--attempt={{attempt}}", "--repeat={{repeat}}", "{{a}}"]
env = {{ SEED = "{{trial}}-{{repeat}}" }}
timeout = 5
repeats = {repeats}
[objective]
metric = "loss"
direction = "minimize"
[budget]
trials = {budget}
[strategy]
{strategy}
{space}"#
        );
        study::parse(&text, "test.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    const SPACE: &str = r#"
[hyper.a]
kind = "categorical"
values = ["x", "y"]
[hyper.b]
kind = "int"
low = 1
high = 7
step = 3
[system.threads]
kind = "int"
low = 1
high = 2
"#;

    fn f(v: &ParamValue) -> f64 {
        v.as_f64().expect("numeric")
    }

    #[test]
    fn grid_is_the_cartesian_product_in_stable_order() {
        let s = study(SPACE, "kind = \"grid\"", 100, 1);
        assert_eq!(grid_size(&s), 2 * 3 * 2);
        let p = plan(&s);
        assert_eq!(p.len(), 12);
        let row =
            |t: &TrialPlan| (t.params["a"].to_string(), t.params["b"].to_string(), t.params["threads"].to_string());
        let rows: Vec<_> = p.iter().map(row).collect();
        let s3 = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());
        assert_eq!(rows[0], s3("x", "1", "1"));
        assert_eq!(rows[1], s3("x", "1", "2"));
        assert_eq!(rows[2], s3("x", "4", "1"));
        assert_eq!(rows[5], s3("x", "7", "2"));
        assert_eq!(rows[6], s3("y", "1", "1"));
        assert_eq!(rows[11], s3("y", "7", "2"));
        assert!(p.iter().enumerate().all(|(i, t)| t.trial == i as u64 && t.repeat == 0));
        // Every configuration exactly once.
        let mut unique = rows.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), 12);
    }

    #[test]
    fn grid_is_truncated_to_the_budget_and_repeats_count() {
        let s = study(SPACE, "kind = \"grid\"", 5, 1);
        assert_eq!(plan(&s).len(), 5);
        let s = study(SPACE, "kind = \"grid\"", 7, 3);
        let p = plan(&s);
        // Two whole configurations of three repeats each.
        assert_eq!(p.len(), 6);
        assert_eq!(p.iter().map(|t| t.repeat).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(p.iter().map(|t| t.trial).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(p[0].params, p[2].params);
        assert_ne!(p[2].params, p[3].params);
    }

    #[test]
    fn float_grids_are_linear_and_log_grids_geometric() {
        assert_eq!(
            grid_values(&ParamSpec::Float { low: 0.0, high: 1.0, grid: 5 }).iter().map(f).collect::<Vec<_>>(),
            vec![0.0, 0.25, 0.5, 0.75, 1.0]
        );
        let log: Vec<f64> =
            grid_values(&ParamSpec::LogFloat { low: 0.001, high: 1.0, grid: 4 }).iter().map(f).collect();
        assert_eq!(log.len(), 4);
        assert_eq!((log[0], log[3]), (0.001, 1.0));
        assert!((log[1] - 0.01).abs() < 1e-12 && (log[2] - 0.1).abs() < 1e-12, "{log:?}");
        assert_eq!(
            grid_values(&ParamSpec::Int { low: -2, high: 3, step: 2 }),
            vec![ParamValue::Int(-2), ParamValue::Int(0), ParamValue::Int(2)]
        );
    }

    #[test]
    fn huge_int_ranges_are_not_materialised() {
        let spec = ParamSpec::Int { low: i64::MIN, high: i64::MAX, step: 1 };
        assert_eq!(grid_len(&spec), u64::MAX);
        assert_eq!(grid_value(&spec, 0), ParamValue::Int(i64::MIN));
        assert_eq!(grid_value(&spec, u64::MAX), ParamValue::Int(i64::MAX));
        let text = "[hyper.a]\nkind = \"int\"\nlow = -9223372036854775808\nhigh = 9223372036854775807\n";
        let p = plan(&study(&format!("{text}[hyper.b]\nkind = \"int\"\nlow = 0\nhigh = 1\n"), "kind = \"grid\"", 3, 1));
        let a: Vec<_> = p.iter().map(|t| (t.params["a"].clone(), t.params["b"].clone())).collect();
        let min = ParamValue::Int(i64::MIN);
        assert_eq!(
            a,
            vec![
                (min.clone(), ParamValue::Int(0)),
                (min, ParamValue::Int(1)),
                (ParamValue::Int(i64::MIN + 1), ParamValue::Int(0))
            ]
        );
    }

    #[test]
    fn random_is_deterministic_per_seed() {
        let space = "[hyper.a]\nkind = \"float\"\nlow = -1\nhigh = 1\n";
        let a = plan(&study(space, "kind = \"random\"\nseed = 7", 20, 1));
        let b = plan(&study(space, "kind = \"random\"\nseed = 7", 20, 1));
        let c = plan(&study(space, "kind = \"random\"\nseed = 8", 20, 1));
        assert_eq!(a.len(), 20);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn random_respects_ranges_lattices_and_log_scale() {
        let space = r#"
[hyper.a]
kind = "categorical"
values = ["x", "y", "z"]
[hyper.lr]
kind = "log_float"
low = 0.0001
high = 1.0
[hyper.m]
kind = "float"
low = 2.5
high = 3.5
[hyper.n]
kind = "int"
low = -5
high = 6
step = 4
"#;
        let p = plan(&study(space, "kind = \"random\"\nseed = 3", 2000, 1));
        assert_eq!(p.len(), 2000);
        let mut below_1e2 = 0;
        let mut seen_n = std::collections::BTreeSet::new();
        for t in &p {
            let lr = f(&t.params["lr"]);
            assert!((0.0001..=1.0).contains(&lr), "{lr}");
            if lr < 0.01 {
                below_1e2 += 1;
            }
            let m = f(&t.params["m"]);
            assert!((2.5..=3.5).contains(&m), "{m}");
            let ParamValue::Int(n) = t.params["n"] else { panic!("n is an int") };
            assert!([-5, -1, 3].contains(&n), "{n} off the lattice");
            seen_n.insert(n);
            assert!(["x", "y", "z"].contains(&t.params["a"].to_string().as_str()));
        }
        assert_eq!(seen_n.len(), 3);
        // Log-uniform on [1e-4, 1]: half of the mass lies below 1e-2 (uniform would give 1%).
        assert!((800..1200).contains(&below_1e2), "{below_1e2} of 2000 below 0.01");
    }

    #[test]
    fn random_repeats_share_a_configuration() {
        let p = plan(&study(SPACE, "kind = \"random\"\nseed = 1", 9, 3));
        assert_eq!(p.len(), 9);
        for chunk in p.chunks(3) {
            assert!(chunk.iter().all(|t| t.params == chunk[0].params));
            assert_eq!(chunk.iter().map(|t| t.repeat).collect::<Vec<_>>(), vec![0, 1, 2]);
        }
    }

    #[test]
    fn render_substitutes_params_and_builtins() {
        let mem = "[hyper.a]\nkind = \"categorical\"\nvalues = [\"x\"]\n\
                   [system.cores]\nkind = \"int\"\nlow = 1\nhigh = 2\n\
                   [system.memory]\nkind = \"categorical\"\nvalues = [256]\n";
        let s = study(mem, "kind = \"grid\"", 4, 2);
        let p = plan(&s);
        let t = &p[3];
        let r = TrialRef { study: "s".into(), trial: t.trial, attempt: 2 };
        let spec = render(&s, t, &r).expect("renders");
        assert_eq!(spec.argv, vec!["run", "--study=s", "--trial=3", "--attempt=2", "--repeat=1", "x"]);
        assert_eq!(spec.env, vec![("SEED".to_string(), "3-1".to_string())]);
        assert_eq!(spec.system, SystemParams { cores: Some(2), threads: None, memory_mib: Some(256) });
        assert_eq!(spec.timeout_ms, 5000);
    }

    proptest::proptest! {
        #[test]
        fn samples_stay_in_range_and_on_the_lattice(
            seed in proptest::prelude::any::<u64>(),
            low in -1_000_000i64..1_000_000,
            span in 1i64..1_000_000,
            step in 1i64..1000,
            flow in -1e6f64..1e6,
            fspan in 1e-9f64..1e6,
            lexp in -12i32..3,
            ldec in 1i32..12,
        ) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let int = ParamSpec::Int { low, high: low + span, step };
            let float = ParamSpec::Float { low: flow, high: flow + fspan, grid: 3 };
            let (llow, lhigh) = (10f64.powi(lexp), 10f64.powi(lexp + ldec));
            let log = ParamSpec::LogFloat { low: llow, high: lhigh, grid: 3 };
            for _ in 0..16 {
                let ParamValue::Int(i) = sample(&int, &mut rng) else { panic!("int") };
                proptest::prop_assert!(i >= low && i <= low + span && (i - low) % step == 0, "{i}");
                let x = f(&sample(&float, &mut rng));
                proptest::prop_assert!(x >= flow && x <= flow + fspan, "{x}");
                let y = f(&sample(&log, &mut rng));
                proptest::prop_assert!(y >= llow && y <= lhigh, "{y}");
            }
            for v in grid_values(&int) {
                let ParamValue::Int(i) = v else { panic!("int") };
                proptest::prop_assert!(i >= low && i <= low + span && (i - low) % step == 0);
            }
        }
    }

    #[test]
    fn render_reports_unknown_placeholders() {
        let mut s = study(SPACE, "kind = \"grid\"", 1, 1);
        s.command.push("{nope}".into());
        let p = plan(&s);
        let r = TrialRef { study: "s".into(), trial: 0, attempt: 1 };
        assert!(matches!(render(&s, &p[0], &r), Err(TemplateError::Unknown { name, .. }) if name == "nope"));
    }
}
