"""Missing optimizer.zero_grad() in a small CNN loop (Adam)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_no_zero_grad_cnn",
    expected=["exploding_gradients"],
    acceptable=["dead_relu", "loss_diverging", "oscillating_loss", "loss_stalled"],
    onset_step=139,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 139, 1: 44, 2: 141},
    description="2-conv CNN on 8x8 digits with SGD(lr=0.02, momentum=0.9). The loop forgets "
                "optimizer.zero_grad() (a frequent forum report: 'loss goes down then explodes', "
                "e.g. after refactoring zero_grad into a branch that only runs at validation). "
                "Each .grad is the running sum of all batch gradients, so the .grad norm grows "
                "with the step count.",
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 3, padding=1)
        self.r1 = nn.ReLU()
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.r2 = nn.ReLU()
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        x = self.r1(self.c1(x))
        x = F.max_pool2d(self.r2(self.c2(x)), 2)
        return self.fc(x.flatten(1))


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    model = Net()
    steps = 250
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                zero_grad=not bug, loss_fn=F.cross_entropy, batches=dataset_batches(X, y, 64, steps, g),
                steps=steps, num_classes=10, scaler=None, autocast=None, clip=None)
