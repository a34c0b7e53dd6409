"""Healthy runs of different kinds: none of them may raise a finding.

They cover what fools naive rules: a noisy small-batch loss, a large but stable gradient norm
(sum-reduced regression on big targets), BatchNorm CNNs, a transformer whose LR warms up from 0
with clipping, fp16 AMP whose GradScaler calibrates by skipping its first steps, a run that converges
early and then sits on a plateau for hundreds of steps, a deep sparse ReLU net with dropout, an LSTM,
OneCycle LR, multi-label BCE, gradient accumulation and a pre-norm residual net.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train


def mlp_adam(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(0))
    x, y = blobs(2048, 32, 10, seed=seed(0))
    model = mlp([32, 128, 128, 10])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64),
        cross_entropy,
        250,
        wk,
        name="healthy_mlp_adam",
        num_classes=10,
    )


def noisy_small_batch(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(1))
    x, y = blobs(4096, 20, 10, seed=seed(1), spread=2.5, label_noise=0.3)
    model = mlp([20, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    return train(
        model,
        opt,
        Sampler(x, y, 4, seed=seed(1)),
        cross_entropy,
        400,
        wk,
        name="healthy_noisy",
        num_classes=10,
    )


def large_stable_grad_norm(wk: dict[str, Any]) -> Any:
    """Regression on targets in the hundreds with a summed loss: grad norm ~1e4 and stable."""
    torch.manual_seed(seed(2))
    g = torch.Generator().manual_seed(seed(2))
    x = torch.randn(4096, 16, generator=g)
    w_true = torch.randn(16, 1, generator=g) * 100.0
    y = x @ w_true + 20.0 * torch.randn(4096, 1, generator=g)  # irreducible noise keeps grads large
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.mse_loss(m(b[0]), b[1], reduction="sum")

    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    return train(
        model, opt, Sampler(x, y, 256, seed=seed(2)), loss_fn, 300, wk, name="healthy_large_grad"
    )


class SmallCNN(nn.Module):
    def __init__(self, k: int = 4) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def shapes(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """8x8 images of four simple patterns plus noise, standardized."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    img = torch.zeros(n, 1, 8, 8)
    img[y == 0, :, 2:6, 2:6] = 1.0  # square
    img[y == 1, :, :, 3:5] = 1.0  # vertical bar
    img[y == 2, :, 3:5, :] = 1.0  # horizontal bar
    eye = torch.eye(8).bool()
    img[(y == 3).nonzero().flatten()[:, None], 0, eye.nonzero()[:, 0], eye.nonzero()[:, 1]] = 1.0
    img = img + 0.5 * torch.randn(img.shape, generator=g)
    return (img - img.mean()) / img.std(), y


def cnn_batchnorm(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(3))
    x, y = shapes(2048, 3)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(
        model,
        opt,
        Sampler(x, y, 32, seed=seed(3)),
        cross_entropy,
        200,
        wk,
        name="healthy_cnn",
        num_classes=4,
    )


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 16, d: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, 12, d))
        layer = nn.TransformerEncoderLayer(d, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        return self.head(self.norm(self.encoder(h)))


def transformer_warmup(wk: dict[str, Any]) -> Any:
    """Predict each token's successor (mod vocab): AdamW, LR warming up from exactly 0, clipping."""
    torch.manual_seed(seed(4))
    vocab = 16
    g = torch.Generator().manual_seed(seed(4))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tok = torch.randint(0, vocab, (16, 12), generator=g)
        return tok, (tok + 1) % vocab

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0]).reshape(-1, vocab), b[1].reshape(-1))

    model = TinyLM(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm = 30
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(s / warm, 0.5 * (1 + math.cos(math.pi * min(s, 300) / 300)))
    )
    return train(
        model,
        opt,
        next_batch,
        loss_fn,
        160,
        wk,
        name="healthy_transformer",
        num_classes=vocab,
        clip=1.0,
        scheduler=sched,
    )


def amp_fp16(wk: dict[str, Any]) -> Any:
    """fp16 autocast with a GradScaler: it skips its first steps while it finds its scale."""
    torch.manual_seed(seed(5))
    x, y = blobs(2048, 32, 10, seed=seed(5))
    model = mlp([32, 128, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=50)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(5)),
        cross_entropy,
        200,
        wk,
        name="healthy_amp",
        num_classes=10,
        scaler=scaler,
        autocast_dtype=torch.float16,
    )


def converged_plateau(wk: dict[str, Any]) -> Any:
    """An easy problem solved in ~50 steps, then 350 steps on the plateau with step LR decay."""
    torch.manual_seed(seed(6))
    x, y = blobs(1024, 8, 3, seed=seed(6), spread=0.3)
    model = mlp([8, 32, 3])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=150, gamma=0.1)
    return train(
        model,
        opt,
        Sampler(x, y, 32, seed=seed(6)),
        cross_entropy,
        400,
        wk,
        name="healthy_plateau",
        num_classes=3,
        scheduler=sched,
    )


def deep_dropout_relu(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(7))
    x, y = blobs(4096, 64, 10, seed=seed(7), spread=1.5)
    layers: list[nn.Module] = []
    d = 64
    for _ in range(6):
        layers += [nn.Linear(d, 128), nn.ReLU(), nn.Dropout(0.3)]
        d = 128
    layers.append(nn.Linear(d, 10))
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(7)),
        cross_entropy,
        200,
        wk,
        name="healthy_deep_dropout",
        num_classes=10,
    )


class SeqClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def lstm_clipped(wk: dict[str, Any]) -> Any:
    """Does the sequence's first channel sum to more than 0? LSTM, RMSprop, clipping at 1."""
    torch.manual_seed(seed(8))
    g = torch.Generator().manual_seed(seed(8))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(32, 20, 4, generator=g)
        return x, (x[:, :, 0].sum(1) > 0).long()

    model = SeqClassifier()
    opt = torch.optim.RMSprop(model.parameters(), lr=3e-3)
    return train(
        model, opt, next_batch, cross_entropy, 200, wk, name="healthy_lstm", num_classes=2, clip=1.0
    )


def one_cycle(wk: dict[str, Any]) -> Any:
    """OneCycleLR: the LR climbs 30x, then anneals; the gradient norm and loss noise move with it."""
    torch.manual_seed(seed(9))
    x, y = blobs(2048, 32, 10, seed=seed(9))
    model = mlp([32, 128, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=250)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(9)),
        cross_entropy,
        250,
        wk,
        name="healthy_onecycle",
        num_classes=10,
        scheduler=sched,
    )


def multilabel_bce(wk: dict[str, Any]) -> Any:
    """20 independent labels with BCE: the first loss is ln 2, not ln 20, and that is right."""
    torch.manual_seed(seed(12))
    g = torch.Generator().manual_seed(seed(12))
    x = torch.randn(2048, 16, generator=g)
    y = (x @ torch.randn(16, 20, generator=g) > 1).float()
    model = mlp([16, 64, 20])

    def loss_fn(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.binary_cross_entropy_with_logits(m(b[0]), b[1])

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(12)),
        loss_fn,
        200,
        wk,
        name="healthy_multilabel",
        num_classes=20,
    )


def grad_accumulation(wk: dict[str, Any]) -> Any:
    """Four micro-batches per optimizer step; w.step() once per optimizer step."""
    import nnwatch

    torch.manual_seed(seed(13))
    x, y = blobs(2048, 32, 10, seed=seed(13))
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = nnwatch.watch(model, opt, num_classes=10, name="healthy_accumulation", **wk)
    sample = Sampler(x, y, 16, seed=seed(13))
    for step in range(200):
        opt.zero_grad()
        total = 0.0
        for k in range(4):
            batch = sample(4 * step + k)
            loss = cross_entropy(model, batch) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        w.step(total, batch=batch)
    w.close()
    return w


class ResBlock(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


def pre_norm_resnet(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(14))
    x, y = blobs(2048, 32, 10, seed=seed(14))
    model = nn.Sequential(
        nn.Linear(32, 64), *[ResBlock(64) for _ in range(6)], nn.LayerNorm(64), nn.Linear(64, 10)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return train(
        model,
        opt,
        Sampler(x, y, 64, seed=seed(14)),
        cross_entropy,
        160,
        wk,
        name="healthy_resnet",
        num_classes=10,
    )


CASES = [
    Case("healthy_mlp_adam", None, "MLP classifier, Adam", mlp_adam),
    Case(
        "healthy_noisy_small_batch",
        None,
        "batch of 4, 30% label noise, SGD: a very noisy loss",
        noisy_small_batch,
    ),
    Case(
        "healthy_large_stable_grad_norm",
        None,
        "sum-reduced regression on big targets: grad norm ~1e4, stable",
        large_stable_grad_norm,
    ),
    Case("healthy_cnn_batchnorm", None, "CNN with BatchNorm, SGD with momentum", cnn_batchnorm),
    Case(
        "healthy_transformer_warmup",
        None,
        "transformer LM, AdamW, LR warmup from 0, clipping",
        transformer_warmup,
    ),
    Case("healthy_amp_fp16", None, "fp16 autocast + GradScaler calibrating from 2^24", amp_fp16),
    Case(
        "healthy_converged_plateau",
        None,
        "converges early, then a long plateau with LR decay",
        converged_plateau,
    ),
    Case(
        "healthy_deep_dropout_relu",
        None,
        "6 ReLU layers with dropout (sparse activations), Adam",
        deep_dropout_relu,
    ),
    Case("healthy_lstm_clipped", None, "LSTM sequence classifier, RMSprop, clipping", lstm_clipped),
    Case("healthy_one_cycle", None, "OneCycleLR: LR up 30x and back down", one_cycle),
    Case(
        "healthy_multilabel_bce",
        None,
        "20-label BCE, num_classes=20 (starts at ln 2)",
        multilabel_bce,
    ),
    Case(
        "healthy_grad_accumulation", None, "4 micro-batches per optimizer step", grad_accumulation
    ),
    Case(
        "healthy_pre_norm_resnet",
        None,
        "6 pre-LayerNorm residual GELU blocks, AdamW",
        pre_norm_resnet,
    ),
]
