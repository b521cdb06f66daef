#!/usr/bin/env bash
# Measures the agent's footprint for BENCHMARKS.md: the size of each built
# binary and the resident memory of an agent that is connected and idle.
#
#   cross/footprint.sh [SECONDS]
#
# Builds (cross/build.sh) the static agents for x86_64 and aarch64, starts a
# coordinator (a debug build: it only waits) on a loopback port
# with a study no agent matches, so every agent connects, announces itself
# and waits. After SECONDS (default 20) it prints VmRSS and VmHWM of each
# agent from /proc. The x86_64 agent runs natively; the aarch64 one runs
# under qemu-aarch64-static, whose figure includes the emulator and is shown
# for reference only.
set -euo pipefail
cd "$(dirname "$0")/.."
wait_s=${1:-20}

cross/build.sh x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
cargo build --quiet -p tunefleet-coordinator
x86="$target_dir/x86_64-unknown-linux-musl/small/tunefleet-agent"
arm="$target_dir/aarch64-unknown-linux-musl/small/tunefleet-agent"

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/idle.toml" <<'EOF'
name = "footprint"
command = ["true"]

[objective]
metric = "wall_time"
direction = "minimize"

[budget]
trials = 1

[strategy]
kind = "grid"

[selector]
arch = ["no-such-arch"]

[hyper.x]
kind = "categorical"
values = [1]
EOF

"$target_dir/debug/tunefleet" run "$work/idle.toml" --store "$work/store.db" --listen 127.0.0.1:0 --quiet \
  >"$work/coordinator.out" 2>"$work/coordinator.err" &
pids+=($!)
url=
for _ in $(seq 1 150); do
  url=$(sed -n 's/^broker: //p' "$work/coordinator.out")
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "footprint.sh: the coordinator did not start:" >&2; cat "$work/coordinator.err" >&2; exit 1; }

start_agent() { # start_agent NAME COMMAND...
  local name=$1
  shift
  TUNEFLEET_LOG=warn "$@" --broker "$url" --name "$name" --state-dir "$work/$name" 2>"$work/$name.err" &
  pids+=($!)
}
start_agent fp-x86 "$x86"
x86_pid=$!
start_agent fp-arm qemu-aarch64-static "$arm"
arm_pid=$!

# Connected: the coordinator stored both agents' announcements.
for _ in $(seq 1 300); do
  n=$(sqlite3 "$work/store.db" "SELECT COUNT(*) FROM agents WHERE name LIKE 'fp-%'" 2>/dev/null || echo 0)
  [ "$n" = 2 ] && break
  sleep 0.1
done
[ "$n" = 2 ] || { echo "footprint.sh: the agents did not announce themselves" >&2; cat "$work"/fp-*.err >&2; exit 1; }
sleep "$wait_s"

kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }
printf '%-34s %12s %10s %10s\n' binary bytes "VmRSS KiB" "VmHWM KiB"
printf '%-34s %12s %10s %10s\n' "x86_64-unknown-linux-musl" "$(stat -c %s "$x86")" "$(kib $x86_pid VmRSS)" "$(kib $x86_pid VmHWM)"
printf '%-34s %12s %10s %10s\n' "aarch64-unknown-linux-musl (qemu)" "$(stat -c %s "$arm")" "$(kib $arm_pid VmRSS)" "$(kib $arm_pid VmHWM)"
