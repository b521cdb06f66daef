#!/usr/bin/env bash
# The Spark k-means study (examples/studies/spark-submit.toml, issue 24) on a
# standalone cluster of this machine, and its best configuration against
# Spark's default executor settings:
#
#   scripts/bench-spark.sh              # REPEATS=5
#
# Starts a master and a worker of 2 cores and 4 GiB from the pyspark of
# target/spark-venv (scripts/needs.sh makes it; SPARK_VENV to use another),
# runs the study as written with `tunefleet run` and one agent tagged
# role=spark-edge (4 trials: partitions x executor cores x executor memory,
# random search), then times `spark-submit` of the best trial's command and
# of the same command without executor settings (standalone's default: every
# core of the worker, 1 GiB), REPEATS interleaved rounds each, outside
# Tunefleet. Prints the trials, the re-measured medians with min and max,
# and their ratio. Stops the cluster at the end.
#
# How long: about 6 minutes on 2 vCPUs. Needs the release binaries:
#   cargo build --release -p tunefleet-coordinator -p tunefleet-agent
# BENCH_KEEP=1 keeps the temp dir (store, logs).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SPARK_VENV:-$PWD/target/spark-venv}
# shellcheck source=scripts/needs.sh
. scripts/needs.sh
needs spark
bin=$PWD/target/release
for b in tunefleet tunefleet-agent; do
  [ -x "$bin/$b" ] || { echo "bench-spark.sh: $bin/$b is missing: cargo build --release -p tunefleet-coordinator -p tunefleet-agent" >&2; exit 1; }
done
export PATH="$bin:$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/tunefleet-bench-spark.XXXXXX")
cleanup() {
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench-spark.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
python3 scripts/bench-spark.py "$work" "$venv"
