"""A client of ``tunefleet serve``'s HTTP JSON API (docs/API.md): submit a
study, follow its trials as they finish, cancel it, read its trials as
records or a DataFrame, and drive a study whose configurations a sampler
of your own chooses (``[strategy] kind = "external"``)::

    import tunefleet

    client = tunefleet.Client(store="fleet.db")   # the address and token serve wrote
    name = client.submit("study.toml")
    for trial in client.follow(name):
        print(trial.number, trial.state, trial.value)
    print(client.best(name).params)

Standard library only (``urllib``); pandas for ``trials_dataframe()``.
"""

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

from .results import Study, TrialRecord

#: States a trial does not leave, as Optuna names them.
FINAL = ("COMPLETE", "FAIL", "PRUNED")


class ApiError(RuntimeError):
    """The service refused a request: its HTTP status and what it said."""

    def __init__(self, status: int, message: str, body: Optional[Dict[str, Any]] = None) -> None:
        super().__init__("%d: %s" % (status, message))
        self.status = status
        self.message = message
        #: The whole answer (``{"error": ..., ...}``).
        self.body = body or {}


@dataclass
class Ask:
    """A trial to fill for an external study: set a value for every
    parameter of ``space`` in ``params``, then ``Client.tell`` it."""

    study: str
    space: Dict[str, Dict[str, Any]]
    left: int
    params: Dict[str, Any] = field(default_factory=dict)


def access_file(store: str) -> str:
    """Where ``tunefleet serve --store STORE`` writes its API's address and
    token: ``api.json`` in the control socket's directory (``fleet.control/``
    for ``fleet.db``)."""
    base, _ = os.path.splitext(store)
    return os.path.join(base + ".control", "api.json")


class Client:
    """``tunefleet serve``'s API at ``url`` with ``token`` (writes need it),
    or both read from the ``api.json`` of the service on ``store``."""

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        store: Optional[str] = None,
        timeout: float = 30.0,
    ) -> None:
        if store is not None and (url is None or token is None):
            with open(access_file(store), encoding="utf-8") as f:
                access = json.load(f)
            url = url or access["url"]
            token = token or access["token"]
        if url is None:
            raise ValueError("give url= (serve prints it as 'api: URL') or store= (its api.json)")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        request = urllib.request.Request(self.url + "/api/v1" + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")
            try:
                body = json.loads(text)
            except ValueError:
                body = {"error": text}
            raise ApiError(e.code, str(body.get("error", text)), body) from None

    # Studies.

    def studies(self) -> List[Dict[str, Any]]:
        """Every study as ``tunefleet status --json`` shows it."""
        return self._request("GET", "/studies")

    def study(self, name: str) -> Dict[str, Any]:
        """One study: its status, strategy, objective, budget and space."""
        return self._request("GET", "/studies/" + name)

    def submit(self, study: Union[str, "os.PathLike[str]", Dict[str, Any]]) -> str:
        """Runs a study on the fleet: a study file's path, its TOML text, or
        the file as a dict (``{"name": ..., "command": [...], "objective":
        {...}, ...}``). Returns its name."""
        if isinstance(study, dict):
            body: Dict[str, Any] = {"study": study}
            name = str(study.get("name", ""))
        else:
            text = str(study)
            if os.path.exists(text):
                with open(text, encoding="utf-8") as f:
                    text = f.read()
            body = {"toml": text}
            name = _name_of(text)
        self._request("POST", "/studies", body)
        return name

    def cancel(self, name: str) -> str:
        """Stops a study: no more trials, its running attempts cancelled."""
        return self._request("POST", "/studies/%s/cancel" % name, {})["message"]

    def enqueue(self, name: str, params: Dict[str, Any]) -> str:
        """Tries ``params`` before any trial of ``name`` not created yet."""
        return self._request("POST", "/studies/%s/enqueue" % name, {"params": params})["message"]

    # Trials.

    def trials(self, name: str) -> List[TrialRecord]:
        """Every trial as a record, by number (``export``'s rows)."""
        return Study(name, self._request("GET", "/studies/%s/trials" % name)).trials()

    def trials_dataframe(self, name: str) -> Any:
        """The trials as a pandas DataFrame with Optuna's column names."""
        return Study(name, self._request("GET", "/studies/%s/trials" % name)).trials_dataframe()

    def best(self, name: str) -> Optional[TrialRecord]:
        """The best trial by the one ranking rule, or ``None`` yet."""
        return Study(name, self._request("GET", "/studies/%s/trials" % name)).best()

    def follow(self, name: str, poll: float = 0.5, timeout: Optional[float] = None) -> Iterator[TrialRecord]:
        """Each trial once, as it becomes final (complete, failed or
        stopped), until the study has ended."""
        seen = set()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ended = self.study(name)["status"]["state"] != "running"
            for t in self.trials(name):
                if t.state in FINAL and t.number not in seen:
                    seen.add(t.number)
                    yield t
            if ended:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("study %s still runs after %.0f s" % (name, timeout or 0))
            time.sleep(poll)

    def wait(self, name: str, numbers: Iterable[int], poll: float = 0.2) -> List[TrialRecord]:
        """Blocks until at least one of the trials ``numbers`` is final;
        returns those that are."""
        wanted = set(numbers)
        while True:
            done = [t for t in self.trials(name) if t.number in wanted and t.state in FINAL]
            if done or not wanted:
                return done
            time.sleep(poll)

    # A sampler of your own.

    def ask(self, name: str) -> Optional[Ask]:
        """A trial to fill for the external study ``name``, or ``None``
        once it takes no more (its budget told, or it ended)."""
        try:
            a = self._request("POST", "/studies/%s/ask" % name, {})
        except ApiError as e:
            if e.status == 409 and e.body.get("told") is True:
                return None
            raise
        return Ask(study=a["study"], space=a["space"], left=int(a["left"]))

    def tell(self, ask: Union[Ask, str], params: Optional[Dict[str, Any]] = None) -> List[int]:
        """The filled trial (or a study's name and ``params``): returns the
        trial numbers it became on the fleet."""
        name = ask.study if isinstance(ask, Ask) else ask
        chosen = dict(ask.params if isinstance(ask, Ask) else {})
        chosen.update(params or {})
        return [int(n) for n in self._request("POST", "/studies/%s/tell" % name, {"params": chosen})["trials"]]


def _name_of(text: str) -> str:
    """The ``name = "..."`` of a study file's text (its first study)."""
    try:
        import tomllib  # Python 3.11

        return str(tomllib.loads(text).get("name", ""))
    except ImportError:  # pragma: no cover - older Pythons: the first name line
        for line in text.splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "name":
                return value.strip().strip("\"'")
        return ""


def optuna_distributions(space: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """A study's space (``Client.study(name)["space"]`` or ``Ask.space``) as
    Optuna distributions, for ``optuna.Study.ask(fixed_distributions)``."""
    import optuna.distributions as d

    out: Dict[str, Any] = {}
    for name, p in space.items():
        kind = p["kind"]
        if kind == "categorical":
            out[name] = d.CategoricalDistribution(p["values"])
        elif kind == "int":
            out[name] = d.IntDistribution(int(p["low"]), int(p["high"]), step=int(p.get("step", 1)))
        else:
            out[name] = d.FloatDistribution(float(p["low"]), float(p["high"]), log=kind == "log_float")
    return out


def drive(client: Client, name: str, sampler: Any, parallel: int = 4, poll: float = 0.2) -> Any:
    """Runs the external study ``name`` with an Optuna ``sampler`` (CMA-ES,
    NSGA-II, anything Optuna's ``ask``/``tell`` takes): up to ``parallel``
    configurations on the fleet at once, each told to the sampler when its
    trials (its repeats: their mean) are final; a trial that failed is told
    as failed. Returns the Optuna study, one Optuna trial per configuration."""
    import optuna

    info = client.study(name)
    study = optuna.create_study(sampler=sampler, direction=info["direction"])
    distributions = optuna_distributions(info["space"])
    waiting: Dict[int, Any] = {}  # Tunefleet trial -> Optuna trial
    results: Dict[int, List[Optional[float]]] = {}  # Optuna trial number -> its runs' values
    runs: Dict[int, int] = {}  # Optuna trial number -> its runs
    asking = True
    while asking or waiting:
        while asking and len(runs) < parallel:
            ask = client.ask(name)
            if ask is None:
                asking = False
                break
            trial = study.ask(distributions)
            ask.params.update(trial.params)
            numbers = client.tell(ask)
            runs[trial.number] = len(numbers)
            results[trial.number] = []
            for n in numbers:
                waiting[n] = trial
        if not waiting:
            continue
        for record in client.wait(name, list(waiting), poll=poll):
            trial = waiting.pop(record.number)
            ok = record.state == "COMPLETE" and record.value is not None
            results[trial.number].append(record.value if ok else None)
            if len(results[trial.number]) < runs[trial.number]:
                continue
            values = results.pop(trial.number)
            del runs[trial.number]
            if any(v is None for v in values):
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, sum(v for v in values if v is not None) / len(values))
    return study
