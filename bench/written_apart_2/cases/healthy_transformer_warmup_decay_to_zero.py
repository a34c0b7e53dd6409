"""Healthy: small pre-LN transformer with linear warmup then linear decay to exactly 0 at the last
step. The last stretch makes (almost) no updates, so the loss flattens and the update size -> 0."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._seq import lm_batches, markov_corpus
from cases._util import seeded

V = 16

CASE = dict(
    name="healthy_transformer_warmup_decay_to_zero", expected=["healthy"], acceptable=[], onset_step=None,
    description="2-layer causal pre-LN transformer (d=32, 4 heads, GELU FFN 64, learned positions) as a next-token "
                "model on a Markov corpus, AdamW 3e-3, LambdaLR: linear warmup over 30 steps, then linear decay "
                "reaching exactly 0.0 at the final step (LR of the last update is 0), batch 32, T=20, 250 steps.",
)


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, h, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x, mask):
        a = self.ln1(x)
        x = x + self.att(a, a, a, attn_mask=mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, d=32, T=20):
        super().__init__()
        self.emb = nn.Embedding(V, d)
        self.pos = nn.Parameter(0.02 * torch.randn(T, d))
        self.blocks = nn.ModuleList([Block(d, 4) for _ in range(2)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, V)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        T = x.shape[1]
        h = self.emb(x) + self.pos[:T]
        for b in self.blocks:
            h = b(h, self.mask[:T, :T])
        return self.head(self.ln(h))


def build(seed, bug=True):
    g = seeded(seed)
    seq = markov_corpus(g, V)
    model = TinyGPT()
    steps = 250
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    warm = 30
    # multiplier for update t (scheduler.step() after update t sets the LR of update t+1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: min((t + 1) / warm, max(0.0, (steps - 1 - t) / (steps - 1 - warm))))
    return dict(model=model, optimizer=opt, loss_fn=lambda o, t: F.cross_entropy(o.reshape(-1, V), t.reshape(-1)),
                batches=lm_batches(seq, 32, 20, steps, g), steps=steps, num_classes=V, scaler=None,
                autocast=None, clip=None, scheduler=sched)
