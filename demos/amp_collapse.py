"""amp_collapse: float16 autocast on raw, unnormalized inputs: the GradScaler's scale keeps halving.

What you see: the model trains under ``torch.autocast`` (float16) with a ``GradScaler``, on the
CPU, on raw sensor readings in the thousands that nobody normalized. The scaled gradients overflow
float16 (largest value 65504), so the scaler skips the step and halves its scale: 65536, 32768,
... The one step that finally gets through applies a huge update; from then on even the forward
pass overflows, every step is skipped and the scale keeps halving, below 1 and on towards zero.
nnwatch reports ``amp_scale_collapse`` (and ``bad_initial_loss``: for the same reason, the first
loss is about 450 instead of ln(10)), and the AMP pane shows the scale falling. The remedy:
normalize the inputs (subtract the mean, divide by the std), keep the overflowing op in float32,
or train in bfloat16.

Run it: ``nnwatch demo amp_collapse`` (live monitor), or ``python demos/amp_collapse.py``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import nnwatch

NUM_CLASSES = 10


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Readings around 3000 +- 500 (say, raw sensor counts), one cluster per class."""
    g = torch.Generator().manual_seed(seed)
    centers = 3000.0 + 500.0 * torch.randn(NUM_CLASSES, 32, generator=g)
    y = torch.randint(0, NUM_CLASSES, (2048,), generator=g)
    return centers[y] + 200.0 * torch.randn(2048, 32, generator=g), y


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait after each step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = make_data(args.seed)  # BUG: not normalized; (x - x.mean(0)) / x.std(0) would fix it
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")

    # A toy model's step takes about a millisecond: measure every step. (By default nnwatch keeps
    # its own cost under 1% of the step time, by measuring gradients and layers less often.)
    with nnwatch.watch(
        model, optimizer, scaler, num_classes=NUM_CLASSES, name="amp_collapse", budget=None
    ) as w:
        for _ in range(args.steps):
            if w.should_stop:  # a monitor sent `stop` (nnwatch ctl RUN stop)
                break
            idx = torch.randint(0, len(x), (64,))
            batch = (x[idx], y[idx])
            with torch.autocast("cpu", dtype=torch.float16):
                logits = model(batch[0])
            loss = nn.functional.cross_entropy(logits.float(), batch[1])
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # skipped when the gradients hold Inf/NaN ...
            scaler.update()  # ... and then the scale is halved
            w.step(loss, batch=batch)
            time.sleep(args.delay)


if __name__ == "__main__":
    main()
