"""Matrix-factorisation recommender trained with its embedding tables stored in bfloat16."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, seed_all

CASE = dict(
    name="bug_bf16_embedding_table_updates_round_away",
    expected=["loss_stalled"],
    acceptable=[],
    update_evidence=["updates_rounded_away"],
    onset_step=0,
    onset_by_seed={0: 0, 1: 0, 2: 0},
    cause_step=0,
    description=(
        "A dot-product matrix-factorisation recommender (user and item nn.Embedding tables, "
        "PyTorch's default N(0, 1) init, d=32) is cast to bfloat16 as a whole (`model.to("
        "torch.bfloat16)`, no fp32 master weights) and trained with Adam lr 1e-3. Adam's steps "
        "(~1e-3) are below half a bf16 ULP for every table entry with |w| >= 0.25, so 95% of the "
        "elements that get a non-zero gradient come out of optimizer.step() bit-identical: the MSE "
        "sits at its initial ~32-33 for 1200 steps while the fp32 control falls to ~12.6. "
        "Modelled on "
        "workofart/ml-by-hand#85 'Create FP32 master copy of weights for mixed-precision "
        "training' (bf16 storage without a master copy: round_bf16(w - lr*update) == w, '0 / 768 "
        "moved' after 100 steps) and keras-team/keras-hub#2629 'Adam optimizer produces near-zero "
        "effective updates when training LoRA weights in bfloat16' (loss identical at every "
        "epoch). Fix: keep the tables in float32."
    ),
)

N_USERS, N_ITEMS, DIM = 300, 400, 32


class MF(nn.Module):
    def __init__(self):
        super().__init__()
        self.user = nn.Embedding(N_USERS, DIM)
        self.item = nn.Embedding(N_ITEMS, DIM)
        self.register_buffer("mu", torch.tensor(3.5))

    def forward(self, x):
        return self.mu + (self.user(x[:, 0]) * self.item(x[:, 1])).sum(1)


def build(seed, bug=True):
    g = seed_all(seed)
    U = torch.randn(N_USERS, 8, generator=g) * 0.6
    V = torch.randn(N_ITEMS, 8, generator=g) * 0.6
    n = 40000
    uu = torch.randint(N_USERS, (n,), generator=g)
    ii = torch.randint(N_ITEMS, (n,), generator=g)
    r = 3.5 + (U[uu] * V[ii]).sum(1) + 0.3 * torch.randn(n, generator=g)
    X = torch.stack([uu, ii], 1)
    model = MF()
    if bug:
        model = model.to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    steps = 1200
    return dict(model=model, optimizer=opt,
                loss_fn=lambda out, y: F.mse_loss(out.float(), y),
                batches=dataset_batches(X, r, 512, steps, g), steps=steps, num_classes=None,
                scaler=None, autocast=None, clip=None)
