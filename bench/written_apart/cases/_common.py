"""Shared helpers for the sealed cases: seeding, data, batch streams, and a plain-torch tracer
that run()-style cases use to return their per-step evidence. No monitor code in here."""
import math
import random

import numpy as np
import torch
import torch.nn as nn


def seed_all(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(7919 * seed + 101)
    return g


_DIG = None


def digits():
    """(X float32 [1797, 64] scaled to [0, 1], y int64 [1797])."""
    global _DIG
    if _DIG is None:
        from sklearn.datasets import load_digits
        d = load_digits()
        _DIG = (torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target, dtype=torch.int64))
    return _DIG[0].clone(), _DIG[1].clone()


def digits_std():
    X, y = digits()
    X = (X - X.mean(0, keepdim=True)) / (X.std(0, keepdim=True) + 1e-2)
    return X, y


def epoch_indices(n, bs, steps, g):
    rows = []
    while len(rows) < steps:
        perm = torch.randperm(n, generator=g)
        for i in range(n // bs):
            rows.append(perm[i * bs:(i + 1) * bs])
            if len(rows) == steps:
                break
    return rows


def dataset_batches(X, y, bs, steps, g):
    idx = epoch_indices(X.shape[0], bs, steps, g)

    def batches(step):
        i = idx[step]
        return X[i], y[i]
    return batches


def fixed_batches(data):
    def batches(step):
        return data[step]
    return batches


class Tracer:
    """Per-step plain-torch evidence: loss, pre-clip global grad norm, per-weight grad norms,
    per-ReLU dead-unit fraction (a unit is dead when it is <= 0 for every input of the batch),
    LR, GradScaler scale, non-finite flags. Used by verify.py's standard loop and by run() cases."""

    def __init__(self, model, params=None):
        self.model = model
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if params is not None:
            ids = {id(p) for p in params}
            self.named = [(n, p) for n, p in self.named if id(p) in ids]
        self.t = dict(loss=[], grad_norm=[], lr=[], scale=[], dead={}, zero={}, param_grad={},
                      nonfinite_loss=[], nonfinite_grad=[], nonfinite_param=[], extra={})
        self._dead = {}
        self._zero = {}
        self.handles = []
        for name, m in model.named_modules():
            if isinstance(m, nn.ReLU):
                self.handles.append(m.register_forward_hook(self._hook(name)))

    def _hook(self, name):
        def hook(mod, inp, out):
            with torch.no_grad():
                t = out.detach().float()
                if not bool(torch.isfinite(t).all()):
                    return
                fdim = 1 if t.dim() in (2, 4) else t.dim() - 1
                alive = (t > 0).transpose(0, fdim).reshape(t.shape[fdim], -1).any(1)
                self._dead[name] = 1.0 - float(alive.float().mean())
                self._zero[name] = float((t <= 0).float().mean())
        return hook

    def grad_norm(self):
        """Global L2 norm of the current .grad (call after backward / unscale_, before clipping)."""
        tot, nan = 0.0, False
        pg = {}
        for n, p in self.named:
            if p.grad is None:
                pg[n] = None
                continue
            v = float(p.grad.detach().double().norm())
            pg[n] = v
            nan |= math.isnan(v)
            tot += v * v
        gn = float("nan") if nan else (math.sqrt(tot) if math.isfinite(tot) else float("inf"))
        return gn, pg

    def record(self, loss, lr=None, scale=None, gn_pg=None, **extra):
        """Call once per optimizer update, after backward (and unscale_) and ideally before step;
        gn_pg may carry a grad_norm() measured earlier (before clipping)."""
        gn, pg = gn_pg if gn_pg is not None else self.grad_norm()
        lv = float(loss.detach().double()) if torch.is_tensor(loss) else float(loss)
        t = self.t
        t["loss"].append(lv)
        t["grad_norm"].append(gn)
        t["lr"].append(lr)
        t["scale"].append(scale)
        t["nonfinite_loss"].append(not math.isfinite(lv))
        t["nonfinite_grad"].append(not math.isfinite(gn))
        t["nonfinite_param"].append(not all(bool(torch.isfinite(p).all()) for _, p in self.named))
        for k, v in pg.items():
            t["param_grad"].setdefault(k, []).append(v)
        for k, v in self._dead.items():
            t["dead"].setdefault(k, []).append(v)
        for k, v in self._zero.items():
            t["zero"].setdefault(k, []).append(v)
        self._dead = {}
        self._zero = {}
        for k, v in extra.items():
            t["extra"].setdefault(k, []).append(v)

    def close(self):
        for h in self.handles:
            h.remove()
        self.t["param_names"] = [n for n, _ in self.named]
        return self.t


class NoWatch:
    """Stand-in for nnwatch.watch in plain mode."""

    def __init__(self, *a, **k):
        self.findings = []

    def step(self, *a, **k):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def no_watch(*a, **k):
    return NoWatch()
