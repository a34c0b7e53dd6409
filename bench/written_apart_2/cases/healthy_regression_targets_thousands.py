"""Healthy: regression with raw targets in the thousands (prices), MSE, Adam. Loss starts ~1e7."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import pregen, seeded

CASE = dict(
    name="healthy_regression_targets_thousands", expected=["healthy"], acceptable=[], onset_step=None,
    description="Synthetic 'house price' regression: 12 standardised features, target = 4000 + 900*(smooth "
                "nonlinear function) + noise (range ~1000-8000, not standardised). 12-128-128-1 SiLU MLP, "
                "output bias initialised to 0, MSE, Adam lr 0.05, batch 128, 400 steps. MSE ~1.7e7 at step 0.",
)


def build(seed, bug=True):
    g = seeded(seed)
    W = torch.randn(12, 4, generator=g) / 12 ** 0.5

    def make(gg):
        x = torch.randn(128, 12, generator=gg)
        h = x @ W
        y = 4000 + 900 * (torch.tanh(h[:, 0]) + 0.5 * h[:, 1] * h[:, 2] + torch.sin(h[:, 3])) \
            + 100 * torch.randn(128, generator=gg)
        return x, y.unsqueeze(1)
    steps = 400
    model = nn.Sequential(nn.Linear(12, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(), nn.Linear(128, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.05), loss_fn=F.mse_loss,
                batches=pregen(make, steps, g), steps=steps, num_classes=None, scaler=None, autocast=None, clip=None)
