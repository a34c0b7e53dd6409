"""Healthy: WGAN-GP on a ring of 8 Gaussians, critic trained 5x per generator step, two watches
(critic and generator). The critic's loss is negative (a Wasserstein estimate), the generator's loss
is -mean critic score and drifts; the critic's watch steps 5x as often as the generator's."""
import torch
import torch.nn as nn

from cases._gan import Z, gan_summary, gen
from cases._util import energy_distance, ring_of_gaussians, seeded

CASE = dict(
    name="healthy_wgan_gp_ncritic5", expected=["healthy"], acceptable=[], onset_step=None, gan=True,
    description="G: 8-64-64-2 ReLU MLP; critic: 2-64-64-1 LeakyReLU MLP; WGAN-GP (lambda 0.1), n_critic=5, "
                "Adam(1e-3, betas 0.5/0.9) for both, batch 128, 200 generator steps (1000 critic steps). "
                "Watches: 'critic' (num_classes None) and 'generator'.",
)


def run(seed, bug, watch):
    g = seeded(seed)
    G = gen()
    D = nn.Sequential(nn.Linear(2, 64), nn.LeakyReLU(0.2), nn.Linear(64, 64), nn.LeakyReLU(0.2), nn.Linear(64, 1))
    og = torch.optim.Adam(G.parameters(), lr=1e-3, betas=(0.5, 0.9))
    od = torch.optim.Adam(D.parameters(), lr=1e-3, betas=(0.5, 0.9))
    wd = watch(D, od, name="critic")
    wg = watch(G, og, name="generator")
    with torch.no_grad():
        e0 = energy_distance(G(torch.randn(1000, Z, generator=g)), ring_of_gaussians(1000, g)[0])
    wdist = []
    for it in range(200):
        for _ in range(5):
            real, _ = ring_of_gaussians(128, g)
            fake = G(torch.randn(128, Z, generator=g)).detach()
            eps = torch.rand(128, 1, generator=g)
            mix = (eps * real + (1 - eps) * fake).requires_grad_(True)
            gr = torch.autograd.grad(D(mix).sum(), mix, create_graph=True)[0]
            gp = ((gr.norm(dim=1) - 1) ** 2).mean()
            w_est = D(real).mean() - D(fake).mean()
            ld = -w_est + 0.1 * gp
            od.zero_grad()
            ld.backward()
            od.step()
            wd.step(ld, batch=(real, None))
            wdist.append(w_est.item())
        z = torch.randn(128, Z, generator=g)
        lg = -D(G(z)).mean()
        og.zero_grad()
        lg.backward()
        og.step()
        wg.step(lg, batch=(z, None))
    wd.close()
    wg.close()
    head = sum(wdist[:100]) / 100
    tail = sum(wdist[-100:]) / 100
    out = gan_summary(G, g, None, d_not_winning=tail < max(head, 0.05) * 1.5 or tail < 0.2)
    out.update(energy_start=e0, w_est_head=max(wdist[:100]), w_est_tail=tail)
    return dict(gan=out)
