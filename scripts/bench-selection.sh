#!/usr/bin/env bash
# How often pipelined probing keeps the wrong configuration (issue 23), on
# this machine, in one run:
#
#   scripts/bench-selection.sh              # TRIALS=20 REPEATS=5
#   TRAIN_ARGS='"--hidden", "1024", "--batch-size", "32", "--passes", "1"' scripts/bench-selection.sh
#                                           # configurations closer together
#
# * The workload: tunefleet-train (hidden 2048, batch 128, 2 passes: about
#   0.1 s an epoch here, two gradient threads about 30 % faster than one
#   on two cores), its system space cores {1, 2} x threads {1, 2}.
# * Independent measurement: a plain study of the four configurations,
#   REPEATS runs of each (12 epochs, one process per run, one agent of one
#   slot); a configuration's time is the median over its runs of the
#   median epoch time after the first epoch (start-up excluded).
# * Pipelined: TRIALS trials of the same program (a hyper-parameter `seed`
#   only makes them distinct trials), each probing the four configurations
#   in windows of 3 epochs after one warm-up epoch (select = "time"; the
#   windows' noise decides whether the two best are measured again), then
#   keeping one for the rest of its 32 epochs (the probing takes at most
#   25: 1 + 3 x (4 windows + 2 rounds of 2 again)); the kept configuration
#   is the one the store records for the trial (results.system); a trial
#   that ended before it chose counts as wrong.
# * A kept configuration is wrong when its independently measured time is
#   more than 5 % above the best configuration's (two configurations within
#   5 % of each other are equally right). Printed: each configuration's
#   time and spread, the kept configurations, the wrong-selection rate, and
#   the margins (standard errors) the trials recorded.
#
# Needs: cargo build --release -p tunefleet-coordinator -p tunefleet-agent -p tunefleet-workloads
# How long: about 2 minutes on 2 vCPUs (nothing else should run).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
trials=${TRIALS:-20}
repeats=${REPEATS:-5}
for b in tunefleet tunefleet-agent tunefleet-train; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cargo build --release -p tunefleet-coordinator -p tunefleet-agent -p tunefleet-workloads" >&2; exit 2; }
done
work=$(mktemp -d)
trap 'if [ -n "${BENCH_KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi' EXIT
export PATH="$bin:$PATH"

common='timeout = 300
lookahead = 0
[objective]
metric = "accuracy"
direction = "maximize"
[system.cores]
kind = "int"
low = 1
high = 2
[system.threads]
kind = "int"
low = 1
high = 2'
train_args=${TRAIN_ARGS:-'"--hidden", "2048", "--batch-size", "128", "--passes", "2"'}
train='"tunefleet-train", '"$train_args"', "--threads", "{threads}"'
cat >"$work/plain.toml" <<TOML
name = "plain"
command = [$train, "--epochs", "12"]
repeats = $repeats
$common
[budget]
trials = $((4 * repeats))
[strategy]
kind = "grid"
TOML
cat >"$work/pipelined.toml" <<TOML
name = "pipelined"
command = [$train, "--epochs", "32", "--seed", "{seed}"]
$common
[budget]
trials = $trials
[strategy]
kind = "grid"
[hyper.seed]
kind = "int"
low = 1
high = $trials
[pipeline]
mode = "pipelined"
probe = "grid"
control = true
window = { epochs = 3, warmup = 1 }
select = "time"
[reuse]
enabled = false
TOML

# Runs a study to its end: one coordinator (embedded broker) and one agent of one slot.
run_study() {
  local name=$1 store=$work/$1.db log=$work/$1.log url='' token
  token=$(tunefleet token create --uses 100000 --store "$store" 2>/dev/null)
  tunefleet run "$work/$name.toml" --store "$store" --listen 127.0.0.1:0 --root "sel-$$-$name" --quiet >"$log" 2>&1 &
  local coordinator=$!
  for _ in $(seq 100); do
    url=$(grep -m1 '^broker: ' "$log" | cut -d' ' -f2) && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$log" >&2; kill "$coordinator"; return 1; }
  tunefleet-agent --broker "$url" --name "sel-$$-$name" --root "sel-$$-$name" --slots 1 --exit-when-idle=5s \
    --join "$token" >"$work/$name-agent.log" 2>&1 &
  local agent=$!
  wait "$coordinator"
  wait "$agent" || true
}

echo "tunefleet-train $train_args; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "independent measurement: $repeats runs of each configuration" >&2
run_study plain
echo "pipelined: $trials trials" >&2
run_study pipelined

python3 - "$work/plain.db" "$work/pipelined.db" <<'PY'
import json, sqlite3, statistics, sys

def epoch_times(measurement):
    e = sorted(json.loads(measurement)["epochs"], key=lambda e: e["epoch"])
    return [(b["elapsed_us"] - a["elapsed_us"]) / 1e6 for a, b in zip(e, e[1:])]

def name(system):
    s = json.loads(system) if isinstance(system, str) else system
    return f"cores={s.get('cores')} threads={s.get('threads')}"

plain = sqlite3.connect(sys.argv[1])
runs = {}
for params, measurement in plain.execute(
        "SELECT t.params, r.measurement FROM results r JOIN trials t ON t.study = r.study AND t.trial = r.trial WHERE r.success = 1"):
    p = json.loads(params)
    key = f"cores={p.get('cores')} threads={p.get('threads')}"
    runs.setdefault(key, []).append(statistics.median(epoch_times(measurement)))
time = {k: statistics.median(v) for k, v in runs.items()}
best = min(time, key=time.get)
print("| configuration | median epoch (s) over its runs | runs (each the median epoch after the first) |")
print("|---|---|---|")
for k in sorted(time, key=time.get):
    print(f"| {k}{' (best)' if k == best else ''} | {time[k]:.4f} | {', '.join(f'{v:.4f}' for v in sorted(runs[k]))} |")

piped = sqlite3.connect(sys.argv[2])
kept, margins = [], []
for system, measurement in piped.execute("SELECT system, measurement FROM results WHERE success = 1 ORDER BY trial"):
    s = json.loads(system) if system else {}
    kept.append(name(s) if s.get("cores") or s.get("threads") else "nothing kept")
    segs = json.loads(measurement).get("segments", [])
    sel = [s for s in segs if s.get("role") == "Selected"]
    margins.append(sel[-1].get("margin") if sel else None)
wrong = [k for k in kept if k not in time or time[k] > 1.05 * time[best]]
print()
print(f"pipelined trials: {len(kept)}; kept: " + ", ".join(f"{k} x{kept.count(k)}" for k in sorted(set(kept))))
print(f"wrong selections (kept more than 5 % slower than {best}): {len(wrong)} of {len(kept)} = {100 * len(wrong) / max(len(kept), 1):.0f} %")
measured = [m for m in margins if m is not None]
if measured:
    print(f"margins recorded (standard errors between the kept and the runner-up): median {statistics.median(measured):.1f}, "
          f"min {min(measured):.1f}, below 2 (kept after the re-probes ran out): {sum(m < 2 for m in measured)}")
PY
