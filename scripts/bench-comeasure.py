"""The cost of co-measurement (issue 24), run by scripts/bench-comeasure.sh.

The same study of short trials (`sleep`), run by one agent tagged
role=driver, with two more agents tagged role=worker online, once as it is
and once with `[measure] nodes = { tags = { role = "worker" } }`: the two
workers then measure their machine over every trial. Rounds alternate the
order. From each process's own rusage (wait4): the coordinator's CPU per
trial, and the workers' CPU over the study (idle agents send telemetry in
both modes; the difference is what measuring costs). Messages per trial
and node are counted from the coordinator's store: one answer stored per
node and trial (each answer follows a Start and a Window sent to it)."""

import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time

work, rounds, trials, sleep_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

STUDY = """name = "co"
command = ["sleep", "{sleep}"]
timeout = 60
[objective]
metric = "wall_time"
direction = "minimize"
[budget]
trials = {trials}
[strategy]
kind = "random"
seed = 1
[hyper.x]
kind = "int"
low = 1
high = 1000000
[selector]
tags = {{ role = "driver" }}
"""
MEASURE = '[measure]\nnodes = { tags = { role = "worker" } }\n'


def cpu_s(ru):
    return ru.ru_utime + ru.ru_stime


def reap(p, sig=None):
    if sig is not None:
        p.send_signal(sig)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru


def run(name, measure):
    env = dict(os.environ, XDG_STATE_HOME=f"{work}/{name}.state")
    study = f"{work}/{name}.toml"
    with open(study, "w") as f:
        f.write(STUDY.format(sleep=sleep_s, trials=trials) + (MEASURE if measure else ""))
    db = f"{work}/{name}.db"
    root = f"bench-{name}-{os.getpid()}"
    token = subprocess.run(["tunefleet", "token", "create", "--store", db], env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    coord = subprocess.Popen(
        ["tunefleet", "run", study, "--store", db, "--root", root, "--quiet", "--listen", "127.0.0.1:0"],
        stdout=open(f"{work}/{name}.coordinator.out", "w"), stderr=open(f"{work}/{name}.coordinator.err", "w"), env=env,
    )
    url = None
    while url is None:
        m = re.search(r"^broker: (\S+)", open(f"{work}/{name}.coordinator.out").read(), re.M)
        if m:
            url = m.group(1)
        elif coord.poll() is not None:
            sys.exit(f"{name}: no broker URL:\n" + open(f"{work}/{name}.coordinator.err").read())
        else:
            time.sleep(0.05)

    def agent(who, tag, cpus):
        return subprocess.Popen(
            ["tunefleet-agent", "--broker", url, "--name", f"{root}-{who}", "--root", root, "--join", token,
             "--tag", f"role={tag}", "--cpus", cpus],
            stdout=subprocess.DEVNULL, stderr=open(f"{work}/{name}.{who}.err", "w"), env=env,
        )

    workers = [agent("w1", "worker", "1"), agent("w2", "worker", "1")]
    # Both workers in the fleet before the first trial is assigned.
    while True:
        try:
            online = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM agents WHERE online = 1")}
        except sqlite3.Error:
            online = set()
        if {f"{root}-w1", f"{root}-w2"} <= online:
            break
        time.sleep(0.05)
    start = time.monotonic()
    driver = agent("driver", "driver", "0")
    coord_ru = reap(coord)
    seconds = time.monotonic() - start
    if coord.returncode != 0:
        sys.exit(f"{name}: tunefleet run exited with {coord.returncode}:\n"
                 + "".join(open(f"{work}/{name}.coordinator.err").readlines()[-20:]))
    reap(driver, signal.SIGTERM)
    worker_cpu = sum(cpu_s(reap(w, signal.SIGTERM)) for w in workers)
    con = sqlite3.connect(db)
    answers = con.execute("SELECT COUNT(*) FROM node_measurements WHERE valid = 1").fetchone()[0]
    invalid = con.execute("SELECT COUNT(*) FROM node_measurements WHERE valid = 0").fetchone()[0]
    done = con.execute("SELECT COUNT(*) FROM results WHERE study = 'co'").fetchone()[0]
    return dict(seconds=seconds, coord_cpu=cpu_s(coord_ru), worker_cpu=worker_cpu, answers=answers,
                invalid=invalid, done=done)


rows = {False: [], True: []}
for r in range(rounds):
    order = [False, True] if r % 2 == 0 else [True, False]
    for measure in order:
        res = run(f"r{r}-{'co' if measure else 'plain'}", measure)
        rows[measure].append(res)
        print(f"round {r + 1} {'co-measured' if measure else 'plain      '}: {res['done']} trials in "
              f"{res['seconds']:.1f} s, coordinator CPU {res['coord_cpu'] * 1e3:.0f} ms, workers' CPU "
              f"{res['worker_cpu'] * 1e3:.0f} ms, node answers {res['answers']} valid / {res['invalid']} invalid or missing",
              flush=True)


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


print()
print(f"{rounds} rounds, {trials} trials of `sleep {sleep_s}` each, 2 nodes (medians, min..max):")
for measure in (False, True):
    rs = rows[measure]
    c = med([x["coord_cpu"] / x["done"] * 1e6 for x in rs])
    w = med([x["worker_cpu"] / x["seconds"] * 100 / 2 for x in rs])
    s = med([x["seconds"] for x in rs])
    print(f"  {'co-measured' if measure else 'plain'}: coordinator CPU per trial {c[0]:.0f} us ({c[1]:.0f}..{c[2]:.0f}); "
          f"each worker agent's CPU {w[0]:.2f} % of a core ({w[1]:.2f}..{w[2]:.2f}); study {s[0]:.1f} s ({s[1]:.1f}..{s[2]:.1f})")
per_round = [(co["coord_cpu"] / co["done"] - pl["coord_cpu"] / pl["done"]) * 1e6 for pl, co in zip(rows[False], rows[True])]
agent = [(co["worker_cpu"] / co["seconds"] - pl["worker_cpu"] / pl["seconds"]) * 100 / 2 for pl, co in zip(rows[False], rows[True])]
print(f"  co-measurement adds, per round: coordinator {', '.join(f'{x:.0f}' for x in per_round)} us per trial "
      f"(2 nodes); each worker {', '.join(f'{x:.2f}' for x in agent)} % of a core while measuring")
print(f"  messages per trial and node: Start and Window down, one answer up (answers stored: "
      f"{sum(x['answers'] for x in rows[True])} for {sum(x['done'] for x in rows[True])} trials)")
