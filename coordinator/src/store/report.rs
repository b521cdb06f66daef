//! Read queries for the HTML report ([`crate::report`]): the measured windows
//! of each agent's most recent trials, and the measurement provenance of a
//! few chosen results. Read-only.

use super::sql::{self, params, Optional, Row};
use tunefleet_common::measurement::{CounterKind, EnergySourceKind, Measurement, SegmentRole};
use tunefleet_common::message::SystemParams;

use super::{bad_text, get_opt_u64, get_u64, json_col, to_i64, Result, SqlContext, Store};

/// One stretch of an agent's time under one system configuration: a
/// segment of a trial (a probe window, the warm-up, the selected rest...),
/// or a whole trial that has no segments.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowRow {
    pub agent: String,
    pub trial: u64,
    /// The segment's role; `None` for a whole trial without segments.
    pub role: Option<SegmentRole>,
    /// The configuration it ran under (`None`: a store from before
    /// configurations were recorded).
    pub system: Option<SystemParams>,
    /// Unix time of its start in microseconds, on the coordinator's clock:
    /// the trial's start is its result's arrival less its wall time (agents'
    /// clocks may disagree; the coordinator's is one clock for all).
    pub start_us: u64,
    pub wall_us: u64,
    pub energy_j: Option<f64>,
    /// The trial's configuration: the one its probe chose, when pipelined.
    pub chosen: Option<SystemParams>,
}

/// Where the figures of one result came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvenanceRow {
    pub trial: u64,
    pub energy_source: EnergySourceKind,
    pub energy_valid: bool,
    /// Why the energy is invalid, or how it was made (a GPU's note when
    /// one of its GPUs' readings is invalid).
    pub energy_note: Option<String>,
    /// The CPU's part of the trial's energy and its GPUs' readings (empty:
    /// it was given none), shown apart.
    pub cpu_energy_j: f64,
    pub gpus: Vec<tunefleet_common::measurement::GpuEnergy>,
    /// Counter events that came from the PMU.
    pub hardware_counters: Vec<String>,
    /// Counter events that came from the kernel's software events.
    pub software_counters: Vec<String>,
    /// Counter events asked for and not measured.
    pub missing_counters: Vec<String>,
    /// Why the measurement may not represent its configuration.
    pub interference: Vec<String>,
}

impl ProvenanceRow {
    fn of(trial: u64, m: &Measurement) -> Self {
        let events =
            |kind: CounterKind| m.counters.iter().filter(|c| c.kind == kind).map(|c| c.event.clone()).collect();
        ProvenanceRow {
            trial,
            energy_source: m.energy.source,
            energy_valid: m.energy_figure().valid,
            energy_note: m
                .gpus
                .iter()
                .filter(|g| !g.valid)
                .find_map(|g| g.note.as_ref().map(|n| format!("GPU {}: {n}", g.index)))
                .or_else(|| m.energy.note.clone()),
            cpu_energy_j: m.cpu_joules(),
            gpus: m.gpus.clone(),
            hardware_counters: events(CounterKind::Hardware),
            software_counters: events(CounterKind::Software),
            missing_counters: m.counters_missing.iter().map(|c| c.event.clone()).collect(),
            interference: m.interference.clone(),
        }
    }
}

impl Store {
    /// The windows of the `per_agent` most recent trials (by arrival of
    /// their result) of each agent in `study`, by agent then time.
    pub fn recent_windows(&self, study: &str, per_agent: usize) -> Result<Vec<WindowRow>> {
        let context = || format!("reading the windows of study {study:?}");
        let mut stmt = self
            .conn
            .prepare_cached(
                "WITH recent AS (
                     SELECT trial, agent, received_ms, wall_us, energy_j, system,
                            ROW_NUMBER() OVER (PARTITION BY agent ORDER BY received_ms DESC, trial DESC) AS rank
                     FROM results WHERE study = ?1)
                 SELECT r.agent AS agent, r.trial AS trial, s.role AS role, COALESCE(s.system, r.system) AS system,
                        r.received_ms AS received_ms, r.wall_us AS trial_wall_us, s.start_us AS start_us,
                        s.wall_us AS segment_wall_us,
                        CASE WHEN s.idx IS NULL THEN r.energy_j ELSE s.energy_j END AS energy_j, r.system AS chosen
                 FROM recent r LEFT JOIN segments s ON s.study = ?1 AND s.trial = r.trial
                 WHERE r.rank <= ?2
                 ORDER BY r.agent, r.received_ms, r.trial, s.idx",
            )
            .ctx(context)?;
        let limit = i64::try_from(per_agent).unwrap_or(i64::MAX);
        let rows = stmt.query_map(params![study, limit], window_row).ctx(context)?;
        rows.collect::<sql::Result<Vec<_>>>().ctx(context)
    }

    /// Where the figures of each of `trials` came from (the measurement
    /// record of its accepted result), in the order given; a trial without
    /// a result is left out.
    pub fn provenance(&self, study: &str, trials: &[u64]) -> Result<Vec<ProvenanceRow>> {
        let context = || format!("reading the provenance of results of study {study:?}");
        let mut stmt =
            self.conn.prepare_cached("SELECT measurement FROM results WHERE study = ?1 AND trial = ?2").ctx(context)?;
        let mut out = Vec::with_capacity(trials.len());
        for &trial in trials {
            let m: Option<Measurement> =
                stmt.query_row(params![study, to_i64("trial", trial)?], |r| json_col(r, 0)).optional().ctx(context)?;
            out.extend(m.map(|m| ProvenanceRow::of(trial, &m)));
        }
        Ok(out)
    }
}

/// A segment role as [`super::Batch::record_segments`] wrote it (its
/// variant's name in lower case), through serde so that every one-word
/// variant parses, those added later included.
fn parse_role(text: &str) -> Option<SegmentRole> {
    let mut chars = text.chars();
    let name: String = chars.next().map(|c| c.to_ascii_uppercase()).into_iter().chain(chars).collect();
    serde_json::from_value(serde_json::Value::String(name)).ok()
}

fn window_row(row: &Row<'_>) -> sql::Result<WindowRow> {
    let system = |name: &str| -> sql::Result<Option<SystemParams>> {
        Ok(row.get::<_, Option<String>>(name)?.and_then(|text| serde_json::from_str(&text).ok()))
    };
    let role = match row.get::<_, Option<String>>("role")? {
        Some(text) => Some(parse_role(&text).ok_or_else(|| bad_text(row, "role", "segment role", &text))?),
        None => None,
    };
    let trial_wall_us = get_u64(row, "trial_wall_us")?;
    let trial_start_us = get_u64(row, "received_ms")?.saturating_mul(1000).saturating_sub(trial_wall_us);
    let (start_us, wall_us) = match (get_opt_u64(row, "start_us")?, get_opt_u64(row, "segment_wall_us")?) {
        (Some(start), Some(wall)) => (trial_start_us.saturating_add(start), wall),
        _ => (trial_start_us, trial_wall_us),
    };
    Ok(WindowRow {
        agent: row.get("agent")?,
        trial: get_u64(row, "trial")?,
        role,
        system: system("system")?,
        start_us,
        wall_us,
        energy_j: row.get("energy_j")?,
        chosen: system("chosen")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{EnergyReading, ExitOutcome, Segment};
    use tunefleet_common::message::TrialRef;

    use crate::domain::search::TrialPlan;

    fn sys(cores: u32) -> SystemParams {
        SystemParams { cores: Some(cores), ..SystemParams::default() }
    }

    fn segment(role: SegmentRole, cores: u32, start_us: u64) -> Segment {
        Segment {
            role,
            system: sys(cores),
            cpus: Vec::new(),
            first_epoch: 1,
            last_epoch: 1,
            steps: 0,
            start_us,
            wall_us: 1000,
            energy_j: Some(1.5),
            cpu_us: None,
            unit_median_us: None,
            unit_spread: None,
            margin: None,
        }
    }

    #[test]
    fn windows_are_segments_or_whole_trials_and_provenance_reads_the_record() {
        let mut store = Store::open_in_memory().expect("store");
        let text = r#"name = "w"
command = ["true"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = 3
[strategy]
kind = "random"
[hyper.x]
kind = "int"
low = 0
high = 9
"#;
        let study = crate::domain::study::parse(text, "test").expect("study");
        let plans: Vec<TrialPlan> =
            (0..3).map(|trial| TrialPlan { trial, params: Default::default(), repeat: 0 }).collect();
        let mut b = store.batch().expect("batch");
        b.open_study(&study, &plans, &crate::domain::study::Opening::Create).expect("create");
        for (trial, at) in [(0u64, 10_000u64), (1, 20_000), (2, 30_000)] {
            let t = TrialRef { study: "w".into(), study_id: 7, trial, attempt: 1 };
            b.record_assignment(&t, "a", at - 5000).expect("assign");
            let mut m =
                Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Rapl, "x"));
            m.wall_us = 3000;
            if trial == 1 {
                m.segments = vec![segment(SegmentRole::Probe, 1, 0), segment(SegmentRole::Selected, 2, 1000)];
            }
            let score = crate::store::Score { objective: Some(1.0), violation: None, system: Some(sys(2)) };
            b.record_result(&t, "a", &m, score, at).expect("result");
            b.record_segments(&t, &m).expect("segments");
        }
        b.commit().expect("commit");

        let w = store.recent_windows("w", 2).expect("windows");
        let shape: Vec<(u64, Option<SegmentRole>, u64)> = w.iter().map(|w| (w.trial, w.role, w.start_us)).collect();
        assert_eq!(
            shape,
            vec![
                (1, Some(SegmentRole::Probe), 20_000_000 - 3000),
                (1, Some(SegmentRole::Selected), 20_000_000 - 2000),
                (2, None, 30_000_000 - 3000)
            ],
            "the 2 most recent trials; segments placed from the trial's start"
        );
        assert_eq!(w[0].system, Some(sys(1)));
        assert_eq!(w[0].chosen, Some(sys(2)));
        assert_eq!(w[2].system, Some(sys(2)), "a whole trial runs under the trial's configuration");

        let p = store.provenance("w", &[2, 7]).expect("provenance");
        assert_eq!(p.len(), 1, "a trial without a result is left out");
        assert_eq!((p[0].trial, p[0].energy_source, p[0].energy_valid), (2, EnergySourceKind::Rapl, false));
        assert_eq!(p[0].energy_note.as_deref(), Some("x"));
    }

    #[test]
    fn every_role_the_batch_writes_parses_back() {
        for role in [SegmentRole::Warmup, SegmentRole::Probe, SegmentRole::Cut, SegmentRole::Reconfigured] {
            assert_eq!(parse_role(&format!("{role:?}").to_lowercase()), Some(role));
        }
        assert_eq!(parse_role("sideways"), None);
    }
}
