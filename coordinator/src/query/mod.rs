//! Questions asked of the store for the commands and the report: the best
//! results, the learned profiles, a study's status, its export. Each returns data; the
//! CLI's views and the report render it.

pub mod best;
pub mod export;
pub mod optuna;
pub mod profiles;
pub mod status;
