"""Small MLP generator/discriminator for the 2-D ring-of-8-Gaussians GAN cases."""
import torch
import torch.nn as nn

from cases._util import energy_distance, ring_of_gaussians, ring_stats

Z = 8


def gen():
    return nn.Sequential(nn.Linear(Z, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def gan_summary(G, g, d_losses, d_not_winning):
    with torch.no_grad():
        real, _ = ring_of_gaussians(1000, g)
        fake = G(torch.randn(1000, Z, generator=g))
    st = ring_stats(fake)
    spread = float(fake.std(0).min() / real.std(0).min())
    return dict(covered=st["covered"], good_frac=st["good_frac"], spread_ratio=spread,
                energy_tail=energy_distance(fake, real), d_not_winning=d_not_winning)
