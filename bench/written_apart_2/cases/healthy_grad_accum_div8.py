"""Healthy: gradient accumulation over 8 micro-batches with `loss = loss / 8` before backward. w.step is
called once per optimizer update (as documented) with the `loss` variable the loop holds: the last
micro-batch's loss divided by 8, so the monitored loss is ~1/8 of the true loss (0.29 at step 0 for K=10)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

ACC = 8

CASE = dict(
    name="healthy_grad_accum_div8", expected=["healthy"], acceptable=[], onset_step=None,
    description="64-128-10 ReLU MLP on digits, micro-batch 16, 8 micro-batches per update (effective 128), "
                "loss/8 before backward, Adam 2e-3, 200 updates. The watched loss is the last micro-batch's loss/8. "
                "Rules are applied to the true per-update loss (sum of the 8 divided losses).",
)


def run(seed, bug, watch):
    g = seeded(seed)
    X, y = digits()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    steps = 200
    batches = fixed_batches(X, y, 16, steps * ACC, g)
    w = watch(model, opt, num_classes=10, name="accum8")
    true_loss, seen = [], []
    opt.zero_grad()
    for step in range(steps):
        tot = 0.0
        for i in range(ACC):
            x, t = batches(step * ACC + i)
            loss = F.cross_entropy(model(x), t)
            loss = loss / ACC
            loss.backward()
            tot += loss.item()
        opt.step()
        w.step(loss, batch=(x, t))
        opt.zero_grad()
        true_loss.append(tot)
        seen.append(loss.item())
    w.close()
    return dict(rule_loss={"accum8": true_loss}, watched_loss0=seen[0], watched_loss_tail=sum(seen[-20:]) / 20)
