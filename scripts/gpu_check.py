"""What scripts/gpu-check.sh prints (issue 38): for each trial of the GPU
study, the energy the agent read through NVML against nvidia-smi's power
readings integrated over the same window, and the share of the trial's
energy that was its GPU's.

    python3 scripts/gpu_check.py STORE POWER_CSV

STORE is the study's SQLite store; POWER_CSV what
`nvidia-smi --query-gpu=timestamp,uuid,power.draw --format=csv,noheader,nounits -lms 100`
wrote while the study ran (timestamps in the machine's local time, as
nvidia-smi prints them).
"""

import datetime
import json
import sqlite3
import statistics
import sys

GOAL = 0.05


def read_power(path):
    """{uuid: [(unix seconds, watts)]}, in time order."""
    series = {}
    with open(path) as f:
        for line in f:
            fields = [x.strip() for x in line.split(",")]
            if len(fields) < 3:
                continue
            try:
                at = datetime.datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                watts = float(fields[2])
            except ValueError:
                continue
            series.setdefault(fields[1], []).append((at, watts))
    for points in series.values():
        points.sort()
    return series


def at(points, t):
    """Watts at `t`, linearly between the samples around it."""
    for (t0, w0), (t1, w1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return w0 if t1 == t0 else w0 + (w1 - w0) * (t - t0) / (t1 - t0)
    return None


def integrate(points, start, end):
    """Joules over [start, end] by trapezoids; None when the samples do not cover it."""
    if not points or points[0][0] > start or points[-1][0] < end:
        return None
    inside = [(t, w) for t, w in points if start < t < end]
    edges = [(start, at(points, start))] + inside + [(end, at(points, end))]
    if any(w is None for _, w in edges):
        return None
    return sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in zip(edges, edges[1:]))


def main(store, power_csv):
    power = read_power(power_csv)
    db = sqlite3.connect(store)
    rows = db.execute(
        "SELECT study, trial, energy_j, gpu_energy_j, measurement FROM results ORDER BY study, trial"
    ).fetchall()
    ratios, shares = [], []
    print("trial  GPU            NVML (J)  nvidia-smi (J)  ratio   trial (J)  GPU share  method")
    for study, trial, energy, gpu_energy, text in rows:
        m = json.loads(text)
        start = m["started_unix_ms"] / 1000.0
        end = start + m["wall_us"] / 1e6
        for g in m.get("gpus", []):
            smi = integrate(power.get(g["uuid"], []), start, end)
            ratio = g["joules"] / smi if smi else None
            share = gpu_energy / energy if gpu_energy is not None and energy else None
            if ratio is not None:
                ratios.append(ratio)
            if share is not None:
                shares.append(share)
            print(
                "%-5s  %-13s  %8.1f  %14s  %5s  %9s  %9s  %s%s"
                % (
                    trial,
                    g["uuid"][:13],
                    g["joules"],
                    "-" if smi is None else "%.1f" % smi,
                    "-" if ratio is None else "%.3f" % ratio,
                    "-" if energy is None else "%.1f" % energy,
                    "-" if share is None else "%.1f %%" % (100 * share),
                    g["method"],
                    "" if g["valid"] else " (invalid: %s)" % g.get("note"),
                )
            )
    if not ratios:
        print("no trial had a GPU reading covered by nvidia-smi's samples")
        return 1
    within = sum(abs(r - 1) <= GOAL for r in ratios)
    print(
        "NVML against nvidia-smi: median ratio %.3f (%.3f to %.3f), %d of %d within %d %%"
        % (statistics.median(ratios), min(ratios), max(ratios), within, len(ratios), GOAL * 100)
    )
    if shares:
        print(
            "the GPU's share of a trial's energy: median %.1f %% (%.1f to %.1f %%)"
            % (100 * statistics.median(shares), 100 * min(shares), 100 * max(shares))
        )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
