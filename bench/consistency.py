"""What the cross-rank consistency check costs: the only collective nnwatch adds.

Part 1 (CPU, gloo, 2 ranks on this machine): a DDP MLP trains with ``consistency_every`` off, 100,
10 and 1, interleaved in rounds so that machine noise hits every setting alike. Reported per
setting: median step time, its overhead against "off", and the time the training thread spends
in the check itself (checksum + launching the async all-reduce + reading a finished one), per
check and amortized per step.

Part 2 (``--gpu``, one CUDA device): the checksum of every parameter tensor of a large model on the
GPU (what each check adds to the device's work; the all-reduce of a few KB is negligible next to
DDP's own), against the time of one forward/backward/AdamW step of the same model.

    python bench/consistency.py [--hidden 1024 2048] [--steps 60] [--rounds 3] [--gpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

SETTINGS = (0, 100, 10, 1)


def _mlp(hidden: int, layers: int = 4) -> nn.Module:
    mods: list[nn.Module] = [nn.Linear(256, hidden), nn.ReLU()]
    for _ in range(layers - 2):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    mods.append(nn.Linear(hidden, 10))
    return nn.Sequential(*mods)


def _worker(rank: int, world: int, port: int, args: Any, queue: Any) -> None:
    os.environ["NNWATCH_RUN_DIR"] = args.run_dir
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    import nnwatch
    from nnwatch.probe.consistency import ConsistencyCheck
    from nnwatch.probe.watch import internals

    spent: list[tuple[float, bool]] = []  # (seconds in the hook, whether it launched a check)
    original = ConsistencyCheck._on_optimizer_step

    def timed(self: Any, *a: Any) -> None:
        before = self.checks
        t = time.perf_counter()
        original(self, *a)
        spent.append((time.perf_counter() - t, self.checks > before))

    ConsistencyCheck._on_optimizer_step = timed  # type: ignore[method-assign]
    results: dict[tuple[int, int], dict[str, list[float]]] = {}
    for hidden in args.hidden:
        torch.manual_seed(0)
        model = _mlp(hidden)
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
        for _ in range(args.rounds):
            for every in SETTINGS:
                spent.clear()
                times: list[float] = []
                with nnwatch.watch(model, opt, name=f"bench-{hidden}-{every}", channel=False,
                                   detectors=False, consistency_every=every) as w:  # fmt: skip
                    for _ in range(args.steps):
                        t = time.perf_counter()
                        opt.zero_grad()
                        loss = nn.functional.cross_entropy(ddp(x), y)
                        loss.backward()
                        opt.step()
                        w.step(loss)
                        times.append(time.perf_counter() - t)
                    check = internals(w).parts.consistency
                    checks = check.checks if check is not None else 0
                r = results.setdefault(
                    (hidden, every),
                    {"step": [], "hook": [], "launch": [], "poll": [], "checks": []},
                )
                r["step"] += times[5:]
                r["hook"] += [sum(d for d, _ in spent)]
                r["launch"] += [d for d, launched in spent if launched]
                r["poll"] += [d for d, launched in spent if not launched]
                r["checks"] += [checks]
    parts = {hidden: _components(_mlp(hidden)) for hidden in args.hidden}
    queue.put((rank, {"settings": results, "parts": parts}))
    dist.destroy_process_group()


def _components(model: nn.Module, n: int = 30) -> dict[str, float]:
    """Median seconds of each piece of one check, timed alone (no training in between)."""
    from nnwatch.probe.consistency import RANK_SLOTS, tensor_checksum

    params = list(model.parameters())
    buf = torch.zeros(2 * RANK_SLOTS + 2 * len(params), dtype=torch.int64)

    def median(fn: Any) -> float:
        fn()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    out = {"checksum": median(lambda: torch.stack([tensor_checksum(p) for p in params]))}
    dist.barrier()
    launches = []
    for _ in range(n):
        t = time.perf_counter()
        work = dist.all_reduce(buf, op=dist.ReduceOp.MAX, async_op=True)
        launches.append(time.perf_counter() - t)
        work.wait()
    out["launch"] = statistics.median(launches)
    return out


def cpu_part(args: argparse.Namespace) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
    res = got[0]["settings"]
    print(
        f"CPU, gloo, 2 ranks, 1 thread each; {args.rounds} rounds x {args.steps} steps per setting"
    )
    print("  step: median training step; check: median time in the hook on a step that launches a")
    print(
        "  check (checksum + async all-reduce launch); poll: median on other steps; per step: all"
    )
    print("  time in the hook / steps; cost: per step / the median step with the check off")
    print(
        f"{'params':>8} {'every':>6} {'step':>9} {'vs off':>7} {'checks':>7} {'check':>8} "
        f"{'poll':>7} {'per step':>9} {'cost':>7}"
    )
    for hidden in args.hidden:
        params = sum(p.numel() for p in _mlp(hidden).parameters())
        base = statistics.median(res[(hidden, 0)]["step"])
        for every in SETTINGS:
            r = res[(hidden, every)]
            med = statistics.median(r["step"])
            steps = args.rounds * args.steps
            launch = statistics.median(r["launch"]) if r["launch"] else 0.0
            poll = statistics.median(r["poll"]) if r["poll"] else 0.0
            per_step = sum(r["hook"]) / steps
            label = "off" if every == 0 else str(every)
            print(
                f"{params / 1e6:>7.2f}M {label:>6} {med * 1e3:>7.2f}ms {100 * (med / base - 1):>+6.1f}% "
                f"{sum(r['checks']):>7} {launch * 1e3:>6.2f}ms {poll * 1e6:>5.0f}us "
                f"{per_step * 1e6:>7.0f}us {100 * per_step / base:>6.2f}%"
            )
    print("\nOne check's pieces, timed alone (median, rank 0 / rank 1):")
    for hidden in args.hidden:
        params = sum(p.numel() for p in _mlp(hidden).parameters())
        a, b = got[0]["parts"][hidden], got[1]["parts"][hidden]
        print(
            f"  {params / 1e6:.2f}M params ({4 * params / 1e6:.1f} MB): checksum "
            f"{a['checksum'] * 1e3:.2f} / {b['checksum'] * 1e3:.2f} ms, all-reduce launch "
            f"{a['launch'] * 1e6:.0f} / {b['launch'] * 1e6:.0f} us"
        )


def gpu_part(args: argparse.Namespace) -> None:
    from nnwatch.probe.consistency import tensor_checksum

    if not torch.cuda.is_available():
        print("no CUDA device: skipping the GPU part")
        return
    dev = torch.device("cuda")
    print(f"\nGPU: {torch.cuda.get_device_name(dev)}")
    print(
        f"{'params':>10} {'tensors':>8} {'checksum':>10} {'train step':>11} {'check/step':>11} {'every 100':>10}"
    )
    for width, depth in ((4096, 8), (8192, 12)):
        model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).to(
            dev, torch.bfloat16
        )
        params = list(model.parameters())
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
        x = torch.randn(4096, width, device=dev, dtype=torch.bfloat16)

        def check(params: list[torch.Tensor] = params) -> None:
            torch.stack([tensor_checksum(p) for p in params])

        def step(model: nn.Module = model, opt: Any = opt, x: torch.Tensor = x) -> None:
            opt.zero_grad(set_to_none=True)
            model(x).float().pow(2).mean().backward()
            opt.step()

        def timed(fn: Any, n: int) -> float:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            return (time.perf_counter() - t) / n

        c, s = timed(check, 20), timed(step, 10)
        n = sum(p.numel() for p in params)
        print(
            f"{n / 1e6:>9.0f}M {len(params):>8} {c * 1e3:>8.2f}ms {s * 1e3:>9.2f}ms "
            f"{100 * c / s:>10.2f}% {100 * c / s / 100:>9.3f}%"
        )
        del model, opt, params, x
        torch.cuda.empty_cache()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--gpu", action="store_true", help="also time the checksum on a CUDA device")
    ap.add_argument("--no-cpu", action="store_true", help="skip the 2-rank CPU part")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nnw-bench-") as tmp:
        args.run_dir = tmp
        if not args.no_cpu:
            cpu_part(args)
        if args.gpu:
            gpu_part(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
