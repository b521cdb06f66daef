"""A scikit-learn workload for Tunefleet: a linear classifier trained by
stochastic gradient descent, one pass over the data per epoch, on a
synthetic problem (no download). Study: examples/studies/sklearn-sgd.toml.

    python3 -m venv ~/.venvs/sk && ~/.venvs/sk/bin/pip install scikit-learn
    ~/.venvs/sk/bin/python examples/python/sklearn_sgd.py --alpha 1e-4 --epochs 5
"""

import argparse
import os
import sys
import time

import numpy as np
from sklearn.datasets import make_classification
from sklearn.linear_model import SGDClassifier
from sklearn.model_selection import train_test_split

try:
    import tunefleet
except ImportError:  # run from the repository, without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
    import tunefleet


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alpha", type=float, default=1e-4, help="L2 regularisation strength")
    p.add_argument("--eta0", type=float, default=0.01, help="initial learning rate")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=60000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    x, y = make_classification(
        n_samples=args.samples, n_features=60, n_informative=20, n_classes=3, random_state=args.seed
    )
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=args.seed)
    model = SGDClassifier(alpha=args.alpha, eta0=args.eta0, learning_rate="invscaling", random_state=args.seed)
    classes = np.unique(y)
    trial = tunefleet.Trial()
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        for batch in np.array_split(np.arange(len(x_train)), 20):
            model.partial_fit(x_train[batch], y_train[batch], classes=classes)
            trial.step()
        accuracy = float(model.score(x_test, y_test))
        trial.epoch(epoch, accuracy=accuracy, epoch_seconds=time.perf_counter() - start, last=epoch == args.epochs)
    trial.final(accuracy=accuracy)


if __name__ == "__main__":
    main()
