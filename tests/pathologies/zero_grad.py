"""A layer that learns nothing: a Linear behind a functional relu with every unit off, and a
branch whose output is detached before it joins the rest."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, seed, train
from .dead import functional_relu


class DetachedBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Linear(32, 64)
        self.side = nn.Linear(32, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.main(x)) + self.side(x).detach()  # a .detach() left from logging
        return self.head(h)


def detached_branch(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(120))
    x, y = blobs(2048, 32, 10, seed=seed(120))
    model = DetachedBranch()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(120)),
        cross_entropy,
        80,
        {**wk, "budget": None},  # every step measured: the branch is absent on each
        name="zero_grad_detached",
        num_classes=10,
    )


CASES = [
    Case(
        "zero_grad_functional_relu",
        "zero_gradient_layer",
        "torch.relu in forward (unhookable), bias at -20",
        functional_relu,
        onset=0,
        layer="fc1",
    ),
    Case(
        "zero_grad_detached_branch",
        "zero_gradient_layer",
        "a branch detached before the sum",
        detached_branch,
        onset=0,
        layer="side",
    ),
]
