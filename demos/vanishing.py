"""vanishing: a deep sigmoid network whose first layers get almost no gradient.

What you see: 16 Linear+Sigmoid layers with PyTorch's default init. The sigmoid's slope is at most
0.25, so each layer the backward pass goes through shrinks the gradient. By the first layer it is
more than a billion times smaller (per element) than at the last. The loss barely moves from ln(10).
nnwatch reports ``vanishing_gradients`` with the first-to-last layer gradient ratio. The remedy:
ReLU/GELU activations, Xavier/Kaiming init, normalization layers or residual connections.

Run it: ``nnwatch demo vanishing`` (live monitor), or ``python demos/vanishing.py``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import nnwatch

DEPTH = 16
NUM_CLASSES = 10


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian blobs: an easy problem that a shallow network would solve in a few steps."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(NUM_CLASSES, 32, generator=g) * 2.0
    y = torch.randint(0, NUM_CLASSES, (2048,), generator=g)
    return centers[y] + torch.randn(2048, 32, generator=g), y


def make_model() -> nn.Module:
    layers: list[nn.Module] = []
    width_in = 32
    for _ in range(DEPTH):
        layers += [nn.Linear(width_in, 64), nn.Sigmoid()]
        width_in = 64
    return nn.Sequential(*layers, nn.Linear(64, NUM_CLASSES))


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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    # A toy model's step takes about a millisecond: measure every step. (By default nnwatch keeps
    # its own cost under 1% of the step time, by measuring gradients and layers less often.)
    with nnwatch.watch(
        model, optimizer, num_classes=NUM_CLASSES, name="vanishing", budget=None
    ) as w:
        for _ in range(args.steps):
            if w.should_stop:  # a monitor sent `stop` (nnwatch ctl RUN stop)
                break
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
