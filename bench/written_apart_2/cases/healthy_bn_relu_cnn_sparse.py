"""Healthy: Conv-BN-ReLU CNN. After BatchNorm about half of every ReLU's outputs are exact zeros,
and after a mean-shifted BN (beta init -0.5) far more, but every unit fires for some input."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._util import digits, fixed_batches, seeded

CASE = dict(
    name="healthy_bn_relu_cnn_sparse", expected=["healthy"], acceptable=[], onset_step=None,
    description="3x [Conv3x3-BatchNorm-ReLU] (16/32/32 channels) on digits as 1x8x8, BN beta initialised to "
                "-0.5 (a common 'sparse start'), global average pool, Linear(32,10); SGD 0.05 m 0.9 nesterov, "
                "wd 5e-4, batch 64, 200 steps. Most ReLU outputs are exact zeros, no unit is dead for a batch.",
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        layers, c = [], 1
        for co in (16, 32, 32):
            bn = nn.BatchNorm2d(co)
            nn.init.constant_(bn.bias, -0.5)
            layers += [nn.Conv2d(c, co, 3, padding=1, bias=False), bn, nn.ReLU()]
            c = co
        self.f = nn.Sequential(*layers)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.f(x.view(-1, 1, 8, 8)).mean((2, 3)))


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    model = Net()
    steps = 200
    return dict(model=model,
                optimizer=torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4),
                loss_fn=F.cross_entropy, batches=fixed_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=None, clip=None)
