//! A result's GPU readings held to the GPUs its trial was given: the
//! agent says which GPUs it measured, the study says how many the trial
//! had. Pure.

use tunefleet_common::measurement::{GpuEnergy, GpuMethod};

/// Makes `readings` say what was measured of the `given` GPUs of a trial
/// (its study's `gpus = N`): a GPU it reported nothing of gets a reading
/// that does not count (its energy was not measured, so the trial's whole
/// energy does not count either, as with a GPU read that failed), and a
/// reading beyond the `given` ones is not believed (a trial given one GPU
/// that reports two, or a CPU trial that reports any). The joules
/// reported stay as they came, for the record.
pub fn gpus_as_given(given: u32, readings: &mut Vec<GpuEnergy>) {
    let given = given as usize;
    let reported = readings.len();
    for r in readings.iter_mut().skip(given) {
        r.valid = false;
        r.note = Some(format!("not believed: the trial was given {given} GPUs and its agent reported {reported}"));
    }
    let mut next = readings.iter().map(|r| r.index).max().map_or(0, |i| i.saturating_add(1));
    while readings.len() < given {
        readings.push(GpuEnergy {
            index: next,
            uuid: String::new(),
            joules: 0.0,
            method: GpuMethod::Counter,
            valid: false,
            note: Some(format!("not measured: the trial was given {given} GPUs and its agent reported {reported}")),
        });
        next = next.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(index: u32) -> GpuEnergy {
        GpuEnergy {
            index,
            uuid: format!("GPU-{index}"),
            joules: 100.0,
            method: GpuMethod::Counter,
            valid: true,
            note: None,
        }
    }

    #[test]
    fn readings_are_held_to_the_gpus_the_trial_was_given() {
        let mut exact = vec![reading(0), reading(3)];
        gpus_as_given(2, &mut exact);
        assert_eq!(exact, vec![reading(0), reading(3)], "as many as given: as reported");

        let mut missing = vec![reading(2)];
        gpus_as_given(2, &mut missing);
        assert_eq!(missing.len(), 2);
        assert!(missing[0].valid);
        assert!(!missing[1].valid && missing[1].joules == 0.0, "{missing:?}");
        assert!(missing[1].note.as_deref().is_some_and(|n| n.contains("given 2 GPUs and its agent reported 1")));

        let mut extra = vec![reading(0), reading(1)];
        gpus_as_given(1, &mut extra);
        assert!(extra[0].valid && !extra[1].valid, "{extra:?}");
        assert_eq!(extra[1].joules, 100.0, "kept for the record");

        let mut cpu_trial = vec![reading(0)];
        gpus_as_given(0, &mut cpu_trial);
        assert!(!cpu_trial[0].valid, "a trial given no GPU has no GPU energy to count");

        let mut none = Vec::new();
        gpus_as_given(0, &mut none);
        assert!(none.is_empty());
    }
}
