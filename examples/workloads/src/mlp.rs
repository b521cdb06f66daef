//! A one-hidden-layer perceptron (`FEATURES -> hidden (ReLU) -> CLASSES`,
//! softmax, cross-entropy) in plain `f32` arithmetic, with SGD and momentum.
//!
//! All parameters live in one flat vector, laid out as
//! `w1 [FEATURES x hidden] | b1 [hidden] | w2 [hidden x CLASSES] | b2 [CLASSES]`,
//! so gradients and velocities share the layout and an update is one loop.
//! `w1` is input-major: the forward pass adds `x[i] * w1[i, ..]` for each
//! non-zero pixel, a contiguous loop the compiler vectorises.

use rand::Rng;

use crate::digits::{Dataset, CLASSES, FEATURES};

/// Network weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    hidden: usize,
    params: Vec<f32>,
}

/// Views of one flat parameter (or gradient) vector.
struct Layers<'a> {
    w1: &'a [f32],
    b1: &'a [f32],
    w2: &'a [f32],
    b2: &'a [f32],
}

/// Mutable views of one flat gradient vector.
struct LayersMut<'a> {
    w1: &'a mut [f32],
    b1: &'a mut [f32],
    w2: &'a mut [f32],
    b2: &'a mut [f32],
}

/// Number of parameters for a hidden width.
pub fn param_count(hidden: usize) -> usize {
    FEATURES * hidden + hidden + hidden * CLASSES + CLASSES
}

fn layers(params: &[f32], hidden: usize) -> Layers<'_> {
    let (w1, rest) = params.split_at(FEATURES * hidden);
    let (b1, rest) = rest.split_at(hidden);
    let (w2, b2) = rest.split_at(hidden * CLASSES);
    Layers { w1, b1, w2, b2 }
}

fn layers_mut(params: &mut [f32], hidden: usize) -> LayersMut<'_> {
    let (w1, rest) = params.split_at_mut(FEATURES * hidden);
    let (b1, rest) = rest.split_at_mut(hidden);
    let (w2, b2) = rest.split_at_mut(hidden * CLASSES);
    LayersMut { w1, b1, w2, b2 }
}

/// Per-worker buffers: the gradient being summed and the activations.
#[derive(Debug, Clone)]
pub struct Workspace {
    hidden: usize,
    /// Sum of the per-sample gradients since the last [`Workspace::clear`].
    pub grad: Vec<f32>,
    /// Sum of the per-sample losses since the last clear.
    pub loss_sum: f64,
    activations: Vec<f32>,
    delta: Vec<f32>,
}

impl Workspace {
    pub fn new(hidden: usize) -> Self {
        Workspace {
            hidden,
            grad: vec![0.0; param_count(hidden)],
            loss_sum: 0.0,
            activations: vec![0.0; hidden],
            delta: vec![0.0; hidden],
        }
    }

    /// Zeroes the gradient and loss sums.
    pub fn clear(&mut self) {
        self.grad.fill(0.0);
        self.loss_sum = 0.0;
    }
}

/// Numerically stable softmax of `z` in place; returns the log of the
/// normaliser relative to the maximum, so `loss = lse - (z[y] - max)`.
fn softmax_in_place(z: &mut [f32; CLASSES]) -> (f32, f32) {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in z.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in z.iter_mut() {
        *v /= sum;
    }
    (max, sum.ln())
}

impl Mlp {
    /// He-uniform weights for the ReLU layer, Glorot-uniform for the output
    /// layer, zero biases.
    pub fn new(hidden: usize, rng: &mut impl Rng) -> Self {
        let mut params = vec![0.0; param_count(hidden)];
        let l = layers_mut(&mut params, hidden);
        let a1 = (6.0 / FEATURES as f32).sqrt();
        l.w1.iter_mut().for_each(|w| *w = rng.random_range(-a1..a1));
        let a2 = (6.0 / (hidden + CLASSES) as f32).sqrt();
        l.w2.iter_mut().for_each(|w| *w = rng.random_range(-a2..a2));
        Mlp { hidden, params }
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// Every weight and bias, flat (what a checkpoint keeps).
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// A model from the flat parameters of [`Mlp::params`]; `None` when
    /// their number does not fit `hidden`.
    pub fn from_params(hidden: usize, params: Vec<f32>) -> Option<Self> {
        (params.len() == param_count(hidden)).then_some(Mlp { hidden, params })
    }

    /// Hidden activations (after ReLU) and output logits for `x`.
    fn forward(&self, x: &[f32], activations: &mut [f32]) -> [f32; CLASSES] {
        let h = self.hidden;
        let l = layers(&self.params, h);
        activations.copy_from_slice(l.b1);
        for (i, &xi) in x.iter().enumerate() {
            if xi != 0.0 {
                let row = &l.w1[i * h..(i + 1) * h];
                activations.iter_mut().zip(row).for_each(|(a, w)| *a += xi * w);
            }
        }
        activations.iter_mut().for_each(|a| *a = a.max(0.0));
        let mut z = [0.0; CLASSES];
        z.copy_from_slice(l.b2);
        for (j, &aj) in activations.iter().enumerate() {
            if aj > 0.0 {
                let row = &l.w2[j * CLASSES..(j + 1) * CLASSES];
                z.iter_mut().zip(row).for_each(|(zk, w)| *zk += aj * w);
            }
        }
        z
    }

    /// Adds the gradient of the loss on `(x, label)` to `ws.grad` and the loss
    /// to `ws.loss_sum`.
    pub fn accumulate(&self, x: &[f32], label: usize, ws: &mut Workspace) {
        debug_assert_eq!(ws.hidden, self.hidden);
        let h = self.hidden;
        let mut z = self.forward(x, &mut ws.activations);
        let target = z[label];
        let (max, log_sum) = softmax_in_place(&mut z);
        ws.loss_sum += f64::from(log_sum - (target - max));
        // z now holds the probabilities; dL/dz = p - onehot(label).
        z[label] -= 1.0;
        let dz = z;

        let w2 = layers(&self.params, h).w2;
        let g = layers_mut(&mut ws.grad, h);
        g.b2.iter_mut().zip(&dz).for_each(|(g, d)| *g += d);
        for (j, (&aj, dj)) in ws.activations.iter().zip(ws.delta.iter_mut()).enumerate() {
            if aj > 0.0 {
                let row = &w2[j * CLASSES..(j + 1) * CLASSES];
                let grow = &mut g.w2[j * CLASSES..(j + 1) * CLASSES];
                grow.iter_mut().zip(&dz).for_each(|(g, d)| *g += aj * d);
                *dj = row.iter().zip(&dz).map(|(w, d)| w * d).sum();
            } else {
                *dj = 0.0;
            }
        }
        g.b1.iter_mut().zip(&ws.delta).for_each(|(g, d)| *g += d);
        for (i, &xi) in x.iter().enumerate() {
            if xi != 0.0 {
                let grow = &mut g.w1[i * h..(i + 1) * h];
                grow.iter_mut().zip(&ws.delta).for_each(|(g, d)| *g += xi * d);
            }
        }
    }

    /// The predicted class and the cross-entropy loss for `(x, label)`.
    pub fn predict(&self, x: &[f32], label: usize, activations: &mut [f32]) -> (usize, f64) {
        let mut z = self.forward(x, activations);
        let target = z[label];
        let class =
            z.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (k, &v)| if v > best.1 { (k, v) } else { best }).0;
        let (max, log_sum) = softmax_in_place(&mut z);
        (class, f64::from(log_sum - (target - max)))
    }

    /// Mean loss and accuracy over `data`.
    pub fn evaluate(&self, data: &Dataset) -> Evaluation {
        let mut activations = vec![0.0; self.hidden];
        let mut loss = 0.0;
        let mut correct = 0usize;
        for i in 0..data.len() {
            let (class, l) = self.predict(data.features(i), data.label(i), &mut activations);
            loss += l;
            correct += usize::from(class == data.label(i));
        }
        let n = data.len().max(1) as f64;
        Evaluation { loss: loss / n, accuracy: correct as f64 / n }
    }

    /// One SGD-with-momentum step: `v = momentum * v - lr * grad_sum / n;
    /// w += v`, where `grad_sum` is the sum of `n` per-sample gradients.
    pub fn step(&mut self, grad_sum: &[f32], n: usize, velocity: &mut [f32], lr: f32, momentum: f32) {
        let scale = lr / n.max(1) as f32;
        for ((w, v), g) in self.params.iter_mut().zip(velocity.iter_mut()).zip(grad_sum) {
            *v = momentum * *v - scale * g;
            *w += *v;
        }
    }

    /// True when every weight is finite.
    pub fn is_finite(&self) -> bool {
        self.params.iter().all(|w| w.is_finite())
    }
}

/// Loss and accuracy on a data set.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digits::parse_csv;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn model(hidden: usize) -> Mlp {
        Mlp::new(hidden, &mut ChaCha8Rng::seed_from_u64(1))
    }

    fn sample() -> Vec<f32> {
        (0..FEATURES).map(|i| if i % 3 == 0 { 0.0 } else { (i % 17) as f32 / 16.0 }).collect()
    }

    fn loss_at(m: &Mlp, x: &[f32], label: usize) -> f64 {
        m.predict(x, label, &mut vec![0.0; m.hidden]).1
    }

    #[test]
    fn gradient_matches_finite_differences() {
        let m = model(8);
        let x = sample();
        let mut ws = Workspace::new(8);
        m.accumulate(&x, 4, &mut ws);
        assert!((ws.loss_sum - loss_at(&m, &x, 4)).abs() < 1e-6);
        // Check a weight in each block of the layout.
        let w1 = 5 * 8 + 3;
        let b1 = FEATURES * 8 + 2;
        let w2 = FEATURES * 8 + 8 + 7 * CLASSES + 4;
        let b2 = param_count(8) - 1;
        let eps = 1e-2;
        for idx in [w1, b1, w2, b2] {
            let mut plus = m.clone();
            plus.params[idx] += eps;
            let mut minus = m.clone();
            minus.params[idx] -= eps;
            let numeric = (loss_at(&plus, &x, 4) - loss_at(&minus, &x, 4)) / (2.0 * f64::from(eps));
            let analytic = f64::from(ws.grad[idx]);
            assert!((numeric - analytic).abs() < 2e-3, "param {idx}: numeric {numeric}, analytic {analytic}");
        }
    }

    #[test]
    fn loss_of_uniform_logits_is_ln_classes() {
        let mut m = model(4);
        m.params.fill(0.0);
        let loss = loss_at(&m, &sample(), 0);
        assert!((loss - (CLASSES as f64).ln()).abs() < 1e-6, "{loss}");
    }

    #[test]
    fn steps_reduce_the_loss_on_a_sample() {
        let mut m = model(16);
        let x = sample();
        let before = loss_at(&m, &x, 2);
        let mut velocity = vec![0.0; param_count(16)];
        let mut ws = Workspace::new(16);
        for _ in 0..20 {
            ws.clear();
            m.accumulate(&x, 2, &mut ws);
            m.step(&ws.grad, 1, &mut velocity, 0.1, 0.5);
        }
        let after = loss_at(&m, &x, 2);
        assert!(after < before / 4.0, "before {before}, after {after}");
        assert!(m.is_finite());
    }

    #[test]
    fn evaluate_counts_correct_predictions() {
        let row = |label: usize| {
            let mut f = vec!["0".to_string(); FEATURES];
            f.push(label.to_string());
            f.join(",")
        };
        let data = parse_csv(&format!("{}\n{}\n", row(0), row(1))).expect("rows");
        let mut m = model(4);
        m.params.fill(0.0);
        // Blank images and a bias towards class 0: one of the two is right.
        layers_mut(&mut m.params, 4).b2[0] = 1.0;
        let e = m.evaluate(&data);
        assert_eq!(e.accuracy, 0.5);
        assert!(e.loss > 0.0);
    }
}
