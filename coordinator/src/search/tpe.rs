//! The Tree-structured Parzen Estimator (to be written).
