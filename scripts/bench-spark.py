"""The Spark k-means study of examples/studies/spark-submit.toml, tuned on a
standalone cluster of this machine, and its best configuration against
Spark's default executor settings (issue 24). Driven by
scripts/bench-spark.sh (read its header)."""

import json
import os
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
import tomllib

import benchstudy

REPEATS = int(os.environ.get("REPEATS", "5"))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = os.path.join(REPO, "examples/studies/spark-submit.toml")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_log(path, text, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in open(path).read():
            return
        if proc.poll() is not None:
            sys.exit(f"bench-spark: {path}: the daemon exited before {text!r}")
        time.sleep(0.1)
    sys.exit(f"bench-spark: no {text!r} in {path}")


def main():
    work, venv = sys.argv[1], sys.argv[2]
    python = f"{venv}/bin/python"
    home = subprocess.run([python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    for sub in ("local", "work", "logs", "state"):
        os.makedirs(f"{work}/{sub}", exist_ok=True)
    port = free_port()
    master = f"spark://127.0.0.1:{port}"
    env = dict(os.environ, PATH=f"{venv}/bin:{os.environ['PATH']}", SPARK_HOME=home, PYSPARK_PYTHON=python,
               SPARK_LOCAL_IP="127.0.0.1", SPARK_LOCAL_DIRS=f"{work}/local", SPARK_LOG_DIR=f"{work}/logs",
               SPARK_WORKER_DIR=f"{work}/work", MASTER=master, XDG_STATE_HOME=f"{work}/state")
    daemons = []
    try:
        log = f"{work}/logs/master.log"
        daemons.append(subprocess.Popen(
            ["spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(free_port())], stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=env,
            start_new_session=True))
        wait_log(log, "Successfully started service 'sparkMaster'", daemons[0])
        daemons.append(subprocess.Popen(
            ["spark-class", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "2",
             "--memory", "4g", "--webui-port", str(free_port()), "--work-dir", f"{work}/work", master],
            stdout=subprocess.DEVNULL, stderr=open(f"{work}/logs/worker.log", "w"), env=env, start_new_session=True))
        wait_log(log, "Registering worker", daemons[1])
        seconds = tune(work, env)
        report(work, env, seconds)
    finally:
        for d in daemons:
            try:
                os.killpg(d.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            d.wait()


def tune(work, env):
    """The study as written, its agent tagged for it in the repository (the
    script path is relative); its wall seconds."""
    return benchstudy.run(work, "spark", STUDY, env, ["--tag", "role=spark-edge"], cwd=REPO)


def study():
    with open(STUDY, "rb") as f:
        return tomllib.load(f)


def argv(params, defaults):
    """The study's command for `params`; `None`: without executor settings
    (Spark's default) and `defaults` for the rest."""
    command = study()["command"]
    out, skip = [], False
    for i, a in enumerate(command):
        if skip:
            skip = False
            continue
        default_only = a in ("--executor-cores", "--executor-memory") or (
            a == "--conf" and i + 1 < len(command) and command[i + 1].startswith("spark.cores.max"))
        if params is None and default_only:
            skip = True
            continue
        out.append(re.sub(r"\{(\w+)\}", lambda m: str((params or defaults)[m.group(1)]), a))
    return out


def report(work, env, seconds):
    db = sqlite3.connect(f"{work}/spark.db")
    rows = db.execute("SELECT t.params, r.objective, r.energy_j, r.energy_source FROM results r JOIN trials t"
                      " USING (study, trial) WHERE r.success = 1 ORDER BY r.objective").fetchall()
    print(f"Study spark-kmeans: {len(rows)} trials in {seconds:.1f} s (tunefleet run, start to exit)\n")
    print("| partitions | executor cores | executor memory MiB | wall time s | energy J (source) |")
    print("|---|---|---|---|---|")
    for params, objective, energy, source in rows:
        p = json.loads(params)
        print(f"| {p['partitions']} | {p['cores']} | {p['memory']} | {objective:.2f} | {energy or 0:.0f} ({source}) |")
    if not rows:
        sys.exit("bench-spark: no trial succeeded; see the agent's log in the kept dir (BENCH_KEEP=1)")
    best = json.loads(rows[0][0])
    # Spark's default: no executor settings (standalone: every core of the
    # worker, 1 GiB), the best trial's partitions.
    defaults = {"partitions": best["partitions"]}
    env = dict(env, **study().get("env", {}))
    runs = {"best": [], "default": []}
    for _ in range(REPEATS):
        for name, params in (("best", best), ("default", None)):
            start = time.monotonic()
            subprocess.run(argv(params, defaults), cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            runs[name].append(time.monotonic() - start)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\nRe-measured outside Tunefleet, {REPEATS} interleaved rounds (wall time of spark-submit, s):\n")
    print("| configuration | median | min | max |")
    print("|---|---|---|---|")
    print(f"| best found: partitions {best['partitions']}, executor cores {best['cores']}, memory {best['memory']} MiB "
          f"| {med['best']:.2f} | {min(runs['best']):.2f} | {max(runs['best']):.2f} |")
    print(f"| Spark's default executor settings, partitions {best['partitions']} | {med['default']:.2f} "
          f"| {min(runs['default']):.2f} | {max(runs['default']):.2f} |")
    print(f"\nbest / default: {med['best'] / med['default']:.3f}")


if __name__ == "__main__":
    main()
