"""Loss diverging: an LSTM at an absurd LR (the loss leaps 100x and stays up), the same LSTM with
SGD running away to NaN, an MLP whose LR is raised 100x at step 30 after it had learned, and Adam
whose LR is raised 100x mid-run on a noisy problem (the loss leaps 2-3x, above chance, and swings
up there: it swings, but its level rose, so it is diverging, not oscillating)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, lr_at, mlp, mse, seed, train

JUMP = 30


class LSTMRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 32, batch_first=True)
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _sequences(s: int):
    g = torch.Generator().manual_seed(s)

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(32, 16, 4, generator=g)
        return x, 0.75 * x[:, :, 0].sum(1, keepdim=True)

    return next_batch


def lstm_absurd_lr(wk: dict[str, Any]) -> Any:
    """Adam at lr=10: the loss leaps from ~7 to hundreds within a few steps and stays there."""
    torch.manual_seed(seed(90))
    model = LSTMRegressor()
    opt = torch.optim.Adam(model.parameters(), lr=10.0)
    return train(model, opt, _sequences(seed(90)), mse, 100, wk, name="diverging_lstm_adam")


def lstm_sgd_runaway(wk: dict[str, Any]) -> Any:
    """SGD at lr=20 on the same LSTM: the loss multiplies every step until it overflows to NaN."""
    torch.manual_seed(seed(91))
    model = LSTMRegressor()
    opt = torch.optim.SGD(model.parameters(), lr=20.0)
    return train(model, opt, _sequences(seed(91)), mse, 40, wk, name="diverging_lstm_sgd")


def lr_raised_after_learning(wk: dict[str, Any]) -> Any:
    """A classifier learns for 30 steps, then its LR goes from 0.05 to 5 and the loss runs away."""
    torch.manual_seed(seed(92))
    x, y = blobs(4096, 32, 10, seed=seed(92))
    model = mlp([32, 64, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(92)),
        cross_entropy,
        80,
        wk,
        name="diverging_lr_raised",
        num_classes=10,
        before_step=lr_at(JUMP, 5.0),
    )


ADAM_JUMP = 60


def adam_lr_raise(wk: dict[str, Any]) -> Any:
    """Overlapping classes with label noise; Adam's LR goes from 1e-3 to 0.1 at step 60."""
    torch.manual_seed(seed(80))
    x, y = blobs(4096, 32, 10, seed=seed(80), spread=3.0, label_noise=0.2)
    model = mlp([32, 64, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 128, seed=seed(80)),
        cross_entropy,
        150,
        wk,
        name="diverging_adam_lr",
        num_classes=10,
        before_step=lr_at(ADAM_JUMP, 0.1),
    )


CASES = [
    Case("diverging_lstm_absurd_lr", "loss_diverging", "LSTM, Adam lr=10", lstm_absurd_lr, onset=0),
    Case(
        "diverging_lstm_sgd_runaway",
        "loss_diverging",
        "LSTM, SGD lr=20, to NaN",
        lstm_sgd_runaway,
        onset=0,
    ),
    Case(
        "diverging_lr_raised_after_learning",
        "loss_diverging",
        "MLP learns, then LR x100 at step 30",
        lr_raised_after_learning,
        onset=JUMP,
    ),
    Case(
        "diverging_adam_lr_raise",
        "loss_diverging",
        "Adam, LR 1e-3 -> 0.1 at step 60: the loss leaps above chance",
        adam_lr_raise,
        onset=ADAM_JUMP,
    ),
]
