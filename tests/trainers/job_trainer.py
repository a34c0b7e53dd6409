"""A small DDP job for the job-view tests (torchrun, gloo, CPU), with the job summary on:

    python -m torch.distributed.run --nnodes 2 --node-rank 0 ... -m tests.trainers.job_trainer

``--summary-every N`` sends every rank's summary to rank 0 every N steps; ``--loss-scale R X``
multiplies rank R's loss by X (a data-sharding bug: one shard's labels are off; from step
``--scale-from N``, so ``--loss-scale 3 nan --scale-from 5`` makes rank 3 go NaN first); ``--hang-rank
R --hang-file F``: once F exists, rank R stops in ``stuck_loading_data`` (a Python sleep, as a
stuck data loader) and the others wait for it in the gradient all-reduce; ``--sleep S``
makes each step S seconds longer so a test can look at (or kill) the live job; ``--steps 0`` runs
until killed. Each rank prints ``rank R run_dir DIR`` once it is watched.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import nnwatch
from nnwatch.probe.watch import internals
from tests.trainers.one_line import say


def stuck_loading_data() -> None:
    """A rank that never brings its next batch: the others wait for it in the all-reduce."""
    while True:
        time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20, help="0: until killed")
    ap.add_argument("--summary-every", type=int, default=2)
    ap.add_argument("--every", type=int, default=0, help="consistency check interval")
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--loss-scale", type=float, nargs=2, default=None, metavar=("RANK", "X"))
    ap.add_argument("--scale-from", type=int, default=0, help="--loss-scale from this step on")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--watch-ranks", type=int, nargs="*", default=None, help="default: all")
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-file", default="")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    scale = 1.0
    if args.loss_scale is not None and int(args.loss_scale[0]) == rank:
        scale = float(args.loss_scale[1])
    watched = args.watch_ranks is None or rank in args.watch_ranks
    w = nnwatch.watch(
        model, opt, name="job", consistency_every=args.every, job_summary_every=args.summary_every
    ) if watched else None
    with w or contextlib.nullcontext():
        if w is not None:
            say(f"rank {rank} run_dir {w.run_dir}")
        step = 0
        while args.steps <= 0 or step < args.steps:
            if rank == args.hang_rank and args.hang_file and os.path.exists(args.hang_file):
                stuck_loading_data()
            x = torch.randn(8, 16, generator=gen)
            y = torch.randint(0, 4, (8,), generator=gen)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y) * (scale if step >= args.scale_from else 1.0)
            loss.backward()
            opt.step()
            if w is not None:
                w.step(loss, batch=(x, y))
            if args.sleep:
                time.sleep(args.sleep)
            step += 1
    check = internals(w).parts.consistency if w is not None else None
    launched = check.summary.launched if check is not None and check.summary is not None else 0
    say(f"rank {rank} done summaries {launched}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
