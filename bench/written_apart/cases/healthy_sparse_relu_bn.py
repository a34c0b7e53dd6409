"""Healthy: BatchNorm + ReLU with a negative shift, 75-85% of activations exactly zero, almost no dead units."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="healthy_sparse_relu_bn",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="MLP 64-512-256-10 with Linear -> BatchNorm1d -> ReLU, the BN shift initialised to -0.9 "
                "(a sparse-coding style net: each unit fires for its top ~18% of inputs). 75-85% of all "
                "ReLU outputs are exact zeros at every step, yet since BN re-centres every unit per "
                "batch, each unit still fires for some inputs: the per-unit dead fraction stays low. "
                "Adam(1e-3); loss ln 10 -> ~0.01. A monitor that counts zeros instead of dead units "
                "raises dead_relu here.",
)


def build(seed):
    g = seed_all(seed)
    X, y = digits_std()
    model = nn.Sequential(nn.Linear(64, 512), nn.BatchNorm1d(512), nn.ReLU(),
                          nn.Linear(512, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        model[1].bias.fill_(-0.9)
        model[4].bias.fill_(-0.9)
    steps = 250
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=None,
                autocast=None, clip=None)
