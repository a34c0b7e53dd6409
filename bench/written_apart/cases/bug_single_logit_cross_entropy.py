"""Binary task with one output logit fed to CrossEntropyLoss (soft targets): loss is exactly 0."""
import torch
import torch.nn as nn

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_single_logit_cross_entropy",
    expected=["loss_stalled"],
    acceptable=["bad_initial_loss", "vanishing_gradients"],
    onset_step=0,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 0, 1: 0, 2: 0},
    description="'Is the digit >= 5?' with a Linear(...,1) head (BCE-style) but nn.CrossEntropyLoss "
                "and float targets of shape [B,1] (accepted as class probabilities). log_softmax over "
                "a single logit is identically 0, so the loss is exactly 0.0 from step 0 and every "
                "gradient is exactly zero (the 'CrossEntropyLoss always returns 0' forum report). "
                "The fix uses BCEWithLogitsLoss.",
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    yb = (y >= 5).float().unsqueeze(1)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
    crit = nn.CrossEntropyLoss() if bug else nn.BCEWithLogitsLoss()
    steps = 200
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                loss_fn=crit, batches=dataset_batches(X, yb, 64, steps, g), steps=steps, num_classes=2,
                scaler=None, autocast=None, clip=None)
