"""Test plumbing for the corpus: what each program's own code computed, one JSON line per update.

The corpus programs are written the way public training scripts are written; the tests compare
what nnwatch recorded against what the program itself computed (the norm its own clip returned).
When ``CORPUS_OUT`` names a file, each program appends its numbers there. Unset, every call here
returns at once, so the benchmark times the plain program; with ``CORPUS_TIMES`` set it only
notes the time of each update, for the benchmark's steady per-step figure.
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import time
from collections.abc import Iterable
from typing import Any

import torch

OUT = os.environ.get("CORPUS_OUT")
#: Set by the benchmark: time each update, and print the steady step time at exit.
TIMES: list[float] | None = [] if os.environ.get("CORPUS_TIMES") else None


def _print_steady_step() -> None:
    """The median time between updates over the second half of the run: the per-step cost once
    the watch's set-up, the probe's warm-up and first-call costs are behind."""
    if TIMES and len(TIMES) >= 8:
        late = TIMES[len(TIMES) // 2 :]
        gaps = [b - a for a, b in zip(late, late[1:], strict=False)]
        print(f"CORPUS_STEP_SECONDS {statistics.median(gaps):.9f}", flush=True)


if TIMES is not None:
    atexit.register(_print_steady_step)


def record(update: int, norm: Any = None, max_norm: float | None = None, *, how: str = "torch_clip") -> None:
    """One optimizer update: the pre-clip norm the program computed, and its clip threshold.

    ``how`` says where the norm came from: ``torch_clip`` (returned by
    ``torch.nn.utils.clip_grad_norm_``), ``manual`` (the program's own sum of squares) or
    ``value`` (measured just before ``clip_grad_value_``).
    """
    if TIMES is not None:
        TIMES.append(time.perf_counter())
    if not OUT:
        return
    value = None if norm is None else float(norm)
    clipped = None if value is None or max_norm is None else bool(value > max_norm)
    line = {"update": update, "norm": value, "max_norm": max_norm, "clipped": clipped, "how": how}
    with open(OUT, "a") as fh:
        fh.write(json.dumps(line) + "\n")


def grad_norm(parameters: Iterable[torch.Tensor]) -> float | None:
    """The global L2 norm of the accumulated gradients, only when the numbers are being recorded."""
    if not OUT:
        return None
    norms = [torch.linalg.vector_norm(p.grad) for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms)))
