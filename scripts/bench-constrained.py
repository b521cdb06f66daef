"""The constrained search benchmark's Optuna side and its table
(scripts/bench-constrained.sh).

  bench-constrained.py optuna SEEDS BUDGET WORKERS [tpe|gp]   one JSON line per (problem, seed)
  bench-constrained.py table FILE...                 a Markdown table from those lines

The problems are search/examples/bench_constrained.rs's, with the same
spaces. Optuna's sampler is TPESampler(seed=seed, constraints_func=...),
or GPSampler(seed=seed, constraints_func=...) (`gp`: needs PyTorch and
SciPy), with every other argument at Optuna 5's default; constraints_func
returns each constraint's signed value (feasible when <= 0), as Optuna asks.
WORKERS = 4: four trials in flight with Optuna's ask-and-tell interface,
the oldest told, one more asked while the other three run.

The table gives, per problem and side, the median best feasible value over
the seeds (a seed with none feasible counts as worse than any), the seeds
with a feasible trial, and the median trials to the first feasible one;
and the null: Optuna against itself on the first and the second half of
the seeds, so a gap between sides counts only where it exceeds what the
seeds alone make.
"""

import json
import math
import statistics
import sys


def gardner(p):
    x, y = p["x"], p["y"]
    return math.sin(x) + y, [math.sin(x) * math.sin(y) + 0.95]


def gramacy(p):
    x, y = p["x"], p["y"]
    c1 = 1.5 - x - 2 * y - 0.5 * math.sin(2 * math.pi * (x * x - 2 * y))
    return x + y, [c1, x * x + y * y - 1.5]


def simionescu(p):
    x, y = p["x"], p["y"]
    r = 1 + 0.2 * math.cos(8 * math.atan2(x, y))
    return 0.1 * x * y, [x * x + y * y - r * r]


def mishra_bird(p):
    x, y = p["x"], p["y"]
    f = math.sin(y) * math.exp((1 - math.cos(x)) ** 2) + math.cos(x) * math.exp((1 - math.sin(y)) ** 2) + (x - y) ** 2
    return f, [(x + 5) ** 2 + (y + 5) ** 2 - 25]


PROBLEMS = {
    "gardner": (gardner, {"x": (0.0, 6.0), "y": (0.0, 6.0)}),
    "gramacy": (gramacy, {"x": (0.0, 1.0), "y": (0.0, 1.0)}),
    "simionescu": (simionescu, {"x": (-1.25, 1.25), "y": (-1.25, 1.25)}),
    "mishra_bird": (mishra_bird, {"x": (-10.0, 0.0), "y": (-6.5, 0.0)}),
}


def run_optuna(seeds, budget, workers, only, kind="tpe"):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name, (f, bounds) in PROBLEMS.items():
        if only and name not in only:
            continue
        dists = {k: optuna.distributions.FloatDistribution(lo, hi) for k, (lo, hi) in bounds.items()}
        for seed in range(seeds):
            constraints = lambda t: t.user_attrs["c"]  # noqa: E731
            sampler = (optuna.samplers.GPSampler(seed=seed, constraints_func=constraints) if kind == "gp"
                       else optuna.samplers.TPESampler(seed=seed, constraints_func=constraints))
            study = optuna.create_study(sampler=sampler)
            in_flight, best, first, finished = [], None, None, 0
            while finished < budget:
                while len(in_flight) < max(1, workers) and len(in_flight) + finished < budget:
                    in_flight.append(study.ask(dists))
                trial = in_flight.pop(0)
                value, c = f(trial.params)
                trial.set_user_attr("c", c)
                study.tell(trial, value)
                finished += 1
                if all(v <= 0 for v in c):
                    best = value if best is None else min(best, value)
                    first = first or finished
            print(json.dumps({"side": f"optuna-{kind}", "fn": name, "seed": seed, "workers": workers,
                              "best": best, "first_feasible": first}))


def key(best):
    """A best feasible value to sort by: none feasible is worse than any."""
    return math.inf if best is None else best


def summary(rows):
    bests = sorted(key(r["best"]) for r in rows)
    firsts = [r["first_feasible"] for r in rows if r["first_feasible"] is not None]
    return statistics.median(bests), sum(1 for r in rows if r["best"] is not None), (
        statistics.median(firsts) if firsts else None)


def table(paths):
    rows = [json.loads(l) for p in paths for l in open(p) if l.strip()]
    sides = sorted({r["side"] for r in rows})
    for workers in sorted({r["workers"] for r in rows}):
        print(f"\n{workers} in flight: median best feasible value (seeds with one feasible; median trials to the first)\n")
        nulls = [s for s in ("optuna-tpe", "optuna-gp") if s in sides]
        print("| problem | " + " | ".join(sides) + "".join(f" | null: {n} seeds 0-9 / 10-19" for n in nulls) + " |")
        print("|---|" + "---|" * (len(sides) + len(nulls)))
        for fn in sorted({r["fn"] for r in rows}):
            cells = []
            for side in sides:
                mine = [r for r in rows if r["side"] == side and r["fn"] == fn and r["workers"] == workers]
                if not mine:
                    cells.append("-")
                    continue
                med, feasible, first = summary(mine)
                cells.append(f"{med:.4g} ({feasible}/{len(mine)}; {first})")
            for n in nulls:
                optuna = sorted((r for r in rows if r["side"] == n and r["fn"] == fn and r["workers"] == workers),
                                key=lambda r: r["seed"])
                half = len(optuna) // 2
                cells.append("-" if not half else
                             f"{summary(optuna[:half])[0]:.4g} / {summary(optuna[half:])[0]:.4g}")
            print(f"| {fn} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "optuna":
        kind = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] in ("tpe", "gp") else "tpe"
        only = set(a for a in sys.argv[5:] if a not in ("tpe", "gp"))
        run_optuna(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), only, kind)
    else:
        table(sys.argv[2:])
