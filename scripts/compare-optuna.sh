#!/usr/bin/env bash
# Tunefleet and Optuna side by side on the same no-op study (issue 12), on
# this machine:
#
#   scripts/compare-optuna.sh            # OPTUNA_TRIALS=600 TUNEFLEET_TRIALS=1500
#
# * Optuna: its RDB storage on SQLite (one file), 2 worker processes that
#   load the study and optimize a no-op objective (one integer parameter,
#   like the Tunefleet study, returned as is), RandomSampler (Tunefleet's
#   strategy here is random too: no model to fit on either side).
# * Tunefleet: `tunefleet run` (embedded broker, durable SQLite store) and
#   2 real `tunefleet-agent` processes of 1 slot each running `true`: each
#   trial is a real process (started directly, one exec, with counters from
#   its first instruction, energy estimate, store).
# * Process creation on the same cores: two shell loops of `/bin/true`
#   (what the whole path could reach at best).
#
# Two rounds of the three, one after the other in turn, so that other work
# on the machine weighs on each alike; the better round of each is shown,
# and every round is printed. Trials/s are counted in each one's own store,
# from the first trial's start to the last trial's end, so neither side's
# start-up counts. Optuna goes into a virtual environment under target/
# (made once, checked by importing it; PyPI must be reachable the first
# time; OPTUNA_VENV to put it elsewhere).
#
# Needs: python3 (with venv), cargo build --release -p tunefleet-coordinator -p tunefleet-agent
# How long: about 40 s once the environment exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
venv=${OPTUNA_VENV:-$PWD/target/optuna-venv}
optuna_trials=${OPTUNA_TRIALS:-600}
tunefleet_trials=${TUNEFLEET_TRIALS:-1500}
for b in tunefleet tunefleet-agent; do
  [ -x "$bin/$b" ] || { echo "missing $bin/$b: cargo build --release -p tunefleet-coordinator -p tunefleet-agent" >&2; exit 2; }
done

work=$(mktemp -d)
cleanup() {
  if [ -n "${BENCH_KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
export XDG_STATE_HOME=$work/state

# shellcheck source=scripts/optuna-venv.sh
. scripts/optuna-venv.sh

# The Optuna worker, the readers of both stores, and the Tunefleet study.
cat >"$work/optuna_worker.py" <<'PY'
import sys
import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
storage, n = sys.argv[1], int(sys.argv[2])
study = optuna.load_study(study_name="noop", storage=storage, sampler=optuna.samplers.RandomSampler())
study.optimize(lambda trial: trial.suggest_int("x", 0, 1_000_000_000), n_trials=n)
PY
cat >"$work/optuna_rate.py" <<'PY'
import sqlite3, sys
from datetime import datetime

db = sqlite3.connect(sys.argv[1])
n, first, last = db.execute(
    "SELECT COUNT(*), MIN(datetime_start), MAX(datetime_complete) FROM trials WHERE state = 'COMPLETE'"
).fetchone()
print(n, round(n / (datetime.fromisoformat(last) - datetime.fromisoformat(first)).total_seconds()))
PY
cat >"$work/tunefleet_rate.py" <<'PY'
import sqlite3, sys

db = sqlite3.connect(sys.argv[1])
n, first, last = db.execute(
    "SELECT (SELECT COUNT(*) FROM results), (SELECT MIN(assigned_ms) FROM attempts),"
    " (SELECT MAX(received_ms) FROM results)"
).fetchone()
print(n, round(n / ((last - first) / 1000)))
PY
cat >"$work/noop.toml" <<TOML
name = "noop"
command = ["true", "{x}"]
timeout = 60
max_attempts = 3
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = $tunefleet_trials
[strategy]
kind = "random"
seed = 1
[hyper.x]
kind = "int"
low = 0
high = 1000000000
TOML

# Processes per second of two loops of /bin/true.
spawn_round() {
  local n=1000 t0 t1
  t0=$(date +%s.%N)
  for _ in 1 2; do (for _ in $(seq "$n"); do /bin/true; done) & done
  wait
  t1=$(date +%s.%N)
  "$py" -c "print(round(2 * $n / ($t1 - $t0)))"
}

# "trials trials/s" of an Optuna study in a new SQLite file, two workers.
optuna_round() {
  local storage=sqlite:///$work/optuna-$1.db workers=()
  "$py" -c "import optuna; optuna.create_study(study_name='noop', storage='$storage')" 2>/dev/null
  for _ in 1 2; do
    "$py" "$work/optuna_worker.py" "$storage" $((optuna_trials / 2)) &
    workers+=($!)
  done
  wait "${workers[@]}"
  "$py" "$work/optuna_rate.py" "$work/optuna-$1.db"
}

# "trials trials/s" of a Tunefleet study in a new store, two agents.
tunefleet_round() {
  local store=$work/tunefleet-$1.db root=cmp-$$-$1 log=$work/coordinator-$1.log url='' agents=()
  "$bin/tunefleet" run "$work/noop.toml" --store "$store" --listen 127.0.0.1:0 --root "$root" --quiet >"$log" 2>&1 &
  local coordinator=$!
  for _ in $(seq 100); do
    url=$(grep -m1 '^broker: ' "$log" | cut -d' ' -f2) && break
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "the coordinator printed no broker address:" >&2
    cat "$log" >&2
    kill "$coordinator" 2>/dev/null || true
    return 1
  fi
  for i in 1 2; do
    # Idle for 10 s (their coordinator gone, should this script be stopped): they exit.
    "$bin/tunefleet-agent" --broker "$url" --name "cmp-$1-$i" --root "$root" --slots 1 --exit-when-idle=10s \
      >"$work/agent-$1-$i.log" 2>&1 &
    agents+=($!)
  done
  wait "$coordinator"
  kill "${agents[@]}" 2>/dev/null || true
  wait "${agents[@]}" 2>/dev/null || true
  "$py" "$work/tunefleet_rate.py" "$store"
}

spawn=() optuna=() tunefleet=()
for r in 1 2; do
  spawn+=("$(spawn_round)")
  optuna+=("$(optuna_round "$r")")
  tunefleet+=("$(tunefleet_round "$r")")
done
# The round with the most trials/s (second field), and every round's rate.
best() { printf '%s\n' "$@" | sort -k2 -n | tail -1; }
rates() { printf '%s\n' "$@" | awk '{ print $NF }' | paste -sd/ -; }
read -r optuna_n optuna_rate <<<"$(best "${optuna[@]}")"
read -r tunefleet_n tunefleet_rate <<<"$(best "${tunefleet[@]}")"
spawn_rate=$(printf '%s\n' "${spawn[@]}" | sort -n | tail -1)

echo "| what | trials | trials/s: best of 2 rounds (each round) |"
echo "|---|---|---|"
echo "| Optuna $optuna_version, SQLite storage, 2 worker processes, RandomSampler, no-op objective | $optuna_n | $optuna_rate ($(rates "${optuna[@]}")) |"
echo "| Tunefleet, coordinator + 2 agents (1 slot each) running \`true\`, durable store | $tunefleet_n | $tunefleet_rate ($(rates "${tunefleet[@]}")) |"
echo "| process creation, two loops of \`/bin/true\` | 2000 | $spawn_rate ($(rates "${spawn[@]}")) |"
echo
"$py" -c "print(f'Tunefleet / Optuna: {$tunefleet_rate / $optuna_rate:.1f}x; Tunefleet at {100 * $tunefleet_rate / $spawn_rate:.0f} % of the process-creation rate')"
