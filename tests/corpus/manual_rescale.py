# A classifier trained with a gradient clip written by hand, the way many repositories
# carried their own `clip_grad_norm` helper in utils.py before (and after) torch had one:
# the global norm is a sum of squares over the parameters, and the gradients are scaled in
# place when it is above max_norm. Plain SGD with momentum on scikit-learn's digits.
from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from _record import record
from sklearn.datasets import load_digits

import nnwatch


def clip_grad_norm(parameters, max_norm):
    """Rescales gradients so that their global L2 norm is at most max_norm; returns the norm."""
    params = [p for p in parameters if p.grad is not None]
    total = torch.sqrt(sum(p.grad.pow(2).sum() for p in params))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in params:
            p.grad.mul_(coef)
    return total


class MLP(nn.Module):
    def __init__(self, n_in=64, n_hidden=128, n_out=10):
        super().__init__()
        self.fc1 = nn.Linear(n_in, n_hidden)
        self.fc2 = nn.Linear(n_hidden, n_hidden)
        self.out = nn.Linear(n_hidden, n_out)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.out(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--max_norm", type=float, default=0.5)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)

    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    X_train, y_train, X_val, y_val = X[:1500], y[:1500], X[1500:], y[1500:]

    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)

    step = 0
    train_start = time.perf_counter()
    with nnwatch.watch(model, optimizer, num_classes=10, name="manual-rescale") as w:
        for epoch in range(args.epochs):
            model.train()
            perm = torch.randperm(len(X_train))
            for i in range(0, len(X_train), args.batch_size):
                idx = perm[i:i + args.batch_size]
                xb, yb = X_train[idx], y_train[idx]
                optimizer.zero_grad()
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                total = clip_grad_norm(model.parameters(), args.max_norm)
                record(step, total, args.max_norm, how="manual")
                optimizer.step()
                w.step(loss, batch=(xb, yb))
                step += 1
            model.eval()
            with torch.no_grad():
                acc = (model(X_val).argmax(1) == y_val).float().mean().item()
            print(f"epoch {epoch} step {step} loss {loss.item():.4f} val_acc {acc:.3f} grad_norm {total.item():.3f}")
    print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")


if __name__ == "__main__":
    main()
