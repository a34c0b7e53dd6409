"""NaN/Inf: log of underflowing probabilities, a corrupt batch, a division by a zero norm, the square
root of a negative number, and an exp that overflows."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import nan_log
from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train

BAD_STEP = 30


def corrupt_batch(wk: dict[str, Any]) -> Any:
    """A data pipeline bug delivers one sample full of NaN at step 30."""
    torch.manual_seed(seed(40))
    x, y = blobs(2048, 16, 5, seed=seed(40))
    sample = Sampler(x, y, 32, seed=seed(40))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by = sample(step)
        if step == BAD_STEP:
            bx = bx.clone()
            bx[7] = float("nan")
        return bx, by

    model = mlp([16, 64, 5])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model, opt, next_batch, cross_entropy, 60, wk, name="nan_corrupt_batch", num_classes=5
    )


class UnitNorm(nn.Module):
    """Project features onto the unit sphere, without an epsilon (the bug)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.norm(dim=-1, keepdim=True)


def zero_norm(wk: dict[str, Any]) -> Any:
    """Padding rows (all-zero inputs) reach a bias-free layer and a norm division: 0/0 = NaN."""
    torch.manual_seed(seed(41))
    x, y = blobs(2048, 16, 5, seed=seed(41))
    sample = Sampler(x, y, 32, seed=seed(41))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by = sample(step)
        if step >= BAD_STEP:
            bx = bx.clone()
            bx[-2:] = 0.0  # padding
        return bx, by

    model = nn.Sequential(
        nn.Linear(16, 32, bias=False), UnitNorm(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(model, opt, next_batch, cross_entropy, 60, wk, name="nan_zero_norm", num_classes=5)


def exp_overflow(wk: dict[str, Any]) -> Any:
    """A hand-written softmax (exp without subtracting the max) overflows once logits pass ~88."""
    torch.manual_seed(seed(42))
    x, y = blobs(2048, 16, 5, seed=seed(42), spread=0.5)  # easy data: logits grow fast
    model = mlp([16, 64, 5])

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        z = m(b[0])
        e = torch.exp(z)
        p = e / e.sum(dim=1, keepdim=True)
        return -torch.log(p.gather(1, b[1][:, None]) + 1e-12).mean()

    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    return train(
        model,
        opt,
        Sampler(x, y, 32, seed=seed(42)),
        loss_fn,
        60,
        wk,
        name="nan_exp_overflow",
        num_classes=5,
    )


class VarianceNorm(nn.Module):
    """Scale by 1/sqrt(var - 0.5): the subtraction is a bug, the square root goes negative."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.var(dim=-1, keepdim=True) - 0.5)


def sqrt_negative(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(43))
    x, y = blobs(2048, 16, 5, seed=seed(43))
    model = nn.Sequential(nn.Linear(16, 32), VarianceNorm(), nn.ReLU(), nn.Linear(32, 5))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        Sampler(x, y, 32, seed=seed(43)),
        cross_entropy,
        80,
        wk,
        name="nan_sqrt_negative",
        num_classes=5,
    )


CASES = [
    Case(
        "nan_log_underflow",
        "nan_or_inf",
        "log(softmax) on one corrupt sample: log(0)",
        lambda wk: nan_log.train(wk),
        onset=None,
    ),
    Case(
        "nan_corrupt_batch",
        "nan_or_inf",
        "a NaN sample in the batch at step 30",
        corrupt_batch,
        onset=None,
        layer="0",
    ),
    Case(
        "nan_zero_norm",
        "nan_or_inf",
        "x / x.norm() on all-zero padding rows",
        zero_norm,
        onset=None,
        layer="2",
    ),
    Case(
        "nan_sqrt_negative",
        "nan_or_inf",
        "sqrt(var - 0.5) in a custom module",
        sqrt_negative,
        onset=None,
        layer="2",
    ),
    Case(
        "nan_exp_overflow",
        "nan_or_inf",
        "hand-written softmax: exp overflows",
        exp_overflow,
        onset=None,
    ),
]
