//! Checks an authenticated message before it reaches the scheduler or the
//! store: every value must be storable (SQLite integers are signed 64-bit).
//! A message that fails is refused with its reason and counted by the
//! engine; a refused result is answered so the agent parks it. Pure: plain
//! values in, a verdict out.

use tunefleet_common::measurement::Measurement;
use tunefleet_common::message::{AgentMessage, TrialRef};

/// Why a message cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value} is out of range (at most {max})", max = i64::MAX)]
pub struct Invalid {
    pub field: &'static str,
    pub value: u64,
}

fn fits(field: &'static str, value: u64) -> Result<(), Invalid> {
    if i64::try_from(value).is_ok() {
        Ok(())
    } else {
        Err(Invalid { field, value })
    }
}

fn trial(t: &TrialRef) -> Result<(), Invalid> {
    fits("trial", t.trial)
}

fn measurement(m: &Measurement) -> Result<(), Invalid> {
    fits("started_unix_ms", m.started_unix_ms)?;
    fits("wall_us", m.wall_us)?;
    fits("user_us", m.user_us)?;
    fits("sys_us", m.sys_us)?;
    fits("max_rss_kib", m.max_rss_kib)?;
    for e in &m.epochs {
        fits("epochs.elapsed_us", e.elapsed_us)?;
    }
    Ok(())
}

/// Whether every value of `msg` can be stored.
pub fn message(msg: &AgentMessage) -> Result<(), Invalid> {
    match msg {
        AgentMessage::Result(r) => trial(&r.trial).and_then(|()| measurement(&r.measurement)),
        AgentMessage::Progress(p) => trial(&p.trial).and_then(|()| fits("elapsed_us", p.elapsed_us)),
        AgentMessage::Refuse(r) => trial(&r.trial),
        AgentMessage::Request(r) => r.running.iter().try_for_each(trial),
        AgentMessage::Status(_) | AgentMessage::Telemetry(_) | AgentMessage::Synced(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::{EnergyReading, EnergySourceKind, ExitOutcome};
    use tunefleet_common::message::{Progress, TrialResult};

    fn result(wall_us: u64, trial: u64) -> AgentMessage {
        AgentMessage::Result(TrialResult {
            trial: TrialRef { study: "s".into(), trial, attempt: 1 },
            measurement: Measurement {
                wall_us,
                ..Measurement::unmeasured(ExitOutcome::Exited(0), EnergyReading::none(EnergySourceKind::Estimated, ""))
            },
        })
    }

    #[test]
    fn values_past_i64_are_refused_with_their_field() {
        assert_eq!(message(&result(5, 1)), Ok(()));
        assert_eq!(message(&result(i64::MAX as u64, 1)), Ok(()));
        let e = message(&result(u64::MAX, 1)).expect_err("refused");
        assert_eq!(e.field, "wall_us");
        assert!(e.to_string().contains("wall_us = 18446744073709551615"), "{e}");
        assert_eq!(message(&result(1, u64::MAX)).map_err(|e| e.field), Err("trial"));
        let p = AgentMessage::Progress(Progress {
            trial: TrialRef { study: "s".into(), trial: 0, attempt: 0 },
            epoch: 1,
            elapsed_us: 1 << 63,
            metrics: Default::default(),
            checkpoint: None,
            profile: None,
        });
        assert_eq!(message(&p).map_err(|e| e.field), Err("elapsed_us"));
    }
}
