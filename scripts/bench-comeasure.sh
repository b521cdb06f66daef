#!/usr/bin/env bash
# The cost of co-measurement (issue 24): the same study of short trials
# with and without `[measure] nodes` (two worker agents measuring each
# trial), side by side in alternating rounds; the coordinator's CPU per
# trial and the workers' CPU from each process's rusage.
#
#   scripts/bench-comeasure.sh          # ROUNDS=3 TRIALS=200 SLEEP=0.1
#
# How long: about ROUNDS x 2 x TRIALS x SLEEP seconds, plus start-up.
# Needs the release binaries:
#   cargo build --release -p tunefleet-coordinator -p tunefleet-agent
# BENCH_KEEP=1 keeps the temp dir (stores, logs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
for b in tunefleet tunefleet-agent; do
  [ -x "$bin/$b" ] || { echo "bench-comeasure.sh: $bin/$b is missing: cargo build --release -p tunefleet-coordinator -p tunefleet-agent" >&2; exit 1; }
done
export PATH="$bin:$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/tunefleet-bench-comeasure.XXXXXX")
cleanup() {
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench-comeasure.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
python3 scripts/bench-comeasure.py "$work" "${ROUNDS:-3}" "${TRIALS:-200}" "${SLEEP:-0.1}"
