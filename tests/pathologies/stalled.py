"""Loss stalled: LR far too small (SGD and Adam), a scheduler that drops the LR to 0, a detached
loss, an optimizer that holds a copy of the model's parameters, and labels that do not line up
with the inputs."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train

ZERO_AT = 60


def tiny_lr_sgd(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(50))
    x, y = blobs(2048, 32, 10, seed=seed(50))
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=1e-7)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(50)),
        cross_entropy,
        80,
        wk,
        name="stalled_tiny_lr",
        num_classes=10,
    )


def tiny_lr_adam(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(51))
    x, y = blobs(2048, 32, 10, seed=seed(51))
    model = mlp([32, 64, 64, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-8)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(51)),
        cross_entropy,
        80,
        wk,
        name="stalled_adam_tiny_lr",
        num_classes=10,
    )


def scheduler_zero(wk: dict[str, Any]) -> Any:
    """A LambdaLR with an integer division bug: the factor becomes 0 at step 60."""
    torch.manual_seed(seed(52))
    x, y = blobs(2048, 32, 10, seed=seed(52), spread=2.0)
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 1 - s // ZERO_AT if s < 2 * ZERO_AT else 0
    )
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(52)),
        cross_entropy,
        120,
        wk,
        name="stalled_zero_lr",
        num_classes=10,
        scheduler=sched,
    )


def detached(wk: dict[str, Any]) -> Any:
    """The logits are detached before the loss (a .detach() left over from logging)."""
    torch.manual_seed(seed(53))
    x, y = blobs(2048, 32, 10, seed=seed(53))
    model = mlp([32, 64, 10])

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        logits = m(b[0]).detach().requires_grad_()
        return nn.functional.cross_entropy(logits, b[1])

    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(53)),
        loss_fn,
        60,
        wk,
        name="stalled_detached",
        num_classes=10,
    )


def misaligned_labels(wk: dict[str, Any]) -> Any:
    """Labels were shuffled separately from the inputs: there is nothing to learn."""
    torch.manual_seed(seed(54))
    x, y = blobs(8192, 32, 10, seed=seed(54))
    y = y[torch.randperm(y.numel(), generator=torch.Generator().manual_seed(seed(0)))]
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(54)),
        cross_entropy,
        120,
        wk,
        name="stalled_misaligned",
        num_classes=10,
    )


def optimizer_on_a_copy(wk: dict[str, Any]) -> Any:
    """The optimizer was built on a deep copy of the model: the model's own weights never move."""
    import copy

    import nnwatch

    torch.manual_seed(seed(55))
    x, y = blobs(2048, 32, 10, seed=seed(55))
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(copy.deepcopy(model).parameters(), lr=0.05)
    w = nnwatch.watch(model, opt, num_classes=10, name="stalled_optimizer_copy", **wk)
    sample = Sampler(x, y, 64, seed=seed(55))
    for step in range(150):
        batch = sample(step)
        model.zero_grad()
        loss = cross_entropy(model, batch)
        loss.backward()
        opt.step()
        w.step(loss, batch=batch)
    w.close()
    return w


CASES = [
    Case("stalled_tiny_lr_sgd", "loss_stalled", "SGD with lr=1e-7", tiny_lr_sgd, onset=0),
    Case("stalled_tiny_lr_adam", "loss_stalled", "Adam with lr=1e-8", tiny_lr_adam, onset=0),
    Case(
        "stalled_scheduler_zero",
        "loss_stalled",
        "LambdaLR drops the LR to 0 at step 60",
        scheduler_zero,
        onset=ZERO_AT,
    ),
    Case(
        "stalled_detached_loss",
        "loss_stalled",
        "logits detached before the loss",
        detached,
        onset=0,
    ),
    Case(
        "stalled_optimizer_on_a_copy",
        "loss_stalled",
        "optimizer built on a deep copy of the model",
        optimizer_on_a_copy,
        onset=0,
    ),
    Case(
        "stalled_misaligned_labels",
        "loss_stalled",
        "labels shuffled apart from inputs",
        misaligned_labels,
        onset=0,
    ),
]
