"""Stalls the run-log writer's detectors put into a fast training loop, with and without the hand-back.

The writer thread feeds each quarter second of records to the detectors in one batch. A Python
thread that holds the GIL keeps it until a waiting thread has asked for CPython's switch interval
(5 ms), so a training thread coming back from a torch kernel during a batch can wait that long,
many times a batch; the detectors therefore hand the GIL back after every record. This bench
shows the difference on the training thread's step times, side by side in one process:

* ``bare``: an unwatched copy of the model (no records, an idle writer),
* ``hand-back``: the watched model, detectors as shipped,
* ``held``: the watched model with the hand-back switched off (``Diagnosis.hand_back = False``).

Windows of ``--steps`` steps rotate between the three, ``--rounds`` times. Reported per mode:
mean and median step, p99 and p99.9, the longest step, and the time lost in stalls (the sum of
every step's excess over twice the bare median). Means on a shared 2-core machine move by a few
percent between identical windows; the tail and the stall time are what this bench is for.

    python bench/writer_stalls.py                 # 8 rounds of 1500 steps
    python bench/writer_stalls.py --rounds 4 --width 256
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time

import torch
from torch import nn

import nnwatch
from nnwatch.probe.watch import internals


def _model(width: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def _window(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
            steps: int, w: nnwatch.Watch | None) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if w is not None:
            w.step(loss)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--width", type=int, default=128, help="hidden width of the 13-layer MLP")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    watched = _model(args.width)
    bare = copy.deepcopy(watched)
    x, y = torch.randn(32, args.width), torch.randint(0, 10, (32,))
    opt_w = torch.optim.SGD(watched.parameters(), lr=0.01, momentum=0.9)
    opt_b = torch.optim.SGD(bare.parameters(), lr=0.01, momentum=0.9)
    modes = ("bare", "hand-back", "held")
    times: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp, nnwatch.watch(
        watched, opt_w, run_dir=f"{tmp}/run", name="writer-stalls", channel=False
    ) as w:
        _window(watched, opt_w, x, y, 300, w)  # past the probe's warm-up
        _window(bare, opt_b, x, y, 300, None)
        diag = internals(w).files.diagnosis
        for rnd in range(args.rounds):
            order = modes if rnd % 2 == 0 else modes[::-1]
            for mode in order:
                if diag is not None:
                    diag.hand_back = mode != "held"
                time.sleep(0.3)  # the writer drains what the last window left
                if mode == "bare":
                    times[mode] += _window(bare, opt_b, x, y, args.steps, None)
                else:
                    times[mode] += _window(watched, opt_w, x, y, args.steps, w)
            print(f"  round {rnd + 1}/{args.rounds} done", flush=True)
    base = statistics.median(times["bare"])
    print(f"\n{args.rounds} rounds x {args.steps} steps per mode, {args.threads} torch thread(s); "
          f"bare median step {1e3 * base:.3f} ms")
    print(f"{'mode':>10} {'mean ms':>8} {'median':>8} {'p99':>8} {'p99.9':>8} {'max':>8} "
          f"{'stalls ms':>10} {'stall share':>12}")
    for mode in modes:
        v = sorted(times[mode])
        n = len(v)
        stall = sum(t - 2 * base for t in v if t > 2 * base)
        print(f"{mode:>10} {1e3 * sum(v) / n:8.3f} {1e3 * v[n // 2]:8.3f} {1e3 * v[int(n * 0.99)]:8.3f} "
              f"{1e3 * v[int(n * 0.999)]:8.3f} {1e3 * v[-1]:8.2f} {1e3 * stall:10.1f} "
              f"{100 * stall / sum(v):11.2f}%")
    print("\nstalls = the sum of every step's excess over twice the bare median step; "
          "stall share = that over the mode's total time")


if __name__ == "__main__":
    main()
