#!/usr/bin/env bash
# GPU energy where an NVIDIA GPU is lent (issue 38). Read only: nothing
# here changes a GPU's settings (power limit, clocks, modes).
#
#   scripts/gpu-check.sh                # binaries in target/release
#   BIN=dir TESTS="dir/gpu_nvml-..." scripts/gpu-check.sh
#
# 1. What the GPU is (nvidia-smi) and what the agent finds (`probe`).
# 2. The tests marked ignored that read the real NVML (TESTS: test
#    binaries built here with `cargo test -p tunefleet-agent --test
#    gpu_nvml --no-run`; skipped when not given).
# 3. A short study of the GPU example (examples/studies/torch-gpu.toml,
#    TRIALS trials, energy a second objective) on one local agent with the
#    driver's NVML, while nvidia-smi samples every GPU's power every 100 ms.
# 4. scripts/gpu_check.py: per trial, the GPU's energy the agent read
#    through NVML against nvidia-smi's power integrated over the trial's
#    window (goal: within 5 %), and the GPU's share of the trial's energy.
#
# Needs nvidia-smi, python3 with PyTorch (CUDA) for the GPU path (without
# it the example trains its plain fallback and the GPU idles), and the
# glibc build of the agent (a static agent cannot load NVML): binaries
# built on a machine whose glibc is no newer than this one's. Everything
# it writes goes under OUT (the device's $OUT, else target/gpu-check).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${BIN:-target/release}" && pwd)
out=${OUT:-$PWD/target/gpu-check}
trials=${TRIALS:-4}
mkdir -p "$out"
rm -rf "$out/agent" "$out/gpu.db" "$out/gpu.db-wal" "$out/gpu.db-shm"

echo "== the GPUs"
nvidia-smi --query-gpu=index,name,uuid,power.draw,power.limit,driver_version --format=csv | tee "$out/gpus.csv"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 \
  | tee "$out/torch.txt" || true
"$bin/tunefleet-agent" probe ${AGENT_ARGS:-} | tee "$out/probe.txt"

echo "== the tests that read the real NVML"
for t in ${TESTS:-}; do
  "$t" --ignored --nocapture 2>&1 | tee -a "$out/tests.txt"
done

echo "== a study of the GPU example, $trials trials, nvidia-smi sampling alongside"
nvidia-smi --query-gpu=timestamp,uuid,power.draw --format=csv,noheader,nounits -lms 100 > "$out/power.csv" &
smi=$!
trap 'kill $smi 2>/dev/null || true' EXIT
sed -e "s/^trials = 16/trials = $trials/" examples/studies/torch-gpu.toml > "$out/torch-gpu.toml"
export XDG_STATE_HOME="$out/state"
"$bin/tunefleet" run "$out/torch-gpu.toml" --store "$out/gpu.db" --listen 127.0.0.1:0 --quiet \
  --launch-max 1 \
  --launcher "$bin/tunefleet-agent --broker {broker} --name {name} --root {root} --workdir $PWD --state-dir $out/agent ${AGENT_ARGS:-}" \
  >"$out/run.txt" 2>"$out/run.log" || echo "tunefleet run failed: see $out/run.log"
cat "$out/run.txt"
# One more power sample past the last trial's end, then the sampler stops.
sleep 0.5
kill $smi 2>/dev/null || true

echo "== NVML against nvidia-smi"
python3 scripts/gpu_check.py "$out/gpu.db" "$out/power.csv" | tee "$out/report.txt"
