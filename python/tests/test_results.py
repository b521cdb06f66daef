"""Tests of tunefleet.load's records and DataFrame, from rows as
``tunefleet export --format json`` writes them (the Rust test
``tests/tests/python.rs`` reads a real store through the real CLI)."""

import datetime
import os
import stat
import sys

import pytest

import tunefleet


def row(trial, state, objective=None, rank=None, **extra):
    base = {
        "trial": trial,
        "repeat": 0,
        "state": state,
        "params": {"lr": 0.01 * (trial + 1), "opt": "adam"},
        "objective": objective,
        "wall_us": None if objective is None else 1_500_000,
        "energy_j": None if objective is None else 12.5,
        "energy_source": None if objective is None else "rapl",
        "energy_valid": None if objective is None else True,
        "gpu_energy_j": None,
        "agent": "node-1",
        "attempt": 1,
        "attempts": 1,
        "exit": None if objective is None else "exit 0",
        "rank": rank,
        "config_mean": objective,
        "config_runs": None if rank is None else 1,
        "measurement": None,
        "nodes": [],
    }
    base.update(extra)
    return base


ROWS = [
    row(0, "done", 0.91, rank=2, feasible=True, violation=0.0),
    row(1, "done", 0.97, rank=3, feasible=False, violation=0.5),
    row(2, "done", 0.95, rank=1, feasible=True, violation=0.0),
    row(3, "failed"),
    row(4, "running"),
    row(5, "stopped", 0.4),
]


def test_records_carry_optunas_states_values_params_and_attributes():
    study = tunefleet.Study("s", ROWS)
    trials = study.trials()
    assert [t.number for t in trials] == [0, 1, 2, 3, 4, 5]
    assert [t.state for t in trials] == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL", "RUNNING", "PRUNED"]
    first = trials[0]
    assert first.value == 0.91 and first.params == {"lr": 0.01, "opt": "adam"}
    assert first.duration == datetime.timedelta(seconds=1.5)
    assert first.user_attrs["energy_j"] == 12.5 and first.user_attrs["energy_source"] == "rapl"
    assert first.user_attrs["wall_time"] == 1.5 and first.user_attrs["rank"] == 2
    assert trials[1].system_attrs == {"feasible": False, "violation": 0.5}
    assert trials[3].value is None and trials[3].duration is None and trials[3].system_attrs == {}


def test_best_is_the_ranked_first_not_the_highest_value():
    # Trial 1 has the highest value but is infeasible: the rule ranked trial 2 first.
    assert tunefleet.Study("s", ROWS).best().number == 2
    assert tunefleet.Study("s", [row(0, "failed")]).best() is None


def test_trials_dataframe_uses_optunas_column_names():
    import pandas

    df = tunefleet.Study("s", ROWS).trials_dataframe()
    assert isinstance(df, pandas.DataFrame)
    for column in ["number", "value", "state", "duration", "params_lr", "params_opt", "user_attrs_energy_j",
                   "user_attrs_agent", "user_attrs_rank", "system_attrs_feasible", "system_attrs_violation"]:
        assert column in df.columns, column
    assert df.loc[df["number"] == 2, "params_lr"].item() == pytest.approx(0.03)
    assert list(df["state"]) == ["COMPLETE", "COMPLETE", "COMPLETE", "FAIL", "RUNNING", "PRUNED"]


def test_a_failed_export_says_why(tmp_path):
    # A stand-in for the program that fails as tunefleet does on an unknown study.
    fake = tmp_path / "tunefleet"
    fake.write_text("#!/bin/sh\necho 'tunefleet: no study \"nope\" in the store' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(tunefleet.ExportError) as e:
        tunefleet.load("nope", store=str(tmp_path / "s.db"), tunefleet=str(fake))
    assert "no study" in str(e.value) and "exited 1" in str(e.value)


def test_the_package_is_typed():
    root = os.path.dirname(tunefleet.__file__)
    assert os.path.exists(os.path.join(root, "py.typed"))
    assert sys.version_info >= (3, 8)
