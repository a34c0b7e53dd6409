"""Healthy: GradScaler with init_scale=2**32 halves ~16 times at the start, then is stable."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="healthy_amp_scaler_init_2p32",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="MLP 64-256-128-10 (GELU) under fp16 autocast with "
                "GradScaler('cpu', init_scale=2**32, growth_interval=2000) (a large init_scale as some "
                "recipes set it, e.g. to avoid underflow). The first 13-14 steps overflow and are "
                "skipped while the scale halves 2^32 -> 2^18-2^19, then it is stable and the model trains "
                "(ln 10 -> ~0.01). A burst of consecutive halvings at the start is the scaler "
                "calibrating, not a collapse.",
)


def build(seed):
    g = seed_all(seed)
    X, y = digits_std()
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 128), nn.GELU(), nn.Linear(128, 10))
    steps = 300
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 32, growth_interval=2000)
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-3), loss_fn=F.cross_entropy,
                batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10, scaler=scaler,
                autocast=dict(device_type="cpu", dtype=torch.float16), clip=None)
