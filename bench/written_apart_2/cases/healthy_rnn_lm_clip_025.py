"""Healthy: LSTM language model on a synthetic Markov corpus with clip_grad_norm_(0.25) (the classic
word-LM setting). The pre-clip norm is above 0.25 on almost every step: clipping is routine here."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._seq import lm_batches, markov_corpus
from cases._util import seeded

V = 32

CASE = dict(
    name="healthy_rnn_lm_clip_025", expected=["healthy"], acceptable=[], onset_step=None,
    description="Embedding(32,32)-LSTM(32->128)-Linear(128,32) next-token model on a 3-successor Markov chain "
                "with 5% random tokens (achievable loss ~1.3 nats vs ln32 = 3.47), T=24, batch 8, SGD lr 1.0 "
                "(the word-LM recipe), clip 0.25, 300 steps. Pre-clip grad norm > 0.25 on nearly all steps.",
)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, 32)
        self.rnn = nn.LSTM(32, 128, batch_first=True)
        self.out = nn.Linear(128, V)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h)


def build(seed, bug=True):
    g = seeded(seed)
    seq = markov_corpus(g, V, branch=3)
    model = LM()
    steps = 300
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
                loss_fn=lambda o, t: F.cross_entropy(o.reshape(-1, V), t.reshape(-1)),
                batches=lm_batches(seq, 8, 24, steps, g), steps=steps, num_classes=V,
                scaler=None, autocast=None, clip=0.25)
