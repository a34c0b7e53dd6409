"""A healthy MLP with dropout, for snapshot and replay tests (the RNG decides the dropout masks).

``python replay_net.py --steps 80 --snapshot-at 5 --spike-at 60`` trains it with nnwatch attached,
asks for a snapshot at step 5 from the training thread, and feeds one corrupt batch (inputs x10, wrong labels) at step 60,
whose gradient-norm spike makes the detectors ask for a snapshot from the writer thread. ``make``
is the replay factory: ``nnwatch replay SNAPSHOT --model tests/pathologies/replay_net.py:make``.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np
import torch
from torch import nn


class DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(20, 64),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(64, 64),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(64, 5),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def make() -> dict[str, Any]:
    return {"model": DropoutNet(), "loss_fn": loss_fn}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--snapshot-at", type=int, default=-1)
    p.add_argument("--spike-at", type=int, default=-1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clip", type=float, default=0.0)
    p.add_argument("--no-batch", action="store_true", help="call w.step(loss) without the batch")
    p.add_argument(
        "--sleep",
        type=float,
        default=0.0,
        help="seconds per step (the detectors act between drains)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import nnwatch

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    g = torch.Generator().manual_seed(1)
    centers = torch.randn(5, 20, generator=g) * 2
    model = DropoutNet()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    w = nnwatch.watch(model, opt, num_classes=5, name="replay_net", channel=False, budget=None)
    for step in range(args.steps):
        if step == args.snapshot_at:
            w.request_snapshot("test")
        y = torch.randint(0, 5, (32,), generator=g)
        x = centers[y] + torch.randn(32, 20, generator=g)
        if step == args.spike_at:  # a corrupt batch: scaled inputs, shifted labels
            x, y = x * 10.0, (y + 1) % 5
        opt.zero_grad()
        loss = loss_fn(model, (x, y))
        loss.backward()
        if args.clip:
            w.clip_grad_norm_(args.clip)
        opt.step()
        w.step(loss, batch=None if args.no_batch else (x, y))
        if args.sleep:
            time.sleep(args.sleep)
    w.close()
    print(w.run_dir)


if __name__ == "__main__":
    main()
