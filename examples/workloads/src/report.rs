//! The JSON lines the workloads print on stdout, one object per line, flushed
//! as soon as written so the agent sees each epoch when it ends.

use std::io::{self, Write};

use serde::Serialize;

use crate::checksum::Checksum;

/// A line of `tunefleet-train`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TrainEvent {
    /// Validation loss and accuracy after an epoch, its wall time, and the
    /// gradient workers it ran with.
    Epoch {
        epoch: u32,
        loss: f64,
        accuracy: f64,
        epoch_seconds: f64,
        threads: usize,
        /// Where the state after this epoch was saved (`--checkpoint-dir`).
        #[serde(skip_serializing_if = "Option::is_none")]
        checkpoint: Option<String>,
    },
    /// A mini-batch done (only with `TUNEFLEET_STEPS=1`), counted over the run.
    Step { step: u64 },
    /// Validation loss and accuracy of the final model.
    Final { loss: f64, accuracy: f64 },
}

/// A line of `tunefleet-stream`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum StreamEvent {
    /// Bytes read plus bytes written per second (GB/s, 10^9) in one epoch,
    /// and the transpose workers it ran with.
    Epoch { epoch: u32, bandwidth_gbs: f64, seconds: f64, threads: usize },
    /// Over all epochs: aggregate and best bandwidth, total kernel time.
    Final { bandwidth_gbs: f64, best_bandwidth_gbs: f64, seconds: f64 },
}

/// A line of `tunefleet-io`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum IoEvent {
    /// Bytes written plus bytes read back per second (MiB/s, 2^20) in one
    /// epoch, the checksum of what was read, and the file workers it ran with.
    Epoch {
        epoch: u32,
        throughput_mibs: f64,
        checksum: Checksum,
        seconds: f64,
        threads: usize,
        /// Where the state after this epoch was saved (`--checkpoint-dir`).
        #[serde(skip_serializing_if = "Option::is_none")]
        checkpoint: Option<String>,
    },
    /// A file written, synced, read back and checked (only with
    /// `TUNEFLEET_STEPS=1`), counted over the run.
    Step { step: u64 },
    /// Over all epochs: aggregate and best throughput, the checksum of the
    /// whole run, total time.
    Final { throughput_mibs: f64, best_throughput_mibs: f64, checksum: Checksum, seconds: f64 },
}

/// Writes `event` as one JSON line and flushes.
pub fn emit(out: &mut impl Write, event: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, event).map_err(io::Error::other)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// The `threads` of every epoch line in `out`, in order (for the workloads' tests).
#[cfg(test)]
pub(crate) fn epoch_threads(out: &[u8]) -> Vec<u64> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|line| line["event"] == "epoch")
        .filter_map(|line| line["threads"].as_u64())
        .collect()
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
        let epoch = TrainEvent::Epoch {
            epoch: 1,
            loss: 0.91,
            accuracy: 0.73,
            epoch_seconds: 0.12,
            threads: 2,
            checkpoint: None,
        };
        assert_eq!(
            line(&epoch),
            "{\"event\":\"epoch\",\"epoch\":1,\"loss\":0.91,\"accuracy\":0.73,\"epoch_seconds\":0.12,\"threads\":2}\n"
        );
        let last = TrainEvent::Final { loss: 0.1, accuracy: 0.97 };
        assert_eq!(line(&last), "{\"event\":\"final\",\"loss\":0.1,\"accuracy\":0.97}\n");
    }

    #[test]
    fn stream_lines_have_the_documented_shape() {
        let epoch = StreamEvent::Epoch { epoch: 2, bandwidth_gbs: 5.5, seconds: 0.25, threads: 3 };
        assert_eq!(
            line(&epoch),
            "{\"event\":\"epoch\",\"epoch\":2,\"bandwidth_gbs\":5.5,\"seconds\":0.25,\"threads\":3}\n"
        );
    }

    #[test]
    fn io_lines_have_the_documented_shape() {
        let epoch = IoEvent::Epoch {
            epoch: 1,
            throughput_mibs: 80.5,
            checksum: Checksum(0xab),
            seconds: 0.1,
            threads: 2,
            checkpoint: Some("/c/epoch-1.ckpt".into()),
        };
        assert_eq!(
            line(&epoch),
            "{\"event\":\"epoch\",\"epoch\":1,\"throughput_mibs\":80.5,\"checksum\":\"00000000000000ab\",\
             \"seconds\":0.1,\"threads\":2,\"checkpoint\":\"/c/epoch-1.ckpt\"}\n"
        );
        assert_eq!(line(&IoEvent::Step { step: 7 }), "{\"event\":\"step\",\"step\":7}\n");
    }
}
