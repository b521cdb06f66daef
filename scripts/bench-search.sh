#!/usr/bin/env bash
# Tunefleet's search strategies (gp and tpe) and Optuna 5's default sampler
# (TPESampler) side by side (issue 22), on six standard test functions of
# one objective and two problems of two objectives, in one run:
#
#   scripts/bench-search.sh                 # SEEDS=40 BUDGET=100 WORKERS="1 4"
#   scripts/bench-search.sh branin zdt1     # only these functions
#
# * Functions (all minimised; regret = true value of the best trial minus
#   the known minimum): branin (2-d, multimodal), hartmann6 (6-d),
#   styblinski_tang4 (4-d, separable), rosenbrock4 (4-d, narrow valley),
#   mixed_int_cat (float, log float, int, int with step 16, 4-way
#   categorical), himmelblau_noisy (2-d, Gaussian noise of sd 1 on what the
#   sampler sees; the regret is the noise-free value of the trial with the
#   best noisy value). Held out (issue 37): levy5, hartmann3, ackley4 and
#   camel from gp's batch rules, rastrigin3, dixon_price4 (4-d on [-10, 10],
#   a curved valley) and griewank5 (5-d on [-10, 10]) from the width of its
#   confidence bound.
# * Two objectives (both minimised; the hypervolume of every trial's point
#   from a fixed reference, larger is better): zdt1 (5-d, convex front,
#   reference (1.1, 11)), fonseca_fleming (3-d on [-4, 4], concave front,
#   reference (1, 1)).
# * Tunefleet: search/examples/bench_search.rs runs the coordinator's
#   own search::gp and search::tpe (what `kind = "gp"` and `kind = "tpe"`
#   ask; with `[objective] also` for two objectives) in-process, no agents:
#   the sampler alone, as on Optuna's side.
# * Optuna: TPESampler(seed=s), every other argument at its default
#   (Optuna 5: multivariate, constant liar; its default sampler for one
#   objective and for several), ask-and-tell, in a virtual environment
#   under target/ (made once; PyPI must be reachable the first time;
#   OPTUNA_VENV to put it elsewhere).
# * WORKERS=4: four trials in flight on both sides (the oldest is told, then
#   one more asked while three run), Tunefleet's running trials (gp's
#   kriging believer, tpe's constant liar) against Optuna's constant liar.
# * Each (function, seed) is one study of BUDGET trials; the figures after 50
#   and after BUDGET trials are read from the same study. Tables: median and
#   interquartile range over the seeds, and the ratio of the medians
#   (Tunefleet / Optuna), and a permutation test's p of their difference.
#   Ten seeds are too few to tell samplers of equal quality apart (see
#   BENCHMARKS.md), hence 40.
# * WORKERS="1 4 16 64": as many in flight; the `parallel` table puts every
#   worker count side by side, each median's ratio to the same sampler's
#   sequential one (x1) and to Optuna's at the same workers (/O), and the
#   median time of an ask.
# * GP_BATCHES="believer penalise ...": gp once per rule for the trials in
#   flight (search/gp_batch.rs, issue 37) instead of its default;
#   STRATEGIES="gp" leaves tpe out; NO_OPTUNA=1 leaves Optuna out.
# * What 20 seeds can tell: `bench-search.py null LIMIT 20 regret100 FILE`
#   splits one side's seeds into groups of 20 and counts, for every pair of
#   groups, the functions where one group's median is above LIMIT times the
#   other's (the same sampler against itself; run with SEEDS=100).
# * OPTUNA_SAMPLERS="tpe gp": Optuna's GPSampler too (side optuna-gp; it
#   needs PyTorch and SciPy in the venv: `target/optuna-venv/bin/pip install
#   torch scipy greenlet`; about 25 s a 100-trial study on 2 cores).
# * bench_search alone: BENCH_SIDE names its side, BENCH_CURVE=1 adds the
#   regret after every trial, GP_CANDIDATES / GP_FIT_EVALS set gp's.
# * A spot check with real processes (tunefleet run, one agent):
#   SPOT_KIND=gp SPOT_SEEDS=10 SPOT_SLOTS=1 cargo test -p tunefleet-tests --test search_spot -- --ignored --nocapture
#
# Runs under `nice -n 10`. How long: about 45 minutes on 2 shared cores
# (half of it Optuna's side, a third Tunefleet's gp).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${OPTUNA_VENV:-$PWD/target/optuna-venv}
seeds=${SEEDS:-40}
budget=${BUDGET:-100}
workers=${WORKERS:-1 4}
strategies=${STRATEGIES:-gp tpe}
batches=${GP_BATCHES:-}
out=${BENCH_OUT:-$PWD/target/bench-search}
mkdir -p "$out"

# shellcheck source=scripts/optuna-venv.sh
. scripts/optuna-venv.sh

cargo build --quiet --release -p tunefleet-search --example bench_search
bench=$PWD/target/release/examples/bench_search

files=()
for w in $workers; do
  for strategy in $strategies; do
    if [ "$strategy" = gp ] && [ -n "$batches" ]; then
      for batch in $batches; do
        echo "workers=$w: Tunefleet gp, batch rule $batch" >&2
        GP_BATCH=$batch STRATEGY=gp nice -n 10 "$bench" "$seeds" "$budget" "$w" "$@" >"$out/tunefleet-gp-$batch-$w.jsonl"
        files+=("$out/tunefleet-gp-$batch-$w.jsonl")
      done
      continue
    fi
    echo "workers=$w: Tunefleet $strategy" >&2
    STRATEGY=$strategy nice -n 10 "$bench" "$seeds" "$budget" "$w" "$@" >"$out/tunefleet-$strategy-$w.jsonl"
    files+=("$out/tunefleet-$strategy-$w.jsonl")
  done
  if [ -z "${NO_OPTUNA:-}" ]; then
    for sampler in ${OPTUNA_SAMPLERS:-tpe}; do
      echo "workers=$w: Optuna $optuna_version, $sampler" >&2
      name=optuna-$w.jsonl
      [ "$sampler" = tpe ] || name=optuna-$sampler-$w.jsonl
      OPTUNA_SAMPLER=$sampler nice -n 10 "$py" scripts/bench-search.py optuna "$seeds" "$budget" "$w" "$@" >"$out/$name"
      files+=("$out/$name")
    done
  fi
done

echo "Optuna $optuna_version; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); seeds $seeds; budget $budget"
if [ -n "$batches" ]; then
  "$py" scripts/bench-search.py parallel "${files[@]}"
else
  "$py" scripts/bench-search.py table "${files[@]}"
  "$py" scripts/bench-search.py parallel "${files[@]}"
fi
