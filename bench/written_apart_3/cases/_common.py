"""Shared helpers for the third sealed batch (data, seeding, deterministic batch streams).

Plain PyTorch + numpy (+ scikit-learn only for the bundled 8x8 digits data set). The seeding and
batch-stream helpers follow ../shared/benchmarks/pathologies-2/cases/_common.py.
"""
import math
import random

import numpy as np
import torch
import torch.nn as nn

DIGITS_K = 10
LN = math.log


def seed_all(seed: int) -> torch.Generator:
    """Seed python/numpy/torch global RNGs and return a dedicated torch generator."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    g = torch.Generator()
    g.manual_seed(10_007 * seed + 31)
    return g


_DIGITS = None


def load_digits_raw():
    """(X float32 [1797, 64] with values 0..16, y int64 [1797])."""
    global _DIGITS
    if _DIGITS is None:
        from sklearn.datasets import load_digits
        d = load_digits()
        _DIGITS = (torch.tensor(d.data, dtype=torch.float32),
                   torch.tensor(d.target, dtype=torch.int64))
    return _DIGITS[0].clone(), _DIGITS[1].clone()


def load_digits_std():
    """Digits scaled to [0, 1], then standardized per pixel (global stats, eps-safe)."""
    X, y = load_digits_raw()
    X = X / 16.0
    mu = X.mean(0, keepdim=True)
    sd = X.std(0, keepdim=True)
    return (X - mu) / (sd + 1e-3), y


def index_stream(n: int, batch_size: int, steps: int, g: torch.Generator,
                 drop_last: bool = True) -> list:
    """List of `steps` index tensors, epoch-wise shuffling without replacement.

    With drop_last=False every epoch ends with the short remainder batch (n % batch_size).
    """
    rows = []
    while len(rows) < steps:
        perm = torch.randperm(n, generator=g)
        starts = range(0, n, batch_size)
        for s in starts:
            chunk = perm[s:s + batch_size]
            if drop_last and len(chunk) < batch_size:
                break
            rows.append(chunk)
            if len(rows) == steps:
                break
    return rows


def dataset_batches(X, y, batch_size: int, steps: int, g: torch.Generator, drop_last=True):
    """Return a callable batches(step) -> (x, y) over a fixed data set."""
    idx = index_stream(X.shape[0], batch_size, steps, g, drop_last=drop_last)

    def batches(step: int):
        i = idx[step % steps]
        return X[i], y[i]

    return batches


def stream_batches(make_batch, steps: int, g: torch.Generator):
    """Pre-generate `steps` fresh synthetic batches with make_batch(g) -> (x, y)."""
    data = [make_batch(g) for _ in range(steps)]

    def batches(step: int):
        return data[step % steps]

    return batches


def mlp(sizes, act=nn.ReLU, last_act=None):
    """Sequential MLP: Linear(+act) ... Linear(+last_act)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(act())
        elif last_act is not None:
            layers.append(last_act())
    return nn.Sequential(*layers)


def markov_corpus(vocab: int, n_tokens: int, g: torch.Generator, branching: int = 3):
    """A first-order Markov token stream: each token has `branching` likely successors."""
    succ = torch.stack([torch.randperm(vocab, generator=g)[:branching] for _ in range(vocab)])
    probs = torch.tensor([0.7, 0.2, 0.1][:branching])
    probs = probs / probs.sum()
    toks = torch.empty(n_tokens, dtype=torch.int64)
    t = int(torch.randint(vocab, (1,), generator=g))
    choice = torch.multinomial(probs, n_tokens, replacement=True, generator=g)
    for i in range(n_tokens):
        toks[i] = t
        t = int(succ[t, choice[i]])
    return toks


def lm_batches(toks, seq_len: int, batch_size: int, steps: int, g: torch.Generator):
    """batches(step) -> (x [B, T], y [B, T]) next-token windows from a token stream."""
    n = toks.shape[0] - seq_len - 1
    starts = torch.randint(n, (steps, batch_size), generator=g)
    ar = torch.arange(seq_len)

    def batches(step: int):
        s = starts[step % steps][:, None] + ar[None, :]
        return toks[s], toks[s + 1]

    return batches


def flat_ce(logits, y):
    """Cross-entropy over [B, T, V] logits and [B, T] targets."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
