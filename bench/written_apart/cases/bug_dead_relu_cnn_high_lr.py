"""CNN with an LR 20x too high: the first updates push most conv channels permanently negative."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import dataset_batches, digits_std, seed_all

CASE = dict(
    name="bug_dead_relu_cnn_high_lr",
    expected=["dead_relu"],
    acceptable=["exploding_gradients", "loss_stalled", "bad_initial_loss", "oscillating_loss", "loss_diverging"],
    onset_step=52,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 52, 1: 55, 2: 59},
    description="3-conv CNN (16-32-32 channels, 3x3) on 8x8 digits, SGD(lr=1.0, momentum=0.9) where "
                "0.05 was meant (the fixed control). The first large updates drive conv biases/weights so far negative that "
                "a whole ReLU layer never fires again for any input (>=90% of its channels dead, from "
                "step ~50), no gradient flows back through it, and the loss is stuck near ln 10 (the classic "
                "'dying ReLU after a too-large learning rate', CS231n).",
)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.r1 = nn.Conv2d(1, 16, 3, padding=1), nn.ReLU()
        self.c2, self.r2 = nn.Conv2d(16, 32, 3, padding=1), nn.ReLU()
        self.c3, self.r3 = nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = x.view(-1, 1, 8, 8)
        x = self.r1(self.c1(x))
        x = F.max_pool2d(self.r2(self.c2(x)), 2)
        x = self.r3(self.c3(x))
        return self.fc(x.mean((2, 3)))


def build(seed, bug=True):
    g = seed_all(seed)
    X, y = digits_std()
    model = CNN()
    steps = 250
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0 if bug else 0.05, momentum=0.9),
                loss_fn=F.cross_entropy, batches=dataset_batches(X, y, 64, steps, g), steps=steps,
                num_classes=10, scaler=None, autocast=None, clip=None)
