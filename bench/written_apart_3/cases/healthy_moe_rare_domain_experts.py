"""Sparse mixture of experts with deterministic (hash/domain) top-1 routing; two experts rare."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import dataset_batches, load_digits_std, seed_all

CASE = dict(
    name="healthy_moe_rare_domain_experts",
    expected=["healthy"],
    acceptable=[],
    description=(
        "A classifier with a sparse MoE layer of 8 GELU experts and top-1 routing decided by a "
        "fixed hash of the input (hash-layer routing, Roller et al. 2021; equivalently "
        "domain-tag routing). The bucket boundaries are skewed so that experts 6 and 7 receive "
        "~3% and ~0.6% of the samples: with batch 32, expert 7 is routed no sample - and its "
        "weights get no gradient (.grad None, Adam skips them) - on ~82% of the steps, expert 6 "
        "on ~39%. Only routed tokens are computed, as in real MoE layers. Correct: rare experts "
        "are rare by design."
    ),
)

N_EXP = 8


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(64, 64)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64)) for _ in range(N_EXP))
        self.out = nn.Linear(64, 10)

    def forward(self, xr):
        x, route = xr[:, :64], xr[:, 64].long()
        h = F.gelu(self.inp(x))
        y = torch.zeros_like(h)
        for e in range(N_EXP):
            sel = torch.nonzero(route == e).squeeze(1)
            if sel.numel():
                y = y.index_add(0, sel, self.experts[e](h[sel]))
        return self.out(h + y)


def build(seed):
    g = seed_all(seed)
    X, y = load_digits_std()
    gh = torch.Generator().manual_seed(4242)
    key = X @ torch.randn(64, generator=gh)
    bounds = torch.quantile(key, torch.tensor([0.16, 0.32, 0.48, 0.64, 0.80, 0.964, 0.994]))
    route = torch.bucketize(key, bounds)  # experts 0-5: ~16% each, 6: ~3%, 7: ~0.6%
    Xr = torch.cat([X, route[:, None].float()], 1)
    model = MoE()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    return dict(model=model, optimizer=opt, loss_fn=F.cross_entropy,
                batches=dataset_batches(Xr, y, 32, 400, g), steps=400, num_classes=10,
                scaler=None, autocast=None, clip=None)
