//! The meter shared by every metered source: a list of channels, each a
//! cumulative energy counter (wrap-around handled by
//! [`counter_delta`]) or an instantaneous power reading
//! integrated over time (trapezoids between samples). Discovery (which
//! channels exist, which count towards the total) is the sources' job.
//!
//! A channel that cannot be read any more (its zone disappeared) keeps the
//! energy counted so far and makes the reading invalid with the reason; a
//! battery status other than `Discharging` at any sample does the same (see
//! the battery source).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tunefleet_common::measurement::{push_power_sample, DomainEnergy, EnergyReading, EnergySourceKind, PowerSample};
use tunefleet_common::message::EnergySourceInfo;

use super::source::{read_i64, read_text, EnergyError, EnergyMeter, EnergySource, SysfsRead, Usage};

/// Energy between two readings of a counter that wraps after `max_range_uj`
/// (the value after `max_range_uj` is 0). `None` when the counter went
/// backwards and no range is known (or the range is inconsistent with the
/// previous value): the delta cannot be told. Several wraps between two
/// samples are indistinguishable from one; see `rapl::max_sampling_interval`.
pub fn counter_delta(prev: u64, now: u64, max_range_uj: Option<u64>) -> Option<u64> {
    if now >= prev {
        return Some(now - prev);
    }
    match max_range_uj {
        Some(max) if max > 0 && prev <= max => Some(max - prev + now),
        _ => None,
    }
}

/// The one `status` under which a fuel gauge measures the machine.
pub const DISCHARGING: &str = "Discharging";

/// What a battery `status` other than `Discharging` says about the power supply.
pub fn status_meaning(status: &str) -> &'static str {
    match status {
        "Charging" => "on external power, charging",
        "Full" => "on external power, full",
        "Not charging" => "on external power, not charging",
        _ => "the power supply cannot be told",
    }
}

/// How one channel is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelRead {
    /// A cumulative energy counter in microjoules; wraps after
    /// `max_range_uj` when known.
    EnergyUj { path: PathBuf, max_range_uj: Option<u64> },
    /// Instantaneous (or averaged) power in microwatts.
    PowerUw { path: PathBuf },
    /// Current in microamperes times voltage in microvolts (fuel gauges);
    /// the sign of the current is ignored.
    CurrentVoltage { current: PathBuf, voltage: PathBuf },
}

/// One energy domain of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channel {
    pub domain: String,
    pub read: ChannelRead,
    /// Added to the reading's total (false for parts of another domain).
    pub in_total: bool,
}

/// A raw value read from a channel.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Raw {
    EnergyUj(u64),
    Watts(f64),
}

fn read_channel(fs: &dyn SysfsRead, read: &ChannelRead) -> Result<Raw, EnergyError> {
    let non_negative = |path: &PathBuf, v: i64| {
        u64::try_from(v).map_err(|_| EnergyError::Parse { path: path.clone(), text: v.to_string() })
    };
    Ok(match read {
        ChannelRead::EnergyUj { path, .. } => Raw::EnergyUj(non_negative(path, read_i64(fs, path)?)?),
        ChannelRead::PowerUw { path } => Raw::Watts(read_i64(fs, path)?.unsigned_abs() as f64 / 1e6),
        ChannelRead::CurrentVoltage { current, voltage } => {
            let amps = read_i64(fs, current)?.unsigned_abs() as f64 / 1e6;
            let volts = read_i64(fs, voltage)?.unsigned_abs() as f64 / 1e6;
            Raw::Watts(amps * volts)
        }
    })
}

/// A discovered metered source: RAPL, hwmon or a battery.
#[derive(Debug, Clone)]
pub struct MeteredSource {
    pub kind: EnergySourceKind,
    pub channels: Vec<Channel>,
    /// `(name, path)` of battery status files: the reading is invalid unless
    /// every one says `Discharging` at every sample.
    pub status: Vec<(String, PathBuf)>,
    pub max_interval: Option<Duration>,
    /// How the total is formed, for `probe` and the Hello.
    pub note: Option<String>,
    pub fs: Arc<dyn SysfsRead>,
}

impl MeteredSource {
    /// Reads every channel once: the error of the first that fails.
    pub fn check_readable(&self) -> Result<(), EnergyError> {
        for channel in &self.channels {
            read_channel(self.fs.as_ref(), &channel.read)?;
        }
        Ok(())
    }
}

impl EnergySource for MeteredSource {
    fn kind(&self) -> EnergySourceKind {
        self.kind
    }

    fn info(&self) -> EnergySourceInfo {
        let readable = self.check_readable();
        EnergySourceInfo {
            kind: self.kind,
            domains: self.channels.iter().map(|c| c.domain.clone()).collect(),
            readable: readable.is_ok(),
            note: match readable {
                Ok(()) => self.note.clone(),
                Err(e) => Some(e.to_string()),
            },
        }
    }

    fn max_interval(&self) -> Option<Duration> {
        self.max_interval
    }

    fn start(&self) -> Result<Box<dyn EnergyMeter>, EnergyError> {
        let mut states = Vec::with_capacity(self.channels.len());
        for channel in &self.channels {
            let raw = read_channel(self.fs.as_ref(), &channel.read)?;
            states.push(ChannelState { channel: channel.clone(), last: Some(raw), joules: 0.0 });
        }
        let mut meter = Meter {
            kind: self.kind,
            fs: Arc::clone(&self.fs),
            states,
            status: self.status.clone(),
            last_elapsed: Duration::ZERO,
            last_watts: None,
            series: Vec::new(),
            reasons: Vec::new(),
            samples: 0,
        };
        meter.check_status(Duration::ZERO);
        Ok(Box::new(meter))
    }
}

#[derive(Debug)]
struct ChannelState {
    channel: Channel,
    /// `None` once the channel could not be read any more.
    last: Option<Raw>,
    joules: f64,
}

#[derive(Debug)]
struct Meter {
    kind: EnergySourceKind,
    fs: Arc<dyn SysfsRead>,
    states: Vec<ChannelState>,
    status: Vec<(String, PathBuf)>,
    last_elapsed: Duration,
    last_watts: Option<f64>,
    series: Vec<PowerSample>,
    /// Why the reading is invalid; empty: valid.
    reasons: Vec<String>,
    samples: u64,
}

impl Meter {
    fn invalid(&mut self, reason: String) {
        if !self.reasons.contains(&reason) {
            tracing::warn!(source = %self.kind, %reason, "energy reading invalid");
            self.reasons.push(reason);
        }
    }

    fn check_status(&mut self, elapsed: Duration) {
        for (name, path) in self.status.clone() {
            match read_text(self.fs.as_ref(), &path) {
                Ok(s) if s == DISCHARGING => {}
                Ok(s) => {
                    let _ = elapsed;
                    self.invalid(format!(
                        "{name} was {s}: {}; a fuel gauge measures the workload only while discharging",
                        status_meaning(&s)
                    ));
                }
                Err(e) => self.invalid(format!("{name} status unreadable: {e}")),
            }
        }
    }
}

impl EnergyMeter for Meter {
    fn so_far(&self, _usage: &Usage) -> Option<f64> {
        Some(self.states.iter().filter(|s| s.channel.in_total).map(|s| s.joules).sum())
    }

    fn sample(&mut self, elapsed: Duration) {
        let dt = elapsed.saturating_sub(self.last_elapsed).as_secs_f64();
        let mut interval_joules = 0.0;
        let mut problems = Vec::new();
        for state in &mut self.states {
            let Some(last) = state.last else { continue };
            let now = match read_channel(self.fs.as_ref(), &state.channel.read) {
                Ok(raw) => raw,
                Err(e) => {
                    problems.push(format!(
                        "domain {} disappeared after {} ms ({e}); its energy up to then is kept",
                        state.channel.domain,
                        self.last_elapsed.as_millis()
                    ));
                    state.last = None;
                    continue;
                }
            };
            let joules = match (last, now, &state.channel.read) {
                (Raw::EnergyUj(prev), Raw::EnergyUj(cur), ChannelRead::EnergyUj { max_range_uj, .. }) => {
                    match counter_delta(prev, cur, *max_range_uj) {
                        Some(delta) => {
                            if max_range_uj.is_some_and(|m| delta > m / 2) {
                                problems.push(format!(
                                    "domain {} used over half its counter range in one interval; wraps may be missed",
                                    state.channel.domain
                                ));
                            }
                            delta as f64 / 1e6
                        }
                        None => {
                            problems.push(format!(
                                "counter of domain {} went backwards ({prev} -> {cur} uJ) with no known range",
                                state.channel.domain
                            ));
                            0.0
                        }
                    }
                }
                (Raw::Watts(p0), Raw::Watts(p1), _) => (p0 + p1) / 2.0 * dt,
                _ => 0.0,
            };
            state.last = Some(now);
            state.joules += joules;
            if state.channel.in_total {
                interval_joules += joules;
            }
        }
        for p in problems {
            self.invalid(p);
        }
        self.check_status(elapsed);
        if dt > 0.0 {
            let watts = interval_joules / dt;
            self.last_watts = Some(watts);
            let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
            push_power_sample(&mut self.series, PowerSample { elapsed_ms, watts });
        }
        self.last_elapsed = elapsed;
        self.samples += 1;
    }

    fn last_watts(&self) -> Option<f64> {
        self.last_watts
    }

    fn stop(mut self: Box<Self>, elapsed: Duration, _usage: &Usage) -> EnergyReading {
        // The runner samples when it sees the exit; a later stop adds nothing.
        if self.samples == 0 || elapsed > self.last_elapsed {
            self.sample(elapsed);
        }
        let domains: Vec<DomainEnergy> = self
            .states
            .iter()
            .map(|s| DomainEnergy { domain: s.channel.domain.clone(), joules: s.joules, in_total: s.channel.in_total })
            .collect();
        let joules = domains.iter().filter(|d| d.in_total).map(|d| d.joules).sum();
        let interval_ms = if self.samples > 1 {
            u32::try_from(elapsed.as_millis() / u128::from(self.samples)).unwrap_or(u32::MAX)
        } else {
            u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX)
        };
        let valid = self.reasons.is_empty();
        EnergyReading {
            source: self.kind,
            joules,
            domains,
            interval_ms,
            valid,
            note: (!valid).then(|| self.reasons.join("; ")),
            series: self.series,
        }
    }
}
