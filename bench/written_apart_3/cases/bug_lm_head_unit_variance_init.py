"""Small LM whose untied lm_head is initialised with variance 1 instead of 1/d."""
import torch
import torch.nn as nn

from ._common import flat_ce, lm_batches, markov_corpus, seed_all

V, D, T = 64, 64, 16

CASE = dict(
    name="bug_lm_head_unit_variance_init",
    expected=["bad_initial_loss"],
    acceptable=["loss_spike"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A 2-layer pre-LN transformer LM (vocab 64, d=64) on a Markov token corpus; the model's "
        "`_init_weights` sets the untied lm_head with `normal_(mean=0, std=factor * 1.0)` "
        "instead of `std=factor * d_model**-0.5`. After the final LayerNorm the hidden state "
        "has norm ~8, so logits have std ~8 and the first cross-entropy is 18-20 instead of ln "
        "64 = 4.16 (the control starts at 4.5-4.8); Adam (lr 1e-3) then brings it down to ~0.9 "
        "like the control. Modelled on huggingface/transformers#26441 '[T5] lm_head weights "
        "initialization: set variance to reciprocal of hidden dim' ('lm_head weights were "
        "initialized with variance of 1 ... resulted in initial cross-entropy loss of ~110', "
        "re-fixing #16749). Fix: std d^-0.5."
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
    def __init__(self, head_std):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.zeros(T, D))
        self.blocks = nn.Sequential(Block(), Block())
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        nn.init.normal_(self.emb.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.lm_head.weight, std=head_std)

    def forward(self, idx):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        return self.lm_head(self.ln_f(self.blocks(x)))


def build(seed, bug=True):
    g = seed_all(seed)
    toks = markov_corpus(V, 20000, g)
    model = LM(head_std=1.0 if bug else D ** -0.5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 250
    return dict(model=model, optimizer=opt, loss_fn=flat_ce,
                batches=lm_batches(toks, T, 32, steps, g), steps=steps, num_classes=V,
                scaler=None, autocast=None, clip=None)
