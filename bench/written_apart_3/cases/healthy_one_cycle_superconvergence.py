"""One-cycle schedule with a high peak LR (super-convergence) on a BatchNorm MLP."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all

CASE = dict(
    name="healthy_one_cycle_superconvergence",
    expected=["healthy"],
    acceptable=[],
    description=(
        "OneCycleLR (Smith & Topin 2018, 'Super-Convergence'; the fast.ai fit_one_cycle "
        "default) on a BatchNorm MLP: SGD with max_lr 0.4 (20x the starting 0.02), peak at 30% "
        "of 400 steps, cycled momentum 0.95 -> 0.85. While the LR climbs 25x the loss stops "
        "falling for ~100 steps (it wobbles between ~0.05 and ~0.09 after a quick first drop), "
        "and the annealing phase then brings it down to ~5e-4; the update/weight ratio stays "
        "~1e-2 through the peak because BatchNorm lets the weights grow with the LR."
    ),
)


def build(seed):
    g = seed_all(seed)
    X, y = load_digits_std()
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(),
                          nn.Linear(256, 256), nn.BatchNorm1d(256), nn.ReLU(),
                          nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.4, total_steps=400, pct_start=0.3)
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 128, 400, g), steps=400, num_classes=10,
                scaler=None, autocast=None, clip=None, scheduler=sched)
