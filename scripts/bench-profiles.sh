#!/usr/bin/env bash
# Profiles, clusters and reuse (issue 10), on this machine, with real
# processes: one coordinator (embedded broker) and one agent of 1 slot.
#
#   scripts/bench-profiles.sh
#
# 1. A campaign of the three bundled workloads (examples/campaigns/kinds.toml:
#    8 pipelined trials each, varied hyper-parameters and data sizes, reuse
#    off so every trial probes and profiles): the confusion matrix of
#    k-means over their first-window profiles (software counters and /proc
#    only: no PMU here), leave-one-out reuse decisions, and
#    docs/bench/clusters.svg (two principal components, coloured by workload).
# 2. The refit time over 100,000 profiles made from those (each jittered),
#    side by side with linfa's defaults (10 runs over all).
# 3. Fresh against recurring: a pipelined training study (3 trials, 4
#    system configurations probed one epoch each after a warm-up epoch,
#    reuse off) and the same job again with other learning rates (reuse on),
#    in a new store: tuning time and energy (what each trial ran before its
#    kept configuration) and the kept configuration's time per epoch.
# 4. Reuse on kinds it did not learn from (issue 23): a campaign of six
#    kinds (examples/campaigns/kinds6.toml: the three bundled workloads and
#    three third-party programs, xz, an SQLite bulk load and GNU sort, 8
#    pipelined trials each, reuse off), then leave one kind out: every job
#    of the kind left out against a model of the other five (the profile
#    alone deciding: a reuse is a false reuse), and every job against a
#    model of all the others (a recurring job of a kind seen: a reuse is
#    what it should get), with the default rule (only its own workload
#    decides) and with the profile alone.
#
# 5. The recurring saving over a campaign (issue 23): a fresh pipelined
#    training study (3 trials, 4 configurations probed) followed by 5
#    recurrences (3 trials each, other learning rates, the same program and
#    arguments), once with reuse on and once with reuse off (every trial
#    probes), each series in a new store; the fresh study's cost is in both.
#    Printed: the whole trials' time and energy of each series, and of the
#    same 18 jobs run plain at the default configuration (what a user who
#    does not tune the system would run), and the kept configurations'
#    time per epoch.
#
# STEPS="1 2 3 4 5" (the default) or any of them, e.g. STEPS="4 5".
#
# Needs: cargo build --release -p tunefleet-coordinator -p tunefleet-agent -p tunefleet-workloads
# How long: about 2 minutes on 2 vCPUs, and 3 more for step 4.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
export PATH="$bin:$PATH"
work=$(mktemp -d)
trap 'pkill -f "tunefleet-agent --broker .* --root bp-" 2>/dev/null || true; [ -n "${BENCH_KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
export XDG_STATE_HOME=$work/state

# Runs `tunefleet SUBCOMMAND FILE` on STORE with one agent; waits for the end.
run() {
  local sub=$1 file=$2 store=$3 root=bp-$RANDOM token
  token=$("$bin/tunefleet" token create --uses 100000 --store "$store" 2>/dev/null)
  "$bin/tunefleet" "$sub" "$file" --store "$store" --listen 127.0.0.1:0 --root "$root" --quiet >"$work/$root.log" 2>&1 &
  local coord=$!
  for _ in $(seq 1 100); do grep -q '^broker: ' "$work/$root.log" && break; sleep 0.1; done
  local url; url=$(grep -m1 '^broker: ' "$work/$root.log" | cut -d' ' -f2)
  "$bin/tunefleet-agent" --broker "$url" --name "bench-agent" --root "$root" --slots 1 --join "$token" \
    >"$work/$root-agent.log" 2>&1 &
  local agent=$!
  wait $coord
  kill $agent 2>/dev/null || true
  wait $agent 2>/dev/null || true
  grep -E '^(campaign|study) ' "$work/$root.log" || true
}

bench=$(cargo bench -p tunefleet-tests --bench profiles --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]=="profiles" and m.get("executable"): print(m["executable"])' | tail -1)

# Writes FILE: a training study NAME of 3 trials over learning rates LRS
# (12 epochs, 6 passes), pipelined over cores {1, 2} x threads {1, 2} with
# reuse ENABLED (true|false), or plain at cores 2 and threads 2 (ENABLED
# "plain").
train_study() {
  local file=$1 name=$2 lrs=$3 enabled=$4 system pipeline
  if [ "$enabled" = plain ]; then
    system='[system.cores]
kind = "categorical"
values = [2]
[system.threads]
kind = "categorical"
values = [2]'
    pipeline=''
  else
    system='[system.cores]
kind = "int"
low = 1
high = 2
[system.threads]
kind = "int"
low = 1
high = 2'
    pipeline="[pipeline]
mode = \"pipelined\"
probe = \"grid\"
window = { epochs = 1, warmup = 1 }
select = \"time\"
control = true
[reuse]
enabled = $enabled"
  fi
  cat >"$file" <<STUDY
name = "$name"
command = ["tunefleet-train", "--lr", "{lr}", "--epochs", "12", "--passes", "6", "--threads", "{threads}"]
timeout = 300
lookahead = 0
[objective]
metric = "accuracy"
direction = "maximize"
[budget]
trials = 3
[strategy]
kind = "grid"
[hyper.lr]
kind = "categorical"
values = [$lrs]
$system
$pipeline
STUDY
}

steps=${STEPS:-1 2 3 4 5}
step() { case " $steps " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if step 1 || step 2; then
  run campaign examples/campaigns/kinds.toml "$work/kinds.db"
fi
if step 1; then
echo "## 1. Three kinds of workload"
mkdir -p docs/bench
"$bench" accuracy "$work/kinds.db" docs/bench/clusters.svg
echo
fi
if step 2; then
echo "## 2. Refit over 100,000 profiles"
"$bench" refit "$work/kinds.db" 100000
echo
fi
if step 4; then
echo "## 4. Reuse on kinds it did not learn from"
run campaign examples/campaigns/kinds6.toml "$work/kinds6.db"
"$bench" kinds "$work/kinds6.db"
echo
fi
if step 5; then
echo "## 5. The recurring saving over a campaign of 5 recurrences"
# series: reuse (fresh, then 5 recurrences with reuse on), probe (reuse off
# throughout), plain (the same jobs at the default configuration, no probing).
lrs=("0.05, 0.1, 0.2" "0.03, 0.07, 0.15" "0.04, 0.08, 0.16" "0.06, 0.12, 0.25" "0.02, 0.09, 0.18" "0.035, 0.11, 0.22")
for series in reuse probe plain; do
  for i in 0 1 2 3 4 5; do
    if [ $series = plain ]; then enabled=plain
    elif [ $series = reuse ] && [ $i -gt 0 ]; then enabled=true
    else enabled=false; fi
    train_study "$work/$series-$i.toml" "job-$i" "${lrs[$i]}" $enabled
    run run "$work/$series-$i.toml" "$work/series-$series.db" >/dev/null
  done
done
python3 - "$work" <<'PY'
import json, sqlite3, statistics, sys
work = sys.argv[1]
print("| series (6 studies of 3 trials: the fresh one and 5 recurrences) | whole trials (s) | energy (J, source) | probe windows | kept configuration, median ms per epoch after the first |")
print("|---|---|---|---|---|")
totals = {}
for series in ("plain", "probe", "reuse"):
    db = sqlite3.connect(f"{work}/series-{series}.db")
    wall, joules, sources, probes, epoch_ms = 0.0, 0.0, set(), 0, []
    for w, j, src, m in db.execute("SELECT wall_us, energy_j, energy_source, measurement FROM results WHERE success = 1"):
        wall += w / 1e6
        joules += j or 0.0
        sources.add(src)
        m = json.loads(m)
        probes += sum(1 for s in m.get("segments", []) if s.get("role") == "Probe")
        e = sorted(m["epochs"], key=lambda e: e["epoch"])
        tail = [(b["elapsed_us"] - a["elapsed_us"]) / 1e3 for a, b in zip(e[-6:], e[-5:])]
        epoch_ms += tail
    totals[series] = (wall, joules)
    print(f"| {series} | {wall:.2f} | {joules:.1f} ({', '.join(sorted(s or 'none' for s in sources))}) | {probes} | {statistics.median(epoch_ms):.1f} |")
(pw, pj), (rw, rj), (nw, nj) = totals["probe"], totals["reuse"], totals["plain"]
print(f"reuse against probing every job: {rw / pw:.2f}x the time, {rj / max(pj, 1e-9):.2f}x the energy; "
      f"against the plain jobs at the default: {rw / nw:.2f}x the time, {rj / max(nj, 1e-9):.2f}x the energy")
PY
echo
fi
step 3 || exit 0
echo "## 3. Fresh against recurring"
for which in fresh recurring; do
  if [ $which = fresh ]; then lrs="0.05, 0.1, 0.2"; enabled=false; else lrs="0.03, 0.07, 0.15"; enabled=true; fi
  train_study "$work/$which.toml" "$which" "$lrs" $enabled
  run run "$work/$which.toml" "$work/reuse.db"
done
"$bench" compare "$work/reuse.db" fresh recurring
"$bin/tunefleet" profiles decisions recurring --store "$work/reuse.db"
