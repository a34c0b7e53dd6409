"""Shared pieces of the pathology suite: seeded synthetic data and one real training loop.

Every case is a real PyTorch training run with ``nnwatch.watch`` attached (real hooks, real run log,
real detectors in the writer thread). Data is synthetic but learnable, and seeded, so that a case
behaves the same on every machine.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import nnwatch

Batch = Any

#: Added to every seed of the suite; the bench sets it to repeat the suite on fresh data and inits.
SEED_OFFSET = 0


def seed(n: int) -> int:
    """Case seed ``n``, shifted by ``SEED_OFFSET``."""
    return n + 1000 * SEED_OFFSET


LossFn = Callable[[nn.Module, Batch], torch.Tensor]


@dataclass(frozen=True)
class Case:
    """One run of the suite. ``expect`` is the finding kind it must raise (None: a healthy run)."""

    name: str
    expect: str | None
    description: str
    train: Callable[[dict[str, Any]], Any]
    onset: int | None = 0
    """Step at which the problem starts; None means "the first step with a non-finite value"."""
    layer: str | None = None
    """The layer the finding must name, where the case has a single culprit."""


def blobs(n: int, dim: int, k: int, seed: int, spread: float = 1.0, label_noise: float = 0.0):
    """Gaussian clusters, one per class: a learnable K-class problem."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(k, dim, generator=g) * 2.0
    y = torch.randint(0, k, (n,), generator=g)
    x = centers[y] + spread * torch.randn(n, dim, generator=g)
    if label_noise > 0:
        flip = torch.rand(n, generator=g) < label_noise
        y = torch.where(flip, torch.randint(0, k, (n,), generator=g), y)
    return x, y


class Sampler:
    """Random minibatches from fixed tensors, seeded: ``sampler(step) -> (x, y)``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0) -> None:
        self.x, self.y, self.bs = x, y, batch_size
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.x.shape[0], (self.bs,), generator=self.g)
        return self.x[idx], self.y[idx]


def cross_entropy(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def mse(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def mlp(sizes: list[int], act: Callable[[], nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    next_batch: Callable[[int], Batch],
    loss_fn: LossFn,
    steps: int,
    watch_kwargs: dict[str, Any],
    *,
    name: str,
    num_classes: int | None = None,
    scaler: Any = None,
    autocast_dtype: torch.dtype | None = None,
    clip: float | None = None,
    before_step: Callable[[int, nn.Module, torch.optim.Optimizer], None] | None = None,
    scheduler: Any = None,
) -> Any:
    """The ordinary loop: zero_grad, forward, backward, (clip), step, w.step(loss, batch=...)."""
    w = nnwatch.watch(model, optimizer, scaler, num_classes=num_classes, name=name, **watch_kwargs)
    for step in range(steps):
        if before_step is not None:
            before_step(step, model, optimizer)
        batch = next_batch(step)
        optimizer.zero_grad(set_to_none=True)
        ctx = (
            torch.autocast("cpu", dtype=autocast_dtype)
            if autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with ctx:
            loss = loss_fn(model, batch)
        if scaler is not None:
            scaler.scale(loss).backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                w.clip_grad_norm_(clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if clip is not None:
                w.clip_grad_norm_(clip)
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        w.step(loss, batch=batch)
    w.close()
    return w


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def lr_at(step_from: int, lr: float) -> Callable[[int, nn.Module, torch.optim.Optimizer], None]:
    """A ``before_step`` that changes the LR at ``step_from`` (the onset of an LR-made problem)."""

    def hook(step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if step == step_from:
            set_lr(optimizer, lr)

    return hook


LN = math.log
