#!/usr/bin/env bash
# Pipelined tuning against the baselines a user would otherwise run
# (issue 23), on three workloads, the whole benchmark run twice:
#
#   scripts/bench-pipeline.sh                # train, stream and xz; RUNS=2 REPEATS=5 BENCH_EPOCHS=20
#   scripts/bench-pipeline.sh xz             # only these workloads
#
# Workloads (scripts/bench-pipeline.py has their commands):
#   train   tunefleet-train, lr in {0.02, 0.1, 0.3}, mini-batches of 8:
#           a second gradient worker costs more than it gives, so the
#           default configuration (cores 2, threads 2) is not the best;
#   stream  tunefleet-stream (a memory-bound transpose), block size in
#           {4, 32, 256}: the default configuration is the best;
#   xz      the system's xz (a third-party program, epoch lines from a
#           shell loop), preset in {0, 1, 2, 3} for the compression ratio of
#           an 8 MB input; cores probed by CPU affinity (xz -T0 starts a
#           thread per CPU it may use).
# System space: cores {1, 2} x threads {1, 2} (xz: cores {1, 2}); the
# default configuration is the largest value of each, what a pipelined
# trial's first window runs.
# Modes, each one `tunefleet run` (embedded broker, its own store) with one
# agent of one slot, the grid strategy over the same hyper grid:
#   plain      the hyper-parameters at the default configuration;
#   two-phase  plain, then the system grid for plain's best (phase two's
#              default-configuration trial not counted: phase one ran it);
#   grid       every hyper x system combination, for reference;
#   pipelined  Tunefleet's defaults: one warm-up epoch, one-epoch windows,
#              one parameter at a time, the fastest kept.
# Tuning time: the coordinator's wall time, start to exit. Energy: the sum
# of the trials' results.energy_j with its source (a model estimate from
# CPU time where there is no RAPL, as here).
# The final job (grid's best hyper-parameters, all epochs) is then timed
# outside Tunefleet under every system configuration (taskset for cores,
# the workload's --threads), REPEATS interleaved rounds: each mode's kept
# configuration against the best by median, with [min, max].
#
# How long: about 7 minutes per run on 2 vCPUs. Needs the release binaries:
#   cargo build --release -p tunefleet-coordinator -p tunefleet-agent -p tunefleet-workloads
# BENCH_KEEP=1 keeps the temp dir (studies, stores, logs, results.json).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in python3 taskset xz; do
  command -v "$tool" >/dev/null || { echo "bench-pipeline.sh: needs $tool" >&2; exit 1; }
done
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
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench-pipeline.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
python3 scripts/bench-pipeline.py "$work" "$@"
