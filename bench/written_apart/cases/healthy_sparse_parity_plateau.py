"""Healthy: sparse parity learnt by an MLP: a long plateau at ln 2, then a sudden drop."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import seed_all

CASE = dict(
    name="healthy_sparse_parity_plateau",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="(24, 3)-sparse parity: the label is the XOR of 3 fixed bits out of 24 random +-1 bits "
                "(Barak et al. 2022, 'Hidden progress in deep learning'). MLP 24-256-2, Adam(1e-3), batch "
                "256, fresh samples every step. The loss sits at ln 2 = 0.693 (label entropy) for ~240 "
                "steps while the first-layer weights slowly align with the 3 relevant bits (hidden "
                "progress, no visible change in the loss), then drops to ~0.02 within ~100 steps. "
                "Calling this plateau 'stalled' and stopping the run would be wrong.",
)


def build(seed):
    g = seed_all(seed)
    n, k, B, steps = 24, 3, 256, 800
    data = []
    for _ in range(steps):
        x = torch.randint(0, 2, (B, n), generator=g).float() * 2 - 1
        data.append((x, ((x[:, :k] < 0).sum(1) % 2).long()))
    model = nn.Sequential(nn.Linear(n, 256), nn.ReLU(), nn.Linear(256, 2))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=F.cross_entropy,
                batches=lambda s: data[s], steps=steps, num_classes=2, scaler=None, autocast=None, clip=None)
