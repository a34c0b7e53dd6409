"""Two-layer GCN with a raw (un-normalized, no self loops) dense adjacency matrix."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import seed_all

CASE = dict(
    name="bug_gcn_unnormalized_adjacency",
    expected=["bad_initial_loss"],
    acceptable=["exploding_gradients", "loss_diverging", "oscillating_loss", "dead_relu"],
    onset_step=0,  # seed 0; measured by verify.py (1 thread)
    onset_by_seed={0: 0, 1: 0, 2: 0},
    description="Node classification on a 4-community stochastic block graph (400 nodes, mean degree "
                "~40), 2-layer GCN written by hand as A @ X @ W, Adam(1e-2), full batch. The author "
                "forgot the renormalization D^-1/2 (A+I) D^-1/2 of Kipf & Welling, so each layer sums "
                "~40 neighbours instead of averaging: the logits are ~1e3x too large at step 0 "
                "(loss[0] = 37-80 against ln 4 = 1.39, grad norm ~500 against ~0.1 when normalized). "
                "Adam still gets there: the loss bounces for ~15 steps and then falls to ~1e-3, which is "
                "why such bugs survive (a frequent 'GCN loss is huge at the start' question).",
)


class GCN(nn.Module):
    def __init__(self, A, d_in, d_h, k):
        super().__init__()
        self.register_buffer("A", A)
        self.l1 = nn.Linear(d_in, d_h)
        self.r1 = nn.ReLU()
        self.l2 = nn.Linear(d_h, k)

    def forward(self, x):
        h = self.r1(self.A @ self.l1(x))
        return self.A @ self.l2(h)


def build(seed, bug=True):
    g = seed_all(seed)
    N, K, d = 400, 4, 16
    comm = torch.arange(N) % K
    P = torch.where(comm[:, None] == comm[None, :], 0.15, 0.05)
    U = torch.rand(N, N, generator=g)
    A = (torch.triu(U, 1) < torch.triu(P, 1)).float()
    A = torch.triu(A, 1)
    A = A + A.T
    if not bug:
        A = A + torch.eye(N)
        dinv = A.sum(1).rsqrt()
        A = dinv[:, None] * A * dinv[None, :]
    centers = torch.randn(K, d, generator=g) * 0.5
    X = centers[comm] + torch.randn(N, d, generator=g)
    train = torch.rand(N, generator=g) < 0.5
    y = torch.where(train, comm, torch.full_like(comm, -100))  # unlabeled nodes ignored
    model = GCN(A, d, 32, K)
    steps = 200
    return dict(model=model, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2),
                loss_fn=lambda out, t: F.cross_entropy(out, t, ignore_index=-100),
                batches=lambda s: (X, y), steps=steps, num_classes=K, scaler=None, autocast=None, clip=None)
