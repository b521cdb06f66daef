#!/usr/bin/env bash
# Builds tunefleet-agent for each TARGET with local toolchains (no container
# engine), installing what is missing, and prints where each binary is.
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
# names it; set CC_<target> to use another), and the glibc targets always
# link with it. With --no-install nothing is installed: a missing piece is an
# error naming it.
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

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=0
need_package() { # need_package COMMAND DEBIAN-PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  if [ $install = 0 ]; then
    echo "build.sh: $1 is missing (Debian package $2); run without --no-install to install it" >&2
    return 1
  fi
  echo "build.sh: installing $2 for $1" >&2
  if [ $apt_updated = 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >&2
}

need_target() { # need_target TARGET
  rustup target list --installed | grep -qx "$1" && return 0
  if [ $install = 0 ]; then
    echo "build.sh: the Rust standard library for $1 is missing; run: rustup target add $1" >&2
    return 1
  fi
  echo "build.sh: rustup target add $1" >&2
  if ! RUST_BACKTRACE=0 rustup target add "$1" >&2; then
    echo "build.sh: rustup cannot install the standard library for $1 from this machine" >&2
    return 1
  fi
}

# Does the agent, built for $1, compile C (the `cc` crate: ring for TLS)?
compiles_c() {
  cargo tree -p tunefleet-agent --target "$1" -e normal,build --prefix none --quiet 2>/dev/null \
    | grep -qE '^(cc|ring) v'
}

failed=()
built=()
for target in "${targets[@]}"; do
  case "$target" in
    aarch64-unknown-linux-musl | aarch64-unknown-linux-gnu) gcc=aarch64-linux-gnu-gcc; pkg=gcc-aarch64-linux-gnu ;;
    armv7-unknown-linux-musleabihf | armv7-unknown-linux-gnueabihf) gcc=arm-linux-gnueabihf-gcc; pkg=gcc-arm-linux-gnueabihf ;;
    x86_64-unknown-linux-musl) gcc=gcc; pkg=gcc ;;
    *) echo "build.sh: unsupported target $target (see --help)" >&2; failed+=("$target"); continue ;;
  esac
  if ! need_target "$target"; then failed+=("$target"); continue; fi
  # .cargo/config.toml names $gcc as the target's C compiler (CC_<target>);
  # a CC_<target> already in the environment wins, so then nothing is installed.
  var=CC_${target//-/_}
  if [ -z "${!var:-}" ] && { [[ "$target" == *-gnu* ]] || compiles_c "$target"; }; then
    if ! need_package "$gcc" "$pkg"; then failed+=("$target"); continue; fi
  fi
  echo "build.sh: building tunefleet-agent for $target (profile $profile)" >&2
  if ! cargo build --quiet -p tunefleet-agent --profile "$profile" --target "$target"; then
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
