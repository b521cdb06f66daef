"""The client against a real ``tunefleet serve`` with real agents, which
``tests/tests/python.rs`` starts: it sets ``TUNEFLEET_LIVE_STORE`` (the
service's store, whose ``api.json`` gives the address and token) and
``TUNEFLEET_BIN`` (the directory of the ``tunefleet`` program). Skipped
without them."""

import io
import os
import subprocess
import time

import pytest

import tunefleet

STORE = os.environ.get("TUNEFLEET_LIVE_STORE")
BIN = os.environ.get("TUNEFLEET_BIN", "")
pytestmark = pytest.mark.skipif(not STORE, reason="needs a running tunefleet serve (tests/tests/python.rs starts one)")


def client():
    return tunefleet.Client(store=STORE)


def export_csv(name):
    done = subprocess.run(
        [os.path.join(BIN, "tunefleet"), "export", name, "--format", "csv", "--store", STORE],
        capture_output=True,
        text=True,
        check=True,
    )
    import pandas

    return pandas.read_csv(io.StringIO(done.stdout))


def echo_study(name, trials, seconds=0.0):
    """A grid over v = 1..trials whose loss is v, as a dict."""
    return {
        "name": name,
        "command": ["sh", "-c", "sleep %s; echo '{{\"event\":\"final\",\"loss\":{v}}}'" % seconds],
        "timeout": 60,
        "objective": {"metric": "loss", "direction": "minimize"},
        "budget": {"trials": trials},
        "strategy": {"kind": "grid"},
        "hyper": {"v": {"kind": "int", "low": 1, "high": trials}},
    }


def test_a_study_submitted_as_a_dict_is_followed_and_read_as_export_has_it():
    c = client()
    name = c.submit(echo_study("py-follow", 6))
    assert name == "py-follow"
    followed = [t.number for t in c.follow(name, timeout=120)]
    assert sorted(followed) == list(range(6)), "each trial once, as it finished"
    df = c.trials_dataframe(name)
    csv = export_csv(name)
    assert list(df["number"]) == list(csv["trial"])
    assert list(df["value"]) == list(csv["objective"])
    assert list(df["params_v"]) == list(csv["v"])
    assert set(df["state"]) == {"COMPLETE"} and set(csv["state"]) == {"done"}
    assert list(df["user_attrs_energy_j"]) == list(csv["energy_j"])
    best = c.best(name)
    assert best is not None and best.number == int(csv.loc[csv["rank"] == 1, "trial"].iloc[0])
    assert best.params == {"v": 1} and best.value == 1.0


def test_a_running_study_is_cancelled():
    c = client()
    name = c.submit(echo_study("py-cancel", 30, seconds=1.0))
    deadline = time.monotonic() + 60
    while not any(s["study"] == name and s["running"] > 0 for s in c.studies()):
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.2)
    assert "cancelled" in c.cancel(name)
    list(c.follow(name, timeout=60))
    states = [t.state for t in c.trials(name)]
    assert states.count("COMPLETE") < 30 and "PRUNED" in states, states


def test_optunas_cmaes_sampler_drives_an_external_study_and_every_trial_is_told_once():
    optuna = pytest.importorskip("optuna")
    c = client()
    study = {
        "name": "py-cmaes",
        "command": [
            "awk",
            "-v",
            "x={x}",
            "-v",
            "y={y}",
            'BEGIN {{ printf "{{\\"event\\":\\"final\\",\\"loss\\":%.9f}}\\n", (x - 0.3) ^ 2 + (y + 0.2) ^ 2 }}',
        ],
        "timeout": 60,
        "objective": {"metric": "loss", "direction": "minimize"},
        "budget": {"trials": 14},
        "strategy": {"kind": "external"},
        "hyper": {"x": {"kind": "float", "low": -1.0, "high": 1.0}, "y": {"kind": "float", "low": -1.0, "high": 1.0}},
    }
    name = c.submit(study)
    sampler = optuna.samplers.CmaEsSampler(seed=3)
    ostudy = tunefleet.drive(c, name, sampler, parallel=3)
    assert c.ask(name) is None, "the budget is told"
    trials = c.trials(name)
    assert len(trials) == 14 and {t.state for t in trials} == {"COMPLETE"}
    assert len(ostudy.trials) == 14, "one Optuna trial per configuration"
    assert {t.state for t in ostudy.trials} == {optuna.trial.TrialState.COMPLETE}
    # Each Tunefleet trial is one Optuna trial: its parameters, its value.
    pairs = sorted((round(t.params["x"], 12), round(t.params["y"], 12), t.value) for t in trials)
    told = sorted((round(t.params["x"], 12), round(t.params["y"], 12), t.value) for t in ostudy.trials)
    assert pairs == told
    # CMA-ES, not a fallback, chose them: its state is in the trials'
    # system attributes after the first generation.
    assert any(k.startswith("cma:") for t in ostudy.trials for k in t.system_attrs), ostudy.trials[-1].system_attrs
    assert c.best(name).value == min(t.value for t in trials)
