"""A study's trials, read from a Tunefleet store through ``tunefleet export``.

The coordinator's CLI does the reading (the one ranking rule included), so
what Python sees is what ``tunefleet best`` and the report show::

    import tunefleet

    study = tunefleet.load("digits", store="tunefleet.db")
    for t in study.trials():
        print(t.number, t.state, t.value, t.params, t.user_attrs["energy_j"])
    df = study.trials_dataframe()       # pandas, Optuna's column names
    print(study.best().params)

Columns and attributes follow Optuna's ``trials_dataframe()``: ``number``,
``value``, ``state`` (``COMPLETE``, ``FAIL``, ``RUNNING``, ``WAITING``,
``PRUNED``), ``duration``, ``params_*``, ``user_attrs_*`` (the energy with
its source and validity, the GPUs' part, the agent, the wall time, the
rank, the configuration's mean and runs) and ``system_attrs_*``
(``feasible`` and ``violation`` in a study with constraints).
"""

import datetime
import json
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

#: Tunefleet's trial states, as Optuna names them.
STATES = {
    "done": "COMPLETE",
    "failed": "FAIL",
    "running": "RUNNING",
    "pending": "WAITING",
    "stopped": "PRUNED",
}

#: Export fields kept as user attributes, by their name there.
USER_ATTRS = (
    "energy_j",
    "energy_source",
    "energy_valid",
    "gpu_energy_j",
    "agent",
    "attempts",
    "repeat",
    "rank",
    "config_mean",
    "config_runs",
    "exit",
)


class ExportError(RuntimeError):
    """``tunefleet export`` failed: its exit status and what it said."""


@dataclass
class TrialRecord:
    """One trial as Optuna's ``FrozenTrial`` shows one: its number, state,
    objective value, parameters and attributes."""

    number: int
    state: str
    value: Optional[float]
    params: Dict[str, Any]
    duration: Optional[datetime.timedelta] = None
    user_attrs: Dict[str, Any] = field(default_factory=dict)
    system_attrs: Dict[str, Any] = field(default_factory=dict)

    def row(self) -> Dict[str, Any]:
        """The record as one row of ``trials_dataframe()``."""
        out: Dict[str, Any] = {"number": self.number, "value": self.value, "state": self.state}
        out["duration"] = self.duration
        out.update({"params_" + k: v for k, v in self.params.items()})
        out.update({"user_attrs_" + k: v for k, v in self.user_attrs.items()})
        out.update({"system_attrs_" + k: v for k, v in self.system_attrs.items()})
        return out


def record(row: Dict[str, Any]) -> TrialRecord:
    """A record from one object of ``tunefleet export --format json``."""
    wall_us = row.get("wall_us")
    user = {k: row.get(k) for k in USER_ATTRS if k in row}
    if wall_us is not None:
        user["wall_time"] = wall_us / 1e6
    system: Dict[str, Any] = {}
    if row.get("feasible") is not None:
        system["feasible"] = row["feasible"]
        system["violation"] = row.get("violation")
    return TrialRecord(
        number=int(row["trial"]),
        state=STATES.get(str(row.get("state")), str(row.get("state")).upper()),
        value=row.get("objective"),
        params=dict(row.get("params") or {}),
        duration=None if wall_us is None else datetime.timedelta(microseconds=wall_us),
        user_attrs=user,
        system_attrs=system,
    )


class Study:
    """A study's trials as ``tunefleet export`` gave them."""

    def __init__(self, name: str, rows: Sequence[Dict[str, Any]]) -> None:
        self.name = name
        self._records = [record(r) for r in rows]

    def trials(self) -> List[TrialRecord]:
        """Every trial, by number."""
        return list(self._records)

    def best(self) -> Optional[TrialRecord]:
        """The best trial by Tunefleet's one ranking rule (``rank`` 1: the
        configuration with the best mean over its runs, feasible ones
        first), or ``None`` while nothing is ranked."""
        ranked = [t for t in self._records if t.user_attrs.get("rank") == 1]
        return ranked[0] if ranked else None

    def trials_dataframe(self) -> Any:
        """The trials as a pandas DataFrame with Optuna's column names
        (needs pandas: ``pip install 'tunefleet[dataframe]'``)."""
        try:
            import pandas
        except ImportError as e:  # pragma: no cover - the message is the point
            raise ImportError("trials_dataframe() needs pandas: pip install 'tunefleet[dataframe]'") from e
        return pandas.DataFrame([t.row() for t in self._records])


def load(study: str, store: str = "tunefleet.db", tunefleet: str = "tunefleet") -> Study:
    """Study ``study`` of the store ``store``, read with the ``tunefleet``
    program (a path, or a name on ``PATH``)."""
    cmd = [tunefleet, "export", study, "--format", "json", "--store", store]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ExportError("%s exited %d: %s" % (" ".join(cmd), done.returncode, done.stderr.strip()))
    return Study(study, json.loads(done.stdout))
