"""Loss spikes that recover: one batch with its labels scrambled, and one batch of regression
targets off by a unit (x100), in otherwise healthy runs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train

AT = 80


def scrambled_labels(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(100))
    x, y = blobs(2048, 32, 10, seed=seed(100), spread=0.5)
    sample = Sampler(x, y, 64, seed=seed(100))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by = sample(step)
        return bx, ((by + 3) % 10 if step == AT else by)

    model = mlp([32, 64, 10])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(
        model, opt, next_batch, cross_entropy, 140, wk, name="spike_labels", num_classes=10
    )


def unit_error_batch(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(101))
    g = torch.Generator().manual_seed(seed(101))
    x = torch.randn(2048, 8, generator=g)
    y = x[:, :2].sum(1, keepdim=True)
    sample = Sampler(x, y, 64, seed=seed(101))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by = sample(step)
        return bx, (by * 100.0 if step == AT else by)

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1])

    model = mlp([8, 32, 1], nn.Tanh)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(model, opt, next_batch, loss_fn, 140, wk, name="spike_unit_error")


CASES = [
    Case(
        "spike_scrambled_labels",
        "loss_spike",
        "labels shifted in one batch",
        scrambled_labels,
        onset=AT,
    ),
    Case(
        "spike_unit_error_batch",
        "loss_spike",
        "targets x100 in one batch",
        unit_error_batch,
        onset=AT,
    ),
]
