//! The training loop of `tunefleet-train`: mini-batch SGD with momentum on
//! the digits, each mini-batch's gradient computed by `threads` scoped
//! workers, validation loss and accuracy reported after every epoch. The
//! workers are started for each epoch, so the control channel
//! ([`crate::control`]) can change their number between epochs.
//!
//! Everything random (the train/validation split, the initial weights, the
//! order of each pass) comes from one ChaCha8 stream seeded by `seed`, so a
//! run is reproducible for a given seed and thread count (the thread count
//! changes the order in which per-sample gradients are summed).

use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, Scope};
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::control::{Settings, Steer};
use crate::digits::Dataset;
use crate::mlp::{param_count, Evaluation, Mlp, Workspace};
use crate::report::{emit, TrainEvent};

/// Hyper-parameters and system parameters of one training run.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    pub lr: f32,
    pub momentum: f32,
    pub batch_size: usize,
    pub hidden: usize,
    pub epochs: u32,
    /// Passes over the training split per epoch (1 is a classic epoch).
    pub passes: u32,
    /// Gradient workers of the first epoch (the control channel may change it).
    pub threads: usize,
    pub seed: u64,
    /// Share of the samples held out for validation.
    pub validation_fraction: f64,
    /// Print a step line after every mini-batch (`TUNEFLEET_STEPS=1`: the
    /// agent's probe windows count steps).
    pub report_steps: bool,
    /// Save the state after every epoch here and name the file on the epoch line.
    pub checkpoint_dir: Option<std::path::PathBuf>,
    /// Go on from this state (the run's other flags must be those it was saved with).
    pub resume: Option<crate::checkpoint::Checkpoint>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            lr: 0.05,
            momentum: 0.9,
            batch_size: 32,
            hidden: 1024,
            epochs: 10,
            passes: 4,
            threads: 1,
            seed: 0,
            validation_fraction: 0.2,
            report_steps: false,
            checkpoint_dir: None,
            resume: None,
        }
    }
}

/// Why a run stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("training diverged in epoch {epoch}: the weights or the loss are no longer finite (lower --lr)")]
    Diverged { epoch: u32 },
    #[error("cannot start gradient worker thread")]
    Spawn(#[source] io::Error),
    #[error("a gradient worker thread stopped unexpectedly")]
    WorkerLost,
    #[error("cannot write the epoch report")]
    Write(#[source] io::Error),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
}

/// Trains on `data` as `config` says, printing one JSON line per epoch and a
/// final line to `out`; returns the final validation loss and accuracy.
///
/// After each epoch line but the last, `steer` says what the next epoch runs
/// with. Each epoch starts `threads - 1` helper threads and ends them; the
/// calling thread is the first worker.
pub fn run(
    config: &TrainConfig,
    data: &Dataset,
    out: &mut impl Write,
    steer: &mut dyn Steer,
) -> Result<Evaluation, TrainError> {
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let (train, validation) = data.split(config.validation_fraction, &mut rng);
    let mut model = Mlp::new(config.hidden, &mut rng);
    let mut velocity = vec![0.0; param_count(config.hidden)];
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut first = 1;
    if let Some(c) = &config.resume {
        let resumed = Mlp::from_params(config.hidden, c.params.clone())
            .filter(|_| c.velocity.len() == velocity.len() && c.order.len() == order.len())
            .ok_or(TrainError::Checkpoint("it was saved with other --hidden or data".into()))?;
        model = resumed;
        velocity.clone_from(&c.velocity);
        order = c.order.iter().map(|&i| i as usize).collect();
        rng.set_word_pos(c.rng_word_pos);
        first = c.epoch + 1;
    }
    let model = RwLock::new(model);
    let mut settings = Settings { threads: config.threads };
    let mut last = read(&model).evaluate(&validation);
    let mut step: u64 = 0;
    for epoch in first..=config.epochs {
        let start = Instant::now();
        thread::scope(|scope| {
            let mut pool = GradientPool::start(scope, &model, &train, settings.threads, config.hidden)?;
            for _ in 0..config.passes {
                order.shuffle(&mut rng);
                for batch in order.chunks(config.batch_size.max(1)) {
                    let grad = pool.gradient(batch)?;
                    write(&model).step(grad, batch.len(), &mut velocity, config.lr, config.momentum);
                    step += 1;
                    if config.report_steps {
                        emit(out, &TrainEvent::Step { step }).map_err(TrainError::Write)?;
                    }
                }
            }
            // Dropping the pool ends the helpers; the scope then joins them.
            Ok::<(), TrainError>(())
        })?;
        let trained = read(&model);
        last = trained.evaluate(&validation);
        let epoch_seconds = start.elapsed().as_secs_f64();
        if !trained.is_finite() || !last.loss.is_finite() {
            return Err(TrainError::Diverged { epoch });
        }
        let checkpoint = match &config.checkpoint_dir {
            Some(dir) => {
                let c = crate::checkpoint::Checkpoint {
                    epoch,
                    rng_word_pos: rng.get_word_pos(),
                    order: order.iter().map(|&i| i as u32).collect(),
                    params: trained.params().to_vec(),
                    velocity: velocity.clone(),
                };
                let path = c.save(dir).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
                Some(path.display().to_string())
            }
            None => None,
        };
        drop(trained);
        let line = TrainEvent::Epoch {
            epoch,
            loss: last.loss,
            accuracy: last.accuracy,
            epoch_seconds,
            threads: settings.threads,
            checkpoint,
        };
        emit(out, &line).map_err(TrainError::Write)?;
        if epoch < config.epochs {
            settings = settings.apply(&steer.between_epochs());
        }
    }
    emit(out, &TrainEvent::Final { loss: last.loss, accuracy: last.accuracy }).map_err(TrainError::Write)?;
    Ok(last)
}

/// The model is only written between mini-batches, when no helper holds it,
/// and a reader that panicked does not poison an `RwLock`; a poisoned lock
/// can only come from a panic of the writer, which ends the run anyway.
fn read(model: &RwLock<Mlp>) -> RwLockReadGuard<'_, Mlp> {
    model.read().unwrap_or_else(PoisonError::into_inner)
}

fn write(model: &RwLock<Mlp>) -> RwLockWriteGuard<'_, Mlp> {
    model.write().unwrap_or_else(PoisonError::into_inner)
}

/// A share of a mini-batch and the buffers to compute its gradient in; it
/// travels to a helper and back.
struct Task {
    indices: Vec<usize>,
    ws: Workspace,
}

/// A helper thread: where to send it work, where its results come back.
struct Helper {
    jobs: Sender<Task>,
    results: Receiver<Task>,
    idle: Option<Task>,
}

/// Computes mini-batch gradients with the calling thread and `threads - 1`
/// scoped helper threads that read the shared model.
struct GradientPool<'env> {
    model: &'env RwLock<Mlp>,
    data: &'env Dataset,
    own: Workspace,
    helpers: Vec<Helper>,
}

impl<'env> GradientPool<'env> {
    fn start<'scope>(
        scope: &'scope Scope<'scope, 'env>,
        model: &'env RwLock<Mlp>,
        data: &'env Dataset,
        threads: usize,
        hidden: usize,
    ) -> Result<Self, TrainError> {
        let mut helpers = Vec::with_capacity(threads.saturating_sub(1));
        for _ in 1..threads.max(1) {
            let (jobs, job_rx) = mpsc::channel::<Task>();
            let (result_tx, results) = mpsc::channel::<Task>();
            thread::Builder::new()
                .name("gradient".into())
                .spawn_scoped(scope, move || {
                    for mut task in job_rx {
                        accumulate(&read(model), data, &task.indices, &mut task.ws);
                        if result_tx.send(task).is_err() {
                            break;
                        }
                    }
                })
                .map_err(TrainError::Spawn)?;
            let idle = Some(Task { indices: Vec::new(), ws: Workspace::new(hidden) });
            helpers.push(Helper { jobs, results, idle });
        }
        Ok(GradientPool { model, data, own: Workspace::new(hidden), helpers })
    }

    /// The summed gradient of `batch` (indices into the data): equal shares go
    /// to the calling thread (the first) and the helpers, and the sums are
    /// reduced in worker order, so the result depends only on the batch and
    /// the thread count.
    fn gradient(&mut self, batch: &[usize]) -> Result<&[f32], TrainError> {
        let share = batch.len().div_ceil(self.helpers.len() + 1).max(1);
        let mut shares = batch.chunks(share);
        let own_share = shares.next().unwrap_or_default();
        let mut busy = 0;
        for (helper, indices) in self.helpers.iter_mut().zip(shares) {
            let Some(mut task) = helper.idle.take() else { return Err(TrainError::WorkerLost) };
            task.indices.clear();
            task.indices.extend_from_slice(indices);
            helper.jobs.send(task).map_err(|_| TrainError::WorkerLost)?;
            busy += 1;
        }
        accumulate(&read(self.model), self.data, own_share, &mut self.own);
        for helper in self.helpers.iter_mut().take(busy) {
            let task = helper.results.recv().map_err(|_| TrainError::WorkerLost)?;
            self.own.grad.iter_mut().zip(&task.ws.grad).for_each(|(g, w)| *g += w);
            self.own.loss_sum += task.ws.loss_sum;
            helper.idle = Some(task);
        }
        Ok(&self.own.grad)
    }
}

/// Zeroes `ws`, then adds the gradients and losses of the samples `indices`.
fn accumulate(model: &Mlp, data: &Dataset, indices: &[usize], ws: &mut Workspace) {
    ws.clear();
    for &i in indices {
        model.accumulate(data.features(i), data.label(i), ws);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{Unsteered, Update};
    use crate::digits::load_bundled;
    use crate::report::epoch_threads;

    fn config() -> TrainConfig {
        TrainConfig { hidden: 32, epochs: 3, ..TrainConfig::default() }
    }

    #[test]
    fn parallel_gradient_equals_the_serial_one() {
        let data = load_bundled().expect("bundled data");
        let model = RwLock::new(Mlp::new(16, &mut ChaCha8Rng::seed_from_u64(3)));
        let batch: Vec<usize> = (0..37).collect();
        let gradient = |threads| {
            thread::scope(|scope| {
                let mut pool = GradientPool::start(scope, &model, &data, threads, 16).expect("threads start");
                // Twice, so the second batch reuses the tasks the helpers returned.
                pool.gradient(&batch[..5]).expect("gradient");
                pool.gradient(&batch).expect("gradient").to_vec()
            })
        };
        let serial = gradient(1);
        assert!(serial.iter().any(|&g| g != 0.0));
        // More workers than samples leaves some idle; the sum is unchanged.
        for threads in [2, 3, 64] {
            let parallel = gradient(threads);
            let worst = serial.iter().zip(&parallel).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-4, "{threads} threads differ by {worst}");
        }
    }

    #[test]
    fn learns_and_reports_each_epoch() {
        let data = load_bundled().expect("bundled data");
        let mut out = Vec::new();
        let result = run(&config(), &data, &mut out, &mut Unsteered).expect("trains");
        let text = String::from_utf8(out).expect("UTF-8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("{\"event\":\"epoch\",\"epoch\":1,"), "{}", lines[0]);
        assert!(lines[3].starts_with("{\"event\":\"final\""), "{}", lines[3]);
        assert!(result.accuracy > 0.85, "{result:?}");
    }

    #[test]
    fn each_epoch_runs_with_the_threads_the_steer_gave_after_the_previous_one() {
        let data = load_bundled().expect("bundled data");
        let mut asked = vec![Some(3), None, Some(2)].into_iter();
        let mut calls = 0;
        let mut steer = || {
            calls += 1;
            Update { threads: asked.next().flatten() }
        };
        let mut out = Vec::new();
        let config = TrainConfig { epochs: 4, passes: 1, threads: 1, ..config() };
        let result = run(&config, &data, &mut out, &mut steer).expect("trains");
        assert_eq!(calls, 3, "asked after every epoch but the last");
        assert_eq!(epoch_threads(&out), [1, 3, 3, 2]);
        assert!(result.loss.is_finite() && result.accuracy > 0.5, "{result:?}");
    }

    #[test]
    fn step_lines_count_every_mini_batch_when_asked_and_never_otherwise() {
        let data = load_bundled().expect("bundled data");
        let lines = |report_steps| {
            let mut out = Vec::new();
            let config = TrainConfig { epochs: 2, passes: 2, batch_size: 64, report_steps, ..config() };
            run(&config, &data, &mut out, &mut Unsteered).expect("trains");
            let text = String::from_utf8(out).expect("utf-8");
            text.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).collect::<Vec<_>>()
        };
        let with = lines(true);
        let steps: Vec<u64> = with.iter().filter(|l| l["event"] == "step").filter_map(|l| l["step"].as_u64()).collect();
        // 80 % of the 1797 samples train: 1438, in batches of 64 = 23 per pass.
        let per_epoch = 2 * 1438usize.div_ceil(64) as u64;
        assert_eq!(steps, (1..=2 * per_epoch).collect::<Vec<_>>(), "numbered over the run");
        let epoch_at = with.iter().position(|l| l["event"] == "epoch").expect("an epoch line");
        assert_eq!(epoch_at as u64, per_epoch, "the first epoch line follows its steps");
        assert!(lines(false).iter().all(|l| l["event"] != "step"));
    }

    #[test]
    fn a_run_resumed_from_a_checkpoint_ends_where_the_whole_run_ends() {
        let data = load_bundled().expect("bundled data");
        let dir = tempfile::tempdir().expect("tempdir");
        let whole =
            run(&TrainConfig { epochs: 4, ..config() }, &data, &mut Vec::new(), &mut Unsteered).expect("trains");
        let mut out = Vec::new();
        let saving = TrainConfig { epochs: 2, checkpoint_dir: Some(dir.path().to_path_buf()), ..config() };
        run(&saving, &data, &mut out, &mut Unsteered).expect("trains");
        let text = String::from_utf8(out).expect("utf-8");
        let last: serde_json::Value =
            serde_json::from_str(text.lines().rfind(|l| l.contains("\"epoch\"")).expect("epoch 2")).expect("json");
        let path = last["checkpoint"].as_str().expect("the epoch line names its checkpoint");
        let c = crate::checkpoint::Checkpoint::load(std::path::Path::new(path)).expect("loads");
        assert_eq!(c.epoch, 2);
        let mut out = Vec::new();
        let resumed = TrainConfig { epochs: 4, resume: Some(c), ..config() };
        let end = run(&resumed, &data, &mut out, &mut Unsteered).expect("trains");
        let epochs: Vec<u64> = String::from_utf8(out)
            .expect("utf-8")
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|l| l["epoch"].as_u64())
            .collect();
        assert_eq!(epochs, [3, 4], "goes on after the saved epoch");
        assert_eq!(end, whole, "the same model as a run that never stopped");
    }

    #[test]
    fn same_seed_same_result_other_seed_other_result() {
        let data = load_bundled().expect("bundled data");
        let go = |seed| {
            run(&TrainConfig { seed, epochs: 1, ..config() }, &data, &mut Vec::new(), &mut Unsteered).expect("trains")
        };
        assert_eq!(go(5), go(5));
        assert_ne!(go(5), go(6));
    }

    #[test]
    fn a_huge_learning_rate_is_reported_as_divergence() {
        let data = load_bundled().expect("bundled data");
        let wild = TrainConfig { lr: f32::MAX, momentum: 0.99, ..config() };
        let e = run(&wild, &data, &mut Vec::new(), &mut Unsteered).expect_err("diverges");
        assert!(matches!(e, TrainError::Diverged { .. }), "{e}");
    }
}
