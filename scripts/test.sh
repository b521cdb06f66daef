#!/usr/bin/env bash
# Runs every Tunefleet test. Installs what the tests need when it is missing:
# Debian's mosquitto (the external-broker tests). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || missing+=(mosquitto)
if [ ${#missing[@]} -gt 0 ]; then
  echo "test.sh: installing ${missing[*]}"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian installs mosquitto in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
# Integration tests run the real binaries: build them all first.
cargo build --workspace --bins --quiet
cargo test --workspace
