"""A model with a sparse embedding (``nn.Embedding(sparse=True)``, trained with SGD or SparseAdam):
its gradient is a sparse tensor, which no dense norm path takes. Before this was handled, the first
backward switched the whole watch off ("reshape is not implemented for sparse tensors")."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import nnwatch


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(200, 16, sparse=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.embed(x).mean(dim=1)))


def _reference_norm(model: nn.Module) -> float:
    """The L2 norm of every gradient, the sparse one with repeated indices summed first."""
    sq = 0.0
    for p in model.parameters():
        g = p.grad
        if g is None:
            continue
        values = g.coalesce().values() if g.is_sparse else g
        sq += float(values.double().square().sum())
    return sq**0.5


def test_a_sparse_embedding_is_recorded_on_every_step(tmp_path) -> None:
    torch.manual_seed(0)
    model = Bag()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    norms = []
    # a budget this small leaves most steps light: both the light and the measured path are used
    with nnwatch.watch(model, opt, run_dir=tmp_path / "run", budget=1e-9, max_interval=8) as w:
        for _ in range(80):
            x = torch.randint(0, 200, (32, 6))  # indices repeat within a batch
            y = torch.randint(0, 3, (32,))
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            norms.append(_reference_norm(model))
            opt.step()
            w.step(loss)
    assert w.disabled is None
    run = nnwatch.load_run(w.run_dir)
    assert len(run) == 80
    assert np.allclose(run["grad_norm"], norms, rtol=1e-5)
    measured = run["layer_sums"] == 1.0
    assert measured.any() and (~measured).any()
    # the embedding's own gradient norm is there on the steps measured in full
    steps, embed = run.layer_stat("grad_layer", "embed")
    full = np.isin(steps, run.steps[measured])
    assert full.any() and np.isfinite(embed[full]).all() and (embed[full] > 0).all()
