"""A GPU training workload for Tunefleet: a small multi-layer perceptron
trained with PyTorch on CUDA, on a synthetic classification problem (no
download). Study: examples/studies/torch-gpu.toml (one GPU per trial,
energy as a second objective).

The agent gives the trial its GPU in CUDA_VISIBLE_DEVICES and measures
the GPU's energy apart from the CPU's. Where PyTorch is not installed, or
sees no GPU, the same problem is trained by a plain logistic regression
in Python (no dependency) and the epochs are reported the same way: the
study runs anywhere, and says which path it took (the `cuda` and `torch`
metrics, 1 or 0).

    python3 -m venv ~/.venvs/torch && ~/.venvs/torch/bin/pip install torch
    ~/.venvs/torch/bin/python examples/python/torch_mlp.py --lr 0.05 --epochs 5
"""

import argparse
import os
import math
import random
import sys
import time

try:
    import tunefleet
except ImportError:  # run from the repository, without `pip install ./python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
    import tunefleet


def synthetic(samples, features, seed):
    """Two classes split by a random hyperplane, with label noise."""
    rng = random.Random(seed)
    w = [rng.gauss(0.0, 1.0) for _ in range(features)]
    xs, ys = [], []
    for _ in range(samples):
        x = [rng.gauss(0.0, 1.0) for _ in range(features)]
        margin = sum(a * b for a, b in zip(w, x))
        y = 1 if margin + rng.gauss(0.0, 0.5) > 0 else 0
        xs.append(x)
        ys.append(y)
    cut = samples * 3 // 4
    return (xs[:cut], ys[:cut]), (xs[cut:], ys[cut:])


def train_torch(torch, args, train, test, trial):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    x_train = torch.tensor(train[0], device=device)
    y_train = torch.tensor(train[1], device=device)
    x_test = torch.tensor(test[0], device=device)
    y_test = torch.tensor(test[1], device=device)
    model = torch.nn.Sequential(
        torch.nn.Linear(x_train.shape[1], args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, 2),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    cuda = 1 if device.type == "cuda" else 0
    accuracy, loss = 0.0, float("nan")
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        order = torch.randperm(len(x_train), device=device)
        for batch in order.split(args.batch):
            opt.zero_grad()
            out = loss_fn(model(x_train[batch]), y_train[batch])
            out.backward()
            opt.step()
            trial.step()
        with torch.no_grad():
            loss = float(loss_fn(model(x_test), y_test))
            accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
        if cuda:
            torch.cuda.synchronize()
        trial.epoch(
            epoch,
            accuracy=accuracy,
            loss=loss,
            cuda=cuda,
            torch=1,
            epoch_seconds=time.perf_counter() - start,
            last=epoch == args.epochs,
        )
    return accuracy, loss, cuda


def train_plain(args, train, test, trial):
    """Logistic regression by SGD in plain Python: the fallback."""
    rng = random.Random(args.seed)
    features = len(train[0][0])
    w, b = [0.0] * features, 0.0

    def prob(x):
        z = b + sum(a * c for a, c in zip(w, x))
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))

    order = list(range(len(train[0])))
    accuracy, loss = 0.0, float("nan")
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        rng.shuffle(order)
        for k in range(0, len(order), args.batch):
            batch = order[k : k + args.batch]
            gw, gb = [0.0] * features, 0.0
            for i in batch:
                err = prob(train[0][i]) - train[1][i]
                gb += err
                for j, xj in enumerate(train[0][i]):
                    gw[j] += err * xj
            step = args.lr / len(batch)
            w = [wj - step * g for wj, g in zip(w, gw)]
            b -= step * gb
            trial.step()
        ps = [prob(x) for x in test[0]]
        loss = -sum(
            math.log(max(p, 1e-12)) if y else math.log(max(1.0 - p, 1e-12)) for p, y in zip(ps, test[1])
        ) / len(ps)
        accuracy = sum((p > 0.5) == bool(y) for p, y in zip(ps, test[1])) / len(ps)
        trial.epoch(
            epoch,
            accuracy=accuracy,
            loss=loss,
            cuda=0,
            torch=0,
            epoch_seconds=time.perf_counter() - start,
            last=epoch == args.epochs,
        )
    return accuracy, loss, 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr", type=float, default=0.05, help="learning rate")
    p.add_argument("--hidden", type=int, default=256, help="hidden units (PyTorch only)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--features", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain", action="store_true", help="the fallback even where PyTorch is installed")
    args = p.parse_args()

    train, test = synthetic(args.samples, args.features, args.seed)
    trial = tunefleet.Trial()
    torch = None
    if not args.plain:
        try:
            import torch  # noqa: F811 (optional: gigabytes, never installed by the tests)
        except ImportError:
            sys.stderr.write("torch_mlp: PyTorch is not installed; training the plain fallback\n")
    if torch is not None:
        accuracy, loss, cuda = train_torch(torch, args, train, test, trial)
    else:
        accuracy, loss, cuda = train_plain(args, train, test, trial)
    trial.final(accuracy=accuracy, loss=loss, cuda=cuda, torch=0 if torch is None else 1)


if __name__ == "__main__":
    main()
