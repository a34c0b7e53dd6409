"""Contrastive loss with sqrt(sum((a-b)^2)): a pair of a sample with itself gives a NaN gradient."""
import torch
import torch.nn as nn

from cases._common import digits_std, seed_all

CASE = dict(
    name="bug_nan_sqrt_zero_distance",
    expected=["nan_or_inf"],
    acceptable=[],
    onset_step=22,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 22, 1: 21, 2: 5},
    description="Siamese MLP 64-128-32 on digits with the contrastive loss (Hadsell et al.) and the "
                "distance written as ((e1-e2)**2).sum(-1).sqrt(). Pairs are drawn uniformly from the "
                "data set, so now and then a sample is paired with itself: d = 0, the forward is "
                "finite (the loss too), but d(sqrt)/dx at 0 is inf and inf*0 = NaN in the backward "
                "(the known 'NaN gradient of torch.norm/sqrt at zero' report). Adam then writes NaN "
                "into every weight and all later losses are NaN. Fixed: sqrt(clamp_min(1e-12)).",
)


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))

    def forward(self, x):  # x: [B, 2, 64]
        return self.net(x)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    steps = 200
    B = 48
    data = []
    for _ in range(steps):
        i = torch.randint(0, X.shape[0], (B,), generator=g)
        # 8 of the 48 pairs are positives: the partner is drawn from the anchor's class (itself included),
        # the rest are random pairs
        j = torch.randint(0, X.shape[0], (B,), generator=g)
        for k in range(8):
            cls = (y == y[i[k]]).nonzero().flatten()
            j[k] = cls[torch.randint(0, len(cls), (1,), generator=g)]
        data.append((torch.stack([X[i], X[j]], 1), (y[i] == y[j]).float()))
    model = Siamese()

    def loss_fn(e, same, margin=2.0):
        sq = ((e[:, 0] - e[:, 1]) ** 2).sum(-1)
        d = sq.sqrt() if bug else sq.clamp_min(1e-12).sqrt()
        return (same * d ** 2 + (1 - same) * torch.relu(margin - d) ** 2).mean()
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=loss_fn,
                batches=lambda s: data[s], steps=steps, num_classes=None, scaler=None, autocast=None, clip=None)
