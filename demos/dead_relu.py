"""dead_relu: an LR spike mid-run pushes a ReLU MLP's units into the negative region, for good.

What you see: the classifier trains normally for 100 steps. Then the learning rate jumps 40x for
20 steps (a schedule restart with the wrong peak). The large updates push most of the units'
pre-activations below zero. A ReLU unit that outputs 0 for every input passes no gradient, so it
never comes back. In the layers pane, ``relu2``'s share of zero outputs climbs from about 45% past
90%, and nnwatch counts the units that no input of the batch turns on: from none to about 3 in 4.
nnwatch reports ``dead_relu`` and names the layer and the remedy: LeakyReLU/GELU, a norm layer
before the activation, a lower LR, and a check of the bias init.

Run it: ``nnwatch demo dead_relu`` (live monitor), or ``python demos/dead_relu.py``.
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict

import torch
from torch import nn

import nnwatch

LR = 0.02
SPIKE_STEPS = range(100, 120)  # the LR is 40x too high for these steps
NUM_CLASSES = 10


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Overlapping Gaussian blobs with 20% noisy labels: the loss never reaches zero."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(NUM_CLASSES, 32, generator=g) * 2.0
    y = torch.randint(0, NUM_CLASSES, (2048,), generator=g)
    x = centers[y] + 2.0 * torch.randn(2048, 32, generator=g)
    noisy = torch.rand(2048, generator=g) < 0.2
    return x, torch.where(noisy, torch.randint(0, NUM_CLASSES, (2048,), generator=g), y)


def make_model() -> nn.Module:
    """Named layers, so that findings say ``relu2`` instead of ``3``."""
    return nn.Sequential(
        OrderedDict(
            fc1=nn.Linear(32, 128),
            relu1=nn.ReLU(),
            fc2=nn.Linear(128, 128),
            relu2=nn.ReLU(),
            fc3=nn.Linear(128, 128),
            relu3=nn.ReLU(),
            head=nn.Linear(128, NUM_CLASSES),
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="training steps")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait after each step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = make_data(args.seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    # A toy model's step takes about a millisecond: measure every step. (By default nnwatch keeps
    # its own cost under 1% of the step time, by measuring gradients and layers less often.)
    with nnwatch.watch(
        model, optimizer, num_classes=NUM_CLASSES, name="dead_relu", budget=None
    ) as w:
        for step in range(args.steps):
            if w.should_stop:  # a monitor sent `stop` (nnwatch ctl RUN stop)
                break
            for group in optimizer.param_groups:
                group["lr"] = LR * 40 if step in SPIKE_STEPS else LR
            idx = torch.randint(0, len(x), (64,))
            batch = (x[idx], y[idx])
            loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            w.step(loss, batch=batch)
            time.sleep(args.delay)


if __name__ == "__main__":
    main()
