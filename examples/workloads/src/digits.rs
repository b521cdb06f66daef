//! The UCI handwritten digits (8x8 images, 1797 samples), bundled in the
//! binary, and a deterministic train/validation split.
//!
//! The data is scikit-learn's `digits.csv.gz` (see `data/README.md` for its
//! origin and licence): one row per image, 64 pixel counts in 0..=16 and the
//! label 0..=9.

use std::io::Read;

use flate2::read::GzDecoder;
use rand::seq::SliceRandom;
use rand::Rng;

/// Pixels per image (8x8).
pub const FEATURES: usize = 64;
/// Digit classes.
pub const CLASSES: usize = 10;
/// The largest pixel count; features are scaled by it into `0.0..=1.0`.
const MAX_PIXEL: f32 = 16.0;

/// The gzip-compressed CSV, embedded so the binary needs no data file.
static BUNDLED_GZ: &[u8] = include_bytes!("../data/digits.csv.gz");

/// What went wrong while reading the digits.
#[derive(Debug, thiserror::Error)]
pub enum DigitsError {
    #[error("cannot inflate the bundled digits.csv.gz")]
    Inflate(#[source] std::io::Error),
    #[error("digits line {line}: {reason}")]
    Row { line: usize, reason: String },
    #[error("the digits data has no rows")]
    Empty,
}

/// Labelled images, features scaled into `0.0..=1.0`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    features: Vec<f32>,
    labels: Vec<u8>,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The features of sample `i` (`FEATURES` values). Panics if out of range.
    pub fn features(&self, i: usize) -> &[f32] {
        &self.features[i * FEATURES..(i + 1) * FEATURES]
    }

    /// The label of sample `i`. Panics if out of range.
    pub fn label(&self, i: usize) -> usize {
        usize::from(self.labels[i])
    }

    /// The samples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Dataset {
        let mut features = Vec::with_capacity(indices.len() * FEATURES);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            features.extend_from_slice(self.features(i));
            labels.push(self.labels[i]);
        }
        Dataset { features, labels }
    }

    /// Splits into (train, validation) after a shuffle drawn from `rng`;
    /// `validation_fraction` of the samples (rounded, at least one, and
    /// leaving at least one for training) go to validation.
    pub fn split(&self, validation_fraction: f64, rng: &mut impl Rng) -> (Dataset, Dataset) {
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(rng);
        let n_val = validation_cut(self.len(), validation_fraction);
        let (val, train) = order.split_at(n_val);
        (self.select(train), self.select(val))
    }
}

/// How many of `len` samples go to validation.
fn validation_cut(len: usize, fraction: f64) -> usize {
    if len < 2 {
        return 0;
    }
    let wanted = (len as f64 * fraction.clamp(0.0, 1.0)).round() as usize;
    wanted.clamp(1, len - 1)
}

/// Parses the CSV text: `FEATURES` pixel counts then the label, per line.
pub fn parse_csv(text: &str) -> Result<Dataset, DigitsError> {
    let mut features = Vec::new();
    let mut labels = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line_no = n + 1;
        if line.trim().is_empty() {
            continue;
        }
        let row_err = |reason: String| DigitsError::Row { line: line_no, reason };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != FEATURES + 1 {
            return Err(row_err(format!("{} fields, expected {}", fields.len(), FEATURES + 1)));
        }
        for field in &fields[..FEATURES] {
            let pixel: f32 = field.parse().map_err(|_| row_err(format!("pixel {field:?} is not a number")))?;
            if !(0.0..=MAX_PIXEL).contains(&pixel) {
                return Err(row_err(format!("pixel {pixel} outside 0..=16")));
            }
            features.push(pixel / MAX_PIXEL);
        }
        let label = fields[FEATURES];
        let label: u8 = label.parse().map_err(|_| row_err(format!("label {label:?} is not an integer")))?;
        if usize::from(label) >= CLASSES {
            return Err(row_err(format!("label {label} outside 0..=9")));
        }
        labels.push(label);
    }
    if labels.is_empty() {
        return Err(DigitsError::Empty);
    }
    Ok(Dataset { features, labels })
}

/// The bundled digits, inflated and parsed.
pub fn load_bundled() -> Result<Dataset, DigitsError> {
    let mut text = String::new();
    GzDecoder::new(BUNDLED_GZ).read_to_string(&mut text).map_err(DigitsError::Inflate)?;
    parse_csv(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn row(label: u8, pixel: u8) -> String {
        let mut fields = vec![pixel.to_string(); FEATURES];
        fields.push(label.to_string());
        fields.join(",")
    }

    #[test]
    fn bundled_data_is_the_full_uci_test_set() {
        let data = load_bundled().expect("bundled data parses");
        assert_eq!(data.len(), 1797);
        let mut per_class = [0usize; CLASSES];
        for i in 0..data.len() {
            per_class[data.label(i)] += 1;
            assert!(data.features(i).iter().all(|&x| (0.0..=1.0).contains(&x)));
        }
        // Every class has between 174 and 183 samples in this set.
        assert!(per_class.iter().all(|&c| (174..=183).contains(&c)), "{per_class:?}");
    }

    #[test]
    fn parses_and_scales_rows() {
        let text = format!("{}\n\n{}\n", row(3, 16), row(9, 8));
        let data = parse_csv(&text).expect("valid rows");
        assert_eq!(data.len(), 2);
        assert_eq!(data.label(0), 3);
        assert_eq!(data.label(1), 9);
        assert_eq!(data.features(0)[0], 1.0);
        assert_eq!(data.features(1)[63], 0.5);
    }

    #[test]
    fn rejects_bad_rows_with_their_line() {
        let short = "1,2,3\n";
        assert!(matches!(parse_csv(short), Err(DigitsError::Row { line: 1, .. })));
        let text = format!("{}\n{}", row(1, 0), row(10, 0));
        let e = parse_csv(&text).expect_err("label 10");
        assert!(e.to_string().contains("line 2"), "{e}");
        let text = row(1, 17);
        assert!(parse_csv(&text).expect_err("pixel 17").to_string().contains("outside 0..=16"));
        assert!(matches!(parse_csv("\n"), Err(DigitsError::Empty)));
    }

    #[test]
    fn split_is_deterministic_disjoint_and_complete() {
        let data = load_bundled().expect("bundled data parses");
        let split = |seed| data.split(0.2, &mut ChaCha8Rng::seed_from_u64(seed));
        let (train, val) = split(7);
        assert_eq!(val.len(), 359);
        assert_eq!(train.len() + val.len(), data.len());
        assert_eq!(split(7), (train.clone(), val.clone()));
        assert_ne!(split(8).1, val);
    }

    #[test]
    fn validation_cut_keeps_both_sides_non_empty() {
        assert_eq!(validation_cut(100, 0.2), 20);
        assert_eq!(validation_cut(10, 0.0), 1);
        assert_eq!(validation_cut(10, 1.0), 9);
        assert_eq!(validation_cut(1, 0.5), 0);
    }
}
