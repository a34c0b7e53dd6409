"""Regression head ending in nn.ReLU, with targets that are all negative."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, mlp, seed_all

CASE = dict(
    name="bug_relu_output_negative_targets",
    expected=["dead_relu"],
    acceptable=["loss_stalled", "zero_gradient_layer", "vanishing_gradients"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "An energy regressor (targets are negative 'binding energies', -5 +- 1) whose output "
        "layer is `nn.Linear(128, 1), nn.ReLU()` - the hidden-layer pattern copied onto the "
        "output. Every prediction is >= 0, so the gradient pushes the output pre-activation "
        "below zero for every input; within a few Adam steps the output unit is zero on the "
        "whole batch, all gradients are exactly zero and the MSE is frozen at mean(y^2) ~ 25. "
        "Modelled on the Q&A 'Are ReLU a very bad choice as last layer for regression?' "
        "(https://math.techqa.club/are-relu-a-very-bad-choice-as-last-layer-for-regression-"
        "4483706: a single ReLU output neuron whose pre-activation stays below 0 'will never "
        "learn anything, because the gradient will always be 0') and "
        "stats.stackexchange 362588 'How can a network with only ReLU nodes output negative "
        "values?'. Fix: linear output."
    ),
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, _ = load_digits_std()
    gt = torch.Generator().manual_seed(123)
    w = torch.randn(64, generator=gt) / 8
    t = -(5 + X @ w)
    model = mlp([64, 128, 128, 1], last_act=nn.ReLU if bug else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 300
    return dict(model=model, optimizer=opt, loss_fn=lambda out, y: F.mse_loss(out, y[:, None]),
                batches=dataset_batches(X, t, 64, steps, g), steps=steps, num_classes=None,
                scaler=None, autocast=None, clip=None)
