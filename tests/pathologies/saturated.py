"""Saturated activations: a tanh net fed raw, unnormalized inputs (pixel-like values 0..255), and a
sigmoid net whose weights were initialized 10x too large. Both are saturated from the first step."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def tanh_raw_inputs(wk: dict[str, Any]) -> Any:
    """Blobs shifted and scaled to 0..255 like raw pixels, straight into Linear -> Tanh."""
    torch.manual_seed(seed(300))
    x, y = blobs(2048, 32, 10, seed=seed(300))
    x = (x - x.min()) / (x.max() - x.min()) * 255.0  # the missing "/ 255 and standardize"
    model = mlp([32, 64, 10], nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(300)),
        cross_entropy,
        100,
        wk,
        name="saturated_tanh_raw_inputs",
        num_classes=10,
    )


def sigmoid_large_init(wk: dict[str, Any]) -> Any:
    """A sigmoid MLP on 1024 features whose Linear weights were drawn with std 1 instead of about
    1/sqrt(fan_in) (``nn.init.normal_(w)``): first pre-activations with std ~32."""
    torch.manual_seed(seed(301))
    x, y = blobs(2048, 1024, 10, seed=seed(301))
    x = (x - x.mean(0)) / x.std(0)
    model = mlp([1024, 256, 256, 10], nn.Sigmoid)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.normal_(0.0, 1.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(301)),
        cross_entropy,
        100,
        wk,
        name="saturated_sigmoid_large_init",
        num_classes=10,
    )


CASES = [
    Case(
        "saturated_tanh_raw_inputs",
        "saturated_activation",
        "tanh MLP on raw 0..255 inputs",
        tanh_raw_inputs,
        onset=0,
        layer="1",
    ),
    Case(
        "saturated_sigmoid_large_init",
        "saturated_activation",
        "sigmoid MLP on 1024 features, weights N(0, 1)",
        sigmoid_large_init,
        onset=0,
        layer="1",
    ),
]
