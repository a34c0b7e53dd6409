"""nan_log: a hand-written cross-entropy takes the log of probabilities that underflow to zero.

What you see: the classifier trains on a stream of readings. At step 40 the stream brings one
record logged in the wrong unit (x1000). Its logits spread by far more than ~104, so ``softmax``
underflows: some probabilities are exactly 0. ``log(0)`` is -inf, the one-hot mask computes
0 * -inf = NaN, and the loss is NaN. nnwatch reports ``nan_or_inf``. Its guard catches the NaN
gradients before ``optimizer.step()`` and writes a snapshot of the step: the batch, the RNG state
and the weights from before the bad update. The run ends there.

Find the line: ``nnwatch replay RUN_DIR --model demos/nan_log.py:make --anomaly`` re-runs the
snapshotted step under anomaly detection and names the op (``torch.log``) and its source line
(``--model nnwatch.demos.nan_log:make`` works from any directory). The fix:
``F.cross_entropy(logits, y)``, which computes log-softmax stably and stays finite.

Run it: ``python demos/nan_log.py`` (prints the replay command), or ``nnwatch demo nan_log --keep``
to watch it live and keep the run for the replay.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn

import nnwatch

NUM_CLASSES = 4
BATCH = 64
BAD_RECORD = 40 * BATCH + 17  # a reading logged in the wrong unit: it arrives at step 40


def make_data(seed: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A stream of labelled readings (four Gaussian blobs), one of them corrupt."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(NUM_CLASSES, 16, generator=g) * 2.0
    y = torch.randint(0, NUM_CLASSES, (max(steps, 41) * BATCH,), generator=g)
    x = centers[y] + torch.randn(len(y), 16, generator=g)
    x[BAD_RECORD] *= 1000.0
    return x, y


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES)
    )


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy written out by hand. BUG: log() of probabilities, which can underflow to 0."""
    x, y = batch
    probs = torch.softmax(model(x), dim=1)
    onehot = nn.functional.one_hot(y, NUM_CLASSES).float()
    return -(onehot * torch.log(probs)).sum(dim=1).mean()  # 0 * log(0) = 0 * -inf = NaN


def make() -> dict[str, Any]:
    """For ``nnwatch replay --model demos/nan_log.py:make``: the model and the loss, as trained."""
    return {"model": make_model(), "loss_fn": loss_fn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps (it stops at the NaN)"
    )
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait after each step")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    x, y = make_data(args.seed, args.steps)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    # A toy model's step takes about a millisecond: measure every step. (By default nnwatch keeps
    # its own cost under 1% of the step time, by measuring gradients and layers less often.)
    with nnwatch.watch(model, optimizer, num_classes=NUM_CLASSES, name="nan_log", budget=None) as w:
        for step in range(args.steps):
            if w.should_stop:  # a monitor sent `stop` (nnwatch ctl RUN stop)
                break
            batch = (x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH])
            loss = loss_fn(model, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            w.step(loss, batch=batch)  # a NaN here makes nnwatch snapshot this step
            if not torch.isfinite(loss):
                print(
                    f"step {step}: the loss is {loss.item()}; stopping. Find the op and line with:"
                )
                print(f"  nnwatch replay {w.run_dir} --model {__file__}:make --anomaly")
                break
            time.sleep(args.delay)


if __name__ == "__main__":
    main()
