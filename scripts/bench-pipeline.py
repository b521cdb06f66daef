"""Pipelined tuning against what a user would otherwise run (issue 23).

Driven by scripts/bench-pipeline.sh (read its header). For each workload
and run, four ways to tune the same hyper-parameter grid, each a real
`tunefleet run` with one agent of one slot:

  plain      the hyper-parameters at the default system configuration (the
             largest value of each system parameter, as a pipelined trial's
             first window runs it);
  two-phase  plain, then the system grid for plain's best hyper-parameters
             (its default-configuration trial left out of the count: phase
             one measured it);
  grid       every hyper x system combination (for reference);
  pipelined  the hyper grid, system parameters probed inside each trial
             with Tunefleet's defaults (one warm-up epoch, one-epoch
             windows, one parameter at a time, fastest kept).

Then the final job (grid's best hyper-parameters, all epochs) is re-measured
outside Tunefleet under every system configuration (taskset for cores, the
workload's own flag for threads), REPEATS times in interleaved rounds: each
mode's kept configuration against the best by median.
"""

import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import time

import benchstudy

EPOCHS = int(os.environ.get("BENCH_EPOCHS", "20"))
REPEATS = int(os.environ.get("REPEATS", "5"))
RUNS = int(os.environ.get("RUNS", "2"))

# A workload: its command template ({name} placeholders: hyper and system
# parameters), objective, hyper grid, system space, whether it speaks the
# control channel (threads change live).
WORKLOADS = {
    # Small mini-batches: a second gradient worker costs more than it gives,
    # so the default (cores 2, threads 2) is not the best configuration.
    "train": {
        "command": ["tunefleet-train", "--lr", "{lr}", "--batch-size", "8", "--hidden", "256",
                    "--passes", "10", "--epochs", str(EPOCHS), "--threads", "{threads}"],
        "objective": ("accuracy", "maximize"),
        "hyper": {"lr": [0.02, 0.1, 0.3]},
        "system": {"cores": [1, 2], "threads": [1, 2]},
        "control": True,
    },
    # A memory-bound transpose: the default (both cores, two threads) is best.
    "stream": {
        "command": ["tunefleet-stream", "--block-size", "{block_size}", "--size-mib", "128", "--passes", "12",
                    "--epochs", str(EPOCHS), "--threads", "{threads}"],
        "objective": ("bandwidth_gbs", "maximize"),
        "hyper": {"block_size": [4, 32, 256]},
        "system": {"cores": [1, 2], "threads": [1, 2]},
        "control": True,
    },
    # A third-party program that knows nothing of Tunefleet: xz's preset
    # tuned for the compression ratio of a fixed input, an epoch per
    # compression; xz -T0 starts as many threads as it has CPUs, so cores
    # (CPU affinity, changed live) is its system parameter.
    "xz": {
        "command": ["sh", "-c",
                    "f=$(mktemp) && seq 1 1200000 > $f && s=$(wc -c < $f) && "
                    f"for e in $(seq 1 {EPOCHS}); do c=$(xz -{{level}} -T0 -c $f | wc -c); "
                    "echo TUNEFLEET epoch=$e ratio=$(awk \"BEGIN {{print $s / $c}}\"); done; rm -f $f"],
        "objective": ("ratio", "maximize"),
        "hyper": {"level": [0, 1, 2, 3]},
        "system": {"cores": [1, 2]},
        "control": False,
    },
}


def render(arg, values, keep=False):
    """Fills `{name}` placeholders from `values` (`keep`: leave the others,
    and `{{`/`}}`, as they are, for Tunefleet to fill)."""
    def one(m):
        if m.group(0) in ("{{", "}}"):
            return m.group(0) if keep else m.group(0)[0]
        name = m.group(1)
        return str(values[name]) if name in values or not keep else m.group(0)
    return re.sub(r"\{\{|\}\}|\{(\w+)\}", one, arg)


def toml_value(v):
    return json.dumps(v)


def default_system(w):
    return {k: max(v) for k, v in w["system"].items()}


def study_toml(name, w, hyper, system, pipelined):
    """A study: `hyper` and `system` map names to value lists; a system
    parameter with one value is substituted into the command."""
    fixed = {k: v[0] for k, v in system.items() if len(v) == 1 and not pipelined}
    command = [render(a, fixed, keep=True) for a in w["command"]]
    metric, direction = w["objective"]
    lines = [
        f"name = {toml_value(name)}",
        f"command = {json.dumps(command)}",
        "timeout = 600",
        "[objective]",
        f"metric = {toml_value(metric)}",
        f"direction = {toml_value(direction)}",
        "[budget]",
        "trials = 1000",
        "[strategy]",
        'kind = "grid"',
    ]
    for k, values in hyper.items():
        lines += [f"[hyper.{k}]", 'kind = "categorical"', f"values = {json.dumps(values)}"]
    for k, values in system.items():
        if k in fixed:
            continue
        lines += [f"[system.{k}]", 'kind = "int"', f"low = {min(values)}", f"high = {max(values)}"]
    if pipelined:
        lines += ["[pipeline]", 'mode = "pipelined"']
        if w["control"]:
            lines += ["control = true"]
    return "\n".join(lines) + "\n"


def run_study(work, name, toml):
    """Runs one study to its end; returns its wall seconds."""
    path = f"{work}/{name}.toml"
    with open(path, "w") as f:
        f.write(toml)
    return benchstudy.run(work, name, path, dict(os.environ, XDG_STATE_HOME=f"{work}/state"))


def read_study(work, name, w):
    db = sqlite3.connect(f"file:{work}/{name}.db?mode=ro", uri=True)
    rows = db.execute(
        "SELECT r.trial, t.params, r.success, r.objective, r.wall_us, r.energy_j, r.energy_source, r.system"
        " FROM results r JOIN trials t USING (study, trial) WHERE r.study = ?",
        (name,),
    ).fetchall()
    trials = []
    for trial, params, success, objective, wall_us, energy_j, source, system in rows:
        params = json.loads(params)
        kept = json.loads(system) if system else {}
        trials.append({
            "hyper": {k: params[k] for k in w["hyper"]},
            # A pipelined trial's kept configuration, else its own.
            "system": {k: kept.get(k) if kept.get(k) is not None else params.get(k) for k in w["system"]},
            "ok": bool(success) and objective is not None,
            "objective": objective,
            "wall_s": (wall_us or 0) / 1e6,
            "energy_j": energy_j or 0.0,
            "source": source or "none",
        })
    return trials


def best(trials, w):
    ok = [t for t in trials if t["ok"]]
    if not ok:
        sys.exit("bench-pipeline: a study had no successful trial; BENCH_KEEP=1 keeps its logs")
    sign = 1 if w["objective"][1] == "maximize" else -1
    return max(ok, key=lambda t: sign * t["objective"])


def key(system):
    return tuple(sorted(system.items()))


def tune(work, run, wname, w):
    """The four modes; per mode: seconds, energy, sources, trials, best
    hyper-parameters and objective, the system configuration kept."""
    modes = {}
    default = {k: [v] for k, v in default_system(w).items()}
    system = w["system"]

    name = f"{wname}-plain-{run}"
    secs = run_study(work, name, study_toml(name, w, w["hyper"], default, False))
    plain = read_study(work, name, w)
    b = best(plain, w)
    modes["plain"] = {"seconds": secs, "trials": plain, "best": b, "kept": default_system(w)}

    name = f"{wname}-phase2-{run}"
    winner = {k: [v] for k, v in b["hyper"].items()}
    secs2 = run_study(work, name, study_toml(name, w, winner, system, False))
    phase2 = read_study(work, name, w)
    # The default configuration's trial: phase one measured it.
    again = [t for t in phase2 if key(t["system"]) == key(default_system(w))]
    less = sum(t["wall_s"] for t in again)
    fastest = min((t for t in phase2 if t["ok"]), key=lambda t: t["wall_s"])
    modes["two-phase"] = {
        "seconds": secs + secs2 - less,
        "trials": plain + [t for t in phase2 if t not in again],
        "best": b,
        "kept": fastest["system"],
    }

    name = f"{wname}-grid-{run}"
    secs = run_study(work, name, study_toml(name, w, w["hyper"], system, False))
    grid = read_study(work, name, w)
    gb = best(grid, w)
    same = [t for t in grid if t["ok"] and t["hyper"] == gb["hyper"]]
    modes["grid"] = {"seconds": secs, "trials": grid, "best": gb,
                     "kept": min(same, key=lambda t: t["wall_s"])["system"]}

    name = f"{wname}-pipelined-{run}"
    secs = run_study(work, name, study_toml(name, w, w["hyper"], system, True))
    pipe = read_study(work, name, w)
    pb = best(pipe, w)
    modes["pipelined"] = {"seconds": secs, "trials": pipe, "best": pb, "kept": pb["system"]}
    for m in modes.values():
        m["energy_j"] = sum(t["energy_j"] for t in m["trials"])
        m["sources"] = sorted({t["source"] for t in m["trials"]})
    return modes


def configurations(w):
    out = [{}]
    for k, values in w["system"].items():
        out = [dict(c, **{k: v}) for c in out for v in values]
    return out


def remeasure(w, hyper):
    """Wall seconds of the final job under each system configuration,
    REPEATS interleaved rounds, outside Tunefleet."""
    times = {key(c): [] for c in configurations(w)}
    for _ in range(REPEATS):
        for c in configurations(w):
            values = dict(hyper, **c)
            argv = [render(a, values) for a in w["command"]]
            cpus = "0" if c.get("cores", 2) == 1 else "0-1"
            start = time.monotonic()
            subprocess.run(["taskset", "-c", cpus] + argv, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            times[key(c)].append(time.monotonic() - start)
    return times


def text(system):
    return ", ".join(f"{k} {v}" for k, v in sorted(system.items())) or "-"


def main():
    work = sys.argv[1]
    only = sys.argv[2:] or list(WORKLOADS)
    results = {}
    for run in range(1, RUNS + 1):
        for wname in only:
            w = WORKLOADS[wname]
            print(f"run {run}: {wname}: tuning four ways", file=sys.stderr, flush=True)
            modes = tune(work, run, wname, w)
            print(f"run {run}: {wname}: re-measuring the final job, {REPEATS} rounds", file=sys.stderr, flush=True)
            times = remeasure(w, modes["grid"]["best"]["hyper"])
            results[(run, wname)] = (modes, times)
            with open(f"{work}/results.json", "w") as f:
                json.dump({f"{r}/{n}": {"modes": {m: {k: v for k, v in d.items() if k != "trials"} | {"n": len(d["trials"])}
                                                     for m, d in ms.items()},
                                         "times": {text(dict(k)): v for k, v in ts.items()}}
                           for (r, n), (ms, ts) in results.items()}, f, indent=1)
    report(results, only)


def report(results, only):
    print(f"Epochs per trial: {EPOCHS}; final job re-measured {REPEATS} times per configuration.\n")
    for (run, wname), (modes, times) in sorted(results.items()):
        w = WORKLOADS[wname]
        med = {k: statistics.median(v) for k, v in times.items()}
        fastest = min(med, key=med.get)
        default = key(default_system(w))
        print(f"### run {run}: {wname} (best configuration re-measured: {text(dict(fastest))}; "
              f"default {'is' if fastest == default else 'is not'} the best)\n")
        print("| mode | tuning s | energy J (source) | trials | best hyper-parameters: objective | kept configuration "
              "| final job s, median [min, max] | vs best |")
        print("|---|---|---|---|---|---|---|---|")
        for m in ("plain", "two-phase", "grid", "pipelined"):
            d = modes[m]
            k = key(d["kept"])
            t = times.get(k)
            final = f"{med[k]:.2f} [{min(t):.2f}, {max(t):.2f}]" if t else "?"
            vs = f"{med[k] / med[fastest]:.3f}" if t else "?"
            print(f"| {m} | {d['seconds']:.1f} | {d['energy_j']:.0f} ({', '.join(d['sources'])}) | {len(d['trials'])} "
                  f"| {text(d['best']['hyper'])}: {d['best']['objective']:.4g} | {text(d['kept'])} | {final} | {vs} |")
        p, a, b = modes["pipelined"], modes["plain"], modes["two-phase"]
        better = a if a["seconds"] <= b["seconds"] else b
        better_e = a if a["energy_j"] <= b["energy_j"] else b
        print()
        print(f"pipelined / better of plain and two-phase: time {p['seconds'] / better['seconds']:.2f}, "
              f"energy {p['energy_j'] / max(better_e['energy_j'], 1e-9):.2f}; "
              f"pipelined / plain: time {p['seconds'] / a['seconds']:.2f}, energy "
              f"{p['energy_j'] / max(a['energy_j'], 1e-9):.2f}; pipelined / grid: time "
              f"{p['seconds'] / modes['grid']['seconds']:.2f}\n")
        print("re-measured (s, median [min, max]): " + "; ".join(
            f"{text(dict(k))} {med[k]:.2f} [{min(v):.2f}, {max(v):.2f}]" for k, v in times.items()) + "\n")


if __name__ == "__main__":
    main()
