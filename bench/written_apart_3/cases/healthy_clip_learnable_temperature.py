"""CLIP-style two-tower InfoNCE with a learnable temperature (logit scale clamped at 100)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all

CASE = dict(
    name="healthy_clip_learnable_temperature",
    expected=["healthy"],
    acceptable=[],
    description=(
        "Contrastive two-tower training as in CLIP (Radford et al. 2021) on two 'views' of each "
        "digit (top and bottom halves): L2-normalised 32-d embeddings, symmetric InfoNCE over "
        "the batch (64), and a learnable logit scale initialised at ln(1/0.07) and clamped at "
        "ln(100) as in CLIP. The loss starts at ~4.6-4.9 (~ln 64 plus the sharp initial "
        "temperature; not a K-class CE, num_classes=None) and falls to ~0.5; the gradient norm "
        "sits at ~10, far above a classifier's. Correct by design."
    ),
)


class Towers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))
        self.b = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 32))
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def forward(self, x):
        za = F.normalize(self.a(x[:, :32]), dim=1)
        zb = F.normalize(self.b(x[:, 32:]), dim=1)
        scale = self.logit_scale.clamp(max=math.log(100)).exp()
        return scale * za @ zb.T


def build(seed):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = Towers()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def loss_fn(logits, _y):
        t = torch.arange(logits.shape[0])
        return 0.5 * (F.cross_entropy(logits, t) + F.cross_entropy(logits.T, t))

    return dict(model=model, optimizer=opt, loss_fn=loss_fn,
                batches=dataset_batches(X, y, 64, 400, g), steps=400, num_classes=None,
                scaler=None, autocast=None, clip=None)
