"""Exploding gradients: an LR jump mid-run, an LR too high from the start, and a loop that forgot
``optimizer.zero_grad()``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, lr_at, mlp, seed, train

ONSET = 60


def lr_jump(wk: dict[str, Any]) -> Any:
    """Regression MLP trains well with SGD; at step 60 the LR goes up 30x and the run diverges."""
    torch.manual_seed(seed(10))
    g = torch.Generator().manual_seed(seed(10))
    x = torch.randn(2048, 16, generator=g)
    y = torch.sin(x[:, :4]).sum(1, keepdim=True) + 0.1 * torch.randn(2048, 1, generator=g)
    model = mlp([16, 64, 64, 1], nn.Tanh)

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1])

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(10)),
        loss_fn,
        120,
        wk,
        name="exploding_lr_jump",
        before_step=lr_at(ONSET, 1.5),
    )


def no_zero_grad(wk: dict[str, Any]) -> Any:
    """The loop never zeroes the gradients: they pile up step after step, and so do the updates."""
    import nnwatch

    torch.manual_seed(seed(11))
    x, y = blobs(2048, 16, 5, seed=seed(11))
    model = mlp([16, 64, 5])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    w = nnwatch.watch(model, opt, num_classes=5, name="exploding_no_zero_grad", **wk)
    sample = Sampler(x, y, 64, seed=seed(11))
    for step in range(100):
        batch = sample(step)
        loss = cross_entropy(model, batch)
        loss.backward()  # BUG: no optimizer.zero_grad()
        opt.step()
        w.step(loss, batch=batch)
    w.close()
    return w


def lr_too_high(wk: dict[str, Any]) -> Any:
    """The LR is too high from the first step: SGD with momentum on a tanh regression diverges."""
    torch.manual_seed(seed(12))
    g = torch.Generator().manual_seed(seed(12))
    x = torch.randn(2048, 16, generator=g)
    y = torch.sin(x[:, :3]).sum(1, keepdim=True) + 0.1 * torch.randn(2048, 1, generator=g)
    model = mlp([16, 64, 64, 1], nn.Tanh)

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1])

    opt = torch.optim.SGD(model.parameters(), lr=0.25, momentum=0.9)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(12)), loss_fn, 80, wk, name="exploding_lr_too_high"
    )


CASES = [
    Case(
        "exploding_lr_jump",
        "exploding_gradients",
        "SGD+momentum regression, LR x30 at step 60",
        lr_jump,
        onset=ONSET,
    ),
    Case(
        "exploding_lr_too_high",
        "exploding_gradients",
        "SGD+momentum, LR too high from the start",
        lr_too_high,
        onset=0,
    ),
    Case(
        "exploding_no_zero_grad",
        "exploding_gradients",
        "gradients accumulate: zero_grad() is missing",
        no_zero_grad,
        onset=0,
    ),
]
