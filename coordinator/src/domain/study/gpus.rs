//! A result's GPU readings against the GPUs its trial was given: the
//! agent's measurement holds one reading per GPU given (valid or saying
//! why not), so a result with another count is not believed. Pure.

use tunefleet_common::measurement::GpuEnergy;

/// `Err(why)` when `readings` are not one per GPU of the `given` ones of a
/// trial (its study's `gpus = N`): a result that says it measured more
/// GPUs than its trial had, or fewer, cannot be told apart from a forged
/// one, so its trial runs again rather than keep an energy it may not
/// have used.
pub fn readings_of_given_gpus(given: u32, readings: &[GpuEnergy]) -> Result<(), String> {
    match readings.len() {
        n if n == given as usize => Ok(()),
        n => Err(format!("not believed: {n} GPU readings for a trial given {given} GPUs")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tunefleet_common::measurement::GpuMethod;

    fn reading(index: u32, valid: bool) -> GpuEnergy {
        GpuEnergy { index, uuid: format!("GPU-{index}"), joules: 100.0, method: GpuMethod::Counter, valid, note: None }
    }

    #[test]
    fn a_result_has_one_reading_per_gpu_its_trial_was_given() {
        assert_eq!(readings_of_given_gpus(2, &[reading(0, true), reading(3, false)]), Ok(()), "one unreadable: kept");
        assert_eq!(readings_of_given_gpus(0, &[]), Ok(()));
        let missing = readings_of_given_gpus(2, &[reading(2, true)]);
        assert_eq!(missing, Err("not believed: 1 GPU readings for a trial given 2 GPUs".into()));
        assert!(readings_of_given_gpus(1, &[reading(0, true), reading(1, true)]).is_err(), "an extra one");
        assert!(readings_of_given_gpus(0, &[reading(0, true)]).is_err(), "a CPU trial reporting a GPU");
    }
}
