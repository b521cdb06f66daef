"""Optuna 5's TPE densities on recorded histories, for tpe's parity test
(issue 37): search/tests/fixtures/tpe_optuna5_replay.json, read by
`search/src/tpe/tests.rs`'s `the_density_ratio_is_optuna_5s_on_recorded_histories`.

  target/optuna-venv/bin/python scripts/tpe-optuna-replay.py > search/tests/fixtures/tpe_optuna5_replay.json

Each case: a space, a history (complete trials with their values, pruned
trials with their last report, running trials), and query points; for
each point, log l(x) - log g(x) of the estimators Optuna 5's default
TPESampler builds from that history (its split of good and bad trials, its
weights, prior, bandwidths, int bins and categorical kernels), which is
what it maximises over its candidates. The histories are drawn at random
(seeded), their values from a few test functions: no sampler chose them.

One thing is made deterministic on Optuna's side: which of several trials
with the same value of a parameter (ints and categoricals have many) takes
which neighbour's gap as its bandwidth. Optuna sorts the values with
NumPy's default argsort, which orders equal values as its introsort
happens to leave them; tpe keeps them in trial order. That order matters
in a multivariate kernel (the tied trials differ in their other
parameters), so the estimators are built here with a stable argsort, and
the fixture then says what Optuna computes with equal values in trial
order; with NumPy's own order the mixed cases differ in exactly those
kernels' bandwidths.
"""

import json
import math
import random

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers._tpe.sampler import _split_trials, default_gamma
from optuna.trial import TrialState, create_trial


def space_of(kind):
    if kind == "branin":
        return {"x1": FloatDistribution(-5.0, 10.0), "x2": FloatDistribution(0.0, 15.0)}
    if kind == "box6":
        return {f"x{i}": FloatDistribution(0.0, 1.0) for i in range(6)}
    return {
        "x": FloatDistribution(-3.0, 3.0),
        "lr": FloatDistribution(1e-5, 1.0, log=True),
        "n": IntDistribution(0, 30),
        "batch": IntDistribution(16, 256, step=16),
        "opt": CategoricalDistribution(["adam", "sgd", "rmsprop", "adagrad"]),
    }


def draw(space, rng):
    p = {}
    for name, d in space.items():
        if isinstance(d, CategoricalDistribution):
            p[name] = rng.choice(d.choices)
        elif isinstance(d, IntDistribution):
            p[name] = d.low + d.step * rng.randrange((d.high - d.low) // d.step + 1)
        elif d.log:
            p[name] = math.exp(rng.uniform(math.log(d.low), math.log(d.high)))
        else:
            p[name] = rng.uniform(d.low, d.high)
    return p


def value(kind, p):
    if kind == "branin":
        x1, x2 = p["x1"], p["x2"]
        b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
        return (x2 - b * x1 * x1 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10
    if kind == "box6":
        return sum((p[f"x{i}"] - 0.1 * i) ** 2 for i in range(6)) + 0.3 * math.sin(9 * p["x0"])
    offset = {"adam": 0.0, "rmsprop": 0.25, "sgd": 0.5}.get(p["opt"], 1.0)
    return ((p["x"] - 0.7) ** 2 + (math.log10(p["lr"]) + 3) ** 2 / 4 + ((p["n"] - 17) / 10) ** 2
            + ((p["batch"] - 96) / 64) ** 2 + offset)


def case(kind, complete, pruned, running, seed):
    rng = random.Random(seed)
    space = space_of(kind)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    history = []
    for number in range(complete + pruned + running):
        p = draw(space, rng)
        if number < complete:
            v = value(kind, p)
            study.add_trial(create_trial(params=p, distributions=space, value=v))
            history.append({"trial": number, "params": p, "complete": v})
        elif number < complete + pruned:
            epoch, v = rng.randrange(1, 4), value(kind, p) * rng.uniform(0.5, 1.5)
            study.add_trial(create_trial(params=p, distributions=space, state=TrialState.PRUNED,
                                         intermediate_values={epoch: v}))
            history.append({"trial": number, "params": p, "pruned": [epoch, v]})
        else:
            study.add_trial(create_trial(params=p, distributions=space, state=TrialState.RUNNING))
            history.append({"trial": number, "params": p, "running": True})
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING))
    n = sum(t.state != TrialState.RUNNING for t in trials)
    below, above = _split_trials(study, trials, default_gamma(n))
    sampler = study.sampler
    argsort = np.argsort
    np.argsort = lambda a, *args, **kw: argsort(a, *args, **{**kw, "kind": "stable"})
    try:
        l = sampler._build_parzen_estimator(study, space, below, handle_below=True)
        g = sampler._build_parzen_estimator(study, space, above, handle_below=False)
    finally:
        np.argsort = argsort
    queries = [draw(space, rng) for _ in range(24)] + [h["params"] for h in history[:8]]
    samples = {name: np.asarray([float(d.to_internal_repr(q[name])) for q in queries]) for name, d in space.items()}
    ratio = l.log_pdf(samples) - g.log_pdf(samples)
    return {"kind": kind, "history": history, "queries": queries, "log_ratio": [float(r) for r in ratio]}


if __name__ == "__main__":
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cases = [
        case("branin", 12, 0, 0, 1),
        case("branin", 60, 0, 0, 2),
        case("box6", 35, 0, 0, 3),
        case("mixed", 20, 0, 0, 4),
        case("mixed", 45, 4, 3, 5),
    ]
    print(json.dumps({"optuna": optuna.__version__, "cases": cases}))
