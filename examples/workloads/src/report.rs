//! The JSON lines the workloads print on stdout, one object per line, flushed
//! as soon as written so the agent sees each epoch when it ends.

use std::io::{self, Write};

use serde::Serialize;

/// A line of `tunefleet-train`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    /// Validation loss and accuracy after an epoch, and its wall time.
    Epoch { epoch: u32, loss: f64, accuracy: f64, epoch_seconds: f64 },
    /// Validation loss and accuracy of the final model.
    Final { loss: f64, accuracy: f64 },
}

/// A line of `tunefleet-stream`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Bytes read plus bytes written per second (GB/s, 10^9) in one epoch.
    Epoch { epoch: u32, bandwidth_gbs: f64, seconds: f64 },
    /// Over all epochs: aggregate and best bandwidth, total kernel time.
    Final { bandwidth_gbs: f64, best_bandwidth_gbs: f64, seconds: f64 },
}

/// Writes `event` as one JSON line and flushes.
pub fn emit(out: &mut impl Write, event: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, event).map_err(io::Error::other)?;
    out.write_all(b"\n")?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(event: &impl Serialize) -> String {
        let mut out = Vec::new();
        emit(&mut out, event).expect("writes to a Vec");
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    #[test]
    fn train_lines_have_the_documented_shape() {
        let epoch = TrainEvent::Epoch { epoch: 1, loss: 0.91, accuracy: 0.73, epoch_seconds: 0.12 };
        assert_eq!(
            line(&epoch),
            "{\"event\":\"epoch\",\"epoch\":1,\"loss\":0.91,\"accuracy\":0.73,\"epoch_seconds\":0.12}\n"
        );
        let last = TrainEvent::Final { loss: 0.1, accuracy: 0.97 };
        assert_eq!(line(&last), "{\"event\":\"final\",\"loss\":0.1,\"accuracy\":0.97}\n");
    }

    #[test]
    fn stream_lines_have_the_documented_shape() {
        let epoch = StreamEvent::Epoch { epoch: 2, bandwidth_gbs: 5.5, seconds: 0.25 };
        assert_eq!(line(&epoch), "{\"event\":\"epoch\",\"epoch\":2,\"bandwidth_gbs\":5.5,\"seconds\":0.25}\n");
    }
}
