//! Checks an authenticated message before it reaches the scheduler or the
//! store: every field of every variant, nested ones included. Integers must
//! be storable (SQLite integers are signed 64-bit), floats finite, strings
//! and collections within the bounds below (docs/PROTOCOL.md, "Bounds"),
//! and strings that end up in logs or commands free of control characters.
//! A message that fails is refused with the field and the reason and
//! counted by the engine; a refused result is answered so the agent parks
//! it. Pure: plain values in, a verdict out.

use std::collections::BTreeMap;

use tunefleet_common::measurement::{
    CounterReading, CounterSample, EnergyReading, EpochMetrics, ExitOutcome, GpuEnergy, Measurement, MemoryLimit,
    Metrics, Segment, Telemetry, WindowProfile, MAX_COUNTER_SAMPLES, MAX_POWER_SAMPLES,
};
use tunefleet_common::message::{
    AgentInfo, AgentMessage, EnergySourceInfo, Progress, SystemParams, TrialRef, MAX_GPUS,
};
use tunefleet_common::profile::Profile;

/// Longest name: a study in a trial reference, a metric, an energy domain,
/// a tag key or value, an agent's version, arch, os or kernel.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest counter event name (perf names are short: `LLC-load-misses:u`).
pub const MAX_COUNTER_NAME_BYTES: usize = 64;
/// Longest free text that is logged: a refusal's reason, an energy note, a
/// missing counter's reason, a spawn error, an interference flag.
pub const MAX_TEXT_BYTES: usize = 1024;
/// Longest log tail (the agent keeps 8 KiB). Stored, never logged: any text.
pub const MAX_LOG_TAIL_BYTES: usize = 16 * 1024;
/// Longest checkpoint reference (the agent's own bound).
pub const MAX_CHECKPOINT_BYTES: usize = 1024;
/// Most metrics in one map (the agent takes 64 a line).
pub const MAX_METRICS: usize = 256;
/// Most epochs in one measurement (the agent keeps 2000).
pub const MAX_EPOCHS: usize = 4096;
/// Most counters read, or missing, in one measurement; most an agent offers.
pub const MAX_COUNTERS: usize = 64;
/// Most energy domains in one reading, or offered by one energy source.
pub const MAX_DOMAINS: usize = 64;
/// Most energy sources an agent offers.
pub const MAX_ENERGY_SOURCES: usize = 16;
/// Most segments in one measurement.
pub const MAX_SEGMENTS: usize = 1024;
/// Most CPUs: an agent's cores, a pinned CPU list, a telemetry's per-CPU figures.
pub const MAX_CPUS: usize = 65_536;
/// Most values in a profile vector (this version has 25 features).
pub const MAX_PROFILE_VALUES: usize = 64;
/// Most interference flags on one measurement.
pub const MAX_INTERFERENCE: usize = 16;
/// Most tags an agent announces.
pub const MAX_TAGS: usize = 64;
/// Most slots an agent announces, and most trials a request says run.
pub const MAX_SLOTS: usize = 1024;

/// Why a value is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Why {
    #[error("{0} is out of range (at most {max})", max = i64::MAX)]
    OutOfRange(u64),
    #[error("{value} is too large (at most {max})")]
    TooLarge { value: u64, max: u64 },
    #[error("{0} is not a finite number")]
    NotFinite(f64),
    #[error("{len} bytes is too long (at most {max})")]
    TooLong { len: usize, max: usize },
    #[error("{len} entries are too many (at most {max})")]
    TooMany { len: usize, max: usize },
    #[error("has a control character or an invisible formatting one (a bidirectional override)")]
    Control,
    #[error("is a bundle where a message belongs (bundles are taken apart first, never nested)")]
    Nested,
    #[error("is empty")]
    Empty,
    #[error("starts with '-' (it would read as an option)")]
    LeadingDash,
    #[error("has a character other than A-Z a-z 0-9 . _ -")]
    Charset,
    #[error("is not under the study's resume_prefix {prefix:?}")]
    NotUnder { prefix: String },
    #[error("{0} is negative")]
    Negative(f64),
    #[error("{0} is above 1 (a share)")]
    AboveOne(f64),
    #[error("{0} is listed twice")]
    Twice(String),
}

/// Which field of a message is refused, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct Invalid {
    /// The path to the field, e.g. `measurement.segments[2].start_us`.
    pub field: String,
    pub why: Why,
}

type Check = Result<(), Invalid>;

fn bad(field: &str, why: Why) -> Invalid {
    Invalid { field: field.to_string(), why }
}

/// Prefixes the path of an error from a nested value with `parent`.
fn under(parent: &str) -> impl Fn(Invalid) -> Invalid + '_ {
    move |mut e| {
        e.field = if e.field.is_empty() { parent.to_string() } else { format!("{parent}.{}", e.field) };
        e
    }
}

fn int(field: &str, value: u64) -> Check {
    if i64::try_from(value).is_ok() {
        Ok(())
    } else {
        Err(bad(field, Why::OutOfRange(value)))
    }
}

fn at_most(field: &str, value: u64, max: u64) -> Check {
    if value <= max {
        Ok(())
    } else {
        Err(bad(field, Why::TooLarge { value, max }))
    }
}

fn finite(field: &str, value: f64) -> Check {
    if value.is_finite() {
        Ok(())
    } else {
        Err(bad(field, Why::NotFinite(value)))
    }
}

fn len(field: &str, len: usize, max: usize) -> Check {
    if len <= max {
        Ok(())
    } else {
        Err(bad(field, Why::TooMany { len, max }))
    }
}

/// Text of at most `max` bytes, any characters (stored, never logged).
fn bytes(field: &str, s: &str, max: usize) -> Check {
    if s.len() <= max {
        Ok(())
    } else {
        Err(bad(field, Why::TooLong { len: s.len(), max }))
    }
}

/// Text of at most `max` bytes without control characters (it is logged).
fn text(field: &str, s: &str, max: usize) -> Check {
    bytes(field, s, max)?;
    if s.chars().any(|c| c.is_control() || tunefleet_common::is_invisible_format(c)) {
        return Err(bad(field, Why::Control));
    }
    Ok(())
}

/// At most `max` items, each checked by `f` (its errors named `field[i]`).
fn each<T>(field: &str, items: &[T], max: usize, f: impl Fn(&T) -> Check) -> Check {
    len(field, items.len(), max)?;
    for (i, item) in items.iter().enumerate() {
        f(item).map_err(|e| under(&format!("{field}[{i}]"))(e))?;
    }
    Ok(())
}

fn metrics(field: &str, m: &Metrics) -> Check {
    len(field, m.len(), MAX_METRICS)?;
    for (name, value) in m {
        text(field, name, MAX_NAME_BYTES)?;
        finite(&format!("{field}[{name:?}]"), *value)?;
    }
    Ok(())
}

fn trial(t: &TrialRef) -> Check {
    text("trial.study", &t.study, MAX_NAME_BYTES)?;
    int("trial.trial", t.trial)
}

/// A checkpoint reference, by the agent's rules and one more: not empty,
/// at most [`MAX_CHECKPOINT_BYTES`], no control characters, and no leading
/// `-` (the next attempt's command gets it as an argument).
pub fn checkpoint(field: &str, reference: &str) -> Check {
    if reference.is_empty() {
        return Err(bad(field, Why::Empty));
    }
    text(field, reference, MAX_CHECKPOINT_BYTES)?;
    if reference.starts_with('-') {
        return Err(bad(field, Why::LeadingDash));
    }
    Ok(())
}

/// Whether a checkpoint is under the study's `resume_prefix` (when it has
/// one): it starts with it and no path segment after it is `..`.
pub fn checkpoint_under(reference: &str, prefix: Option<&str>) -> Result<(), Why> {
    let Some(prefix) = prefix else { return Ok(()) };
    // By components: `/shared/ckpt` holds `/shared/ckpt/a.pt`, not `/shared/ckpt-other/a.pt`.
    match reference.strip_prefix(prefix) {
        Some(rest)
            if (prefix.ends_with(['/', '\\']) || rest.is_empty() || rest.starts_with(['/', '\\']))
                && !rest.split(['/', '\\']).any(|seg| seg == "..") =>
        {
            Ok(())
        }
        _ => Err(Why::NotUnder { prefix: prefix.to_string() }),
    }
}

fn system(s: &SystemParams) -> Check {
    s.memory_mib.map_or(Ok(()), |m| int("memory_mib", m))
}

fn profile(p: &Profile) -> Check {
    each("values", &p.values, MAX_PROFILE_VALUES, |v| v.map_or(Ok(()), |v| finite("", v)))
}

fn window_profile(w: &WindowProfile) -> Check {
    system(&w.system).map_err(under("system"))?;
    int("wall_us", w.wall_us)?;
    profile(&w.profile).map_err(under("profile"))
}

fn epoch(e: &EpochMetrics) -> Check {
    int("elapsed_us", e.elapsed_us)?;
    metrics("metrics", &e.metrics)?;
    e.checkpoint.as_deref().map_or(Ok(()), |c| checkpoint("checkpoint", c))
}

fn counter(c: &CounterReading) -> Check {
    text("event", &c.event, MAX_COUNTER_NAME_BYTES)?;
    int("value", c.value)?;
    int("time_enabled_ns", c.time_enabled_ns)?;
    int("time_running_ns", c.time_running_ns)
}

fn counter_sample(s: &CounterSample) -> Check {
    int("elapsed_ms", s.elapsed_ms)?;
    each("deltas", &s.deltas, MAX_COUNTERS, |d| finite("", *d))
}

fn energy(e: &EnergyReading) -> Check {
    finite("joules", e.joules)?;
    each("domains", &e.domains, MAX_DOMAINS, |d| {
        text("domain", &d.domain, MAX_NAME_BYTES)?;
        finite("joules", d.joules)
    })?;
    e.note.as_deref().map_or(Ok(()), |n| text("note", n, MAX_TEXT_BYTES))?;
    each("series", &e.series, MAX_POWER_SAMPLES, |p| {
        int("elapsed_ms", p.elapsed_ms)?;
        finite("watts", p.watts)
    })
}

fn gpu_energy(g: &GpuEnergy) -> Check {
    text("uuid", &g.uuid, MAX_NAME_BYTES)?;
    finite("joules", g.joules)?;
    if g.joules < 0.0 {
        return Err(bad("joules", Why::Negative(g.joules)));
    }
    g.note.as_deref().map_or(Ok(()), |n| text("note", n, MAX_TEXT_BYTES))
}

/// At most [`MAX_GPUS`] readings, each GPU once.
fn gpu_energies(field: &str, gpus: &[GpuEnergy]) -> Check {
    each(field, gpus, MAX_GPUS as usize, gpu_energy)?;
    twice(field, gpus.iter().map(|g| g.index))
}

/// The first index listed twice, refused.
fn twice(field: &str, indices: impl Iterator<Item = u32>) -> Check {
    let mut seen = std::collections::BTreeSet::new();
    for i in indices {
        if !seen.insert(i) {
            return Err(bad(field, Why::Twice(format!("GPU {i}"))));
        }
    }
    Ok(())
}

fn segment(s: &Segment) -> Check {
    system(&s.system).map_err(under("system"))?;
    len("cpus", s.cpus.len(), MAX_CPUS)?;
    int("start_us", s.start_us)?;
    int("wall_us", s.wall_us)?;
    s.energy_j.map_or(Ok(()), |j| finite("energy_j", j))?;
    s.cpu_us.map_or(Ok(()), |c| int("cpu_us", c))?;
    s.unit_median_us.map_or(Ok(()), |u| int("unit_median_us", u))?;
    s.unit_spread.map_or(Ok(()), |x| finite("unit_spread", x))?;
    s.margin.map_or(Ok(()), |x| finite("margin", x))
}

fn measurement(m: &Measurement) -> Check {
    int("started_unix_ms", m.started_unix_ms)?;
    int("wall_us", m.wall_us)?;
    int("user_us", m.user_us)?;
    int("sys_us", m.sys_us)?;
    int("max_rss_kib", m.max_rss_kib)?;
    if let ExitOutcome::SpawnFailed(why) = &m.exit {
        text("exit", why, MAX_TEXT_BYTES)?;
    }
    each("epochs", &m.epochs, MAX_EPOCHS, epoch)?;
    metrics("final_metrics", &m.final_metrics)?;
    each("counters", &m.counters, MAX_COUNTERS, counter)?;
    each("counters_missing", &m.counters_missing, MAX_COUNTERS, |c| {
        text("event", &c.event, MAX_COUNTER_NAME_BYTES)?;
        text("reason", &c.reason, MAX_TEXT_BYTES)
    })?;
    each("counter_series", &m.counter_series, MAX_COUNTER_SAMPLES, counter_sample)?;
    profile(&m.profile).map_err(under("profile"))?;
    energy(&m.energy).map_err(under("energy"))?;
    len("limits.cpus", m.limits.cpus.len(), MAX_CPUS)?;
    if let MemoryLimit::Cgroup { bytes } | MemoryLimit::Rlimit { bytes } = m.limits.memory {
        int("limits.memory", bytes)?;
    }
    bytes("log_tail", &m.log_tail, MAX_LOG_TAIL_BYTES)?;
    each("segments", &m.segments, MAX_SEGMENTS, segment)?;
    m.selected.as_ref().map_or(Ok(()), system).map_err(under("selected"))?;
    m.window_profile.as_ref().map_or(Ok(()), window_profile).map_err(under("window_profile"))?;
    each("interference", &m.interference, MAX_INTERFERENCE, |s| text("", s, MAX_TEXT_BYTES))?;
    if let Some(share) = m.cpu_share {
        fraction("cpu_share", share)?;
    }
    gpu_energies("gpus", &m.gpus)
}

/// A share of something: finite, 0 to 1.
fn fraction(field: &str, value: f64) -> Check {
    finite(field, value)?;
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else if value < 0.0 {
        Err(bad(field, Why::Negative(value)))
    } else {
        Err(bad(field, Why::AboveOne(value)))
    }
}

fn progress(p: &Progress) -> Check {
    trial(&p.trial)?;
    int("elapsed_us", p.elapsed_us)?;
    metrics("metrics", &p.metrics)?;
    p.checkpoint.as_deref().map_or(Ok(()), |c| checkpoint("checkpoint", c))?;
    p.profile.as_ref().map_or(Ok(()), window_profile).map_err(under("profile"))
}

fn telemetry(t: &Telemetry) -> Check {
    int("unix_ms", t.unix_ms)?;
    finite("cpu_utilisation", t.cpu_utilisation)?;
    each("per_cpu", &t.per_cpu, MAX_CPUS, |v| finite("", *v))?;
    int("memory_used_bytes", t.memory_used_bytes)?;
    int("memory_total_bytes", t.memory_total_bytes)?;
    t.power_watts.map_or(Ok(()), |w| finite("power_watts", w))?;
    t.foreign_cpu.map_or(Ok(()), |f| finite("foreign_cpu", f))?;
    t.conditions.battery_percent.map_or(Ok(()), |b| finite("conditions.battery_percent", b))?;
    t.conditions.temperature_c.map_or(Ok(()), |c| finite("conditions.temperature_c", c))
}

/// Whether every value of `msg` is within bounds and can be stored.
pub fn message(msg: &AgentMessage) -> Check {
    match msg {
        AgentMessage::Result(r) => {
            trial(&r.trial)?;
            measurement(&r.measurement).map_err(under("measurement"))
        }
        AgentMessage::Progress(p) => progress(p),
        AgentMessage::Refuse(r) => {
            trial(&r.trial)?;
            text("reason", &r.reason, MAX_TEXT_BYTES)
        }
        // Running: its slots, and as many trials that exited whose results
        // are still to come; held: up to four per slot.
        AgentMessage::Request(r) => {
            each("running", &r.running, 2 * MAX_SLOTS, trial)?;
            each("held", &r.held, MAX_SLOTS * tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT as usize, trial)
        }
        AgentMessage::Telemetry(t) => telemetry(t),
        AgentMessage::CoMeasured(m) => {
            trial(&m.trial)?;
            int("from_unix_ms", m.from_unix_ms)?;
            int("to_unix_ms", m.to_unix_ms)?;
            energy(&m.energy).map_err(under("energy"))?;
            int("cpu_us", m.cpu_us)?;
            at_most("cpus", u64::from(m.cpus), MAX_CPUS as u64)?;
            int("covered_ms", m.covered_ms)?;
            gpu_energies("gpus", &m.gpus)
        }
        AgentMessage::Status(_) | AgentMessage::Synced(_) => Ok(()),
        // Taken apart before any check (`AgentMessage::unbundle`): one inside another is refused there.
        AgentMessage::Bundle(_) => Err(bad("bundle", Why::Nested)),
    }
}

fn energy_source(s: &EnergySourceInfo) -> Check {
    each("domains", &s.domains, MAX_DOMAINS, |d| text("", d, MAX_NAME_BYTES))?;
    s.note.as_deref().map_or(Ok(()), |n| text("note", n, MAX_TEXT_BYTES))
}

fn tags(t: &BTreeMap<String, String>) -> Check {
    len("tags", t.len(), MAX_TAGS)?;
    for (k, v) in t {
        text("tags", k, MAX_NAME_BYTES)?;
        text(&format!("tags[{k:?}]"), v, MAX_NAME_BYTES)?;
    }
    Ok(())
}

/// Whether a Hello's [`AgentInfo`] is within bounds: its name by the topic
/// rules, short descriptions, and bounded tags, energy sources, counters,
/// slots and cores.
pub fn agent_info(info: &AgentInfo) -> Result<(), Invalid> {
    if info.agent.is_empty() {
        return Err(bad("agent", Why::Empty));
    }
    bytes("agent", &info.agent, tunefleet_common::topic::MAX_AGENT_ID)?;
    if tunefleet_common::topic::validate_agent_id(&info.agent).is_err() {
        return Err(bad("agent", Why::Charset));
    }
    text("version", &info.version, MAX_NAME_BYTES)?;
    text("arch", &info.arch, MAX_NAME_BYTES)?;
    text("os", &info.os, MAX_NAME_BYTES)?;
    text("kernel", &info.kernel, MAX_NAME_BYTES)?;
    at_most("cores", u64::from(info.cores), MAX_CPUS as u64)?;
    int("memory_bytes", info.memory_bytes)?;
    at_most("slots", u64::from(info.slots), MAX_SLOTS as u64)?;
    let most = u64::from(info.slots) * u64::from(tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT);
    at_most("lookahead", u64::from(info.lookahead), most)?;
    each("energy", &info.energy, MAX_ENERGY_SOURCES, energy_source)?;
    each("counters", &info.counters, MAX_COUNTERS, |c| text("", c, MAX_COUNTER_NAME_BYTES))?;
    each("gpus", &info.gpus, MAX_GPUS as usize, |g| {
        text("uuid", &g.uuid, MAX_NAME_BYTES)?;
        text("name", &g.name, MAX_NAME_BYTES)
    })?;
    twice("gpus", info.gpus.iter().map(|g| g.index))?;
    tags(&info.tags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{
        Conditions, CounterKind, DomainEnergy, EnergySourceKind, MissingCounter, PowerSample, SegmentRole,
    };
    use tunefleet_common::message::{Refusal, TrialResult, WorkRequest};

    fn good() -> Measurement {
        Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
    }

    fn result(m: Measurement) -> AgentMessage {
        AgentMessage::Result(TrialResult {
            trial: TrialRef { study: "s".into(), study_id: 7, trial: 1, attempt: 1 },
            measurement: m,
        })
    }

    fn seg() -> Segment {
        Segment {
            role: SegmentRole::Probe,
            system: SystemParams::default(),
            cpus: vec![0, 1],
            first_epoch: 1,
            last_epoch: 1,
            steps: 0,
            start_us: 0,
            wall_us: 10,
            energy_j: Some(1.0),
            cpu_us: Some(5),
            unit_median_us: None,
            unit_spread: None,
            margin: None,
        }
    }

    fn wp() -> WindowProfile {
        WindowProfile { system: SystemParams::default(), epochs: 1, steps: 0, wall_us: 1, profile: Profile::empty() }
    }

    fn progress(edit: impl FnOnce(&mut Progress)) -> AgentMessage {
        let mut p = Progress {
            trial: TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 0 },
            epoch: 1,
            elapsed_us: 1,
            metrics: [("loss".to_string(), 0.5)].into(),
            checkpoint: Some("/ckpt/1".into()),
            profile: Some(wp()),
        };
        edit(&mut p);
        AgentMessage::Progress(p)
    }

    /// The field `msg` is refused on, or `None` when it passes.
    fn refused(msg: &AgentMessage) -> Option<String> {
        message(msg).err().map(|e| e.field)
    }

    fn with(edit: impl FnOnce(&mut Measurement)) -> AgentMessage {
        let mut m = good();
        edit(&mut m);
        result(m)
    }

    #[test]
    fn a_full_result_within_bounds_passes() {
        let m = with(|m| {
            m.epochs = vec![EpochMetrics {
                epoch: 1,
                elapsed_us: 5,
                metrics: [("v".to_string(), 1.0)].into(),
                checkpoint: Some("s3://b/k".into()),
            }];
            m.counters = vec![CounterReading {
                event: "task-clock".into(),
                kind: CounterKind::Software,
                value: 1,
                time_enabled_ns: 1,
                time_running_ns: 1,
            }];
            m.counters_missing = vec![MissingCounter { event: "cycles".into(), reason: "no PMU".into() }];
            m.counter_series = vec![CounterSample { elapsed_ms: 1, deltas: vec![1.0] }];
            m.energy.domains = vec![DomainEnergy { domain: "package-0".into(), joules: 1.0, in_total: true }];
            m.energy.series = vec![PowerSample { elapsed_ms: 1, watts: 3.0 }];
            m.segments = vec![seg()];
            m.selected = Some(SystemParams { memory_mib: Some(5), ..Default::default() });
            m.window_profile = Some(wp());
            m.interference = vec!["load 3.2".into()];
            m.log_tail = "line\n\x1b[31mred\x1b[0m\n".into();
        });
        assert_eq!(message(&m), Ok(()));
        assert_eq!(message(&progress(|_| {})), Ok(()));
    }

    #[test]
    fn integers_past_i64_are_refused_with_their_field() {
        let big = i64::MAX as u64 + 1;
        assert_eq!(refused(&with(|m| m.wall_us = i64::MAX as u64)), None);
        let cases: Vec<(&str, AgentMessage)> = vec![
            ("measurement.started_unix_ms", with(|m| m.started_unix_ms = big)),
            ("measurement.wall_us", with(|m| m.wall_us = u64::MAX)),
            ("measurement.user_us", with(|m| m.user_us = big)),
            ("measurement.sys_us", with(|m| m.sys_us = big)),
            ("measurement.max_rss_kib", with(|m| m.max_rss_kib = big)),
            (
                "measurement.segments[0].start_us",
                with(|m| m.segments = vec![Segment { start_us: 9223372036854775813, ..seg() }]),
            ),
            ("measurement.segments[1].wall_us", with(|m| m.segments = vec![seg(), Segment { wall_us: big, ..seg() }])),
            ("measurement.segments[0].cpu_us", with(|m| m.segments = vec![Segment { cpu_us: Some(big), ..seg() }])),
            (
                "measurement.segments[0].system.memory_mib",
                with(|m| {
                    m.segments =
                        vec![Segment { system: SystemParams { memory_mib: Some(big), ..Default::default() }, ..seg() }]
                }),
            ),
            (
                "measurement.epochs[0].elapsed_us",
                with(|m| {
                    m.epochs =
                        vec![EpochMetrics { epoch: 1, elapsed_us: big, metrics: Metrics::new(), checkpoint: None }]
                }),
            ),
            (
                "measurement.counters[0].value",
                with(|m| {
                    m.counters = vec![CounterReading {
                        event: "e".into(),
                        kind: CounterKind::Hardware,
                        value: big,
                        time_enabled_ns: 0,
                        time_running_ns: 0,
                    }]
                }),
            ),
            (
                "measurement.counter_series[0].elapsed_ms",
                with(|m| m.counter_series = vec![CounterSample { elapsed_ms: big, deltas: vec![] }]),
            ),
            (
                "measurement.energy.series[0].elapsed_ms",
                with(|m| m.energy.series = vec![PowerSample { elapsed_ms: big, watts: 1.0 }]),
            ),
            ("measurement.limits.memory", with(|m| m.limits.memory = MemoryLimit::Cgroup { bytes: big })),
            (
                "measurement.window_profile.wall_us",
                with(|m| m.window_profile = Some(WindowProfile { wall_us: big, ..wp() })),
            ),
            (
                "trial.trial",
                AgentMessage::Result(TrialResult {
                    trial: TrialRef { study: "s".into(), study_id: 7, trial: big, attempt: 0 },
                    measurement: good(),
                }),
            ),
            ("elapsed_us", progress(|p| p.elapsed_us = 1 << 63)),
            ("profile.wall_us", progress(|p| p.profile = Some(WindowProfile { wall_us: big, ..wp() }))),
        ];
        for (field, msg) in cases {
            assert_eq!(refused(&msg).as_deref(), Some(field), "{msg:?}");
        }
        let e = message(&with(|m| m.wall_us = u64::MAX)).expect_err("refused");
        assert!(e.to_string().contains("measurement.wall_us: 18446744073709551615 is out of range"), "{e}");
    }

    #[test]
    fn floats_must_be_finite_wherever_they_are() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let cases: Vec<(&str, AgentMessage)> = vec![
                ("measurement.final_metrics[\"v\"]", with(|m| m.final_metrics = [("v".to_string(), bad)].into())),
                (
                    "measurement.epochs[0].metrics[\"loss\"]",
                    with(|m| {
                        m.epochs = vec![EpochMetrics {
                            epoch: 1,
                            elapsed_us: 0,
                            metrics: [("loss".to_string(), bad)].into(),
                            checkpoint: None,
                        }]
                    }),
                ),
                ("measurement.energy.joules", with(|m| m.energy.joules = bad)),
                (
                    "measurement.energy.domains[0].joules",
                    with(|m| m.energy.domains = vec![DomainEnergy { domain: "d".into(), joules: bad, in_total: true }]),
                ),
                (
                    "measurement.energy.series[0].watts",
                    with(|m| m.energy.series = vec![PowerSample { elapsed_ms: 0, watts: bad }]),
                ),
                (
                    "measurement.segments[0].energy_j",
                    with(|m| m.segments = vec![Segment { energy_j: Some(bad), ..seg() }]),
                ),
                (
                    "measurement.segments[0].unit_spread",
                    with(|m| m.segments = vec![Segment { unit_spread: Some(bad), ..seg() }]),
                ),
                ("measurement.segments[0].margin", with(|m| m.segments = vec![Segment { margin: Some(bad), ..seg() }])),
                (
                    "measurement.counter_series[0].deltas[1]",
                    with(|m| m.counter_series = vec![CounterSample { elapsed_ms: 0, deltas: vec![1.0, bad] }]),
                ),
                ("measurement.profile.values[3]", with(|m| m.profile.values[3] = Some(bad))),
                (
                    "measurement.window_profile.profile.values[0]",
                    with(|m| {
                        let mut w = wp();
                        w.profile.values[0] = Some(bad);
                        m.window_profile = Some(w);
                    }),
                ),
                ("metrics[\"loss\"]", progress(|p| p.metrics = [("loss".to_string(), bad)].into())),
                (
                    "profile.profile.values[24]",
                    progress(|p| {
                        let mut w = wp();
                        w.profile.values[24] = Some(bad);
                        p.profile = Some(w);
                    }),
                ),
            ];
            for (field, msg) in cases {
                assert_eq!(refused(&msg).as_deref(), Some(field), "{msg:?}");
            }
        }
    }

    fn telemetry_with(edit: impl FnOnce(&mut Telemetry)) -> AgentMessage {
        let mut t = Telemetry {
            unix_ms: 1,
            interval_ms: 1000,
            cpu_utilisation: 0.5,
            per_cpu: vec![0.5; 4],
            memory_used_bytes: 1,
            memory_total_bytes: 2,
            power_watts: Some(3.0),
            power_source: EnergySourceKind::Rapl,
            running: 1,
            foreign_cpu: Some(0.1),
            conditions: Conditions {
                charging: Some(false),
                battery_percent: Some(50.0),
                throttled: None,
                temperature_c: Some(40.0),
            },
        };
        edit(&mut t);
        AgentMessage::Telemetry(t)
    }

    #[test]
    fn telemetry_is_checked_field_by_field() {
        assert_eq!(refused(&telemetry_with(|_| {})), None);
        let cases: Vec<(&str, AgentMessage)> = vec![
            ("unix_ms", telemetry_with(|t| t.unix_ms = u64::MAX)),
            ("cpu_utilisation", telemetry_with(|t| t.cpu_utilisation = f64::NAN)),
            ("per_cpu[2]", telemetry_with(|t| t.per_cpu[2] = f64::INFINITY)),
            ("per_cpu", telemetry_with(|t| t.per_cpu = vec![0.0; MAX_CPUS + 1])),
            ("memory_used_bytes", telemetry_with(|t| t.memory_used_bytes = u64::MAX)),
            ("memory_total_bytes", telemetry_with(|t| t.memory_total_bytes = u64::MAX)),
            ("power_watts", telemetry_with(|t| t.power_watts = Some(f64::NAN))),
            ("foreign_cpu", telemetry_with(|t| t.foreign_cpu = Some(f64::NEG_INFINITY))),
            ("conditions.battery_percent", telemetry_with(|t| t.conditions.battery_percent = Some(f64::NAN))),
            ("conditions.temperature_c", telemetry_with(|t| t.conditions.temperature_c = Some(f64::INFINITY))),
        ];
        for (field, msg) in cases {
            assert_eq!(refused(&msg).as_deref(), Some(field), "{msg:?}");
        }
    }

    #[test]
    fn strings_and_collections_are_bounded() {
        let long = |n: usize| "x".repeat(n);
        let cases: Vec<(&str, AgentMessage)> = vec![
            (
                "measurement.epochs",
                with(|m| {
                    m.epochs = vec![
                        EpochMetrics { epoch: 1, elapsed_us: 0, metrics: Metrics::new(), checkpoint: None };
                        MAX_EPOCHS + 1
                    ]
                }),
            ),
            (
                "measurement.final_metrics",
                with(|m| m.final_metrics = (0..=MAX_METRICS).map(|i| (i.to_string(), 0.0)).collect()),
            ),
            ("measurement.final_metrics", with(|m| m.final_metrics = [(long(MAX_NAME_BYTES + 1), 0.0)].into())),
            ("measurement.final_metrics", with(|m| m.final_metrics = [("lo\nss".to_string(), 0.0)].into())),
            (
                "measurement.counters",
                with(|m| {
                    m.counters = vec![
                        CounterReading {
                            event: "e".into(),
                            kind: CounterKind::Hardware,
                            value: 0,
                            time_enabled_ns: 0,
                            time_running_ns: 0
                        };
                        MAX_COUNTERS + 1
                    ]
                }),
            ),
            (
                "measurement.counters[0].event",
                with(|m| {
                    m.counters = vec![CounterReading {
                        event: long(MAX_COUNTER_NAME_BYTES + 1),
                        kind: CounterKind::Hardware,
                        value: 0,
                        time_enabled_ns: 0,
                        time_running_ns: 0,
                    }]
                }),
            ),
            (
                "measurement.counters_missing[0].reason",
                with(|m| m.counters_missing = vec![MissingCounter { event: "e".into(), reason: "a\x1b[2Jb".into() }]),
            ),
            (
                "measurement.counters_missing",
                with(|m| {
                    m.counters_missing =
                        vec![MissingCounter { event: "e".into(), reason: "r".into() }; MAX_COUNTERS + 1]
                }),
            ),
            (
                "measurement.counter_series",
                with(|m| {
                    m.counter_series = vec![CounterSample { elapsed_ms: 0, deltas: vec![] }; MAX_COUNTER_SAMPLES + 1]
                }),
            ),
            (
                "measurement.counter_series[0].deltas",
                with(|m| m.counter_series = vec![CounterSample { elapsed_ms: 0, deltas: vec![0.0; MAX_COUNTERS + 1] }]),
            ),
            ("measurement.profile.values", with(|m| m.profile.values = vec![None; MAX_PROFILE_VALUES + 1])),
            (
                "measurement.energy.domains",
                with(|m| {
                    m.energy.domains =
                        vec![DomainEnergy { domain: "d".into(), joules: 0.0, in_total: true }; MAX_DOMAINS + 1]
                }),
            ),
            (
                "measurement.energy.domains[0].domain",
                with(|m| {
                    m.energy.domains =
                        vec![DomainEnergy { domain: long(MAX_NAME_BYTES + 1), joules: 0.0, in_total: true }]
                }),
            ),
            ("measurement.energy.note", with(|m| m.energy.note = Some(long(MAX_TEXT_BYTES + 1)))),
            (
                "measurement.energy.series",
                with(|m| m.energy.series = vec![PowerSample { elapsed_ms: 0, watts: 0.0 }; MAX_POWER_SAMPLES + 1]),
            ),
            ("measurement.limits.cpus", with(|m| m.limits.cpus = vec![0; MAX_CPUS + 1])),
            ("measurement.log_tail", with(|m| m.log_tail = long(MAX_LOG_TAIL_BYTES + 1))),
            ("measurement.segments", with(|m| m.segments = vec![seg(); MAX_SEGMENTS + 1])),
            (
                "measurement.segments[0].cpus",
                with(|m| m.segments = vec![Segment { cpus: vec![0; MAX_CPUS + 1], ..seg() }]),
            ),
            ("measurement.interference", with(|m| m.interference = vec!["x".into(); MAX_INTERFERENCE + 1])),
            ("measurement.interference[0]", with(|m| m.interference = vec!["forged\nline".into()])),
            ("measurement.exit", with(|m| m.exit = ExitOutcome::SpawnFailed("no\rsuch".into()))),
            ("measurement.exit", with(|m| m.exit = ExitOutcome::SpawnFailed(long(MAX_TEXT_BYTES + 1)))),
            ("trial.study", result_for_study(&long(MAX_NAME_BYTES + 1))),
            ("trial.study", result_for_study("s\n")),
            ("metrics", progress(|p| p.metrics = (0..=MAX_METRICS).map(|i| (i.to_string(), 0.0)).collect())),
            (
                "reason",
                AgentMessage::Refuse(Refusal {
                    trial: TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 0 },
                    reason: long(MAX_TEXT_BYTES + 1),
                }),
            ),
            (
                "reason",
                AgentMessage::Refuse(Refusal {
                    trial: TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 0 },
                    reason: "\x1b[31mFORGED".into(),
                }),
            ),
            (
                "running",
                AgentMessage::Request(WorkRequest {
                    seq: 1,
                    free: 1,
                    ahead: 0,
                    running: vec![TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 0 }; 2 * MAX_SLOTS + 1],
                    held: vec![],
                }),
            ),
            (
                "held",
                AgentMessage::Request(WorkRequest {
                    seq: 1,
                    free: 1,
                    ahead: 0,
                    running: vec![],
                    held: vec![
                        TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 0 };
                        MAX_SLOTS * tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT as usize + 1
                    ],
                }),
            ),
            (
                "running[1].trial.trial",
                AgentMessage::Request(WorkRequest {
                    seq: 1,
                    free: 1,
                    ahead: 0,
                    running: vec![
                        TrialRef { study: "s".into(), study_id: 7, trial: 0, attempt: 0 },
                        TrialRef { study: "s".into(), study_id: 7, trial: u64::MAX, attempt: 0 },
                    ],
                    held: vec![],
                }),
            ),
        ];
        for (field, msg) in cases {
            assert_eq!(refused(&msg).as_deref(), Some(field));
        }
        // At the bound exactly: kept.
        assert_eq!(refused(&with(|m| m.log_tail = long(MAX_LOG_TAIL_BYTES))), None);
        assert_eq!(refused(&with(|m| m.segments = vec![seg(); MAX_SEGMENTS])), None);
    }

    fn result_for_study(study: &str) -> AgentMessage {
        AgentMessage::Result(TrialResult {
            trial: TrialRef { study: study.into(), study_id: 7, trial: 0, attempt: 0 },
            measurement: good(),
        })
    }

    /// A checkpoint smuggled options and forged log
    /// lines into another agent's command.
    #[test]
    fn regression_checkpoints_are_one_plain_argument() {
        let cp = |c: &str| refused(&progress(|p| p.checkpoint = Some(c.into())));
        assert_eq!(cp("s3://bucket/ckpt/7"), None);
        assert_eq!(cp("--output=/home/victim/.bashrc").as_deref(), Some("checkpoint"));
        assert_eq!(cp("/ckpt\n\x1b[31mFORGED LOG LINE").as_deref(), Some("checkpoint"));
        assert_eq!(cp("").as_deref(), Some("checkpoint"));
        assert_eq!(cp(&"x".repeat(MAX_CHECKPOINT_BYTES)), None);
        assert_eq!(cp(&"x".repeat(MAX_CHECKPOINT_BYTES + 1)).as_deref(), Some("checkpoint"));
        let e = message(&progress(|p| p.checkpoint = Some("-x".into()))).expect_err("refused");
        assert_eq!(e.why, Why::LeadingDash);
        let epoch = with(|m| {
            m.epochs =
                vec![EpochMetrics { epoch: 1, elapsed_us: 0, metrics: Metrics::new(), checkpoint: Some("-rf".into()) }]
        });
        assert_eq!(refused(&epoch).as_deref(), Some("measurement.epochs[0].checkpoint"));

        let prefix = Some("s3://bucket/ckpt/");
        assert_eq!(checkpoint_under("s3://bucket/ckpt/t7/e3", prefix), Ok(()));
        assert_eq!(checkpoint_under("anything", None), Ok(()));
        for outside in
            ["s3://bucket/other", "s3://bucket/ckpt", "/tmp/x", "s3://bucket/ckpt/../../etc", "s3://bucket/ckpt/a/.."]
        {
            assert!(checkpoint_under(outside, prefix).is_err(), "{outside}");
        }
        // A prefix without its slash holds its directory, not its namesakes.
        let bare = Some("/shared/ckpt");
        assert_eq!(checkpoint_under("/shared/ckpt/t1.pt", bare), Ok(()));
        assert!(checkpoint_under("/shared/ckpt-other/evil.pt", bare).is_err());
        assert!(checkpoint_under("/shared/ckptevil.pt", bare).is_err());
    }

    /// U+202E survived into logs, the summary, `status` and the report.
    #[test]
    fn regression_a_bidirectional_override_is_refused_like_a_control_character() {
        let e = message(&progress(|p| {
            p.metrics = [("acc\u{202E}ssol".to_string(), 1.0)].into();
        }))
        .expect_err("refused");
        assert_eq!(e.why, Why::Control);
        let e = message(&progress(|p| p.checkpoint = Some("/ckpt/\u{2066}x".into()))).expect_err("refused");
        assert_eq!(e.why, Why::Control);
        assert!(message(&progress(|p| p.metrics = [("accuracy".to_string(), 1.0)].into())).is_ok());
    }

    /// GPUs an agent offers and GPU readings a result carries.
    #[test]
    fn regression_a_cpu_share_is_a_finite_share() {
        let with = |share: f64| {
            let mut m =
                Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""));
            m.cpu_share = Some(share);
            measurement(&m).err().map(|e| (e.field, e.why))
        };
        assert_eq!(with(0.25), None);
        assert_eq!(with(1.0), None);
        for bad in [f64::NAN, -7.0, 1e308, f64::INFINITY, 1.0000001] {
            let refused = with(bad).expect("refused");
            assert_eq!(refused.0, "cpu_share", "{bad}");
        }
    }

    #[test]
    fn gpus_are_bounded_listed_once_and_never_negative() {
        use tunefleet_common::measurement::{GpuEnergy, GpuMethod};
        use tunefleet_common::message::GpuDevice;
        let gpu = |index| GpuDevice { index, uuid: format!("GPU-{index}"), name: "H200".into() };
        assert_eq!(info_with(|i| i.gpus = (0..MAX_GPUS).map(gpu).collect()), None);
        assert_eq!(info_with(|i| i.gpus = (0..=MAX_GPUS).map(gpu).collect()).as_deref(), Some("gpus"));
        let twice = AgentInfo { gpus: vec![gpu(0), gpu(1), gpu(0)], ..AgentInfo::minimal("a", 1) };
        assert_eq!(agent_info(&twice).map_err(|e| e.why), Err(Why::Twice("GPU 0".into())));
        let reading = |index, joules| GpuEnergy {
            index,
            uuid: "GPU-a".into(),
            joules,
            method: GpuMethod::Counter,
            valid: true,
            note: None,
        };
        assert_eq!(refused(&with(|m| m.gpus = vec![reading(0, 5.0), reading(1, 0.0)])), None);
        assert_eq!(refused(&with(|m| m.gpus = vec![reading(0, -1.0)])).as_deref(), Some("measurement.gpus[0].joules"));
        assert_eq!(
            refused(&with(|m| m.gpus = vec![reading(0, f64::NAN)])).as_deref(),
            Some("measurement.gpus[0].joules")
        );
        assert_eq!(
            refused(&with(|m| m.gpus = vec![reading(2, 1.0), reading(2, 1.0)])).as_deref(),
            Some("measurement.gpus")
        );
    }

    fn info_with(edit: impl FnOnce(&mut AgentInfo)) -> Option<String> {
        let mut info = AgentInfo::minimal("agent-1.lab_b", 7);
        edit(&mut info);
        agent_info(&info).err().map(|e| e.field)
    }

    #[test]
    fn agent_info_is_bounded() {
        let long = |n: usize| "x".repeat(n);
        assert_eq!(info_with(|_| {}), None);
        let full = info_with(|i| {
            i.agent = long(64);
            i.version = long(MAX_NAME_BYTES);
            i.cores = MAX_CPUS as u32;
            i.slots = MAX_SLOTS as u32;
            i.tags = (0..MAX_TAGS).map(|k| (k.to_string(), long(MAX_NAME_BYTES))).collect();
            i.counters = vec![long(MAX_COUNTER_NAME_BYTES); MAX_COUNTERS];
            i.energy = vec![
                EnergySourceInfo {
                    kind: EnergySourceKind::Rapl,
                    domains: vec!["package-0".into(); MAX_DOMAINS],
                    readable: true,
                    note: None
                };
                MAX_ENERGY_SOURCES
            ];
        });
        assert_eq!(full, None, "at every bound exactly: admitted");
        let source = |domains: usize, note: &str| EnergySourceInfo {
            kind: EnergySourceKind::Rapl,
            domains: vec!["d".into(); domains],
            readable: false,
            note: Some(note.into()),
        };
        let cases: Vec<(&str, Option<String>)> = vec![
            ("agent", info_with(|i| i.agent = String::new())),
            ("agent", info_with(|i| i.agent = long(65))),
            ("agent", info_with(|i| i.agent = "a/b".into())),
            ("agent", info_with(|i| i.agent = "a\n".into())),
            ("version", info_with(|i| i.version = long(MAX_NAME_BYTES + 1))),
            ("arch", info_with(|i| i.arch = "x86\x1b".into())),
            ("os", info_with(|i| i.os = long(MAX_NAME_BYTES + 1))),
            ("kernel", info_with(|i| i.kernel = long(MAX_NAME_BYTES + 1))),
            ("cores", info_with(|i| i.cores = MAX_CPUS as u32 + 1)),
            ("slots", info_with(|i| i.slots = MAX_SLOTS as u32 + 1)),
            ("lookahead", info_with(|i| i.lookahead = i.slots * tunefleet_common::message::MAX_LOOKAHEAD_PER_SLOT + 1)),
            ("memory_bytes", info_with(|i| i.memory_bytes = u64::MAX)),
            ("tags", info_with(|i| i.tags = (0..=MAX_TAGS).map(|k| (k.to_string(), String::new())).collect())),
            ("tags", info_with(|i| i.tags = [(long(MAX_NAME_BYTES + 1), String::new())].into())),
            ("tags[\"k\"]", info_with(|i| i.tags = [("k".into(), long(MAX_NAME_BYTES + 1))].into())),
            ("counters", info_with(|i| i.counters = vec!["c".into(); MAX_COUNTERS + 1])),
            ("counters[0]", info_with(|i| i.counters = vec![long(MAX_COUNTER_NAME_BYTES + 1)])),
            ("energy", info_with(|i| i.energy = vec![source(1, ""); MAX_ENERGY_SOURCES + 1])),
            ("energy[0].domains", info_with(|i| i.energy = vec![source(MAX_DOMAINS + 1, "")])),
            ("energy[0].note", info_with(|i| i.energy = vec![source(1, &long(MAX_TEXT_BYTES + 1))])),
        ];
        for (field, got) in cases {
            assert_eq!(got.as_deref(), Some(field));
        }
    }
}
