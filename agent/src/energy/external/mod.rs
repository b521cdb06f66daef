//! External meters: a PDU outlet, a smart plug, a lab power meter, read
//! through a command (`--energy-command`) or an HTTP endpoint
//! (`--energy-url`) that prints one value ([`value`] says which forms).
//! Readings are labelled [`EnergySourceKind::External`], with the command
//! or URL in the note. When configured, the external meter is the source:
//! it is never skipped for another one, whatever it answers.
//!
//! # Semantics
//!
//! * Watts (power now) are integrated over time like a hwmon power sensor:
//!   trapezoids between readings.
//! * Joules are a cumulative counter: the energy is the difference between
//!   readings. A counter that goes down (the meter was reset, or wrapped at
//!   a range nobody told us) makes the reading invalid with both values;
//!   that interval's energy is unknown, never negative, and counting goes
//!   on from the new value.
//!
//! # Failures
//!
//! A reading that fails (the command exits non-zero, prints garbage, or
//! outlives `--energy-timeout`, 2 s by default; the HTTP server does not
//! answer or answers an error) makes the measurement's energy invalid, with
//! the reason, and counting goes on with the next good reading. The note
//! says how many readings failed and how many in a row at the end; the log
//! says so at the first failure, once when failures repeat
//! ([`REPEATED_FAILURES`] in a row), and when the meter answers again.
//!
//! # Timing
//!
//! Reading a meter takes time (a process, a network round trip), so the
//! meter is read on a thread of its own: each [`EnergyMeter::sample`]
//! takes the readings that have arrived and asks for the next, and never
//! blocks the agent. A reading is dated halfway through its request.
//! [`EnergySource::start`] and [`EnergyMeter::stop`] wait for their reading
//! (at most the timeout, twice for `stop` when a reading was under way):
//! the first and last values bound the measurement. Dates are clamped into
//! the measured span: the power read just before the start counts from the
//! start, the one read just after the end up to the end.

pub mod fetch;
pub mod value;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use tunefleet_common::measurement::{push_power_sample, DomainEnergy, EnergyReading, EnergySourceKind, PowerSample};
use tunefleet_common::message::EnergySourceInfo;

pub use fetch::{FetchError, HttpUrl};
pub use value::{parse_value, Unit, Value, ValueError};

use super::source::{EnergyError, EnergyMeter, EnergySource, Usage};

/// How long one reading may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Failures in a row after which the log says the meter keeps failing.
pub const REPEATED_FAILURES: u32 = 3;
/// The one domain of an external meter.
pub const DOMAIN: &str = "external";

/// Where an external meter is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Run by `sh -c`; its standard output is the value.
    Command(String),
    /// GET; the body of a 2xx answer is the value.
    Url(HttpUrl),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Command(c) => write!(f, "command `{c}`"),
            Target::Url(u) => write!(f, "GET {u}"),
        }
    }
}

/// An external meter as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalConfig {
    pub target: Target,
    /// What a bare number means.
    pub unit: Unit,
    /// Bound of one reading.
    pub timeout: Duration,
}

impl ExternalConfig {
    /// Reads the meter once (blocking, within the timeout).
    pub fn read_once(&self) -> Result<Value, String> {
        let output = match &self.target {
            Target::Command(c) => fetch::run_command(c, self.timeout),
            Target::Url(u) => fetch::http_get(u, self.timeout),
        }
        .map_err(|e| e.to_string())?;
        parse_value(&output, self.unit).map_err(|e| e.to_string())
    }

    /// How the figures are made, for notes and `probe`.
    pub fn describe(&self) -> String {
        format!("external meter, {}, bare numbers in {}", self.target, self.unit)
    }
}

/// The external meter as an [`EnergySource`].
#[derive(Debug, Clone)]
pub struct ExternalSource {
    pub config: ExternalConfig,
}

impl EnergySource for ExternalSource {
    fn kind(&self) -> EnergySourceKind {
        EnergySourceKind::External
    }

    fn info(&self) -> EnergySourceInfo {
        let read = self.config.read_once();
        EnergySourceInfo {
            kind: EnergySourceKind::External,
            domains: vec![DOMAIN.to_string()],
            readable: read.is_ok(),
            note: Some(match read {
                Ok(v) => format!("{}; reads {}", self.config.describe(), shown(v)),
                Err(e) => format!("{}; reading failed: {e}", self.config.describe()),
            }),
        }
    }

    fn start(&self) -> Result<Box<dyn EnergyMeter>, EnergyError> {
        let (request_tx, request_rx) = mpsc::channel::<()>();
        let (reading_tx, readings) = mpsc::channel::<Timed>();
        let config = self.config.clone();
        std::thread::Builder::new()
            .name("energy-meter".into())
            .spawn(move || {
                // Ends when the meter is dropped (no more requests, or no
                // one to send to).
                while request_rx.recv().is_ok() {
                    let before = Instant::now();
                    let result = config.read_once();
                    let at = before + before.elapsed() / 2;
                    if reading_tx.send(Timed { at, result }).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| EnergyError::Thread(e.to_string()))?;
        let mut meter = ExternalMeter {
            config: self.config.clone(),
            requests: request_tx,
            readings,
            in_flight: false,
            epoch: Instant::now(),
            integrator: Integrator::default(),
            last_elapsed: Duration::ZERO,
            samples: 0,
            series: Vec::new(),
            last_watts: None,
        };
        // The first value, read before the workload starts, dated at the start.
        meter.wait_for_reading(Some(0.0));
        meter.epoch = Instant::now();
        Ok(Box::new(meter))
    }
}

fn shown(v: Value) -> String {
    match v {
        Value::Watts(w) => format!("{w} W"),
        Value::Joules(j) => format!("{j} J"),
    }
}

/// A reading and when it was taken (halfway through its request).
#[derive(Debug, Clone)]
struct Timed {
    at: Instant,
    result: Result<Value, String>,
}

/// Energy from a series of readings: pure, fed in order.
#[derive(Debug, Default, Clone)]
pub struct Integrator {
    /// The last good reading and its date.
    last: Option<(f64, Value)>,
    /// Joules counted so far.
    pub joules: f64,
    /// Why the figure cannot be trusted (distinct reasons, in order).
    pub reasons: Vec<String>,
    pub readings: u32,
    pub failures: u32,
    /// Failures since the last good reading.
    pub failing: u32,
}

/// What one reading changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Increment {
    /// The first good reading: nothing to count yet.
    First,
    /// Energy over the interval since the previous good reading.
    Interval { seconds: f64, joules: f64 },
    /// No energy counted (a failure, a counter reset, a unit switch).
    Nothing,
}

impl Integrator {
    fn invalid(&mut self, reason: String) {
        if !self.reasons.contains(&reason) {
            self.reasons.push(reason);
        }
    }

    /// Adds a reading taken at `at` seconds (dates are kept in order: a
    /// reading dated before the previous one counts at the same time).
    pub fn add(&mut self, at: f64, result: Result<Value, String>) -> Increment {
        self.readings += 1;
        let value = match result {
            Ok(v) => v,
            Err(e) => {
                self.failures += 1;
                self.failing += 1;
                self.invalid(format!("reading failed: {e}"));
                return Increment::Nothing;
            }
        };
        self.failing = 0;
        let Some((t0, prev)) = self.last else {
            self.last = Some((at, value));
            return Increment::First;
        };
        let at = at.max(t0);
        let seconds = at - t0;
        let joules = match (prev, value) {
            (Value::Watts(p0), Value::Watts(p1)) => (p0 + p1) / 2.0 * seconds,
            (Value::Joules(c0), Value::Joules(c1)) if c1 >= c0 => c1 - c0,
            (Value::Joules(c0), Value::Joules(c1)) => {
                self.invalid(format!(
                    "the counter went down ({c0} J -> {c1} J): the meter was reset or wrapped; \
                     the energy of that interval is unknown"
                ));
                self.last = Some((at, value));
                return Increment::Nothing;
            }
            (a, b) => {
                self.invalid(format!("the meter switched from {} to {}", a.unit(), b.unit()));
                return Increment::Nothing;
            }
        };
        self.last = Some((at, value));
        self.joules += joules;
        Increment::Interval { seconds, joules }
    }

    /// Joules up to `end`: power held from the last good reading when it
    /// came earlier (a counter has nothing to add).
    pub fn joules_until(&self, end: f64) -> f64 {
        match self.last {
            Some((t, Value::Watts(p))) if end > t => self.joules + p * (end - t),
            _ => self.joules,
        }
    }

    /// The failures, for the note: how many, and how many in a row at the end.
    pub fn failure_summary(&self) -> Option<String> {
        (self.failures > 0).then(|| {
            let tail = if self.failing > 0 { format!(", the last {} in a row", self.failing) } else { String::new() };
            format!("{} of {} readings failed{tail}", self.failures, self.readings)
        })
    }
}

/// A measurement in progress on an external meter.
struct ExternalMeter {
    config: ExternalConfig,
    requests: mpsc::Sender<()>,
    readings: mpsc::Receiver<Timed>,
    in_flight: bool,
    epoch: Instant,
    integrator: Integrator,
    last_elapsed: Duration,
    samples: u64,
    series: Vec<PowerSample>,
    last_watts: Option<f64>,
}

impl ExternalMeter {
    fn request(&mut self) {
        if !self.in_flight {
            // The worker is gone only if it panicked: the wait then fails.
            self.in_flight = self.requests.send(()).is_ok();
        }
    }

    /// Seconds from the epoch to `at` (0 before it).
    fn date(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.epoch).as_secs_f64()
    }

    /// Takes one reading, dated `at` when given (else when it was read).
    fn take(&mut self, timed: Timed, at: Option<f64>) {
        self.in_flight = false;
        let at = at.unwrap_or_else(|| self.date(timed.at));
        let failed_before = self.integrator.failing;
        if let Err(e) = &timed.result {
            let n = self.integrator.failing + 1;
            if n == 1 || n == REPEATED_FAILURES {
                let repeated = n == REPEATED_FAILURES;
                tracing::warn!(
                    meter = %self.config.target,
                    error = %e,
                    in_a_row = n,
                    repeated,
                    "external energy meter reading failed"
                );
            }
        }
        match self.integrator.add(at, timed.result) {
            Increment::Interval { seconds, joules } if seconds > 0.0 => {
                let watts = joules / seconds;
                self.last_watts = Some(watts);
                let elapsed_ms = (at * 1000.0) as u64;
                push_power_sample(&mut self.series, PowerSample { elapsed_ms, watts });
            }
            _ => {}
        }
        if failed_before >= REPEATED_FAILURES && self.integrator.failing == 0 {
            tracing::info!(meter = %self.config.target, "external energy meter answers again");
        }
    }

    /// Takes every reading that has arrived.
    fn drain(&mut self) {
        while let Ok(timed) = self.readings.try_recv() {
            self.take(timed, None);
        }
    }

    /// Asks for a reading (unless one is under way) and waits for it,
    /// bounded; dates it `at` when given.
    fn wait_for_reading(&mut self, at: Option<f64>) {
        self.request();
        let bound = self.config.timeout + Duration::from_secs(1);
        match self.readings.recv_timeout(bound) {
            Ok(timed) => self.take(timed, at),
            Err(_) => {
                self.in_flight = false;
                let reason = format!("no reading within {} ms", bound.as_millis());
                self.take(Timed { at: Instant::now(), result: Err(reason) }, at);
            }
        }
    }
}

impl EnergyMeter for ExternalMeter {
    fn sample(&mut self, elapsed: Duration) {
        self.drain();
        self.request();
        self.last_elapsed = elapsed;
        self.samples += 1;
    }

    fn last_watts(&self) -> Option<f64> {
        self.last_watts
    }

    fn so_far(&self, _usage: &Usage) -> Option<f64> {
        Some(self.integrator.joules)
    }

    fn stop(mut self: Box<Self>, elapsed: Duration, _usage: &Usage) -> EnergyReading {
        let end = elapsed.as_secs_f64();
        self.drain();
        if self.in_flight {
            // Asked for before the end: it counts where it was taken.
            let bound = self.config.timeout + Duration::from_secs(1);
            if let Ok(timed) = self.readings.recv_timeout(bound) {
                let at = self.date(timed.at).min(end);
                self.take(timed, Some(at));
            }
            self.in_flight = false;
        }
        // The last value, read just after the end, dated at the end.
        self.wait_for_reading(Some(end));
        if self.samples == 0 || elapsed > self.last_elapsed {
            self.samples += 1;
        }
        let joules = self.integrator.joules_until(end);
        let mut reasons = self.integrator.reasons.clone();
        if let Some(summary) = self.integrator.failure_summary() {
            reasons.insert(0, summary);
        }
        let valid = reasons.is_empty();
        let describe = self.config.describe();
        let interval_ms = u32::try_from(elapsed.as_millis() / u128::from(self.samples.max(1))).unwrap_or(u32::MAX);
        EnergyReading {
            source: EnergySourceKind::External,
            joules,
            domains: vec![DomainEnergy { domain: DOMAIN.to_string(), joules, in_total: true }],
            interval_ms,
            valid,
            note: Some(if valid { describe } else { format!("{}; {describe}", reasons.join("; ")) }),
            series: self.series,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage() -> Usage {
        Usage { wall: Duration::ZERO, cpu: Duration::ZERO, cores: 1 }
    }

    fn source(command: &str, unit: Unit, timeout: Duration) -> ExternalSource {
        ExternalSource { config: ExternalConfig { target: Target::Command(command.into()), unit, timeout } }
    }

    /// Samples `meter` `n` times, waiting between samples so readings arrive.
    fn run(meter: &mut Box<dyn EnergyMeter>, n: u64, step: Duration) -> Duration {
        for i in 1..=n {
            std::thread::sleep(step);
            meter.sample(step * u32::try_from(i).unwrap_or(u32::MAX));
        }
        step * u32::try_from(n + 1).unwrap_or(u32::MAX)
    }

    #[test]
    fn watts_integrate_as_trapezoids() {
        let mut i = Integrator::default();
        assert_eq!(i.add(0.0, Ok(Value::Watts(10.0))), Increment::First);
        assert_eq!(i.add(2.0, Ok(Value::Watts(20.0))), Increment::Interval { seconds: 2.0, joules: 30.0 });
        assert_eq!(i.add(3.0, Ok(Value::Watts(20.0))), Increment::Interval { seconds: 1.0, joules: 20.0 });
        assert_eq!(i.joules, 50.0);
        // Held from the last reading up to the end.
        assert_eq!(i.joules_until(4.5), 80.0);
        assert!(i.reasons.is_empty());
    }

    #[test]
    fn joules_are_a_counter_and_a_decrease_is_reported_not_negative() {
        let mut i = Integrator::default();
        i.add(0.0, Ok(Value::Joules(1000.0)));
        assert_eq!(i.add(1.0, Ok(Value::Joules(1040.0))), Increment::Interval { seconds: 1.0, joules: 40.0 });
        assert_eq!(i.add(2.0, Ok(Value::Joules(5.0))), Increment::Nothing, "reset: unknown, not -1035 J");
        assert_eq!(i.add(3.0, Ok(Value::Joules(25.0))), Increment::Interval { seconds: 1.0, joules: 20.0 });
        assert_eq!(i.joules, 60.0);
        assert_eq!(i.joules_until(10.0), 60.0, "a counter has nothing to extrapolate");
        assert_eq!(i.reasons.len(), 1);
        assert!(i.reasons[0].contains("1040 J -> 5 J"), "{:?}", i.reasons);
    }

    #[test]
    fn failures_and_unit_switches_make_reasons() {
        let mut i = Integrator::default();
        i.add(0.0, Ok(Value::Watts(10.0)));
        assert_eq!(i.add(1.0, Err("exit status 1".into())), Increment::Nothing);
        assert_eq!(i.add(2.0, Err("exit status 1".into())), Increment::Nothing);
        assert_eq!(i.failing, 2);
        // The gap is bridged, but the reading stays invalid.
        assert_eq!(i.add(3.0, Ok(Value::Watts(10.0))), Increment::Interval { seconds: 3.0, joules: 30.0 });
        assert_eq!(i.failing, 0);
        assert_eq!(i.add(4.0, Ok(Value::Joules(3.0))), Increment::Nothing);
        assert_eq!(i.reasons, ["reading failed: exit status 1", "the meter switched from watts to joules"]);
        assert_eq!(i.failure_summary().as_deref(), Some("2 of 5 readings failed"));
        i.add(5.0, Err("x".into()));
        assert_eq!(i.failure_summary().as_deref(), Some("3 of 6 readings failed, the last 1 in a row"));
    }

    #[test]
    fn a_meter_command_through_the_energy_source() {
        let src = source("echo 5 W", Unit::Joules, DEFAULT_TIMEOUT);
        assert_eq!(src.kind(), EnergySourceKind::External);
        let info = src.info();
        assert!(info.readable, "{info:?}");
        assert!(info.note.as_deref().is_some_and(|n| n.contains("command `echo 5 W`")), "{info:?}");
        let mut meter = src.start().expect("starts");
        let end = run(&mut meter, 3, Duration::from_millis(100));
        assert!(meter.last_watts().is_some_and(|w| (w - 5.0).abs() < 1e-9), "{:?}", meter.last_watts());
        let r = meter.stop(end, &usage());
        assert_eq!(r.source, EnergySourceKind::External);
        assert!(r.valid, "{:?}", r.note);
        // 5 W held for the whole span, whatever the dates of the readings.
        let expected = 5.0 * end.as_secs_f64();
        assert!((r.joules - expected).abs() < 1e-6, "{} J, expected {expected}", r.joules);
        assert_eq!(r.domains.len(), 1);
        assert!(!r.series.is_empty());
        assert!(r.note.as_deref().is_some_and(|n| n.contains("echo 5 W")), "{:?}", r.note);
    }

    #[test]
    fn a_configured_meter_is_selected_even_when_it_fails_now() {
        let dir = tempfile::tempdir().expect("tempdir");
        let zone = dir.path().join("powercap/intel-rapl:0");
        std::fs::create_dir_all(&zone).expect("mkdir");
        std::fs::write(zone.join("name"), "package-0\n").expect("write");
        std::fs::write(zone.join("energy_uj"), "1000\n").expect("write");
        for (command, readable) in [("echo 5 W", true), ("exit 1", false)] {
            let roots = crate::energy::EnergyRoots {
                external: Some(source(command, Unit::Watts, DEFAULT_TIMEOUT).config),
                ..crate::energy::EnergyRoots::under(dir.path())
            };
            let sel = crate::energy::select(&roots, crate::energy::EstimateModel::default());
            assert_eq!(sel.source.kind(), EnergySourceKind::External, "{command}");
            let kinds: Vec<EnergySourceKind> = sel.found.iter().map(|i| i.kind).collect();
            assert_eq!(kinds, [EnergySourceKind::External, EnergySourceKind::Rapl, EnergySourceKind::Estimated]);
            assert_eq!(sel.found[0].readable, readable, "{command}");
            assert!(sel.skipped.is_empty(), "RAPL is not skipped, only not used");
        }
        let sel = crate::energy::select(&crate::energy::EnergyRoots::under(dir.path()), Default::default());
        assert_eq!(sel.source.kind(), EnergySourceKind::Rapl, "without a meter, as before");
    }

    #[test]
    fn a_meter_url_through_the_energy_source() {
        let (url, server) = fetch::tests::serve(|line| {
            if line.contains("/broken") {
                b"HTTP/1.1 500 Internal Server Error\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\n\r\n{\"watts\": 8}\n"
            }
        });
        let config = ExternalConfig { target: Target::Url(url.clone()), unit: Unit::Joules, timeout: DEFAULT_TIMEOUT };
        let src = ExternalSource { config };
        assert!(src.info().readable);
        let mut meter = src.start().expect("starts");
        let end = run(&mut meter, 3, Duration::from_millis(50));
        let r = meter.stop(end, &usage());
        assert!(r.valid, "{:?}", r.note);
        assert!((r.joules - 8.0 * end.as_secs_f64()).abs() < 1e-6, "{}", r.joules);
        assert!(r.note.as_deref().is_some_and(|n| n.contains(&format!("GET {url}"))), "{:?}", r.note);
        let broken = HttpUrl { path: "/broken".into(), ..url.clone() };
        let config = ExternalConfig { target: Target::Url(broken), unit: Unit::Watts, timeout: DEFAULT_TIMEOUT };
        let r = ExternalSource { config }.start().expect("starts").stop(Duration::from_millis(10), &usage());
        assert!(!r.valid);
        assert!(r.note.as_deref().is_some_and(|n| n.contains("HTTP status 500")), "{:?}", r.note);
        let requests = fetch::tests::stop(&url, server);
        // info, start, three samples (at most), stop; then the broken meter's two.
        assert!((5..=8).contains(&requests.len()), "{}", requests.len());
    }

    #[test]
    fn a_joules_counter_command_counts_differences() {
        let dir = tempfile::tempdir().expect("tempdir");
        let counter = dir.path().join("counter");
        std::fs::write(&counter, "0").expect("write");
        // Each reading adds 10 J to the counter and prints it.
        let cmd = format!("n=$(cat {p}); n=$((n + 10)); echo $n > {p}; echo $n", p = counter.display());
        let mut meter = source(&cmd, Unit::Joules, DEFAULT_TIMEOUT).start().expect("starts");
        let end = run(&mut meter, 3, Duration::from_millis(100));
        let r = meter.stop(end, &usage());
        assert!(r.valid, "{:?}", r.note);
        let reads: f64 = std::fs::read_to_string(&counter).expect("read").trim().parse().expect("number");
        // Everything after the first reading (the baseline) counts.
        assert_eq!(r.joules, reads - 10.0);
        assert!(r.joules >= 20.0, "{}", r.joules);
    }

    #[test]
    fn garbage_and_failing_commands_make_the_energy_invalid_not_a_crash() {
        for (cmd, why) in [("echo hello", "not a number"), ("exit 1", "exited with"), ("echo", "empty output")] {
            let mut meter = source(cmd, Unit::Watts, DEFAULT_TIMEOUT).start().expect("starts");
            let end = run(&mut meter, 3, Duration::from_millis(50));
            assert_eq!(meter.last_watts(), None);
            let r = meter.stop(end, &usage());
            assert!(!r.valid, "{cmd}");
            assert_eq!(r.joules, 0.0, "{cmd}");
            let note = r.note.unwrap_or_default();
            assert!(note.contains(why), "{cmd}: {note}");
            // Every reading failed, and the note says so.
            assert!(note.contains("readings failed, the last"), "{cmd}: {note}");
            assert!(note.contains(cmd), "{cmd}: {note}");
        }
    }

    #[test]
    fn a_command_that_hangs_is_bounded_and_reported() {
        let timeout = Duration::from_millis(200);
        let started = Instant::now();
        let mut meter = source("sleep 30", Unit::Watts, timeout).start().expect("starts");
        let end = run(&mut meter, 2, Duration::from_millis(50));
        let r = meter.stop(end, &usage());
        assert!(!r.valid);
        assert!(r.note.as_deref().is_some_and(|n| n.contains("no answer within 200 ms")), "{:?}", r.note);
        // start, one in-flight reading and the last: each at most the timeout.
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn a_meter_that_fails_then_recovers_keeps_counting_but_is_invalid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let flag = dir.path().join("broken");
        let cmd = format!("if [ -e {} ]; then exit 1; fi; echo 10", flag.display());
        let mut meter = source(&cmd, Unit::Watts, DEFAULT_TIMEOUT).start().expect("starts");
        run(&mut meter, 2, Duration::from_millis(60));
        std::fs::write(&flag, "").expect("write");
        run(&mut meter, 2, Duration::from_millis(150));
        std::fs::remove_file(&flag).expect("remove");
        let end = Duration::from_millis(600);
        run(&mut meter, 2, Duration::from_millis(60));
        let r = meter.stop(end, &usage());
        assert!(!r.valid);
        let note = r.note.unwrap_or_default();
        assert!(note.contains("readings failed") && !note.contains("in a row"), "{note}");
        assert!(r.joules > 0.0);
    }
}
