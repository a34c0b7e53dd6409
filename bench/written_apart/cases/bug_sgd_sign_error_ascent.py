"""Hand-written SGD update with a sign error: gradient ascent. run() case with optimizer=None."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import Tracer, dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_sgd_sign_error_ascent",
    expected=["loss_diverging"],
    acceptable=["exploding_gradients", "bad_initial_loss", "oscillating_loss", "dead_relu"],
    onset_step=73,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 73, 1: 62, 2: 66},
    description="A from-scratch training loop (no torch optimizer: `with torch.no_grad(): p += lr * "
                "p.grad` instead of `p -= lr * p.grad`, the sign slip seen in hand-written "
                "tutorials/homework). The MLP 64-64-10 climbs the cross-entropy: the loss rises "
                "steadily from ln 10 and the logits grow without bound (no NaN within the run). "
                "The watch gets optimizer=None and w.step() marks each update.",
)

STEPS = 200
LR = 0.05


def run(seed, watch, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    batches = dataset_batches(X, y, 64, STEPS, g)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    tr = Tracer(model)
    w = watch(model, None, num_classes=10, name="sign-error-sgd")
    sign = 1.0 if bug else -1.0
    try:
        for step in range(STEPS):
            x, t = batches(step)
            for p in model.parameters():
                p.grad = None
            loss = F.cross_entropy(model(x), t)
            loss.backward()
            gn = tr.grad_norm()
            with torch.no_grad():
                for p in model.parameters():
                    p += sign * LR * p.grad  # BUG: should be p -= LR * p.grad
            tr.record(loss, lr=LR, gn_pg=gn)
            w.step(loss, batch=(x, t))
    finally:
        w.close()
    out = tr.close()
    out["num_classes"] = 10
    return out
