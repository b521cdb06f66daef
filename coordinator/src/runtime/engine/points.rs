//! The points a trial result becomes in InfluxDB, as line protocol.
//!
//! Three measurements, every point tagged `study`, `trial`, `attempt`,
//! `agent` and `source` (the energy source):
//!
//! - `tunefleet_trial`: one summary per accepted result, at the moment the
//!   workload ended. Fields `wall_s`, `user_s`, `sys_s`, `cpu_s`,
//!   `max_rss_kib`, `success`, `exit_code` (when it exited), `energy_j` (the
//!   trial's whole energy: its CPU share and its GPUs'), for a trial given
//!   GPUs `cpu_energy_j` and `gpu_energy_j` (the two parts), `cpu_share`
//!   where the CPU reading was the machine's, shared with other trials by
//!   CPU time (`cpu_energy_j` is that share of it), and `objective`
//!   (when known); tags `exit` (how it ended) and `valid` (whether the
//!   energy figure, every part of it, can be trusted).
//! - `tunefleet_energy`: one point per energy domain, also at the end. Field
//!   `joules`; tags `domain`, `in_total` (false for a sub-zone already counted
//!   in its package) and `valid`. A GPU is a domain `gpu-N` (its index),
//!   tagged `gpu` (its UUID) and `method` (`counter` or `power_integrated`),
//!   `valid` its own reading's (a CPU domain's and a power sample's
//!   `valid` is the CPU reading's).
//! - `tunefleet_power`: the power time series of the run, one point per
//!   sample at the start time plus its `elapsed_ms`. Field `watts`; tags
//!   `domain` (`total`: the counted domains) and `valid`.
//!
//! Timestamps are Unix milliseconds taken from the measurement itself, so the
//! same result always gives the same points: writing them twice overwrites
//! (InfluxDB keeps one value per measurement, tag set, field and timestamp).
//! Values that line protocol cannot carry are left out: non-finite numbers,
//! empty tags. Control characters and backslashes in tag values become `_`.

use influxdb2::models::{DataPoint, WriteDataPoint};
use tunefleet_common::measurement::{ExitOutcome, Measurement};
use tunefleet_common::message::TrialRef;

/// The per-trial summary measurement.
pub const TRIAL: &str = "tunefleet_trial";
/// The per-domain energy measurement.
pub const ENERGY: &str = "tunefleet_energy";
/// The power time-series measurement.
pub const POWER: &str = "tunefleet_power";

/// The points of one accepted result, one line-protocol line each (without
/// newline), timestamps in milliseconds. `objective` is the value the study
/// optimises, when the trial has one.
pub fn trial_points(trial: &TrialRef, agent: &str, m: &Measurement, objective: Option<f64>) -> Vec<String> {
    let energy = &m.energy;
    let whole = m.energy_figure();
    let start = i64::try_from(m.started_unix_ms).unwrap_or(i64::MAX);
    let end = start.saturating_add(i64::try_from(m.wall_us / 1000).unwrap_or(i64::MAX));
    // Every point's tags, with the source and the validity of what it shows.
    let tags = |source: &str, counts: bool| {
        [
            ("study", trial.study.clone()),
            ("trial", trial.trial.to_string()),
            ("attempt", trial.attempt.to_string()),
            ("agent", agent.to_string()),
            ("source", source.to_string()),
            ("valid", counts.to_string()),
        ]
    };
    // The CPU reading's domains and power, as read; the summary's validity is the whole figure's.
    let common = tags(energy.source.as_str(), energy.counted().is_some());
    let mut out = Vec::with_capacity(1 + energy.domains.len() + m.gpus.len() + energy.series.len());

    let mut summary = LinePoint::new(TRIAL, &tags(energy.source.as_str(), whole.counted().is_some()), end)
        .tag("exit", exit_kind(&m.exit))
        .float("wall_s", m.wall_us as f64 / 1e6)
        .float("user_s", m.user_us as f64 / 1e6)
        .float("sys_s", m.sys_us as f64 / 1e6)
        .float("cpu_s", (m.user_us + m.sys_us) as f64 / 1e6)
        .int("max_rss_kib", i64::try_from(m.max_rss_kib).unwrap_or(i64::MAX))
        .bool("success", m.exit.success())
        .float("energy_j", whole.joules.unwrap_or(f64::NAN));
    if let Some(gpu) = m.gpu_joules() {
        summary = summary.float("cpu_energy_j", m.cpu_joules()).float("gpu_energy_j", gpu);
    }
    if let Some(share) = m.cpu_share {
        summary = summary.float("cpu_share", share);
    }
    if let ExitOutcome::Exited(code) = m.exit {
        summary = summary.int("exit_code", i64::from(code));
    }
    if let Some(v) = objective {
        summary = summary.float("objective", v);
    }
    out.extend(summary.line());

    for d in &energy.domains {
        let p = LinePoint::new(ENERGY, &common, end)
            .tag("domain", &d.domain)
            .tag("in_total", if d.in_total { "true" } else { "false" })
            .float("joules", d.joules);
        out.extend(p.line());
    }
    for g in &m.gpus {
        let p = LinePoint::new(ENERGY, &tags("nvml", g.figure().counted().is_some()), end)
            .tag("domain", &format!("gpu-{}", g.index))
            .tag("gpu", &g.uuid)
            .tag("method", g.method.as_str())
            .tag("in_total", "true")
            .float("joules", g.joules);
        out.extend(p.line());
    }
    for s in &energy.series {
        let at = start.saturating_add(i64::try_from(s.elapsed_ms).unwrap_or(i64::MAX));
        out.extend(LinePoint::new(POWER, &common, at).tag("domain", "total").float("watts", s.watts).line());
    }
    out
}

/// How the workload ended, as a short tag value.
pub fn exit_kind(exit: &ExitOutcome) -> &'static str {
    match exit {
        ExitOutcome::Exited(_) => "exited",
        ExitOutcome::Signaled(_) => "signaled",
        ExitOutcome::TimedOut => "timed_out",
        ExitOutcome::Cancelled => "cancelled",
        ExitOutcome::SpawnFailed(_) => "spawn_failed",
    }
}

/// A tag value line protocol can carry: control characters (a newline would
/// end the line) and backslashes (which escape what follows) become `_`.
pub fn clean_tag(value: &str) -> String {
    value.chars().map(|c| if c.is_control() || c == '\\' { '_' } else { c }).collect()
}

/// A point under construction; skips what line protocol cannot hold.
struct LinePoint {
    builder: influxdb2::models::data_point::DataPointBuilder,
}

impl LinePoint {
    fn new(measurement: &str, tags: &[(&str, String)], at_ms: i64) -> Self {
        let p = LinePoint { builder: DataPoint::builder(measurement).timestamp(at_ms) };
        tags.iter().fold(p, |p, (k, v)| p.tag(k, v))
    }

    fn tag(mut self, key: &str, value: &str) -> Self {
        let value = clean_tag(value);
        if !value.is_empty() {
            self.builder = self.builder.tag(key, value);
        }
        self
    }

    fn float(mut self, key: &str, value: f64) -> Self {
        if value.is_finite() {
            self.builder = self.builder.field(key, value);
        }
        self
    }

    fn int(mut self, key: &str, value: i64) -> Self {
        self.builder = self.builder.field(key, value);
        self
    }

    fn bool(mut self, key: &str, value: bool) -> Self {
        self.builder = self.builder.field(key, value);
        self
    }

    /// The line, or nothing when no field survived.
    fn line(self) -> Option<String> {
        let point = self.builder.build().ok()?;
        let mut buf = Vec::with_capacity(256);
        // Writing into a Vec cannot fail.
        point.write_data_point_to(&mut buf).ok()?;
        let mut line = String::from_utf8(buf).ok()?;
        if line.ends_with('\n') {
            line.pop();
        }
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{DomainEnergy, EnergyReading, EnergySourceKind, PowerSample};

    fn measurement() -> Measurement {
        Measurement {
            started_unix_ms: 1_700_000_000_000,
            wall_us: 2_500_000,
            user_us: 1_000_000,
            sys_us: 250_000,
            max_rss_kib: 4096,
            energy: EnergyReading {
                joules: 12.5,
                domains: vec![
                    DomainEnergy { domain: "package-0".into(), joules: 12.5, in_total: true },
                    DomainEnergy { domain: "package-0/core".into(), joules: 9.0, in_total: false },
                ],
                interval_ms: 1000,
                valid: true,
                note: None,
                series: vec![
                    PowerSample { elapsed_ms: 1000, watts: 5.0 },
                    PowerSample { elapsed_ms: 2000, watts: f64::NAN },
                    PowerSample { elapsed_ms: 2500, watts: 4.0 },
                ],
                ..EnergyReading::none(EnergySourceKind::Rapl, "")
            },
            ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
        }
    }

    #[test]
    fn a_trial_given_gpus_has_its_whole_energy_and_each_part_apart() {
        use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
        let mut m = measurement();
        m.gpus = vec![
            GpuEnergy {
                index: 1,
                uuid: "GPU-b".into(),
                joules: 200.0,
                method: GpuMethod::Counter,
                valid: true,
                note: None,
            },
            GpuEnergy {
                index: 3,
                uuid: "GPU-d".into(),
                joules: 87.5,
                method: GpuMethod::PowerIntegrated,
                valid: true,
                note: None,
            },
        ];
        m.cpu_share = Some(0.8);
        let lines = trial_points(&trial(), "agent-1", &m, None);
        let summary = &lines[0];
        assert!(summary.contains("energy_j=297.5,") && summary.contains("cpu_energy_j=10,"), "{summary}");
        assert!(summary.contains("cpu_share=0.8,"), "{summary}");
        assert!(summary.contains("gpu_energy_j=287.5,") && summary.contains("valid=true"), "{summary}");
        let gpu: Vec<&String> = lines.iter().filter(|l| l.contains("domain=gpu-")).collect();
        assert_eq!(gpu.len(), 2, "{lines:#?}");
        assert!(gpu[0].contains("domain=gpu-1,gpu=GPU-b,") && gpu[0].contains("method=counter,"), "{}", gpu[0]);
        assert!(gpu[0].contains("source=nvml,") && gpu[0].contains(" joules=200 "), "{}", gpu[0]);
        assert!(gpu[1].contains("method=power_integrated,") && gpu[1].contains(" joules=87.5 "), "{}", gpu[1]);
        // One GPU read failed: that point and the trial's whole figure say so.
        m.gpus[1].valid = false;
        let lines = trial_points(&trial(), "agent-1", &m, None);
        assert!(lines[0].contains("valid=false"), "{}", lines[0]);
        let failed = lines.iter().find(|l| l.contains("domain=gpu-3")).expect("its point");
        assert!(failed.contains("valid=false"), "{failed}");
        let fine = lines.iter().find(|l| l.contains("domain=gpu-1")).expect("its point");
        assert!(fine.contains("valid=true"), "{fine}");
        let cpu = lines.iter().find(|l| l.contains("domain=package-0,")).expect("the CPU's domain");
        assert!(cpu.contains("valid=true"), "the CPU reading is as good as it was: {cpu}");
    }

    fn trial() -> TrialRef {
        TrialRef { study: "my study".into(), study_id: 7, trial: 7, attempt: 2 }
    }

    #[test]
    fn a_result_becomes_a_summary_domain_energies_and_power_samples() {
        let lines = trial_points(&trial(), "agent-1", &measurement(), Some(0.93));
        // Tags come sorted by key; the NaN power sample is left out.
        let expected = [
            "tunefleet_trial,agent=agent-1,attempt=2,exit=exited,source=rapl,study=my\\ study,trial=7,valid=true \
             cpu_s=1.25,energy_j=12.5,exit_code=0i,max_rss_kib=4096i,objective=0.93,success=t,sys_s=0.25,user_s=1,\
             wall_s=2.5 1700000002500",
            "tunefleet_energy,agent=agent-1,attempt=2,domain=package-0,in_total=true,source=rapl,study=my\\ study,\
             trial=7,valid=true joules=12.5 1700000002500",
            "tunefleet_energy,agent=agent-1,attempt=2,domain=package-0/core,in_total=false,source=rapl,\
             study=my\\ study,trial=7,valid=true joules=9 1700000002500",
            "tunefleet_power,agent=agent-1,attempt=2,domain=total,source=rapl,study=my\\ study,trial=7,valid=true \
             watts=5 1700000001000",
            "tunefleet_power,agent=agent-1,attempt=2,domain=total,source=rapl,study=my\\ study,trial=7,valid=true \
             watts=4 1700000002500",
        ];
        assert_eq!(lines, expected);
    }

    #[test]
    fn the_same_result_gives_the_same_points() {
        let a = trial_points(&trial(), "agent-1", &measurement(), Some(0.93));
        let b = trial_points(&trial(), "agent-1", &measurement(), Some(0.93));
        assert_eq!(a, b);
    }

    #[test]
    fn what_line_protocol_cannot_carry_is_left_out() {
        let mut m = measurement();
        m.exit = ExitOutcome::Signaled(9);
        m.energy.joules = f64::NAN;
        m.energy.valid = false;
        m.energy.source = EnergySourceKind::Estimated;
        m.energy.domains = vec![DomainEnergy { domain: "cpu".into(), joules: f64::INFINITY, in_total: true }];
        m.energy.series.clear();
        let t = TrialRef { study: "a,b=c\nd\\".into(), study_id: 7, trial: 1, attempt: 1 };
        let lines = trial_points(&t, "", &m, None);
        assert_eq!(lines.len(), 1, "the domain without a finite value is dropped: {lines:?}");
        let line = &lines[0];
        assert!(line.starts_with("tunefleet_trial,attempt=1,exit=signaled,source=estimated,"), "{line}");
        assert!(line.contains("study=a\\,b\\=c_d_,"), "{line}");
        assert!(!line.contains("agent="), "empty tag left out: {line}");
        assert!(!line.contains("energy_j") && !line.contains("exit_code") && !line.contains("objective"), "{line}");
        assert!(line.contains("valid=false"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn negative_exit_codes_are_kept() {
        let mut m = measurement();
        m.exit = ExitOutcome::Exited(-1);
        let lines = trial_points(&trial(), "a", &m, None);
        assert!(lines[0].contains("exit_code=-1i,"), "{}", lines[0]);
        assert!(lines[0].contains("success=f"), "{}", lines[0]);
    }

    #[test]
    fn clean_tag_replaces_what_would_break_a_line() {
        assert_eq!(clean_tag("ok name-1"), "ok name-1");
        assert_eq!(clean_tag("a\nb\tc\\"), "a_b_c_");
    }

    #[test]
    fn exit_kinds_are_short_words() {
        assert_eq!(exit_kind(&ExitOutcome::TimedOut), "timed_out");
        assert_eq!(exit_kind(&ExitOutcome::SpawnFailed("x".into())), "spawn_failed");
        assert_eq!(exit_kind(&ExitOutcome::Cancelled), "cancelled");
    }
}
