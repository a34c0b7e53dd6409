# A deep MLP regressor whose learning rate is far too high, written like the many
# Kaggle-notebook training loops: a config dict, a linear LR warmup set by hand, SGD with
# momentum, torch's clip_grad_norm_ at 1.0, and a check that stops on a non-finite loss.
# Clipping bounds each update, but with LR 5 the weights still grow step after step: the
# pre-clip gradient norm climbs from about 1 through 1e3..1e6 and on until its float32 sum
# of squares overflows to inf, while the loss runs away from where it started (1e25 by the
# end). It never turns NaN: once the norm is inf, torch's clip scales every gradient by 0.
from __future__ import annotations

import math
import time

import torch
import torch.nn as nn
from _record import record

import nnwatch

CFG = {
    "seed": 0,
    "n_samples": 2048,
    "n_features": 16,
    "hidden": 64,
    "n_layers": 12,
    "batch_size": 64,
    "lr": 5.0,           # should have been 5e-3
    "momentum": 0.9,
    "warmup_steps": 100,
    "max_steps": 150,
    "max_grad_norm": 1.0,
    "log_every": 10,
}


def make_dataset(cfg):
    g = torch.Generator().manual_seed(cfg["seed"])
    X = torch.randn(cfg["n_samples"], cfg["n_features"], generator=g)
    w1 = torch.randn(cfg["n_features"], 32, generator=g) / 4
    w2 = torch.randn(32, 1, generator=g)
    y = torch.tanh(X @ w1) @ w2
    y = (y - y.mean()) / y.std()
    return X, y


def build_model(cfg):
    layers = [nn.Linear(cfg["n_features"], cfg["hidden"]), nn.LeakyReLU(0.1)]
    for _ in range(cfg["n_layers"] - 2):
        layers += [nn.Linear(cfg["hidden"], cfg["hidden"]), nn.LeakyReLU(0.1)]
    layers.append(nn.Linear(cfg["hidden"], 1))
    return nn.Sequential(*layers)


def main():
    torch.manual_seed(CFG["seed"])
    torch.set_num_threads(1)
    X, y = make_dataset(CFG)
    model = build_model(CFG)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=CFG["lr"], momentum=CFG["momentum"])

    train_start = time.perf_counter()
    with nnwatch.watch(model, optimizer, name="diverging") as w:
        for step in range(CFG["max_steps"]):
            lr = CFG["lr"] * min(1.0, (step + 1) / CFG["warmup_steps"])
            for g in optimizer.param_groups:
                g["lr"] = lr
            idx = torch.randint(0, len(X), (CFG["batch_size"],))
            xb, yb = X[idx], y[idx]

            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            if not math.isfinite(loss.item()):
                print(f"step {step}: loss is {loss.item()}, stopping training")
                break
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CFG["max_grad_norm"])
            record(step, grad_norm, CFG["max_grad_norm"])
            optimizer.step()
            w.step(loss, batch=(xb, yb))

            if step % CFG["log_every"] == 0:
                print(f"step {step:4d} | lr {lr:.3f} | loss {loss.item():.4g} | grad_norm {grad_norm.item():.4g}")
    print(f"CORPUS_TRAIN_SECONDS {time.perf_counter() - train_start:.6f}")


if __name__ == "__main__":
    main()
