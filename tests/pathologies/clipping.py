"""Clipping misuse: max_norm=0 (every gradient zeroed), and max_norm=1e-4 on norms near 1."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def clip_zero(wk: dict[str, Any]) -> Any:
    """A sigmoid MLP (a 'fix the init, replace sigmoid' suspect) whose clip is at max_norm=0."""
    torch.manual_seed(seed(110))
    x, y = blobs(2048, 32, 10, seed=seed(110))
    model = mlp([32, 64, 64, 10], nn.Sigmoid)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(110)),
        cross_entropy,
        60,
        wk,
        name="clip_zero",
        num_classes=10,
        clip=0.0,
    )


def clip_tiny(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(111))
    x, y = blobs(2048, 32, 10, seed=seed(111))
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(111)),
        cross_entropy,
        100,
        wk,
        name="clip_tiny",
        num_classes=10,
        clip=1e-4,
    )


CASES = [
    Case(
        "clip_max_norm_zero", "clipping_misuse", "clip_grad_norm_ at max_norm=0", clip_zero, onset=0
    ),
    Case("clip_max_norm_tiny", "clipping_misuse", "clip at 1e-4, norms near 1", clip_tiny, onset=0),
]
