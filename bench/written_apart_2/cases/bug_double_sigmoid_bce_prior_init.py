"""Bug: a multi-label head ends in nn.Sigmoid and its output goes to BCEWithLogitsLoss (a second
sigmoid). The head uses the focal-loss 'prior' bias init (p=0.01), so the first sigmoid sits on its
flat tail (slope ~0.01) and the second squeezes every prediction to ~0.5: the loss sits at ln 2."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_double_sigmoid_bce_prior_init", expected=["loss_stalled"], acceptable=["vanishing_gradients"],
    onset_step=0,
    description="Digits as 10 one-hot binary targets (multi-label style), 64-64-64-10 ReLU MLP whose last Linear bias "
                "is initialised to -ln(99) (prior p=0.01, RetinaNet recipe), followed by nn.Sigmoid (bug) and "
                "BCEWithLogitsLoss; SGD lr 0.5 momentum 0.9, batch 64, 300 steps; num_classes=None. The loss stays "
                "at ~0.697 -> 0.694 (= ln 2 + 0.5%). Fixed: no nn.Sigmoid (0.47 -> 0.002).",
)


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    t = F.one_hot(y, 10).float()
    last = nn.Linear(64, 10)
    nn.init.constant_(last.bias, -math.log(99))
    layers = [nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), last] + ([nn.Sigmoid()] if bug else [])
    model = nn.Sequential(*layers)
    steps = 300
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9),
                loss_fn=nn.BCEWithLogitsLoss(), batches=fixed_batches(X, t, 64, steps, g), steps=steps,
                num_classes=None, scaler=None, autocast=None, clip=None)
