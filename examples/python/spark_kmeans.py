"""Spark MLlib k-means for Tunefleet, as PipeTune's Spark KMeans: points
generated on the executors around `k` centres, clustered by MLlib's k-means
one iteration at a time (each resumed from the last model), an epoch line
per iteration with the within-cluster sum of squared errors (`cost`).
Study: examples/studies/spark-submit.toml.

    spark-submit --master spark://HOST:7077 examples/python/spark_kmeans.py --points 20000
"""

import argparse
import os
import sys
import random
import time

from pyspark import SparkConf, SparkContext
from pyspark.mllib.clustering import KMeans

try:
    import tunefleet
except ImportError:  # run from the repository, without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
    import tunefleet


def points(part, count, dims, k, seed):
    """`count` points of partition `part`: a centre drawn from `k` fixed
    ones (a grid of spacing 10), plus unit Gaussian noise."""
    rng = random.Random(seed * 1_000_003 + part)
    centres = [[10.0 * ((c >> d) & 1) + 3.0 * c for d in range(dims)] for c in range(k)]
    for _ in range(count):
        c = centres[rng.randrange(k)]
        yield [x + rng.gauss(0.0, 1.0) for x in c]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=100_000)
    p.add_argument("--dims", type=int, default=8)
    p.add_argument("--k", type=int, default=8, help="clusters to find")
    p.add_argument("--iterations", type=int, default=10, help="k-means iterations, an epoch each")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    sc = SparkContext(conf=SparkConf().setAppName("tunefleet-kmeans"))
    sc.setLogLevel("WARN")
    trial = tunefleet.Trial()
    n, parts = args.points, max(args.partitions, 1)
    per = [n // parts + (1 if i < n % parts else 0) for i in range(parts)]
    data = (
        sc.parallelize(range(parts), parts)
        .flatMap(lambda i: points(i, per[i], args.dims, args.k, args.seed))
        .cache()
    )
    model, cost = None, float("nan")
    for it in range(1, args.iterations + 1):
        start = time.perf_counter()
        model = KMeans.train(
            data, args.k, maxIterations=1, initializationMode="random", seed=args.seed, initialModel=model
        )
        cost = float(model.computeCost(data))
        trial.epoch(it, cost=cost, epoch_seconds=time.perf_counter() - start, last=it == args.iterations)
    trial.final(cost=cost)
    sc.stop()


if __name__ == "__main__":
    main()
