"""Oscillating loss: full-batch gradient descent whose LR is raised past the stability limit.

Gradient descent on a loss of curvature lambda is stable only for LR < 2 / lambda. Past that
limit the iterate overshoots the valley floor on every step; on a quadratic it would run away,
but the logistic loss flattens far from its optimum, so the iterate settles into a bounded
back-and-forth (a period-2 cycle or a longer one) and the loss swings around a level a little
above where it was, with no trend. Each program measures the largest Hessian eigenvalue at step
60 and sets the LR to twice its stability limit, so the pathology is the same on every seed.

An earlier program here raised Adam's LR 100x on a noisy 10-class problem: its loss leapt to
2-3x its level, above chance (ln 10), and stayed there. That is a divergence, and it now lives
in ``diverging.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, blobs, cross_entropy, seed, set_lr, train

ONSET = 60
PAST_LIMIT = 2.0  # the LR set at ONSET, in units of the stability limit 2 / lambda_max


def sharpness(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Largest eigenvalue of the full-batch cross-entropy Hessian at the current weights."""
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])

    def loss_of(v: torch.Tensor) -> torch.Tensor:
        params, i = {}, 0
        for name, shape in zip(names, shapes, strict=True):
            n = shape.numel()
            params[name] = v[i : i + n].view(shape)
            i += n
        return nn.functional.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    hessian = torch.autograd.functional.hessian(loss_of, flat)
    return float(torch.linalg.eigvalsh(hessian).max())


def _logistic_past_limit(wk: dict[str, Any], n: int, dim: int, name: str) -> Any:
    """Logistic regression on badly scaled, non-separable data, full batch, from zero weights."""
    torch.manual_seed(seed(n))
    x, y = blobs(512, dim, 2, seed=seed(n), spread=3.0, label_noise=0.1)
    x = (x - x.mean(0)) / x.std(0) * torch.linspace(0.2, 3.0, dim)
    model = nn.Linear(dim, 2)
    nn.init.zeros_(model.weight)  # logistic regression starts at 0: loss ln 2
    nn.init.zeros_(model.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def past_limit(step: int, m: nn.Module, o: torch.optim.Optimizer) -> None:
        if step == ONSET:
            set_lr(o, PAST_LIMIT * 2.0 / sharpness(m, x, y))

    return train(
        model,
        opt,
        lambda s: (x, y),
        cross_entropy,
        150,
        wk,
        name=name,
        num_classes=2,
        before_step=past_limit,
    )


def full_batch_overshoot(wk: dict[str, Any]) -> Any:
    return _logistic_past_limit(wk, 81, 8, "oscillating_full_batch")


def full_batch_overshoot_wide(wk: dict[str, Any]) -> Any:
    return _logistic_past_limit(wk, 85, 12, "oscillating_full_batch_wide")


CASES = [
    Case(
        "oscillating_full_batch",
        "oscillating_loss",
        "full-batch GD on 8 features, LR 2x past 2/curvature at step 60",
        full_batch_overshoot,
        onset=ONSET,
    ),
    Case(
        "oscillating_full_batch_wide",
        "oscillating_loss",
        "full-batch GD on 12 features, LR 2x past 2/curvature at step 60",
        full_batch_overshoot_wide,
        onset=ONSET,
    ),
]
