"""A classifier whose loss takes the log of softmax probabilities: they underflow to 0, log(0) = -inf.

The model returns probabilities (``torch.softmax``) and the loss is the textbook formula written
out by hand, ``-(onehot * log(p)).sum()``. Training is healthy until a batch holds one corrupt
sample (features x1000, a sensor glitch): its logits spread by far more than ~104, ``exp``
underflows, some probabilities become exactly 0, log(0) = -inf and the loss turns NaN (0 * -inf).
With ``log_softmax`` / ``F.cross_entropy`` the same batch would give a large but finite loss. This file is also a replay factory: ``nnwatch replay SNAPSHOT --model
tests/pathologies/nan_log.py:make``. Run it directly to train (``python nan_log.py --steps 60``).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn

NUM_CLASSES = 4
FEATURES = 16


class SoftmaxClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, NUM_CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.body(x), dim=-1)


def nan_log_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    p = model(x)
    onehot = nn.functional.one_hot(y, NUM_CLASSES).to(p.dtype)
    return -(onehot * torch.log(p)).sum(dim=1).mean()  # NAN_LOG_LINE: log of probabilities


def make() -> dict[str, Any]:
    """Replay factory: the model (any weights; the snapshot's are loaded) and the loss function."""
    return {"model": SoftmaxClassifier(), "loss_fn": nan_log_loss}


def data(data_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(data_seed)
    centers = torch.randn(NUM_CLASSES, FEATURES, generator=g) * 3.0
    y = torch.randint(0, NUM_CLASSES, (512,), generator=g)
    x = centers[y] + torch.randn(512, FEATURES, generator=g)
    return x, y


GLITCH_STEP = 40


def glitch(sampler: Any, at: int = GLITCH_STEP) -> Any:
    """Wrap a batch sampler so that the batch of step ``at`` holds one corrupt sample."""

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = sampler(step)
        if step == at:
            x = x.clone()
            x[3] *= 1000.0
        return x, y

    return next_batch


def _common() -> Any:
    """The suite's helpers, whether this file runs as part of the package or as a script."""
    if __package__:
        from . import common
    else:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from pathologies import common
    return common


def train(watch_kwargs: dict[str, Any], steps: int = 60, lr: float = 0.3) -> Any:
    common = _common()
    torch.manual_seed(common.seed(0))
    model = SoftmaxClassifier()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = data(common.seed(0))
    batches = glitch(common.Sampler(x, y, 32, seed=common.seed(1)))
    return common.train(
        model,
        opt,
        batches,
        nan_log_loss,
        steps,
        watch_kwargs,
        name="nan_log",
        num_classes=NUM_CLASSES,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--lr", type=float, default=0.3)
    args = p.parse_args()
    torch.set_num_threads(1)
    w = train({}, steps=args.steps, lr=args.lr)
    print(w.run_dir)


if __name__ == "__main__":
    main()
