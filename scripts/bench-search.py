"""The search benchmark's Optuna side and its tables (scripts/bench-search.sh).

  bench-search.py optuna SEEDS BUDGET WORKERS   one JSON line per (function, seed)
  bench-search.py table FILE...                 Markdown tables from those lines

The functions are the ones coordinator/examples/bench_search.rs runs on
Tunefleet's side, with the same spaces (same names, bounds, steps and
choices). Optuna's sampler is TPESampler(seed=seed) with every other
argument at Optuna's default. WORKERS = 4 simulates four workers of equal
speed with Optuna's ask-and-tell interface: four trials in flight, the
oldest is told, one more is asked while the other three are RUNNING (which
Optuna 5's default constant liar sees).
"""

import json
import math
import statistics
import sys


def branin(p):
    x1, x2 = p["x1"], p["x2"]
    b = 5.1 / (4 * math.pi**2)
    c = 5 / math.pi
    t = 1 / (8 * math.pi)
    return (x2 - b * x1 * x1 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


ALPHA = [1.0, 1.2, 3.0, 3.2]
A = [
    [10, 3, 17, 3.5, 1.7, 8],
    [0.05, 10, 17, 0.1, 8, 14],
    [3, 3.5, 1.7, 10, 17, 8],
    [17, 8, 0.05, 10, 0.1, 14],
]
P = [
    [1312, 1696, 5569, 124, 8283, 5886],
    [2329, 4135, 8307, 3736, 1004, 9991],
    [2348, 1451, 3522, 2883, 3047, 6650],
    [4047, 8828, 8732, 5743, 1091, 381],
]


def hartmann6(p):
    x = [p[f"x{i}"] for i in range(6)]
    return -sum(
        ALPHA[i] * math.exp(-sum(A[i][j] * (x[j] - P[i][j] * 1e-4) ** 2 for j in range(6)))
        for i in range(4)
    )


def styblinski_tang(p):
    return sum(0.5 * (x**4 - 16 * x * x + 5 * x) for x in (p[f"x{i}"] for i in range(4)))


def rosenbrock(p):
    x = [p[f"x{i}"] for i in range(4)]
    return sum(100 * (x[i + 1] - x[i] ** 2) ** 2 + (1 - x[i]) ** 2 for i in range(3))


def mixed(p):
    offset = {"adam": 0.0, "rmsprop": 0.25, "sgd": 0.5}.get(p["opt"], 1.0)
    return (
        (p["x"] - 0.7) ** 2
        + (math.log10(p["lr"]) + 3) ** 2 / 4
        + ((p["n"] - 17) / 10) ** 2
        + ((p["batch"] - 96) / 64) ** 2
        + offset
    )


def himmelblau(p):
    x, y = p["x"], p["y"]
    return (x * x + y - 11) ** 2 + (x + y * y - 7) ** 2


def box(names, low, high):
    return [("float", n, low, high) for n in names]


# name -> (space, function, optimum, noise standard deviation)
FUNCTIONS = {
    "branin": ([("float", "x1", -5.0, 10.0), ("float", "x2", 0.0, 15.0)], branin, 0.397887357729738, 0.0),
    "hartmann6": (box([f"x{i}" for i in range(6)], 0.0, 1.0), hartmann6, -3.32236801141551, 0.0),
    "styblinski_tang4": (box([f"x{i}" for i in range(4)], -5.0, 5.0), styblinski_tang, -39.16616570377142 * 4, 0.0),
    "rosenbrock4": (box([f"x{i}" for i in range(4)], -2.048, 2.048), rosenbrock, 0.0, 0.0),
    "mixed_int_cat": (
        [
            ("float", "x", -3.0, 3.0),
            ("log", "lr", 1e-5, 1.0),
            ("int", "n", 0, 30, 1),
            ("int", "batch", 16, 256, 16),
            ("cat", "opt", ["adam", "sgd", "rmsprop", "adagrad"]),
        ],
        mixed,
        0.0,
        0.0,
    ),
    "himmelblau_noisy": (box(["x", "y"], -5.0, 5.0), himmelblau, 0.0, 1.0),
}


def suggest(trial, space):
    p = {}
    for d in space:
        if d[0] == "float":
            p[d[1]] = trial.suggest_float(d[1], d[2], d[3])
        elif d[0] == "log":
            p[d[1]] = trial.suggest_float(d[1], d[2], d[3], log=True)
        elif d[0] == "int":
            p[d[1]] = trial.suggest_int(d[1], d[2], d[3], step=d[4])
        else:
            p[d[1]] = trial.suggest_categorical(d[1], d[2])
    return p


def optuna_study(name, seed, budget, workers):
    import random

    import optuna

    space, f, optimum, noise = FUNCTIONS[name]
    rng = random.Random(seed ^ 0x9E3779B97F4A7C15)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    in_flight = []
    asked = finished = 0
    best_seen, best_true, at50 = math.inf, math.inf, math.nan
    while finished < budget:
        while len(in_flight) < max(workers, 1) and asked < budget:
            trial = study.ask()
            in_flight.append((trial, suggest(trial, space)))
            asked += 1
        trial, p = in_flight.pop(0)
        truth = f(p)
        seen = truth + (rng.gauss(0.0, noise) if noise > 0 else 0.0)
        study.tell(trial, seen)
        if seen < best_seen:
            best_seen, best_true = seen, truth
        finished += 1
        if finished == 50:
            at50 = best_true - optimum
    return at50, best_true - optimum


def run_optuna(seeds, budget, workers, only):
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    for name in FUNCTIONS:
        if only and name not in only:
            continue
        for seed in range(seeds):
            r50, r100 = optuna_study(name, seed, budget, workers)
            print(json.dumps({"side": "optuna", "fn": name, "seed": seed, "workers": workers,
                              "regret50": r50, "regret100": r100}), flush=True)


def quartiles(v):
    q = statistics.quantiles(sorted(v), n=4, method="inclusive")
    return q[0], statistics.median(v), q[2]


def permutation_p(a, b, rounds=4000):
    """Two-sided p-value of the difference of the medians (seeded permutations)."""
    import random

    rng = random.Random(0)
    observed = abs(statistics.median(a) - statistics.median(b))
    pool = list(a) + list(b)
    hits = 0
    for _ in range(rounds):
        rng.shuffle(pool)
        if abs(statistics.median(pool[: len(a)]) - statistics.median(pool[len(a):])) >= observed:
            hits += 1
    return hits / rounds


def fmt(x):
    return f"{x:.3g}"


def table(paths):
    rows = []
    for path in paths:
        with open(path) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{")]
    groups = {}
    for r in rows:
        groups.setdefault((r["workers"], r["fn"], r["side"]), []).append(r)
    out = []
    for workers in sorted({r["workers"] for r in rows}):
        out.append(f"\n**{'sequential' if workers == 1 else f'{workers} in flight'}** "
                   "(median regret [IQR] over seeds; ratio = Tunefleet median / Optuna median; "
                   "p = permutation test of the difference of the medians)\n")
        out.append("| function | budget | Tunefleet | Optuna 5 | ratio | p | seeds |")
        out.append("|---|---|---|---|---|---|---|")
        for name in FUNCTIONS:
            tf, op = groups.get((workers, name, "tunefleet")), groups.get((workers, name, "optuna"))
            if not tf or not op:
                continue
            for budget in (50, 100):
                key = f"regret{budget}"
                a, b = [r[key] for r in tf], [r[key] for r in op]
                (t1, tm, t3), (o1, om, o3) = quartiles(a), quartiles(b)
                ratio = tm / om if om > 0 else math.inf
                out.append(f"| {name} | {budget} | {fmt(tm)} [{fmt(t1)}, {fmt(t3)}] | {fmt(om)} [{fmt(o1)}, {fmt(o3)}] "
                           f"| {ratio:.2f} | {permutation_p(a, b):.2f} | {len(tf)}/{len(op)} |")
    print("\n".join(out))


if __name__ == "__main__":
    if sys.argv[1] == "optuna":
        run_optuna(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
    elif sys.argv[1] == "table":
        table(sys.argv[2:])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
