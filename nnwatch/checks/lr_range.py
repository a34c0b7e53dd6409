"""Check D: which learning rate is sensible? An exponential LR range test on a copy of the model.

The sweep trains a copy for ``steps`` mini-batches while the learning rate grows geometrically
from ``start`` to ``end``, and stops once the exponentially smoothed loss (beta 0.9, bias
corrected) exceeds 4x the best smoothed loss so far, or turns NaN/Inf. That point is reported as
the LR where training diverges.

The suggestion rule ("steep-and-safe", see :func:`suggest_lr`):

1. smooth the raw losses up to the divergence point with a *centered* Gaussian kernel
   (sigma = steps/25 points). Unlike the running average used for stopping, it has no lag, so the
   curve is not shifted towards larger learning rates;
2. ``lr_min`` = the LR at the minimum of that curve; ``lr_steep`` = the LR of its steepest descent
   (most negative slope against log10 LR), searched only to the left of ``lr_min``;
3. suggestion = the geometric mean of ``lr_steep`` and ``lr_min / 10``.

Why not the classic "steepest slope of the running average"? On noisy curves its argmin lands on
noise, very often among the first steps, where the bias-corrected average is built from only a
few samples. The minimum of a lag-free smoothed curve is stable, ``lr_min / 10`` keeps a decade
of margin below the cliff, and averaging with the steepest point keeps the suggestion on the
descending part of the curve. ``tests/unit/test_checks_lr.py`` measures both rules on synthetic noisy
curves with a known shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np
import torch
from torch import nn

from nnwatch.checks.common import (
    CheckError,
    CheckResult,
    LossFn,
    call_model,
    compute_loss,
    copy_user_optimizer,
    group_lr,
    model_device,
    prepared_copy,
    seeded,
    split_batch,
    to_device,
)
from nnwatch.checks.textplot import line_chart

DIVERGE_FACTOR = 4.0
EMA_BETA = 0.9
MIN_DROP = 0.03  # the smoothed loss must fall at least 3% below its start for a suggestion


def format_lr(lr: float) -> str:
    """``0.0039 -> "3.9e-3"``: short, and unambiguous next to other LRs."""
    mantissa, exp = f"{lr:.1e}".split("e")
    return f"{mantissa}e{int(exp)}"


@dataclass(frozen=True)
class LRSuggestion:
    """The pieces of the rule, kept so that a report can show how the number was reached."""

    lr: float
    lr_min: float
    lr_steep: float


@dataclass(frozen=True)
class LRFindResult(CheckResult):
    """Outcome of :func:`lr_find`: the curve, the suggestion and where the loss diverged."""

    check_name: ClassVar[str] = "LR range"
    passed: bool
    verdict: str
    suggestion: float | None
    lr_min: float | None
    lr_steep: float | None
    diverged_at: float | None
    current_lr: float | None
    lrs: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: bool = False

    def summary(self) -> str:
        if self.suggestion is None:
            return "no suggestion" + (
                f" (diverges above {self.diverged_at:.2g})" if self.diverged_at else ""
            )
        tail = (
            f"diverges above {self.diverged_at:.2g}"
            if self.diverged_at is not None
            else f"no divergence up to {self.lrs[-1]:.2g}"
        )
        return f"suggested {format_lr(self.suggestion)} ({tail})"

    def plot(self, width: int = 60, height: int = 12) -> str:
        """The smoothed loss against the LR (log scale) as plain text, marks at the key LRs."""
        if not self.smoothed:
            return "(no curve)"
        finite = [v for v in self.smoothed if math.isfinite(v)]
        best = min(finite) if finite else 1.0
        marks: dict[str, float] = {}
        if self.suggestion is not None:
            marks["suggested"] = self.suggestion
        if self.current_lr is not None:
            marks["yours"] = self.current_lr
        return line_chart(
            self.lrs,
            self.smoothed,
            width=width,
            height=height,
            y_max=min(max(finite, default=1.0), DIVERGE_FACTOR * best),
            marks=marks,
            y_label="loss",
        )


# ----------------------------------------------------------------------------------------------
# the rule


def ema(losses: Iterable[float], beta: float = EMA_BETA) -> list[float]:
    """Bias-corrected exponential moving average (what the sweep watches to stop)."""
    out, avg = [], 0.0
    for i, v in enumerate(losses):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def divergence_index(smoothed: list[float], factor: float = DIVERGE_FACTOR) -> int | None:
    """First index where the smoothed loss is non-finite or above ``factor`` x the best so far."""
    best = math.inf
    for i, v in enumerate(smoothed):
        if not math.isfinite(v):
            return i
        best = min(best, v)
        if i > 0 and v > factor * best:
            return i
    return None


def centered_smooth(values: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian kernel smoothing over the index, renormalised at the edges (no phase lag)."""
    n = len(values)
    idx = np.arange(n, dtype=float)
    weights = np.exp(-0.5 * ((idx[None, :] - idx[:, None]) / max(sigma, 1e-9)) ** 2)
    return cast("np.ndarray", (weights @ values) / weights.sum(axis=1))


def suggest_lr(
    lrs: list[float], losses: list[float], *, diverge_factor: float = DIVERGE_FACTOR
) -> LRSuggestion | None:
    """The "steep-and-safe" rule described in the module docstring; None when the loss never fell."""
    if len(lrs) != len(losses):
        raise ValueError("lrs and losses differ in length")
    stop = divergence_index(ema(losses), diverge_factor)
    n = len(losses) if stop is None else stop
    if n < 5:
        return None
    x = np.log10(np.asarray(lrs[:n], dtype=float))
    y = np.asarray(losses[:n], dtype=float)
    if not np.all(np.isfinite(y)):
        return None
    smooth = centered_smooth(y, max(2.0, len(lrs) / 25))
    m = int(np.argmin(smooth))
    if m == 0 or smooth[m] > (1 - MIN_DROP) * smooth[0]:
        return None
    slope = np.gradient(smooth, x)
    s = int(np.argmin(slope[: m + 1]))
    lr_min, lr_steep = float(lrs[m]), float(lrs[s])
    return LRSuggestion(
        lr=float(10 ** ((math.log10(lr_steep) + math.log10(lr_min / 10)) / 2)),
        lr_min=lr_min,
        lr_steep=lr_steep,
    )


def steepest_slope_lr(lrs: list[float], losses: list[float], beta: float = 0.98) -> float | None:
    """The classic rule, for comparison: steepest descent of the running average (fastai's beta)."""
    smooth = ema(losses, beta)
    stop = divergence_index(smooth)
    n = len(losses) if stop is None else stop
    if n < 3:
        return None
    slope = np.gradient(np.asarray(smooth[:n]), np.log10(np.asarray(lrs[:n], dtype=float)))
    return float(lrs[int(np.argmin(slope))])


# ----------------------------------------------------------------------------------------------
# the sweep


def _forever(loader: Iterable[Any]) -> Iterator[Any]:
    while True:
        empty = True
        for b in loader:
            empty = False
            yield b
        if empty:
            raise CheckError("the loader yielded no batches")


def lr_find(
    model: nn.Module,
    loader: Iterable[Any],
    loss_fn: LossFn,
    optimizer_cls: type[torch.optim.Optimizer] = torch.optim.AdamW,
    start: float = 1e-7,
    end: float = 10.0,
    steps: int = 100,
    *,
    optimizer_kwargs: dict[str, Any] | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    current_lr: float | None = None,
    diverge_factor: float = DIVERGE_FACTOR,
    seed: int = 0,
    show: bool = False,
) -> LRFindResult:
    """Sweep the LR from ``start`` to ``end`` over ``steps`` batches of ``loader`` on a copy.

    ``optimizer`` (the user's, untouched) replaces ``optimizer_cls``: its class, hyper-parameters
    and parameter membership are copied, and its LR becomes ``current_lr`` so it can be judged
    against the curve. ``show`` prints the curve as text.
    """
    if not (0 < start < end) or steps < 2:
        raise ValueError("need 0 < start < end and steps >= 2")
    lrs_all = [start * (end / start) ** (i / (steps - 1)) for i in range(steps)]
    with seeded(seed):
        net = prepared_copy(model)
        if optimizer is not None:
            opt, warnings = copy_user_optimizer(optimizer, model, net)
            if current_lr is None:
                current_lr = max(group_lr(g) for g in optimizer.param_groups)
        else:
            params = [p for p in net.parameters() if p.requires_grad]
            opt = optimizer_cls(params, lr=start, **(optimizer_kwargs or {}))  # type: ignore[call-arg]
            warnings = []
        lrs, losses, smoothed = _sweep(net, opt, loader, loss_fn, lrs_all, diverge_factor)
    stop = divergence_index(smoothed, diverge_factor)
    diverged_at = lrs[stop] if stop is not None else None
    pick = suggest_lr(lrs, losses, diverge_factor=diverge_factor)
    causes: list[str] = []
    verdict = _verdict(pick, stop, diverged_at, current_lr, causes, warnings)
    result = LRFindResult(
        passed=verdict == "OK",
        verdict=verdict,
        suggestion=pick.lr if pick else None,
        lr_min=pick.lr_min if pick else None,
        lr_steep=pick.lr_steep if pick else None,
        diverged_at=diverged_at,
        current_lr=current_lr,
        lrs=lrs,
        losses=losses,
        smoothed=smoothed,
        causes=causes,
        warnings=warnings,
    )
    if show:
        print(result.plot())
    return result


def _sweep(
    net: nn.Module,
    opt: torch.optim.Optimizer,
    loader: Iterable[Any],
    loss_fn: LossFn,
    lrs_all: list[float],
    diverge_factor: float,
) -> tuple[list[float], list[float], list[float]]:
    """One step per LR, until the smoothed loss diverges: (LRs, losses, smoothed losses)."""
    device = model_device(net)
    batches = _forever(loader)
    lrs: list[float] = []
    losses: list[float] = []
    best = math.inf
    avg = 0.0
    smoothed: list[float] = []
    for i, lr in enumerate(lrs_all):
        for g in opt.param_groups:
            g["lr"] = lr
        inputs, targets = to_device(split_batch(next(batches)), device)
        opt.zero_grad(set_to_none=True)
        loss = compute_loss(loss_fn, call_model(net, inputs), targets)
        if loss.requires_grad:
            loss.backward()
        opt.step()
        value = float(loss.detach())
        lrs.append(lr)
        losses.append(value)
        avg = EMA_BETA * avg + (1 - EMA_BETA) * value
        sm = avg / (1 - EMA_BETA ** (i + 1))
        smoothed.append(sm)
        if not math.isfinite(sm) or (i > 0 and sm > diverge_factor * best):
            break
        best = min(best, sm)
    return lrs, losses, smoothed


def _verdict(
    pick: Any,
    stop: int | None,
    diverged_at: float | None,
    current_lr: float | None,
    causes: list[str],
    warnings: list[str],
) -> str:
    """FAILED (no LR to suggest), TOO HIGH (the user's LR diverges) or OK, with why."""
    if pick is None:
        if stop is not None and stop < 5:
            causes.append(
                f"the loss diverged at once (lr {diverged_at:.2g}): start the sweep lower or "
                "check the gradient check for exploding gradients"
            )
        else:
            causes.append(
                "the loss never fell during the sweep: fix the single-batch check first "
                "(a graph, optimizer or label bug stops any LR from working)"
            )
        return "FAILED"
    if current_lr is not None and diverged_at is not None and current_lr >= diverged_at:
        causes.append(
            f"your learning rate {current_lr:.2g} is at or above {diverged_at:.2g}, where the "
            f"loss diverges; try {format_lr(pick.lr)}"
        )
        return "TOO HIGH"
    if current_lr is not None and current_lr > 10 * pick.lr:
        warnings.append(
            f"your learning rate {current_lr:.2g} is over 10x the suggestion {format_lr(pick.lr)}"
        )
    elif current_lr is not None and current_lr < pick.lr / 100:
        warnings.append(
            f"your learning rate {current_lr:.2g} is under 1/100 of the suggestion "
            f"{format_lr(pick.lr)}: training may be needlessly slow"
        )
    return "OK"
