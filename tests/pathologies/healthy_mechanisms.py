"""Healthy runs whose loss or gradients move for a reason, which a rule on the curves' shape took
for a fault: a curriculum that adds harder classes mid-run (the loss jumps, then falls again), a
distillation loss (cross-entropy plus a T^2-scaled KL, which does not start at ln K), a mixture of
experts whose rare experts see a few tokens a step, a deep ReLU net whose zero-initialised head
makes its gradient norm grow 30x as it learns, a GAN's generator watched alone (its loss rises as
the discriminator wins), a float64 regression whose finite loss starts at 1e40, a multi-label
model ending in a sigmoid under BCELoss (one squashing, the loss's own log), and a model returning
(logits, features) whose loss adds a penalty on the features, and data shuffled once and read in
the same order every epoch, with a short last batch. None may raise a warning."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import nnwatch

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


class Curriculum:
    """Classes 0-2 for the first ``switch`` steps, then all ten."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, switch: int, seed_: int) -> None:
        self.easy = Sampler(x[y < 3], y[y < 3], 64, seed=seed_)
        self.all = Sampler(x, y, 64, seed=seed_ + 1)
        self.switch = switch

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.easy(step) if step < self.switch else self.all(step)


def curriculum(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(720))
    x, y = blobs(4096, 32, 10, seed=seed(720), spread=1.5)
    model = mlp([32, 128, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model, opt, Curriculum(x, y, 150, seed(720)), cross_entropy, 320, wk,
        name="healthy_curriculum", num_classes=10,
    )  # fmt: skip


def distillation(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(721))
    x, y = blobs(4096, 32, 10, seed=seed(721), spread=1.5)
    teacher = mlp([32, 256, 10])
    topt = torch.optim.Adam(teacher.parameters(), lr=1e-3)
    sample = Sampler(x, y, 64, seed=seed(721))
    for step in range(200):
        xb, yb = sample(step)
        topt.zero_grad()
        F.cross_entropy(teacher(xb), yb).backward()
        topt.step()
    teacher.eval()
    student = mlp([32, 32, 10])
    t = 4.0

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, yb = batch
        out = m(xb)
        with torch.no_grad():
            soft = F.softmax(teacher(xb) / t, -1)
        kl = F.kl_div(F.log_softmax(out / t, -1), soft, reduction="batchmean")
        return 0.5 * F.cross_entropy(out, yb) + 0.5 * t * t * kl

    opt = torch.optim.Adam(student.parameters(), lr=1e-3)
    return train(
        student, opt, Sampler(x, y, 64, seed=seed(722)), loss_fn, 200, wk,
        name="healthy_distillation", num_classes=10,
    )  # fmt: skip


class Experts(nn.Module):
    """Top-1 routing over eight experts, the gate biased so that the last ones see few tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(32, 8)
        self.experts = nn.ModuleList(mlp([32, 64, 32]) for _ in range(8))
        self.head = nn.Linear(32, 10)
        with torch.no_grad():
            self.gate.bias.copy_(torch.tensor([1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5, -2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x).softmax(-1)
        top = g.argmax(-1)
        out = torch.zeros(x.shape[0], 32)
        for k, expert in enumerate(self.experts):
            idx = (top == k).nonzero().squeeze(1)
            if len(idx):
                out = out.index_add(0, idx, expert(x[idx]) * g[idx, k : k + 1])
        return self.head(out)


def rare_experts(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(723))
    x, y = blobs(4096, 32, 10, seed=seed(723), spread=1.5)
    model = Experts()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(723)), cross_entropy, 250, wk,
        name="healthy_rare_experts", num_classes=10,
    )  # fmt: skip


def deep_relu_zero_head(wk: dict[str, Any]) -> Any:
    """20 He-initialised ReLU layers under a zero head: the norm grows 25-40x as it learns."""
    torch.manual_seed(seed(724))
    x, y = blobs(4096, 32, 10, seed=seed(724), spread=1.5)
    model = mlp([32] + [128] * 20 + [10])
    for m in model:
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    nn.init.zeros_(model[-1].weight)
    opt = torch.optim.Adam(model.parameters(), lr=5e-4)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(724)), cross_entropy, 250, wk,
        name="healthy_deep_relu_zero_head", num_classes=10,
    )  # fmt: skip


def gan_generator_alone(wk: dict[str, Any]) -> Any:
    """Only the generator is watched; a strong discriminator makes its loss climb."""
    torch.manual_seed(seed(725))
    real, _ = blobs(4096, 32, 4, seed=seed(725), spread=0.5)
    gen = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32))
    disc = nn.Sequential(nn.Linear(32, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    og = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(disc.parameters(), lr=3e-3, betas=(0.5, 0.999))
    w = nnwatch.watch(gen, og, name="healthy_gan_generator_alone", **wk)
    sample = Sampler(real, real, 64, seed=seed(725))
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    for step in range(400):
        xb, _ = sample(step)
        z = torch.randn(64, 8)
        fake = gen(z)
        od.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(disc(xb), ones) + F.binary_cross_entropy_with_logits(
            disc(fake.detach()), zeros
        )
        d_loss.backward()
        od.step()
        og.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(disc(fake), ones)
        g_loss.backward()
        og.step()
        w.step(g_loss, batch=(z,))
    w.close()
    return w


def float64_huge_loss(wk: dict[str, Any]) -> Any:
    """A float64 regression on targets of 1e20: a finite loss of 1e40 that falls."""
    torch.manual_seed(seed(726))
    g = torch.Generator().manual_seed(seed(726))
    x = torch.randn(2048, 16, generator=g, dtype=torch.float64)
    y = (x @ torch.randn(16, generator=g, dtype=torch.float64)) * 1e20
    model = nn.Linear(16, 1).double()
    with torch.no_grad():
        model.weight.mul_(1e20)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, yb = batch
        return F.mse_loss(m(xb).squeeze(-1), yb)

    return train(
        model, opt, Sampler(x, y, 64, seed=seed(726)), loss_fn, 200, wk,
        name="healthy_float64_huge_loss",
    )  # fmt: skip


def sigmoid_bce(wk: dict[str, Any]) -> Any:
    """Ten one-vs-rest outputs through nn.Sigmoid under nn.BCELoss: squashed once, as it should."""
    torch.manual_seed(seed(727))
    x, y = blobs(2048, 32, 10, seed=seed(727))
    t = F.one_hot(y, 10).float()
    model = nn.Sequential(mlp([32, 64, 10]), nn.Sigmoid())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, tb = batch
        return F.binary_cross_entropy(m(xb), tb)

    return train(
        model, opt, Sampler(x, t, 64, seed=seed(727)), loss_fn, 200, wk,
        name="healthy_sigmoid_bce",
    )  # fmt: skip


class WithFeatures(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp([32, 64, 32])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.head(torch.relu(h)), h


def logits_and_features(wk: dict[str, Any]) -> Any:
    """A model returning (logits, features); the loss is CE on the logits plus a feature penalty."""
    torch.manual_seed(seed(728))
    x, y = blobs(2048, 32, 10, seed=seed(728))
    model = WithFeatures()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
        xb, yb = batch
        logits, h = m(xb)
        return F.cross_entropy(logits, yb) + 1e-3 * h.pow(2).mean()

    return train(
        model, opt, Sampler(x, y, 64, seed=seed(728)), loss_fn, 200, wk,
        name="healthy_logits_and_features", num_classes=10,
    )  # fmt: skip


class FixedOrder:
    """Shuffled once, then read in that order every epoch; the last batch of each is short."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed_: int) -> None:
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed_))
        self.x, self.y, self.bs = x[order], y[order], batch_size
        self.per_epoch = -(-len(y) // batch_size)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = step % self.per_epoch
        return self.x[k * self.bs : (k + 1) * self.bs], self.y[k * self.bs : (k + 1) * self.bs]


def fixed_order(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(729))
    x, y = blobs(1000, 32, 10, seed=seed(729), spread=2.0)
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(
        model, opt, FixedOrder(x, y, 64, seed(729)), cross_entropy, 400, wk,
        name="healthy_fixed_order", num_classes=10,
    )  # fmt: skip


CASES = [
    Case("healthy_curriculum", None, "harder classes added at step 150", curriculum),
    Case("healthy_distillation", None, "0.5 CE + 0.5 T^2 KL from a teacher", distillation),
    Case("healthy_rare_experts", None, "top-1 mixture of experts, rare experts", rare_experts),
    Case("healthy_deep_relu_zero_head", None, "grad norm grows 30x as it learns", deep_relu_zero_head),
    Case("healthy_gan_generator_alone", None, "a generator watched alone", gan_generator_alone),
    Case("healthy_float64_huge_loss", None, "a float64 loss of 1e40 that falls", float64_huge_loss),
    Case("healthy_sigmoid_bce", None, "nn.Sigmoid under nn.BCELoss", sigmoid_bce),
    Case("healthy_logits_and_features", None, "(logits, features), a feature penalty", logits_and_features),
    Case("healthy_fixed_order", None, "one order every epoch, a short last batch", fixed_order),
]
