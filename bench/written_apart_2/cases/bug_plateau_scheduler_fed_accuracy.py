"""Bug: ReduceLROnPlateau left in its default mode='min' but stepped with the held-out accuracy. Rising
accuracy looks like 'no improvement', so the LR is cut every few steps until training freezes."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_plateau_scheduler_fed_accuracy", expected=["loss_stalled"], acceptable=["vanishing_gradients"],
    onset_step=0,
    description="64-64-10 ReLU MLP on digits, SGD lr 0.01 momentum 0.9, batch 64, 300 steps. After every update the "
                "model is evaluated on a fixed held-out set of 297 digits and ReduceLROnPlateau(mode='min', factor=0.3, "
                "patience=2) is stepped with the held-out accuracy (bug; fixed: with the held-out loss). The LR falls "
                "below 1e-8 within ~50 steps and the training loss freezes near its starting value.",
)


def run(seed, bug, watch):
    g = seeded(seed)
    X, y = digits()
    perm = torch.randperm(len(y), generator=g)
    Xv, yv, Xt, yt = X[perm[:297]], y[perm[:297]], X[perm[297:]], y[perm[297:]]
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=0.3, patience=2)
    steps = 300
    batches = fixed_batches(Xt, yt, 64, steps, g)
    w = watch(model, opt, num_classes=10, name="plateau-acc")
    lrs, accs = [], []
    for step in range(steps):
        x, t = batches(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), t)
        loss.backward()
        opt.step()
        with torch.no_grad():
            out = model(Xv)
            vacc = (out.argmax(1) == yv).float().mean().item()
            vloss = F.cross_entropy(out, yv).item()
        sched.step(vacc if bug else vloss)
        w.step(loss, batch=(x, t))
        lrs.append(opt.param_groups[0]["lr"])
        accs.append(vacc)
    w.close()
    first_small = next((i for i, v in enumerate(lrs) if v < 1e-6), None)
    return dict(lr_below_1e6_at=first_small, lr_final=lrs[-1], val_acc_final=accs[-1])
