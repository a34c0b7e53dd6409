"""A real sharded training job for process-level tests, started with torchrun on the CPU (gloo):

    python -m torch.distributed.run --standalone --nproc_per_node 2 -m tests.trainers.sharded_trainer \
        --layout fsdp

``--layout fsdp``: FSDP2 (``fully_shard``) on a 1-D mesh, with a layer whose rows do not split
evenly; ``hsdp``: FSDP2 on a 2-D mesh (4 ranks), replicated over its first dimension and
sharded over the second; ``tp``: tensor parallel (a sequence-parallel LayerNorm, whose gradients are ``Partial``,
a column- and a row-parallel Linear); ``2d``: 4 ranks on a ``(dp, tp)`` mesh, tensor parallel over
``tp`` and FSDP2 over ``dp``, each block under activation checkpointing. ``--clip X`` clips with
torch's ``clip_grad_norm_`` (0: no clip; ``--clip-by nnwatch``: with ``w.clip_grad_norm_``). ``--nan-rank R --nan-step K`` multiplies that rank's
loss by NaN at step K; ``--watch-rank R`` calls ``watch()`` on that rank only. Only the README's
two lines are added for nnwatch.

``--every-step`` measures every layer on every step (no cost budget); ``--budget B`` sets it. Each rank writes ``--out/ref-rR.json``: per step, the whole model's gradient norm before the clip
(torch's clip's ``full_tensor()``, or the same sum of ``full_tensor()`` squares without a clip),
after it, and each layer's whole gradient, weight and update norms (the change the optimizer
made), for the test to compare.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

import nnwatch
from tests.trainers.one_line import say


class Block(nn.Module):
    """LayerNorm, up, ReLU, down: the tensor-parallel unit (sequence-parallel norm)."""

    def __init__(self, dim: int = 16, hidden: int = 34) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.ckpt = False

    def _run(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ckpt:
            return x + checkpoint(self._run, x, use_reentrant=False)
        return x + self._run(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def _tp(block: Block, mesh: object) -> None:
    """Tensor parallel over ``mesh``, the norm sequence parallel (its gradients are
    ``Partial``)."""
    plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}  # fmt: skip
    parallelize_module(block, mesh, plan)  # type: ignore[arg-type]


def build(layout: str, ckpt: bool) -> Net:
    torch.manual_seed(0)
    net = Net()
    for b in net.blocks:
        b.ckpt = ckpt
    if layout in ("fsdp", "hsdp"):
        world = dist.get_world_size()
        # HSDP: replicated over the first mesh dimension, sharded over the second
        dims = (world,) if layout == "fsdp" else (2, world // 2)
        names = ("shard",) if layout == "fsdp" else ("replicate", "shard")
        mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
        for m in (net.inp, *net.blocks, net.head):
            fully_shard(m, mesh=mesh)
        fully_shard(net, mesh=mesh)
    else:
        dims = (dist.get_world_size(),) if layout == "tp" else (2, dist.get_world_size() // 2)
        names = ("tp",) if layout == "tp" else ("dp", "tp")
        mesh = init_device_mesh("cpu", dims, mesh_dim_names=names)
        for b in net.blocks:
            _tp(b, mesh["tp"])
        # the ends too, so that every gradient is a DTensor of one mesh (torch's clip takes no
        # mix of plain tensors and DTensors, nor of meshes)
        parallelize_module(net, mesh["tp"], {"inp": ColwiseParallel(output_layouts=Shard(1)),
                                             "head": RowwiseParallel(input_layouts=Shard(1))})  # fmt: skip
        if layout == "2d":
            for b in net.blocks:
                fully_shard(b, mesh=mesh["dp"])
            fully_shard(net, mesh=mesh["dp"])
    return net


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def layer_norms(net: nn.Module, what: str) -> dict[str, float]:
    """Each module's whole gradient (or weight) norm over its own parameters (collectives: the
    test's own reference, not nnwatch's)."""
    out: dict[str, float] = {}
    for name, mod in net.named_modules():
        ps = list(mod.parameters(recurse=False))
        if not ps:
            continue
        sq = 0.0
        for p in ps:
            t = p.grad if what == "grad" else p
            if t is None:
                continue
            sq += float(full(t.detach()).double().pow(2).sum())
        out[name] = math.sqrt(sq)
    return out


def full_weights(net: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Each module's own parameters, whole (collectives: the test's reference)."""
    return {
        name: [full(p.detach()).double().clone() for p in mod.parameters(recurse=False)]
        for name, mod in net.named_modules()
        if list(mod.parameters(recurse=False))
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layout", choices=["fsdp", "hsdp", "tp", "2d"], default="fsdp")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--clip", type=float, default=0.5)
    ap.add_argument("--ckpt", action="store_true")
    ap.add_argument("--clip-by", choices=["torch", "nnwatch"], default="torch")
    ap.add_argument("--nan-rank", type=int, default=-1)
    ap.add_argument("--nan-step", type=int, default=-1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--every-step", action="store_true", help="per-layer rows on every step")
    ap.add_argument("--watch-rank", type=int, default=-1, help="watch this rank only (default: all)")
    ap.add_argument("--budget", type=float, default=None, help="the cost budget (default: nnwatch's)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net = build(args.layout, args.ckpt)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    # data parallel ranks read their own shard; tensor parallel ranks the same batch
    seed = 100 + (rank if args.layout in ("fsdp", "hsdp") else rank // 2 if args.layout == "2d" else 0)
    gen = torch.Generator().manual_seed(seed)
    refs = []
    every: dict[str, object] = {"budget": None, "layer_interval": 1} if args.every_step else {}
    if args.budget is not None:
        every["budget"] = args.budget
    watched = args.watch_rank < 0 or rank == args.watch_rank
    w = nnwatch.watch(net, opt, name=f"sharded-{args.layout}", **every) if watched else None
    with w or contextlib.nullcontext():
        if w is not None:
            say(f"rank {rank} run_dir {w.run_dir}")
        for step in range(args.steps):
            x = torch.randn(4, 6, 8, generator=gen)
            y = torch.randint(0, 4, (4, 6), generator=gen)
            opt.zero_grad()
            out = net(x)
            loss = nn.functional.cross_entropy(full(out).reshape(-1, 4), y.reshape(-1))
            if rank == args.nan_rank and step == args.nan_step:
                loss = loss * float("nan")
            loss.backward()
            ref = {"step": step, "grad_layers": layer_norms(net, "grad")}
            ref["pre"] = math.sqrt(sum(v * v for v in ref["grad_layers"].values()))
            if args.clip > 0 and args.clip_by == "nnwatch" and w is not None:
                total = w.clip_grad_norm_(max_norm=args.clip)
            elif args.clip > 0:
                total = torch.nn.utils.clip_grad_norm_(net.parameters(), args.clip)
            if args.clip > 0:
                ref["torch"] = float(full(total))
                ref["post"] = math.sqrt(sum(v * v for v in layer_norms(net, "grad").values()))
            before = full_weights(net)
            opt.step()
            ref["weight_layers"] = layer_norms(net, "weight")
            after = full_weights(net)
            ref["update_layers"] = {
                name: math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(after[name], ws, strict=True)))
                for name, ws in before.items()
            }
            refs.append(ref)
            if w is not None:
                w.step(full(loss).detach(), batch=(x, y))
    (args.out / f"ref-r{rank}.json").write_text(json.dumps(refs))
    say(f"rank {rank} done")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
