#!/usr/bin/env bash
# The constrained search benchmark: Tunefleet's gp and tpe (in-process,
# search/examples/bench_constrained.rs) and Optuna 5's constrained TPE
# and, where PyTorch is installed, GPSampler (scripts/bench-constrained.py,
# in the Optuna virtual environment scripts/needs.sh makes) on four
# constrained problems, the same seeds and
# budget, sequentially and with WORKERS in flight; a Markdown table.
#
# Usage: scripts/bench-constrained.sh [SEEDS] [BUDGET] [WORKERS...]
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=${1:-20}
budget=${2:-40}
shift $(( $# > 2 ? 2 : $# )) || true
workers=("${@:-1}")
[ $# -gt 0 ] || workers=(1 4)
python=${OPTUNA_VENV:-target/optuna-venv}/bin/python
out=$(mktemp -d)
cargo build --quiet --release -p tunefleet-search --example bench_constrained
for w in "${workers[@]}"; do
  for strategy in gp tpe; do
    STRATEGY=$strategy target/release/examples/bench_constrained "$seeds" "$budget" "$w" >>"$out/tunefleet.jsonl"
  done
  "$python" scripts/bench-constrained.py optuna "$seeds" "$budget" "$w" tpe >>"$out/optuna.jsonl"
  # Optuna's GPSampler where PyTorch is installed (BENCH_OPTUNA_GP=0 leaves it out).
  if [ "${BENCH_OPTUNA_GP:-1}" = 1 ] && "$python" -c 'import torch, scipy' 2>/dev/null; then
    "$python" scripts/bench-constrained.py optuna "$seeds" "$budget" "$w" gp >>"$out/optuna.jsonl"
  fi
done
"$python" scripts/bench-constrained.py table "$out/tunefleet.jsonl" "$out/optuna.jsonl"
echo "raw lines: $out" >&2
