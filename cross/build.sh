#!/usr/bin/env bash
# Builds tunefleet-agent for each TARGET with local toolchains (no container
# engine), installing what fails its check (scripts/needs.sh checks each
# need by using it), and prints where each binary is.
#
#   cross/build.sh [--profile PROFILE] [--no-install] [TARGET...]
#
# TARGET defaults to aarch64-unknown-linux-musl. Supported:
#   aarch64-unknown-linux-musl      static; Graviton, ARM servers, Android phones (adb)
#   armv7-unknown-linux-musleabihf  static; 32-bit ARM (no perf counters on armv7)
#   x86_64-unknown-linux-musl       static; any x86_64 Linux, batch containers
#   aarch64-unknown-linux-gnu       glibc, dynamically linked
#   armv7-unknown-linux-gnueabihf   glibc, dynamically linked
# PROFILE defaults to `small` (size-optimised, stripped; see Cargo.toml).
#
# The musl targets link with rust-lld (.cargo/config.toml): no C cross
# compiler is needed unless a dependency compiles C. When one does (ring,
# for TLS), the distribution's cross gcc compiles it (.cargo/config.toml
# names it; set CC_<target> to use another) with the C library's headers
# (libc6-dev-arm64-cross), and the glibc targets always link with it. With
# --no-install nothing is installed: a need that fails its check is an error
# naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=small
install=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) [ $# -ge 2 ] || { echo "build.sh: --profile needs a value" >&2; exit 2; }; profile=$2; shift 2 ;;
    --profile=*) profile=${1#--profile=}; shift ;;
    --no-install) install=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(aarch64-unknown-linux-musl)

# Each need is checked by using it; what fails is installed (scripts/needs.sh).
# shellcheck source=scripts/needs.sh
. scripts/needs.sh
no_install=()
[ $install = 1 ] || no_install=(--no-install)

# Does the agent, built for $1, compile C (the `cc` crate: ring for TLS)?
compiles_c() {
  cargo tree -p tunefleet-agent --target "$1" -e normal,build --prefix none --quiet 2>/dev/null \
    | grep -qE '^(cc|ring) v'
}

failed=()
built=()
for target in "${targets[@]}"; do
  case "$target" in
    aarch64-unknown-linux-musl | aarch64-unknown-linux-gnu | armv7-unknown-linux-musleabihf | \
      armv7-unknown-linux-gnueabihf | x86_64-unknown-linux-musl) ;;
    *) echo "build.sh: unsupported target $target (see --help)" >&2; failed+=("$target"); continue ;;
  esac
  wanted=("rust-target:$target")
  # The glibc targets link with the cross gcc; the musl ones need it only
  # when a dependency compiles C.
  if [[ "$target" == *-gnu* ]] || compiles_c "$target"; then wanted+=("cc:$target"); fi
  if ! needs "${no_install[@]}" "${wanted[@]}"; then failed+=("$target"); continue; fi
  echo "build.sh: building tunefleet-agent for $target (profile $profile)" >&2
  # A static (musl) agent cannot load the GPU driver's library: built
  # without NVML (its `probe` says so), and no bigger for it.
  features=()
  [[ "$target" == *-musl* ]] && features=(--no-default-features)
  if ! cargo build --quiet -p tunefleet-agent --profile "$profile" --target "$target" "${features[@]}"; then
    failed+=("$target")
    continue
  fi
  dir=$profile
  [ "$profile" = dev ] && dir=debug
  built+=("$target/$dir/tunefleet-agent")
done

target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
for rel in "${built[@]}"; do
  bin="$target_dir/$rel"
  printf '%s\t%s bytes\t%s\n' "$bin" "$(stat -c %s "$bin")" "$(file -b "$bin" 2>/dev/null || true)"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "build.sh: not built: ${failed[*]}" >&2
  exit 1
fi
