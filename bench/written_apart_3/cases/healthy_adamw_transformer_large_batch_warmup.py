"""Small transformer LM: AdamW weight_decay 0.1, batch 128, linear warmup + cosine decay."""
import math

import torch
import torch.nn as nn

from ._common import flat_ce, lm_batches, markov_corpus, seed_all

V, D, T = 48, 48, 16

CASE = dict(
    name="healthy_adamw_transformer_large_batch_warmup",
    expected=["healthy"],
    acceptable=[],
    description=(
        "GPT-style recipe at toy scale: a 2-layer pre-LN transformer LM on a Markov corpus, "
        "batch 128 sequences (large for the task), AdamW(lr 3e-3, betas (0.9, 0.95), "
        "weight_decay=0.1) on the matrices (not on norms/biases/embeddings, as in nanoGPT), "
        "linear warmup over 30 steps from 0 then cosine decay to 10%. Weight decay 0.1 is large "
        "but correct for decoupled AdamW; the loss falls from ~3.8 (ln 48 = 3.87) to ~0.85, near "
        "the corpus entropy, with a flat gradient norm."
    ),
)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(T, D))
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, V, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        return self.head(self.ln_f(self.blocks(self.emb(idx) + self.pos)))


def build(seed):
    g = seed_all(seed)
    toks = markov_corpus(V, 30000, g)
    model = LM()
    decay = [p for n, p in model.named_parameters()
             if p.dim() >= 2 and not n.startswith(("emb", "pos"))]
    no_decay = [p for n, p in model.named_parameters()
                if not (p.dim() >= 2 and not n.startswith(("emb", "pos")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    steps, warm = 150, 30

    def lr_lambda(s):
        if s < warm:
            return s / warm
        p = (s - warm) / (steps - warm)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda)
    return dict(model=model, optimizer=opt, loss_fn=flat_ce,
                batches=lm_batches(toks, T, 128, steps, g), steps=steps, num_classes=V,
                scaler=None, autocast=None, clip=1.0, scheduler=sched)
