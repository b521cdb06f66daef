"""The search benchmark's Optuna side and its tables (scripts/bench-search.sh).

  bench-search.py optuna SEEDS BUDGET WORKERS   one JSON line per (function, seed)
  bench-search.py table FILE...                 Markdown tables from those lines

The functions are the ones search/examples/bench_search.rs runs on
Tunefleet's side, with the same spaces (same names, bounds, steps and
choices), and the two two-objective problems (zdt1, fonseca_fleming) with
the same reference points. Optuna's sampler is TPESampler(seed=seed) with
every other argument at Optuna's default (Optuna 5's default sampler, for
one objective and for several). WORKERS = 4 simulates four workers of equal
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


def levy(p):
    w = [1 + (p[f"x{i}"] - 1) / 4 for i in range(5)]
    return (math.sin(math.pi * w[0]) ** 2
            + sum((wi - 1) ** 2 * (1 + 10 * math.sin(math.pi * wi + 1) ** 2) for wi in w[:4])
            + (w[4] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[4]) ** 2))


A3 = [[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]]
P3 = [[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]]


def hartmann3(p):
    x = [p[f"x{i}"] for i in range(3)]
    return -sum(ALPHA[i] * math.exp(-sum(A3[i][j] * (x[j] - P3[i][j] * 1e-4) ** 2 for j in range(3)))
                for i in range(4))


def ackley(p):
    x = [p[f"x{i}"] for i in range(4)]
    s1 = sum(v * v for v in x) / 4
    s2 = sum(math.cos(2 * math.pi * v) for v in x) / 4
    return -20 * math.exp(-0.2 * math.sqrt(s1)) - math.exp(s2) + 20 + math.e


def camel(p):
    x, y = p["x1"], p["x2"]
    return (4 - 2.1 * x * x + x**4 / 3) * x * x + x * y + (-4 + 4 * y * y) * y * y


def rastrigin(p):
    x = [p[f"x{i}"] for i in range(3)]
    return 10 * len(x) + sum(v * v - 10 * math.cos(2 * math.pi * v) for v in x)


def dixon_price(p):
    x = [p[f"x{i}"] for i in range(4)]
    return (x[0] - 1) ** 2 + sum((i + 1) * (2 * x[i] ** 2 - x[i - 1]) ** 2 for i in range(1, 4))


def griewank(p):
    x = [p[f"x{i}"] for i in range(5)]
    return 1 + sum(v * v for v in x) / 4000 - math.prod(math.cos(v / math.sqrt(i + 1)) for i, v in enumerate(x))


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
    # Held out (issue 37): never looked at while gp's batch rules were written.
    "levy5": (box([f"x{i}" for i in range(5)], -10.0, 10.0), levy, 0.0, 0.0),
    "hartmann3": (box([f"x{i}" for i in range(3)], 0.0, 1.0), hartmann3, -3.862782147820756, 0.0),
    "ackley4": (box([f"x{i}" for i in range(4)], -5.0, 5.0), ackley, 0.0, 0.0),
    "camel": ([("float", "x1", -3.0, 3.0), ("float", "x2", -2.0, 2.0)], camel, -1.031628453489877, 0.0),
    # Held out from the width of gp's confidence bound (issue 37, fourth round).
    "rastrigin3": (box([f"x{i}" for i in range(3)], -5.12, 5.12), rastrigin, 0.0, 0.0),
    "dixon_price4": (box([f"x{i}" for i in range(4)], -10.0, 10.0), dixon_price, 0.0, 0.0),
    "griewank5": (box([f"x{i}" for i in range(5)], -10.0, 10.0), griewank, 0.0, 0.0),
}


def zdt1(p):
    x = [p[f"x{i}"] for i in range(5)]
    g = 1 + 9 * sum(x[1:]) / 4
    return [x[0], g * (1 - math.sqrt(x[0] / g))]


def fonseca_fleming(p):
    x = [p[f"x{i}"] for i in range(3)]
    c = 1 / math.sqrt(3)
    return [1 - math.exp(-sum((v - s * c) ** 2 for v in x)) for s in (1, -1)]


# name -> (space, function of two objectives, reference point)
TWO_OBJECTIVES = {
    "zdt1": (box([f"x{i}" for i in range(5)], 0.0, 1.0), zdt1, (1.1, 11.0)),
    "fonseca_fleming": (box([f"x{i}" for i in range(3)], -4.0, 4.0), fonseca_fleming, (1.0, 1.0)),
}


def hypervolume2(points, reference):
    inside = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    volume, ceiling = 0.0, reference[1]
    for x, y in inside:
        if y < ceiling:
            volume += (reference[0] - x) * (ceiling - y)
            ceiling = y
    return volume


def drive(study, space, budget, workers, finish):
    """Runs `budget` trials with `workers` in flight: asks while fewer are in
    flight, then finishes the oldest with `finish(trial, params)` (which
    tells the study), as the Rust side's `drive` does."""
    in_flight, asked = [], 0
    for _ in range(budget):
        while len(in_flight) < max(workers, 1) and asked < budget:
            trial = study.ask()
            in_flight.append((trial, suggest(trial, space)))
            asked += 1
        finish(*in_flight.pop(0))


def optuna_study2(name, seed, budget, workers):
    import optuna

    space, f, reference = TWO_OBJECTIVES[name]
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=optuna.samplers.TPESampler(seed=seed))
    seen, at50 = [], [math.nan]

    def finish(trial, p):
        v = f(p)
        study.tell(trial, v)
        seen.append(v)
        if len(seen) == 50:
            at50[0] = hypervolume2(seen, reference)

    drive(study, space, budget, workers, finish)
    return at50[0], hypervolume2(seen, reference)


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
    study = optuna.create_study(sampler=make_sampler(optuna, seed))
    state = {"finished": 0, "best_seen": math.inf, "best_true": math.inf, "at50": math.nan}

    def finish(trial, p):
        truth = f(p)
        seen = truth + (rng.gauss(0.0, noise) if noise > 0 else 0.0)
        study.tell(trial, seen)
        if seen < state["best_seen"]:
            state["best_seen"], state["best_true"] = seen, truth
        state["finished"] += 1
        if state["finished"] == 50:
            state["at50"] = state["best_true"] - optimum

    drive(study, space, budget, workers, finish)
    return state["at50"], state["best_true"] - optimum


def sampler_kind():
    """OPTUNA_SAMPLER: `tpe` (the default: TPESampler, Optuna's default
    sampler) or `gp` (GPSampler, which needs PyTorch and SciPy)."""
    import os

    kind = os.environ.get("OPTUNA_SAMPLER", "tpe")
    if kind not in ("tpe", "gp"):
        sys.exit(f"OPTUNA_SAMPLER={kind}: tpe or gp")
    return kind


def make_sampler(optuna, seed):
    """Optuna's sampler of `sampler_kind()`, seeded, every other argument at its default."""
    if sampler_kind() == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def run_optuna(seeds, budget, workers, only):
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    import os

    first = int(os.environ.get("SEED_FROM", "0"))  # seeds from there, as the Rust side
    side = "optuna" if sampler_kind() == "tpe" else "optuna-gp"
    for name in FUNCTIONS:
        if only and name not in only:
            continue
        for seed in range(first, first + seeds):
            r50, r100 = optuna_study(name, seed, budget, workers)
            print(json.dumps({"side": side, "fn": name, "seed": seed, "workers": workers,
                              "regret50": r50, "regret100": r100}), flush=True)
    for name in TWO_OBJECTIVES:
        if side != "optuna" or (only and name not in only):
            continue
        for seed in range(seeds):
            h50, h100 = optuna_study2(name, seed, budget, workers)
            print(json.dumps({"side": "optuna", "fn": name, "seed": seed, "workers": workers,
                              "hv50": h50, "hv100": h100}), flush=True)


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
    """Per worker count: the regret table (one objective) and the
    hypervolume table (two objectives), each Tunefleet sampler against
    Optuna's."""
    rows = []
    for path in paths:
        with open(path) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{")]
    groups = {}
    for r in rows:
        groups.setdefault((r["workers"], r["fn"], r["side"]), []).append(r)
    sides = [("tunefleet-gp", "Tunefleet gp"), ("tunefleet", "Tunefleet tpe")]
    sides = [(k, label) for k, label in sides if any(r["side"] == k for r in rows)]
    out = []
    for workers in sorted({r["workers"] for r in rows}):
        mode = "sequential" if workers == 1 else f"{workers} in flight"
        for what, names, key, better in (("regret", FUNCTIONS, "regret", "below"),
                                           ("hypervolume", TWO_OBJECTIVES, "hv", "above")):
            if not any((workers, n, "optuna") in groups for n in names):
                continue
            out.append(f"\n**{mode}, {what}** (median [IQR] over seeds; ratio = Tunefleet median / Optuna median, "
                       f"{better} 1 is better; p = permutation test of the difference of the medians)\n")
            head = "| function | budget | " + " | ".join(label for _, label in sides) + " | Optuna 5 TPE | "
            head += " | ".join(f"ratio {label.split()[-1]} | p" for _, label in sides) + " | seeds |"
            out.append(head)
            out.append("|" + "---|" * (head.count("|") - 1))
            for name in names:
                op = groups.get((workers, name, "optuna"))
                ours = [groups.get((workers, name, k)) for k, _ in sides]
                if not op or not all(ours):
                    continue
                for budget in (50, 100):
                    k = f"{key}{budget}"
                    b = [r[k] for r in op]
                    o1, om, o3 = quartiles(b)
                    cells, ratios = [], []
                    for mine in ours:
                        a = [r[k] for r in mine]
                        t1, tm, t3 = quartiles(a)
                        cells.append(f"{fmt(tm)} [{fmt(t1)}, {fmt(t3)}]")
                        ratio = tm / om if om > 0 else math.inf
                        ratios.append(f"{ratio:.3g} | {permutation_p(a, b):.2f}")
                    seeds = "/".join(str(len(m)) for m in ours) + f"/{len(op)}"
                    out.append(f"| {name} | {budget} | " + " | ".join(cells) + f" | {fmt(om)} [{fmt(o1)}, {fmt(o3)}] | "
                               + " | ".join(ratios) + f" | {seeds} |")
    print("\n".join(out))


FLOOR = 1e-4


def parallel(paths):
    """One objective, every side and worker count side by side (issue 37):
    median [IQR] of the regret after the budget, its ratio to the same
    side's sequential median (x1) and to Optuna's at the same workers (/O),
    both medians floored at FLOOR."""
    rows = []
    for path in paths:
        with open(path) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{") and "regret100" in line]
    groups = {}
    for r in rows:
        groups.setdefault((r["fn"], r["side"], r["workers"]), []).append(r["regret100"])
    sides = sorted({r["side"] for r in rows}, key=lambda s: (s == "optuna", s))
    workers = sorted({r["workers"] for r in rows})
    out = ["| function | side | " + " | ".join(f"{w} in flight: median [IQR] (x1, /O)" for w in workers) + " |",
           "|" + "---|" * (2 + len(workers))]
    wins = {}
    for name in FUNCTIONS:
        for side in sides:
            seq = groups.get((name, side, 1))
            if not seq and side.startswith("tunefleet-gp"):
                # Every gp rule asks alike with nothing in flight.
                seq = next((groups[k] for k in sorted(groups) if k[0] == name and k[2] == 1
                            and k[1].startswith("tunefleet-gp")), None)
            if not any((name, side, w) in groups for w in workers):
                continue
            cells = []
            for w in workers:
                v = groups.get((name, side, w))
                if not v:
                    cells.append("–")
                    continue
                q1, m, q3 = quartiles(v) if len(v) > 1 else (v[0], v[0], v[0])
                # Ratios of regrets floored at FLOOR: below it, a regret
                # is the end of a converged search, and 2e-6 / 1e-6 no loss.
                to1 = f"{max(m, FLOOR) / max(statistics.median(seq), FLOOR):.2f}" if seq else "–"
                op = groups.get((name, "optuna", w))
                to_o = f"{max(m, FLOOR) / max(statistics.median(op), FLOOR):.2f}" if op else "–"
                cells.append(f"{fmt(m)} [{fmt(q1)}, {fmt(q3)}] ({to1}, {to_o})")
                wins.setdefault((name, w), []).append((m, side))
            out.append(f"| {name} | {side} | " + " | ".join(cells) + " |")
    out.append("")
    tally = {}
    for (name, w), ms in wins.items():
        if w == 1:
            continue
        gps = [max(m, FLOOR) for m, s in ms if s.startswith("tunefleet-gp")]
        if not gps:
            continue
        best = min(gps)
        for m, s in ms:
            if max(m, FLOOR) == best and s.startswith("tunefleet-gp"):
                tally[(s, w)] = tally.get((s, w), 0) + 1
    for (s, w), n in sorted(tally.items()):
        out.append(f"- {s}: the best gp rule (ties at the floor counted for each) at {w} in flight on {n} functions")
    times = {}
    for r in rows:
        if "ask_ms" in r:
            times.setdefault((r["side"], r["workers"]), []).append(r["ask_ms"])
    for (s, w), t in sorted(times.items()):
        out.append(f"- {s}, {w} in flight: median ask {statistics.median(t):.1f} ms")
    print("\n".join(out))


def null(args):
    """How often a side meets a ratio criterion against itself (issue 37):
    `null LIMIT GROUP KEY FILE...` splits each (side, workers) study set's
    seeds into disjoint groups of GROUP consecutive seeds, and for every
    ordered pair of groups counts the functions whose median regret (KEY:
    regret50 or regret100, floored at FLOOR) in the first group is above
    LIMIT times the second's: the same sampler, two sets of seeds. A
    criterion "at most LIMIT times on every function" that a sampler
    cannot meet against itself at GROUP seeds cannot tell samplers apart."""
    limit, size, key = float(args[0]), int(args[1]), args[2]
    rows = []
    for path in args[3:]:
        with open(path) as fh:
            rows += [json.loads(line) for line in fh if line.startswith("{") and key in line]
    groups = {}
    for r in rows:
        groups.setdefault((r["side"], r["workers"], r["fn"]), {})[r["seed"]] = r[key]
    for side, workers in sorted({(s, w) for s, w, _ in groups}):
        fns = [n for n in FUNCTIONS if (side, workers, n) in groups]
        seeds = sorted(set.intersection(*(set(groups[(side, workers, n)]) for n in fns)))
        blocks = [seeds[i:i + size] for i in range(0, len(seeds) - size + 1, size)]
        if len(blocks) < 2:
            print(f"{side}, {workers} in flight: fewer than two groups of {size} seeds")
            continue
        med = {(n, b): max(statistics.median(groups[(side, workers, n)][s] for s in blk), FLOOR)
               for n in fns for b, blk in enumerate(blocks)}
        pairs = [(a, b) for a in range(len(blocks)) for b in range(len(blocks)) if a != b]
        above = {n: 0 for n in fns}
        met, counts, worst = 0, [], []
        for a, b in pairs:
            over = [n for n in fns if med[(n, a)] > limit * med[(n, b)]]
            for n in over:
                above[n] += 1
            met += not over
            counts.append(len(over))
            worst.append(max(med[(n, a)] / med[(n, b)] for n in fns))
        print(f"\n{side}, {workers} in flight, {key}: {len(blocks)} groups of {size} seeds, {len(pairs)} ordered pairs, "
              f"{len(fns)} functions")
        print(f"- pairs within {limit}x of itself on every function: {met} of {len(pairs)}; "
              f"functions above {limit}x per pair: median {statistics.median(counts)}; "
              f"the largest ratio per pair: median {statistics.median(worst):.2f}")
        print("- pairs above, by function: " + ", ".join(f"{n} {above[n]}" for n in fns))


if __name__ == "__main__":
    if sys.argv[1] == "optuna":
        run_optuna(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:])
    elif sys.argv[1] == "table":
        table(sys.argv[2:])
    elif sys.argv[1] == "parallel":
        parallel(sys.argv[2:])
    elif sys.argv[1] == "null":
        null(sys.argv[2:])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
