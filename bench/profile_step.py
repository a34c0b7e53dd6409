"""Where nnwatch's own time goes in a training step: cProfile over a watched loop.

The overhead benchmark says how much nnwatch costs; this says which of its functions cost it,
on the CPU or on a GPU (``--device cuda``), so that a slow path is found by measurement.

    python bench/profile_step.py --device cuda --model mlp --steps 300
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import overhead  # noqa: E402 - the benchmark's models

import nnwatch  # noqa: E402
from nnwatch.probe.watch import internals  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="mlp", choices=list(overhead.MODELS))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--only", default="", help="list only functions whose file path holds this (e.g. nnwatch)")
    args = ap.parse_args()
    torch.manual_seed(0)
    model, batch = overhead.MODELS[args.model]()
    model.to(args.device)
    data = [tuple(t.to(args.device) for t in batch()) for _ in range(4)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    cuda = args.device.startswith("cuda")

    def loop(n: int, w: nnwatch.Watch | None) -> float:
        t = time.perf_counter()
        for i in range(n):
            x, y = data[i % len(data)]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if w is not None:
                w.step(loss, batch=(x, y))
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t) / n

    loop(50, None)
    bare = loop(args.steps, None)
    with nnwatch.watch(model, opt, name="profile", run_dir=tempfile.mkdtemp()) as w:
        loop(100, w)  # past the warm-up and the budget's first decisions
        prof = cProfile.Profile()
        prof.enable()
        watched = loop(args.steps, w)
        prof.disable()
        print(f"bare {bare * 1e3:.3f} ms/step, watched {watched * 1e3:.3f} ms/step "
              f"(x{watched / bare:.3f}), budget k={internals(w).parts.schedule.budget.interval}, stats every {internals(w).parts.schedule.budget.layer_interval}")
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    if args.only:
        stats.sort_stats("cumulative").print_stats(args.only, args.top)
    else:
        stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
