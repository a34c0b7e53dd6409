"""Healthy: a small GAN on 8x8 digits, two networks, two watches ("G" and "D")."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from cases._common import Tracer, digits, seed_all

CASE = dict(
    name="healthy_gan_digits",
    expected=["healthy"],
    acceptable=[],
    onset_step=None,
    control=False,
    description="DCGAN-style recipe with MLPs on load_digits scaled to [-1, 1]: G 16-128-256-64 (ReLU, "
                "BatchNorm, tanh out), D 64-256-128-1 (LeakyReLU 0.2), Adam(betas=(0.5, 0.999)) with the two-time-scale "
                "rule (Heusel et al. 2017: G 2e-4, D 6e-4), BCE-with-logits, non-saturating G loss, batch 64, one D and one G update per step. Each "
                "net has its own watch (name 'G' / 'D'). The G loss doubles (~0.7 -> 1.4-1.6 by step ~100, "
                "then flat) while D learns, and D's loss falls from ~1.39 to ~0.8-0.95 without going to 0: that is the normal "
                "adversarial game, not divergence or a stall. Samples keep their diversity (no mode "
                "collapse) and nothing is non-finite.",
)

STEPS = 400


def run(seed, watch, bug=True):
    g = seed_all(seed)
    X, _ = digits()
    X = X * 2 - 1
    zd = 16
    G = nn.Sequential(nn.Linear(zd, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 256), nn.BatchNorm1d(256),
                      nn.ReLU(), nn.Linear(256, 64), nn.Tanh())
    D = nn.Sequential(nn.Linear(64, 256), nn.LeakyReLU(0.2), nn.Linear(256, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))
    oG = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    oD = torch.optim.Adam(D.parameters(), lr=6e-4, betas=(0.5, 0.999))
    tG, tD = Tracer(G), Tracer(D)
    wG = watch(G, oG, name="G")
    wD = watch(D, oD, name="D")
    gen_std, d_acc = [], []
    bce = F.binary_cross_entropy_with_logits
    try:
        for step in range(STEPS):
            idx = torch.randint(0, X.shape[0], (64,), generator=g)
            real = X[idx]
            z = torch.randn(64, zd, generator=g)
            # --- D update
            oD.zero_grad(set_to_none=True)
            fake = G(z)
            lr_, lf_ = D(real), D(fake.detach())
            d_loss = bce(lr_, torch.ones_like(lr_)) + bce(lf_, torch.zeros_like(lf_))
            d_loss.backward()
            gnD = tD.grad_norm()
            oD.step()
            tD.record(d_loss, lr=6e-4, gn_pg=gnD)
            wD.step(d_loss, batch=(torch.cat([real, fake.detach()]), None))
            d_acc.append(float(((lr_ > 0).float().mean() + (lf_ < 0).float().mean()) / 2))
            # --- G update
            oG.zero_grad(set_to_none=True)
            lg = D(fake)
            g_loss = bce(lg, torch.ones_like(lg))
            g_loss.backward()
            gnG = tG.grad_norm()
            oG.step()
            tG.record(g_loss, lr=2e-4, gn_pg=gnG)
            wG.step(g_loss, batch=(z, None))
            gen_std.append(float(fake.detach().std(0).mean()))
    finally:
        wG.close()
        wD.close()
    return dict(G=tG.close(), D=tD.close(), gen_std=gen_std, d_acc=d_acc, data_std=float(X.std(0).mean()))
