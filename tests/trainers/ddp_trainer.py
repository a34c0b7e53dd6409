"""A real DDP training job for process-level tests, started with torchrun on the CPU (gloo):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m tests.trainers.ddp_trainer

Faults can be injected on one rank: ``--nan-rank R --nan-step K`` multiplies that rank's loss by
NaN at step K (a bad batch on one data shard); ``--drift-rank R --drift-step K`` nudges one weight
of that rank after its update (code that edits weights on one rank only). ``--hold-at S --go FILE``
makes every rank wait at step S until FILE exists, so a test can look at the live job.
``--watch-ranks 0`` runs nnwatch on rank 0 only (a common logging habit). ``--sleep S`` makes each
step take S seconds longer (a job that runs long enough to be killed or frozen mid-way);
``--clip 0`` does not clip (gradient norms are then measured only on the steps the budget picks).
``--adam --learnable`` trains Adam on labels the inputs determine (a loss that keeps falling);
``--save FILE`` writes the model and optimizer state at the end (rank 0), ``--resume FILE`` starts
from such a file, as a training script resumes from its checkpoint.
Each rank prints ``rank R run_dir DIR`` and, at the end, ``rank R checks N diverged M``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import nnwatch
from nnwatch.probe.watch import internals
from tests.trainers.one_line import say


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--every", type=int, default=5, help="consistency check interval")
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--nan-rank", type=int, default=-1)
    ap.add_argument("--nan-step", type=int, default=-1)
    ap.add_argument("--drift-rank", type=int, default=-1)
    ap.add_argument("--drift-step", type=int, default=-1)
    ap.add_argument("--hold-at", type=int, default=-1)
    ap.add_argument("--go", type=Path, default=None)
    ap.add_argument("--sleep", type=float, default=0.0, help="extra seconds per step")
    ap.add_argument("--watch-ranks", type=int, nargs="*", default=None, help="default: all")
    ap.add_argument("--adam", action="store_true")
    ap.add_argument("--learnable", action="store_true", help="labels follow from the inputs")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--resume", type=Path, default=None)
    ap.add_argument("--fail-rank", type=int, default=-1, help="raise on this rank ...")
    ap.add_argument("--fail-step", type=int, default=-1, help="... at this step")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = DDP(model)
    opt = (torch.optim.Adam if args.adam else torch.optim.SGD)(model.parameters(), lr=args.lr)
    if args.resume is not None:
        state = torch.load(args.resume, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    gen = torch.Generator().manual_seed(100 + rank)  # a different data shard per rank
    watched = args.watch_ranks is None or rank in args.watch_ranks
    w = nnwatch.watch(model, opt, name="ddp", consistency_every=args.every) if watched else None
    with w or contextlib.nullcontext():
        if w is not None:
            say(f"rank {rank} run_dir {w.run_dir}")
        for step in range(args.steps):
            if step == args.hold_at and args.go is not None:
                say(f"rank {rank} holding")
                while not args.go.exists():
                    time.sleep(0.05)
            x = torch.randn(8, 16, generator=gen)
            y = x[:, :4].argmax(dim=1) if args.learnable else torch.randint(0, 4, (8,), generator=gen)
            opt.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x), y)
            if rank == args.fail_rank and step == args.fail_step:
                raise RuntimeError(f"rank {rank}: a bad record in shard {rank}")
            if rank == args.nan_rank and step == args.nan_step:
                loss = loss * float("nan")
            loss.backward()
            if args.clip > 0 and w is not None:
                w.clip_grad_norm_(max_norm=args.clip)
            elif args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            if rank == args.drift_rank and step == args.drift_step:
                with torch.no_grad():
                    model[0].weight[0, 0] += 1e-3
            if w is not None:
                w.step(loss, batch=(x, y))
            if args.sleep:
                time.sleep(args.sleep)
    check = (
        internals(w).parts.consistency if w is not None else None
    )  # closed with the run: its last check is read by now
    if args.save is not None and rank == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, args.save)
    checks = 0 if check is None else len(check.results)
    diverged = 0 if check is None else sum(1 for r in check.results if r.diverged)
    say(f"rank {rank} checks {checks} diverged {diverged}")
    dist.destroy_process_group()
    return 0


def run_job() -> int:
    """As Hydra runs a job: an exception is printed and the process exits with status 1."""
    try:
        return main()
    except Exception as exc:  # noqa: BLE001 - the framework's catch-all
        print(f"Error executing job with overrides: []\n{exc!r}", file=sys.stderr, flush=True)
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(run_job())
