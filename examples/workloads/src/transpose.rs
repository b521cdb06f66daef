//! The kernel of `tunefleet-stream`: a blocked, out-of-place transpose of a
//! square `f64` matrix, ping-ponging between two buffers, one transpose per
//! epoch. It moves `2 * n * n * 8` bytes per epoch with almost no arithmetic,
//! so it is bound by memory bandwidth, and the tile size decides how well the
//! strided reads use the caches.
//!
//! The source starts as `a[i][j] = i * n + j` (exact in `f64`), so after any
//! number of epochs every element's value is known and [`verify`] checks all
//! of them.
//!
//! Each transpose starts its worker threads and ends them, so the control
//! channel ([`crate::control`]) can change their number between epochs.

use std::io::{self, Write};
use std::thread;
use std::time::Instant;

use crate::control::{Settings, Steer};
use crate::report::{emit, StreamEvent};

const BYTES_PER_ELEMENT: usize = std::mem::size_of::<f64>();
const MIB: usize = 1 << 20;

/// Parameters of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    /// Both buffers together, in MiB.
    pub size_mib: usize,
    /// Tile edge, in elements.
    pub block_size: usize,
    /// Workers of the first epoch (the control channel may change it).
    pub threads: usize,
    pub epochs: u32,
    /// Transposes per epoch.
    pub passes: u32,
    /// Corrupts one element after the last epoch, to exercise the check.
    pub inject_fault: bool,
}

/// The first element that does not hold its expected value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("element ({row}, {col}) is {found}, expected {expected}")]
pub struct Mismatch {
    pub row: usize,
    pub col: usize,
    pub found: f64,
    pub expected: f64,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("result check failed after {transposes} transposes")]
    Check {
        transposes: u64,
        #[source]
        mismatch: Mismatch,
    },
    #[error("cannot start transpose worker thread")]
    Spawn(#[source] io::Error),
    #[error("cannot write the epoch report")]
    Write(#[source] io::Error),
}

/// Side of the square matrices that fit two to `size_mib` (at least 1).
pub fn side_for(size_mib: usize) -> usize {
    let elements_each = size_mib.saturating_mul(MIB) / (2 * BYTES_PER_ELEMENT);
    (elements_each as f64).sqrt().floor().max(1.0) as usize
}

/// Bytes moved by one transpose of an `n x n` matrix (each element read once
/// and written once).
pub fn bytes_per_transpose(n: usize) -> f64 {
    2.0 * (n * n * BYTES_PER_ELEMENT) as f64
}

/// The starting matrix `a[i][j] = i * n + j`.
pub fn initial(n: usize) -> Vec<f64> {
    (0..n * n).map(|k| k as f64).collect()
}

/// `dst = src^T` for `n x n` matrices, tiled `block x block`; the rows of
/// `dst` are split into contiguous bands, one per thread. Returns the number
/// of bands, the threads that worked (fewer than `threads` when there are
/// not enough rows to share).
pub fn transpose(src: &[f64], dst: &mut [f64], n: usize, block: usize, threads: usize) -> Result<usize, StreamError> {
    debug_assert_eq!(src.len(), n * n);
    debug_assert_eq!(dst.len(), n * n);
    if n == 0 {
        return Ok(0);
    }
    let block = block.clamp(1, n);
    let band_rows = n.div_ceil(threads.max(1));
    let workers = n.div_ceil(band_rows);
    thread::scope(|scope| {
        let mut bands = dst.chunks_mut(band_rows * n).enumerate();
        let first = bands.next();
        for (b, band) in bands {
            thread::Builder::new()
                .name("transpose".into())
                .spawn_scoped(scope, move || transpose_band(src, band, n, b * band_rows, block))
                .map_err(StreamError::Spawn)?;
        }
        if let Some((_, band)) = first {
            transpose_band(src, band, n, 0, block);
        }
        Ok(workers)
    })
}

/// Fills `band`, the rows of `dst` starting at `row0`, tile by tile.
fn transpose_band(src: &[f64], band: &mut [f64], n: usize, row0: usize, block: usize) {
    let rows = band.len() / n;
    for ib in (0..rows).step_by(block) {
        let i_end = (ib + block).min(rows);
        for jb in (0..n).step_by(block) {
            let j_end = (jb + block).min(n);
            for i in ib..i_end {
                let out = &mut band[i * n + jb..i * n + j_end];
                let col = row0 + i;
                for (o, j) in out.iter_mut().zip(jb..j_end) {
                    *o = src[j * n + col];
                }
            }
        }
    }
}

/// Checks that `m` is the starting matrix (`transposed == false`) or its
/// transpose.
pub fn verify(m: &[f64], n: usize, transposed: bool) -> Result<(), Mismatch> {
    for (k, &found) in m.iter().enumerate() {
        let (row, col) = (k / n, k % n);
        let expected = if transposed { col * n + row } else { k } as f64;
        if found != expected {
            return Err(Mismatch { row, col, found, expected });
        }
    }
    Ok(())
}

/// Runs `config.epochs` epochs of `config.passes` transposes, printing one
/// JSON line per epoch and a final line to `out`, then checks every element
/// of the result. After each epoch line but the last, `steer` says what the
/// next epoch runs with.
pub fn run(config: &StreamConfig, out: &mut impl Write, steer: &mut dyn Steer) -> Result<(), StreamError> {
    let n = side_for(config.size_mib);
    let mut src = initial(n);
    // Written (not calloc'ed) so the first epoch does not pay for page faults.
    let mut dst = vec![f64::NAN; n * n];
    let bytes = bytes_per_transpose(n);
    let mut total_seconds = 0.0;
    let mut best = 0.0_f64;
    let mut settings = Settings { threads: config.threads };
    for epoch in 1..=config.epochs {
        let start = Instant::now();
        let mut threads = settings.threads;
        for _ in 0..config.passes {
            threads = transpose(&src, &mut dst, n, config.block_size, settings.threads)?;
            std::mem::swap(&mut src, &mut dst);
        }
        let seconds = start.elapsed().as_secs_f64();
        total_seconds += seconds;
        let bandwidth_gbs = bytes * f64::from(config.passes) / seconds.max(1e-9) / 1e9;
        best = best.max(bandwidth_gbs);
        emit(out, &StreamEvent::Epoch { epoch, bandwidth_gbs, seconds, threads }).map_err(StreamError::Write)?;
        if epoch < config.epochs {
            settings = settings.apply(&steer.between_epochs());
        }
    }
    if config.inject_fault {
        if let Some(x) = src.last_mut() {
            *x += 1.0;
        }
    }
    // After each swap `src` holds the latest result: transposed after an odd
    // number of transposes.
    let transposes = u64::from(config.epochs) * u64::from(config.passes);
    verify(&src, n, transposes % 2 == 1).map_err(|mismatch| StreamError::Check { transposes, mismatch })?;
    let aggregate = bytes * transposes as f64 / total_seconds.max(1e-9) / 1e9;
    let last = StreamEvent::Final { bandwidth_gbs: aggregate, best_bandwidth_gbs: best, seconds: total_seconds };
    emit(out, &last).map_err(StreamError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{Unsteered, Update};
    use crate::report::epoch_threads;

    #[test]
    fn sizes_follow_the_mib_budget() {
        assert_eq!(side_for(64), 2048);
        assert_eq!(side_for(1), 256);
        assert_eq!(side_for(0), 1);
        assert_eq!(bytes_per_transpose(2), 64.0);
    }

    #[test]
    fn transpose_is_right_for_awkward_shapes() {
        // Sides and tiles that do not divide each other, more threads than rows.
        for (n, block, threads) in [(1, 1, 1), (7, 3, 2), (33, 8, 3), (10, 64, 16), (16, 4, 1)] {
            let src = initial(n);
            let mut dst = vec![f64::NAN; n * n];
            let workers = transpose(&src, &mut dst, n, block, threads).expect("transposes");
            assert_eq!(workers, threads.min(n), "n={n} threads={threads}");
            assert_eq!(verify(&dst, n, true), Ok(()), "n={n} block={block} threads={threads}");
            let mut back = vec![f64::NAN; n * n];
            transpose(&dst, &mut back, n, block, threads).expect("transposes");
            assert_eq!(verify(&back, n, false), Ok(()));
        }
    }

    #[test]
    fn verify_finds_the_first_wrong_element() {
        let mut m = initial(4);
        assert_eq!(verify(&m, 4, false), Ok(()));
        assert!(verify(&m, 4, true).is_err());
        m[6] = -1.0;
        let e = verify(&m, 4, false).expect_err("corrupted");
        assert_eq!((e.row, e.col, e.expected), (1, 2, 6.0));
    }

    #[test]
    fn run_reports_epochs_and_fails_on_a_fault() {
        // Odd and even transpose counts end in different buffers and layouts.
        for passes in [1, 2] {
            let config =
                StreamConfig { size_mib: 1, block_size: 32, threads: 2, epochs: 3, passes, inject_fault: false };
            let mut out = Vec::new();
            run(&config, &mut out, &mut Unsteered).expect("correct result");
            let text = String::from_utf8(out).expect("UTF-8");
            assert_eq!(text.lines().count(), 4);
            assert!(text.lines().last().is_some_and(|l| l.starts_with("{\"event\":\"final\"")), "{text}");
            let faulty = StreamConfig { inject_fault: true, ..config };
            let e = run(&faulty, &mut Vec::new(), &mut Unsteered).expect_err("corrupted result");
            assert!(matches!(e, StreamError::Check { transposes, .. } if transposes == 3 * u64::from(passes)), "{e}");
        }
    }

    #[test]
    fn each_epoch_runs_with_the_threads_the_steer_gave_after_the_previous_one() {
        let mut asked = vec![Some(2), Some(3)].into_iter();
        let mut steer = || Update { threads: asked.next().flatten() };
        let config =
            StreamConfig { size_mib: 1, block_size: 16, threads: 1, epochs: 4, passes: 3, inject_fault: false };
        let mut out = Vec::new();
        run(&config, &mut out, &mut steer).expect("correct result");
        assert_eq!(epoch_threads(&out), [1, 2, 3, 3]);
    }
}
