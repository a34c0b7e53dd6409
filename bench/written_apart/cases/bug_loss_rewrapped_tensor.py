"""loss = torch.tensor(loss.item(), requires_grad=True): the graph is cut, no parameter gets a grad."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_loss_rewrapped_tensor",
    expected=["loss_stalled"],
    acceptable=["vanishing_gradients"],
    onset_step=0,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 0, 1: 0, 2: 0},
    description="MLP 64-128-10 + Adam(1e-3) on digits, but the loss function re-wraps the value "
                "as a new leaf: `loss = torch.tensor(F.cross_entropy(...).item(), requires_grad=True)` "
                "(a well-known Stack Overflow question: 'my loss never changes'; done to 'fix' a "
                "'does not require grad' error). backward() succeeds, every parameter's .grad stays "
                "None, Adam skips them, and the loss stays at ln 10.",
)


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    with torch.no_grad():
        model[2].weight.mul_(0.1)

    def loss_fn(out, t):
        loss = F.cross_entropy(out, t)
        if bug:
            loss = torch.tensor(loss.item(), requires_grad=True)
        return loss
    steps = 250
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=loss_fn,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=None,
                autocast=None, clip=None)
