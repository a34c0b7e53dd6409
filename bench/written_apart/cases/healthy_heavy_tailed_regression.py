"""Healthy: regression with Student-t(1.5) target noise: per-batch MSE spikes 10-100x, model learns."""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import fixed_batches, seed_all

CASE = dict(
    name="healthy_heavy_tailed_regression",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="MLP 20-128-128-1 regressing a nonlinear signal (amplitude ~10) whose targets carry "
                "heavy-tailed Student-t(df=2, infinite variance) noise, scale 0.5, (financial returns, sensor glitches), MSE, batch 32, "
                "Adam(1e-3). Single outliers make some batch losses 5-150x the running median and the "
                "grad norm spikes with them, all the way through training; the typical loss still "
                "falls well below its start.",
)


DF = 2.0


def build(seed):
    g = seed_all(seed)
    steps, B, d = 300, 32, 20
    W1 = torch.randn(d, 8, generator=g) / d ** 0.5
    w2 = torch.randn(8, 1, generator=g)
    rs = np.random.RandomState(1000 + seed)
    data = []
    for _ in range(steps):
        x = torch.randn(B, d, generator=g)
        f = torch.tanh(x @ W1) @ w2 * 4
        noise = torch.tensor(rs.standard_t(DF, size=(B, 1)), dtype=torch.float32)
        data.append((x, f + 0.5 * noise))
    model = nn.Sequential(nn.Linear(d, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=F.mse_loss,
                batches=fixed_batches(data), steps=steps, num_classes=None, scaler=None, autocast=None, clip=None)
