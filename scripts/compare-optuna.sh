#!/usr/bin/env bash
# Tunefleet and Optuna side by side on the same study (issues 12 and 25), on
# this machine:
#
#   scripts/compare-optuna.sh        # ROUNDS=2 OPTUNA_TRIALS=600 JOURNAL_TRIALS=2000 TUNEFLEET_TRIALS=3000
#   TUNEFLEET_BEFORE=/path/to/other/release scripts/compare-optuna.sh   # and another build, before/after
#   OPTUNA=0 TUNEFLEET_BEFORE=... scripts/compare-optuna.sh   # Tunefleet builds and process creation only
#
# * Optuna 5, 2 worker processes each, RandomSampler (Tunefleet's strategy
#   here is random too: no model to fit on either side), one integer
#   parameter, with two storages: its RDB storage on SQLite (one file), and
#   its journal file storage (`JournalStorage(JournalFileBackend(path))`),
#   and two objectives each: in-process (the parameter returned as is:
#   Optuna's best case), and one that runs `true` as a process
#   (`subprocess.run`: the same work as a Tunefleet trial).
# * Tunefleet: `tunefleet run` (embedded broker, durable SQLite store) and
#   2 real `tunefleet-agent` processes of 1 slot each running `true`: each
#   trial is a real process (started directly, one exec, with counters from
#   its first instruction, energy estimate, store), its result synced to the
#   agent's spool before it is sent. With TUNEFLEET_BEFORE (a directory
#   holding another build's `tunefleet` and `tunefleet-agent`), that build
#   too, in the same rounds, right before this one.
# * Process creation on the same cores: two shell loops of `/bin/true`
#   (what the whole path could reach at best).
#
# ROUNDS rounds of all of them, one after the other in turn, so that other
# work on the machine weighs on each alike; the best round of each is
# shown, every round is printed, and the ratios are taken round by round
# (side by side in time). Trials/s are counted in each one's own store,
# from the first trial's start to the last trial's end, so no start-up
# counts. For each Tunefleet round, the CPU per trial of the agents (their
# own threads), of the trials' processes (the agents' children), of the
# embedded broker's threads and of the coordinator's other threads, from
# /proc (`utime + stime`) sampled every 0.2 s, over the trials that ended
# between the first sample 0.5 s into the study and the last sample.
# Optuna goes into a virtual environment under target/ (made once, checked
# by importing it; PyPI must be reachable the first time; OPTUNA_VENV to
# put it elsewhere).
#
# Needs: python3 (with venv), cargo build --release -p tunefleet-coordinator -p tunefleet-agent
# How long: about 90 s a round once the environment exists.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
before=${TUNEFLEET_BEFORE:-}
venv=${OPTUNA_VENV:-$PWD/target/optuna-venv}
rounds=${ROUNDS:-2}
optuna_trials=${OPTUNA_TRIALS:-600}
journal_trials=${JOURNAL_TRIALS:-2000}
tunefleet_trials=${TUNEFLEET_TRIALS:-3000}
for d in "$bin" ${before:+"$before"}; do
  for b in tunefleet tunefleet-agent; do
    [ -x "$d/$b" ] || { echo "missing $d/$b: cargo build --release -p tunefleet-coordinator -p tunefleet-agent" >&2; exit 2; }
  done
done

work=$(mktemp -d)
cleanup() {
  if [ -n "${BENCH_KEEP:-}" ]; then echo "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
export XDG_STATE_HOME=$work/state

# shellcheck source=scripts/optuna-venv.sh
. scripts/optuna-venv.sh

# The Optuna worker and reader (both storages), the Tunefleet reader, the
# CPU sampler, and the Tunefleet study.
cat >"$work/optuna_study.py" <<'PY'
import subprocess
import sys
import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)


def storage_of(spec):
    if spec.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(spec[len("journal:"):]))
    return spec


def in_process(trial):
    return trial.suggest_int("x", 0, 1_000_000_000)


def runs_true(trial):
    x = trial.suggest_int("x", 0, 1_000_000_000)
    subprocess.run(["true", str(x)], check=True)
    return x


what, spec = sys.argv[1], sys.argv[2]
if what == "create":
    optuna.create_study(study_name="noop", storage=storage_of(spec))
elif what == "work":
    n, objective = int(sys.argv[3]), {"inproc": in_process, "true": runs_true}[sys.argv[4]]
    study = optuna.load_study(study_name="noop", storage=storage_of(spec), sampler=optuna.samplers.RandomSampler())
    study.optimize(objective, n_trials=n)
else:  # rate: "trials trials/s", first start to last end
    trials = [
        t
        for t in optuna.load_study(study_name="noop", storage=storage_of(spec)).trials
        if t.state == optuna.trial.TrialState.COMPLETE
    ]
    first = min(t.datetime_start for t in trials)
    last = max(t.datetime_complete for t in trials)
    print(len(trials), round(len(trials) / (last - first).total_seconds()))
PY
cat >"$work/tunefleet_rate.py" <<'PY'
import json, sqlite3, sys

db = sqlite3.connect(sys.argv[1])
n, first, last = db.execute(
    "SELECT (SELECT COUNT(*) FROM results), (SELECT MIN(assigned_ms) FROM attempts),"
    " (SELECT MAX(received_ms) FROM results)"
).fetchone()
# CPU per trial from the sampler's file: the first sample 0.5 s into the
# study and the last one, and the results received between them.
samples = [json.loads(l) for l in open(sys.argv[2])]
start = [s for s in samples if s["ms"] >= first + 500]
cpu = "-"
if len(start) >= 2:
    a, b = start[0], start[-1]
    (k,) = db.execute("SELECT COUNT(*) FROM results WHERE received_ms > ? AND received_ms <= ?", (a["ms"], b["ms"])).fetchone()
    if k:
        us = lambda key: round((b[key] - a[key]) / k)
        cpu = "/".join(str(us(key)) for key in ("agents", "trials", "broker", "coordinator"))
print(n, round(n / ((last - first) / 1000)), cpu)
PY
cat >"$work/cpu_sample.py" <<'PY'
# Samples the CPU time (µs) of a coordinator (its broker threads apart) and
# its agents every 0.2 s, one JSON line per sample, until the coordinator ends.
import json, os, sys, time

tick = 1_000_000 / os.sysconf("SC_CLK_TCK")
out, coordinator, agents = sys.argv[1], int(sys.argv[2]), [int(p) for p in sys.argv[3:]]
# The embedded broker's threads (rumqttd's and the thread that starts it);
# the coordinator's main thread is also called "tunefleet".
broker_threads = {"tunefleet", "tunefleet-inter", "tunefleet-tls", "tunefleet-broke", "router-0", "timer"}


def fields(path):
    with open(path) as f:
        text = f.read()
    comm = text[text.index("(") + 1 : text.rindex(")")]
    return comm, text[text.rindex(")") + 2 :].split()


def sample():
    s = {"ms": time.time() * 1000, "agents": 0, "trials": 0, "broker": 0, "coordinator": 0}
    for pid in agents:
        _, f = fields(f"/proc/{pid}/stat")
        s["agents"] += (int(f[11]) + int(f[12])) * tick
        s["trials"] += (int(f[13]) + int(f[14])) * tick
    for tid in os.listdir(f"/proc/{coordinator}/task"):
        comm, f = fields(f"/proc/{coordinator}/task/{tid}/stat")
        key = "broker" if int(tid) != coordinator and comm in broker_threads else "coordinator"
        s[key] += (int(f[11]) + int(f[12])) * tick
    return s


with open(out, "w") as o:
    while True:
        try:
            s = sample()
        except (FileNotFoundError, ProcessLookupError, ValueError):
            break
        o.write(json.dumps(s) + "\n")
        o.flush()
        time.sleep(0.2)
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
  "$py" -c "print(2 * $n, round(2 * $n / ($t1 - $t0)))"
}

# "trials trials/s" of an Optuna study: storage (sqlite|journal), objective
# (inproc|true), trials, round.
optuna_round() {
  local spec workers=()
  case $1 in
    sqlite) spec=sqlite:///$work/optuna-$1-$2-$4.db ;;
    journal) spec=journal:$work/optuna-$1-$2-$4.log ;;
  esac
  "$py" "$work/optuna_study.py" create "$spec" 2>/dev/null
  for _ in 1 2; do
    "$py" "$work/optuna_study.py" work "$spec" $(($3 / 2)) "$2" &
    workers+=($!)
  done
  wait "${workers[@]}"
  "$py" "$work/optuna_study.py" rate "$spec"
}

# "trials trials/s cpu" of a Tunefleet study in a new store, two agents:
# binaries, round label.
tunefleet_round() {
  local bin=$1 store=$work/tunefleet-$2.db root=cmp-$$-$2 log=$work/coordinator-$2.log url='' agents=() token
  token=$("$bin/tunefleet" token create --uses 100000 --store "$store" 2>/dev/null)
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
    "$bin/tunefleet-agent" --broker "$url" --name "cmp-$2-$i" --root "$root" --slots 1 --exit-when-idle=10s --join "$token" \
      >"$work/agent-$2-$i.log" 2>&1 &
    agents+=($!)
  done
  "$py" "$work/cpu_sample.py" "$work/cpu-$2.jsonl" "$coordinator" "${agents[@]}" &
  local sampler=$!
  wait "$coordinator"
  wait "$sampler" || true
  kill "${agents[@]}" 2>/dev/null || true
  wait "${agents[@]}" 2>/dev/null || true
  "$py" "$work/tunefleet_rate.py" "$store" "$work/cpu-$2.jsonl"
}

optuna=${OPTUNA:-1}
if [ "$optuna" = 0 ]; then
  kinds=(spawn ${before:+before} after)
else
  kinds=(spawn sqlite-inproc sqlite-true journal-inproc journal-true ${before:+before} after)
fi
declare -A runs
for r in $(seq "$rounds"); do
  runs[spawn]+="$(spawn_round)"$'\n'
  if [ "$optuna" != 0 ]; then
  runs[sqlite-inproc]+="$(optuna_round sqlite inproc "$optuna_trials" "$r")"$'\n'
  runs[sqlite-true]+="$(optuna_round sqlite true "$optuna_trials" "$r")"$'\n'
  runs[journal-inproc]+="$(optuna_round journal inproc "$journal_trials" "$r")"$'\n'
  runs[journal-true]+="$(optuna_round journal true "$journal_trials" "$r")"$'\n'
  fi
  if [ -n "$before" ]; then
    runs[before]+="$(tunefleet_round "$before" "before-$r")"$'\n'
  fi
  runs[after]+="$(tunefleet_round "$bin" "after-$r")"$'\n'
done

declare -A label=(
  [spawn]="process creation, two loops of \`/bin/true\`"
  [sqlite-inproc]="Optuna $optuna_version, SQLite storage, 2 worker processes, in-process objective"
  [sqlite-true]="Optuna $optuna_version, SQLite storage, 2 worker processes, objective runs \`true\`"
  [journal-inproc]="Optuna $optuna_version, journal file storage, 2 worker processes, in-process objective"
  [journal-true]="Optuna $optuna_version, journal file storage, 2 worker processes, objective runs \`true\`"
  [before]="Tunefleet before ($before), coordinator + 2 agents (1 slot each) running \`true\`"
  [after]="Tunefleet, coordinator + 2 agents (1 slot each) running \`true\`, durable spool and store"
)
# Field 2 of each round (trials/s), and the CPU field of Tunefleet's rounds.
col() { printf '%s' "${runs[$1]}" | awk -v f="$2" '{ print $f }'; }
echo "| what | trials | trials/s: best of $rounds rounds (each round) |"
echo "|---|---|---|"
for k in "${kinds[@]}"; do
  echo "| ${label[$k]} | $(col "$k" 1 | head -1) | $(col "$k" 2 | sort -n | tail -1) ($(col "$k" 2 | paste -sd/ -)) |"
done
echo
echo "Round by round (same round, side by side):"
echo
if [ "$optuna" = 0 ]; then
  echo "| round | % of process creation |${before:+ after / before |}"
  echo "|---|---|${before:+---|}"
else
  echo "| round | Tunefleet / Optuna SQLite running \`true\` | / Optuna journal running \`true\` | / Optuna journal in-process | % of process creation |${before:+ after / before |}"
  echo "|---|---|---|---|---|${before:+---|}"
fi
for r in $(seq "$rounds"); do
  at() { col "$1" 2 | sed -n "${r}p"; }
  if [ "$optuna" = 0 ]; then
    "$py" -c "
a, p = $(at after), $(at spawn)
b = '${before:+$(at before)}'
print(f'| {$r} | {100 * a / p:.0f} % |' + (f' {a / int(b):.2f}x |' if b else ''))
"
    continue
  fi
  "$py" -c "
a, s, j, i, p = $(at after), $(at sqlite-true), $(at journal-true), $(at journal-inproc), $(at spawn)
b = '${before:+$(at before)}'
print(f'| {$r} | {a / s:.1f}x | {a / j:.2f}x | {a / i:.2f}x | {100 * a / p:.0f} % |' + (f' {a / int(b):.2f}x |' if b else ''))
"
done
echo
echo "CPU per trial, µs (agents' own threads / the trials' processes / the embedded broker / the coordinator), each round:"
for k in ${before:+before} after; do
  echo "* ${label[$k]}: $(col "$k" 3 | paste -sd' ' -)"
done
