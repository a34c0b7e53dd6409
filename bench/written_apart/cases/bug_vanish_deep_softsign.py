"""32-layer plain Softsign MLP, default init, no residuals: the first layers get ~no gradient."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_vanish_deep_softsign",
    expected=["vanishing_gradients"],
    acceptable=["loss_stalled"],
    onset_step=0,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 0, 1: 0, 2: 0},
    description="A 32-layer, 64-wide plain MLP with Softsign activations (x/(1+|x|)), PyTorch's "
                "default Linear init (Var(w) = 1/(3 fan_in)), no normalization and no skip "
                "connections, RMSprop(1e-3). Each layer shrinks the backward signal, "
                "so the first layer's gradient is orders of magnitude below the last's (Glorot & "
                "Bengio 2010 studied exactly softsign/tanh stacks).",
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    depth = 32 if bug else 3
    layers, d = [], 64
    for _ in range(depth):
        layers += [nn.Linear(d, 64), nn.Softsign()]
    model = nn.Sequential(*layers, nn.Linear(64, 10))
    steps = 200
    return dict(model=model, optimizer=torch.optim.RMSprop(model.parameters(), lr=1e-3), loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=None,
                autocast=None, clip=None)
