//! Perf counter readings of a trial: one reading per event over the whole
//! run, the series of increments per sampling interval, and the events that
//! could not be counted. Part of the measurement record
//! ([`crate::measurement`], which re-exports them); apart so that the
//! workload profile ([`crate::profile`]) derives from counters alone.

use serde::{Deserialize, Serialize};

/// Whether a counter came from the PMU or from the kernel's software events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CounterKind {
    Hardware,
    Software,
}

/// One perf counter over the whole process tree of the workload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterReading {
    /// perf-style event name, e.g. `task-clock`, `instructions`.
    pub event: String,
    pub kind: CounterKind,
    /// Raw count as read from the kernel.
    pub value: u64,
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
}

impl CounterReading {
    /// True when the kernel multiplexed this counter (it ran part of the time).
    pub fn multiplexed(&self) -> bool {
        self.time_running_ns < self.time_enabled_ns
    }

    /// The count scaled for multiplexing: `value * enabled / running`.
    pub fn scaled(&self) -> f64 {
        if self.time_running_ns == 0 {
            0.0
        } else {
            self.value as f64 * self.time_enabled_ns as f64 / self.time_running_ns as f64
        }
    }
}

/// Counter increments over one sampling interval of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CounterSample {
    /// Milliseconds since the workload started, at the end of the interval.
    pub elapsed_ms: u64,
    /// Scaled increments, one per entry of
    /// [`crate::measurement::Measurement::counters`], same order.
    pub deltas: Vec<f64>,
}

/// Longest counter series kept in one measurement; longer runs are thinned
/// by merging neighbouring samples (see [`push_counter_sample`]).
pub const MAX_COUNTER_SAMPLES: usize = 512;

/// Appends `sample` to `series`, keeping at most [`MAX_COUNTER_SAMPLES`]:
/// when full, neighbouring pairs are merged (increments added, later end
/// time), so the series covers the whole run at a coarser step.
pub fn push_counter_sample(series: &mut Vec<CounterSample>, sample: CounterSample) {
    if series.len() >= MAX_COUNTER_SAMPLES {
        let merged: Vec<CounterSample> = series
            .chunks(2)
            .map(|pair| {
                let last = &pair[pair.len() - 1];
                let mut deltas = pair[0].deltas.clone();
                for other in &pair[1..] {
                    for (d, o) in deltas.iter_mut().zip(&other.deltas) {
                        *d += o;
                    }
                }
                CounterSample { elapsed_ms: last.elapsed_ms, deltas }
            })
            .collect();
        *series = merged;
    }
    series.push(sample);
}

/// A counter that was asked for and could not be measured, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissingCounter {
    pub event: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_series_merges_keep_the_sum() {
        let mut series = Vec::new();
        let n = 2 * MAX_COUNTER_SAMPLES as u64 + 7;
        for i in 0..n {
            push_counter_sample(&mut series, CounterSample { elapsed_ms: i, deltas: vec![1.0, 2.0] });
        }
        assert!(series.len() <= MAX_COUNTER_SAMPLES);
        let total: f64 = series.iter().map(|s| s.deltas[0]).sum();
        assert_eq!(total, n as f64);
        let total2: f64 = series.iter().map(|s| s.deltas[1]).sum();
        assert_eq!(total2, 2.0 * n as f64);
    }
}
