"""Runs one study the way the benchmark scripts measure it (imported by
scripts/bench-pipeline.py and scripts/bench-spark.py): `tunefleet run` on
an embedded broker of a free port, one agent of one slot joining with an
enrolment token, until the coordinator exits."""

import os
import re
import signal
import subprocess
import sys
import time


def run(work, name, study, env, agent_args=(), cwd=None):
    """Runs `study` into `{work}/{name}.db` (logs beside it) with `env`
    (its XDG_STATE_HOME holds the keys) and one agent started with
    `agent_args` in `cwd`; returns the coordinator's wall seconds, start to
    exit. Exits with the logs' tail when the coordinator or the agent fails."""
    log = f"{work}/{name}"
    root = f"bench-{name}-{os.getpid()}"
    # A coordinator trusts no agent by default, nor an agent a coordinator.
    token = subprocess.run(["tunefleet", "token", "create", "--store", f"{log}.db"], env=env, check=True,
                           capture_output=True, text=True).stdout.strip()
    start = time.monotonic()
    coord = subprocess.Popen(
        ["tunefleet", "run", study, "--store", f"{log}.db", "--root", root, "--quiet", "--listen", "127.0.0.1:0"],
        stdout=open(f"{log}.coordinator.out", "w"), stderr=open(f"{log}.coordinator.err", "w"), env=env,
    )
    url = None
    deadline = time.monotonic() + 30
    while url is None:
        with open(f"{log}.coordinator.out") as f:
            m = re.search(r"^broker: (\S+)", f.read(), re.M)
        if m:
            url = m.group(1)
        elif coord.poll() is not None or time.monotonic() > deadline:
            coord.kill()
            sys.exit(f"{name}: the coordinator printed no broker URL:\n" + open(f"{log}.coordinator.err").read())
        else:
            time.sleep(0.05)
    agent = subprocess.Popen(
        ["tunefleet-agent", "--broker", url, "--name", f"{root}-agent", "--root", root, "--slots", "1",
         "--join", token, *agent_args],
        stdout=subprocess.DEVNULL, stderr=open(f"{log}.agent.err", "w"), env=env, cwd=cwd,
    )
    while coord.poll() is None:
        if agent.poll() is not None:
            coord.kill()
            sys.exit(f"{name}: the agent exited with {agent.returncode}:\n"
                     + "".join(open(f"{log}.agent.err").readlines()[-5:]))
        time.sleep(0.05)
    seconds = time.monotonic() - start
    agent.send_signal(signal.SIGTERM)
    agent.wait()
    if coord.returncode != 0:
        sys.exit(f"{name}: tunefleet run exited with {coord.returncode}:\n"
                 + "".join(open(f"{log}.coordinator.err").readlines()[-20:]))
    return seconds
