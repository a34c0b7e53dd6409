"""StepLR meant per epoch, stepped per batch: the LR collapses after a few dozen steps."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_steplr_per_batch",
    expected=["loss_stalled"],
    acceptable=[],
    onset_step=0,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 0, 1: 0, 2: 0},
    description="MLP 64-128-10 on digits, SGD(lr=0.01, momentum=0.9) with StepLR(step_size=2, "
                "gamma=0.1) written for 'decay 10x every 2 epochs' but scheduler.step() sits in the "
                "batch loop (the classic misplacement torch's docs warn about). After 20 batches "
                "the LR is 1e-12: the model never leaves its initial loss (~ln 10).",
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    with torch.no_grad():
        model[2].weight.mul_(0.1)
        model[2].bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    steps = 300
    # per epoch = 28 batches of 64; the fixed version steps the scheduler once per epoch
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2 if bug else 2 * 28, gamma=0.1 if bug else 0.5)
    return dict(model=model, optimizer=opt, scheduler=sched, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=None,
                autocast=None, clip=None)
