"""Bugs that live in the update, not in the loss curve's shape: each stalls or derails a run in a
way only the recorded updates explain.

Updates that round away in bfloat16 weights, a weight decay that pins the weights, a regression
target broadcast against a (B, 1) prediction, an LR so high that a clipped regression stays stuck
high, a layer that rebuilds its weight from ``.data`` (the optimizer's parameters never get a
gradient), data in label order, a KL term with its sign flipped (a loss with no floor), a loss
taken from a detached output (``requires_grad = True`` set on it to silence backward),
cross-entropy over a model that already ends in a softmax, and three sources of data
concatenated and read block by block (the loss jumps at every boundary).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import nnwatch

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def bf16_rounding(wk: dict[str, Any]) -> Any:
    """Weights in bfloat16 and a small LR: every update is below half a bfloat16 ulp."""
    torch.manual_seed(seed(700))
    x, y = blobs(2048, 32, 10, seed=seed(700))
    model = mlp([32, 64, 10]).to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    return train(
        model, opt, Sampler(x.bfloat16(), y, 64, seed=seed(700)), cross_entropy, 80, wk,
        name="mech_bf16_rounding", num_classes=10,
    )  # fmt: skip


def decay_pinned(wk: dict[str, Any]) -> Any:
    """weight_decay=5 (meant as 5e-4): every step multiplies the weights by 0.75."""
    torch.manual_seed(seed(701))
    x, y = blobs(2048, 32, 10, seed=seed(701))
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=5.0)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(701)), cross_entropy, 120, wk,
        name="mech_decay_pinned", num_classes=10,
    )  # fmt: skip


def _regression(n: int, seed_: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed_)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, generator=g) * 1.5
    return x, x @ w + 0.5 * torch.randn(n, generator=g)


def target_broadcast(wk: dict[str, Any]) -> Any:
    """A (B, 1) prediction against a (B,) target: the loss is over (B, B), only the mean is learnable."""
    torch.manual_seed(seed(702))
    x, y = _regression(4096, seed(702))
    model = mlp([20, 64, 1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, yb = batch
        return ((m(xb) - yb) ** 2).mean()  # BUG: (B, 1) - (B,) broadcasts

    return train(
        model, opt, Sampler(x, y, 64, seed=seed(702)), loss_fn, 150, wk,
        name="mech_target_broadcast",
    )  # fmt: skip


def lr_far_too_high(wk: dict[str, Any]) -> Any:
    """A clipped regression at 10x its working LR (1000x the default's): stuck high, not diverging."""
    torch.manual_seed(seed(703))
    x, y = _regression(4096, seed(703))
    model = mlp([20, 64, 1])
    opt = torch.optim.SGD(model.parameters(), lr=3.0)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, yb = batch
        return F.mse_loss(m(xb).squeeze(-1), yb)

    return train(
        model, opt, Sampler(x, y, 64, seed=seed(703)), loss_fn, 200, wk,
        name="mech_lr_far_too_high", clip=1.0,
    )  # fmt: skip


class DataLinear(nn.Module):
    """A masked linear layer that rebuilds its weight from ``.data`` on every forward."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * n_in**-0.5)
        self.bias = nn.Parameter(torch.zeros(n_out))
        self.register_buffer("mask", (torch.rand(n_out, n_in) > 0.2).float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.data * self.mask, self.bias.data)  # BUG: .data cuts the graph


def data_rebuild(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(704))
    x, y = blobs(2048, 32, 10, seed=seed(704))
    model = nn.Sequential(DataLinear(32, 128), nn.ReLU(), DataLinear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(704)), cross_entropy, 120, wk,
        name="mech_data_rebuild", num_classes=10,
    )  # fmt: skip


class InOrder:
    """Batches that walk a data set sorted by label, never shuffled."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> None:
        order = torch.argsort(y, stable=True)
        self.x, self.y, self.bs = x[order], y[order], batch_size
        self.per_epoch = len(y) // batch_size

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = step % self.per_epoch
        return self.x[k * self.bs : (k + 1) * self.bs], self.y[k * self.bs : (k + 1) * self.bs]


def sorted_labels(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(705))
    x, y = blobs(2048, 32, 10, seed=seed(705), spread=1.5)
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return train(
        model, opt, InOrder(x, y, 64), cross_entropy, 160, wk,
        name="mech_sorted_labels", num_classes=10,
    )  # fmt: skip


class Vae(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = mlp([32, 64, 16])
        self.dec = mlp([8, 64, 32])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = self.enc(x)
        mu, logvar = h[:, :8], h[:, 8:]
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        return self.dec(z), mu, logvar


def kl_sign_flipped(wk: dict[str, Any]) -> Any:
    """A VAE whose KL term is subtracted: the loss falls without bound below zero."""
    torch.manual_seed(seed(706))
    x, _ = blobs(2048, 32, 10, seed=seed(706))
    model = Vae()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    w = nnwatch.watch(model, opt, name="mech_kl_sign", **wk)
    sample = Sampler(x, x, 64, seed=seed(706))
    for step in range(200):
        xb, _ = sample(step)
        opt.zero_grad(set_to_none=True)
        rec, mu, logvar = model(xb)
        kl = -0.5 * (1 + logvar - mu**2 - logvar.exp()).sum(1).mean()
        loss = F.mse_loss(rec, xb, reduction="sum") / len(xb) - kl  # BUG: the KL is subtracted
        loss.backward()
        opt.step()
        w.step(loss, batch=(xb,))
    w.close()
    return w


def detached_loss(wk: dict[str, Any]) -> Any:
    """Cross-entropy of ``out.data`` plus a weight penalty (added so that backward runs): only the
    penalty's gradient reaches the weights."""
    torch.manual_seed(seed(707))
    x, y = blobs(2048, 32, 10, seed=seed(707))
    model = mlp([32, 64, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, yb = batch
        penalty = 1e-4 * sum(p.pow(2).sum() for p in m.parameters())
        return F.cross_entropy(m(xb).data, yb) + penalty  # BUG: .data cuts the graph

    return train(
        model, opt, Sampler(x, y, 64, seed=seed(707)), loss_fn, 80, wk,
        name="mech_detached_loss", num_classes=10,
    )  # fmt: skip


def double_softmax(wk: dict[str, Any]) -> Any:
    """A model ending in nn.Softmax under cross-entropy: it falls, then stops far from zero."""
    torch.manual_seed(seed(708))
    x, y = blobs(2048, 32, 10, seed=seed(708))
    model = nn.Sequential(mlp([32, 64, 10]), nn.Softmax(dim=-1))  # BUG: CE applies its own
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(708)), cross_entropy, 300, wk,
        name="mech_double_softmax", num_classes=10,
    )  # fmt: skip


class Blocks:
    """Three sources (as recorded, inverted, features reversed) concatenated and read in order,
    each epoch the same: ``per_block`` batches of one source, then the next."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, per_block: int) -> None:
        n = per_block * batch_size
        x, y = x[:n], y[:n]
        self.x = torch.cat([x, -x, x.flip(1)])
        self.y = torch.cat([y, y, y])
        self.bs, self.batches = batch_size, 3 * per_block

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = step % self.batches
        return self.x[k * self.bs : (k + 1) * self.bs], self.y[k * self.bs : (k + 1) * self.bs]


def data_blocks(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(709))
    x, y = blobs(2048, 32, 10, seed=seed(709), spread=1.5)
    model = mlp([32, 128, 10])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(
        model, opt, Blocks(x, y, 64, 32), cross_entropy, 400, wk,
        name="mech_data_blocks", num_classes=10,
    )  # fmt: skip


CASES = [
    Case("mech_bf16_rounding", "loss_stalled", "bfloat16 weights, LR 1e-4: updates round away", bf16_rounding),
    Case("mech_decay_pinned", "loss_stalled", "weight_decay=5 pins the weights near zero", decay_pinned),
    Case("mech_target_broadcast", "loss_stalled", "(B, 1) prediction minus (B,) target", target_broadcast),
    Case("mech_lr_far_too_high", "loss_stalled", "a clipped regression at LR 3: stuck high", lr_far_too_high),
    Case(
        "mech_data_rebuild", "zero_gradient_layer", "a layer rebuilds its weight from .data",
        data_rebuild, layer="0",
    ),  # fmt: skip
    Case("mech_sorted_labels", "oscillating_loss", "data sorted by label, never shuffled", sorted_labels),
    Case("mech_kl_sign", "loss_diverging", "a VAE whose KL term is subtracted", kl_sign_flipped),
    Case("mech_detached_loss", "loss_stalled", "CE of out.data plus a weight penalty", detached_loss),
    Case("mech_double_softmax", "loss_stalled", "nn.Softmax under cross-entropy", double_softmax),
    Case("mech_data_blocks", "loss_spike", "three sources read block by block", data_blocks, onset=32),
]
