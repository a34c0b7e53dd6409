"""Bug: SGD+momentum LR 50x too high on a small CNN (a typo: 0.5 for 0.01). The loss climbs steadily
for many steps before anything becomes non-finite."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="bug_sgd_lr50x_cnn_diverging", expected=["loss_diverging"],
    acceptable=["exploding_gradients", "nan_or_inf", "oscillating_loss"],
    onset_step=15, onset_by_seed={0: 15, 1: 24, 2: 18},
    description="Conv(1->16)-LeakyReLU-Conv(16->32)-LeakyReLU-MaxPool-Linear(512->10) on digits as 1x8x8, "
                "SGD momentum 0.9 with lr 0.5 (intended 0.01). Batch 64, 200 steps. Fixed: lr 0.01.",
)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.LeakyReLU(0.1), nn.Conv2d(16, 32, 3, padding=1),
                               nn.LeakyReLU(0.1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(512, 10))

    def forward(self, x):
        return self.f(x.view(-1, 1, 8, 8))


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = CNN()
    steps = 200
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5 if bug else 0.01, momentum=0.9),
                loss_fn=F.cross_entropy, batches=fixed_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
