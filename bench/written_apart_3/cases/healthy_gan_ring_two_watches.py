"""Non-saturating GAN on a ring of 8 Gaussians, watched as two runs (G and D) as documented."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._common import seed_all

CASE = dict(
    name="healthy_gan_ring_two_watches",
    expected=["healthy"],
    acceptable=[],
    gan=True,
    learn_probe="energy_distance",
    description=(
        "A small GAN (LeakyReLU MLP generator and discriminator, non-saturating loss, one-sided "
        "label smoothing 0.9, Adam 2e-4 with beta1 0.5 - the DCGAN defaults) on a 2-d ring of "
        "8 Gaussians, watched the way nnwatch's "
        "GAN guide says: two watches named G and D, each stepped after its own net's update, D "
        "then G every iteration. D's loss hovers around 2 ln 2 and G's around ln 2-1.5 with "
        "oscillations - the game, not a pathology. Progress is judged by the energy distance "
        "between generated and real samples on a fixed noise batch (verification probe)."
    ),
)

STEPS = 700
NMODES, SPREAD = 8, 0.05


def ring(n, g):
    k = torch.randint(NMODES, (n,), generator=g).float()
    ang = 2 * math.pi * k / NMODES
    c = torch.stack([torch.cos(ang), torch.sin(ang)], 1) * 2.0
    return c + SPREAD * torch.randn(n, 2, generator=g)


def energy_distance(a, b):
    return float(2 * torch.cdist(a, b).mean() - torch.cdist(a, a).mean()
                 - torch.cdist(b, b).mean())


def run(seed, bug, watch):
    g = seed_all(seed)
    G = nn.Sequential(nn.Linear(8, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2),
                      nn.Linear(64, 2))
    D = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2),
                      nn.Linear(64, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-4, betas=(0.5, 0.999))
    real_all = ring(STEPS * 64, g)
    noise_all = torch.randn(STEPS * 2 * 64, 8, generator=g)
    z_eval = torch.randn(256, 8, generator=g)
    real_eval = ring(256, g)
    wg = watch(G, opt_g, num_classes=None, name="G")
    wd = watch(D, opt_d, num_classes=None, name="D")
    ones, zeros = torch.ones(64, 1), torch.zeros(64, 1)
    probe = []
    try:
        for step in range(STEPS):
            real = real_all[step * 64:(step + 1) * 64]
            z1 = noise_all[2 * step * 64:(2 * step + 1) * 64]
            z2 = noise_all[(2 * step + 1) * 64:(2 * step + 2) * 64]
            opt_d.zero_grad(set_to_none=True)
            loss_d = F.binary_cross_entropy_with_logits(D(real), 0.9 * ones) + \
                F.binary_cross_entropy_with_logits(D(G(z1).detach()), zeros)
            loss_d.backward()
            opt_d.step()
            wd.step(loss_d, batch=(real, ones))
            opt_g.zero_grad(set_to_none=True)
            loss_g = F.binary_cross_entropy_with_logits(D(G(z2)), ones)
            loss_g.backward()
            opt_g.step()
            wg.step(loss_g, batch=(z2, ones))
            with torch.no_grad():
                probe.append(energy_distance(G(z_eval), real_eval))
    finally:
        wg.close()
        wd.close()
    return {"probe": {"energy_distance": probe}}
