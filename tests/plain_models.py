"""Models defined without importing nnwatch, so that a saved one can be loaded where it is absent."""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    """Embedding, an LSTM over sequence-first input, a head tied to the embedding."""

    def __init__(self, vocab: int = 30, dim: int = 16) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, dim)
        self.rnn = nn.LSTM(dim, dim)
        self.norm = ScaleShift(dim)
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.encoder.weight

    def forward(self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor] | None = None):
        out, hidden = self.rnn(self.encoder(x), hidden)
        return self.decoder(self.norm(out)), hidden


class ScaleShift(nn.Module):
    """A hand-written norm-like module that owns its parameters (as nanoGPT's LayerNorm does)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight + self.bias
