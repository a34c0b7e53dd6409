"""Float64 least-squares fit with a step size above 2/L: the loss climbs to 1e40+ and stays finite."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import fixed_batches, seed_all

CASE = dict(
    name="bug_float64_diverging",
    expected=["loss_diverging"],
    acceptable=["exploding_gradients", "oscillating_loss", "bad_initial_loss"],
    onset_step=13,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 13, 1: 13, 2: 12},
    description="A float64 linear model (scientific curve fit: 12 polynomial/physical features, one of "
                "them on a 3x larger scale) trained by full-batch SGD(lr=0.122; 0.02 was intended). lr times "
                "the largest Hessian eigenvalue is ~2.2, above the stability limit 2, so the error along "
                "that direction grows ~1.2x per step: the MSE goes 1 -> 1e40+ (finite in float64, no NaN) and keeps "
                "climbing; the grad norm grows with it. Fixed: lr=0.005.",
)


def build(seed, bug=True):
    g = seed_all(seed)
    n, d = 512, 12
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    X = X - X.mean(0, keepdim=True)
    X = torch.linalg.qr(X)[0] * n ** 0.5          # centred, exactly whitened features
    X[:, 0] *= 3.0                                # one feature on a 3x scale: Hessian eigenvalue 18
    wt = torch.randn(d, 1, generator=g, dtype=torch.float64)
    Y = X @ wt + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    model = nn.Linear(d, 1).double()
    steps = 300
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.122 if bug else 0.02),
                loss_fn=F.mse_loss, batches=fixed_batches([(X, Y)] * steps), steps=steps, num_classes=None,
                scaler=None, autocast=None, clip=None)
