"""Vanishing gradients: a deep sigmoid MLP, and a deep tanh MLP initialised far too small."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def deep_sigmoid(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(20))
    x, y = blobs(2048, 32, 10, seed=seed(20))
    model = mlp([32] + [64] * 12 + [10], nn.Sigmoid)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(20)),
        cross_entropy,
        80,
        wk,
        name="vanishing_deep_sigmoid",
        num_classes=10,
    )


def tiny_init_tanh(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(21))
    x, y = blobs(2048, 32, 10, seed=seed(21))
    model = mlp([32] + [64] * 8 + [10], nn.Tanh)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, 0.01)
                m.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(21)),
        cross_entropy,
        80,
        wk,
        name="vanishing_tiny_init",
        num_classes=10,
    )


CASES = [
    Case(
        "vanishing_deep_sigmoid",
        "vanishing_gradients",
        "12 sigmoid layers, default init",
        deep_sigmoid,
        onset=0,
        layer="0",
    ),
    Case(
        "vanishing_tiny_init_tanh",
        "vanishing_gradients",
        "8 tanh layers with weights ~N(0, 0.01)",
        tiny_init_tanh,
        onset=0,
        layer="0",
    ),
]
