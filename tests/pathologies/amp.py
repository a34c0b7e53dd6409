"""AMP scale collapse: fp16 gradients that overflow at every scale (CPU autocast + GradScaler)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, mlp, seed, train

ONSET = 40


def loss_weight(wk: dict[str, Any]) -> Any:
    """An auxiliary loss with weight 1e6 is switched on at step 40: fp16 gradients overflow even unscaled."""
    torch.manual_seed(seed(70))
    x, y = blobs(2048, 32, 10, seed=seed(70))
    model = mlp([32, 128, 128, 10])
    state = {"step": 0}

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        logits = m(b[0])
        ce = nn.functional.cross_entropy(logits.float(), b[1])
        if state["step"] >= ONSET:
            ce = ce + 1e6 * logits.float().pow(2).mean()
        state["step"] += 1
        return ce

    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", growth_interval=20)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(70)),
        loss_fn,
        90,
        wk,
        name="amp_loss_weight",
        num_classes=10,
        scaler=scaler,
        autocast_dtype=torch.float16,
    )


def input_scale(wk: dict[str, Any]) -> Any:
    """From step 40 the data arrive un-normalized (x 1e3): fp16 activations overflow in the forward."""
    torch.manual_seed(seed(71))
    x, y = blobs(2048, 32, 10, seed=seed(71))
    sample = Sampler(x, y, 64, seed=seed(71))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        bx, by = sample(step)
        return (bx * 1e4 if step >= ONSET else bx), by

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0]).float(), b[1])

    model = mlp([32, 128, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", growth_interval=20)
    return train(
        model,
        opt,
        next_batch,
        loss_fn,
        90,
        wk,
        name="amp_input_scale",
        num_classes=10,
        scaler=scaler,
        autocast_dtype=torch.float16,
    )


CASES = [
    Case(
        "amp_loss_weight",
        "amp_scale_collapse",
        "fp16: a x1e6 loss term from step 40",
        loss_weight,
        onset=ONSET,
    ),
    Case(
        "amp_input_scale",
        "amp_scale_collapse",
        "fp16: inputs x1e4 from step 40 overflow the forward",
        input_scale,
        onset=ONSET,
    ),
]
