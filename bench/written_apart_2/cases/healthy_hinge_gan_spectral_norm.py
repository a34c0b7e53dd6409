"""Healthy: hinge-loss GAN with a spectrally normalised discriminator trained at 4x the generator's LR
(TTUR), two watches. D's hinge loss hovers near 1.5-2, never near 0."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm

from cases._gan import Z, gan_summary, gen
from cases._util import energy_distance, ring_of_gaussians, seeded

CASE = dict(
    name="healthy_hinge_gan_spectral_norm", expected=["healthy"], acceptable=[], onset_step=None, gan=True,
    description="G: 8-64-64-2 ReLU MLP; D: 2-128-128-1 LeakyReLU MLP with spectral_norm on every Linear; hinge "
                "loss; Adam betas (0.0, 0.9), D lr 4e-3, G lr 1e-3 (TTUR), one D step per G step, batch 128, "
                "600 steps. Watches: 'D' and 'G'.",
)


def run(seed, bug, watch):
    g = seeded(seed)
    G = gen()
    D = nn.Sequential(spectral_norm(nn.Linear(2, 128)), nn.LeakyReLU(0.2), spectral_norm(nn.Linear(128, 128)),
                      nn.LeakyReLU(0.2), spectral_norm(nn.Linear(128, 1)))
    og = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.0, 0.9))
    od = torch.optim.Adam(D.parameters(), lr=4e-3, betas=(0.0, 0.9))
    wd = watch(D, od, name="D")
    wg = watch(G, og, name="G")
    with torch.no_grad():
        e0 = energy_distance(G(torch.randn(1000, Z, generator=g)), ring_of_gaussians(1000, g)[0])
    dl = []
    for it in range(600):
        real, _ = ring_of_gaussians(128, g)
        fake = G(torch.randn(128, Z, generator=g))
        ld = F.relu(1 - D(real)).mean() + F.relu(1 + D(fake.detach())).mean()
        od.zero_grad()
        ld.backward()
        od.step()
        wd.step(ld, batch=(real, None))
        dl.append(ld.item())
        z = torch.randn(128, Z, generator=g)
        lg = -D(G(z)).mean()
        og.zero_grad()
        lg.backward()
        og.step()
        wg.step(lg, batch=(z, None))
    wd.close()
    wg.close()
    tail = sum(dl[-80:]) / 80
    out = gan_summary(G, g, dl, d_not_winning=tail > 0.5)
    out.update(energy_start=e0, d_loss_tail=tail, d_loss_min=min(dl))
    return dict(gan=out)
