//! The workload's output, read line by line by two tasks on the agent's
//! event loop (no thread per stream) with bounded memory ([`crate::output`]): metric lines ([`crate::metrics`])
//! become epochs (forwarded as progress while the trial runs), the exec
//! wrapper's failure marker says why the workload did not start, and the
//! rest feeds the log tail.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tunefleet_common::measurement::{EpochMetrics, Metrics, WindowProfile};

use crate::exec::EXEC_FAILED_MARKER;
use crate::metrics::{parse_metric_line, MetricLine};
use crate::output::{LineReader, LogTail, MAX_LINE_BYTES};

/// Epochs kept in one measurement (the message must stay far below 1 MiB).
pub const MAX_EPOCHS: usize = 2000;

/// A line of output, classified by its reader.
#[derive(Debug)]
pub(super) enum OutputEvent {
    Epoch { epoch: u32, metrics: Metrics, checkpoint: Option<String>, elapsed_us: u64 },
    Step { elapsed_us: u64 },
    Final(Metrics),
    Log { text: String, truncated: bool },
    ExecFailed(String),
}

/// `d` in microseconds, the unit of a measurement's times (saturating).
pub(super) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

async fn read_stream(pipe: impl AsyncRead + Unpin, is_stderr: bool, start: Instant, tx: mpsc::Sender<OutputEvent>) {
    let mut reader = LineReader::new(BufReader::new(pipe), MAX_LINE_BYTES);
    while let Ok(Some(line)) = reader.next_line().await {
        let event = match (is_stderr, line.text.strip_prefix(EXEC_FAILED_MARKER)) {
            (true, Some(reason)) => OutputEvent::ExecFailed(reason.to_string()),
            _ => match parse_metric_line(&line.text) {
                MetricLine::Epoch { epoch, metrics, checkpoint } => {
                    OutputEvent::Epoch { epoch, metrics, checkpoint, elapsed_us: micros(start.elapsed()) }
                }
                MetricLine::Step { .. } => OutputEvent::Step { elapsed_us: micros(start.elapsed()) },
                MetricLine::Final { metrics } => OutputEvent::Final(metrics),
                MetricLine::Log => OutputEvent::Log { text: line.text, truncated: line.truncated },
            },
        };
        if tx.send(event).await.is_err() {
            break;
        }
    }
}

/// Reads `pipe` (the workload's stdout, or its stderr) on a task of the
/// event loop until it closes or the task is aborted (a pipe an escaped
/// process keeps open: [`super::ended`] aborts it).
pub(super) fn spawn_reader(
    pipe: Option<impl AsyncRead + Unpin + Send + 'static>,
    is_stderr: bool,
    start: Instant,
    tx: &mpsc::Sender<OutputEvent>,
) -> Option<JoinHandle<()>> {
    let tx = tx.clone();
    pipe.map(|pipe| tokio::spawn(read_stream(pipe, is_stderr, start, tx)))
}

/// What the workload's output added up to.
#[derive(Debug, Default)]
pub(super) struct Collected {
    pub(super) epochs: Vec<EpochMetrics>,
    pub(super) epochs_dropped: u64,
    pub(super) final_metrics: Option<Metrics>,
    pub(super) tail: LogTail,
    pub(super) exec_failed: Option<String>,
}

/// One finished epoch, as the trial reports it while it runs; the first
/// after a pipelined trial's first window closed carries its profile.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochReport {
    pub metrics: EpochMetrics,
    pub profile: Option<WindowProfile>,
}

impl Collected {
    pub(super) fn take(
        &mut self,
        event: OutputEvent,
        progress: Option<&mpsc::Sender<EpochReport>>,
        profile: Option<WindowProfile>,
    ) {
        match event {
            OutputEvent::Epoch { epoch, metrics, checkpoint, elapsed_us } => {
                let e = EpochMetrics { epoch, elapsed_us, metrics, checkpoint };
                if let Some(tx) = progress {
                    // Progress is advisory: dropped when the agent lags.
                    let _ = tx.try_send(EpochReport { metrics: e.clone(), profile });
                }
                if self.epochs.len() < MAX_EPOCHS {
                    self.epochs.push(e);
                } else {
                    self.epochs_dropped += 1;
                }
            }
            OutputEvent::Step { .. } => {}
            OutputEvent::Final(m) => self.final_metrics = Some(m),
            OutputEvent::Log { text, truncated } => self.tail.push(&text, truncated),
            OutputEvent::ExecFailed(reason) => self.exec_failed = Some(reason),
        }
    }
}
