"""Bug: fp16 training (model.half(), run under fp16 autocast) with Adam(eps=1e-16). In fp16 the eps
rounds to 0 and small second moments underflow to 0, so m / (sqrt(v) + eps) becomes inf/NaN."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_adam_eps_fp16", expected=["nan_or_inf"], acceptable=["exploding_gradients"],
    onset_step=0,
    description="64-128-128-10 ReLU MLP converted with model.half() (weights, grads and Adam state in fp16) and run "
                "under torch.autocast(cpu, float16); Adam lr 1e-3 with eps=1e-16 (copied from an fp32 recipe "
                "that wanted 'no eps'). Batch 64, 200 steps. Fixed: eps=1e-4, the usual fp16 choice.",
)


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).half()
    X = X.half()
    steps = 200
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-16 if bug else 1e-4)
    return dict(model=model, optimizer=opt, loss_fn=lambda o, t: F.cross_entropy(o.float(), t),
                batches=fixed_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=None,
                autocast=dict(device_type="cpu", dtype=torch.float16), clip=None)
