#!/usr/bin/env python3
"""The whole path on each store, and Optuna on the same server.

Side by side in one run, alternating, on one machine: a study of TRIALS
trials of `true` (random search over one float, objective wall_time) run by
`tunefleet run` with AGENTS real agents of SLOTS slots each, into a SQLite
file and into a PostgreSQL store (a cluster this script starts on a free
port); and Optuna 5 with AGENTS x SLOTS worker processes on the same
PostgreSQL server (RDBStorage, RandomSampler), each running `true` per
trial. Prints one JSON line per run and the medians with their spread.

Usage: scripts/bench-store.py [--trials N] [--agents N] [--slots N]
       [--pairs N] [--bin DIR] [--python PY] [--sides sqlite,postgres,optuna]
       [--statements]
The Optuna side needs psycopg2 in its virtual environment
(target/optuna-venv/bin/pip install psycopg2-binary).
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

OPTUNA_WORKER = r"""
import subprocess, sys, time, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, name, n, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
study = optuna.load_study(study_name=name, storage=url, sampler=optuna.samplers.RandomSampler(seed=seed))
def objective(trial):
    trial.suggest_float("x", 0.0, 1.0)
    t = time.monotonic()
    subprocess.run(["true"], check=True)
    return time.monotonic() - t
study.optimize(objective, n_trials=n)
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bin():
    versions = sorted(os.listdir("/usr/lib/postgresql"))
    return f"/usr/lib/postgresql/{versions[-1]}/bin"


def as_postgres(cmd):
    return ["runuser", "-u", "postgres", "--"] + cmd if os.geteuid() == 0 else cmd


def start_postgres(dir, statements=False):
    data = os.path.join(dir, "data")
    os.makedirs(data)
    if os.geteuid() == 0:
        shutil.chown(dir, "postgres")
        shutil.chown(data, "postgres")
    b = pg_bin()
    subprocess.run(as_postgres([f"{b}/initdb", "-D", data, "-A", "trust", "-U", "tunefleet"]),
                   check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    opts = f"-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
    if statements:
        opts += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
    subprocess.run(as_postgres([f"{b}/pg_ctl", "-D", data, "-o", opts, "-l", os.path.join(dir, "log"), "-w", "start"]),
                   check=True, stdout=subprocess.DEVNULL)
    return port, lambda: subprocess.run(as_postgres([f"{b}/pg_ctl", "-D", data, "-m", "fast", "stop"]),
                                        stdout=subprocess.DEVNULL)


def study_file(dir, name, trials):
    path = os.path.join(dir, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f'''name = "{name}"
command = ["true", "{{x}}"]
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = {trials}
[strategy]
kind = "random"
seed = 1
[hyper.x]
kind = "float"
low = 0.0
high = 1.0
''')
    return path


def server_cpu_s(data):
    """CPU seconds of the PostgreSQL server whose data directory is `data`:
    its postmaster, with what its reaped children used (a backend that
    served a closed connection), and its running children."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open(os.path.join(data, "postmaster.pid")) as f:
            postmaster = int(f.readline())
    except (OSError, ValueError):
        return 0.0
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(pid) == postmaster:
            total += sum(int(x) for x in rest[11:15])  # utime, stime, cutime, cstime
        elif int(rest[1]) == postmaster:
            total += int(rest[11]) + int(rest[12])
    return total / tick


def psql(port, sql):
    return subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "tunefleet", "-d", "postgres",
                           "-At", "-F", "\t", "-c", sql], check=True, capture_output=True, text=True).stdout


def statements(port, trials):
    """The server's statements since the last call, most time first: calls
    and server time (execution and planning) per trial."""
    rows = psql(port, "SELECT calls, total_exec_time + total_plan_time, regexp_replace(query, '\\s+', ' ', 'g') "
                      "FROM pg_stat_statements "
                      "ORDER BY 2 DESC")
    psql(port, "SELECT pg_stat_statements_reset()")
    out, calls, ms = [], 0, 0.0
    for line in rows.splitlines():
        c, t, q = line.split("\t", 2)
        if "pg_stat_statements" in q:
            continue
        calls, ms = calls + int(c), ms + float(t)
        out.append({"calls_per_trial": round(int(c) / trials, 2), "us_per_trial": round(float(t) * 1e3 / trials, 1),
                    "query": " ".join(q.split())[:110]})
    db = psql(port, "SELECT sum(xact_commit), sum(xact_rollback) FROM pg_stat_database").split()
    wal = psql(port, "SELECT wal_records, wal_bytes, wal_sync FROM pg_stat_wal").split()
    psql(port, "SELECT pg_stat_reset(), pg_stat_reset_shared('wal')")
    return {"calls_per_trial": round(calls / trials, 2), "us_per_trial": round(ms * 1e3 / trials, 1),
            "commits_per_trial": round(int(db[0]) / trials, 2), "rollbacks": int(db[1]),
            "wal_records_per_trial": round(int(wal[0]) / trials, 1), "wal_bytes_per_trial": round(int(wal[1]) / trials),
            "wal_syncs_per_trial": round(int(wal[2]) / trials, 2), "top": out[:15]}


def children_cpu_s():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def tunefleet(bin, dir, store, name, a):
    study = study_file(dir, name, a.trials)
    env = dict(os.environ, XDG_STATE_HOME=os.path.join(dir, "state"))
    start = time.monotonic()
    coord = subprocess.Popen([f"{bin}/tunefleet", "run", study, "--store", store, "--listen", "127.0.0.1:0",
                              "--quiet", "--open-enrolment", "--root", name],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    url = None
    for line in coord.stdout:
        if line.startswith("broker: "):
            url = line.split(" ", 1)[1].strip()
            break
    agents = [subprocess.Popen([f"{bin}/tunefleet-agent", "--broker", url, "--name", f"{name}-{i}", "--root", name,
                                "--slots", str(a.slots), "--trust-first-coordinator", "--exit-when-idle=2s",
                                "--state-dir", os.path.join(dir, f"{name}-{i}")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
              for i in range(a.agents)]
    out = coord.stdout.read()
    code = coord.wait()
    wall = time.monotonic() - start
    for p in agents:
        p.wait(timeout=60)
    done = f"{a.trials}/{a.trials} trials done" in out
    return {"side": name.split("-")[0], "trials": a.trials, "wall_s": wall, "trials_per_s": a.trials / wall,
            "exit": code, "all_done": done}


def optuna_side(py, url, name, a):
    subprocess.run([py, "-c", f"import optuna; optuna.create_study(study_name='{name}', storage='{url}')"],
                   check=True)
    workers = a.agents * a.slots
    per = [a.trials // workers + (1 if i < a.trials % workers else 0) for i in range(workers)]
    start = time.monotonic()
    procs = [subprocess.Popen([py, "-c", OPTUNA_WORKER, url, name, str(n), str(i)]) for i, n in enumerate(per)]
    codes = [p.wait() for p in procs]
    wall = time.monotonic() - start
    done = subprocess.run([py, "-c", f"import optuna; print(len(optuna.load_study(study_name='{name}', "
                           f"storage='{url}').trials))"], capture_output=True, text=True).stdout.strip()
    return {"side": "optuna", "trials": a.trials, "wall_s": wall, "trials_per_s": a.trials / wall,
            "exit": max(codes), "all_done": done == str(a.trials)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--agents", type=int, default=2)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--bin", default="target/release")
    p.add_argument("--python", default="target/optuna-venv/bin/python")
    p.add_argument("--sides", default="sqlite,postgres,optuna", help="which to run, comma-separated")
    p.add_argument("--statements", action="store_true",
                   help="print the server's statements a trial after each run (pg_stat_statements)")
    a = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as dir:
        os.chmod(dir, 0o755)  # the server's user walks into it
        port, stop = start_postgres(os.path.join(dir, "pg"), a.statements)
        data = os.path.join(dir, "pg", "data")
        try:
            if a.statements:
                psql(port, "CREATE EXTENSION pg_stat_statements")
            for k in range(a.pairs):
                pg = f"postgres://tunefleet@127.0.0.1:{port}/postgres?schema=bench{k}"
                order = ["sqlite", "postgres", "optuna"] if k % 2 == 0 else ["optuna", "postgres", "sqlite"]
                for side in [o for o in order if o in a.sides.split(",")]:
                    cpu = (children_cpu_s(), server_cpu_s(data))
                    if side == "sqlite":
                        r = tunefleet(a.bin, dir, os.path.join(dir, f"s{k}.db"), f"sqlite-{k}", a)
                    elif side == "postgres":
                        r = tunefleet(a.bin, dir, pg, f"postgres-{k}", a)
                    else:
                        url = f"postgresql+psycopg2://tunefleet@127.0.0.1:{port}/postgres"
                        r = optuna_side(a.python, url, f"optuna-{k}", a)
                    # CPU per trial: this script's children (the coordinator,
                    # the agents and what they ran, or Optuna's workers) and
                    # the database server's processes.
                    r["cpu_us_per_trial"] = round((children_cpu_s() - cpu[0]) / a.trials * 1e6)
                    r["server_cpu_us_per_trial"] = round((server_cpu_s(data) - cpu[1]) / a.trials * 1e6)
                    print(json.dumps(r), flush=True)
                    runs.append(r)
                    if a.statements and side != "sqlite":
                        print(json.dumps(statements(port, a.trials), indent=1), flush=True)
        finally:
            stop()
    by = {s: [r["trials_per_s"] for r in runs if r["side"] == s] for s in ("sqlite", "postgres", "optuna")}
    med = {s: statistics.median(v) for s, v in by.items() if v}
    for s, v in by.items():
        if v:
            print(f"{s}: median {med[s]:.1f} trials/s over {len(v)} runs (min {min(v):.1f}, max {max(v):.1f})")
    if "postgres" in med and "sqlite" in med:
        print(f"postgres / sqlite: {med['postgres'] / med['sqlite']:.3f}x")
    if "postgres" in med and "optuna" in med:
        print(f"tunefleet on postgres / optuna on postgres: {med['postgres'] / med['optuna']:.2f}x")
    if not all(r["all_done"] for r in runs):
        sys.exit("a run did not finish every trial")


if __name__ == "__main__":
    main()
