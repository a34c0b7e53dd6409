"""Healthy runs of still more kinds, so that the corpus covers what users train: tanh and sigmoid
MLPs (no saturation alarm on a working squashing net), a GRU, fine-tuning a pretrained body under a
new head (zero and default init), a resumed run that keeps improving, bfloat16 autocast noise, batches of two, torch's own
clip_grad_norm_ firing mildly on every step, strong AdamW weight decay, heavy dropout, a
BatchNorm CNN under Adam with cosine decay, and gradient accumulation that hands ``w.step()`` the
micro-batch loss divided by the count, as nanoGPT does. None may raise a warning."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import nnwatch

from .common import Case, Sampler, blobs, cross_entropy, mlp, seed, train
from .healthy import SmallCNN, shapes


def tanh_mlp(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(400))
    x, y = blobs(2048, 32, 10, seed=seed(400), spread=1.5)
    model = mlp([32, 64, 64, 10], nn.Tanh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(400)), cross_entropy, 200, wk,
        name="healthy_tanh", num_classes=10,
    )  # fmt: skip


def sigmoid_mlp(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(401))
    x, y = blobs(2048, 32, 10, seed=seed(401), spread=1.5)
    model = mlp([32, 64, 64, 10], nn.Sigmoid)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(401)), cross_entropy, 200, wk,
        name="healthy_sigmoid", num_classes=10,
    )  # fmt: skip


class GRUClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 32, batch_first=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(x)
        return self.head(out[:, -1])


def gru(wk: dict[str, Any]) -> Any:
    """Which of the first three channels has the largest sum over the sequence? GRU, Adam."""
    torch.manual_seed(seed(402))
    g = torch.Generator().manual_seed(seed(402))

    def next_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(32, 16, 4, generator=g)
        return x, x[:, :, :3].sum(1).argmax(1)

    model = GRUClassifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    return train(model, opt, next_batch, cross_entropy, 200, wk, name="healthy_gru", num_classes=3)


def _pretrained_body(n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A body trained (unwatched) for 200 steps on a 10-class task, and that task's data."""
    torch.manual_seed(seed(n))
    x, y = blobs(4096, 32, 10, seed=seed(n), spread=1.5)
    body = mlp([32, 128, 64])
    pre = nn.Sequential(body, nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(pre.parameters(), lr=1e-3)
    sample = Sampler(x, y, 64, seed=seed(n))
    for step in range(200):
        xb, yb = sample(step)
        opt.zero_grad()
        cross_entropy(pre, (xb, yb)).backward()
        opt.step()
    return body, x, y


def _fine_tune(wk: dict[str, Any], n: int, zero_head: bool, name: str) -> Any:
    """A new 4-class head on the pretrained body and a fresh optimizer with a smaller LR for the
    body: the usual transfer-learning recipe."""
    body, x, y = _pretrained_body(n)
    y2 = y % 4  # the new task: a coarser labelling of the same inputs
    model = nn.Sequential(body, nn.ReLU(), nn.Linear(64, 4))
    if zero_head:
        nn.init.zeros_(model[2].weight)  # the new head starts at zero (BiT's recipe): loss ln 4
        nn.init.zeros_(model[2].bias)
    opt2 = torch.optim.Adam(
        [
            {"params": body.parameters(), "lr": 1e-4},
            {"params": model[2].parameters(), "lr": 1e-3},
        ]
    )
    return train(
        model, opt2, Sampler(x, y2, 64, seed=seed(n + 1)), cross_entropy, 200, wk,
        name=name, num_classes=4,
    )  # fmt: skip


def fine_tune(wk: dict[str, Any]) -> Any:
    """Fine-tuning under a zero-initialized head: the first loss is ln K exactly."""
    return _fine_tune(wk, 403, True, "healthy_fine_tune")


def fine_tune_default_head(wk: dict[str, Any]) -> Any:
    """The same with PyTorch's default head init: on trained ReLU features, whose outputs are
    large, the random head's logits spread and the first loss lands well above ln K. That is what
    uninformed logits of that spread score, not a bad init."""
    return _fine_tune(wk, 412, False, "healthy_fine_tune_default_head")


def resumed(wk: dict[str, Any]) -> Any:
    """Trained for 100 steps, saved and loaded (model and optimizer), then watched as it goes on."""
    import io

    torch.manual_seed(seed(405))
    x, y = blobs(4096, 32, 10, seed=seed(405), spread=2.0)
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sample = Sampler(x, y, 64, seed=seed(405))
    for step in range(100):
        opt.zero_grad()
        cross_entropy(model, sample(step)).backward()
        opt.step()
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf)
    model2 = mlp([32, 64, 10])
    model2.load_state_dict(state["model"])
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.02, momentum=0.9)
    opt2.load_state_dict(state["opt"])
    return train(
        model2, opt2, lambda s: sample(100 + s), cross_entropy, 200, wk,
        name="healthy_resumed", num_classes=10,
    )  # fmt: skip


def bf16_autocast(wk: dict[str, Any]) -> Any:
    """bfloat16 autocast on the CPU: 8 bits of mantissa make every loss and gradient noisier."""
    torch.manual_seed(seed(406))
    x, y = blobs(2048, 32, 10, seed=seed(406))
    model = mlp([32, 128, 128, 10])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(406)), cross_entropy, 200, wk,
        name="healthy_bf16", num_classes=10, autocast_dtype=torch.bfloat16,
    )  # fmt: skip


def batch_of_two(wk: dict[str, Any]) -> Any:
    """Two samples per step: the loss jumps between near 0 and several nats from step to step."""
    torch.manual_seed(seed(407))
    x, y = blobs(4096, 16, 5, seed=seed(407), spread=1.5)
    model = mlp([16, 64, 5])
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    return train(
        model, opt, Sampler(x, y, 2, seed=seed(407)), cross_entropy, 400, wk,
        name="healthy_batch_of_two", num_classes=5,
    )  # fmt: skip


def torch_clip_mild(wk: dict[str, Any]) -> Any:
    """torch.nn.utils.clip_grad_norm_ (not nnwatch's) with max_norm just under the usual norm:
    it fires on nearly every step and scales the gradient down by a few tens of percent."""
    torch.manual_seed(seed(408))
    x, y = blobs(2048, 32, 10, seed=seed(408), spread=2.0, label_noise=0.1)
    model = mlp([32, 64, 10])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    w = nnwatch.watch(model, opt, num_classes=10, name="healthy_torch_clip", **wk)
    sample = Sampler(x, y, 64, seed=seed(408))
    for step in range(200):
        batch = sample(step)
        opt.zero_grad()
        loss = cross_entropy(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        opt.step()
        w.step(loss, batch=batch)
    w.close()
    return w


def strong_weight_decay(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(409))
    x, y = blobs(2048, 32, 10, seed=seed(409), spread=1.5)
    model = mlp([32, 128, 10])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.3)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(409)), cross_entropy, 200, wk,
        name="healthy_weight_decay", num_classes=10,
    )  # fmt: skip


def heavy_dropout(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(410))
    x, y = blobs(2048, 32, 10, seed=seed(410), spread=1.5)
    model = nn.Sequential(
        nn.Linear(32, 256), nn.ReLU(), nn.Dropout(0.6),
        nn.Linear(256, 256), nn.ReLU(), nn.Dropout(0.6),
        nn.Linear(256, 10),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return train(
        model, opt, Sampler(x, y, 64, seed=seed(410)), cross_entropy, 200, wk,
        name="healthy_heavy_dropout", num_classes=10,
    )  # fmt: skip


def cnn_adam_cosine(wk: dict[str, Any]) -> Any:
    torch.manual_seed(seed(411))
    x, y = shapes(2048, seed(411))
    model = SmallCNN()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=200)
    return train(
        model, opt, Sampler(x, y, 32, seed=seed(411)), cross_entropy, 200, wk,
        name="healthy_cnn_cosine", num_classes=4, scheduler=sched,
    )  # fmt: skip


def accumulated(wk: dict[str, Any]) -> Any:
    """nanoGPT's loop: 4 micro-batches per update, each loss divided by 4, torch's clip at 1.0,
    and the last (divided) micro-batch loss passed to w.step(): it starts near ln(10) / 4."""
    torch.manual_seed(seed(412))
    x, y = blobs(4096, 32, 10, seed=seed(412), spread=1.5)
    model = mlp([32, 64, 64, 10])
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sample = Sampler(x, y, 32, seed=seed(412))
    accumulation = 4
    with nnwatch.watch(model, opt, num_classes=10, name="healthy_accumulated", **wk) as w:
        for step in range(150):
            for micro in range(accumulation):
                xb, yb = sample(step * accumulation + micro)
                loss = cross_entropy(model, (xb, yb)) / accumulation
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            w.step(loss, batch=(xb, yb))
    return w


CASES = [
    Case("healthy_tanh_mlp", None, "tanh MLP, SGD momentum", tanh_mlp),
    Case("healthy_sigmoid_mlp", None, "sigmoid MLP, Adam", sigmoid_mlp),
    Case("healthy_gru", None, "GRU sequence classifier, Adam", gru),
    Case("healthy_fine_tune_new_head", None, "pretrained body, new 4-class head", fine_tune),
    Case(
        "healthy_fine_tune_default_head",
        None,
        "pretrained body, new 4-class head with PyTorch's default init",
        fine_tune_default_head,
    ),
    Case(
        "healthy_resumed_still_learning",
        None,
        "resumed from a checkpoint, loss keeps falling",
        resumed,
    ),
    Case("healthy_bf16_autocast", None, "bfloat16 autocast: low-precision noise", bf16_autocast),
    Case("healthy_batch_of_two", None, "two samples per step", batch_of_two),
    Case(
        "healthy_torch_clip_mild",
        None,
        "torch's clip_grad_norm_ firing mildly every step",
        torch_clip_mild,
    ),
    Case("healthy_strong_weight_decay", None, "AdamW, weight_decay=0.3", strong_weight_decay),
    Case("healthy_heavy_dropout", None, "dropout 0.6 in a wide MLP", heavy_dropout),
    Case("healthy_cnn_adam_cosine", None, "BatchNorm CNN, Adam, cosine decay", cnn_adam_cosine),
    Case(
        "healthy_accumulated",
        None,
        "gradient accumulation, w.step() given the micro-batch loss / 4",
        accumulated,
    ),
]
