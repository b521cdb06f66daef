#!/usr/bin/env bash
# The least energy at accuracy >= 0.97 on scikit-learn's digits: Tunefleet's
# gp with the constraint, Tunefleet's energy to the target with early
# stopping, and Optuna 5's constrained TPE driving the same command; each
# kept configuration then run on 5 other seeds (scripts/bench-digits.py).
# One agent of one slot; energy estimated from CPU time on both sides (no
# meter here). About 5 minutes on 2 vCPUs.
#
# Usage: scripts/bench-digits.sh [BUDGET]   (BUDGET trials each, 30)
# Needs the release binaries (cargo build --release -p tunefleet-coordinator
# -p tunefleet-agent); makes target/digits-venv (scikit-learn, Optuna 5)
# with pip from PyPI when it is missing. BENCH_KEEP=1 keeps the temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$PWD/target/release
for b in tunefleet tunefleet-agent; do
  [ -x "$bin/$b" ] || { echo "bench-digits.sh: $bin/$b is missing: cargo build --release -p tunefleet-coordinator -p tunefleet-agent" >&2; exit 1; }
done
venv=${DIGITS_VENV:-$PWD/target/digits-venv}
if ! "$venv/bin/python" -c 'import sklearn, optuna' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check scikit-learn 'optuna>=5,<6'
fi
export PATH="$venv/bin:$bin:$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/tunefleet-bench-digits.XXXXXX")
cleanup() {
  if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench-digits.sh: kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
"$venv/bin/python" scripts/bench-digits.py "$work" "$@"
