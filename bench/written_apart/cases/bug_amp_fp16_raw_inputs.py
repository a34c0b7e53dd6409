"""fp16 autocast on raw, unnormalized sensor values: the weight gradient overflows fp16 at any scale >= 1."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import fixed_batches, seed_all

CASE = dict(
    name="bug_amp_fp16_raw_inputs",
    expected=["amp_scale_collapse"],
    acceptable=["loss_stalled", "nan_or_inf"],
    onset_step=16,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 16, 1: 16, 2: 16},
    description="Regression MLP 16-128-128-1 under torch.autocast('cpu', float16) + GradScaler, fed "
                "raw sensor readings in the thousands (pressure in Pa, counts) and targets in the "
                "thousands, with no input normalization (the 'GradScaler scale keeps decreasing / "
                "goes below 1' report for unnormalized data). The first layer's weight gradient "
                "x^T.dL/dh is computed in fp16 and is ~1e5-1e7 even before scaling, so it overflows "
                "at every scale >= 1: the scaler halves the scale every step until it is far below 1. "
                "The loss stays finite. Fixed: standardized inputs and targets.",
)


def build(seed, bug=True):
    g = seed_all(seed)
    steps = 200
    W = torch.randn(16, 1, generator=g)
    mu = torch.linspace(500, 5000, 16)

    def make():
        z = torch.randn(256, 16, generator=g)
        yy = torch.tanh(z @ W / 4) * 2000 + 3000
        x = mu + z * mu * 0.2
        if not bug:
            x, yy = z, (yy - 3000) / 2000
        return x, yy
    data = [make() for _ in range(steps)]
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3),
                loss_fn=F.mse_loss, batches=fixed_batches(data), steps=steps, num_classes=None, scaler=scaler,
                autocast=dict(device_type="cpu", dtype=torch.float16), clip=None)
