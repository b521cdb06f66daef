"""Tests of the client's parts that need no service (test_live.py drives
a real ``tunefleet serve``)."""

import json
import os

import pytest

import tunefleet
from tunefleet.client import _name_of


def test_the_access_file_is_beside_the_control_socket():
    assert tunefleet.access_file("fleet.db") == os.path.join("fleet.control", "api.json")
    assert tunefleet.access_file("/srv/a.b.db") == os.path.join("/srv/a.b.control", "api.json")


def test_a_client_reads_its_address_and_token_from_the_store(tmp_path):
    os.mkdir(tmp_path / "fleet.control")
    (tmp_path / "fleet.control" / "api.json").write_text(json.dumps({"url": "http://127.0.0.1:1/", "token": "t" * 64}))
    client = tunefleet.Client(store=str(tmp_path / "fleet.db"))
    assert client.url == "http://127.0.0.1:1" and client.token == "t" * 64
    with pytest.raises(ValueError):
        tunefleet.Client()


def test_a_refusal_is_an_api_error_with_its_status():
    # Nothing listens on port 1: a connection error, not an ApiError.
    client = tunefleet.Client(url="http://127.0.0.1:1", token="x")
    with pytest.raises(OSError):
        client.studies()
    e = tunefleet.ApiError(409, "study s has every configuration its budget takes")
    assert e.status == 409 and "409" in str(e)


def test_a_study_files_name():
    assert _name_of('name = "digits"\ncommand = ["x"]\n') == "digits"
    assert _name_of("[objective]\n") == ""


def test_a_space_becomes_optunas_distributions():
    optuna = pytest.importorskip("optuna")
    d = tunefleet.optuna_distributions(
        {
            "lr": {"kind": "log_float", "low": 1e-4, "high": 0.1},
            "x": {"kind": "float", "low": 0.0, "high": 1.0},
            "n": {"kind": "int", "low": 2, "high": 8, "step": 2},
            "opt": {"kind": "categorical", "values": ["adam", "sgd"]},
        }
    )
    assert d["lr"] == optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)
    assert d["x"] == optuna.distributions.FloatDistribution(0.0, 1.0)
    assert d["n"] == optuna.distributions.IntDistribution(2, 8, step=2)
    assert d["opt"] == optuna.distributions.CategoricalDistribution(["adam", "sgd"])
