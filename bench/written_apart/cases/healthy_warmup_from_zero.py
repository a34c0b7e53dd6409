"""Healthy: linear LR warmup that starts at exactly 0 (no update at step 0), then constant."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="healthy_warmup_from_zero",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="MLP 64-128-128-10 with SiLU, AdamW(1e-3) and LambdaLR(lambda s: min(1, s/100)): the LR "
                "is exactly 0.0 at step 0 (the first update does nothing) and ramps linearly over 100 "
                "steps (the 'warmup from zero' of many HF schedules). The loss sits at ln 10 for the "
                "first ~30 steps, then trains to ~0.03.",
)


def build(seed):
    g = seed_all(seed)
    X, y = digits_std()
    model = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(), nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps = 300
    return dict(model=model, optimizer=opt,
                scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 100)),
                loss_fn=F.cross_entropy, batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
