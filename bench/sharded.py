"""What nnwatch costs a sharded job: a 2-rank FSDP2 job (gloo, CPU, this machine), bare against
watched.

Both ranks hold two FSDP2 copies of the same MLP: a bare one and one watched for the whole
benchmark (warmed up once), and train them in blocks of ``--steps`` steps, interleaved in rounds
(bare, nnwatch; the pair's order flips every round) so that the machine's drift hits both halves
of a pair alike. Each round runs bare, nnwatch, bare (mirrored every other round). Rank 0
reports, per model size, the median and min-max over the rounds of the ratio of the nnwatch
block's time to its two bare neighbours' mean, the ratio of the two bare blocks (the noise
floor), the bare step time, and nnwatch's direct cost: the time spent inside its hooks and
``w.step()`` (its own clock, as its cost budget counts it), as a share of the bare step. The jobs clip with torch's ``clip_grad_norm_`` (``--clip 0``: no clip). The only collective
nnwatch adds is one async all-reduce of a few floats per parameter per step, read a step later.

    python bench/sharded.py                          # hidden 256 and 1024, 8 rounds
    python bench/sharded.py --hidden 512 --rounds 3 --steps 10   # quick look
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def _mlp(hidden: int, layers: int = 4) -> nn.Module:
    mods: list[nn.Module] = [nn.Linear(128, hidden), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 10))
    return nn.Sequential(*mods)


def _sharded(hidden: int, mesh: Any) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _mlp(hidden)
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _block(model: nn.Module, opt: Any, w: Any, steps: int, clip: float, gen: Any) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(32, 128, generator=gen)
        y = torch.randint(0, 10, (32,), generator=gen)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if w is not None:
            w.step(loss)
    return time.perf_counter() - t0


def _worker(rank: int, world: int, port: int, args: Any, queue: Any) -> None:
    os.environ["NNWATCH_RUN_DIR"] = args.run_dir
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    import nnwatch
    from nnwatch.probe.budget import UPDATE_EVERY
    from nnwatch.probe.schedule import WARMUP_STEPS
    from nnwatch.probe.watch import internals

    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(rank)
    for hidden in args.hidden:
        bare = _sharded(hidden, mesh)
        watched = _sharded(hidden, mesh)
        opt_b = torch.optim.SGD(bare.parameters(), lr=0.01)
        opt_w = torch.optim.SGD(watched.parameters(), lr=0.01)
        with nnwatch.watch(watched, opt_w, name=f"bench-fsdp-{hidden}") as w:
            budget = internals(w).parts.schedule.budget
            warm = max(args.steps, WARMUP_STEPS + 2 * UPDATE_EVERY)  # past the probe's warm-up
            _block(bare, opt_b, None, args.steps, args.clip, gen)
            _block(watched, opt_w, w, warm, args.clip, gen)
            ratios, noise, bare_steps, own = [], [], [], []
            for r in range(args.rounds):
                dist.barrier()
                # bare, nnwatch, bare (or the mirror): the two bare blocks give the noise floor
                order = ("bare", "nnwatch", "bare2") if r % 2 == 0 else ("bare2", "nnwatch", "bare")
                times = {}
                for which in order:
                    own0 = budget.own_total
                    if which == "nnwatch":
                        times[which] = _block(watched, opt_w, w, args.steps, args.clip, gen)
                        own.append((budget.own_total - own0) / args.steps)
                    else:
                        times[which] = _block(bare, opt_b, None, args.steps, args.clip, gen)
                pair = (times["bare"] + times["bare2"]) / 2
                ratios.append(times["nnwatch"] / pair)
                noise.append(times["bare2"] / times["bare"])
                bare_steps.append(pair / args.steps)
        if rank == 0:
            queue.put((hidden, ratios, noise, bare_steps, own, w.disabled))
        del bare, watched
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--clip", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        args.run_dir = run_dir
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.start_processes(_worker, args=(2, _free_port(), args, queue), nprocs=2, start_method="spawn")
        results = [queue.get() for _ in args.hidden]
    print(f"FSDP2, 2 ranks (gloo, CPU, 1 thread each), {args.steps} steps x {args.rounds} rounds, "
          f"{'clip ' + str(args.clip) if args.clip > 0 else 'no clip'}")  # fmt: skip
    print(f"{'hidden':>7} {'bare step':>10} {'nnwatch/bare (median, min-max)':>32} "
          f"{'bare/bare (noise)':>18} {'own/step':>9}")  # fmt: skip
    for hidden, ratios, noise, bare_steps, own, disabled in results:
        med = statistics.median(ratios)
        step = statistics.median(bare_steps)
        own_share = statistics.median(own) / step
        print(f"{hidden:>7} {step * 1e3:>8.2f}ms {med:>14.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
              f" {statistics.median(noise):>18.3f} {own_share * 100:>8.2f}%"
              + (f"  OFF: {disabled}" if disabled else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
