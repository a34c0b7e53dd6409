"""Inputs and labels shuffled by two independent samplers: the labels carry no signal."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import digits_std, epoch_indices, seed_all

CASE = dict(
    name="bug_shuffled_labels",
    expected=["loss_stalled"],
    acceptable=[],
    onset_step=0,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 0, 1: 0, 2: 0},
    description="MLP 64-256-256-10 with AdamW(1e-3) on digits, but X and y come from two "
                "DataLoaders that each shuffle (the 'zip(loader_x, loader_y) with shuffle=True' "
                "report). Every epoch re-pairs inputs with random labels, so nothing can be learnt "
                "or memorised: the loss sits at ln 10.",
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    steps = 300
    ix = epoch_indices(X.shape[0], 64, steps, g)
    iy = epoch_indices(X.shape[0], 64, steps, g) if bug else ix
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        model[4].weight.mul_(0.1)

    def batches(step):
        return X[ix[step]], y[iy[step]]
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), loss_fn=F.cross_entropy,
                batches=batches, steps=steps, num_classes=10, scaler=None, autocast=None, clip=None)
