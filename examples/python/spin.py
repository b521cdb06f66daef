"""A stand-in job for trying the helper and the pipelined mode without any
library: each epoch is `--seconds` of work shared by `trial.threads`
workers (so two threads halve it), and its loss falls with the epochs.

    python3 examples/python/spin.py --epochs 5 --seconds 0.2
"""

import argparse
import os
import sys
import threading
import time

try:
    import tunefleet
except ImportError:  # run from the repository, without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
    import tunefleet


def work(seconds, threads):
    """`seconds` of waiting split over `threads` threads (a stand-in for
    work that scales with its workers)."""
    workers = [threading.Thread(target=time.sleep, args=(seconds / threads,)) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.2, help="work per epoch on one thread")
    p.add_argument("--scale", type=float, default=1.0, help="a hyper-parameter: the loss is scaled by it")
    args = p.parse_args()
    trial = tunefleet.Trial()
    loss = 1.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        work(args.seconds, trial.threads)
        loss = args.scale / epoch
        trial.epoch(epoch, loss=loss, epoch_seconds=time.perf_counter() - start, last=epoch == args.epochs)
    trial.final(loss=loss)


if __name__ == "__main__":
    main()
