"""Oscillating loss: Adam's LR raised 100x mid-run, and full-batch GD stepping past the curvature."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, lr_at, mlp, seed, train

ONSET = 60


def adam_lr_raise(wk: dict[str, Any]) -> Any:
    """Overlapping classes with label noise; Adam's LR goes from 1e-3 to 0.1 at step 60."""
    torch.manual_seed(seed(80))
    x, y = blobs(4096, 32, 10, seed=seed(80), spread=3.0, label_noise=0.2)
    model = mlp([32, 64, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 128, seed=seed(80)),
        cross_entropy,
        150,
        wk,
        name="oscillating_adam_lr",
        num_classes=10,
        before_step=lr_at(ONSET, 0.1),
    )


def full_batch_overshoot(wk: dict[str, Any]) -> Any:
    """Logistic regression on badly scaled, non-separable data, full batch; at step 60 the LR jumps
    past 2/curvature and the loss spikes and recovers over and over (it cannot diverge: the
    logistic loss flattens far from the optimum)."""
    torch.manual_seed(seed(81))
    x, y = blobs(512, 8, 2, seed=seed(81), spread=3.0, label_noise=0.1)
    x = (x - x.mean(0)) / x.std(0) * torch.linspace(0.2, 3.0, 8)
    model = nn.Linear(8, 2)
    nn.init.zeros_(model.weight)  # logistic regression starts at 0: loss ln 2
    nn.init.zeros_(model.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        lambda s: (x, y),
        cross_entropy,
        150,
        wk,
        name="oscillating_full_batch",
        num_classes=2,
        before_step=lr_at(ONSET, 5.0),
    )


CASES = [
    Case(
        "oscillating_adam_lr_raise",
        "oscillating_loss",
        "Adam, LR 1e-3 -> 0.1 at step 60",
        adam_lr_raise,
        onset=ONSET,
    ),
    Case(
        "oscillating_full_batch",
        "oscillating_loss",
        "full-batch GD, LR past 2/curvature at step 60",
        full_batch_overshoot,
        onset=ONSET,
    ),
]
