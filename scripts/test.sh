#!/usr/bin/env bash
# Runs every Tunefleet test. First checks, by using each one, what the tests
# need, and installs what fails its check (scripts/needs.sh): Debian's
# mosquitto (the external-broker tests), ejabberd (the two-node cluster
# test), victoria-metrics (the InfluxDB sink tests start their own) and
# PostgreSQL (the PostgreSQL store tests start their own server);
# chromium (the HTML report is loaded in it); for the deployment tests
# the aarch64 Rust target, the aarch64 cross gcc with its C library (ring's
# C code), qemu-user-static registered with binfmt_misc, and
# systemd-analyze; man (the generated man pages are rendered with it);
# Debian's Slurm and munge (the Slurm test starts its own one-node cluster);
# pyspark and numpy from PyPI in target/spark-venv, on Debian's OpenJDK 17
# (the Spark test starts its own standalone master and worker); Optuna 5 from
# PyPI in target/optuna-venv (an exported study is loaded by Optuna);
# pytest, pandas, setuptools and wheel from PyPI in target/python-venv (the
# Python package python/ is built, installed and passes its tests).
# Safe to run again.
#
#   scripts/test.sh [--install-only | --quick]
#
# --install-only stops after the checks and installs.
# --quick is the tier to run while working: every unit test, the engine
# driven through its turn, and the fast integration tests (real agent and
# coordinator processes on the embedded broker); no installs, no Slurm,
# Spark, qemu, ejabberd, InfluxDB, Chromium, Mosquitto or docs walk-through.
# CI runs the full command.
set -euo pipefail
cd "$(dirname "$0")/.."

install_only=0
quick=0
case "${1:-}" in
  "") ;;
  --install-only) install_only=1 ;;
  --quick) quick=1 ;;
  *) echo "test.sh: unknown argument $1 (scripts/test.sh [--install-only | --quick])" >&2; exit 2 ;;
esac

# The quick tier is plain `cargo test --workspace`: the test files and
# tests that need installs or minutes are marked in code (the tests
# crate's `full` feature: `#![cfg(feature = "full")]` on a file,
# `#[cfg_attr(not(feature = "full"), ignore)]` on a test), so a new test
# file lands in the quick tier unless it says otherwise.
if [ $quick = 1 ]; then
  cargo test --workspace --quiet
  exit 0
fi

# shellcheck source=scripts/needs.sh
. scripts/needs.sh
needs mosquitto ejabberd victoria-metrics postgresql systemd-analyze systemd-nspawn chromium man slurm spark optuna python3 python-package \
  rust-target:aarch64-unknown-linux-musl cc:aarch64-unknown-linux-musl qemu-aarch64
[ $install_only = 0 ] || exit 0
# Debian installs mosquitto in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --features tunefleet-tests/full --quiet -- -D warnings
# Integration tests run the real binaries: build them all first.
cargo build --workspace --bins --quiet
# The static aarch64 agent the qemu test runs (about 2 minutes from scratch
# on 2 cores, seconds when up to date).
cross/build.sh aarch64-unknown-linux-musl
cargo test --workspace --features tunefleet-tests/full
