#!/usr/bin/env bash
# Measures the agent's footprint for BENCHMARKS.md: the size of each built
# binary and the resident memory of an agent that is connected and idle.
#
#   cross/footprint.sh [SECONDS]
#
# Builds (cross/build.sh) the static agents for x86_64 and aarch64, starts a
# coordinator (a debug build: it only waits) on a loopback port
# with a study no agent matches, so every agent connects, announces itself
# and waits; a second coordinator serves mutual TLS (certificates from
# scripts/fleet-certs.sh) for a TLS-connected pair. After SECONDS (default
# 20) it prints VmRSS and VmHWM of each agent from /proc. The x86_64 agent runs natively; the aarch64 one runs
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

scripts/fleet-certs.sh "$work/certs" 127.0.0.1 fp-x86-tls fp-arm-tls >/dev/null

start_coordinator() { # start_coordinator NAME FLAGS...; sets url
  local name=$1
  shift
  "$target_dir/debug/tunefleet" run "$work/idle.toml" --store "$work/$name.db" --listen 127.0.0.1:0 --quiet "$@" \
    >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
  url=
  for _ in $(seq 1 150); do
    url=$(sed -n 's/^broker: //p' "$work/$name.out")
    [ -n "$url" ] && return 0
    sleep 0.1
  done
  echo "footprint.sh: the coordinator did not start:" >&2
  cat "$work/$name.err" >&2
  exit 1
}

start_agent() { # start_agent NAME COMMAND...
  local name=$1
  shift
  TUNEFLEET_LOG=warn "$@" --broker "$url" --name "$name" --state-dir "$work/$name" 2>"$work/$name.err" &
  pids+=($!)
}

start_coordinator plain
start_agent fp-x86 "$x86"
x86_pid=$!
start_agent fp-arm qemu-aarch64-static "$arm"
arm_pid=$!
c=$work/certs
start_coordinator tls --broker-cert "$c/broker.pem" --broker-key "$c/broker.key" --broker-client-ca "$c/ca.pem"
start_agent fp-x86-tls "$x86" --ca "$c/ca.pem" --cert "$c/fp-x86-tls.pem" --key "$c/fp-x86-tls.key"
x86_tls_pid=$!
start_agent fp-arm-tls qemu-aarch64-static "$arm" --ca "$c/ca.pem" --cert "$c/fp-arm-tls.pem" --key "$c/fp-arm-tls.key"
arm_tls_pid=$!

# Connected: each coordinator stored both of its agents' announcements.
announced() { sqlite3 "$work/$1.db" "SELECT COUNT(*) FROM agents" 2>/dev/null || echo 0; }
for _ in $(seq 1 300); do
  [ "$(announced plain)" = 2 ] && [ "$(announced tls)" = 2 ] && break
  sleep 0.1
done
if [ "$(announced plain)" != 2 ] || [ "$(announced tls)" != 2 ]; then
  echo "footprint.sh: the agents did not announce themselves" >&2
  tail -n 5 "$work"/fp-*.err >&2
  exit 1
fi
sleep "$wait_s"

kib() { awk -v k="$2" '$1 == k":" { print $2 }' "/proc/$1/status"; }
row() { # row LABEL BINARY PID
  printf '%-40s %10s %10s %10s\n' "$1" "$(stat -c %s "$2")" "$(kib "$3" VmRSS)" "$(kib "$3" VmHWM)"
}
printf '%-40s %10s %10s %10s\n' "agent, connection" bytes "VmRSS KiB" "VmHWM KiB"
row "x86_64 static, mqtt://" "$x86" $x86_pid
row "x86_64 static, mqtts:// (mutual TLS)" "$x86" $x86_tls_pid
row "aarch64 static under qemu, mqtt://" "$arm" $arm_pid
row "aarch64 static under qemu, mqtts://" "$arm" $arm_tls_pid
