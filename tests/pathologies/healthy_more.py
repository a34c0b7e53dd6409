"""More healthy runs, of the kinds that fool loss rules: a slow steady learner, a plateau before
the drop, cosine restarts that bump a converged loss, a VAE, a small GAN (the generator's loss
rises as the discriminator learns), label smoothing (a loss floor far above zero) and SGD with
Nesterov and weight decay. None may raise a warning."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def slow_learner(wk: dict[str, Any]) -> Any:
    """Plain SGD at a small LR: the loss falls slowly, a few percent per 40 steps."""
    torch.manual_seed(seed(200))
    x, y = blobs(2048, 32, 10, seed=seed(200), spread=2.0)
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.003)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(200)),
        cross_entropy,
        250,
        wk,
        name="healthy_slow",
        num_classes=10,
    )


def plateau_then_drop(wk: dict[str, Any]) -> Any:
    """XOR of two inputs through a small-init tanh net: it sits at ln 2 on a saddle for 50-70 steps
    (the weights grow from 0.2x their default scale), then drops."""
    torch.manual_seed(seed(201))
    g = torch.Generator().manual_seed(seed(201))
    x = torch.randn(2048, 2, generator=g)
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).long()
    model = mlp([2, 16, 2], nn.Tanh)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.mul_(0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(201)),
        cross_entropy,
        300,
        wk,
        name="healthy_plateau_drop",
        num_classes=2,
    )


def cosine_restarts(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(202))
    x, y = blobs(2048, 16, 5, seed=seed(202), spread=0.8)
    model = mlp([16, 64, 5])
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=60)
    return train(
        model,
        opt,
        Sampler(x, y, 32, seed=seed(202)),
        cross_entropy,
        240,
        wk,
        name="healthy_cosine_restarts",
        num_classes=5,
        scheduler=sched,
    )


class VAE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 8))
        self.dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu, logvar = self.enc(x).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        rec = nn.functional.mse_loss(self.dec(z), x, reduction="sum") / x.shape[0]
        kl = -0.5 * (1 + logvar - mu.square() - logvar.exp()).sum(1).mean()
        return rec + kl


def vae(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(203))
    g = torch.Generator().manual_seed(seed(203))
    x = torch.randn(2048, 4, generator=g) @ torch.randn(4, 16, generator=g)
    model = VAE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, x, 64, seed=seed(203)),
        lambda m, b: m(b[0]),
        250,
        wk,
        name="healthy_vae",
    )


def gan(wk: dict[str, Any]) -> Any:
    """A GAN on a 2-D Gaussian; the watched model is the pair, the logged loss D's + G's."""
    import nnwatch

    torch.manual_seed(seed(204))
    g = torch.Generator().manual_seed(seed(204))
    G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    D = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    pair = nn.ModuleDict({"G": G, "D": D})
    opt_g = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.999))
    bce = nn.functional.binary_cross_entropy_with_logits
    w = nnwatch.watch(pair, opt_g, name="healthy_gan", **wk)
    for _ in range(250):
        real = torch.randn(64, 2, generator=g) * 0.5 + torch.tensor([2.0, -1.0])
        fake = G(torch.randn(64, 4, generator=g))
        opt_d.zero_grad()
        err_d = bce(D(real), torch.ones(64, 1)) + bce(D(fake.detach()), torch.zeros(64, 1))
        err_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        err_g = bce(D(fake), torch.ones(64, 1))
        err_g.backward()
        opt_g.step()
        w.step(err_d.detach() + err_g.detach())
    w.close()
    return w


def label_smoothing(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(205))
    x, y = blobs(2048, 32, 10, seed=seed(205), spread=0.5)
    model = mlp([32, 64, 10])

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0]), b[1], label_smoothing=0.2)

    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(205)),
        loss_fn,
        250,
        wk,
        name="healthy_label_smoothing",
        num_classes=10,
    )


def nesterov_weight_decay(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(206))
    x, y = blobs(2048, 32, 10, seed=seed(206), spread=1.5)
    model = mlp([32, 128, 64, 10])
    opt = torch.optim.SGD(
        model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4
    )
    return train(
        model,
        opt,
        Sampler(x, y, 32, seed=seed(206)),
        cross_entropy,
        200,
        wk,
        name="healthy_nesterov",
        num_classes=10,
    )


CASES = [
    Case(
        "healthy_plateau_then_drop",
        None,
        "small-init tanh net on XOR: sits at ln 2 on a saddle, then drops",
        plateau_then_drop,
    ),
    Case("healthy_slow_steady_learner", None, "SGD lr=0.003: slow but steady", slow_learner),
    Case("healthy_cosine_restarts", None, "cosine LR with warm restarts", cosine_restarts),
    Case("healthy_vae", None, "VAE, reconstruction + KL", vae),
    Case("healthy_gan", None, "2-D GAN, logged D + G loss", gan),
    Case("healthy_label_smoothing", None, "label smoothing 0.2: loss floor ~0.9", label_smoothing),
    Case("healthy_nesterov_wd", None, "SGD Nesterov + weight decay", nesterov_weight_decay),
]
