"""Graph convolution with raw (sum) neighbour aggregation: no degree normalisation."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import seed_all

CASE = dict(
    name="bug_gcn_sum_aggregation_unnormalized",
    expected=["exploding_gradients"],
    acceptable=["bad_initial_loss", "loss_spike", "oscillating_loss", "loss_diverging",
                "nan_or_inf", "dead_relu", "loss_stalled", "zero_gradient_layer"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "3-layer GCN for node classification on a 400-node stochastic block model (4 "
        "communities, mean degree ~25), full-graph SGD lr 0.05 momentum 0.9. The propagation "
        "uses the raw adjacency with self loops (A + I) instead of D^-1/2 (A + I) D^-1/2, so "
        "every layer multiplies activations by ~25: initial loss ~390-440 (ln 4 = 1.39), the "
        "first SGD steps blow the gradient norm up 400-12000x within 1-2 steps, every ReLU is "
        "dead from step 2-3 on, and the loss ends at ~34 instead of ~0.1. Modelled on "
        "alibaba/graph-learn#153 'GCN实现有误' (the GCN aggregation 'simply adds the node's own "
        "features and its neighbours' features' without the normalisation coefficient; fixed by "
        "adding the degree norm). Fix: symmetric normalisation."
    ),
)

N, C = 400, 4


class GCN(nn.Module):
    def __init__(self, A_hat):
        super().__init__()
        self.register_buffer("A_hat", A_hat)
        self.l1, self.l2, self.l3 = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, C)
        self.r1, self.r2 = nn.ReLU(), nn.ReLU()

    def forward(self, x):
        h = self.r1(self.A_hat @ self.l1(x))
        h = self.r2(self.A_hat @ self.l2(h))
        return self.A_hat @ self.l3(h)


def build(seed, bug=True):
    g = seed_all(seed)
    lab = torch.randint(C, (N,), generator=g)
    P = torch.where(lab[:, None] == lab[None, :], 0.15, 0.03)
    A = (torch.rand(N, N, generator=g) < P).float()
    A = torch.triu(A, 1)
    A = A + A.T + torch.eye(N)
    feat = torch.randn(N, 16, generator=g) + 0.6 * F.one_hot(lab, 16).float()
    if bug:
        A_hat = A
    else:
        d = A.sum(1)
        A_hat = A / torch.sqrt(d[:, None] * d[None, :])
    mask = torch.rand(N, generator=g) < 0.5
    model = GCN(A_hat)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def loss_fn(out, y):
        return F.cross_entropy(out[mask], y[mask])

    def batches(step):
        return feat, lab

    return dict(model=model, optimizer=opt, loss_fn=loss_fn, batches=batches, steps=300,
                num_classes=C, scaler=None, autocast=None, clip=None)
