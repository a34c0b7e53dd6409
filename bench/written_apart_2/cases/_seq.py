"""Synthetic token sequences for the sequence cases."""
import torch


def markov_corpus(g, vocab=16, length=20000, branch=2):
    """A sparse random Markov chain: each token has `branch` likely successors (entropy ~ln branch)."""
    nxt = torch.stack([torch.randperm(vocab, generator=g)[:branch] for _ in range(vocab)])
    seq = torch.empty(length, dtype=torch.long)
    seq[0] = 0
    choice = torch.randint(0, branch, (length,), generator=g)
    noise = torch.rand(length, generator=g) < 0.05
    rnd = torch.randint(0, vocab, (length,), generator=g)
    for i in range(1, length):
        seq[i] = rnd[i] if noise[i] else nxt[seq[i - 1], choice[i]]
    return seq


def lm_batches(seq, bs, T, steps, g):
    starts = torch.randint(0, len(seq) - T - 1, (steps, bs), generator=g)
    ar = torch.arange(T + 1)

    def batches(step):
        w = seq[starts[step][:, None] + ar]
        return w[:, :-1], w[:, 1:]
    return batches
