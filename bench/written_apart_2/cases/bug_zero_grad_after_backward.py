"""Bug: optimizer.zero_grad() sits between loss.backward() and optimizer.step() (a refactor moved it),
so every step applies a zero gradient and the model never learns."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_zero_grad_after_backward", expected=["loss_stalled"], acceptable=["vanishing_gradients"],
    onset_step=0,
    description="64-128-64-10 ReLU MLP on digits, SGD lr 0.05 momentum 0.9, batch 64, 250 steps. Loop order "
                "backward -> zero_grad(set_to_none=False) -> step: the optimizer always sees zero grads, "
                "parameters never change, the loss stays at its initial ~ln10. Fixed: zero_grad before forward.",
)


def run(seed, bug, watch):
    g = seeded(seed)
    X, y = digits()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = 250
    batches = fixed_batches(X, y, 64, steps, g)
    w = watch(model, opt, num_classes=10, name="zero-grad-order")
    losses = []
    for step in range(steps):
        x, t = batches(step)
        if not bug:
            opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        if bug:
            opt.zero_grad(set_to_none=False)  # BUG: wipes the gradients just computed
        opt.step()
        w.step(loss, batch=(x, t))
        losses.append(loss.item())
    w.close()
    return dict(final_loss=losses[-1])
