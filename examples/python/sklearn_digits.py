"""scikit-learn's digits (bundled with scikit-learn: no download) learnt by
a one-hidden-layer MLP, one pass over the training set per epoch, the test
accuracy reported after each (through tunefleet.Trial). Studies:
examples/studies/digits-least-energy.toml and digits-energy-to-target.toml.

    python3 -m venv ~/.venvs/sk && ~/.venvs/sk/bin/pip install scikit-learn
    ~/.venvs/sk/bin/python examples/python/sklearn_digits.py --lr 0.01 --hidden 64 --epochs 20
"""

import argparse
import os
import sys
import warnings

import numpy as np
from sklearn.datasets import load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

try:
    import tunefleet
except ImportError:  # run from the repository, without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
    import tunefleet


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.01, help="Adam's initial learning rate")
    p.add_argument("--hidden", type=int, default=64, help="units of the hidden layer")
    p.add_argument("--batch", type=int, default=64, help="mini-batch size")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0, help="the split's and the initial weights' seed")
    args = p.parse_args()

    digits = load_digits()
    x = digits.data / 16.0
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.25, random_state=args.seed, stratify=digits.target
    )
    model = MLPClassifier(
        hidden_layer_sizes=(args.hidden,),
        learning_rate_init=args.lr,
        batch_size=args.batch,
        random_state=args.seed,
    )
    classes = np.unique(digits.target)
    trial = tunefleet.Trial()
    accuracy = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for epoch in range(1, args.epochs + 1):
            model.partial_fit(x_train, y_train, classes=classes)
            accuracy = float(model.score(x_test, y_test))
            trial.epoch(epoch, accuracy=accuracy)
    trial.final(accuracy=accuracy)


if __name__ == "__main__":
    main()
