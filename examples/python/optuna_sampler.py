"""Optuna's CMA-ES sampler drives a Tunefleet study on the fleet.

The study file says ``[strategy] kind = "external"``: Tunefleet creates no
configuration of its own; this program asks for trials to fill, fills each
with CMA-ES's choice, and tells it; the fleet runs them (leased, measured,
retried, metered) and CMA-ES learns from the results. (Not named cmaes.py:
it would shadow the ``cmaes`` module Optuna imports.)::

    tunefleet serve --store fleet.db &          # with agents joined
    python3 examples/python/optuna_sampler.py --store fleet.db examples/studies/external.toml

Needs ``pip install './python[optuna]'`` (Optuna 5 and cmaes).
"""

import argparse
import json

import optuna

import tunefleet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", help="a study file whose [strategy] kind is external")
    parser.add_argument("--store", default="tunefleet.db", help="the store tunefleet serve runs on (its api.json)")
    parser.add_argument("--parallel", type=int, default=4, help="configurations on the fleet at once")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    client = tunefleet.Client(store=args.store)
    name = client.submit(args.study)
    study = tunefleet.drive(client, name, optuna.samplers.CmaEsSampler(seed=args.seed), parallel=args.parallel)
    best = client.best(name)
    print(json.dumps({
        "study": name,
        "optuna_trials": len(study.trials),
        "best_value": study.best_value,
        "tunefleet_best": None if best is None else {"trial": best.number, "value": best.value, "params": best.params},
    }))


if __name__ == "__main__":
    main()
