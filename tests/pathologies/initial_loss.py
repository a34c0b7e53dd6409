"""Bad initial loss: oversized logits, unnormalized inputs, one class biased, a summed loss."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def large_logits(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(60))
    x, y = blobs(2048, 32, 10, seed=seed(60))
    model = mlp([32, 128, 10])
    with torch.no_grad():
        model[-1].weight.mul_(30.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(60)),
        cross_entropy,
        30,
        wk,
        name="init_large_logits",
        num_classes=10,
    )


def raw_pixels(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(61))
    g = torch.Generator().manual_seed(seed(61))
    y = torch.randint(0, 10, (2048,), generator=g)
    protos = torch.randint(0, 256, (10, 64), generator=g).float()
    x = (protos[y] + 30 * torch.randn(2048, 64, generator=g)).clamp(0, 255)  # raw 0..255 pixels
    model = mlp([64, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(61)),
        cross_entropy,
        30,
        wk,
        name="init_raw_pixels",
        num_classes=10,
    )


def summed_loss(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(62))
    x, y = blobs(2048, 32, 10, seed=seed(62))
    model = mlp([32, 128, 10])

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0]), b[1], reduction="sum")

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(62)),
        loss_fn,
        30,
        wk,
        name="init_summed_loss",
        num_classes=10,
    )


def biased_class(wk: dict[str, Any]) -> Any:
    """100 classes; the output bias of class 0 starts at 15, so every sample predicts class 0."""
    torch.manual_seed(seed(63))
    x, y = blobs(2048, 32, 100, seed=seed(63))
    model = mlp([32, 128, 100])
    with torch.no_grad():
        model[-1].bias[0] = 15.0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(63)),
        cross_entropy,
        30,
        wk,
        name="init_biased_class",
        num_classes=100,
    )


CASES = [
    Case(
        "bad_init_large_logits",
        "bad_initial_loss",
        "last layer weights x30",
        large_logits,
        onset=0,
        layer="2",
    ),
    Case(
        "bad_init_raw_pixels",
        "bad_initial_loss",
        "inputs are raw 0..255 pixel values",
        raw_pixels,
        onset=0,
        layer="2",
    ),
    Case(
        "bad_init_biased_class",
        "bad_initial_loss",
        "100 classes, one output bias at 15",
        biased_class,
        onset=0,
    ),
    Case(
        "bad_init_summed_loss",
        "bad_initial_loss",
        "cross-entropy with reduction='sum'",
        summed_loss,
        onset=0,
    ),
]
