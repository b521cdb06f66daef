# Sourced by scripts/test.sh and cross/build.sh: checks what the tests and the
# cross builds need by using it (a command that exists but cannot do the job
# fails its check), and installs only what failed.
#
#   needs [--no-install] NEED...
#
# NEED is one of:
#   mosquitto            `mosquitto -h` starts (the external-broker tests)
#   victoria-metrics     `victoria-metrics -version` starts (the InfluxDB sink tests)
#   postgresql           Debian's PostgreSQL server makes a cluster with `initdb`
#                        (as the `postgres` user under root) and `psql` runs (the
#                        PostgreSQL store tests start their own server)
#   ejabberd             Erlang loads Debian's ejabberd application, and epmd
#                        exists (the two-node cluster test runs both itself)
#   systemd-analyze      `systemd-analyze --version` starts (the systemd unit tests)
#   systemd-nspawn       `systemd-nspawn --version` starts (the agent unit's test
#                        boots a container with systemd as its init)
#   python3              Python 3.7 or newer runs with json, threading and unittest
#                        (the workload helper's tests, the Python workloads)
#   man                  `man -l` renders a page given by path (the man-page test
#                        renders the generated pages with it)
#   chromium             headless `chromium --dump-dom` loads a page and runs its
#                        script (the HTML report's browser test and benchmark)
#   rust-target:TARGET   rustc compiles a crate that uses std for TARGET
#   cc:TARGET            the C compiler cargo uses for TARGET (CC_<target> from the
#                        environment, else the one .cargo/config.toml names)
#                        compiles a file that includes <stdint.h> (ring's C); for
#                        the glibc targets, which it links, it links a program too
#   slurm                `sbatch` and `squeue` (given a minimal slurm.conf),
#                        `slurmctld`, `slurmd` and `munged` print their versions and
#                        `mungekey` makes a key (the Slurm test runs its own
#                        cluster: munged, slurmctld and slurmd)
#   spark                a virtual environment ($SPARK_VENV, default target/spark-venv
#                        of the repository) whose python imports pyspark and numpy
#                        and whose spark-submit prints its version on the machine's
#                        Java (the Spark test runs a standalone master and worker
#                        from it); installed with pip from PyPI, with Debian's
#                        python3-venv and OpenJDK 17
#   optuna               a virtual environment ($OPTUNA_VENV, default target/optuna-venv
#                        of the repository) whose python imports Optuna 5, opens
#                        a journal file (the Optuna export test loads one) and
#                        imports optuna-dashboard (which serves it); pip from
#                        PyPI, with Debian's python3-venv
#   python-package       a virtual environment ($PYTHON_VENV, default target/python-venv
#                        of the repository) whose pip builds and installs the
#                        repository's python/ package (setuptools and wheel, no
#                        build isolation: no network in the tests) and whose python
#                        imports pytest, pandas, Optuna 5 and cmaes (the package's
#                        own tests, the client driven by Optuna's CMA-ES); pip
#                        from PyPI, with Debian's python3-venv
#   qemu-aarch64         a static aarch64 program (built with aarch64-linux-gnu-gcc)
#                        runs as `qemu-aarch64-static PROGRAM` and as `PROGRAM`,
#                        which the kernel hands to qemu through binfmt_misc (the
#                        aarch64 agent re-executes itself for every trial)
#
# Installing runs `apt-get update` once, then `apt-get install` of the Debian
# packages of every failed need together, `rustup target add` for a missing
# target, and registers qemu-aarch64 with binfmt_misc; then each failed need
# is checked again. With --no-install nothing is installed and each failure
# is reported. Returns non-zero when a need still fails; prints on stderr.
#
# Debian's recommended packages are installed too (no --no-install-recommends):
# every package a check needs is named below all the same, so what is
# installed does not hang on what Debian recommends.

# The Spark test's virtual environment.
needs_spark_venv=${SPARK_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/spark-venv}
# The Python package's tests.
needs_python_venv=${PYTHON_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/python-venv}
# The Optuna export test's (and the Optuna comparisons').
needs_optuna_venv=${OPTUNA_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/optuna-venv}

needs_as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# The C compiler cargo uses for Rust target $1, as `.cargo/config.toml` sets
# it (kept in step with its [env] section) unless CC_<target> is set.
needs_cc_for() {
  local var=CC_${1//-/_}
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  case "$1" in
    aarch64-*) echo aarch64-linux-gnu-gcc ;;
    armv7-*) echo arm-linux-gnueabihf-gcc ;;
    x86_64-*) echo gcc ;;
  esac
}

# What the last failed check printed, shown when a need still fails.
needs_output=

# needs_check NEED: 0 when NEED does its job on this machine.
needs_check() {
  local need=$1 dir status=0
  case "$need" in
    mosquitto)
      # Debian installs it in /usr/sbin; `-h` prints its usage and version
      # and exits non-zero, so the check reads what it printed.
      needs_output=$(PATH="$PATH:/usr/sbin" mosquitto -h 2>&1) || true
      grep -q '^mosquitto version' <<<"$needs_output"
      ;;
    victoria-metrics) needs_output=$(victoria-metrics -version 2>&1) ;;
    postgresql)
      local bin
      bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
      [ -n "$bin" ] && [ -x "$bin/initdb" ] || return 1
      dir=$(mktemp -d)
      if [ "$(id -u)" = 0 ]; then
        chown postgres "$dir" && needs_output=$(runuser -u postgres -- "$bin/initdb" -D "$dir/data" -A trust --no-sync 2>&1)
      else
        needs_output=$("$bin/initdb" -D "$dir/data" -A trust --no-sync 2>&1)
      fi
      status=$?
      rm -rf "$dir"
      [ $status = 0 ] && psql --version >/dev/null 2>&1
      ;;
    python3)
      # The workload helper's tests and the Python workloads: 3.7 or newer,
      # with the standard library's json, threading and unittest.
      needs_output=$(python3 -c 'import json, threading, unittest, sys; assert sys.version_info >= (3, 7); print("ok")' 2>&1) &&
        [ "$needs_output" = ok ]
      ;;
    ejabberd)
      # The test starts its own Erlang VMs on ejabberd's code (ERL_LIBS),
      # not ejabberdctl or the system service: the check loads it that way.
      local app=
      for app in /usr/lib/*/ejabberd-*/ebin/ejabberd.app; do [ -e "$app" ] && break; done
      [ -e "$app" ] || { needs_output="no /usr/lib/*/ejabberd-*/ebin/ejabberd.app"; return 1; }
      command -v epmd >/dev/null || { needs_output="no epmd on PATH"; return 1; }
      needs_output=$(ERL_LIBS=${app%/ejabberd-*} erl -noshell -eval \
        'ok = application:load(ejabberd), {ok, V} = application:get_key(ejabberd, vsn), io:format("ejabberd ~s~n", [V]), halt().' 2>&1)
      grep -q '^ejabberd ' <<<"$needs_output"
      ;;
    systemd-analyze) needs_output=$(systemd-analyze --version 2>&1) ;;
    systemd-nspawn) needs_output=$(systemd-nspawn --version 2>&1) ;;
    slurm)
      # Debian installs the daemons in /usr/sbin. The clients read a
      # slurm.conf before anything else (without one they look for the
      # controller in DNS): a minimal one in a temp dir serves. The test makes
      # its own munge key with mungekey, so the check makes one too.
      dir=$(mktemp -d)
      printf 'ClusterName=probe\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n' >"$dir/slurm.conf"
      needs_output=$(export PATH="$PATH:/usr/sbin" SLURM_CONF="$dir/slurm.conf" && sbatch --version 2>&1 \
        && squeue --version 2>&1 && slurmctld -V 2>&1 && slurmd -V 2>&1 && munged --version 2>&1 \
        && mungekey --create --keyfile "$dir/munge.key" 2>&1) || status=$?
      [ $status = 0 ] && [ -s "$dir/munge.key" ] || status=1
      rm -rf "$dir"
      return $status
      ;;
    optuna)
      dir=$(mktemp -d)
      needs_output=$("$needs_optuna_venv/bin/python" -c '
import sys, optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
assert optuna.__version__.startswith("5."), optuna.__version__
s = optuna.create_study(study_name="probe", storage=JournalStorage(JournalFileBackend(sys.argv[1])))
s.add_trial(optuna.trial.create_trial(value=1.0))
import optuna_dashboard
print("optuna", optuna.__version__, len(s.trials))' "$dir/probe.log" 2>&1) || status=$?
      rm -rf "$dir"
      [ $status = 0 ] && grep -q ' 1$' <<<"$needs_output"
      ;;
    python-package)
      # Building the package uses what the tests use: setuptools and wheel
      # without build isolation, then pytest and pandas import.
      dir=$(mktemp -d)
      needs_output=$("$needs_python_venv/bin/pip" wheel --quiet --no-deps --no-build-isolation \
        --disable-pip-version-check --wheel-dir "$dir" "$(dirname "${BASH_SOURCE[0]}")/../python" 2>&1 \
        && "$needs_python_venv/bin/python" -c 'import pytest, pandas, optuna, cmaes; assert optuna.__version__.startswith("5."); print("pytest", pytest.__version__, "pandas", pandas.__version__, "optuna", optuna.__version__, "cmaes", cmaes.__version__)' 2>&1) || status=$?
      ls "$dir"/tunefleet-*.whl >/dev/null 2>&1 || status=1
      rm -rf "$dir"
      [ $status = 0 ] && grep -q '^pytest ' <<<"$needs_output"
      ;;
    spark)
      needs_output=$("$needs_spark_venv/bin/python" -c 'import numpy, pyspark; print("pyspark", pyspark.__version__)' 2>&1 \
        && PATH="$needs_spark_venv/bin:$PATH" spark-submit --version 2>&1) || status=$?
      [ $status = 0 ] && grep -q 'version' <<<"$needs_output"
      ;;
    man)
      dir=$(mktemp -d)
      printf '.TH PROBE 1\n.SH NAME\nprobe \\- a page\n' >"$dir/probe.1"
      needs_output=$(man -l "$dir/probe.1" 2>&1) || status=$?
      rm -rf "$dir"
      [ $status = 0 ] && grep -q 'probe - a page' <<<"$needs_output"
      ;;
    chromium)
      # The page's script writes the answer: found only if chromium ran it.
      # --no-sandbox: chromium refuses to run as root with its sandbox.
      dir=$(mktemp -d)
      printf '<!DOCTYPE html><title>probe</title><p id="out"></p><script>document.getElementById("out").textContent = "chromium " + 6 * 7;</script>\n' >"$dir/probe.html"
      needs_output=$(chromium --headless=new --no-sandbox --disable-gpu --user-data-dir="$dir/profile" \
        --dump-dom "file://$dir/probe.html" 2>"$dir/stderr") || status=$?
      if [ $status = 0 ] && grep -q '>chromium 42<' <<<"$needs_output"; then
        rm -rf "$dir"
        return 0
      fi
      needs_output="$needs_output $(tail -n 5 "$dir/stderr" 2>/dev/null)"
      rm -rf "$dir"
      return 1
      ;;
    rust-target:*)
      dir=$(mktemp -d)
      echo 'pub fn f() -> String { std::env::args().collect() }' >"$dir/probe.rs"
      needs_output=$(rustc --edition 2021 --crate-type rlib --target "${need#rust-target:}" \
        --out-dir "$dir" "$dir/probe.rs" 2>&1) || status=$?
      rm -rf "$dir"
      return $status
      ;;
    cc:*)
      local target=${need#cc:} cc
      cc=$(needs_cc_for "$target")
      [ -n "$cc" ] || { needs_output="no C compiler is known for $target"; return 1; }
      dir=$(mktemp -d)
      printf '#include <stdint.h>\nint main(void) { uint32_t x = 42; return (int)(x - 42); }\n' >"$dir/probe.c"
      # CC_<target> may hold a command with arguments ("zig cc --target ..."): split on purpose.
      # shellcheck disable=SC2086
      needs_output=$(cd "$dir" && $cc -c probe.c -o probe.o 2>&1) || status=$?
      if [ $status = 0 ] && [[ "$target" == *-gnu* ]]; then
        # shellcheck disable=SC2086
        needs_output=$(cd "$dir" && $cc probe.o -o probe 2>&1) || status=$?
      fi
      rm -rf "$dir"
      return $status
      ;;
    qemu-aarch64)
      dir=$(mktemp -d)
      printf '#include <stdio.h>\nint main(void) { puts("aarch64 runs"); return 0; }\n' >"$dir/probe.c"
      needs_output=$(cd "$dir" && aarch64-linux-gnu-gcc -static probe.c -o probe 2>&1 \
        && qemu-aarch64-static ./probe 2>&1 && ./probe 2>&1) || status=$?
      rm -rf "$dir"
      [ $status = 0 ] && [ "$needs_output" = $'aarch64 runs\naarch64 runs' ] && return 0
      [ $status = 0 ] && needs_output="the aarch64 probe printed: $needs_output"
      return 1
      ;;
    *)
      needs_output="unknown need $need (see scripts/needs.sh)"
      return 1
      ;;
  esac
}

# needs_packages NEED: the Debian packages that make NEED pass its check.
needs_packages() {
  local var
  case "$1" in
    mosquitto) echo mosquitto ;;
    victoria-metrics) echo victoria-metrics ;;
    postgresql) echo postgresql postgresql-client ;;
    python3) echo python3 ;;
    ejabberd) echo ejabberd ;;
    systemd-analyze) echo systemd ;;
    systemd-nspawn) echo systemd-container ;;
    slurm) echo slurmctld slurmd slurm-client munge ;;
    man) echo man-db groff-base ;;
    spark) echo python3-venv openjdk-17-jre-headless ;;
    optuna) echo python3-venv ;;
    python-package) echo python3-venv ;;
    chromium) echo chromium ;;
    cc:*)
      var=CC_${1#cc:}
      var=${var//-/_}
      # A compiler the environment chose is not Debian's to fix.
      if [ -n "${!var:-}" ]; then
        echo "needs: $var is set, so nothing is installed for $1: fix that compiler or unset it" >&2
        return 0
      fi
      case "${1#cc:}" in
        aarch64-*) echo gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;;
        armv7-*) echo gcc-arm-linux-gnueabihf libc6-dev-armhf-cross ;;
        x86_64-*) echo gcc libc6-dev ;;
      esac
      ;;
    # The probe is built with the cross gcc and its static C library.
    qemu-aarch64) echo qemu-user-static binfmt-support gcc-aarch64-linux-gnu libc6-dev-arm64-cross ;;
  esac
}

# Registers qemu-aarch64 with binfmt_misc when it is not: in a container
# nothing at boot mounts binfmt_misc or imports Debian's qemu formats.
needs_binfmt_aarch64() {
  [ -e /proc/sys/fs/binfmt_misc/register ] \
    || needs_as_root mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || return 1
  local entry=/proc/sys/fs/binfmt_misc/qemu-aarch64
  grep -qx enabled "$entry" 2>/dev/null && return 0
  # Registered but switched off: update-binfmts would call it enabled.
  if [ -e "$entry" ]; then echo 1 | needs_as_root tee "$entry" >/dev/null; return; fi
  # binfmt-support imports the formats qemu-user-static ships when it is
  # installed after it; not when it came first.
  [ -e /var/lib/binfmts/qemu-aarch64 ] || needs_as_root update-binfmts --import qemu-aarch64 || return 1
  [ -e "$entry" ] || needs_as_root update-binfmts --enable qemu-aarch64
}

needs() {
  local install=1 need failed=() packages=() more=() targets=() still=()
  if [ "${1:-}" = --no-install ]; then install=0; shift; fi
  for need in "$@"; do
    needs_check "$need" || failed+=("$need")
  done
  [ ${#failed[@]} -gt 0 ] || return 0
  if [ $install = 0 ]; then
    for need in "${failed[@]}"; do
      needs_check "$need" || true
      echo "needs: $need fails its check${needs_output:+: $needs_output}" >&2
    done
    echo "needs: run without --no-install to install: ${failed[*]}" >&2
    return 1
  fi
  for need in "${failed[@]}"; do
    case "$need" in
      rust-target:*) targets+=("${need#rust-target:}") ;;
      *)
        read -ra more <<<"$(needs_packages "$need")"
        packages+=("${more[@]}")
        ;;
    esac
  done
  if [ ${#packages[@]} -gt 0 ]; then
    # One package can serve two needs (cc:aarch64-... and qemu-aarch64).
    mapfile -t packages < <(printf '%s\n' "${packages[@]}" | sort -u)
    echo "needs: failed: ${failed[*]}; installing ${packages[*]}" >&2
    needs_as_root apt-get update -qq >&2
    needs_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >&2
  fi
  for need in "${targets[@]}"; do
    echo "needs: rustup target add $need" >&2
    RUST_BACKTRACE=0 rustup target add "$need" >&2 || true
  done
  for need in "${failed[@]}"; do
    if [ "$need" = qemu-aarch64 ]; then needs_binfmt_aarch64 >&2 || true; fi
    if [ "$need" = spark ]; then
      echo "needs: pip install pyspark==4.3.0 numpy into $needs_spark_venv" >&2
      { python3 -m venv "$needs_spark_venv" \
        && "$needs_spark_venv/bin/pip" install --quiet --disable-pip-version-check pyspark==4.3.0 numpy; } >&2 || true
    fi
    if [ "$need" = python-package ]; then
      echo "needs: pip install pytest pandas setuptools wheel 'optuna>=5,<6' cmaes into $needs_python_venv" >&2
      { python3 -m venv "$needs_python_venv" \
        && "$needs_python_venv/bin/pip" install --quiet --disable-pip-version-check pytest pandas setuptools wheel \
          'optuna>=5,<6' cmaes; } >&2 || true
    fi
    if [ "$need" = optuna ]; then
      echo "needs: pip install 'optuna>=5,<6' optuna-dashboard into $needs_optuna_venv" >&2
      { python3 -m venv "$needs_optuna_venv" \
        && "$needs_optuna_venv/bin/pip" install --quiet --disable-pip-version-check 'optuna>=5,<6' optuna-dashboard; } >&2 || true
    fi
    if ! needs_check "$need"; then
      echo "needs: $need still fails its check${needs_output:+: $needs_output}" >&2
      still+=("$need")
    fi
  done
  [ ${#still[@]} -eq 0 ]
}
