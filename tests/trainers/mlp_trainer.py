"""A real training loop used by process-level tests: ``python -m tests.trainers.mlp_trainer``.

It prints ``step N`` after each ``w.step()`` so a test can tell how far it got before a kill.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

import nnwatch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--delay", type=float, default=0.0)
    ap.add_argument("--name", default="mlp")
    ap.add_argument("--hang-at", type=int, default=-1, help="stop stepping (sleep) at this step")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with nnwatch.watch(model, opt, num_classes=4, name=args.name) as w:
        print(f"run_dir {w.run_dir}", flush=True)
        for i in range(args.steps):
            if w.should_stop:
                break
            if i == args.hang_at:
                print("hanging", flush=True)
                time.sleep(3600)
            x = torch.randn(8, 16)
            y = torch.randint(0, 4, (8,))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            w.clip_grad_norm_(max_norm=None)
            opt.step()
            w.step(loss, batch=(x, y))
            print(f"step {i}", flush=True)
            if args.delay:
                time.sleep(args.delay)
    return 0


if __name__ == "__main__":
    sys.exit(main())
