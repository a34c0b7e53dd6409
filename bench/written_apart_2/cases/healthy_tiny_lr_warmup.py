"""Healthy: the first 30 steps run an exponential LR warmup from 1e-7 up to 3e-3, so the loss sits
at its initial value (and the parameters barely move) for ~28 steps before training starts."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="healthy_tiny_lr_warmup", expected=["healthy"], acceptable=[], onset_step=None,
    description="64-128-128-10 ReLU MLP on digits, Adam with base LR 3e-3; LambdaLR multiplies it by "
                "(1e-7/3e-3)^(1-t/30) for t<30 (LR 1e-7 at step 0, 1e-5 at step 15, 3e-3 at step 30), then constant. "
                "Batch 64, 300 steps. Loss flat at ~ln10 for ~28 steps, then falls to ~0.02.",
)


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    steps = 300
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    r = 1e-7 / 3e-3
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: r ** (1 - t / 30) if t < 30 else 1.0)
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy, batches=fixed_batches(X, y, 64, steps, g),
                steps=steps, num_classes=10, scaler=None, autocast=None, clip=None, scheduler=sched)
