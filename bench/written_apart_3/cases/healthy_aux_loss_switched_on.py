"""An auxiliary reconstruction loss switched on at step 60 (deep-supervision style)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all

CASE = dict(
    name="healthy_aux_loss_switched_on",
    expected=["healthy"],
    acceptable=[],
    description=(
        "A classifier with an auxiliary decoder head that reconstructs the input from the hidden "
        "features; the auxiliary MSE (weight 1.0) is switched on at step 60 of 400, after the "
        "classifier has warmed up - the 'auxiliary loss enabled after N steps' pattern of "
        "multi-task recipes. The logged total loss steps up ~2x at step 60 (~0.5 -> ~1.0) and "
        "then falls to ~0.2 as both terms are learnt. num_classes=None (CE + MSE)."
    ),
)

SWITCH, STEPS = 60, 400


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
        self.cls = nn.Linear(128, 10)
        self.dec = nn.Sequential(nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 64))
        self.aux_weight = 0.0

    def forward(self, x):
        h = self.body(x)
        return self.cls(h), self.dec(h), x


def build(seed):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    base = dataset_batches(X, y, 64, STEPS, g)

    def batches(step):
        model.aux_weight = 1.0 if step >= SWITCH else 0.0
        return base(step)

    def loss_fn(out, t):
        logits, rec, x = out
        return F.cross_entropy(logits, t) + model.aux_weight * F.mse_loss(rec, x)

    return dict(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches, steps=STEPS,
                num_classes=None, scaler=None, autocast=None, clip=None)
