"""Healthy: CNN under bf16 autocast on CPU, no GradScaler (bf16 does not need one)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="healthy_bf16_cnn",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    description="2-conv CNN with BatchNorm2d on 8x8 digits under torch.autocast('cpu', dtype=torch.bfloat16), "
                "AdamW(2e-3, wd 0.05), no GradScaler. bf16 has 8 mantissa bits, so the loss and "
                "activations are quantised (the loss moves in visible steps) but the run trains cleanly: "
                "ln 10 -> ~0.006.",
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1, self.r1 = nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU()
        self.c2, self.b2, self.r2 = nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()
        self.fc = nn.Linear(64 * 16, 10)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        x = self.r1(self.b1(self.c1(x)))
        x = F.max_pool2d(self.r2(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


def build(seed):
    g = seed_all(seed)
    X, y = digits_std()
    model = Net()
    steps = 200
    return dict(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05),
                loss_fn=F.cross_entropy, batches=dataset_batches(X, y, 64, steps, g), steps=steps, num_classes=10,
                scaler=None, autocast=dict(device_type="cpu", dtype=torch.bfloat16), clip=None)
