#!/usr/bin/env bash
# Pipelined vs sequential tuning (issue 9): the same search run both ways on
# this machine, for the two bundled workloads.
#
#   scripts/bench-pipeline.sh              # run the four studies, print, write the chart
#   scripts/bench-pipeline.sh --report DIR # only read the stores a run kept in DIR (BENCH_KEEP=1)
#                                          # and print and chart them again
#
# What it runs: for tunefleet-train (accuracy, maximize; lr x batch_size,
# 6 configurations; --passes 12) and tunefleet-stream (bandwidth_gbs, the mean over the epochs of the kept configuration,
# maximize; block_size, 3 configurations; 128 MiB, --passes 24), two studies
# with the same hyper space, the same system space (cores {1,2} x threads
# {1,2}), the same epochs per trial (BENCH_EPOCHS, default 10; an epoch takes
# about 0.2 to 0.6 s here) and a grid strategy whose budget covers the grid:
#   sequential  a trial per hyper x system configuration (24 and 12 trials);
#   pipelined   a trial per hyper configuration (6 and 3 trials), which runs
#               1 warm-up epoch, one 1-epoch window under each of the 4
#               system configurations (probe = "grid"), then the fastest
#               (select = "time") for the rest; threads change live through
#               the workloads' control channel.
# Stream's objective is its mean bandwidth over the epochs of the configuration
# each trial kept (objective.aggregate = "kept_mean"): over all epochs it would
# count a pipelined trial's probe windows under slow configurations against
# the tile size.
# Each study is one `tunefleet run` (embedded broker on a free port, its own
# topic root and store) with one `tunefleet-agent` of 1 slot, started as
# tests/src/lib.rs starts them, so trials never compete for the 2 cores. The tuning
# time is the coordinator's wall time from start to exit.
#
# How long: about 3 minutes on 2 vCPUs when the machine is otherwise idle
# (the two sequential studies are 80 % of it).
# Needs the release binaries:
#   cargo build --release -p tunefleet-coordinator -p tunefleet-agent -p tunefleet-workloads
#
# What it prints: per workload and mode the tuning time, energy (sum of the
# trials' results.energy_j, with results.energy_source: a model estimate from
# CPU time where there is no RAPL), trials, epochs, best hyper-parameters and
# objective, and the system configuration kept (pipelined: the one selected in
# the trial of the sequential best hyper-parameters, with its epoch time from
# the Selected segment; sequential: the fastest of that hyper configuration's
# 4 trials, epoch time = wall_us / epochs); then the ratios against the goals
# of issue 9. Writes docs/bench/pipeline.svg (grouped bars: tuning time and
# energy per workload, sequential vs pipelined). The chart is hand-written SVG
# from python3's standard library: a few bars need no plotting dependency.
#
# BENCH_KEEP=1 keeps the temp dir (studies, stores, logs) and prints where.
set -euo pipefail
cd "$(dirname "$0")/.."

epochs=${BENCH_EPOCHS:-10}
chart=docs/bench/pipeline.svg
report_only=
case "${1:-}" in
  "") ;;
  --report)
    report_only=${2:?bench-pipeline.sh --report DIR}
    ;;
  *) echo "bench-pipeline.sh: unknown argument $1 (scripts/bench-pipeline.sh [--report DIR])" >&2; exit 2 ;;
esac

command -v python3 >/dev/null || { echo "bench-pipeline.sh: needs python3" >&2; exit 1; }

# --- the studies --------------------------------------------------------------

# study NAME MODE WORKLOAD: writes $work/NAME.toml.
study() {
  local name=$1 mode=$2 workload=$3 command objective hyper pipeline=
  case $workload in
    train)
      command="\"tunefleet-train\", \"--lr\", \"{lr}\", \"--batch-size\", \"{batch_size}\", \"--epochs\", \"$epochs\", \"--passes\", \"12\", \"--threads\", \"{threads}\""
      objective='metric = "accuracy"
direction = "maximize"'
      hyper='[hyper.lr]
kind = "categorical"
values = [0.02, 0.1, 0.3]

[hyper.batch_size]
kind = "categorical"
values = [32, 64]'
      ;;
    stream)
      command="\"tunefleet-stream\", \"--block-size\", \"{block_size}\", \"--size-mib\", \"128\", \"--epochs\", \"$epochs\", \"--passes\", \"24\", \"--threads\", \"{threads}\""
      objective='metric = "bandwidth_gbs"
direction = "maximize"
aggregate = "kept_mean"'
      hyper='[hyper.block_size]
kind = "categorical"
values = [4, 32, 256]'
      ;;
  esac
  if [ "$mode" = pipelined ]; then
    pipeline='[pipeline]
mode = "pipelined"
probe = "grid"
window = { epochs = 1, warmup = 1 }
select = "time"
control = true'
  fi
  cat >"$work/$name.toml" <<EOF
name = "$name"
command = [$command]
timeout = 300

[objective]
$objective

[budget]
trials = 100

[strategy]
kind = "grid"

$hyper

[system.cores]
kind = "int"
low = 1
high = 2

[system.threads]
kind = "int"
low = 1
high = 2

$pipeline
EOF
}

# --- running one study ------------------------------------------------------

coord_pid=
agent_pid=
stop_children() {
  for pid in $agent_pid $coord_pid; do
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  agent_pid='' coord_pid=''
}

# run_study NAME: runs $work/NAME.toml into $work/NAME.db with one agent of
# one slot; writes the wall seconds of the study to $work/NAME.seconds.
run_study() {
  local name=$1 root="bench-$1-$$" url='' start end deadline
  cut -d' ' -f1 /proc/loadavg >"$work/$name.load"
  start=$(date +%s%N)
  XDG_STATE_HOME=$work/state tunefleet run "$work/$name.toml" --store "$work/$name.db" \
    --root "$root" --quiet --listen 127.0.0.1:0 >"$work/$name.coordinator.out" 2>"$work/$name.coordinator.err" &
  coord_pid=$!
  # The coordinator prints `broker: URL` once its broker listens.
  deadline=$((SECONDS + 30))
  while [ -z "$url" ]; do
    url=$(sed -n 's/^broker: //p' "$work/$name.coordinator.out" | head -n 1)
    if [ -z "$url" ]; then
      if ! kill -0 "$coord_pid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
        echo "bench-pipeline.sh: the coordinator of $name printed no broker URL:" >&2
        cat "$work/$name.coordinator.err" >&2
        exit 1
      fi
      sleep 0.05
    fi
  done
  XDG_STATE_HOME=$work/state tunefleet-agent --broker "$url" --name "$root-agent" --root "$root" --slots 1 \
    >"$work/$name.agent.out" 2>"$work/$name.agent.err" &
  agent_pid=$!
  local status=0
  wait "$coord_pid" || status=$?
  end=$(date +%s%N)
  coord_pid=''
  stop_children
  if [ $status -ne 0 ]; then
    echo "bench-pipeline.sh: tunefleet run $name exited with $status:" >&2
    tail -n 20 "$work/$name.coordinator.err" >&2
    exit 1
  fi
  python3 -c "print(($end - $start) / 1e9)" >"$work/$name.seconds"
  cut -d' ' -f1 /proc/loadavg >>"$work/$name.load"
  printf '%-20s %7.1f s  (load average before, after: %s)\n' "$name" "$(cat "$work/$name.seconds")" \
    "$(paste -sd' ' "$work/$name.load")" >&2
}

if [ -z "$report_only" ]; then
  bin=$PWD/target/release
  for b in tunefleet tunefleet-agent tunefleet-train tunefleet-stream; do
    [ -x "$bin/$b" ] || {
      echo "bench-pipeline.sh: $bin/$b is missing: cargo build --release -p tunefleet-coordinator -p tunefleet-agent -p tunefleet-workloads" >&2
      exit 1
    }
  done
  export PATH="$bin:$PATH"
  work=$(mktemp -d "${TMPDIR:-/tmp}/tunefleet-bench-pipeline.XXXXXX")
  cleanup() {
    stop_children
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench-pipeline.sh: kept $work" >&2; else rm -rf "$work"; fi
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  for workload in train stream; do
    for mode in sequential pipelined; do
      study "$workload-$mode" "$mode" "$workload"
      run_study "$workload-$mode"
    done
  done
else
  work=$report_only
fi

# --- reading the stores, the table, the chart ------------------------------

mkdir -p "$(dirname "$chart")"
python3 - "$work" "$chart" <<'PY'
import json, sqlite3, sys
from html import escape

work, chart = sys.argv[1], sys.argv[2]
WORKLOADS = {"train": ["batch_size", "lr"], "stream": ["block_size"]}
SYSTEM = ["cores", "threads"]
# Per-epoch metrics that depend on the system configuration: compared in the
# configuration each mode keeps, since a pipelined trial's objective mixes
# epochs of every probe window.
EPOCH_METRIC = {"stream": "bandwidth_gbs"}


def per_epoch_s(wall_us, epochs):
    return wall_us / 1e6 / max(epochs, 1)


def read(workload, mode):
    name = f"{workload}-{mode}"
    db = sqlite3.connect(f"file:{work}/{name}.db?mode=ro", uri=True)
    direction = db.execute("SELECT direction FROM studies WHERE name = ?", (name,)).fetchone()[0]
    rows = db.execute(
        "SELECT r.trial, t.params, r.success, r.objective, r.wall_us, r.energy_j, r.energy_source,"
        " r.measurement, r.system FROM results r JOIN trials t USING (study, trial) WHERE r.study = ?",
        (name,),
    ).fetchall()
    trials = []
    for trial, params, success, objective, wall_us, energy_j, source, m, system in rows:
        m = json.loads(m)
        params = json.loads(params)
        trials.append({
            "trial": trial,
            "hyper": {k: params[k] for k in WORKLOADS[workload]},
            "system": {k: params[k] for k in SYSTEM if k in params},
            "success": bool(success),
            "objective": objective,
            "wall_us": wall_us,
            "energy_j": energy_j or 0.0,
            "source": source or "none",
            "epochs": m.get("epochs", []),
            "selected": json.loads(system) if system else None,
        })
    segments = {}
    for trial, role, system, first, last, wall_us in db.execute(
        "SELECT trial, role, system, first_epoch, last_epoch, wall_us FROM segments WHERE study = ? ORDER BY trial, idx",
        (name,),
    ):
        segments.setdefault(trial, []).append(
            {"role": role, "system": json.loads(system), "epochs": last - first + 1, "wall_us": wall_us}
        )
    ok = [t for t in trials if t["success"] and t["objective"] is not None]
    pick = max if direction == "maximize" else min
    best = pick(ok, key=lambda t: t["objective"])
    try:
        load = " -> ".join(open(f"{work}/{name}.load").read().split())
    except OSError:
        load = "?"
    return {
        "load": load,
        "seconds": float(open(f"{work}/{name}.seconds").read()),
        "trials": len(trials),
        "failed": len(trials) - len(ok),
        "epochs": sum(len(t["epochs"]) for t in trials),
        "energy_j": sum(t["energy_j"] for t in trials),
        "sources": sorted({t["source"] for t in trials}),
        "best": best,
        "all": trials,
        "segments": segments,
    }


def sys_str(s):
    return "cores %s, threads %s" % (s.get("cores"), s.get("threads"))


def hyper_str(h):
    return ", ".join(f"{k} {v}" for k, v in sorted(h.items()))


def steady_s(t):
    """Epoch time without start-up and the first epoch (like the pipelined warm-up)."""
    e = t["epochs"]
    if len(e) < 2:
        return per_epoch_s(t["wall_us"], len(e))
    return (e[-1]["elapsed_us"] - e[0]["elapsed_us"]) / 1e6 / (len(e) - 1)


results = {}
lines = []
out = lines.append
for workload in WORKLOADS:
    seq, pipe = read(workload, "sequential"), read(workload, "pipelined")
    results[workload] = (seq, pipe)
    # The system configurations compared: those of the sequential best
    # hyper-parameters, measured by their own trials, and the one the
    # pipelined trial of the same hyper-parameters selected.
    hyper = seq["best"]["hyper"]
    same = [t for t in seq["all"] if t["hyper"] == hyper and t["success"]]
    for t in same:
        t["epoch_s"] = per_epoch_s(t["wall_us"], len(t["epochs"]))
    fastest = min(same, key=lambda t: t["epoch_s"])
    ptrial = next(t for t in pipe["all"] if t["hyper"] == hyper)
    psegs = pipe["segments"].get(ptrial["trial"], [])
    sel = next((s for s in psegs if s["role"].lower() == "selected"), None)
    selected = ptrial["selected"] or (sel or {}).get("system", {})
    sel_epoch_s = per_epoch_s(sel["wall_us"], sel["epochs"]) if sel else float("nan")
    seq_of_selected = next((t for t in same if all(t["system"].get(k) == selected.get(k) for k in SYSTEM)), None)
    seq["kept"], seq["kept_s"] = fastest["system"], fastest["epoch_s"]
    pipe["kept"], pipe["kept_s"] = selected, sel_epoch_s

    out(f"\n## {workload}: hyper-parameters {', '.join(WORKLOADS[workload])}; best hyper-parameters of sequential: {hyper_str(hyper)}\n")
    out("| mode | tuning time (s) | energy (J) | trials | epochs | best hyper-parameters | objective | system config kept | its epoch time (s) |")
    out("|---|---|---|---|---|---|---|---|---|")
    for mode, r in (("sequential", seq), ("pipelined", pipe)):
        fail = f" ({r['failed']} failed)" if r["failed"] else ""
        out(f"| {mode} | {r['seconds']:.1f} | {r['energy_j']:.1f} ({'/'.join(r['sources'])}) | {r['trials']}{fail} | {r['epochs']}"
            f" | {hyper_str(r['best']['hyper'])} | {r['best']['objective']:.4f} | {sys_str(r['kept'])} | {r['kept_s']:.3f} |")
    out("\nSequential trials of those hyper-parameters (epoch time = wall_us / epochs; steady = last minus first epoch's end / (epochs - 1)):\n")
    out("| system config | epoch time (s) | steady epoch time (s) | objective |")
    out("|---|---|---|---|")
    for t in sorted(same, key=lambda t: t["epoch_s"]):
        out(f"| {sys_str(t['system'])} | {t['epoch_s']:.3f} | {steady_s(t):.3f} | {t['objective']:.4f} |")
    out(f"\nPipelined trial of those hyper-parameters (objective {ptrial['objective']:.4f}), segments:\n")
    out("| role | system config | epochs | epoch time (s) |")
    out("|---|---|---|---|")
    for s in psegs:
        out(f"| {s['role']} | {sys_str(s['system'])} | {s['epochs']} | {per_epoch_s(s['wall_us'], s['epochs']):.3f} |")

    time_ratio = pipe["seconds"] / seq["seconds"]
    energy_ratio = pipe["energy_j"] / seq["energy_j"] if seq["energy_j"] else float("nan")
    obj_diff = (pipe["best"]["objective"] - seq["best"]["objective"]) / abs(seq["best"]["objective"]) * 100
    sel_vs = (sel_epoch_s / fastest["epoch_s"] - 1) * 100
    pick_vs = (seq_of_selected["epoch_s"] / fastest["epoch_s"] - 1) * 100 if seq_of_selected else float("nan")
    def goal(ok):
        return "met" if ok else "MISSED"
    metric = EPOCH_METRIC.get(workload)
    if metric and sel:
        def mean(xs):
            return sum(xs) / len(xs) if xs else float("nan")
        first = sum(s["epochs"] for s in psegs if s["role"].lower() != "selected") + 1
        p_vals = [e["metrics"][metric] for e in ptrial["epochs"] if e["epoch"] >= first and metric in e["metrics"]]
        s_vals = [e["metrics"][metric] for e in fastest["epochs"][1:] if metric in e["metrics"]]
        out(f"\nPer-epoch {metric} in the configuration kept, mean: sequential {mean(s_vals):.3f} "
            f"(epochs 2 to {len(fastest['epochs'])} of its fastest trial), pipelined {mean(p_vals):.3f} "
            f"(the {len(p_vals)} epochs of the Selected segment): {(mean(p_vals) / mean(s_vals) - 1) * 100:+.1f} %.")
    out(f"\nLoad average (1 min) of the machine, start -> end: sequential {seq['load']}, pipelined {pipe['load']} (2 vCPUs).")
    out("\n| ratio | value | goal |")
    out("|---|---|---|")
    out(f"| tuning time, pipelined / sequential | {time_ratio:.2f} ({(1 - time_ratio) * 100:.0f} % less) | ≤ 0.50: {goal(time_ratio <= 0.5)} |")
    out(f"| energy, pipelined / sequential | {energy_ratio:.2f} ({(1 - energy_ratio) * 100:.0f} % less) | ≤ 0.50: {goal(energy_ratio <= 0.5)} |")
    out(f"| best objective, pipelined vs sequential | {obj_diff:+.2f} % | within 2 %: {goal(abs(obj_diff) <= 2 or obj_diff > 0)} |")
    out(f"| selected config's epoch time (Selected segment) vs fastest sequential | {sel_vs:+.1f} % | within 5 %: {goal(sel_vs <= 5)} |")
    out(f"| selected config as sequential measured it vs fastest sequential | {pick_vs:+.1f} % | within 5 %: {goal(pick_vs <= 5)} |")

print("\n".join(lines).lstrip("\n"))

# The chart: per workload two groups (tuning time, energy), each a bar for
# sequential and one for pipelined; each group scaled to its own maximum, the
# value written on the bar.
W, H = 760, 360
left, top, bottom = 40, 60, 300
colors = {"sequential": "#8c96a8", "pipelined": "#2f7ed8"}
groups = []
for workload, (seq, pipe) in results.items():
    groups.append((f"{workload}: tuning time", "s", seq["seconds"], pipe["seconds"]))
    groups.append((f"{workload}: energy ({'/'.join(seq['sources'])})", "J", seq["energy_j"], pipe["energy_j"]))
slot = (W - 2 * left) / len(groups)
bar = slot * 0.3
svg = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
    f'<rect width="{W}" height="{H}" fill="white"/>',
    f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="16">Pipelined vs sequential tuning (issue 9), 2 vCPUs</text>',
    f'<line x1="{left}" y1="{bottom}" x2="{W - left}" y2="{bottom}" stroke="black"/>',
]
for mode, i in (("sequential", 0), ("pipelined", 1)):
    x = W - 260 + i * 120
    svg.append(f'<rect x="{x}" y="36" width="12" height="12" fill="{colors[mode]}"/>')
    svg.append(f'<text x="{x + 16}" y="46">{mode}</text>')
for g, (label, unit, s, p) in enumerate(groups):
    top_value = max(s, p) or 1.0
    x0 = left + g * slot + (slot - 2 * bar) / 2
    for i, (mode, v) in enumerate((("sequential", s), ("pipelined", p))):
        h = (bottom - top - 20) * v / top_value
        x = x0 + i * bar
        svg.append(f'<rect x="{x:.1f}" y="{bottom - h:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" fill="{colors[mode]}"/>')
        svg.append(f'<text x="{x + bar / 2 - 1:.1f}" y="{bottom - h - 4:.1f}" text-anchor="middle">{v:.0f} {unit}</text>')
    cx = left + g * slot + slot / 2
    svg.append(f'<text x="{cx:.1f}" y="{bottom + 18}" text-anchor="middle">{escape(label)}</text>')
    svg.append(f'<text x="{cx:.1f}" y="{bottom + 34}" text-anchor="middle" fill="#555">pipelined / sequential = {p / s if s else float("nan"):.2f}</text>')
svg.append(f'<text x="{left}" y="{H - 8}" fill="#555" font-size="11">Energy: the agent\'s model estimate from CPU time and pinned cores (no RAPL), not a meter. Each pair scaled to its maximum.</text>')
svg.append("</svg>")
with open(chart, "w") as f:
    f.write("\n".join(svg) + "\n")
print(f"\nchart: {chart}")
PY
