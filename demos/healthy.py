"""healthy: a small CNN learns scikit-learn's 8x8 handwritten digits cleanly. Nothing to report.

What you see: what a good run looks like, for comparison with the other demos. The first loss is
close to ln(10) = 2.30, the loss falls steadily, gradient norms stay in a narrow band, about half of
each ReLU's outputs are zero, and nnwatch raises no finding. Held-out accuracy is printed at the end.
The data (``sklearn.datasets.load_digits``, 1797 images) ships with scikit-learn: no download.

Run it: ``nnwatch demo healthy`` (live monitor), or ``python demos/healthy.py``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import nnwatch

NUM_CLASSES = 10


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """load_digits as (N, 1, 8, 8) images scaled to [0, 1]; the last 297 images are held out."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("the healthy demo needs scikit-learn: pip install scikit-learn") from None

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2),  # 8x8 -> 4x4
        nn.Flatten(),
        nn.Linear(32 * 4 * 4, 64), nn.ReLU(),
        nn.Linear(64, NUM_CLASSES),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait after each step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y, x_test, y_test = make_data(args.seed)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    # A toy model's step takes about a millisecond: measure every step. (By default nnwatch keeps
    # its own cost under 1% of the step time, by measuring gradients and layers less often.)
    with nnwatch.watch(model, optimizer, num_classes=NUM_CLASSES, name="healthy", budget=None) as w:
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
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        print(
            f"held-out accuracy after {w.step_index} steps: {accuracy:.1%}; findings: {len(w.findings)}"
        )


if __name__ == "__main__":
    main()
