"""Healthy: gradient accumulation over 4 micro-batches, loss / 4, one optimizer step per 4 (run() case)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import Tracer, dataset_batches, digits_std, seed_all

CASE = dict(
    name="healthy_grad_accum_4",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    control=False,
    description="MLP 64-256-128-10 (ReLU, dropout 0.1) on digits with gradient accumulation as in the HF/"
                "nanoGPT loops: 4 micro-batches of 16, each loss divided by 4 and backpropagated, then "
                "clip_grad_norm_(1.0), optimizer.step() (AdamW 1e-3) and zero_grad(). w.step() is called "
                "once per optimizer update with the summed (undivided-mean) loss of the 4 micro-batches; "
                "the .grad seen before the update is the sum of 4 partial gradients (that is the design, not "
                "a missing zero_grad). 150 updates, loss ln 10 -> ~0.05.",
)

UPDATES, ACC, MB = 150, 4, 16


def run(seed, watch, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    batches = dataset_batches(X, y, MB, UPDATES * ACC, g)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tr = Tracer(model)
    w = watch(model, opt, num_classes=10, name="grad-accum")
    model.train()
    try:
        for u in range(UPDATES):
            total = 0.0
            xs, ys = [], []
            for m in range(ACC):
                xb, yb = batches(u * ACC + m)
                loss = F.cross_entropy(model(xb), yb) / ACC
                loss.backward()
                total = total + loss.detach()
                xs.append(xb)
                ys.append(yb)
            gn = tr.grad_norm()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tr.record(total, lr=1e-3, gn_pg=gn, clipped=gn[0] > 1.0)
            w.step(total, batch=(torch.cat(xs), torch.cat(ys)))
            opt.zero_grad(set_to_none=True)
    finally:
        w.close()
    out = tr.close()
    out["num_classes"] = 10
    return out
