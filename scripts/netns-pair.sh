#!/bin/bash
# A failover pair on two "machines" of one host: two `tunefleet serve` in
# network namespaces of their own (10.77.0.2 and .3, each with its embedded
# broker), the store on a PostgreSQL server reached at 10.77.0.10, two agents
# in the host's namespace (10.77.0.1) given both brokers. A study of 600
# trials of 0.3 s; once 150 are stored, the active is cut off without a word:
#   db    its route to the server blackholed (its agents still reach it;
#         its own sends to the server fail at once, EINVAL, while the
#         server hears nothing of it)
#   host  its link down (nothing reaches it, nor it anything: ENETUNREACH)
# Neither is a network that drops packets silently on both sides (that
# needs netem or a firewall, which this host lacks).
# and the script says when it ended, when the standby was active and when
# every trial was done, then checks the store and the agents' spools.
#
# Root, iproute2, procps, bc and psql. The server: PGPORT (55432) on this host, role
# `tunefleet`, listening on every address (listen_addresses = '*') with
# `host all all 10.77.0.0/24 trust` in pg_hba.conf. BIN: the directory of
# `tunefleet` and `tunefleet-agent` (target/release).
#
#   sudo BIN=target/release scripts/netns-pair.sh db
set -u
MODE=${1:-db}
B=$(realpath "${BIN:-target/release}")
PGPORT=${PGPORT:-55432}
S=/tmp/tunefleet-netns-pair
PSQL="psql -h 127.0.0.1 -p $PGPORT -U tunefleet -d postgres -Atq"
cleanup() {
  pkill -f "tunefleet serve --listen 10.77" 2>/dev/null; pkill -f "tunefleet-agent --broker mqtt://10.77" 2>/dev/null
  for n in a b; do ip link del tf$n-h 2>/dev/null; ip netns del tf$n 2>/dev/null; done
  ip link del tfbr 2>/dev/null
  # Devices go a moment after their namespace: wait for them.
  for k in $(seq 1 100); do ip link show tfa-h >/dev/null 2>&1 || ip link show tfb-h >/dev/null 2>&1 || break; sleep 0.1; done
}
cleanup
trap cleanup EXIT
$PSQL -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE client_addr << '10.77.0.0/24'" 
rm -rf $S; mkdir -p $S/state $S/agents; chmod 700 $S $S/state $S/agents
ip link add tfbr type bridge && ip addr add 10.77.0.1/24 dev tfbr && ip addr add 10.77.0.10/24 dev tfbr && ip link set tfbr up
i=2
for n in a b; do
  ip netns add tf$n
  ip link add tf$n-h type veth peer name tf$n-c
  ip link set tf$n-c netns tf$n
  ip link set tf$n-h master tfbr up
  ip netns exec tf$n ip addr add 10.77.0.$i/24 dev tf$n-c
  ip netns exec tf$n ip link set tf$n-c up
  ip netns exec tf$n ip link set lo up
  i=$((i+1))
done
$PSQL -c "DROP SCHEMA IF EXISTS nsx CASCADE" 2>/dev/null
STORE="postgres://tunefleet@10.77.0.10:$PGPORT/postgres?schema=nsx"
export XDG_STATE_HOME=$S/state TUNEFLEET_LOG=info
serve() { # ns name ip
  ip netns exec tf$1 env XDG_STATE_HOME=$S/state $B/tunefleet serve --listen $2:1884 --broker-open-to-network --root nsx --page off --store "$STORE" --control $S/$1/control.sock > $S/$1.log 2>&1 &
  echo $! > $S/$1.pid
}
serve a 10.77.0.2
for k in $(seq 1 600); do grep -q "active: this" $S/a.log 2>/dev/null && break; sleep 0.1; done
grep -q "active: this" $S/a.log || { echo "a is not active"; cat $S/a.log; cleanup; exit 1; }
head -3 $S/a.log | cut -c1-200
serve b 10.77.0.3
for k in $(seq 1 100); do grep -q "standby: another" $S/b.log 2>/dev/null && break; sleep 0.1; done
TOKEN=$($B/tunefleet token create --uses 1000 --ttl 2h --store "$STORE")
cat > $S/study.toml <<T
name = "nsx"
command = ["sh", "-c", "sleep 0.3; echo '{{\"event\":\"final\",\"v\":{x}}}'"]
[objective]
metric = "v"
direction = "maximize"
[budget]
trials = 600
[strategy]
kind = "random"
seed = 1
[hyper.x]
kind = "int"
low = 1
high = 1000
T
$B/tunefleet submit $S/study.toml --store "$STORE" --control $S/a/control.sock
for n in 1 2; do
  TUNEFLEET_JOIN=$TOKEN XDG_STATE_HOME=$S/agents $B/tunefleet-agent --broker mqtt://10.77.0.2:1884,mqtt://10.77.0.3:1884 --name ns-$n --root nsx --slots 4 > $S/agent-$n.log 2>&1 &
done
for k in $(seq 1 600); do r=$($PSQL -c "SELECT COUNT(*) FROM nsx.results" 2>/dev/null); [ "${r:-0}" -ge 150 ] && break; sleep 0.1; done
echo "results before the cut: $r"
T0=$(date +%s.%N)
if [ "$MODE" = db ]; then ip netns exec tfa ip route add blackhole 10.77.0.10/32; else ip netns exec tfa ip link set tfa-c down; fi
APID=$(cat $S/a.pid)
[ -n "$APID" ] || { echo "a's process not found"; exit 1; }
# Both watched in one loop: when a ended, when b said it is active.
T1=; T2=
for k in $(seq 1 1200); do
  [ -z "$T1" ] && ! kill -0 $APID 2>/dev/null && T1=$(date +%s.%N)
  [ -z "$T2" ] && grep -q "active: this" $S/b.log && T2=$(date +%s.%N)
  [ -n "$T1" ] && [ -n "$T2" ] && break
  sleep 0.05
done
if kill -0 $APID 2>/dev/null; then echo "a still runs 60 s after the cut; results stored: $($PSQL -c 'SELECT COUNT(*) FROM nsx.results'); b: $(grep -c 'active: this' $S/b.log) active lines"; kill -KILL $APID; T1=$(date +%s.%N); fi
[ -n "$T2" ] || { for k in $(seq 1 1800); do grep -q "active: this" $S/b.log && break; sleep 0.1; done; T2=$(date +%s.%N); }
for k in $(seq 1 3000); do d=$($PSQL -c "SELECT COUNT(*) FROM nsx.trials WHERE state = 'done'"); [ "$d" = 600 ] && break; sleep 0.1; done
T3=$(date +%s.%N)
echo "mode $MODE: a ended $(echo "$T1 - $T0" | bc) s after the cut; b active $(echo "$T2 - $T0" | bc) s after; all 600 done $(echo "$T3 - $T0" | bc) s after"
echo "results $($PSQL -c 'SELECT COUNT(*) FROM nsx.results'), failed $($PSQL -c "SELECT COUNT(*) FROM nsx.trials WHERE state = 'failed'"), epoch $($PSQL -c 'SELECT epoch FROM nsx.coordinator_lease')"
echo "--- a's last lines"; tail -4 $S/a.log | cut -c1-250
pkill -TERM -f "tunefleet-agent --broker mqtt://10.77"; sleep 3
for n in 1 2; do XDG_STATE_HOME=$S/agents $B/tunefleet-agent spool --name ns-$n 2>&1 | tail -1; done
pkill -TERM -f "tunefleet serve --listen 10.77.0.3"; sleep 2
cleanup
$PSQL -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE client_addr << '10.77.0.0/24'" >/dev/null
