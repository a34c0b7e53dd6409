"""Helpers shared by the cases in this batch: seeding, data, batch streams."""
import math
import random

import numpy as np
import torch


def seeded(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    g = torch.Generator()
    g.manual_seed(7919 * seed + 3)
    return g


_D = None


def digits():
    """sklearn's 8x8 digits, scaled to [0,1] then standardised per pixel. (X [1797,64], y [1797])."""
    global _D
    if _D is None:
        from sklearn.datasets import load_digits
        d = load_digits()
        X = torch.tensor(d.data, dtype=torch.float32) / 16.0
        X = (X - X.mean(0)) / (X.std(0) + 1e-2)
        _D = (X, torch.tensor(d.target, dtype=torch.int64))
    return _D[0].clone(), _D[1].clone()


def sampler(n, bs, steps, g):
    """[steps, bs] indices, epoch-wise reshuffled."""
    rows = []
    while len(rows) < steps:
        p = torch.randperm(n, generator=g)
        for i in range(n // bs):
            rows.append(p[i * bs:(i + 1) * bs])
            if len(rows) == steps:
                break
    return torch.stack(rows)


def fixed_batches(X, y, bs, steps, g):
    idx = sampler(X.shape[0], bs, steps, g)

    def batches(step):
        i = idx[step % steps]
        return X[i], y[i]
    return batches


def pregen(make, steps, g):
    data = [make(g) for _ in range(steps)]

    def batches(step):
        return data[step % steps]
    return batches


def ring_of_gaussians(n, g, modes=8, radius=2.0, sd=0.05):
    k = torch.randint(0, modes, (n,), generator=g)
    ang = 2 * math.pi * k.float() / modes
    c = torch.stack([radius * torch.cos(ang), radius * torch.sin(ang)], 1)
    return c + sd * torch.randn(n, 2, generator=g), k


def ring_stats(fake, modes=8, radius=2.0, sd=0.05):
    """mode coverage (modes holding >=2% of samples within 4 sd... relaxed to 0.5 distance), quality frac."""
    ang = 2 * math.pi * torch.arange(modes).float() / modes
    centres = torch.stack([radius * torch.cos(ang), radius * torch.sin(ang)], 1)
    d = torch.cdist(fake, centres)
    dmin, arg = d.min(1)
    good = dmin < 0.5
    counts = torch.bincount(arg[good], minlength=modes).float()
    covered = int((counts >= 0.02 * fake.shape[0]).sum())
    return dict(covered=covered, good_frac=float(good.float().mean()))


def energy_distance(a, b):
    return float(2 * torch.cdist(a, b).mean() - torch.cdist(a, a).mean() - torch.cdist(b, b).mean())
