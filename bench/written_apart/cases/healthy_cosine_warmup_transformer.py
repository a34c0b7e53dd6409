"""Healthy: small transformer classifier with linear warmup + cosine decay (to ~0) and AdamW."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import seed_all

CASE = dict(
    name="healthy_cosine_warmup_transformer",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="1-layer pre-LN TransformerEncoder (d=32, 4 heads) over 12-token sequences from an 8-symbol "
                "alphabet; the label is the symbol that occurs most often (K=8). AdamW(3e-3) with "
                "LambdaLR: 30 steps of linear warmup from 1% of the peak, then cosine decay to 0 at "
                "the last step (the GPT/BERT recipe). The LR rises 100x, then shrinks by ~1e5 at the "
                "end, which is the schedule, not a stall.",
)


class Tiny(nn.Module):
    def __init__(self, V=8, d=32, T=12, K=8):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.pos = nn.Parameter(torch.randn(T, d) * 0.02)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 64, dropout=0.0, batch_first=True,
                                                                    norm_first=True), 1, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, K)

    def forward(self, x):
        h = self.enc(self.emb(x) + self.pos)
        return self.head(self.norm(h.mean(1)))


def build(seed):
    g = seed_all(seed)
    steps, B, T, V = 300, 64, 12, 8
    data = []
    for _ in range(steps):
        x = torch.randint(0, V, (B, T), generator=g)
        # plant a clear winner: 5 copies of a random symbol
        w = torch.randint(0, V, (B,), generator=g)
        pos = torch.rand(B, T, generator=g).argsort(1)[:, :5]
        x.scatter_(1, pos, w[:, None].expand(-1, 5))
        counts = F.one_hot(x, V).sum(1)
        data.append((x, counts.argmax(1)))
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm = 30

    def lam(s):
        if s < warm:
            return 0.01 + 0.99 * s / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / (steps - warm)))
    return dict(model=model, optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lam),
                loss_fn=F.cross_entropy, batches=lambda s: data[s], steps=steps, num_classes=8, scaler=None,
                autocast=None, clip=1.0)
