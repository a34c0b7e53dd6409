"""Healthy: float64 curve fit with torch.optim.LBFGS and a closure (run() case)."""

import torch
import torch.nn as nn

from cases._common import Tracer, seed_all

CASE = dict(
    name="healthy_lbfgs_float64_fit",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    control=False,
    description="A float64 MLP 1-32-32-1 (tanh) fitting a damped oscillation y = exp(-x/3) sin(3x) + noise on "
                "256 points (a physics-informed style regression), full batch, LBFGS(lr=1, max_iter=10, "
                "history 20, strong-Wolfe line search): optimizer.step(closure), each step runs the "
                "closure up to 10x. The loss drops ~100x in 60 steps (0.14 -> ~1e-3, the "
                "noise floor is 1e-4), in bursts when the line search finds a good direction; the "
                "gradient norm of the last closure call jumps up and down by 10-50x between steps "
                "(curvature changes), which is normal for quasi-Newton, not exploding gradients.",
)

STEPS = 60


def run(seed, watch, bug=True):
    g = seed_all(seed)
    x = torch.linspace(0, 6, 256, dtype=torch.float64).unsqueeze(1)
    y = torch.exp(-x / 3) * torch.sin(3 * x) + 0.01 * torch.randn(256, 1, generator=g, dtype=torch.float64)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1)).double()
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=10, history_size=20, line_search_fn="strong_wolfe")
    tr = Tracer(model)
    w = watch(model, opt, name="lbfgs-fit")
    try:
        for step in range(STEPS):
            def closure():
                opt.zero_grad()
                loss = ((model(x) - y) ** 2).mean()
                loss.backward()
                return loss
            loss = opt.step(closure)
            gn = tr.grad_norm()  # gradient of the closure's last evaluation
            tr.record(loss, lr=1.0, gn_pg=gn)
            w.step(loss, batch=(x, y))
    finally:
        w.close()
    return tr.close()
