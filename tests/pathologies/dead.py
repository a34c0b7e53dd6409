"""Dead ReLUs: a negative bias init, one batch of wild targets mid-run, and a functional ReLU nnwatch cannot hook."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train

SPIKE = 50


def negative_bias(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(30))
    x, y = blobs(2048, 32, 10, seed=seed(30))
    model = mlp([32, 128, 128, 10])
    with torch.no_grad():
        model[2].bias.fill_(-20.0)  # every unit of the second hidden layer starts (and stays) off
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(30)),
        cross_entropy,
        80,
        wk,
        name="dead_negative_bias",
        num_classes=10,
    )


def outlier_targets(wk: dict[str, Any]) -> Any:
    """ReLU regression with SGD; at step 50 one batch arrives with targets off by -100 (a unit bug).

    The huge error drives every bias down in one update and the units of both layers never fire again.
    """
    torch.manual_seed(seed(31))
    g = torch.Generator().manual_seed(seed(31))
    x = torch.randn(2048, 16, generator=g)
    y = x[:, :4].sum(1, keepdim=True).relu() + 0.1 * torch.randn(2048, 1, generator=g)
    sample = Sampler(x, y, 64, seed=seed(31))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by = sample(step)
        return bx, (by - 100.0 if step == SPIKE else by)

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1])

    model = mlp([16, 64, 64, 1])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return train(model, opt, next_batch, loss_fn, 110, wk, name="dead_outlier_targets")


def adam_lr_jump(wk: dict[str, Any]) -> Any:
    """Adam's LR jumps from 1e-3 to 0.5 at step 50 on a ReLU regression: the units die."""
    torch.manual_seed(seed(33))
    g = torch.Generator().manual_seed(seed(33))
    x = 3 * torch.randn(2048, 16, generator=g)
    y = torch.sin(x[:, :3]).sum(1, keepdim=True)

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1])

    model = mlp([16, 64, 64, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def jump(step: int, m: nn.Module, o: torch.optim.Optimizer) -> None:
        if step == SPIKE:
            for group in o.param_groups:
                group["lr"] = 0.5

    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(33)),
        loss_fn,
        100,
        wk,
        name="dead_adam_lr_jump",
        before_step=jump,
    )


class FunctionalReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 128)
        self.fc2 = nn.Linear(128, 10)
        with torch.no_grad():
            self.fc1.bias.fill_(-20.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))  # a function, not a module: no hook sees it


def functional_relu(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(32))
    x, y = blobs(2048, 32, 10, seed=seed(32))
    model = FunctionalReluNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(32)),
        cross_entropy,
        60,
        wk,
        name="dead_functional_relu",
        num_classes=10,
    )


CASES = [
    Case(
        "dead_relu_negative_bias",
        "dead_relu",
        "hidden bias initialised at -20",
        negative_bias,
        onset=0,
        layer="3",
    ),
    Case(
        "dead_relu_outlier_targets",
        "dead_relu",
        "regression: one batch of targets off by -100 at step 50",
        outlier_targets,
        onset=SPIKE,
    ),
    Case(
        "dead_relu_adam_lr_jump",
        "dead_relu",
        "Adam LR 1e-3 -> 0.5 at step 50",
        adam_lr_jump,
        onset=SPIKE,
    ),
]
