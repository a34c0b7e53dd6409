"""Healthy: siamese network with a contrastive loss on squared distances and a down-scaled last layer
(x0.12 at init). Every pair starts at distance ~0, the gradient is proportional to the embedding scale,
so the loss sits flat at ~(fraction of different-class pairs) for ~80-90 steps, then falls."""
import torch
import torch.nn as nn

from cases._util import digits, seeded

SCALE = 0.12

CASE = dict(
    name="healthy_siamese_contrastive_plateau", expected=["healthy"], acceptable=[], onset_step=None,
    description="Pairs of digits (50% same class), shared 64-128-128-16 ReLU tower, last Linear scaled by 0.12 at "
                "init, loss = y*d^2 + (1-y)*max(0, 1-d^2) (squared-distance margin 1), SGD lr 0.02 momentum 0.9, "
                "batch 64 pairs, 400 steps, num_classes=None. Flat at ~0.5 (the negative fraction of each batch) "
                "for ~80-90 steps, then falls to ~0.07. The grad norm grows ~40-75x while the embeddings unfold.",
)


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 16))
        with torch.no_grad():
            self.tower[-1].weight.mul_(SCALE)
            self.tower[-1].bias.zero_()

    def forward(self, pair):
        a, b = self.tower(pair[:, 0]), self.tower(pair[:, 1])
        return ((a - b) ** 2).sum(1)  # squared distance


def contrastive_sq(d2, same):
    return (same * d2 + (1 - same) * torch.clamp(1 - d2, min=0)).mean()


def make_pairs(X, y, steps, g, n=64):
    byc = [torch.nonzero(y == c).squeeze(1) for c in range(10)]
    sizes = torch.tensor([len(b) for b in byc])
    data = []
    for _ in range(steps):
        same = (torch.rand(n, generator=g) < 0.5).float()
        i = torch.randint(0, len(y), (n,), generator=g)
        shift = torch.randint(1, 10, (n,), generator=g)
        c2 = torch.where(same > 0, y[i], (y[i] + shift) % 10)
        pick = (torch.rand(n, generator=g) * sizes[c2]).long()
        j = torch.stack([byc[int(c)][int(k)] for c, k in zip(c2, pick)])
        data.append((torch.stack([X[i], X[j]], 1), same))
    return data


def build(seed, bug=True):
    g = seeded(seed)
    X, y = digits()
    steps = 400
    data = make_pairs(X, y, steps, g)
    model = Siamese()
    return dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
                loss_fn=contrastive_sq, batches=lambda s: data[s], steps=steps, num_classes=None,
                scaler=None, autocast=None, clip=None)
