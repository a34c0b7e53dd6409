"""Bug: SGD+momentum with LR 1.0 (100x the intended 0.01) on a Conv-BN-ReLU CNN. BatchNorm keeps the
activations bounded, so nothing overflows; instead the early huge updates drive the BN shifts (beta)
far negative and the ReLUs after them switch off for every input, for good."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_bn_cnn_lr100x_dead_relu", expected=["dead_relu"],
    acceptable=["loss_stalled", "exploding_gradients", "loss_diverging", "oscillating_loss"], onset_step=5,
    onset_by_seed={0: 5, 1: 8, 2: 7},
    description="Conv(1->16)-BN-ReLU-Conv(16->32)-BN-ReLU-MaxPool-Linear(512->10) on digits as 1x8x8, SGD lr 1.0 "
                "momentum 0.9 (intended 0.01), batch 64, 200 steps. Fixed: lr 0.01.",
)


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(512, 10))
    steps = 200
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0 if bug else 0.01, momentum=0.9),
                loss_fn=F.cross_entropy, batches=fixed_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
