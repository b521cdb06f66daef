#!/usr/bin/env bash
# Runs every Tunefleet test. Installs what the tests need when it is missing:
# Debian's mosquitto (the external-broker tests) and victoria-metrics (the
# InfluxDB sink tests start their own on free ports); qemu-user-static, its
# binfmt_misc registration, the aarch64 Rust target and cross gcc, and
# systemd-analyze (the deployment tests). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
command -v victoria-metrics >/dev/null 2>&1 || missing+=(victoria-metrics)
# The deployment tests (tests/tests/deploy.rs): the aarch64 agent under qemu,
# TLS's C code for aarch64, and systemd-analyze for the units.
command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || [ -x /usr/sbin/update-binfmts ] || missing+=(binfmt-support)
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian installs mosquitto in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin"
# The aarch64 agent re-executes itself for every trial: the kernel must hand
# aarch64 executables to qemu (binfmt_misc), not only the first one we start.
[ -e /proc/sys/fs/binfmt_misc/register ] || as_root mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null || as_root update-binfmts --enable qemu-aarch64

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Integration tests run the real binaries: build them all first.
cargo build --workspace --bins --quiet
# The static aarch64 agent the qemu test runs (adds the Rust target when
# missing; about 2 minutes from scratch on 2 cores, seconds when up to date).
cross/build.sh aarch64-unknown-linux-musl
cargo test --workspace
